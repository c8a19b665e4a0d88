//! `gregor group list|describe|reset-offsets|delete`, modelled on `kafka-consumer-groups`.
//!
//! Groups and members come from ListGroups + DescribeGroups (librdkafka's group list);
//! committed offsets from OffsetFetch through a consumer that uses the group's id without
//! joining it; log end offsets from ListOffsets (watermarks); resets are OffsetCommit from that
//! same consumer, which Kafka (and gregor) accept only while the group has no members.
//! librdkafka describes classic groups only: a KIP-848 (`group.protocol=consumer`) group is
//! listed, but its members are not shown.

use super::{ConnectionArgs, Output};
use anyhow::{bail, ensure, Context, Result};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct GroupArgs {
    #[command(subcommand)]
    command: GroupCommand,
    #[command(flatten)]
    pub(super) connection: ConnectionArgs,
    /// How to print results.
    #[arg(long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    /// Timeout for each request, in milliseconds.
    #[arg(long, default_value_t = 30_000, global = true)]
    timeout_ms: u64,
}

#[derive(clap::Subcommand, Debug)]
enum GroupCommand {
    /// List consumer groups with their state and protocol.
    List {
        /// Only groups in this state (Empty, Stable, PreparingRebalance, CompletingRebalance,
        /// Dead, Assigning, Reconciling, NotReady, Unknown: Kafka's group states;
        /// case-insensitive). Repeatable, or comma-separated as with kafka-consumer-groups.
        #[arg(long, value_delimiter = ',', value_parser = parse_group_state)]
        state: Vec<String>,
    },
    /// Members and their assignments, and per partition the committed offset, log end offset
    /// and lag.
    Describe { group: String },
    /// Plan (and with --execute, commit) new offsets for a group without active members.
    ResetOffsets(ResetArgs),
    /// Delete a group without active members, with its committed offsets.
    Delete { group: String },
}

#[derive(clap::Args, Debug)]
struct ResetArgs {
    group: String,
    /// Topic to reset, optionally with partitions: `orders` or `orders:0,2`. Repeatable.
    #[arg(long, value_name = "TOPIC[:P,P...]", value_parser = parse_topic_partitions,
          required_unless_present = "all_topics", conflicts_with = "all_topics")]
    topic: Vec<(String, Vec<i32>)>,
    /// Every topic the group has committed offsets for.
    #[arg(long)]
    all_topics: bool,
    #[command(flatten)]
    spec: ResetSpec,
    /// Commit the new offsets (without it, only print the plan).
    #[arg(long, conflicts_with = "dry_run")]
    execute: bool,
    /// Only print the plan (the default).
    #[arg(long)]
    dry_run: bool,
}

#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
struct ResetSpec {
    /// The log start offset.
    #[arg(long)]
    to_earliest: bool,
    /// The log end offset.
    #[arg(long)]
    to_latest: bool,
    /// The committed offset (no change; useful to see the plan).
    #[arg(long)]
    to_current: bool,
    /// This offset, moved into [log start, log end] when outside.
    #[arg(long, value_name = "OFFSET")]
    to_offset: Option<i64>,
    /// The first offset whose timestamp is at or after this time: YYYY-MM-DDTHH:mm:SS[.sss]
    /// with an optional Z or ±HH:MM (UTC when absent), or milliseconds since the epoch.
    #[arg(long, value_name = "DATETIME", value_parser = parse_datetime_ms)]
    to_datetime: Option<i64>,
    /// The committed offset plus N (N may be negative), kept within [log start, log end].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    shift_by: Option<i64>,
}

pub async fn run(args: GroupArgs) -> Result<()> {
    let timeout = Duration::from_millis(args.timeout_ms);
    match args.command {
        GroupCommand::Delete { group } => {
            delete(&args.connection, &group, timeout, args.output).await
        }
        command => {
            let connection = args.connection.clone();
            let output = args.output;
            tokio::task::spawn_blocking(move || match command {
                GroupCommand::List { state } => list(&connection, &state, timeout, output),
                GroupCommand::Describe { group } => describe(&connection, &group, timeout, output),
                GroupCommand::ResetOffsets(reset) => {
                    reset_offsets(&connection, &reset, timeout, output)
                }
                GroupCommand::Delete { .. } => unreachable!("handled above"),
            })
            .await?
        }
    }
}

