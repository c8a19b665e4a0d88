//! Consumer groups against the real `gregor` binary: librdkafka consumers in classic groups
//! (eager and cooperative-sticky), static membership, session timeouts, committed offsets
//! across restarts and crashes, and KIP-848 (`group.protocol=consumer`) members, whose
//! assignments survive a restart of the coordinator.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use gregor_tests::{clients, Gregor};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, RebalanceProtocol};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");
const TIMEOUT: Duration = Duration::from_secs(60);

fn create_topic(bootstrap: &str, name: &str, partitions: i32) -> Result<()> {
    clients::create_topic(bootstrap, name, partitions)
}

fn produce(bootstrap: &str, topic: &str, partitions: i32, n: usize, tag: &str) -> Result<()> {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()?;
    for i in 0..n {
        let key = format!("{tag}-{i}");
        let value = format!("{tag}-{i}");
        let part = (i as i32) % partitions;
        loop {
            match p.send(
                BaseRecord::to(topic)
                    .key(&key)
                    .payload(&value)
                    .partition(part),
            ) {
                Ok(()) => break,
                Err((e, _)) => {
                    p.poll(Duration::from_millis(10));
                    if !matches!(
                        e.rdkafka_error_code(),
                        Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                    ) {
                        bail!("produce: {e}");
                    }
                }
            }
        }
    }
    p.flush(Duration::from_secs(30))?;
    Ok(())
}

fn consumer(bootstrap: &str, group: &str, extra: &[(&str, &str)]) -> Result<BaseConsumer> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "200")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "500");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    Ok(c.create()?)
}

fn assigned(c: &BaseConsumer) -> usize {
    c.assignment().map(|a| a.count()).unwrap_or(0)
}

/// Polls every consumer until `done` says so or the timeout passes; records (partition,
/// offset) of every message and fails on a duplicate.
fn poll_all(
    consumers: &[&BaseConsumer],
    seen: &mut HashSet<(i32, i64)>,
    mut done: impl FnMut(&HashSet<(i32, i64)>, &[&BaseConsumer]) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + TIMEOUT;
    while !done(seen, consumers) {
        if Instant::now() > deadline {
            bail!(
                "timed out: {} records seen, assignments {:?}",
                seen.len(),
                consumers.iter().map(|c| assigned(c)).collect::<Vec<_>>()
            );
        }
        for c in consumers {
            if let Some(m) = c.poll(Duration::from_millis(20)) {
                // Transient client errors (a broker connection going down) are retried.
                let Ok(m) = m else { continue };
                ensure!(
                    seen.insert((m.partition(), m.offset())),
                    "record {}/{} consumed twice",
                    m.partition(),
                    m.offset()
                );
            }
        }
    }
    Ok(())
}

#[test]
fn three_members_share_six_partitions_each_record_once() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let b = g.bootstrap();
    create_topic(&b, "shared", 6)?;
    produce(&b, "shared", 6, 600, "a")?;
    let cs: Vec<BaseConsumer> = (0..3)
        .map(|_| consumer(&b, "g-three", &[]))
        .collect::<Result<_>>()?;
    let started = Instant::now();
    for c in &cs {
        c.subscribe(&["shared"])?;
    }
    let refs: Vec<&BaseConsumer> = cs.iter().collect();
    let mut seen = HashSet::new();
    let mut all_assigned_at = None;
    poll_all(&refs, &mut seen, |s, cs| {
        if all_assigned_at.is_none() && cs.iter().all(|c| assigned(c) == 2) {
            all_assigned_at = Some(started.elapsed());
        }
        s.len() == 600 && all_assigned_at.is_some()
    })?;
    let t = all_assigned_at.unwrap_or_default();
    eprintln!(
        "three members: JoinGroup to assignment took {} ms (group.initial.rebalance.delay.ms=3000)",
        t.as_millis()
    );
    ensure!(t < Duration::from_secs(15), "assignment took {t:?}");
    // Every member got two distinct partitions.
    let mut parts = HashSet::new();
    for c in &cs {
        for e in c.assignment()?.elements() {
            ensure!(parts.insert(e.partition()), "partition assigned twice");
        }
    }
    ensure!(parts.len() == 6);
    // The group is described as Stable with three consumer members.
    let groups = cs[0].fetch_group_list(Some("g-three"), Duration::from_secs(10))?;
    let gi = &groups.groups()[0];
    ensure!(gi.state() == "Stable", "state {}", gi.state());
    ensure!(gi.protocol_type() == "consumer");
    ensure!(gi.members().len() == 3);
    ensure!(gi.members()[0].client_host().starts_with("/127.0.0.1"));
    Ok(())
}

