//! CreateTopics (key 19), DeleteTopics (key 20, by name and by id from v6, KIP-516) and
//! CreatePartitions (key 37, KIP-195). <https://kafka.apache.org/protocol#The_Messages_CreateTopics>

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use gregor_metadata::controller::NewTopic;
use gregor_metadata::ConfigResource;
use gregor_protocol::kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use gregor_protocol::kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use gregor_protocol::kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use gregor_protocol::kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse, TopicName,
};
use tracing::{info, warn};
use uuid::Uuid;

use super::sb;
use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use crate::config::{validate_topic_config, TopicConfigs};
use crate::error_codes as ec;
use gregor_network::RequestContext;

const NOT_AUTHORIZED: &str = "Authorization failed.";

/// Creates `name` with the broker defaults (`num.partitions`, `default.replication.factor`),
/// for Metadata auto-creation.
///
/// # Errors
/// The Kafka error code of the failure (TOPIC_ALREADY_EXISTS counts as success).
pub fn auto_create(broker: &Arc<Broker>, name: &str) -> Result<(), i16> {
    let t = NewTopic {
        name: name.to_string(),
        num_partitions: broker.config.num_partitions,
        replication_factor: broker.config.default_replication_factor,
        assignments: vec![],
        configs: BTreeMap::new(),
    };
    match broker.controller.create_topic(t, false) {
        Ok(_) => {
            info!(topic = name, "auto-created topic");
            publish(broker)
        }
        Err(e) if e.kafka_error_code() == ec::TOPIC_ALREADY_EXISTS => Ok(()),
        Err(e) => Err(e.kafka_error_code()),
    }
}

fn publish(broker: &Arc<Broker>) -> Result<(), i16> {
    broker.publish_metadata().map_err(|e| {
        warn!(error = %e, "applying metadata to partition logs failed");
        ec::KAFKA_STORAGE_ERROR
    })
}

fn failed(name: &TopicName, code: i16, message: String) -> CreatableTopicResult {
    crate::observability::record_error(
        gregor_protocol::kafka_protocol::messages::ApiKey::CreateTopics,
        code,
    );
    CreatableTopicResult::default()
        .with_name(name.clone())
        .with_error_code(code)
        .with_error_message(Some(sb(&message)))
        .with_num_partitions(-1)
        .with_replication_factor(-1)
        // Kafka sends an empty list, not null (clients iterate it).
        .with_configs(Some(vec![]))
}

