//! `__consumer_offsets` is compacted: many commits of the same group and partition shrink to
//! the latest one, and the committed offset survives the cleaning and a restart.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::{Bytes, BytesMut};
use gregor_tests::Gregor;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, GroupId, OffsetCommitRequest, OffsetFetchRequest, RequestHeader,
    RequestKind, ResponseHeader, ResponseKind, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

fn encode(key: ApiKey, version: i16, correlation_id: i32, req: &RequestKind) -> Result<Vec<u8>> {
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(sb("offsets-compaction-test")))
        .encode(&mut buf, key.request_header_version(version))?;
    req.encode(&mut buf, version)?;
    let mut out = (buf.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&buf);
    Ok(out)
}

fn read(s: &mut TcpStream, key: ApiKey, version: i16) -> Result<ResponseKind> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut body)?;
    let mut b = Bytes::from(body);
    ResponseHeader::decode(&mut b, key.response_header_version(version))?;
    ResponseKind::decode(key, &mut b, version)
}

fn commit_request(offset: i64) -> RequestKind {
    OffsetCommitRequest::default()
        .with_group_id(GroupId(sb("busy")))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(sb("t")))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(offset)])])
        .into()
}

fn fetch_committed(bootstrap: &str) -> Result<i64> {
    let mut s = TcpStream::connect(bootstrap)?;
    let req: RequestKind = OffsetFetchRequest::default()
        .with_group_id(GroupId(sb("busy")))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(TopicName(sb("t")))
            .with_partition_indexes(vec![0])]))
        .into();
    s.write_all(&encode(ApiKey::OffsetFetch, 7, 1, &req)?)?;
    match read(&mut s, ApiKey::OffsetFetch, 7)? {
        ResponseKind::OffsetFetch(r) => Ok(r.topics[0].partitions[0].committed_offset),
        o => bail!("unexpected {o:?}"),
    }
}

/// (log size now, bytes ever appended) of `__consumer_offsets`, from /metrics.
fn offsets_log_bytes(g: &Gregor) -> Result<(f64, f64)> {
    let (_, body) = g.admin_get("/metrics")?;
    let value = |prefix: &str| -> Option<f64> {
        body.lines()
            .find(|l| l.starts_with(prefix) && l.contains("topic=\"__consumer_offsets\""))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse().ok())
    };
    Ok((
        value("gregor_log_size_bytes{").context("no log size for __consumer_offsets")?,
        value("gregor_topic_bytes_in_total{").context("no bytes in for __consumer_offsets")?,
    ))
}

#[test]
fn many_commits_of_one_group_compact_to_the_latest() -> Result<()> {
    const COMMITS: i64 = 30_000;
    let mut g = Gregor::start(
        BIN,
        &[
            "offsets.topic.num.partitions=1",
            "offsets.topic.segment.bytes=1048576",
            "log.cleaner.backoff.ms=100",
            "log.cleaner.min.cleanable.ratio=0.01",
        ],
    )?;
    let bs = g.bootstrap();
    let mut s = TcpStream::connect(&bs)?;
    let create: RequestKind = CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(sb("t")))
            .with_num_partitions(1)
            .with_replication_factor(1)])
        .into();
    s.write_all(&encode(ApiKey::CreateTopics, 7, 0, &create)?)?;
    read(&mut s, ApiKey::CreateTopics, 7)?;
    // As clients do: find the coordinator first (this creates __consumer_offsets).
    let find: RequestKind = kafka_protocol::messages::FindCoordinatorRequest::default()
        .with_key(sb("busy"))
        .into();
    s.write_all(&encode(ApiKey::FindCoordinator, 3, 0, &find)?)?;
    match read(&mut s, ApiKey::FindCoordinator, 3)? {
        ResponseKind::FindCoordinator(r) => ensure!(r.error_code == 0, "{r:?}"),
        o => bail!("unexpected {o:?}"),
    }

    // Commits pipelined 100 at a time (responses come back in order).
    let mut next = 0i64;
    while next < COMMITS {
        let batch_end = (next + 100).min(COMMITS);
        let mut out = Vec::new();
        for offset in next..batch_end {
            out.extend(encode(
                ApiKey::OffsetCommit,
                8,
                offset as i32,
                &commit_request(offset),
            )?);
        }
        s.write_all(&out)?;
        for _ in next..batch_end {
            match read(&mut s, ApiKey::OffsetCommit, 8)? {
                ResponseKind::OffsetCommit(r) => {
                    let code = r.topics[0].partitions[0].error_code;
                    ensure!(code == 0, "commit failed with {code}");
                }
                o => bail!("unexpected {o:?}"),
            }
        }
        next = batch_end;
    }
    ensure!(fetch_committed(&bs)? == COMMITS - 1);

    // Several closed 1 MiB segments of commits of one key shrink to (almost) nothing: what
    // is left is at most the active segment plus one batch per cleaned segment.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut size, written) = offsets_log_bytes(&g)?;
    ensure!(written > 3_000_000.0, "the test wrote only {written} bytes");
    while size > written / 3.0 {
        ensure!(
            Instant::now() < deadline,
            "__consumer_offsets-0 still {size} of {written} bytes after 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
        size = offsets_log_bytes(&g)?.0;
    }
    ensure!(fetch_committed(&bs)? == COMMITS - 1);
    // The cleaned log is what the coordinator reloads from.
    g.restart()?;
    ensure!(
        fetch_committed(&bs)? == COMMITS - 1,
        "committed offset lost after restart"
    );
    Ok(())
}
