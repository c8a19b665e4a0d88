//! Connection handling: many concurrent connections, oversize and malformed frames, ApiVersions
//! at an unknown version, acks=0 failures. Raw frames are built with the `kafka-protocol` crate;
//! rdkafka checks that the broker keeps serving real clients afterwards.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{ensure, Result};
use bytes::{Bytes, BytesMut};
use gregor_tests::Gregor;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse,
    RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

fn frame<R: Encodable>(key: ApiKey, version: i16, correlation_id: i32, req: &R) -> Vec<u8> {
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("conn-test")))
        .encode(&mut buf, key.request_header_version(version))
        .expect("encode header");
    req.encode(&mut buf, version).expect("encode body");
    let mut out = (buf.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&buf);
    out
}

fn read_response(s: &mut TcpStream) -> Result<Bytes> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut body)?;
    Ok(Bytes::from(body))
}

fn closed_by_peer(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

fn broker_still_serves(bootstrap: &str) -> Result<()> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    c.fetch_metadata(None, Duration::from_secs(10))?;
    Ok(())
}

#[test]
fn three_hundred_concurrent_connections_with_pipelined_requests() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let mut conns = Vec::new();
    for _ in 0..300 {
        conns.push(TcpStream::connect(g.bootstrap())?);
    }
    // Five pipelined requests on each connection; answers must come back in order.
    for c in &mut conns {
        let mut out = Vec::new();
        for id in 0..5 {
            out.extend(frame(
                ApiKey::Metadata,
                12,
                id,
                &MetadataRequest::default().with_topics(None),
            ));
        }
        c.write_all(&out)?;
    }
    for c in &mut conns {
        for id in 0..5 {
            let mut b = read_response(c)?;
            let h = ResponseHeader::decode(&mut b, ApiKey::Metadata.response_header_version(12))?;
            ensure!(h.correlation_id == id, "response out of order");
            let m = MetadataResponse::decode(&mut b, 12)?;
            ensure!(m.brokers.len() == 1);
        }
    }
    Ok(())
}

#[test]
fn api_versions_at_an_unknown_version_gets_v0_answer_and_keeps_the_connection() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let mut s = TcpStream::connect(g.bootstrap())?;
    // A v99 request: header v2 with an empty body (the client cannot know our layout).
    let mut raw = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(ApiKey::ApiVersions as i16)
        .with_request_api_version(99)
        .with_correlation_id(42)
        .encode(&mut raw, 2)?;
    raw.extend_from_slice(&[0, 0, 0]);
    let mut out = (raw.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&raw);
    s.write_all(&out)?;
    let mut b = read_response(&mut s)?;
    let h = ResponseHeader::decode(&mut b, 0)?;
    ensure!(h.correlation_id == 42);
    let r = ApiVersionsResponse::decode(&mut b, 0)?;
    ensure!(r.error_code == 35, "error {}", r.error_code);
    // KIP-511: only ApiVersions' own range, so the client can retry at a version we know.
    ensure!(
        r.api_keys.len() == 1 && r.api_keys[0].api_key == ApiKey::ApiVersions as i16,
        "api keys: {:?}",
        r.api_keys
    );
    // Same connection, a supported version now.
    s.write_all(&frame(
        ApiKey::ApiVersions,
        3,
        43,
        &ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("test"))
            .with_client_software_version(StrBytes::from_static_str("1.0")),
    ))?;
    let mut b = read_response(&mut s)?;
    let h = ResponseHeader::decode(&mut b, 0)?;
    ensure!(h.correlation_id == 43);
    let r = ApiVersionsResponse::decode(&mut b, 3)?;
    ensure!(r.error_code == 0);
    Ok(())
}

#[test]
fn oversize_and_malformed_frames_close_only_their_connection() -> Result<()> {
    let g = Gregor::start(BIN, &["socket.request.max.bytes=1000"])?;
    let mut other = TcpStream::connect(g.bootstrap())?;

    // A size prefix above socket.request.max.bytes: closed before anything is allocated.
    let mut s = TcpStream::connect(g.bootstrap())?;
    s.write_all(&2_000_000_000i32.to_be_bytes())?;
    ensure!(
        closed_by_peer(&mut s),
        "oversize frame did not close the connection"
    );

    // A negative size.
    let mut s = TcpStream::connect(g.bootstrap())?;
    s.write_all(&(-5i32).to_be_bytes())?;
    ensure!(closed_by_peer(&mut s));

    // Garbage inside a well-sized frame: unknown API key, then a truncated Metadata body.
    let mut s = TcpStream::connect(g.bootstrap())?;
    s.write_all(&[0, 0, 0, 8, 0x7f, 0x7f, 0, 0, 0, 0, 0, 1])?;
    ensure!(closed_by_peer(&mut s));
    let mut s = TcpStream::connect(g.bootstrap())?;
    let mut f = frame(
        ApiKey::Metadata,
        12,
        1,
        &MetadataRequest::default().with_topics(None),
    );
    f.truncate(f.len() - 2);
    let new_len = (f.len() - 4) as i32;
    f[..4].copy_from_slice(&new_len.to_be_bytes());
    s.write_all(&f)?;
    ensure!(closed_by_peer(&mut s));

    // The untouched connection and new clients still work.
    other.write_all(&frame(
        ApiKey::Metadata,
        12,
        7,
        &MetadataRequest::default().with_topics(None),
    ))?;
    let mut b = read_response(&mut other)?;
    ensure!(ResponseHeader::decode(&mut b, 1)?.correlation_id == 7);
    broker_still_serves(&g.bootstrap())?;
    ensure!(!g.server_log().contains("panicked"), "server panicked");
    Ok(())
}
