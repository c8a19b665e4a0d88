//! The request side of the difftest: scenario JSON -> `kafka-protocol` request structs, record
//! batches built with `gregor_protocol::batch::BatchBuilder` (and deliberately broken ones), and
//! the response side: a decoded response -> a JSON tree (through its `Debug` form, which the
//! generated structs all derive) so that two brokers' answers can be compared field by field.

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use gregor_protocol::batch::{BatchBuilder, Compression};
use kafka_protocol::messages::{
    alter_configs_request, create_topics_request, delete_records_request, delete_topics_request,
    describe_configs_request, describe_quorum_request, describe_topic_partitions_request,
    fetch_request, incremental_alter_configs_request, join_group_request, leave_group_request,
    list_offsets_request, metadata_request, offset_commit_request, offset_fetch_request,
    produce_request, sync_group_request, update_features_request, AlterConfigsRequest, ApiKey,
    ApiVersionsRequest, BrokerId, CreateTopicsRequest, DeleteRecordsRequest, DeleteTopicsRequest,
    DescribeConfigsRequest, DescribeQuorumRequest, DescribeTopicPartitionsRequest, FetchRequest,
    FindCoordinatorRequest, GroupId, HeartbeatRequest, IncrementalAlterConfigsRequest,
    InitProducerIdRequest, JoinGroupRequest, LeaveGroupRequest, ListOffsetsRequest,
    MetadataRequest, OffsetCommitRequest, OffsetFetchRequest, ProduceRequest, RequestKind,
    SyncGroupRequest, TopicName, UpdateFeaturesRequest,
};
use kafka_protocol::protocol::StrBytes;
use serde_json::{Map, Value};

fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

fn int(v: &Value, key: &str, default: i64) -> Result<i64> {
    match field(v, key) {
        None => Ok(default),
        Some(x) => x
            .as_i64()
            .ok_or_else(|| anyhow!("field {key} should be an integer, got {x}")),
    }
}

fn i32f(v: &Value, key: &str, default: i32) -> Result<i32> {
    Ok(i32::try_from(int(v, key, default.into())?)?)
}

fn i16f(v: &Value, key: &str, default: i16) -> Result<i16> {
    Ok(i16::try_from(int(v, key, default.into())?)?)
}

fn i8f(v: &Value, key: &str, default: i8) -> Result<i8> {
    Ok(i8::try_from(int(v, key, default.into())?)?)
}

fn boolf(v: &Value, key: &str, default: bool) -> bool {
    field(v, key).and_then(Value::as_bool).unwrap_or(default)
}

fn string(v: &Value, key: &str) -> Result<String> {
    field(v, key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| anyhow!("missing string field {key} in {v}"))
}

fn string_or(v: &Value, key: &str, default: &str) -> String {
    field(v, key)
        .and_then(Value::as_str)
        .unwrap_or(default)
        .to_string()
}

fn opt_string(v: &Value, key: &str) -> Option<StrBytes> {
    field(v, key)
        .and_then(Value::as_str)
        .map(|s| StrBytes::from_string(s.to_string()))
}

