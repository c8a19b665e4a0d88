//! Seam 2 of issue 9: log I/O runs on the I/O pool, so a stalled disk job holds an I/O thread
//! but not the async workers. A broker runs in this process on a single-threaded runtime with
//! `num.io.threads=1`; the test occupies the only I/O thread with a job that blocks until
//! released. A produce on one connection then waits for it, while another connection's
//! ApiVersions and Metadata are answered.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use gregor_protocol::batch::BatchBuilder;
use gregor_protocol::kafka_protocol::messages::create_topics_request::CreatableTopic;
use gregor_protocol::kafka_protocol::messages::produce_request::{
    PartitionProduceData, TopicProduceData,
};
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, CreateTopicsRequest, MetadataRequest,
    MetadataResponse, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use gregor_protocol::kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::BrokerConfig;
use crate::server;

fn frame<R: Encodable>(key: ApiKey, version: i16, correlation_id: i32, req: &R) -> Vec<u8> {
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("io-stall-test")))
        .encode(&mut buf, key.request_header_version(version))
        .expect("header");
    req.encode(&mut buf, version).expect("body");
    let mut out = (buf.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&buf);
    out
}

async fn call<R: Encodable>(s: &mut TcpStream, key: ApiKey, version: i16, req: &R) -> Bytes {
    s.write_all(&frame(key, version, 1, req))
        .await
        .expect("send");
    response(s, key, version).await
}

async fn response(s: &mut TcpStream, key: ApiKey, version: i16) -> Bytes {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.expect("length");
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.expect("body");
    let mut b = Bytes::from(body);
    ResponseHeader::decode(&mut b, key.response_header_version(version)).expect("header");
    b
}

#[tokio::test(flavor = "current_thread")]
async fn a_stalled_io_job_does_not_stop_other_connections_from_being_served() {
    let dir = tempfile::tempdir().expect("temp dir");
    let props: BTreeMap<String, String> = [
        ("log.dirs", dir.path().display().to_string()),
        ("listeners", "PLAINTEXT://127.0.0.1:0".into()),
        ("admin.listener", String::new()),
        ("num.io.threads", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let (config, _) = BrokerConfig::from_properties(props).expect("config");
    let running = server::start(config).await.expect("start");
    let broker = running.broker.clone();
    assert_eq!(broker.replica_manager.io_pool().threads(), 1);
    let addr = broker.bound[0];

    let mut producer = TcpStream::connect(addr).await.expect("connect");
    let create = CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("t")))
            .with_num_partitions(1)
            .with_replication_factor(1)]);
    call(&mut producer, ApiKey::CreateTopics, 7, &create).await;

    // Occupy the only I/O thread until released.
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let pool = broker.replica_manager.io_pool().clone();
    let stalled = tokio::spawn(async move {
        pool.run(move || {
            let _ = started_tx.send(());
            released.recv_timeout(Duration::from_secs(60)).is_ok()
        })
        .await
    });
    started_rx.await.expect("the stalling job started");

    let batch = BatchBuilder::new(0, 1_700_000_000_000)
        .record(1_700_000_000_000, Some(b"k"), Some(b"v"), &[])
        .build();
    let produce = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("t")))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(Bytes::from(batch)))])]);
    producer
        .write_all(&frame(ApiKey::Produce, 9, 2, &produce))
        .await
        .expect("send produce");
    // The append waits for the I/O thread...
    let early = tokio::time::timeout(
        Duration::from_millis(300),
        response(&mut producer, ApiKey::Produce, 9),
    )
    .await;
    assert!(
        early.is_err(),
        "the append ran although the I/O thread is stalled"
    );

    // ...while another connection is served.
    let mut other = TcpStream::connect(addr).await.expect("connect");
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        let mut b = call(
            &mut other,
            ApiKey::ApiVersions,
            3,
            &ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("t"))
                .with_client_software_version(StrBytes::from_static_str("1")),
        )
        .await;
        let v = ApiVersionsResponse::decode(&mut b, 3).expect("ApiVersions");
        let mut b = call(
            &mut other,
            ApiKey::Metadata,
            12,
            &MetadataRequest::default().with_topics(None),
        )
        .await;
        let m = MetadataResponse::decode(&mut b, 12).expect("Metadata");
        (v.error_code, m.topics.len())
    })
    .await;
    assert_eq!(
        answered.ok(),
        Some((0, 1)),
        "ApiVersions and Metadata answered"
    );
    assert!(!stalled.is_finished());

    release.send(()).expect("release");
    assert_eq!(stalled.await.ok(), Some(Ok(true)));
    let mut b = tokio::time::timeout(
        Duration::from_secs(10),
        response(&mut producer, ApiKey::Produce, 9),
    )
    .await
    .expect("the produce completes once the I/O thread is free");
    let r = ProduceResponse::decode(&mut b, 9).expect("Produce");
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    running.shutdown().await.expect("shutdown");
}

