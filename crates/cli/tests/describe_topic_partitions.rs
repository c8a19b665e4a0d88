//! DescribeTopicPartitions (API 75, KIP-966) on a 3-node gregor cluster: Apache Kafka 4.4.0's
//! `kafka-topics --describe` uses it (and prints `Elr:` / `LastKnownElr:` lists instead of the
//! `N/A` of its Metadata fallback), also when it has to page with a small
//! `--partition-size-limit-per-response`; raw requests check the cursor pagination
//! (`NextCursor` inside a topic and at a topic boundary), the errors (unknown and invalid
//! names, INVALID_REQUEST for a cursor outside the topic list or with a negative partition)
//! and that only the broker listener advertises the API.
//!
//! `cargo test -p gregor --test describe_topic_partitions -- --nocapture` (needs `cargo xtask kafka`).

use std::time::Duration;

use gregor_tests::cluster::{Cluster, ClusterConfig, Implementation};
use gregor_tests::reference::tool_output;
use gregor_tests::wire::{sb, KafkaConn};
use kafka_protocol::messages::describe_topic_partitions_request::{Cursor, TopicRequest};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse, TopicName,
};

const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_TOPIC_EXCEPTION: i16 = 17;
const INVALID_REQUEST: i16 = 42;
/// Every topic operation (READ .. ALTER_CONFIGS) as a bit field: no authorizer allows all.
const ALL_TOPIC_OPERATIONS: i32 =
    (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 10) | (1 << 11);

fn conn(addr: &str) -> KafkaConn {
    KafkaConn::connect_timeout(
        addr.parse().expect("an address"),
        Duration::from_secs(10),
        "dtp-test",
    )
    .expect("connect")
}

fn describe(
    bootstrap: &str,
    topics: &[&str],
    limit: i32,
    cursor: Option<(&str, i32)>,
) -> DescribeTopicPartitionsResponse {
    conn(bootstrap)
        .call(
            ApiKey::DescribeTopicPartitions,
            0,
            &DescribeTopicPartitionsRequest::default()
                .with_topics(
                    topics
                        .iter()
                        .map(|t| TopicRequest::default().with_name(TopicName(sb(t))))
                        .collect(),
                )
                .with_response_partition_limit(limit)
                .with_cursor(cursor.map(|(t, p)| {
                    Cursor::default()
                        .with_topic_name(TopicName(sb(t)))
                        .with_partition_index(p)
                })),
        )
        .expect("DescribeTopicPartitions")
}

/// (topic, error, partition indexes) per topic, and the next cursor.
type Summary = (Vec<(String, i16, Vec<i32>)>, Option<(String, i32)>);

fn summary(r: &DescribeTopicPartitionsResponse) -> Summary {
    (
        r.topics
            .iter()
            .map(|t| {
                (
                    t.name.as_ref().map_or(String::new(), |n| n.0.to_string()),
                    t.error_code,
                    t.partitions.iter().map(|p| p.partition_index).collect(),
                )
            })
            .collect(),
        r.next_cursor
            .as_ref()
            .map(|c| (c.topic_name.0.to_string(), c.partition_index)),
    )
}

fn owned(v: &[(&str, i16, &[i32])], cursor: Option<(&str, i32)>) -> Summary {
    (
        v.iter()
            .map(|(t, e, p)| ((*t).to_string(), *e, p.to_vec()))
            .collect(),
        cursor.map(|(t, p)| (t.to_string(), p)),
    )
}

fn create(bootstrap: &str, topic: &str, partitions: &str) {
    let out = tool_output(
        "kafka-topics",
        &[
            "--bootstrap-server",
            bootstrap,
            "--create",
            "--topic",
            topic,
            "--partitions",
            partitions,
            "--replication-factor",
            "3",
        ],
    )
    .expect("kafka-topics");
    assert!(out.contains(&format!("Created topic {topic}")), "{out}");
}