/// A consumer that speaks for `group` (OffsetFetch, OffsetCommit) without joining it.
fn group_consumer(connection: &ConnectionArgs, group: &str) -> Result<BaseConsumer> {
    connection
        .client_config(&[
            ("group.id", group),
            ("enable.auto.commit", "false"),
            ("enable.partition.eof", "false"),
        ])
        .create()
        .context("creating the consumer")
}

/// Kafka's group state names (`GroupState` in Kafka 4.x: classic, consumer and share groups).
const GROUP_STATES: &[&str] = &[
    "Unknown",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
    "Dead",
    "Empty",
    "Assigning",
    "Reconciling",
    "NotReady",
];

/// A `--state` value: one of [`GROUP_STATES`], any case, returned in Kafka's spelling; anything
/// else is refused with the valid names, as `kafka-consumer-groups --list --state` does.
fn parse_group_state(s: &str) -> Result<String> {
    match GROUP_STATES
        .iter()
        .find(|g| g.eq_ignore_ascii_case(s.trim()))
    {
        Some(g) => Ok((*g).to_string()),
        None => bail!(
            "invalid state {s:?}; valid states are: {}",
            GROUP_STATES.join(", ")
        ),
    }
}

fn list(
    connection: &ConnectionArgs,
    states: &[String],
    timeout: Duration,
    output: Output,
) -> Result<()> {
    let consumer = group_consumer(connection, "gregor-cli")?;
    let groups = consumer
        .fetch_group_list(None, timeout)
        .context("listing groups")?;
    let mut rows: Vec<(String, String, String, String)> = groups
        .groups()
        .iter()
        .filter(|g| states.is_empty() || states.iter().any(|s| s.eq_ignore_ascii_case(g.state())))
        .map(|g| {
            (
                g.name().to_string(),
                g.state().to_string(),
                g.protocol_type().to_string(),
                g.protocol().to_string(),
            )
        })
        .collect();
    rows.sort();
    match output {
        Output::Json => {
            let value: Vec<_> = rows
                .iter()
                .map(|(g, s, t, p)| json!({"group": g, "state": s, "protocol_type": t, "protocol": p}))
                .collect();
            println!("{}", serde_json::Value::Array(value));
        }
        Output::Table => {
            let mut table = Table::new();
            table.load_preset(UTF8_FULL_CONDENSED);
            table.set_header(["Group", "State", "Protocol type", "Protocol"]);
            for (g, s, t, p) in rows {
                table.add_row([g, s, t, p]);
            }
            println!("{table}");
        }
    }
    Ok(())
}

/// A member as DescribeGroups reports it, with its assignment decoded.
struct Member {
    member_id: String,
    client_id: String,
    host: String,
    assignment: Vec<(String, Vec<i32>)>,
}

/// One group's DescribeGroups answer.
struct GroupDescription {
    state: String,
    protocol: String,
    members: Vec<Member>,
}

fn describe_group(
    consumer: &BaseConsumer,
    group: &str,
    timeout: Duration,
) -> Result<GroupDescription> {
    let list = consumer
        .fetch_group_list(Some(group), timeout)
        .with_context(|| format!("describing group {group}"))?;
    let Some(info) = list.groups().iter().find(|g| g.name() == group) else {
        return Ok(GroupDescription {
            state: "Dead".into(),
            protocol: String::new(),
            members: vec![],
        });
    };
    let mut members = Vec::new();
    for m in info.members() {
        let assignment = match m.assignment() {
            Some(bytes) if !bytes.is_empty() && info.protocol_type() == "consumer" => {
                decode_assignment(bytes).with_context(|| {
                    format!("decoding the assignment of member {} of {group}", m.id())
                })?
            }
            _ => vec![],
        };
        members.push(Member {
            member_id: m.id().to_string(),
            client_id: m.client_id().to_string(),
            host: m.client_host().to_string(),
            assignment,
        });
    }
    members.sort_by(|a, b| a.member_id.cmp(&b.member_id));
    Ok(GroupDescription {
        state: info.state().to_string(),
        protocol: info.protocol().to_string(),
        members,
    })
}

