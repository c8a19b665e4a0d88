//! DescribeLogDirs (key 35, v1-4): the partitions this broker holds in each of its `log.dirs`,
//! with their size in bytes and lag (high watermark minus log end offset, at least 0), as
//! Kafka's `ReplicaManager.describeLogDirs`. `kafka-reassign-partitions --execute` asks it
//! for the current assignment. Needs `Describe` on the Cluster. The volume's total and usable
//! bytes (v4) are reported unknown (-1).
//! <https://kafka.apache.org/protocol#The_Messages_DescribeLogDirs>

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gregor_network::RequestContext;
use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use gregor_protocol::kafka_protocol::messages::{
    DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName,
};

use super::sb;
use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;

/// Answers DescribeLogDirs from the partitions this broker holds.
pub fn describe_log_dirs(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &DescribeLogDirsRequest,
) -> DescribeLogDirsResponse {
    if !broker.authorize(
        ctx,
        AclOperation::Describe,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return DescribeLogDirsResponse::default()
            .with_error_code(ErrorCode::ClusterAuthorizationFailed.code());
    }
    let rm = &broker.replica_manager;
    let partitions = match &req.topics {
        None => rm.partitions(),
        // The partitions asked for, each once (Kafka's set), looked up one by one rather than
        // every hosted partition compared with every topic asked for.
        Some(ts) => ts
            .iter()
            .flat_map(|t| t.partitions.iter().map(|i| (t.topic.as_str(), *i)))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter_map(|(topic, index)| rm.partition(topic, index))
            .collect(),
    };
    // log dir -> topic -> partitions
    let mut dirs: BTreeMap<std::path::PathBuf, BTreeMap<String, Vec<DescribeLogDirsPartition>>> =
        broker
            .config
            .log_dirs
            .iter()
            .map(|d| (absolute(d), BTreeMap::new()))
            .collect();
    for p in partitions {
        let Some(dir) = p.log.dir().parent().map(absolute) else {
            continue;
        };
        let leo = p.log.log_end_offset();
        dirs.entry(dir)
            .or_default()
            .entry(p.topic.clone())
            .or_default()
            .push(
                DescribeLogDirsPartition::default()
                    .with_partition_index(p.index)
                    .with_partition_size(i64::try_from(p.log.size_in_bytes()).unwrap_or(i64::MAX))
                    .with_offset_lag((p.high_watermark() - leo).max(0))
                    .with_is_future_key(false),
            );
    }
    // A failed dir (KIP-112) answers KAFKA_STORAGE_ERROR and no partitions, as Kafka's
    // `describeLogDirs` does for an offline dir.
    let failed: BTreeSet<std::path::PathBuf> = rm
        .logs()
        .dir_health()
        .iter()
        .filter(|h| h.is_failed())
        .map(|h| absolute(h.dir()))
        .collect();
    let results = dirs
        .into_iter()
        .map(|(dir, topics)| {
            if failed.contains(&dir) {
                return DescribeLogDirsResult::default()
                    .with_error_code(ErrorCode::KafkaStorageError.code())
                    .with_log_dir(sb(&dir.display().to_string()))
                    .with_total_bytes(-1)
                    .with_usable_bytes(-1);
            }
            DescribeLogDirsResult::default()
                .with_log_dir(sb(&dir.display().to_string()))
                .with_total_bytes(-1)
                .with_usable_bytes(-1)
                .with_topics(
                    topics
                        .into_iter()
                        .map(|(name, mut partitions)| {
                            partitions.sort_by_key(|p| p.partition_index);
                            DescribeLogDirsTopic::default()
                                .with_name(TopicName(sb(&name)))
                                .with_partitions(partitions)
                        })
                        .collect(),
                )
        })
        .collect();
    DescribeLogDirsResponse::default().with_results(results)
}

/// `dir` made absolute (against the working directory) without touching the file system.
fn absolute(dir: &std::path::Path) -> std::path::PathBuf {
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())
}