#[test]
fn describe_topic_partitions_pages_and_serves_kafka_topics() {
    let cluster = Cluster::start(&ClusterConfig::combined(
        Implementation::Gregor(env!("CARGO_BIN_EXE_gregor").into()),
        3,
    ))
    .expect("a 3-node cluster");
    let b = cluster.node(2).bootstrap().expect("broker 2");
    create(&b, "dtp-a", "5");
    create(&b, "dtp-b", "3");

    // Advertised on the broker listener, not on the controller listener.
    let versions = |addr: &str| -> Option<(i16, i16)> {
        let r: ApiVersionsResponse = conn(addr)
            .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
            .expect("ApiVersions");
        r.api_keys
            .iter()
            .find(|k| k.api_key == ApiKey::DescribeTopicPartitions as i16)
            .map(|k| (k.min_version, k.max_version))
    };
    assert_eq!(versions(&b), Some((0, 0)));
    let controller = cluster.node(2).controller_endpoint().expect("controller");
    assert_eq!(versions(&controller), None);

    // Kafka's tool, paging two partitions at a time.
    for limit in ["2", "2000"] {
        let out = tool_output(
            "kafka-topics",
            &[
                "--bootstrap-server",
                &b,
                "--describe",
                "--topic",
                "dtp-a,dtp-b",
                "--partition-size-limit-per-response",
                limit,
            ],
        )
        .expect("kafka-topics --describe");
        for (topic, n) in [("dtp-a", 5), ("dtp-b", 3)] {
            assert!(
                out.contains(&format!("Topic: {topic}\tTopicId: "))
                    && out.contains(&format!("PartitionCount: {n}\tReplicationFactor: 3")),
                "{out}"
            );
            for p in 0..n {
                let line = out
                    .lines()
                    .find(|l| l.contains(&format!("Topic: {topic}\tPartition: {p}\t")))
                    .unwrap_or_else(|| panic!("no line for {topic}-{p}: {out}"));
                assert!(
                    line.contains("\tElr: \tLastKnownElr: "),
                    "the ELR comes from DescribeTopicPartitions: {line}"
                );
            }
        }
    }

    // All topics (the empty list), paged by raw requests.
    let r = describe(&b, &[], 4, None);
    assert_eq!(
        summary(&r),
        owned(&[("dtp-a", 0, &[0, 1, 2, 3])], Some(("dtp-a", 4)))
    );
    let t = &r.topics[0];
    assert!(!t.is_internal && !t.topic_id.is_nil());
    assert_eq!(t.topic_authorized_operations, ALL_TOPIC_OPERATIONS);
    let p = &t.partitions[0];
    assert_eq!(p.replica_nodes.len(), 3);
    assert_eq!(p.isr_nodes.len(), 3);
    assert!(p.replica_nodes.contains(&p.leader_id));
    assert_eq!(p.eligible_leader_replicas.as_deref(), Some(&[][..]));
    assert_eq!(p.last_known_elr.as_deref(), Some(&[][..]));
    assert!(p.offline_replicas.is_empty());
    let r = describe(&b, &[], 4, Some(("dtp-a", 4)));
    assert_eq!(
        summary(&r),
        owned(&[("dtp-a", 0, &[4]), ("dtp-b", 0, &[0, 1, 2])], None)
    );
    // The limit reached at the end of a topic: the cursor is the next topic's start.
    let r = describe(&b, &[], 1, Some(("dtp-a", 4)));
    assert_eq!(
        summary(&r),
        owned(&[("dtp-a", 0, &[4])], Some(("dtp-b", 0)))
    );
    // A limit below 1 counts as 1.
    let r = describe(&b, &["dtp-b"], 0, None);
    assert_eq!(
        summary(&r),
        owned(&[("dtp-b", 0, &[0])], Some(("dtp-b", 1)))
    );

    // Errors: unknown and invalid names are reported, topics before the cursor are not.
    let r = describe(
        &b,
        &["dtp-a", "nope", "bad name!", "dtp-b"],
        2000,
        Some(("dtp-b", 2)),
    );
    assert_eq!(
        summary(&r),
        owned(
            &[
                ("dtp-b", 0, &[2]),
                ("nope", UNKNOWN_TOPIC_OR_PARTITION, &[])
            ],
            None
        )
    );
    let r = describe(&b, &["zzz", "bad name!", "dtp-b"], 2000, None);
    assert_eq!(
        summary(&r),
        owned(
            &[
                ("bad name!", INVALID_TOPIC_EXCEPTION, &[]),
                ("dtp-b", 0, &[0, 1, 2]),
                ("zzz", UNKNOWN_TOPIC_OR_PARTITION, &[]),
            ],
            None
        )
    );
    assert!(r.topics[2].topic_id.is_nil());
    // The cursor's topic must be in the list, and its partition not negative.
    let r = describe(&b, &["dtp-b"], 2000, Some(("dtp-a", 0)));
    assert_eq!(summary(&r), owned(&[("dtp-b", INVALID_REQUEST, &[])], None));
    let r = describe(&b, &["dtp-a"], 2000, Some(("dtp-a", -1)));
    assert_eq!(summary(&r), owned(&[("dtp-a", INVALID_REQUEST, &[])], None));
}