/// Coordinator writes go through the I/O pool too: with the only I/O thread stalled, an
/// OffsetCommit waits for it while another connection is served (the coordinator's
/// synchronous append leaves its async worker through `block_in_place`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_io_job_delays_a_coordinator_write_but_not_other_connections() {
    use gregor_protocol::kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use gregor_protocol::kafka_protocol::messages::{
        FindCoordinatorRequest, FindCoordinatorResponse, OffsetCommitRequest, OffsetCommitResponse,
    };

    let dir = tempfile::tempdir().expect("temp dir");
    let props: BTreeMap<String, String> = [
        ("log.dirs", dir.path().display().to_string()),
        ("listeners", "PLAINTEXT://127.0.0.1:0".into()),
        ("admin.listener", String::new()),
        ("num.io.threads", "1".into()),
        ("offsets.topic.num.partitions", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let (config, _) = BrokerConfig::from_properties(props).expect("config");
    let running = server::start(config).await.expect("start");
    let broker = running.broker.clone();
    let addr = broker.bound[0];

    let mut client = TcpStream::connect(addr).await.expect("connect");
    let create = CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("t")))
            .with_num_partitions(1)
            .with_replication_factor(1)]);
    call(&mut client, ApiKey::CreateTopics, 7, &create).await;
    let find = FindCoordinatorRequest::default().with_key(StrBytes::from_static_str("g"));
    let mut b = call(&mut client, ApiKey::FindCoordinator, 3, &find).await;
    let found = FindCoordinatorResponse::decode(&mut b, 3).expect("FindCoordinator");
    assert_eq!(found.error_code, 0);

    let (release, released) = std::sync::mpsc::channel::<()>();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let pool = broker.replica_manager.io_pool().clone();
    let stalled = tokio::spawn(async move {
        pool.run(move || {
            let _ = started_tx.send(());
            released.recv_timeout(Duration::from_secs(60)).is_ok()
        })
        .await
    });
    // The I/O thread is busy before the commit arrives.
    started_rx.await.expect("the stalling job started");
    // A simple-group commit (generation -1) writes an offset record to __consumer_offsets.
    let commit = OffsetCommitRequest::default()
        .with_group_id(StrBytes::from_static_str("g").into())
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(0)])]);
    client
        .write_all(&frame(ApiKey::OffsetCommit, 8, 2, &commit))
        .await
        .expect("send commit");
    let early = tokio::time::timeout(
        Duration::from_millis(300),
        response(&mut client, ApiKey::OffsetCommit, 8),
    )
    .await;
    if let Ok(mut b) = early {
        let r = OffsetCommitResponse::decode(&mut b, 8).expect("OffsetCommit");
        panic!("the commit was answered although the I/O thread is stalled: {r:?}");
    }
    let mut other = TcpStream::connect(addr).await.expect("connect");
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        let mut b = call(
            &mut other,
            ApiKey::ApiVersions,
            3,
            &ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("t"))
                .with_client_software_version(StrBytes::from_static_str("1")),
        )
        .await;
        ApiVersionsResponse::decode(&mut b, 3)
            .expect("ApiVersions")
            .error_code
    })
    .await;
    assert_eq!(answered.ok(), Some(0), "ApiVersions answered meanwhile");

    release.send(()).expect("release");
    assert_eq!(stalled.await.ok(), Some(Ok(true)));
    let mut b = tokio::time::timeout(
        Duration::from_secs(10),
        response(&mut client, ApiKey::OffsetCommit, 8),
    )
    .await
    .expect("the commit completes once the I/O thread is free");
    let r = OffsetCommitResponse::decode(&mut b, 8).expect("OffsetCommit");
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    running.shutdown().await.expect("shutdown");
}
