//! DescribeLogDirs (API 35) for a list of partitions, as Kafka's
//! `ReplicaManager.describeLogDirs` answers it: only the hosted partitions asked for, each
//! once however often it is asked for, topics with none of them left out; without a list,
//! every hosted partition. The handler looks the asked partitions up one by one (it used to
//! compare every hosted partition with every topic asked for).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Result;
use gregor_tests::wire::{sb, KafkaConn};
use gregor_tests::Gregor;
use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
use kafka_protocol::messages::{
    ApiKey, DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName,
};

const BIN: &str = env!("CARGO_BIN_EXE_gregor");

/// topic -> partition indexes, over every log dir of the answer (which must have no error).
fn partitions(r: &DescribeLogDirsResponse) -> BTreeMap<String, Vec<i32>> {
    assert_eq!(r.error_code, 0, "{r:?}");
    let mut out: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for dir in &r.results {
        assert_eq!(dir.error_code, 0, "{dir:?}");
        for t in &dir.topics {
            out.entry(t.name.0.to_string())
                .or_default()
                .extend(t.partitions.iter().map(|p| p.partition_index));
        }
    }
    out
}

#[test]
fn a_list_answers_the_hosted_partitions_asked_for_each_once() -> Result<()> {
    let g = Gregor::start(BIN, &[])?;
    let bs = g.bootstrap();
    for (topic, n) in [("dld-a", 3), ("dld-b", 1), ("dld-c", 1)] {
        gregor_tests::clients::create_topic(&bs, topic, n)?;
    }
    let mut conn = KafkaConn::connect_timeout(bs.parse()?, Duration::from_secs(10), "dld")?;
    let ask = |topic: &str, parts: &[i32]| {
        DescribableLogDirTopic::default()
            .with_topic(TopicName(sb(topic)))
            .with_partitions(parts.to_vec())
    };
    let listed: DescribeLogDirsResponse = conn.call(
        ApiKey::DescribeLogDirs,
        4,
        &DescribeLogDirsRequest::default().with_topics(Some(vec![
            // Partition 2 twice (also under a second entry of the topic), 9 does not exist.
            ask("dld-a", &[2, 0, 2, 9]),
            ask("dld-a", &[2]),
            ask("dld-c", &[0]),
            ask("dld-unknown", &[0]),
        ])),
    )?;
    assert_eq!(
        partitions(&listed),
        BTreeMap::from([
            ("dld-a".to_string(), vec![0, 2]),
            ("dld-c".to_string(), vec![0]),
        ])
    );
    let all: DescribeLogDirsResponse = conn.call(
        ApiKey::DescribeLogDirs,
        4,
        &DescribeLogDirsRequest::default().with_topics(None),
    )?;
    assert_eq!(
        partitions(&all),
        BTreeMap::from([
            ("dld-a".to_string(), vec![0, 1, 2]),
            ("dld-b".to_string(), vec![0]),
            ("dld-c".to_string(), vec![0]),
        ])
    );
    Ok(())
}