/// A member that joins over the raw protocol, syncs, and then goes silent: a crashed client.
mod raw {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use anyhow::{ensure, Context, Result};
    use bytes::{BufMut, Bytes, BytesMut};
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

    pub struct Conn {
        s: TcpStream,
        correlation: i32,
    }

    pub fn sb(s: &str) -> StrBytes {
        StrBytes::from_string(s.to_string())
    }

    impl Conn {
        pub fn connect(bootstrap: &str) -> Result<Self> {
            Ok(Self {
                s: TcpStream::connect(bootstrap)?,
                correlation: 0,
            })
        }

        pub fn call(
            &mut self,
            key: ApiKey,
            version: i16,
            req: &RequestKind,
        ) -> Result<ResponseKind> {
            self.correlation += 1;
            let mut buf = BytesMut::new();
            RequestHeader::default()
                .with_request_api_key(key as i16)
                .with_request_api_version(version)
                .with_correlation_id(self.correlation)
                .with_client_id(Some(sb("raw-member")))
                .encode(&mut buf, key.request_header_version(version))?;
            req.encode(&mut buf, version)
                .with_context(|| format!("encoding {key:?} v{version}"))?;
            self.s.write_all(&(buf.len() as i32).to_be_bytes())?;
            self.s.write_all(&buf)?;
            let mut len = [0u8; 4];
            self.s
                .read_exact(&mut len)
                .with_context(|| format!("no response to {key:?} v{version}"))?;
            let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
            self.s.read_exact(&mut body)?;
            let mut b = Bytes::from(body);
            let h = ResponseHeader::decode(&mut b, key.response_header_version(version))?;
            ensure!(h.correlation_id == self.correlation, "correlation id");
            let resp = ResponseKind::decode(key, &mut b, version)
                .with_context(|| format!("decoding {key:?} v{version}"))?;
            ensure!(b.is_empty(), "{key:?} v{version}: trailing bytes");
            Ok(resp)
        }
    }

