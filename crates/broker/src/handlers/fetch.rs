//! Fetch (key 1), <https://kafka.apache.org/protocol#The_Messages_Fetch>. Reads are bounded by
//! the high watermark (or the last stable offset for read_committed). A fetch with less than
//! `min_bytes` available waits up to `max_wait_ms`, woken when a high watermark of one of its
//! partitions moves (no polling). `max_bytes` and `partition_max_bytes` are soft for the first
//! batch returned (KIP-74). Empty partitions carry zero-length records, never null. Topic ids
//! from v13 (KIP-516). gregor does not create incremental fetch sessions (KIP-227): it answers
//! session id 0, which tells clients to keep sending full fetch requests.
//!
//! Fetch from follower (KIP-392): a consumer's fetch from v11 on carries its rack
//! (`client.rack`); with `replica.selector.class` set, the leader may answer a partition with
//! `PreferredReadReplica` and no records, and a follower serves such fetches up to its own high
//! watermark. Older consumer fetches are served by the leader only.
//!
//! Followers (replica id >= 0: `ReplicaState.ReplicaId` from v15, the top-level `ReplicaId`
//! before) need ClusterAction, read up to the log end offset, send their broker epoch (v15,
//! KIP-903), log start offset and `LastFetchedEpoch` (v12); a diverging log is answered with
//! `DivergingEpoch` (Kafka's `Partition.fetchRecords`).

use std::sync::Arc;

use bytes::Bytes;
use gregor_log::TopicPartition;
use gregor_protocol::kafka_protocol::messages::fetch_response::{
    EpochEndOffset, FetchableTopicResponse, PartitionData,
};
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, RequestHeader, ResponseKind, TopicName,
};
use uuid::Uuid;

use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use crate::error_codes as ec;
use crate::observability::record_error;
use crate::replica_manager::{FetchOutcome, FetchParams, FetchPartition, FetchPartitionResult};
use crate::replication::replica_selector::ClientMetadata;
use gregor_network::RequestContext;
use gregor_network::{respond, Handled};

fn empty_partition(index: i32, code: i16) -> PartitionData {
    PartitionData::default()
        .with_partition_index(index)
        .with_error_code(code)
        .with_high_watermark(-1)
        .with_last_stable_offset(-1)
        .with_log_start_offset(-1)
        .with_preferred_read_replica(BrokerId(-1))
        .with_records(Some(Bytes::new()))
}

/// The response shape of one topic; partitions hold an error found here or the index of their
/// entry in the replica manager's fetch.
struct TopicSlots {
    name: TopicName,
    topic_id: Uuid,
    partitions: Vec<(i32, Result<usize, i16>)>,
}

/// Errors Kafka's `KafkaApis.handleFetch` and `ReplicaManager` find before reading the log.
fn refused_before_read(code: i16) -> bool {
    matches!(
        code,
        ec::UNKNOWN_TOPIC_OR_PARTITION
            | ec::UNKNOWN_TOPIC_ID
            | ec::NOT_LEADER_OR_FOLLOWER
            | ec::FENCED_LEADER_EPOCH
            | ec::UNKNOWN_LEADER_EPOCH
            | ec::TOPIC_AUTHORIZATION_FAILED
    )
}

fn partition_data(index: i32, r: &FetchPartitionResult, isolation_level: i8) -> PartitionData {
    if r.error_code != ec::NONE {
        record_error(ApiKey::Fetch, r.error_code);
    }
    let diverging = r.diverging_epoch.map_or_else(
        || EpochEndOffset::default().with_epoch(-1).with_end_offset(-1),
        |(epoch, end_offset)| {
            EpochEndOffset::default()
                .with_epoch(epoch)
                .with_end_offset(end_offset)
        },
    );
    PartitionData::default()
        .with_diverging_epoch(diverging)
        .with_partition_index(index)
        .with_error_code(r.error_code)
        .with_high_watermark(r.high_watermark)
        .with_last_stable_offset(r.last_stable_offset)
        .with_log_start_offset(r.log_start_offset)
        .with_preferred_read_replica(BrokerId(r.preferred_read_replica.unwrap_or(-1)))
        .with_aborted_transactions(
            // As Kafka: partitions refused before the read (unknown, not led here, fenced)
            // carry the default empty list; read results carry a list for read_committed and
            // null for read_uncommitted.
            (isolation_level == 1 || refused_before_read(r.error_code)).then(Vec::new),
        )
        .with_records(Some(r.records.clone()))
}

fn encode(
    slots: Vec<TopicSlots>,
    results: &[FetchPartitionResult],
    isolation_level: i8,
    version: i16,
) -> FetchResponse {
    let topics = slots
        .into_iter()
        .map(|t| {
            let parts = t
                .partitions
                .into_iter()
                .map(|(index, slot)| match slot {
                    Ok(i) => partition_data(index, &results[i], isolation_level),
                    Err(code) => {
                        record_error(ApiKey::Fetch, code);
                        empty_partition(index, code)
                    }
                })
                .collect();
            FetchableTopicResponse::default()
                .with_topic(if version >= 13 {
                    TopicName::default()
                } else {
                    t.name
                })
                .with_topic_id(t.topic_id)
                .with_partitions(parts)
        })
        .collect();
    FetchResponse::default().with_responses(topics)
}

