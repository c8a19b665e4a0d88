//! Issue 9, defect 1: a few bytes from any client must not abort the broker. Each frame below
//! is tiny but carries an array count of 2^31 - 1 (or a compact count of 2^32 - 1) where the
//! request's first array is; before the fix, kafka-protocol reserved room for that many
//! elements (tens of GB) and the allocation failure aborted the process. Now each gets the
//! connection closed with a "malformed request" log line, the process stays up with a small
//! resident set, and another client keeps working.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use bytes::BytesMut;
use gregor_tests::Gregor;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, RequestHeader};
use kafka_protocol::protocol::{Encodable, StrBytes};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

/// An int32 array count of 2^31 - 1 (non-flexible versions).
const HUGE_COUNT: [u8; 4] = [0x7f, 0xff, 0xff, 0xff];
/// An unsigned-varint compact array count of 2^32 - 1, i.e. 2^32 - 2 elements (flexible).
const HUGE_COMPACT_COUNT: [u8; 5] = [0xff, 0xff, 0xff, 0xff, 0x0f];

/// A frame (with its size prefix): a request header, then `body`.
fn frame(key: ApiKey, version: i16, body: &[u8]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("hostile")))
        .encode(&mut buf, key.request_header_version(version))
        .expect("a request header encodes");
    buf.extend_from_slice(body);
    let mut out = (buf.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&buf);
    out
}

/// Requests whose body starts with an array, at a non-flexible and a flexible version, and a
/// Produce whose partition array (inside its one topic) is the huge one.
fn hostile_frames() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (key, old, flexible) in [
        (ApiKey::Metadata, 4, 12),
        (ApiKey::CreateTopics, 4, 7),
        (ApiKey::DeleteGroups, 1, 2),
        (ApiKey::DescribeGroups, 4, 5),
        (ApiKey::DescribeConfigs, 3, 4),
    ] {
        out.push((format!("{key:?} v{old}"), frame(key, old, &HUGE_COUNT)));
        out.push((
            format!("{key:?} v{flexible}"),
            frame(key, flexible, &HUGE_COMPACT_COUNT),
        ));
    }
    // Produce v8: transactional id null, acks 1, timeout 30000, one topic "t", then the
    // partition count.
    let mut produce = vec![0xff, 0xff, 0, 1, 0, 0, 0x75, 0x30, 0, 0, 0, 1, 0, 1, b't'];
    produce.extend_from_slice(&HUGE_COUNT);
    out.push(("Produce v8".into(), frame(ApiKey::Produce, 8, &produce)));
    out
}

/// VmRSS of `pid` in KiB, from /proc/<pid>/status.
fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS line")?;
    line.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .context("unparsable VmRSS line")
}

/// Sends `bytes` and waits until the broker closes the connection.
fn send_and_expect_close(bootstrap: &str, bytes: &[u8]) -> Result<()> {
    let mut s = TcpStream::connect(bootstrap)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(bytes)?;
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
        Ok(n) => bail!("the broker answered {n} bytes instead of closing the connection"),
        Err(e) => bail!("the broker neither answered nor closed the connection: {e}"),
    }
}

/// An ApiVersions round trip on a fresh connection.
fn api_versions_works(bootstrap: &str) -> Result<()> {
    let mut s = TcpStream::connect(bootstrap)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut body = BytesMut::new();
    ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("second-client"))
        .with_client_software_version(StrBytes::from_static_str("1"))
        .encode(&mut body, 3)?;
    s.write_all(&frame(ApiKey::ApiVersions, 3, &body))?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut resp = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut resp)?;
    // Correlation id, then (header v0) the body: error code 0.
    ensure!(
        resp.get(..4) == Some(&1i32.to_be_bytes()[..]),
        "wrong correlation id"
    );
    ensure!(
        resp.get(4..6) == Some(&[0u8, 0][..]),
        "ApiVersions error {:?}",
        resp.get(4..6)
    );
    Ok(())
}

#[test]
fn huge_array_counts_close_the_connection_and_the_broker_stays_up_and_small() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let pid = g.pid().context("the broker has a pid")?;
    api_versions_works(&g.bootstrap())?;
    let rss_before = rss_kib(pid)?;
    let frames = hostile_frames();
    // Each frame several times over, so that a leak or a large allocation per frame shows.
    for round in 0..5 {
        for (name, bytes) in &frames {
            send_and_expect_close(&g.bootstrap(), bytes)
                .with_context(|| format!("round {round}, {name} ({} bytes)", bytes.len()))?;
            api_versions_works(&g.bootstrap())
                .with_context(|| format!("a second client after {name} (round {round})"))?;
        }
    }
    let rss_after = rss_kib(pid)?;
    ensure!(
        rss_after < rss_before + 64 * 1024,
        "resident set grew from {rss_before} KiB to {rss_after} KiB"
    );
    let log = g.server_log();
    ensure!(
        log.contains("malformed request; closing connection")
            && log.contains("Tried to allocate a collection of size"),
        "no malformed-request log line naming the count; log:\n{log}"
    );
    Ok(())
}

/// A client opening malformed connections in a loop cannot fill the broker's log: the
/// "closing connection" warnings are rate-limited (10 lines per 10 s; the next line let
/// through says how many were suppressed). Before the limit, every bad connection logged one
/// line (12,551 connections, 1.4 MB of log in the new-user trial).
#[test]
fn warnings_about_malformed_connections_are_rate_limited() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let (name, bytes) = hostile_frames()
        .into_iter()
        .next()
        .context("at least one hostile frame")?;
    let started = std::time::Instant::now();
    let connections = 500;
    for i in 0..connections {
        send_and_expect_close(&g.bootstrap(), &bytes)
            .with_context(|| format!("connection {i} ({name})"))?;
    }
    api_versions_works(&g.bootstrap())?;
    let windows = started.elapsed().as_secs() / 10 + 2;
    let log = g.server_log();
    let lines = log
        .lines()
        .filter(|l| l.contains("malformed request; closing connection"))
        .count() as u64;
    ensure!(
        (1..=10 * windows).contains(&lines),
        "{lines} malformed-request warnings for {connections} connections in {:?} \
         (at most {} expected)",
        started.elapsed(),
        10 * windows
    );
    Ok(())
}