    /// ConsumerProtocolSubscription v0.
    pub fn subscription(topics: &[&str]) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(0);
        b.put_i32(topics.len() as i32);
        for t in topics {
            b.put_i16(t.len() as i16);
            b.put_slice(t.as_bytes());
        }
        b.put_i32(-1);
        b.freeze()
    }

    #[allow(clippy::too_many_arguments)] // mirrors JoinGroup's fields one to one
    pub fn join(
        c: &mut Conn,
        version: i16,
        group: &str,
        member_id: &str,
        instance: Option<&str>,
        protocol: &str,
        topics: &[&str],
        session_timeout_ms: i32,
    ) -> Result<JoinGroupResponse> {
        let req = JoinGroupRequest::default()
            .with_group_id(GroupId(sb(group)))
            .with_session_timeout_ms(session_timeout_ms)
            .with_rebalance_timeout_ms(session_timeout_ms)
            .with_member_id(sb(member_id))
            .with_group_instance_id(instance.map(sb))
            .with_protocol_type(sb("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(sb(protocol))
                .with_metadata(subscription(topics))]);
        match c.call(ApiKey::JoinGroup, version, &req.into())? {
            ResponseKind::JoinGroup(r) => Ok(r),
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }

    pub fn sync(
        c: &mut Conn,
        version: i16,
        group: &str,
        generation: i32,
        member_id: &str,
        instance: Option<&str>,
        assignments: Vec<(String, Bytes)>,
    ) -> Result<SyncGroupResponse> {
        let req = SyncGroupRequest::default()
            .with_group_id(GroupId(sb(group)))
            .with_generation_id(generation)
            .with_member_id(sb(member_id))
            .with_group_instance_id(instance.map(sb))
            .with_assignments(
                assignments
                    .into_iter()
                    .map(|(m, a)| {
                        sync_group_request::SyncGroupRequestAssignment::default()
                            .with_member_id(sb(&m))
                            .with_assignment(a)
                    })
                    .collect(),
            );
        match c.call(ApiKey::SyncGroup, version, &req.into())? {
            ResponseKind::SyncGroup(r) => Ok(r),
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }

    pub fn heartbeat(
        c: &mut Conn,
        version: i16,
        group: &str,
        generation: i32,
        member_id: &str,
        instance: Option<&str>,
    ) -> Result<i16> {
        let req = HeartbeatRequest::default()
            .with_group_id(GroupId(sb(group)))
            .with_generation_id(generation)
            .with_member_id(sb(member_id))
            .with_group_instance_id(instance.map(sb));
        match c.call(ApiKey::Heartbeat, version, &req.into())? {
            ResponseKind::Heartbeat(r) => Ok(r.error_code),
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }

    pub fn find_coordinator(c: &mut Conn, group: &str) -> Result<()> {
        let req = FindCoordinatorRequest::default()
            .with_key(sb(group))
            .with_key_type(0);
        match c.call(ApiKey::FindCoordinator, 3, &req.into())? {
            ResponseKind::FindCoordinator(r) => {
                ensure!(r.error_code == 0, "FindCoordinator error {}", r.error_code);
                Ok(())
            }
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
}

#[test]
fn a_member_leaves_and_one_crashes_and_the_others_take_over() -> Result<()> {
    let g = Gregor::start(
        BIN,
        &[
            "group.min.session.timeout.ms=1000",
            "group.initial.rebalance.delay.ms=500",
        ],
    )?;
    let b = g.bootstrap();
    create_topic(&b, "takeover", 6)?;
    let a = consumer(&b, "g-takeover", &[])?;
    let leaver = consumer(&b, "g-takeover", &[])?;
    a.subscribe(&["takeover"])?;
    leaver.subscribe(&["takeover"])?;
    let mut seen = HashSet::new();
    poll_all(&[&a, &leaver], &mut seen, |_, cs| {
        cs.iter().map(|c| assigned(c)).sum::<usize>() == 6 && cs.iter().all(|c| assigned(c) > 0)
    })?;
    // A raw member joins (rebalance), is given partitions by the leader, then goes silent.
    let mut crashed = raw::Conn::connect(&b)?;
    raw::find_coordinator(&mut crashed, "g-takeover")?;
    let first = raw::join(
        &mut crashed,
        5,
        "g-takeover",
        "",
        None,
        "range",
        &["takeover"],
        2000,
    )?;
    let member_id = first.member_id.to_string();
    let stop = Arc::new(AtomicBool::new(false));
    // The join completes only once the rdkafka members rejoin, so poll them meanwhile.
    let joined = std::thread::scope(|s| -> Result<_> {
        let h = s.spawn(|| -> Result<_> {
            let r = raw::join(
                &mut crashed,
                5,
                "g-takeover",
                &member_id,
                None,
                "range",
                &["takeover"],
                2000,
            );
            stop.store(true, Ordering::SeqCst);
            r
        });
        let deadline = Instant::now() + TIMEOUT;
        while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
            let _ = a.poll(Duration::from_millis(20));
            let _ = leaver.poll(Duration::from_millis(20));
        }
        h.join()
            .map_err(|_| anyhow::anyhow!("join thread panicked"))?
    })?;
    ensure!(
        joined.error_code == 0,
        "raw join error {}",
        joined.error_code
    );
    let generation = joined.generation_id;
    let done = AtomicBool::new(false);
    let synced = std::thread::scope(|s| -> Result<_> {
        let h = s.spawn(|| {
            let r = raw::sync(
                &mut crashed,
                3,
                "g-takeover",
                generation,
                &member_id,
                None,
                vec![],
            );
            done.store(true, Ordering::SeqCst);
            r
        });
        while !done.load(Ordering::SeqCst) {
            let _ = a.poll(Duration::from_millis(20));
            let _ = leaver.poll(Duration::from_millis(20));
        }
        h.join()
            .map_err(|_| anyhow::anyhow!("sync thread panicked"))?
    })?;
    ensure!(
        synced.error_code == 0,
        "raw sync error {}",
        synced.error_code
    );
    ensure!(
        !synced.assignment.is_empty(),
        "the crashed member got partitions"
    );
    // Now the leaver closes (LeaveGroup) and the raw member never heartbeats again.
    drop(leaver);
    let mut seen = HashSet::new();
    poll_all(&[&a], &mut seen, |_, cs| assigned(cs[0]) == 6)?;
    produce(&b, "takeover", 6, 60, "after")?;
    let before = seen.len();
    poll_all(&[&a], &mut seen, |s, _| s.len() >= before + 60)?;
    Ok(())
}

#[test]
fn cooperative_sticky_incremental_rebalance() -> Result<()> {
    let g = Gregor::start(BIN, &["group.initial.rebalance.delay.ms=300"])?;
    let b = g.bootstrap();
    create_topic(&b, "coop", 6)?;
    produce(&b, "coop", 6, 120, "x")?;
    let extra = [("partition.assignment.strategy", "cooperative-sticky")];
    let a = consumer(&b, "g-coop", &extra)?;
    a.subscribe(&["coop"])?;
    let mut seen = HashSet::new();
    poll_all(&[&a], &mut seen, |s, cs| {
        s.len() == 120 && assigned(cs[0]) == 6
    })?;
    ensure!(matches!(
        a.rebalance_protocol(),
        RebalanceProtocol::Cooperative
    ));
    let before: HashSet<i32> = a
        .assignment()?
        .elements()
        .iter()
        .map(|e| e.partition())
        .collect();
    let c2 = consumer(&b, "g-coop", &extra)?;
    c2.subscribe(&["coop"])?;
    let mut min_a = 6;
    poll_all(&[&a, &c2], &mut seen, |_, cs| {
        min_a = min_a.min(assigned(cs[0]));
        assigned(cs[0]) == 3 && assigned(cs[1]) == 3
    })?;
    // Incremental: the first member only gave up partitions, it never lost all of them.
    ensure!(min_a >= 3, "first member dropped to {min_a} partitions");
    let after: HashSet<i32> = a
        .assignment()?
        .elements()
        .iter()
        .map(|e| e.partition())
        .collect();
    ensure!(after.is_subset(&before));
    produce(&b, "coop", 6, 60, "y")?;
    poll_all(&[&a, &c2], &mut seen, |s, _| s.len() == 180)?;
    Ok(())
}

#[test]
fn static_member_restarts_without_rebalance() -> Result<()> {
    let g = Gregor::start(BIN, &["group.initial.rebalance.delay.ms=300"])?;
    let b = g.bootstrap();
    create_topic(&b, "static", 2)?;
    let extra = [
        ("group.instance.id", "instance-1"),
        ("session.timeout.ms", "30000"),
    ];
    let c = consumer(&b, "g-static", &extra)?;
    c.subscribe(&["static"])?;
    let mut seen = HashSet::new();
    poll_all(&[&c], &mut seen, |_, cs| assigned(cs[0]) == 2)?;
    // Watch the generation with a raw heartbeat: the group's generation is in the OffsetFetch
    // answers of neither API, but a commit at the wrong generation fails, so commit with it.
    let groups = c.fetch_group_list(Some("g-static"), Duration::from_secs(10))?;
    let old_member = groups.groups()[0].members()[0].id().to_string();
    drop(c); // a static member sends no LeaveGroup
    let c = consumer(&b, "g-static", &extra)?;
    let restarted = Instant::now();
    c.subscribe(&["static"])?;
    poll_all(&[&c], &mut seen, |_, cs| assigned(cs[0]) == 2)?;
    let took = restarted.elapsed();
    let groups = c.fetch_group_list(Some("g-static"), Duration::from_secs(10))?;
    let gi = &groups.groups()[0];
    ensure!(gi.state() == "Stable");
    ensure!(gi.members().len() == 1, "one member, the old id replaced");
    ensure!(gi.members()[0].id() != old_member);
    // No rebalance: the rejoin did not wait for group.initial.rebalance.delay.ms or the
    // session timeout of the old incarnation.
    ensure!(took < Duration::from_secs(10), "rejoin took {took:?}");
    let mut conn = raw::Conn::connect(&b)?;
    // The old member id is fenced.
    let code = raw::heartbeat(&mut conn, 4, "g-static", 1, &old_member, Some("instance-1"))?;
    ensure!(code == 82, "old static member id: {code}");
    // The generation did not move: heartbeating the new id at generation 1 works.
    let new_member = gi.members()[0].id().to_string();
    let code = raw::heartbeat(&mut conn, 4, "g-static", 1, &new_member, Some("instance-1"))?;
    ensure!(
        code == 0,
        "generation changed: heartbeat at generation 1 -> {code}"
    );
    Ok(())
}

fn commit_and_check_after(restart: impl FnOnce(&mut Gregor) -> Result<()>) -> Result<()> {
    let mut g = Gregor::start(BIN, &["group.initial.rebalance.delay.ms=0"])?;
    let b = g.bootstrap();
    create_topic(&b, "durable", 3)?;
    produce(&b, "durable", 3, 30, "d")?;
    {
        let c = consumer(&b, "g-durable", &[("enable.auto.commit", "false")])?;
        c.subscribe(&["durable"])?;
        let mut seen = HashSet::new();
        poll_all(&[&c], &mut seen, |s, _| s.len() == 30)?;
        c.commit_consumer_state(CommitMode::Sync)?;
        // A simple (generation -1) commit in another group.
        let s = consumer(&b, "g-simple", &[])?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("durable", 1, Offset::Offset(7))?;
        s.commit(&tpl, CommitMode::Sync)?;
    }
    restart(&mut g)?;
    let b = g.bootstrap();
    let c = consumer(&b, "g-durable", &[])?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 {
        tpl.add_partition("durable", p);
    }
    let committed = c.committed_offsets(tpl.clone(), Duration::from_secs(20))?;
    let offsets: BTreeMap<i32, Offset> = committed
        .elements()
        .iter()
        .map(|e| (e.partition(), e.offset()))
        .collect();
    for p in 0..3 {
        ensure!(
            offsets[&p] == Offset::Offset(10),
            "partition {p}: {:?}",
            offsets[&p]
        );
    }
    let s = consumer(&b, "g-simple", &[])?;
    let committed = s.committed_offsets(tpl, Duration::from_secs(20))?;
    ensure!(committed.find_partition("durable", 1).map(|e| e.offset()) == Some(Offset::Offset(7)));
    // A consumer resumes after the committed offsets: nothing more to read.
    produce(&b, "durable", 3, 3, "later")?;
    c.subscribe(&["durable"])?;
    let mut seen = HashSet::new();
    poll_all(&[&c], &mut seen, |s, _| s.len() == 3)?;
    ensure!(seen.iter().all(|(_, o)| *o == 10), "resumed at {seen:?}");
    Ok(())
}

#[test]
fn committed_offsets_survive_a_graceful_restart() -> Result<()> {
    commit_and_check_after(|g| {
        g.stop()?;
        g.restart()
    })
}

#[test]
fn committed_offsets_survive_kill_9() -> Result<()> {
    commit_and_check_after(|g| {
        g.kill9()?;
        g.restart()
    })
}

#[test]
fn kip848_consumer_protocol_members_share_a_topic() -> Result<()> {
    let g = Gregor::start(BIN, &["group.consumer.heartbeat.interval.ms=500"])?;
    let b = g.bootstrap();
    create_topic(&b, "kip848", 6)?;
    produce(&b, "kip848", 6, 300, "k")?;
    let extra = [("group.protocol", "consumer")];
    let mk = || -> Result<BaseConsumer> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &b)
            .set("group.id", "g-kip848")
            .set("group.protocol", extra[0].1)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "200");
        Ok(c.create()?)
    };
    let c1 = mk()?;
    let c2 = mk()?;
    c1.subscribe(&["kip848"])?;
    c2.subscribe(&["kip848"])?;
    let mut seen = HashSet::new();
    poll_all(&[&c1, &c2], &mut seen, |s, cs| {
        s.len() == 300 && assigned(cs[0]) == 3 && assigned(cs[1]) == 3
    })?;
    // Described by ListGroups as a consumer group; a classic DescribeGroups says Dead.
    let groups = c1.fetch_group_list(Some("g-kip848"), Duration::from_secs(10))?;
    ensure!(
        groups.groups()[0].state() == "Dead",
        "classic describe of a consumer group"
    );
    drop(c2);
    let mut seen2 = HashSet::new();
    poll_all(&[&c1], &mut seen2, |_, cs| assigned(cs[0]) == 6)?;
    Ok(())
}