/// Decodes a ConsumerProtocolAssignment (any version: v0-v3 share this layout): version
/// int16, topics [name string, partitions [int32]], user data bytes (ignored).
fn decode_assignment(bytes: &[u8]) -> Result<Vec<(String, Vec<i32>)>> {
    struct Reader<'a>(&'a [u8]);
    impl Reader<'_> {
        fn take(&mut self, n: usize) -> Result<&[u8]> {
            ensure!(self.0.len() >= n, "truncated assignment");
            let (head, tail) = self.0.split_at(n);
            self.0 = tail;
            Ok(head)
        }
        fn i16(&mut self) -> Result<i16> {
            let b = self.take(2)?;
            Ok(i16::from_be_bytes([b[0], b[1]]))
        }
        fn i32(&mut self) -> Result<i32> {
            let b = self.take(4)?;
            Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        }
        fn len(&mut self, n: i32, item_size: usize) -> Result<usize> {
            let n = usize::try_from(n).context("negative array length in assignment")?;
            ensure!(
                n.saturating_mul(item_size) <= self.0.len(),
                "array length {n} exceeds the assignment"
            );
            Ok(n)
        }
    }
    let mut r = Reader(bytes);
    let version = r.i16()?;
    ensure!(version >= 0, "assignment version {version}");
    let n = r.i32()?;
    let topics = r.len(n, 6)?;
    let mut out = Vec::with_capacity(topics);
    for _ in 0..topics {
        let len = r.i16()?;
        let len = usize::try_from(len).context("null topic name in assignment")?;
        let name = String::from_utf8_lossy(r.take(len)?).into_owned();
        let n = r.i32()?;
        let count = r.len(n, 4)?;
        let mut partitions = Vec::with_capacity(count);
        for _ in 0..count {
            partitions.push(r.i32()?);
        }
        partitions.sort_unstable();
        out.push((name, partitions));
    }
    Ok(out)
}

/// Every partition of every topic in the cluster (internal ones excluded), from Metadata.
fn all_partitions(consumer: &BaseConsumer, timeout: Duration) -> Result<Vec<(String, i32)>> {
    let metadata = consumer
        .fetch_metadata(None, timeout)
        .context("fetching metadata")?;
    let mut out = Vec::new();
    for t in metadata.topics() {
        if t.error().is_some() || t.name().starts_with("__") {
            continue;
        }
        out.extend(
            t.partitions()
                .iter()
                .map(|p| (t.name().to_string(), p.id())),
        );
    }
    out.sort();
    Ok(out)
}

/// Committed offsets of `group` for `partitions` (partitions without one are left out).
fn committed(
    consumer: &BaseConsumer,
    partitions: &[(String, i32)],
    timeout: Duration,
) -> Result<BTreeMap<(String, i32), i64>> {
    let mut tpl = TopicPartitionList::new();
    for (t, p) in partitions {
        tpl.add_partition(t, *p);
    }
    let result = consumer
        .committed_offsets(tpl, timeout)
        .context("fetching committed offsets")?;
    let mut out = BTreeMap::new();
    for e in result.elements() {
        if let Offset::Offset(o) = e.offset() {
            out.insert((e.topic().to_string(), e.partition()), o);
        }
    }
    Ok(out)
}

