//! CreateTopics (key 19), DeleteTopics (key 20, by name and by id from v6, KIP-516) and
//! CreatePartitions (key 37, KIP-195). <https://kafka.apache.org/protocol#The_Messages_CreateTopics>

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use gregor_metadata::controller::{NewTopic, PartitionsIncrease};
use gregor_metadata::{ConfigResource, ControllerError};
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
/// The Kafka error code of the failure (TOPIC_ALREADY_EXISTS counts as success;
/// LEADER_NOT_AVAILABLE while no controller can take the change, as Kafka answers for a topic
/// being created).
pub async fn auto_create(broker: &Arc<Broker>, name: &str) -> Result<(), i16> {
    // Internal topics are created with their coordinator's layout, never as ordinary topics
    // (Kafka's AutoTopicCreationManager): a one-partition `__consumer_offsets` made by a
    // Metadata request would leave every group without a coordinator.
    if name == crate::group_coordinator::GROUP_METADATA_TOPIC_NAME {
        return crate::coordinator_writer::ensure_offsets_topic(broker).await;
    }
    if super::produce::is_internal_topic(name) {
        // No coordinator of gregor's owns it yet (transactions, share groups).
        return Err(ec::UNKNOWN_TOPIC_OR_PARTITION);
    }
    let t = NewTopic {
        name: name.to_string(),
        num_partitions: broker.config.num_partitions,
        replication_factor: broker.config.default_replication_factor,
        assignments: vec![],
        configs: BTreeMap::new(),
    };
    let outcome = broker.create_topics_internal(vec![t]).await.and_then(|r| {
        r.into_iter()
            .next()
            .unwrap_or(Err(ControllerError::UnknownTopicOrPartition))
    });
    match outcome {
        Ok(_) => {
            info!(topic = name, "auto-created topic");
            Ok(())
        }
        Err(e) if e.kafka_error_code() == ec::TOPIC_ALREADY_EXISTS => Ok(()),
        Err(ControllerError::NotController { .. }) => Err(ec::LEADER_NOT_AVAILABLE),
        Err(e) => {
            warn!(topic = name, error = %e, "auto-creating topic failed");
            Err(e.kafka_error_code())
        }
    }
}