/// Answers CreateTopics. `-1` partitions or replication factor mean the broker defaults;
/// `validate_only` checks without creating; a name given twice fails with INVALID_REQUEST.
pub fn create_topics(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let cluster_create = broker.authorize(
        ctx,
        AclOperation::Create,
        ResourceType::Cluster,
        CLUSTER_NAME,
    );
    let mut counts: HashMap<String, usize> = HashMap::new();
    for t in &req.topics {
        *counts.entry(t.name.0.to_string()).or_default() += 1;
    }
    let mut results = Vec::with_capacity(req.topics.len());
    let mut created_any = false;
    let mut answered_duplicates: HashSet<String> = HashSet::new();
    for t in req.topics {
        let name = t.name.0.to_string();
        if counts.get(&name).copied().unwrap_or(0) > 1 {
            // As Kafka: one result per distinct name.
            if !answered_duplicates.insert(name.clone()) {
                continue;
            }
            results.push(failed(
                &t.name,
                ec::INVALID_REQUEST,
                format!("Create topics request from client contains multiple entries for the following topics: {name}"),
            ));
            continue;
        }
        if !cluster_create
            && !broker.authorize(ctx, AclOperation::Create, ResourceType::Topic, &name)
        {
            results.push(failed(
                &t.name,
                ec::TOPIC_AUTHORIZATION_FAILED,
                NOT_AUTHORIZED.into(),
            ));
            continue;
        }
        if !t.assignments.is_empty() && (t.num_partitions != -1 || t.replication_factor != -1) {
            results.push(failed(
                &t.name,
                ec::INVALID_REQUEST,
                "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.".into(),
            ));
            continue;
        }
        let mut configs = BTreeMap::new();
        let mut config_error = None;
        for c in &t.configs {
            let Some(value) = c.value.as_ref() else {
                config_error = Some(format!(
                    "Null value not supported for topic configs: {}",
                    &*c.name
                ));
                break;
            };
            if let Err(e) = validate_topic_config(&c.name, value) {
                config_error = Some(e.to_string());
                break;
            }
            configs.insert(c.name.to_string(), value.to_string());
        }
        if let Some(msg) = config_error {
            results.push(failed(&t.name, ec::INVALID_CONFIG, msg));
            continue;
        }
        let mut assignments: Vec<(i32, Vec<i32>)> = t
            .assignments
            .iter()
            .map(|a| {
                (
                    a.partition_index,
                    a.broker_ids.iter().map(|b| b.0).collect(),
                )
            })
            .collect();
        assignments.sort_by_key(|(p, _)| *p);
        if assignments
            .iter()
            .enumerate()
            .any(|(i, (p, _))| *p != i as i32)
        {
            results.push(failed(
                &t.name,
                ec::INVALID_REPLICA_ASSIGNMENT,
                "Partitions should be a consecutive 0-based integer sequence".into(),
            ));
            continue;
        }
        let num_partitions = if t.num_partitions == -1 {
            broker.config.num_partitions
        } else {
            t.num_partitions
        };
        let replication_factor = if t.replication_factor == -1 {
            broker.config.default_replication_factor
        } else {
            t.replication_factor
        };
        let new_topic = NewTopic {
            name: name.clone(),
            num_partitions,
            replication_factor,
            assignments: assignments.into_iter().map(|(_, r)| r).collect(),
            configs: configs.clone(),
        };
        let actual_partitions = if new_topic.assignments.is_empty() {
            num_partitions
        } else {
            new_topic.assignments.len() as i32
        };
        let actual_rf = new_topic
            .assignments
            .first()
            .map_or(replication_factor, |a| a.len() as i16);
        match broker.controller.create_topic(new_topic, req.validate_only) {
            Ok(topic_id) => {
                if !req.validate_only {
                    created_any = true;
                    info!(topic = %name, partitions = actual_partitions, "created topic");
                }
                let described = TopicConfigs::resolve(&broker.config, &configs);
                let cfgs = described
                    .entries
                    .iter()
                    .map(|(def, value, source)| {
                        CreatableTopicConfigs::default()
                            .with_name(sb(def.name))
                            .with_value(Some(sb(value)))
                            .with_read_only(false)
                            .with_config_source(source.code())
                            .with_is_sensitive(false)
                    })
                    .collect();
                results.push(
                    CreatableTopicResult::default()
                        .with_name(t.name.clone())
                        .with_topic_id(if version >= 7 && !req.validate_only {
                            topic_id
                        } else {
                            Uuid::nil()
                        })
                        .with_error_message(None)
                        .with_num_partitions(actual_partitions)
                        .with_replication_factor(actual_rf)
                        .with_configs(Some(cfgs)),
                );
            }
            Err(e) => results.push(failed(&t.name, e.kafka_error_code(), e.to_string())),
        }
    }
    if created_any {
        if let Err(code) = publish(broker) {
            for r in &mut results {
                if r.error_code == ec::NONE {
                    r.error_code = code;
                }
            }
        }
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// Answers DeleteTopics: by name (all versions) or by topic id (v6+).
pub fn delete_topics(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: DeleteTopicsRequest,
    version: i16,
) -> DeleteTopicsResponse {
    let image = broker.controller.image();
    let mut wanted: Vec<(Option<String>, Uuid)> = if version >= 6 {
        req.topics
            .iter()
            .map(|t| (t.name.as_ref().map(|n| n.0.to_string()), t.topic_id))
            .collect()
    } else {
        req.topic_names
            .iter()
            .map(|n| (Some(n.0.to_string()), Uuid::nil()))
            .collect()
    };
    let mut responses = Vec::new();
    let mut deleted_any = false;
    for (name, id) in wanted.drain(..) {
        let (lookup, not_found) = match (&name, id.is_nil()) {
            (Some(n), true) => (image.topic(n), ec::UNKNOWN_TOPIC_OR_PARTITION),
            (None, false) => (image.topic_by_id(&id), ec::UNKNOWN_TOPIC_ID),
            (Some(_), false) => {
                responses.push(
                    DeletableTopicResult::default()
                        .with_name(name.as_deref().map(|n| TopicName(sb(n))))
                        .with_topic_id(id)
                        .with_error_code(ec::INVALID_REQUEST)
                        .with_error_message(Some(sb(
                            "Topic name and topic id cannot both be set.",
                        ))),
                );
                continue;
            }
            (None, true) => (None, ec::INVALID_REQUEST),
        };
        let Some(t) = lookup else {
            responses.push(
                DeletableTopicResult::default()
                    .with_name(name.as_deref().map(|n| TopicName(sb(n))))
                    .with_topic_id(id)
                    .with_error_code(not_found)
                    .with_error_message(Some(sb(if not_found == ec::UNKNOWN_TOPIC_ID {
                        "This server does not host this topic ID."
                    } else {
                        "This server does not host this topic-partition."
                    }))),
            );
            continue;
        };
        let (topic_name, topic_id) = (t.name.clone(), t.topic_id);
        let result = DeletableTopicResult::default()
            .with_name(Some(TopicName(sb(&topic_name))))
            .with_topic_id(if version >= 6 { topic_id } else { Uuid::nil() });
        if !broker.authorize(ctx, AclOperation::Delete, ResourceType::Topic, &topic_name) {
            responses.push(
                result
                    .with_error_code(ec::TOPIC_AUTHORIZATION_FAILED)
                    .with_error_message(Some(sb(NOT_AUTHORIZED))),
            );
            continue;
        }
        match broker.controller.delete_topic(topic_id) {
            Ok(_) => {
                deleted_any = true;
                info!(topic = %topic_name, "deleted topic");
                responses.push(result);
            }
            Err(e) => responses.push(
                result
                    .with_error_code(e.kafka_error_code())
                    .with_error_message(Some(sb(&e.to_string()))),
            ),
        }
    }
    if deleted_any {
        if let Err(code) = publish(broker) {
            for r in &mut responses {
                if r.error_code == ec::NONE {
                    r.error_code = code;
                }
            }
        }
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

/// Answers CreatePartitions.
pub fn create_partitions(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: CreatePartitionsRequest,
    _version: i16,
) -> CreatePartitionsResponse {
    let mut results = Vec::new();
    let mut changed = false;
    for t in req.topics {
        let assignments: Vec<Vec<i32>> = t
            .assignments
            .unwrap_or_default()
            .into_iter()
            .map(|a| a.broker_ids.into_iter().map(|b| b.0).collect())
            .collect();
        let r = CreatePartitionsTopicResult::default().with_name(t.name.clone());
        if !broker.authorize(ctx, AclOperation::Alter, ResourceType::Topic, &t.name) {
            results.push(
                r.with_error_code(ec::TOPIC_AUTHORIZATION_FAILED)
                    .with_error_message(Some(sb(NOT_AUTHORIZED))),
            );
            continue;
        }
        match broker
            .controller
            .create_partitions(&t.name, t.count, assignments, req.validate_only)
        {
            Ok(()) => {
                changed |= !req.validate_only;
                results.push(r);
            }
            Err(e) => results.push(
                r.with_error_code(e.kafka_error_code())
                    .with_error_message(Some(sb(&e.to_string()))),
            ),
        }
    }
    if changed {
        if let Err(code) = publish(broker) {
            for r in &mut results {
                if r.error_code == ec::NONE {
                    r.error_code = code;
                }
            }
        }
    }
    CreatePartitionsResponse::default().with_results(results)
}

/// Topic-level non-default configs, for DescribeConfigs.
pub fn topic_overrides(broker: &Broker, topic: &str) -> BTreeMap<String, String> {
    broker
        .controller
        .image()
        .configs_of(ConfigResource::Topic, topic)
}