/// A KIP-848 group as raw ConsumerGroupDescribe v0 reports it: (state, group epoch,
/// assignment epoch, members as (id, epoch, assigned "topic-id:partition"s)).
type DescribedGroup = (String, i32, i32, BTreeMap<String, (i32, Vec<String>)>);

fn consumer_group_describe(bootstrap: &str, group: &str) -> Result<DescribedGroup> {
    use kafka_protocol::messages::{
        ApiKey, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, GroupId,
        RequestHeader, ResponseHeader,
    };
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
    use std::io::{Read, Write};
    let key = ApiKey::ConsumerGroupDescribe;
    let mut buf = bytes::BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(0)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("groups-test")))
        .encode(&mut buf, key.request_header_version(0))?;
    ConsumerGroupDescribeRequest::default()
        .with_group_ids(vec![GroupId(StrBytes::from_string(group.to_string()))])
        .encode(&mut buf, 0)?;
    let mut s = std::net::TcpStream::connect(bootstrap)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(&(buf.len() as i32).to_be_bytes())?;
    s.write_all(&buf)?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut body)?;
    let mut b = bytes::Bytes::from(body);
    ResponseHeader::decode(&mut b, key.response_header_version(0))?;
    let r = ConsumerGroupDescribeResponse::decode(&mut b, 0)?;
    let Some(g) = r.groups.into_iter().next() else {
        bail!("no group in the response");
    };
    ensure!(
        g.error_code == 0,
        "ConsumerGroupDescribe: error {}",
        g.error_code
    );
    let members = g
        .members
        .into_iter()
        .map(|m| {
            let mut parts: Vec<String> = m
                .assignment
                .topic_partitions
                .iter()
                .flat_map(|t| {
                    t.partitions
                        .iter()
                        .map(move |p| format!("{}:{p}", t.topic_id))
                })
                .collect();
            parts.sort();
            (m.member_id.to_string(), (m.member_epoch, parts))
        })
        .collect();
    Ok((
        g.group_state.to_string(),
        g.group_epoch,
        g.assignment_epoch,
        members,
    ))
}