fn sb(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

fn topic(s: impl Into<String>) -> TopicName {
    TopicName(sb(s))
}

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    field(v, key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn uuid(v: &Value, key: &str) -> Result<uuid::Uuid> {
    match field(v, key).and_then(Value::as_str) {
        None => Ok(uuid::Uuid::nil()),
        Some(s) => uuid::Uuid::parse_str(s).with_context(|| format!("{key}: bad uuid {s}")),
    }
}

fn i32_list(v: &Value, key: &str) -> Result<Vec<i32>> {
    list(v, key)
        .iter()
        .map(|x| {
            x.as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| anyhow!("{key}: expected int32s"))
        })
        .collect()
}

/// The API named in a scenario step (Kafka's message names without `Request`).
pub fn api_key(name: &str) -> Result<ApiKey> {
    Ok(match name {
        "Produce" => ApiKey::Produce,
        "Fetch" => ApiKey::Fetch,
        "ListOffsets" => ApiKey::ListOffsets,
        "Metadata" => ApiKey::Metadata,
        "OffsetCommit" => ApiKey::OffsetCommit,
        "OffsetFetch" => ApiKey::OffsetFetch,
        "FindCoordinator" => ApiKey::FindCoordinator,
        "JoinGroup" => ApiKey::JoinGroup,
        "Heartbeat" => ApiKey::Heartbeat,
        "LeaveGroup" => ApiKey::LeaveGroup,
        "SyncGroup" => ApiKey::SyncGroup,
        "ApiVersions" => ApiKey::ApiVersions,
        "CreateTopics" => ApiKey::CreateTopics,
        "DeleteTopics" => ApiKey::DeleteTopics,
        "DeleteRecords" => ApiKey::DeleteRecords,
        "InitProducerId" => ApiKey::InitProducerId,
        "DescribeConfigs" => ApiKey::DescribeConfigs,
        "AlterConfigs" => ApiKey::AlterConfigs,
        "IncrementalAlterConfigs" => ApiKey::IncrementalAlterConfigs,
        "DescribeTopicPartitions" => ApiKey::DescribeTopicPartitions,
        "UpdateFeatures" => ApiKey::UpdateFeatures,
        "DescribeQuorum" => ApiKey::DescribeQuorum,
        "WriteTxnMarkers" => ApiKey::WriteTxnMarkers,
        "DescribeProducers" => ApiKey::DescribeProducers,
        "AddPartitionsToTxn" => ApiKey::AddPartitionsToTxn,
        "EndTxn" => ApiKey::EndTxn,
        other => bail!("unknown api {other:?} in scenario"),
    })
}

/// Builds the request `api` from the step's `body` (absent fields take Kafka's defaults).
#[allow(clippy::too_many_lines)]
pub fn build_request(api: ApiKey, version: i16, b: &Value) -> Result<RequestKind> {
    Ok(match api {
        ApiKey::ApiVersions => RequestKind::ApiVersions(
            ApiVersionsRequest::default()
                .with_client_software_name(sb(string_or(b, "client_software_name", "difftest")))
                .with_client_software_version(sb(string_or(b, "client_software_version", "1.0"))),
        ),
        ApiKey::Metadata => {
            let topics = match field(b, "topics") {
                None => None,
                Some(_) => Some(
                    list(b, "topics")
                        .iter()
                        .map(|t| {
                            Ok(metadata_request::MetadataRequestTopic::default()
                                .with_name(t.as_str().map(topic))
                                .with_topic_id(uuid(t, "topic_id").unwrap_or_default()))
                        })
                        .collect::<Result<Vec<_>>>()?,
                ),
            };
            RequestKind::Metadata(
                MetadataRequest::default()
                    .with_topics(topics)
                    .with_allow_auto_topic_creation(boolf(b, "allow_auto_topic_creation", true)),
            )
        }
        ApiKey::DescribeTopicPartitions => {
            let topics = list(b, "topics")
                .iter()
                .filter_map(|t| t.as_str())
                .map(|t| {
                    describe_topic_partitions_request::TopicRequest::default().with_name(topic(t))
                })
                .collect();
            let cursor = match field(b, "cursor") {
                None => None,
                Some(c) => Some(
                    describe_topic_partitions_request::Cursor::default()
                        .with_topic_name(topic(string(c, "topic_name")?))
                        .with_partition_index(i32f(c, "partition_index", 0)?),
                ),
            };
            RequestKind::DescribeTopicPartitions(
                DescribeTopicPartitionsRequest::default()
                    .with_topics(topics)
                    .with_response_partition_limit(i32f(b, "response_partition_limit", 2000)?)
                    .with_cursor(cursor),
            )
        }
        ApiKey::CreateTopics => {
            let topics = list(b, "topics")
                .iter()
                .map(|t| {
                    Ok(create_topics_request::CreatableTopic::default()
                        .with_name(topic(string(t, "name")?))
                        .with_num_partitions(i32f(t, "num_partitions", -1)?)
                        .with_replication_factor(i16f(t, "replication_factor", -1)?)
                        .with_configs(configs(t, |name, value| {
                            create_topics_request::CreatableTopicConfig::default()
                                .with_name(name)
                                .with_value(value)
                        })))
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::CreateTopics(
                CreateTopicsRequest::default()
                    .with_topics(topics)
                    .with_timeout_ms(i32f(b, "timeout_ms", 30_000)?)
                    .with_validate_only(boolf(b, "validate_only", false)),
            )
        }
        ApiKey::DeleteTopics => {
            let names: Vec<String> = list(b, "topics")
                .iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect();
            let mut req =
                DeleteTopicsRequest::default().with_timeout_ms(i32f(b, "timeout_ms", 30_000)?);
            if version >= 6 {
                req.topics = names
                    .iter()
                    .map(|n| {
                        delete_topics_request::DeleteTopicState::default().with_name(Some(topic(n)))
                    })
                    .collect();
            } else {
                req.topic_names = names.iter().map(topic).collect();
            }
            RequestKind::DeleteTopics(req)
        }
        ApiKey::Produce => {
            let topic_data = list(b, "topics")
                .iter()
                .map(|t| {
                    let partitions = list(t, "partitions")
                        .iter()
                        .map(|p| {
                            Ok(produce_request::PartitionProduceData::default()
                                .with_index(i32f(p, "index", 0)?)
                                .with_records(match field(p, "records") {
                                    None => None,
                                    Some(spec) => Some(Bytes::from(records(spec)?)),
                                }))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(produce_request::TopicProduceData::default()
                        .with_name(topic(string(t, "name")?))
                        .with_partition_data(partitions))
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::Produce(
                ProduceRequest::default()
                    .with_transactional_id(
                        opt_string(b, "transactional_id")
                            .map(kafka_protocol::messages::TransactionalId),
                    )
                    .with_acks(i16f(b, "acks", -1)?)
                    .with_timeout_ms(i32f(b, "timeout_ms", 5_000)?)
                    .with_topic_data(topic_data),
            )
        }
        ApiKey::Fetch => {
            let topics = list(b, "topics")
                .iter()
                .map(|t| {
                    let partitions = list(t, "partitions")
                        .iter()
                        .map(|p| {
                            Ok(fetch_request::FetchPartition::default()
                                .with_partition(i32f(p, "partition", 0)?)
                                .with_current_leader_epoch(i32f(p, "current_leader_epoch", -1)?)
                                .with_fetch_offset(int(p, "fetch_offset", 0)?)
                                .with_log_start_offset(int(p, "log_start_offset", -1)?)
                                .with_partition_max_bytes(i32f(
                                    p,
                                    "partition_max_bytes",
                                    1_048_576,
                                )?))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(fetch_request::FetchTopic::default()
                        .with_topic(topic(string_or(t, "name", "")))
                        .with_topic_id(uuid(t, "topic_id")?)
                        .with_partitions(partitions))
                })
                .collect::<Result<Vec<_>>>()?;
            let forgotten = list(b, "forgotten_topics_data")
                .iter()
                .map(|t| {
                    let partitions = list(t, "partitions")
                        .iter()
                        .map(|p| {
                            p.as_i64()
                                .and_then(|p| i32::try_from(p).ok())
                                .ok_or_else(|| anyhow!("forgotten partition {p} is not an i32"))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(fetch_request::ForgottenTopic::default()
                        .with_topic(topic(string_or(t, "name", "")))
                        .with_topic_id(uuid(t, "topic_id")?)
                        .with_partitions(partitions))
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::Fetch(
                FetchRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_max_wait_ms(i32f(b, "max_wait_ms", 0)?)
                    .with_min_bytes(i32f(b, "min_bytes", 1)?)
                    .with_max_bytes(i32f(b, "max_bytes", 52_428_800)?)
                    .with_isolation_level(i8f(b, "isolation_level", 0)?)
                    // KIP-227: sessionless unless the step names a session and epoch.
                    .with_session_id(i32f(b, "session_id", 0)?)
                    .with_session_epoch(i32f(b, "session_epoch", -1)?)
                    .with_forgotten_topics_data(forgotten)
                    .with_topics(topics),
            )
        }
        ApiKey::ListOffsets => {
            let topics = list(b, "topics")
                .iter()
                .map(|t| {
                    let partitions = list(t, "partitions")
                        .iter()
                        .map(|p| {
                            Ok(list_offsets_request::ListOffsetsPartition::default()
                                .with_partition_index(i32f(p, "partition_index", 0)?)
                                .with_current_leader_epoch(i32f(p, "current_leader_epoch", -1)?)
                                .with_timestamp(int(p, "timestamp", -1)?))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(list_offsets_request::ListOffsetsTopic::default()
                        .with_name(topic(string(t, "name")?))
                        .with_partitions(partitions))
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::ListOffsets(
                ListOffsetsRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_isolation_level(i8f(b, "isolation_level", 0)?)
                    .with_topics(topics),
            )
        }
        ApiKey::DescribeConfigs => {
            let resources = list(b, "resources")
                .iter()
                .map(|r| {
                    let keys = field(r, "configuration_keys").map(|_| {
                        list(r, "configuration_keys")
                            .iter()
                            .filter_map(|k| k.as_str().map(sb))
                            .collect()
                    });
                    Ok(describe_configs_request::DescribeConfigsResource::default()
                        .with_resource_type(i8f(r, "resource_type", 2)?)
                        .with_resource_name(sb(string(r, "resource_name")?))
                        .with_configuration_keys(keys))
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::DescribeConfigs(
                DescribeConfigsRequest::default()
                    .with_resources(resources)
                    .with_include_synonyms(boolf(b, "include_synonyms", false))
                    .with_include_documentation(boolf(b, "include_documentation", false)),
            )
        }
        ApiKey::AlterConfigs => {
            let resources = list(b, "resources")
                .iter()
                .map(|r| {
                    Ok(alter_configs_request::AlterConfigsResource::default()
                        .with_resource_type(i8f(r, "resource_type", 2)?)
                        .with_resource_name(sb(string(r, "resource_name")?))
                        .with_configs(configs(r, |name, value| {
                            alter_configs_request::AlterableConfig::default()
                                .with_name(name)
                                .with_value(value)
                        })))
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::AlterConfigs(
                AlterConfigsRequest::default()
                    .with_resources(resources)
                    .with_validate_only(boolf(b, "validate_only", false)),
            )
        }
        // `topic` (default `__cluster_metadata`) and its `partitions` (default [0]).
        ApiKey::DescribeQuorum => {
            let partitions = match field(b, "partitions") {
                None => vec![0],
                Some(_) => i32_list(b, "partitions")?,
            };
            RequestKind::DescribeQuorum(DescribeQuorumRequest::default().with_topics(vec![
                describe_quorum_request::TopicData::default()
                    .with_topic_name(topic(string_or(b, "topic", "__cluster_metadata")))
                    .with_partitions(
                        partitions
                            .into_iter()
                            .map(|p| {
                                describe_quorum_request::PartitionData::default()
                                    .with_partition_index(p)
                            })
                            .collect(),
                    ),
            ]))
        }
        ApiKey::UpdateFeatures => {
            let updates = list(b, "feature_updates")
                .iter()
                .map(|u| {
                    Ok(update_features_request::FeatureUpdateKey::default()
                        .with_feature(sb(&string(u, "feature")?))
                        .with_max_version_level(i16f(u, "max_version_level", 0)?)
                        .with_upgrade_type(i8f(u, "upgrade_type", 1)?))
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::UpdateFeatures(
                UpdateFeaturesRequest::default()
                    .with_timeout_ms(i32f(b, "timeout_ms", 60_000)?)
                    .with_feature_updates(updates)
                    .with_validate_only(boolf(b, "validate_only", false)),
            )
        }
        ApiKey::IncrementalAlterConfigs => {
            let resources = list(b, "resources")
                .iter()
                .map(|r| {
                    let configs = list(r, "configs")
                        .iter()
                        .map(|c| {
                            Ok(
                                incremental_alter_configs_request::AlterableConfig::default()
                                    .with_name(sb(string(c, "name")?))
                                    .with_config_operation(i8f(c, "op", 0)?)
                                    .with_value(opt_string(c, "value")),
                            )
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(
                        incremental_alter_configs_request::AlterConfigsResource::default()
                            .with_resource_type(i8f(r, "resource_type", 2)?)
                            .with_resource_name(sb(string(r, "resource_name")?))
                            .with_configs(configs),
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::IncrementalAlterConfigs(
                IncrementalAlterConfigsRequest::default()
                    .with_resources(resources)
                    .with_validate_only(boolf(b, "validate_only", false)),
            )
        }
        ApiKey::DeleteRecords => {
            let topics = list(b, "topics")
                .iter()
                .map(|t| {
                    let partitions = list(t, "partitions")
                        .iter()
                        .map(|p| {
                            Ok(delete_records_request::DeleteRecordsPartition::default()
                                .with_partition_index(i32f(p, "partition_index", 0)?)
                                .with_offset(int(p, "offset", -1)?))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(delete_records_request::DeleteRecordsTopic::default()
                        .with_name(topic(string(t, "name")?))
                        .with_partitions(partitions))
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::DeleteRecords(
                DeleteRecordsRequest::default()
                    .with_topics(topics)
                    .with_timeout_ms(i32f(b, "timeout_ms", 30_000)?),
            )
        }
        // `{"markers": [{"producer_id", "producer_epoch", "commit", "coordinator_epoch",
        //   "topics": [{"name", "partitions": [0]}]}]}`
        ApiKey::WriteTxnMarkers => {
            use kafka_protocol::messages::write_txn_markers_request::{
                WritableTxnMarker, WritableTxnMarkerTopic,
            };
            let markers = list(b, "markers")
                .iter()
                .map(|m| {
                    let topics = list(m, "topics")
                        .iter()
                        .map(|t| {
                            Ok(WritableTxnMarkerTopic::default()
                                .with_name(topic(string(t, "name")?))
                                .with_partition_indexes(i32_list(t, "partitions")?))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(WritableTxnMarker::default()
                        .with_producer_id(kafka_protocol::messages::ProducerId(int(
                            m,
                            "producer_id",
                            -1,
                        )?))
                        .with_producer_epoch(i16f(m, "producer_epoch", 0)?)
                        .with_transaction_result(boolf(m, "commit", false))
                        .with_coordinator_epoch(i32f(m, "coordinator_epoch", 0)?)
                        .with_topics(topics))
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::WriteTxnMarkers(
                kafka_protocol::messages::WriteTxnMarkersRequest::default().with_markers(markers),
            )
        }
        // `{"topics": [{"name", "partitions": [0]}]}`
        ApiKey::DescribeProducers => {
            use kafka_protocol::messages::describe_producers_request::TopicRequest;
            let topics = list(b, "topics")
                .iter()
                .map(|t| {
                    Ok(TopicRequest::default()
                        .with_name(topic(string(t, "name")?))
                        .with_partition_indexes(i32_list(t, "partitions")?))
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::DescribeProducers(
                kafka_protocol::messages::DescribeProducersRequest::default().with_topics(topics),
            )
        }
        ApiKey::InitProducerId => RequestKind::InitProducerId(
            InitProducerIdRequest::default()
                // Null unless given (the generated default is the empty string).
                .with_transactional_id(
                    opt_string(b, "transactional_id")
                        .map(kafka_protocol::messages::TransactionalId),
                )
                .with_transaction_timeout_ms(i32f(b, "transaction_timeout_ms", 60_000)?)
                .with_producer_id(kafka_protocol::messages::ProducerId(int(
                    b,
                    "producer_id",
                    -1,
                )?))
                .with_producer_epoch(i16f(b, "producer_epoch", -1)?),
        ),
        // The client's form (v0-3): one transaction, its topics and partitions.
        ApiKey::AddPartitionsToTxn => {
            use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
            let topics = list(b, "topics")
                .iter()
                .map(|t| {
                    Ok(AddPartitionsToTxnTopic::default()
                        .with_name(topic(string(t, "name")?))
                        .with_partitions(i32_list(t, "partitions")?))
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::AddPartitionsToTxn(
                kafka_protocol::messages::AddPartitionsToTxnRequest::default()
                    .with_v3_and_below_transactional_id(kafka_protocol::messages::TransactionalId(
                        sb(string(b, "transactional_id")?),
                    ))
                    .with_v3_and_below_producer_id(kafka_protocol::messages::ProducerId(int(
                        b,
                        "producer_id",
                        -1,
                    )?))
                    .with_v3_and_below_producer_epoch(i16f(b, "producer_epoch", 0)?)
                    .with_v3_and_below_topics(topics),
            )
        }
        ApiKey::EndTxn => RequestKind::EndTxn(
            kafka_protocol::messages::EndTxnRequest::default()
                .with_transactional_id(kafka_protocol::messages::TransactionalId(sb(string(
                    b,
                    "transactional_id",
                )?)))
                .with_producer_id(kafka_protocol::messages::ProducerId(int(
                    b,
                    "producer_id",
                    -1,
                )?))
                .with_producer_epoch(i16f(b, "producer_epoch", 0)?)
                .with_committed(boolf(b, "commit", false)),
        ),
        ApiKey::FindCoordinator => {
            let key = string(b, "key")?;
            let req = FindCoordinatorRequest::default().with_key_type(i8f(b, "key_type", 0)?);
            RequestKind::FindCoordinator(if version >= 4 {
                req.with_coordinator_keys(vec![sb(key)])
            } else {
                req.with_key(sb(key))
            })
        }
        ApiKey::JoinGroup => {
            let protocols = if field(b, "protocols").is_some() {
                list(b, "protocols")
                    .iter()
                    .map(|p| {
                        Ok(join_group_request::JoinGroupRequestProtocol::default()
                            .with_name(sb(string(p, "name")?))
                            .with_metadata(Bytes::from(string_or(p, "metadata", "").into_bytes())))
                    })
                    .collect::<Result<Vec<_>>>()?
            } else {
                vec![join_group_request::JoinGroupRequestProtocol::default()
                    .with_name(sb("range"))
                    .with_metadata(Bytes::from_static(b"meta"))]
            };
            RequestKind::JoinGroup(
                JoinGroupRequest::default()
                    .with_group_id(GroupId(sb(string(b, "group_id")?)))
                    .with_session_timeout_ms(i32f(b, "session_timeout_ms", 10_000)?)
                    .with_rebalance_timeout_ms(i32f(b, "rebalance_timeout_ms", 10_000)?)
                    .with_member_id(sb(string_or(b, "member_id", "")))
                    .with_group_instance_id(opt_string(b, "group_instance_id"))
                    .with_protocol_type(sb(string_or(b, "protocol_type", "consumer")))
                    .with_protocols(protocols),
            )
        }
        ApiKey::SyncGroup => {
            let assignments = list(b, "assignments")
                .iter()
                .map(|a| {
                    Ok(sync_group_request::SyncGroupRequestAssignment::default()
                        .with_member_id(sb(string(a, "member_id")?))
                        .with_assignment(Bytes::from(string_or(a, "assignment", "").into_bytes())))
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::SyncGroup(
                SyncGroupRequest::default()
                    .with_group_id(GroupId(sb(string(b, "group_id")?)))
                    .with_generation_id(i32f(b, "generation_id", -1)?)
                    .with_member_id(sb(string_or(b, "member_id", "")))
                    .with_group_instance_id(opt_string(b, "group_instance_id"))
                    .with_protocol_type(opt_string(b, "protocol_type"))
                    .with_protocol_name(opt_string(b, "protocol_name"))
                    .with_assignments(assignments),
            )
        }
        ApiKey::Heartbeat => RequestKind::Heartbeat(
            HeartbeatRequest::default()
                .with_group_id(GroupId(sb(string(b, "group_id")?)))
                .with_generation_id(i32f(b, "generation_id", -1)?)
                .with_member_id(sb(string_or(b, "member_id", "")))
                .with_group_instance_id(opt_string(b, "group_instance_id")),
        ),
        ApiKey::LeaveGroup => {
            let member_id = string_or(b, "member_id", "");
            let req =
                LeaveGroupRequest::default().with_group_id(GroupId(sb(string(b, "group_id")?)));
            RequestKind::LeaveGroup(if version >= 3 {
                req.with_members(vec![leave_group_request::MemberIdentity::default()
                    .with_member_id(sb(member_id))
                    .with_group_instance_id(opt_string(b, "group_instance_id"))])
            } else {
                req.with_member_id(sb(member_id))
            })
        }
        ApiKey::OffsetCommit => {
            let topics = list(b, "topics")
                .iter()
                .map(|t| {
                    let partitions = list(t, "partitions")
                        .iter()
                        .map(|p| {
                            Ok(
                                offset_commit_request::OffsetCommitRequestPartition::default()
                                    .with_partition_index(i32f(p, "partition_index", 0)?)
                                    .with_committed_offset(int(p, "committed_offset", 0)?)
                                    .with_committed_leader_epoch(-1)
                                    .with_committed_metadata(opt_string(p, "metadata")),
                            )
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(offset_commit_request::OffsetCommitRequestTopic::default()
                        .with_name(topic(string(t, "name")?))
                        .with_partitions(partitions))
                })
                .collect::<Result<Vec<_>>>()?;
            RequestKind::OffsetCommit(
                OffsetCommitRequest::default()
                    .with_group_id(GroupId(sb(string(b, "group_id")?)))
                    .with_generation_id_or_member_epoch(i32f(b, "generation_id", -1)?)
                    .with_member_id(sb(string_or(b, "member_id", "")))
                    .with_group_instance_id(opt_string(b, "group_instance_id"))
                    .with_retention_time_ms(-1)
                    .with_topics(topics),
            )
        }
        ApiKey::OffsetFetch => {
            let group = string(b, "group_id")?;
            let topics: Option<Vec<(String, Vec<i32>)>> = match field(b, "topics") {
                None => None,
                Some(_) => Some(
                    list(b, "topics")
                        .iter()
                        .map(|t| Ok((string(t, "name")?, i32_list(t, "partitions")?)))
                        .collect::<Result<Vec<_>>>()?,
                ),
            };
            if version < 8 {
                return Ok(RequestKind::OffsetFetch(
                    OffsetFetchRequest::default()
                        .with_group_id(GroupId(sb(group)))
                        .with_topics(topics.map(|ts| {
                            ts.into_iter()
                                .map(|(n, ps)| {
                                    offset_fetch_request::OffsetFetchRequestTopic::default()
                                        .with_name(topic(n))
                                        .with_partition_indexes(ps)
                                })
                                .collect()
                        })),
                ));
            }
            RequestKind::OffsetFetch(OffsetFetchRequest::default().with_groups(
                vec![offset_fetch_request::OffsetFetchRequestGroup::default()
                        .with_group_id(GroupId(sb(group)))
                        .with_member_epoch(-1)
                        .with_topics(topics.map(|ts| {
                            ts.into_iter()
                                .map(|(n, ps)| {
                                    offset_fetch_request::OffsetFetchRequestTopics::default()
                                        .with_name(topic(n))
                                        .with_partition_indexes(ps)
                                })
                                .collect()
                        }))],
            ))
        }
        other => bail!("difftest cannot build {other:?} requests yet"),
    })
}

/// `configs: {"name": "value" | null}` as a list of config entries, in name order.
fn configs<T>(v: &Value, make: impl Fn(StrBytes, Option<StrBytes>) -> T) -> Vec<T> {
    field(v, "configs")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| make(sb(k.clone()), v.as_str().map(|s| sb(s.to_string()))))
                .collect()
        })
        .unwrap_or_default()
}

/// A fixed record timestamp, so both brokers store (and return) identical bytes.
const BASE_TIMESTAMP_MS: i64 = 1_700_000_000_000;

/// The records of a Produce partition, from a spec:
/// `{"count": 3, "value_size": 10, "compression": "none|gzip|snappy|lz4|zstd",
///   "base_offset": 0, "corrupt_crc": false, "magic": 2, "timestamp": ms, "step_ms": 1,
///   "keys": false, "producer_id": -1, "producer_epoch": 0, "base_sequence": 0,
///   "transactional": false}` (a producer id makes the batch idempotent, and transactional
/// with `transactional`).
pub fn records(spec: &Value) -> Result<Vec<u8>> {
    let count = int(spec, "count", 1)?;
    let value_size = usize::try_from(int(spec, "value_size", 10)?)?;
    let ts = int(spec, "timestamp", BASE_TIMESTAMP_MS)?;
    let step_ms = int(spec, "step_ms", 1)?;
    let keys = boolf(spec, "keys", false);
    let magic = int(spec, "magic", 2)?;
    let value = |i: i64| -> Vec<u8> {
        let mut v = format!("value-{i}-").into_bytes();
        v.resize(value_size, b'x');
        v
    };
    if magic < 2 {
        return Ok(legacy_message_set(magic, count, ts, &value));
    }
    let codec = match string_or(spec, "compression", "none").as_str() {
        "none" => Compression::None,
        "gzip" => Compression::Gzip,
        "snappy" => Compression::Snappy,
        "lz4" => Compression::Lz4,
        "zstd" => Compression::Zstd,
        other => bail!("unknown compression {other}"),
    };
    let mut builder = BatchBuilder::new(0, ts).compression(codec);
    let producer_id = int(spec, "producer_id", -1)?;
    if producer_id >= 0 {
        builder = builder
            .producer(
                producer_id,
                i16f(spec, "producer_epoch", 0)?,
                i32f(spec, "base_sequence", 0)?,
            )
            .transactional(boolf(spec, "transactional", false), false);
    }
    for i in 0..count {
        let key = format!("key-{i}");
        builder = builder.record(
            ts + i * step_ms,
            keys.then_some(key.as_bytes()),
            Some(&value(i)),
            &[],
        );
    }
    let mut batch = builder.build();
    let base_offset = int(spec, "base_offset", 0)?;
    if base_offset != 0 {
        // Not covered by the CRC.
        gregor_protocol::batch::set_base_offset(&mut batch, base_offset);
    }
    if boolf(spec, "corrupt_crc", false) {
        // The CRC sits at bytes 17..21 of the v2 header.
        batch[20] ^= 0xff;
    }
    Ok(batch)
}

/// A magic 0/1 message set (uncompressed), as pre-0.11 clients sent.
fn legacy_message_set(magic: i64, count: i64, ts: i64, value: &dyn Fn(i64) -> Vec<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..count {
        let mut body = vec![u8::try_from(magic).unwrap_or(1), 0u8];
        if magic == 1 {
            body.extend_from_slice(&ts.to_be_bytes());
        }
        body.extend_from_slice(&(-1i32).to_be_bytes()); // null key
        let v = value(i);
        body.extend_from_slice(&i32::try_from(v.len()).unwrap_or(0).to_be_bytes());
        body.extend_from_slice(&v);
        let crc = crc32_ieee(&body);
        let mut msg = crc.to_be_bytes().to_vec();
        msg.extend_from_slice(&body);
        out.extend_from_slice(&i.to_be_bytes());
        out.extend_from_slice(&i32::try_from(msg.len()).unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&msg);
    }
    out
}

fn crc32_ieee(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xedb8_8320 & mask);
        }
    }
    !crc
}

/// Parses the `{:?}` form of a generated response into JSON: structs become objects, `Some(x)`
/// and newtypes their content, `None` null, lists arrays, maps objects; anything else (numbers,
/// uuids, byte strings) a number or a string.
pub fn debug_to_json(text: &str) -> Result<Value> {
    let mut p = DebugParser {
        s: text.as_bytes(),
        i: 0,
    };
    let v = p.value()?;
    p.ws();
    if p.i != p.s.len() {
        bail!("trailing input at {} in debug text", p.i);
    }
    Ok(v)
}

struct DebugParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl DebugParser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> Result<()> {
        if self.eat(c) {
            Ok(())
        } else {
            bail!("expected {:?} at {} in debug text", c as char, self.i)
        }
    }

    /// A quoted string (the opening quote not yet consumed); escapes kept as written.
    fn quoted(&mut self) -> Result<String> {
        self.i += 1;
        let start = self.i;
        while self.i < self.s.len() {
            match self.s[self.i] {
                b'\\' => self.i += 2,
                b'"' => {
                    let raw = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
                    self.i += 1;
                    return Ok(unescape(&raw));
                }
                _ => self.i += 1,
            }
        }
        bail!("unterminated string in debug text")
    }

    fn value(&mut self) -> Result<Value> {
        self.ws();
        match self.peek() {
            None => bail!("unexpected end of debug text"),
            Some(b'"') => Ok(Value::String(self.quoted()?)),
            Some(b'b') if self.s.get(self.i + 1) == Some(&b'"') => {
                self.i += 1;
                let s = self.quoted()?;
                Ok(Value::String(format!("b\"{s}\"")))
            }
            Some(b'[') => {
                self.i += 1;
                let mut out = Vec::new();
                while !self.eat(b']') {
                    out.push(self.value()?);
                    self.eat(b',');
                }
                Ok(Value::Array(out))
            }
            Some(b'{') => {
                self.i += 1;
                let mut out = Map::new();
                while !self.eat(b'}') {
                    let k = self.value()?;
                    self.expect(b':')?;
                    let v = self.value()?;
                    let key = match k {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    out.insert(key, v);
                    self.eat(b',');
                }
                Ok(Value::Object(out))
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.i;
                while self.i < self.s.len()
                    && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_')
                {
                    self.i += 1;
                }
                let ident = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
                // A uuid may start with a letter: a bare token continuing with '-'.
                if self.peek() == Some(b'-') {
                    self.i = start;
                    return Ok(self.bare());
                }
                self.ws();
                match self.peek() {
                    Some(b'{') => {
                        self.i += 1;
                        let mut out = Map::new();
                        while !self.eat(b'}') {
                            self.ws();
                            let fs = self.i;
                            while self.i < self.s.len()
                                && (self.s[self.i].is_ascii_alphanumeric()
                                    || self.s[self.i] == b'_')
                            {
                                self.i += 1;
                            }
                            let name = String::from_utf8_lossy(&self.s[fs..self.i]).into_owned();
                            self.expect(b':')?;
                            let v = self.value()?;
                            out.insert(name, v);
                            self.eat(b',');
                        }
                        Ok(Value::Object(out))
                    }
                    Some(b'(') => {
                        self.i += 1;
                        let mut items = Vec::new();
                        while !self.eat(b')') {
                            items.push(self.value()?);
                            self.eat(b',');
                        }
                        Ok(if items.len() == 1 {
                            items.pop().unwrap_or(Value::Null)
                        } else {
                            Value::Array(items)
                        })
                    }
                    _ => Ok(match ident.as_str() {
                        "None" => Value::Null,
                        "true" => Value::Bool(true),
                        "false" => Value::Bool(false),
                        _ => Value::String(ident),
                    }),
                }
            }
            Some(_) => Ok(self.bare()),
        }
    }

    fn bare(&mut self) -> Value {
        let start = self.i;
        while self.i < self.s.len() && !matches!(self.s[self.i], b',' | b'}' | b']' | b')' | b':') {
            // A map key such as `{0: ...}` ends at ':'; uuids never contain ':'.
            self.i += 1;
        }
        let tok = String::from_utf8_lossy(&self.s[start..self.i])
            .trim()
            .to_string();
        if let Ok(n) = tok.parse::<i64>() {
            return Value::from(n);
        }
        if let Ok(f) = tok.parse::<f64>() {
            return Value::from(f);
        }
        Value::String(tok)
    }
}

fn unescape(raw: &str) -> String {
    if !raw.contains('\\') {
        return raw.to_string();
    }
    raw.replace("\\\"", "\"")
        .replace("\\n", "\n")
        .replace("\\\\", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_text_parses() {
        let v = debug_to_json(
            r#"Produce(ProduceResponse { responses: [TopicProduceResponse { name: "t", topic_id: 0a1b2c3d-0000-0000-0000-000000000000, partition_responses: [PartitionProduceResponse { index: 0, error_code: 0, base_offset: -1, error_message: None, records: Some(b"\0\x01\"x"), unknown_tagged_fields: {} }] }], throttle_time_ms: 0, f: 1.5 })"#,
        )
        .unwrap();
        assert_eq!(v["responses"][0]["name"], "t");
        assert_eq!(
            v["responses"][0]["topic_id"],
            "0a1b2c3d-0000-0000-0000-000000000000"
        );
        let p = &v["responses"][0]["partition_responses"][0];
        assert_eq!(p["base_offset"], -1);
        assert!(p["error_message"].is_null());
        assert_eq!(p["unknown_tagged_fields"], serde_json::json!({}));
        assert_eq!(v["f"], 1.5);
    }

    #[test]
    fn legacy_crc_is_ieee() {
        assert_eq!(crc32_ieee(b"123456789"), 0xcbf4_3926);
    }
}