fn watermarks(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<(i64, i64)> {
    consumer
        .fetch_watermarks(topic, partition, timeout)
        .with_context(|| format!("fetching the offsets of {topic}-{partition}"))
}

fn describe(
    connection: &ConnectionArgs,
    group: &str,
    timeout: Duration,
    output: Output,
) -> Result<()> {
    let consumer = group_consumer(connection, group)?;
    let description = describe_group(&consumer, group, timeout)?;
    let offsets = committed(&consumer, &all_partitions(&consumer, timeout)?, timeout)?;
    if description.state == "Dead" && description.members.is_empty() && offsets.is_empty() {
        bail!("Consumer group '{group}' does not exist.");
    }
    // Partitions with a committed offset or an owner, as kafka-consumer-groups shows them.
    let mut owner: BTreeMap<(String, i32), &Member> = BTreeMap::new();
    for m in &description.members {
        for (t, ps) in &m.assignment {
            for p in ps {
                owner.insert((t.clone(), *p), m);
            }
        }
    }
    let keys: BTreeSet<(String, i32)> = offsets.keys().chain(owner.keys()).cloned().collect();
    let mut rows = Vec::new();
    for (t, p) in keys {
        let (_, log_end) = watermarks(&consumer, &t, p, timeout)?;
        let current = offsets.get(&(t.clone(), p)).copied();
        let lag = current.map(|c| (log_end - c).max(0));
        rows.push((
            t.clone(),
            p,
            current,
            log_end,
            lag,
            owner.get(&(t, p)).copied(),
        ));
    }
    match output {
        Output::Json => {
            let members: Vec<_> = description
                .members
                .iter()
                .map(|m| {
                    json!({
                        "member_id": m.member_id,
                        "client_id": m.client_id,
                        "host": m.host,
                        "assignment": m.assignment.iter()
                            .map(|(t, ps)| json!({"topic": t, "partitions": ps}))
                            .collect::<Vec<_>>(),
                    })
                })
                .collect();
            let offsets: Vec<_> = rows
                .iter()
                .map(|(t, p, current, end, lag, m)| {
                    json!({
                        "topic": t,
                        "partition": p,
                        "current_offset": current,
                        "log_end_offset": end,
                        "lag": lag,
                        "member_id": m.map(|m| &m.member_id),
                        "host": m.map(|m| &m.host),
                        "client_id": m.map(|m| &m.client_id),
                    })
                })
                .collect();
            println!(
                "{}",
                json!({
                    "group": group,
                    "state": description.state,
                    "protocol": description.protocol,
                    "members": members,
                    "offsets": offsets,
                })
            );
        }
        Output::Table => {
            println!(
                "Group {group}: state {}, {} member(s){}",
                description.state,
                description.members.len(),
                if description.protocol.is_empty() {
                    String::new()
                } else {
                    format!(", assignor {}", description.protocol)
                }
            );
            if description.members.is_empty() {
                println!("Consumer group '{group}' has no active members.");
            } else {
                let mut table = Table::new();
                table.load_preset(UTF8_FULL_CONDENSED);
                table.set_header([
                    "Member id",
                    "Host",
                    "Client id",
                    "#Partitions",
                    "Assignment",
                ]);
                for m in &description.members {
                    let count: usize = m.assignment.iter().map(|(_, ps)| ps.len()).sum();
                    let assignment = m
                        .assignment
                        .iter()
                        .map(|(t, ps)| format!("{t}({})", join(ps)))
                        .collect::<Vec<_>>()
                        .join(" ");
                    table.add_row([
                        m.member_id.clone(),
                        m.host.clone(),
                        m.client_id.clone(),
                        count.to_string(),
                        assignment,
                    ]);
                }
                println!("{table}");
            }
            let mut table = Table::new();
            table.load_preset(UTF8_FULL_CONDENSED);
            table.set_header([
                "Topic",
                "Partition",
                "Current offset",
                "Log end offset",
                "Lag",
                "Member id",
                "Host",
                "Client id",
            ]);
            let dash = || "-".to_string();
            for (t, p, current, end, lag, m) in rows {
                table.add_row([
                    t,
                    p.to_string(),
                    current.map_or_else(dash, |c| c.to_string()),
                    end.to_string(),
                    lag.map_or_else(dash, |l| l.to_string()),
                    m.map_or_else(dash, |m| m.member_id.clone()),
                    m.map_or_else(dash, |m| m.host.clone()),
                    m.map_or_else(dash, |m| m.client_id.clone()),
                ]);
            }
            println!("{table}");
        }
    }
    Ok(())
}

fn join(ps: &[i32]) -> String {
    ps.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}

/// `orders` or `orders:0,2`.
fn parse_topic_partitions(s: &str) -> Result<(String, Vec<i32>)> {
    let (topic, partitions) = match s.split_once(':') {
        Some((t, ps)) => {
            let ps = ps
                .split(',')
                .map(|p| {
                    p.trim()
                        .parse::<i32>()
                        .ok()
                        .filter(|p| *p >= 0)
                        .with_context(|| format!("partition {p:?} in {s:?} is not a partition id"))
                })
                .collect::<Result<Vec<_>>>()?;
            (t, ps)
        }
        None => (s, vec![]),
    };
    ensure!(!topic.is_empty(), "empty topic name in {s:?}");
    Ok((topic.to_string(), partitions))
}

/// Milliseconds since the epoch from `YYYY-MM-DDTHH:mm:SS[.sss][Z|±HH:MM]` (UTC when no zone
/// is given) or from a number of milliseconds.
fn parse_datetime_ms(s: &str) -> Result<i64> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let bad = || format!("{s:?} is not YYYY-MM-DDTHH:mm:SS[.sss][Z|+HH:MM] or epoch milliseconds");
    let (date, rest) = s.split_once('T').with_context(bad)?;
    let (time, offset_minutes) = if let Some(t) = rest.strip_suffix('Z') {
        (t, 0)
    } else if let Some(i) = rest.rfind(['+', '-']) {
        let (t, zone) = rest.split_at(i);
        let sign = if zone.starts_with('-') { -1 } else { 1 };
        let (h, m) = zone[1..].split_once(':').unwrap_or((&zone[1..], "0"));
        let h: i64 = h.parse().ok().with_context(bad)?;
        let m: i64 = m.parse().ok().with_context(bad)?;
        (t, sign * (h * 60 + m))
    } else {
        (rest, 0)
    };
    let num = |x: &str| x.parse::<i64>().ok().with_context(bad);
    let d: Vec<&str> = date.split('-').collect();
    ensure!(d.len() == 3, bad());
    let (year, month, day) = (num(d[0])?, num(d[1])?, num(d[2])?);
    let (hms, millis) = match time.split_once('.') {
        Some((hms, frac)) => {
            let frac = format!("{frac:0<3}");
            (hms, num(frac.get(..3).with_context(bad)?)?)
        }
        None => (time, 0),
    };
    let t: Vec<&str> = hms.split(':').collect();
    ensure!(t.len() == 3, bad());
    let (hour, minute, second) = (num(t[0])?, num(t[1])?, num(t[2])?);
    ensure!(
        (1..=12).contains(&month)
            && (1..=31).contains(&day)
            && hour < 24
            && minute < 60
            && second < 61
            && hour >= 0
            && minute >= 0
            && second >= 0,
        bad()
    );
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Ok(seconds * 1000 + millis)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// One line of the reset plan.
struct Planned {
    topic: String,
    partition: i32,
    current: Option<i64>,
    new_offset: i64,
}

fn reset_offsets(
    connection: &ConnectionArgs,
    args: &ResetArgs,
    timeout: Duration,
    output: Output,
) -> Result<()> {
    let group = args.group.as_str();
    let consumer = group_consumer(connection, group)?;
    let description = describe_group(&consumer, group, timeout)?;
    if !(description.state == "Empty" || description.state == "Dead") {
        bail!(
            "Assignments can only be reset if the group '{group}' is inactive, but the current \
             state is {}.",
            description.state
        );
    }
    let everything = all_partitions(&consumer, timeout)?;
    let current_all = committed(&consumer, &everything, timeout)?;
    let partitions: Vec<(String, i32)> = if args.all_topics {
        let topics: BTreeSet<&String> = current_all.keys().map(|(t, _)| t).collect();
        everything
            .iter()
            .filter(|(t, _)| topics.contains(t))
            .cloned()
            .collect()
    } else {
        let mut out = Vec::new();
        for (topic, ps) in &args.topic {
            let existing: Vec<i32> = everything
                .iter()
                .filter(|(t, _)| t == topic)
                .map(|(_, p)| *p)
                .collect();
            ensure!(!existing.is_empty(), "topic {topic} does not exist");
            if ps.is_empty() {
                out.extend(existing.iter().map(|p| (topic.clone(), *p)));
            } else {
                for p in ps {
                    ensure!(existing.contains(p), "partition {topic}-{p} does not exist");
                    out.push((topic.clone(), *p));
                }
            }
        }
        out
    };
    let by_time = match args.spec.to_datetime {
        Some(ts) => {
            let mut tpl = TopicPartitionList::new();
            for (t, p) in &partitions {
                tpl.add_partition_offset(t, *p, Offset::Offset(ts))
                    .with_context(|| format!("looking up {t}-{p} by time"))?;
            }
            let result = consumer
                .offsets_for_times(tpl, timeout)
                .context("looking up offsets by time")?;
            result
                .elements()
                .iter()
                .map(|e| {
                    let o = match e.offset() {
                        Offset::Offset(o) => Some(o),
                        _ => None,
                    };
                    ((e.topic().to_string(), e.partition()), o)
                })
                .collect::<BTreeMap<_, _>>()
        }
        None => BTreeMap::new(),
    };
    let mut plan = Vec::with_capacity(partitions.len());
    for (t, p) in partitions {
        let (start, end) = watermarks(&consumer, &t, p, timeout)?;
        let current = current_all.get(&(t.clone(), p)).copied();
        let spec = &args.spec;
        let new_offset = if spec.to_earliest {
            start
        } else if spec.to_latest {
            end
        } else if let Some(o) = spec.to_offset {
            o.clamp(start, end.max(start))
        } else if spec.to_datetime.is_some() {
            // No record at or after the time: the log end offset, as Kafka.
            by_time
                .get(&(t.clone(), p))
                .copied()
                .flatten()
                .unwrap_or(end)
        } else if let Some(n) = spec.shift_by {
            let Some(c) = current else {
                bail!("Cannot shift offset for partition {t}-{p} since there is no current committed offset");
            };
            c.saturating_add(n).clamp(start, end.max(start))
        } else {
            // --to-current
            match current {
                Some(c) => c,
                None => bail!("Partition {t}-{p} has no committed offset to keep (--to-current)"),
            }
        };
        plan.push(Planned {
            topic: t,
            partition: p,
            current,
            new_offset,
        });
    }
    if args.execute && !plan.is_empty() {
        let mut tpl = TopicPartitionList::new();
        for e in &plan {
            tpl.add_partition_offset(&e.topic, e.partition, Offset::Offset(e.new_offset))
                .with_context(|| format!("committing {}-{}", e.topic, e.partition))?;
        }
        consumer
            .commit(&tpl, CommitMode::Sync)
            .with_context(|| format!("committing offsets for group {group}"))?;
    }
    match output {
        Output::Json => {
            let value: Vec<_> = plan
                .iter()
                .map(|e| {
                    json!({
                        "group": group,
                        "topic": e.topic,
                        "partition": e.partition,
                        "current_offset": e.current,
                        "new_offset": e.new_offset,
                    })
                })
                .collect();
            println!("{}", json!({ "executed": args.execute, "offsets": value }));
        }
        Output::Table => {
            let mut table = Table::new();
            table.load_preset(UTF8_FULL_CONDENSED);
            table.set_header([
                "Group",
                "Topic",
                "Partition",
                "Current offset",
                "New offset",
            ]);
            for e in &plan {
                table.add_row([
                    group.to_string(),
                    e.topic.clone(),
                    e.partition.to_string(),
                    e.current.map_or_else(|| "-".to_string(), |c| c.to_string()),
                    e.new_offset.to_string(),
                ]);
            }
            println!("{table}");
            if !args.execute {
                eprintln!("Dry run: nothing was committed. Add --execute to commit these offsets.");
            }
        }
    }
    Ok(())
}

async fn delete(
    connection: &ConnectionArgs,
    group: &str,
    timeout: Duration,
    output: Output,
) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = connection
        .client_config(&[])
        .create()
        .context("creating the admin client")?;
    let opts = AdminOptions::new()
        .request_timeout(Some(timeout))
        .operation_timeout(Some(timeout));
    let results = admin
        .delete_groups(&[group], &opts)
        .await
        .with_context(|| format!("deleting group {group}"))?;
    for r in results {
        if let Err((g, code)) = r {
            bail!(
                "Deletion of some consumer groups failed:\n* Group '{g}' could not be deleted \
                 due to: {code}"
            );
        }
    }
    match output {
        Output::Table => {
            println!("Deletion of requested consumer groups ('{group}') was successful.");
        }
        Output::Json => println!("{}", json!({ "deleted": group })),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(version: i16, topics: &[(&str, &[i32])], user_data: Option<&[u8]>) -> Vec<u8> {
        let mut b = version.to_be_bytes().to_vec();
        b.extend((topics.len() as i32).to_be_bytes());
        for (t, ps) in topics {
            b.extend((t.len() as i16).to_be_bytes());
            b.extend(t.as_bytes());
            b.extend((ps.len() as i32).to_be_bytes());
            for p in *ps {
                b.extend(p.to_be_bytes());
            }
        }
        match user_data {
            Some(u) => {
                b.extend((u.len() as i32).to_be_bytes());
                b.extend(u);
            }
            None => b.extend((-1i32).to_be_bytes()),
        }
        b
    }

    #[test]
    fn assignments_decode() {
        let bytes = encode(3, &[("orders", &[2, 0]), ("t", &[])], Some(b"x"));
        assert_eq!(
            decode_assignment(&bytes).unwrap(),
            vec![
                ("orders".to_string(), vec![0, 2]),
                ("t".to_string(), vec![])
            ]
        );
        assert_eq!(decode_assignment(&encode(0, &[], None)).unwrap(), vec![]);
    }

    #[test]
    fn bad_assignments_are_errors() {
        let bytes = encode(1, &[("orders", &[1, 2, 3])], None);
        for cut in 0..bytes.len() - 4 {
            assert!(decode_assignment(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut huge = 0i16.to_be_bytes().to_vec();
        huge.extend(i32::MAX.to_be_bytes());
        assert!(decode_assignment(&huge).is_err());
    }

    #[test]
    fn topic_partitions_parse() {
        assert_eq!(parse_topic_partitions("t").unwrap(), ("t".into(), vec![]));
        assert_eq!(
            parse_topic_partitions("t:0,2").unwrap(),
            ("t".into(), vec![0, 2])
        );
        assert!(parse_topic_partitions("t:x").is_err());
        assert!(parse_topic_partitions(":1").is_err());
    }

    #[test]
    fn datetimes_parse() {
        assert_eq!(parse_datetime_ms("1970-01-01T00:00:00").unwrap(), 0);
        assert_eq!(
            parse_datetime_ms("2024-02-29T12:34:56.789Z").unwrap(),
            1_709_210_096_789
        );
        assert_eq!(
            parse_datetime_ms("2024-02-29T14:34:56.789+02:00").unwrap(),
            1_709_210_096_789
        );
        assert_eq!(
            parse_datetime_ms("1700000000000").unwrap(),
            1_700_000_000_000
        );
        assert!(parse_datetime_ms("2024-13-01T00:00:00").is_err());
        assert!(parse_datetime_ms("yesterday").is_err());
    }
}