#[test]
fn kip848_group_survives_a_coordinator_restart() -> Result<()> {
    let mut g = Gregor::start(BIN, &["group.consumer.heartbeat.interval.ms=500"])?;
    let b = g.bootstrap();
    create_topic(&b, "kip848-restart", 4)?;
    let mk = || -> Result<BaseConsumer> {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &b)
            .set("group.id", "g-kip848-restart")
            .set("group.protocol", "consumer")
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false");
        Ok(c.create()?)
    };
    let c1 = mk()?;
    let c2 = mk()?;
    c1.subscribe(&["kip848-restart"])?;
    c2.subscribe(&["kip848-restart"])?;
    let mut seen = HashSet::new();
    // The records are produced once both members hold their share: with auto-commit off, a
    // record read by the first member before the second joined would legitimately be read
    // again after the handover (nothing was committed), which is not what this test is about.
    poll_all(&[&c1, &c2], &mut seen, |_, cs| {
        assigned(cs[0]) == 2 && assigned(cs[1]) == 2
    })?;
    produce(&b, "kip848-restart", 4, 200, "a")?;
    poll_all(&[&c1, &c2], &mut seen, |s, cs| {
        s.len() == 200 && assigned(cs[0]) == 2 && assigned(cs[1]) == 2
    })?;
    c1.commit_consumer_state(CommitMode::Sync)?;
    c2.commit_consumer_state(CommitMode::Sync)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let before = loop {
        let d = consumer_group_describe(&b, "g-kip848-restart")?;
        if d.0 == "Stable" || Instant::now() > deadline {
            break d;
        }
        for c in [&c1, &c2] {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(20)) {
                bail!("record {}/{} read twice", m.partition(), m.offset());
            }
        }
    };
    ensure!(
        before.0 == "Stable" && before.3.len() == 2,
        "before: {before:?}"
    );

    g.stop()?;
    g.restart()?;
    // Right after the restart, before the members heartbeat again, the group is the same.
    let after = consumer_group_describe(&b, "g-kip848-restart")?;
    ensure!(
        after == before,
        "after the restart {after:?}, before {before:?}"
    );

    // The members carry on: new records are read once each, nothing below the committed
    // offsets is read again, and the group is not rebalanced.
    produce(&b, "kip848-restart", 4, 100, "b")?;
    poll_all(&[&c1, &c2], &mut seen, |s, _| s.len() == 300)?;
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        for c in [&c1, &c2] {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(20)) {
                bail!("record {}/{} read again", m.partition(), m.offset());
            }
        }
    }
    let later = consumer_group_describe(&b, "g-kip848-restart")?;
    ensure!(
        later.1 == before.1 && later.3 == before.3,
        "rebalanced after the restart: {later:?}, before {before:?}"
    );
    Ok(())
}
