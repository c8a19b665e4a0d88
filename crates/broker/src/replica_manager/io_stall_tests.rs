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
    let pool = broker.replica_manager.io_pool().clone();
    let stalled = tokio::spawn(async move {
        pool.run(move || released.recv_timeout(Duration::from_secs(60)).is_ok())
            .await
    });

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
