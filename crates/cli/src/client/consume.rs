//! `gregor consume TOPIC`: prints records one per line until `--max-messages`, `--timeout-ms`
//! of silence, or Ctrl-C.
//!
//! With `--partition` or `--offset` the consumer assigns partitions itself (no group, nothing
//! committed); otherwise it subscribes, in `--group` if given (committing offsets) or in a
//! throwaway group (committing nothing).

use super::format::{Fields, Template};
use super::{ConnectionArgs, Output};
use anyhow::{bail, Context, Result};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::json;
use std::io::Write;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct ConsumeArgs {
    /// Topic to consume from.
    topic: String,
    #[command(flatten)]
    pub(super) connection: ConnectionArgs,
    /// Start from the earliest offset when there is no committed or given offset.
    #[arg(long)]
    from_beginning: bool,
    /// Read only this partition (assigns it; no group).
    #[arg(long, short = 'p')]
    partition: Option<i32>,
    /// Start offset: a number, `earliest` or `latest` (assigns partitions; no group).
    #[arg(long, short = 'o', value_parser = parse_offset)]
    offset: Option<StartOffset>,
    /// Stop after this many records.
    #[arg(long, short = 'n')]
    max_messages: Option<u64>,
    /// Stop when no record arrives for this long, in milliseconds.
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// Consumer group; offsets are committed to it.
    #[arg(long, short = 'g')]
    group: Option<String>,
    /// Output template: %k %v %p %o %t %h %T, or {key} {value} {partition} {offset}
    /// {timestamp} {headers} {topic}; \t and \n escapes.
    #[arg(long, default_value = "%v")]
    format: String,
    /// `json` prints one JSON object per record instead of the template.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StartOffset {
    Earliest,
    Latest,
    At(i64),
}

fn parse_offset(s: &str) -> Result<StartOffset> {
    match s {
        "earliest" | "beginning" => Ok(StartOffset::Earliest),
        "latest" | "end" => Ok(StartOffset::Latest),
        n => match n.parse::<i64>() {
            Ok(n) if n >= 0 => Ok(StartOffset::At(n)),
            _ => bail!("offset must be a non-negative number, `earliest` or `latest`, got {s:?}"),
        },
    }
}

impl StartOffset {
    fn to_rdkafka(self) -> Offset {
        match self {
            Self::Earliest => Offset::Beginning,
            Self::Latest => Offset::End,
            Self::At(n) => Offset::Offset(n),
        }
    }
}

pub async fn run(args: ConsumeArgs) -> Result<()> {
    let template = Template::parse(&args.format)?;
    let assign = args.partition.is_some() || args.offset.is_some();
    let commit = args.group.is_some() && !assign;
    let group = args.group.clone().unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        format!("gregor-consume-{}-{nanos}", std::process::id())
    });
    let reset = if args.from_beginning {
        "earliest"
    } else {
        "latest"
    };
    let consumer: StreamConsumer = args
        .connection
        .client_config(&[
            ("group.id", &group),
            ("enable.auto.commit", if commit { "true" } else { "false" }),
            // Only records that were printed count as consumed: offsets are stored by hand
            // after each write, so --max-messages commits exactly what it printed.
            ("enable.auto.offset.store", "false"),
            ("auto.offset.reset", reset),
            ("enable.partition.eof", "false"),
        ])
        .create()
        .context("creating the consumer")?;

    if assign {
        let start = args.offset.unwrap_or(if args.from_beginning {
            StartOffset::Earliest
        } else {
            StartOffset::Latest
        });
        let partitions = match args.partition {
            Some(p) => vec![p],
            None => partitions_of(&consumer, &args.topic)?,
        };
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition_offset(&args.topic, p, start.to_rdkafka())
                .with_context(|| format!("assigning {}-{p}", args.topic))?;
        }
        consumer.assign(&tpl).context("assigning partitions")?;
    } else {
        consumer
            .subscribe(&[&args.topic])
            .with_context(|| format!("subscribing to {}", args.topic))?;
    }

    let idle = args.timeout_ms.map(Duration::from_millis);
    // SIGTERM ends consumption like Ctrl-C: commit what was printed and leave the group.
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let mut out = std::io::BufWriter::new(std::io::stdout());
    let mut count: u64 = 0;
    let mut line = String::new();
    loop {
        if args.max_messages.is_some_and(|max| count >= max) {
            break;
        }
        let recv = consumer.recv();
        let received = tokio::select! {
            r = async {
                match idle {
                    Some(d) => tokio::time::timeout(d, recv).await.ok(),
                    None => Some(recv.await),
                }
            } => r,
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
        };
        let Some(received) = received else { break }; // idle for --timeout-ms
        let msg = received.with_context(|| format!("consuming from {}", args.topic))?;
        line.clear();
        render(&msg, &template, args.output, &mut line);
        line.push('\n');
        count += 1;
        let written = out.write_all(line.as_bytes()).and_then(|()| out.flush());
        match written {
            Ok(()) if commit => consumer
                .store_offset_from_message(&msg)
                .context("storing the consumed offset")?,
            Ok(()) => {}
            // The reader went away (`| head`): stop quietly, like other Unix tools.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(e).context("writing to stdout"),
        }
    }
    match out.flush() {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(e).context("writing to stdout")
        }
        _ => {}
    }
    if commit && count > 0 {
        match consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
            // The auto-commit already committed every stored offset: nothing is left to do.
            Err(rdkafka::error::KafkaError::ConsumerCommit(
                rdkafka::types::RDKafkaErrorCode::NoOffset,
            )) => {}
            other => other.context("committing consumed offsets")?,
        }
    }
    eprintln!("Processed a total of {count} messages");
    Ok(())
}

/// Partition ids of `topic`, from a metadata request.
fn partitions_of(consumer: &StreamConsumer, topic: &str) -> Result<Vec<i32>> {
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .with_context(|| format!("fetching metadata of {topic}"))?;
    let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
        bail!("topic {topic} not in metadata");
    };
    if let Some(err) = t.error() {
        bail!(
            "topic {topic}: {}",
            rdkafka::types::RDKafkaErrorCode::from(err)
        );
    }
    Ok(t.partitions().iter().map(|p| p.id()).collect())
}

fn render(msg: &BorrowedMessage<'_>, template: &Template, output: Output, out: &mut String) {
    let headers: Vec<(String, Option<Vec<u8>>)> = msg
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default();
    let timestamp_ms = msg.timestamp().to_millis();
    match output {
        Output::Table => template.render(
            &Fields {
                topic: msg.topic(),
                key: msg.key(),
                value: msg.payload(),
                partition: msg.partition(),
                offset: msg.offset(),
                timestamp_ms,
                headers: &headers,
            },
            out,
        ),
        Output::Json => {
            let text = |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned());
            let headers: Vec<_> = headers
                .iter()
                .map(|(k, v)| json!({ "key": k, "value": text(v.as_deref()) }))
                .collect();
            out.push_str(
                &json!({
                    "topic": msg.topic(),
                    "partition": msg.partition(),
                    "offset": msg.offset(),
                    "timestamp": timestamp_ms,
                    "key": text(msg.key()),
                    "value": text(msg.payload()),
                    "headers": headers,
                })
                .to_string(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse() {
        assert_eq!(parse_offset("earliest").unwrap(), StartOffset::Earliest);
        assert_eq!(parse_offset("latest").unwrap(), StartOffset::Latest);
        assert_eq!(parse_offset("17").unwrap(), StartOffset::At(17));
        assert!(parse_offset("-3").is_err());
        assert!(parse_offset("soon").is_err());
    }
}