/// Handles Fetch: resolves topic ids, hands the partitions to
/// [`ReplicaManager::fetch_messages`](crate::replica_manager::ReplicaManager::fetch_messages)
/// and encodes its results. The first read happens before this returns; a long poll is
/// deferred. Needs `Read` on each topic, or `ClusterAction` on the Cluster for a follower
/// (`replica_id >= 0`); partitions not authorised get TOPIC_AUTHORIZATION_FAILED, as Kafka's
/// `KafkaApis.handleFetch`.
pub async fn handle(broker: &Arc<Broker>, ctx: &RequestContext, req: FetchRequest) -> Handled {
    let header = ctx.header.clone();
    let version = header.request_api_version;
    let reply = move |header: &RequestHeader, body: FetchResponse| {
        respond(header, ApiKey::Fetch, ResponseKind::Fetch(body))
    };
    if version >= 7 && req.session_id != 0 {
        // gregor never hands out session ids, so any non-zero id is unknown.
        let body = FetchResponse::default().with_error_code(ec::FETCH_SESSION_ID_NOT_FOUND);
        return Handled::Ready(reply(&header, body));
    }
    let replica_id = if version >= 15 {
        req.replica_state.replica_id.0
    } else {
        req.replica_id.0
    };
    let follower_authorized = replica_id < 0
        || broker.authorize(
            ctx,
            AclOperation::ClusterAction,
            ResourceType::Cluster,
            CLUSTER_NAME,
        );
    let image = broker.controller.image();
    let mut entries = Vec::new();
    // Per entry: whether the partition exists in the metadata (a broker that is not one of
    // its replicas answers NOT_LEADER_OR_FOLLOWER, as Kafka's getPartitionOrError).
    let mut in_image = Vec::new();
    let mut unresolved = false;
    let slots: Vec<TopicSlots> = req
        .topics
        .iter()
        .map(|t| {
            let name = if version >= 13 {
                image.topic_by_id(&t.topic_id).map(|ti| ti.name.clone())
            } else {
                Some(t.topic.0.to_string())
            };
            let authorized = follower_authorized
                && name.as_deref().is_none_or(|n| {
                    replica_id >= 0
                        || broker.authorize(ctx, AclOperation::Read, ResourceType::Topic, n)
                });
            let partitions = t
                .partitions
                .iter()
                .map(|fp| {
                    let slot = match &name {
                        None => {
                            unresolved = true;
                            Err(ec::UNKNOWN_TOPIC_ID)
                        }
                        Some(_) if !authorized => {
                            unresolved = true;
                            Err(ec::TOPIC_AUTHORIZATION_FAILED)
                        }
                        Some(n) => {
                            in_image.push(
                                image
                                    .topic(n)
                                    .is_some_and(|ti| ti.partitions.contains_key(&fp.partition)),
                            );
                            entries.push(FetchPartition {
                                topic_partition: TopicPartition::new(n.clone(), fp.partition),
                                fetch_offset: fp.fetch_offset,
                                partition_max_bytes: fp.partition_max_bytes,
                                current_leader_epoch: fp.current_leader_epoch,
                                last_fetched_epoch: if version >= 12 {
                                    fp.last_fetched_epoch
                                } else {
                                    -1
                                },
                                log_start_offset: if replica_id >= 0 {
                                    fp.log_start_offset
                                } else {
                                    -1
                                },
                            });
                            Ok(entries.len() - 1)
                        }
                    };
                    (fp.partition, slot)
                })
                .collect();
            TopicSlots {
                name: t.topic.clone(),
                topic_id: t.topic_id,
                partitions,
            }
        })
        .collect();
    let isolation_level = req.isolation_level;
    let params = FetchParams {
        replica_id,
        // A partition in error answers at once, as Kafka does.
        max_wait_ms: if unresolved {
            0
        } else {
            i64::from(req.max_wait_ms)
        },
        min_bytes: req.min_bytes,
        max_bytes: req.max_bytes,
        isolation_level,
        replica_epoch: if version >= 15 {
            req.replica_state.replica_epoch
        } else {
            -1
        },
        // Kafka's KafkaApis.handleFetchRequest: v11 added the preferred replica logic.
        client_metadata: (version >= 11).then(|| ClientMetadata {
            rack_id: req.rack_id.to_string(),
            client_id: header
                .client_id
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            listener_name: ctx.listener_name.clone(),
        }),
    };
    match broker.replica_manager.fetch_messages(params, entries).await {
        FetchOutcome::Complete(mut results) => {
            not_a_replica(&mut results, &in_image);
            Handled::Ready(reply(
                &header,
                encode(slots, &results, isolation_level, version),
            ))
        }
        FetchOutcome::Delayed(delayed) => Handled::Deferred(Box::pin(async move {
            let mut results = delayed.complete().await;
            not_a_replica(&mut results, &in_image);
            reply(&header, encode(slots, &results, isolation_level, version))
        })),
    }
}

/// Kafka's `getPartitionOrError`: a partition this broker does not host but the metadata
/// knows (this broker is not one of its replicas, e.g. a stale preferred read replica or
/// leader) is NOT_LEADER_OR_FOLLOWER, which sends clients to refresh their metadata;
/// UNKNOWN_TOPIC_OR_PARTITION stays for partitions the metadata does not have.
fn not_a_replica(results: &mut [FetchPartitionResult], in_image: &[bool]) {
    for (r, known) in results.iter_mut().zip(in_image) {
        if *known && r.error_code == ec::UNKNOWN_TOPIC_OR_PARTITION {
            r.error_code = ec::NOT_LEADER_OR_FOLLOWER;
        }
    }
}