/// The Kafka error code and message for a change the controller did not complete
/// (NOT_CONTROLLER while no controller can take it; KAFKA_STORAGE_ERROR when it was committed
/// but this broker failed to apply it).
fn controller_failure(e: &ControllerError) -> (i16, String) {
    (e.kafka_error_code(), e.to_string())
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
/// The topics that pass the checks here go to the controller in one request (one batch of
/// records); the response is sent once they are applied on this broker.
///
/// A topic is created whole or not at all as far as this broker goes: when the controller
/// committed a topic but this broker could not create the log of one of its partitions
/// (ENOSPC, EACCES, EIO, ...; [`crate::replica_manager::ReplicaManager::log_creation_failures`]),
/// the topic is deleted again through the controller (by topic id, as DeleteTopics does) and
/// answered KAFKA_STORAGE_ERROR (56) with a message naming the partition, the directory and
/// the cause; Metadata then does not list it, the logs of its other partitions are deleted,
/// and creating it again once the cause is fixed starts afresh. Kafka 4.4 answers such a
/// topic with success (its controller does not wait for brokers), the broker takes the log
/// directory offline (`LogDirFailureChannel`) and the partition stays without a log.
///
/// Out of scope: a replica that fails on *another* broker (this node is the active
/// controller, a client's broker forwards to it, or the topic's replicas are elsewhere). That
/// broker keeps retrying the creation
/// ([`crate::replica_manager::ReplicaManager::retry_log_creation`]) and the topic stays.
pub async fn create_topics(
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
    // Topics for the controller, with their place in `results` and what the answer needs.
    let mut new_topics = Vec::new();
    let mut accepted = Vec::new();
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
        // Filled in below from the controller's answer.
        results.push(CreatableTopicResult::default());
        accepted.push((
            results.len() - 1,
            t.name,
            configs,
            actual_partitions,
            actual_rf,
        ));
        new_topics.push(new_topic);
    }
    if new_topics.is_empty() {
        return CreateTopicsResponse::default().with_topics(results);
    }
    // KIP-599: strict from v6.
    let quota = mutation_quota(broker, ctx, 6);
    let answers = broker
        .controller
        .create_topics_with_quota(
            new_topics,
            req.validate_only,
            partition_change_quota(&quota),
        )
        .await;
    for (i, (slot, name, configs, partitions, rf)) in accepted.into_iter().enumerate() {
        let answer = match &answers {
            Ok(a) => a.get(i).map_or_else(
                || {
                    Err((
                        ec::UNKNOWN_SERVER_ERROR,
                        "no answer from the controller".into(),
                    ))
                },
                |r| r.as_ref().copied().map_err(controller_failure),
            ),
            Err(e) => Err(controller_failure(e)),
        };
        let answer = if req.validate_only {
            answer
        } else {
            settle_created_topic(broker, &name.0, answer).await
        };
        results[slot] = match answer {
            Ok(topic_id) => {
                if !req.validate_only {
                    info!(topic = %name.0, partitions, "created topic");
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
                CreatableTopicResult::default()
                    .with_name(name)
                    .with_topic_id(if version >= 7 && !req.validate_only {
                        topic_id
                    } else {
                        Uuid::nil()
                    })
                    .with_error_message(None)
                    .with_num_partitions(partitions)
                    .with_replication_factor(rf)
                    .with_configs(Some(cfgs))
            }
            Err((code, message)) => failed(&name, code, message),
        };
    }
    CreateTopicsResponse::default()
        .with_topics(results)
        .with_throttle_time_ms(throttle(ctx, &quota))
}

/// The answer for topic `name` that the controller answered `answer` for, once this
/// broker's logs are looked at: a topic whose partitions here have no log
/// ([`crate::replica_manager::ReplicaManager::log_creation_failures_of`]) is deleted again
/// through the controller and answered KAFKA_STORAGE_ERROR; a topic the controller answered
/// KAFKA_STORAGE_ERROR for (applying its batch failed on this node) whose partitions here all
/// have their logs was created, and is answered with its id (another topic of the batch
/// failed).
async fn settle_created_topic(
    broker: &Arc<Broker>,
    name: &str,
    answer: Result<Uuid, (i16, String)>,
) -> Result<Uuid, (i16, String)> {
    let topic_id = match &answer {
        Ok(id) => *id,
        Err((code, _)) if *code == ec::KAFKA_STORAGE_ERROR => {
            match broker.controller.image().topic(name) {
                Some(t) => t.topic_id,
                None => return answer,
            }
        }
        Err(_) => return answer,
    };
    let rm = &broker.replica_manager;
    let failures = rm.log_creation_failures_of(name, topic_id);
    if failures.is_empty() {
        return match answer {
            Err(_) if rm.hosts_local_replicas(&broker.controller.image(), name) => Ok(topic_id),
            other => other,
        };
    }
    let causes = failures
        .iter()
        .map(|f| f.error.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let deleted = broker.controller.delete_topics(vec![topic_id]).await;
    if broker.controller.image().topic_by_id(&topic_id).is_none() {
        warn!(topic = name, %topic_id, cause = %causes,
            "topic not created: its logs could not be created on this broker, so it was deleted again");
        return Err((
            ec::KAFKA_STORAGE_ERROR,
            format!(
                "Topic '{name}' was not created: {causes}. Its records were deleted again; create it again once the cause is fixed."
            ),
        ));
    }
    let why = match deleted {
        Ok(answers) => answers
            .into_iter()
            .next()
            .and_then(Result::err)
            .map_or_else(|| "no answer".to_string(), |e| e.to_string()),
        Err(e) => e.to_string(),
    };
    warn!(topic = name, %topic_id, cause = %causes, error = %why,
        "a topic's logs could not be created on this broker and deleting the topic again failed; the creation is retried");
    Err((
        ec::KAFKA_STORAGE_ERROR,
        format!(
            "Topic '{name}' was created, but {causes}; deleting it again failed ({why}): this broker retries creating the logs every {} s.",
            crate::replica_manager::LOG_CREATION_RETRY_INTERVAL.as_secs()
        ),
    ))
}

/// Answers DeleteTopics: by name (all versions) or by topic id (v6+). The topics found go to
/// the controller in one request; the response is sent once their logs are deleted here.
pub async fn delete_topics(
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
    // Topic ids for the controller, with their place in `responses`.
    let mut to_delete: Vec<(usize, Uuid)> = Vec::new();
    // Kafka's `ControllerApis.deleteTopics`: Delete on the Cluster allows every topic; else a
    // name the principal may not Describe is TOPIC_AUTHORIZATION_FAILED whether or not it
    // exists, and Delete on the topic is needed.
    let cluster_delete = broker.authorize(
        ctx,
        AclOperation::Delete,
        ResourceType::Cluster,
        CLUSTER_NAME,
    );
    for (name, id) in wanted.drain(..) {
        if let (Some(n), true) = (&name, id.is_nil()) {
            if !cluster_delete
                && !broker.authorize(ctx, AclOperation::Describe, ResourceType::Topic, n)
            {
                responses.push(
                    DeletableTopicResult::default()
                        .with_name(Some(TopicName(sb(n))))
                        .with_error_code(ec::TOPIC_AUTHORIZATION_FAILED)
                        .with_error_message(Some(sb(NOT_AUTHORIZED))),
                );
                continue;
            }
        }
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
        if !cluster_delete
            && !broker.authorize(ctx, AclOperation::Delete, ResourceType::Topic, &topic_name)
        {
            responses.push(
                result
                    .with_error_code(ec::TOPIC_AUTHORIZATION_FAILED)
                    .with_error_message(Some(sb(NOT_AUTHORIZED))),
            );
            continue;
        }
        responses.push(result);
        to_delete.push((responses.len() - 1, topic_id));
    }
    if to_delete.is_empty() {
        return DeleteTopicsResponse::default().with_responses(responses);
    }
    // KIP-599: strict from v5.
    let quota = mutation_quota(broker, ctx, 5);
    let answers = broker
        .controller
        .delete_topics_with_quota(
            to_delete.iter().map(|(_, id)| *id).collect(),
            partition_change_quota(&quota),
        )
        .await;
    for (i, (slot, _)) in to_delete.into_iter().enumerate() {
        let answer = match &answers {
            Ok(a) => a.get(i).map_or_else(
                || {
                    Err((
                        ec::UNKNOWN_SERVER_ERROR,
                        "no answer from the controller".into(),
                    ))
                },
                |r| r.as_ref().map_err(controller_failure),
            ),
            Err(e) => Err(controller_failure(e)),
        };
        match answer {
            Ok(name) => info!(topic = %name, "deleted topic"),
            Err((code, message)) => {
                let r = &mut responses[slot];
                r.error_code = code;
                r.error_message = Some(sb(&message));
            }
        }
    }
    DeleteTopicsResponse::default()
        .with_responses(responses)
        .with_throttle_time_ms(throttle(ctx, &quota))
}

/// Answers CreatePartitions: all topics go to the controller in one request; the response is
/// sent once the new partitions' logs exist here.
///
/// A new partition whose log this broker could not create
/// ([`crate::replica_manager::ReplicaManager::log_creation_failures`]) makes its topic's answer
/// KAFKA_STORAGE_ERROR (56), naming the partitions, the directory and the cause. The partitions
/// stay: Kafka has no way to remove partitions from a topic, so they cannot be rolled back as
/// a new topic is; this broker retries creating their logs every
/// [`crate::replica_manager::LOG_CREATION_RETRY_INTERVAL`] (and with the next metadata
/// change) until it succeeds. New partitions whose replicas fail on another broker are out of
/// scope here: that broker retries in the same way.
pub async fn create_partitions(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: CreatePartitionsRequest,
    _version: i16,
) -> CreatePartitionsResponse {
    let mut results = Vec::with_capacity(req.topics.len());
    let mut increases = Vec::with_capacity(req.topics.len());
    // The place in `results` of each increase sent to the controller.
    let mut slots = Vec::with_capacity(req.topics.len());
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
        slots.push(results.len());
        results.push(r);
        increases.push(PartitionsIncrease {
            topic: t.name.to_string(),
            total_count: t.count,
            assignments,
        });
    }
    if increases.is_empty() {
        return CreatePartitionsResponse::default().with_results(results);
    }
    // Each topic's id and partition count before: partitions from that index on are new.
    let before: Vec<Option<(Uuid, i32)>> = {
        let image = broker.controller.image();
        increases
            .iter()
            .map(|inc| {
                image
                    .topic(&inc.topic)
                    .map(|t| (t.topic_id, t.partitions.len() as i32))
            })
            .collect()
    };
    let validate_only = req.validate_only;
    // KIP-599: strict from v3.
    let quota = mutation_quota(broker, ctx, 3);
    let answers = broker
        .controller
        .create_partitions_with_quota(increases, req.validate_only, partition_change_quota(&quota))
        .await;
    for (i, slot) in slots.into_iter().enumerate() {
        let r = &mut results[slot];
        let answer = match &answers {
            Ok(a) => a.get(i).map_or_else(
                || {
                    Err((
                        ec::UNKNOWN_SERVER_ERROR,
                        "no answer from the controller".into(),
                    ))
                },
                |r| r.as_ref().copied().map_err(controller_failure),
            ),
            Err(e) => Err(controller_failure(e)),
        };
        let answer = match before.get(i).copied().flatten() {
            Some((topic_id, count)) if !validate_only => {
                settle_new_partitions(broker, &r.name, topic_id, count, answer)
            }
            _ => answer,
        };
        if let Err((code, message)) = answer {
            r.error_code = code;
            r.error_message = Some(sb(&message));
        }
    }
    CreatePartitionsResponse::default()
        .with_results(results)
        .with_throttle_time_ms(throttle(ctx, &quota))
}

/// The request's controller mutation quota (KIP-599), if a `controller_mutation_rate`
/// applies to its principal and client id.
fn mutation_quota(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    strict_since_version: i16,
) -> Option<Arc<crate::client_quota::ControllerMutationQuota>> {
    let image = broker.controller.image();
    broker
        .client_quotas
        .controller_mutation
        .quota_for(&image, ctx, strict_since_version)
}

/// The quota as the controller applies it per topic.
fn partition_change_quota(
    quota: &Option<Arc<crate::client_quota::ControllerMutationQuota>>,
) -> Option<gregor_metadata::controller::PartitionChangeQuota> {
    quota.clone().map(|q| {
        let f: gregor_metadata::controller::PartitionChangeQuota =
            Arc::new(move |partitions| q.record(partitions));
        f
    })
}

/// The throttle time of the response (ms), with the client's connection muted for it
/// (KIP-219; a forwarded request's connection is the forwarding broker's, which
/// `controller_server` gives a throttle of its own, so only the client's broker mutes).
fn throttle(
    ctx: &RequestContext,
    quota: &Option<Arc<crate::client_quota::ControllerMutationQuota>>,
) -> i32 {
    let t = quota.as_ref().map_or(0, |q| q.throttle_time_ms());
    ctx.throttle.throttle(t);
    i32::try_from(t).unwrap_or(i32::MAX)
}

/// The answer for the partitions added to topic `name` (id `topic_id`, `count` partitions
/// before) that the controller answered `answer` for, once this broker's logs are looked at:
/// KAFKA_STORAGE_ERROR naming the new partitions whose logs could not be created here; success
/// for a KAFKA_STORAGE_ERROR of the controller (another topic of the batch failed to apply)
/// when every partition of the topic here has its log.
fn settle_new_partitions(
    broker: &Broker,
    name: &str,
    topic_id: Uuid,
    count: i32,
    answer: Result<(), (i16, String)>,
) -> Result<(), (i16, String)> {
    match &answer {
        Ok(()) => {}
        Err((code, _)) if *code == ec::KAFKA_STORAGE_ERROR => {}
        Err(_) => return answer,
    }
    let rm = &broker.replica_manager;
    let failures: Vec<_> = rm
        .log_creation_failures_of(name, topic_id)
        .into_iter()
        .filter(|f| f.topic_partition.partition >= count)
        .collect();
    if failures.is_empty() {
        return match answer {
            Err(_) if rm.hosts_local_replicas(&broker.controller.image(), name) => Ok(()),
            other => other,
        };
    }
    let causes = failures
        .iter()
        .map(|f| f.error.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    warn!(topic = name, cause = %causes,
        "new partitions' logs could not be created on this broker; the creation is retried");
    Err((
        ec::KAFKA_STORAGE_ERROR,
        format!(
            "Partitions were added to topic '{name}', but {causes}. Partitions cannot be removed again, so they stay; this broker retries creating their logs every {} s.",
            crate::replica_manager::LOG_CREATION_RETRY_INTERVAL.as_secs()
        ),
    ))
}

/// Topic-level non-default configs, for DescribeConfigs.
pub fn topic_overrides(broker: &Broker, topic: &str) -> BTreeMap<String, String> {
    broker
        .controller
        .image()
        .configs_of(ConfigResource::Topic, topic)
}
