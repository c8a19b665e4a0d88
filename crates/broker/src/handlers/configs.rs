//! DescribeConfigs (key 32), AlterConfigs (key 33) and IncrementalAlterConfigs (key 44):
//! <https://kafka.apache.org/protocol#The_Messages_DescribeConfigs>, KIP-133 (sources and
//! synonyms), KIP-226 (dynamic broker configs; config types and documentation, v3+), KIP-339
//! (IncrementalAlterConfigs: SET, DELETE, APPEND, SUBTRACT).
//!
//! Changes are validated here (Kafka's names, types, ranges and allowed values; only dynamic
//! broker configs may change at run time), committed as `ConfigRecord`s through
//! `ControllerHandle::alter_configs`, which returns once the metadata loader has applied them
//! to the logs (`ReplicaManager::apply_image`).

use std::sync::Arc;

use gregor_protocol::kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use gregor_protocol::kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use gregor_protocol::kafka_protocol::protocol::StrBytes;

use super::sb;
use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use crate::config::{ConfigSource, ConfigType, TopicConfigs};
use crate::error_codes as ec;
use gregor_network::RequestContext;

/// `ConfigResource.Type.TOPIC`.
pub const RESOURCE_TOPIC: i8 = 2;
/// `ConfigResource.Type.BROKER`.
pub const RESOURCE_BROKER: i8 = 4;
/// `ConfigResource.Type.GROUP` (KIP-848 group configs).
pub const RESOURCE_GROUP: i8 = 32;

/// The metadata image's resource for GROUP configs (`ConfigRecord` resource type 32).
pub const GROUP_CONFIG_RESOURCE: gregor_metadata::ConfigResource =
    gregor_metadata::ConfigResource::Other(RESOURCE_GROUP);

fn wanted(keys: &Option<Vec<StrBytes>>, name: &str) -> bool {
    keys.as_ref()
        .is_none_or(|k| k.is_empty() || k.iter().any(|k| &**k == name))
}

/// The authorization error for `operation` on a config resource: a topic is authorised as
/// its Topic, broker and broker-logger resources as the Cluster (Kafka's `ConfigHelper`).
fn config_authorization_error(
    broker: &Broker,
    ctx: &RequestContext,
    operation: AclOperation,
    resource_type: i8,
    name: &str,
) -> Option<i16> {
    if resource_type == RESOURCE_TOPIC {
        (!broker.authorize(ctx, operation, ResourceType::Topic, name))
            .then_some(ec::TOPIC_AUTHORIZATION_FAILED)
    } else if resource_type == RESOURCE_GROUP {
        (!broker.authorize(ctx, operation, ResourceType::Group, name))
            .then_some(ec::GROUP_AUTHORIZATION_FAILED)
    } else {
        (!broker.authorize(ctx, operation, ResourceType::Cluster, CLUSTER_NAME))
            .then_some(ec::CLUSTER_AUTHORIZATION_FAILED)
    }
}

/// Answers DescribeConfigs for topics and brokers (`DescribeConfigs` on the topic or the
/// Cluster).
pub fn describe_configs(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let mut results = Vec::new();
    for res in &req.resources {
        let mut r = DescribeConfigsResult::default()
            .with_resource_type(res.resource_type)
            .with_resource_name(res.resource_name.clone());
        if let Some(code) = config_authorization_error(
            broker,
            ctx,
            AclOperation::DescribeConfigs,
            res.resource_type,
            &res.resource_name,
        ) {
            r.error_code = code;
            results.push(r);
            continue;
        }
        match res.resource_type {
            RESOURCE_TOPIC => {
                let name = res.resource_name.to_string();
                if broker.controller.image().topic(&name).is_none() {
                    r.error_code =
                        if gregor_metadata::controller::validate_topic_name(&name).is_err() {
                            ec::INVALID_TOPIC_EXCEPTION
                        } else {
                            ec::UNKNOWN_TOPIC_OR_PARTITION
                        };
                    r.error_message = Some(sb(&format!("Topic {name} does not exist.")))
                        .filter(|_| r.error_code == ec::UNKNOWN_TOPIC_OR_PARTITION);
                    results.push(r);
                    continue;
                }
                let overrides = super::topics::topic_overrides(broker, &name);
                let dynamic = broker.replica_manager.dynamic_configs();
                let resolved = TopicConfigs::resolve_dynamic(&broker.config, &dynamic, &overrides);
                for (def, value, source) in &resolved.entries {
                    if !wanted(&res.configuration_keys, def.name) {
                        continue;
                    }
                    // Kafka's ConfigHelper.createTopicConfigEntry: the topic override, then
                    // the broker synonyms of the config's broker name.
                    let mut all: Vec<(String, String, ConfigSource)> = Vec::new();
                    if *source == ConfigSource::DynamicTopic {
                        all.push((
                            def.name.to_string(),
                            value.clone(),
                            ConfigSource::DynamicTopic,
                        ));
                    }
                    if let Some(syn) = def.broker_synonym {
                        all.extend(broker.config.config_synonyms(&dynamic, syn));
                    }
                    let source = all.first().map_or(ConfigSource::Default, |s| s.2);
                    let synonyms = if req.include_synonyms {
                        all.iter()
                            .map(|(n, v, s)| {
                                DescribeConfigsSynonym::default()
                                    .with_name(sb(n))
                                    .with_value(Some(sb(v)))
                                    .with_source(s.code())
                            })
                            .collect()
                    } else {
                        Vec::new()
                    };
                    r.configs.push(
                        DescribeConfigsResourceResult::default()
                            .with_name(sb(def.name))
                            .with_value(Some(sb(value)))
                            .with_read_only(false)
                            .with_config_source(source.code())
                            .with_is_sensitive(false)
                            .with_synonyms(synonyms)
                            .with_config_type(if version >= 3 {
                                def.config_type.code()
                            } else {
                                0
                            })
                            .with_documentation(
                                (version >= 3 && req.include_documentation).then(|| sb(def.doc)),
                            ),
                    );
                }
            }
            RESOURCE_BROKER => {
                let name = res.resource_name.to_string();
                let own = broker.config.node_id.to_string();
                if !name.is_empty() && name != own {
                    r.error_code = ec::INVALID_REQUEST;
                    r.error_message = Some(sb(&format!(
                        "Unexpected broker id, expected {own} or empty string, but received {name}"
                    )));
                    results.push(r);
                    continue;
                }
                let dynamic = broker.replica_manager.dynamic_configs();
                let synonym = |n: &str, v: &str, s: ConfigSource| {
                    DescribeConfigsSynonym::default()
                        .with_name(sb(n))
                        .with_value(Some(sb(v)))
                        .with_source(s.code())
                };
                if name.is_empty() {
                    // The cluster-default resource lists only the dynamic defaults, as Kafka.
                    for (cname, value) in &dynamic.cluster_default {
                        if !wanted(&res.configuration_keys, cname) {
                            continue;
                        }
                        let ty = crate::config::broker_config_type(cname)
                            .map_or(ConfigType::String, |(t, _)| t);
                        r.configs.push(
                            DescribeConfigsResourceResult::default()
                                .with_name(sb(cname))
                                .with_value(Some(sb(value)))
                                .with_read_only(!crate::config::is_dynamic_broker_config(cname))
                                .with_config_source(ConfigSource::DynamicDefaultBroker.code())
                                .with_is_sensitive(false)
                                .with_synonyms(if req.include_synonyms {
                                    vec![synonym(cname, value, ConfigSource::DynamicDefaultBroker)]
                                } else {
                                    vec![]
                                })
                                .with_config_type(if version >= 3 { ty.code() } else { 0 }),
                        );
                    }
                    results.push(r);
                    continue;
                }
                // The replication throttle rates are no KafkaConfig keys: Kafka lists them
                // only when set dynamically (its `originals`).
                let quota_rates = crate::config::BROKER_QUOTA_KEYS
                    .iter()
                    .filter(|n| dynamic.get(n).is_some())
                    .map(|n| {
                        (
                            (*n).to_string(),
                            None,
                            ConfigSource::Default,
                            ConfigType::Long,
                        )
                    });
                let mut entries = broker.config.describe();
                entries.extend(quota_rates);
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                for (cname, value, _, ty) in entries {
                    if !wanted(&res.configuration_keys, &cname) {
                        continue;
                    }
                    let value = match dynamic.get(&cname) {
                        Some((v, _)) => Some(v.to_string()),
                        None => value,
                    };
                    let all = broker.config.config_synonyms(&dynamic, &cname);
                    let source = all.first().map_or(ConfigSource::Default, |s| s.2);
                    let synonyms = if req.include_synonyms {
                        all.iter().map(|(n, v, s)| synonym(n, v, *s)).collect()
                    } else {
                        vec![]
                    };
                    r.configs.push(
                        DescribeConfigsResourceResult::default()
                            .with_name(sb(&cname))
                            .with_value(value.as_deref().map(sb))
                            .with_read_only(!crate::config::is_dynamic_broker_config(&cname))
                            .with_config_source(source.code())
                            .with_is_sensitive(false)
                            .with_synonyms(synonyms)
                            .with_config_type(if version >= 3 { ty.code() } else { 0 })
                            // Kafka sends null unless documentation was asked for.
                            .with_documentation(
                                (version >= 3 && req.include_documentation).then(StrBytes::default),
                            ),
                    );
                }
            }
            RESOURCE_GROUP => {
                let overrides = broker
                    .controller
                    .image()
                    .configs_of(GROUP_CONFIG_RESOURCE, &res.resource_name);
                let dynamic = broker.replica_manager.dynamic_configs();
                for def in crate::broker_config_defs::KAFKA_GROUP_CONFIGS {
                    if !wanted(&res.configuration_keys, def.name) {
                        continue;
                    }
                    // Kafka's ConfigHelper for groups: the group's own value (GROUP_CONFIG),
                    // then the broker config it defaults to, else the group default.
                    let mut all: Vec<(String, String, ConfigSource)> = Vec::new();
                    if let Some(v) = overrides.get(def.name) {
                        all.push((def.name.to_string(), v.clone(), ConfigSource::GroupConfig));
                    }
                    match def.broker_synonym {
                        Some(syn) => {
                            let (v, source) = broker.config.effective(&dynamic, syn);
                            all.push((syn.to_string(), v, source));
                        }
                        None => all.push((
                            def.name.to_string(),
                            def.default.unwrap_or("").to_string(),
                            ConfigSource::Default,
                        )),
                    }
                    let (_, value, source) = all[0].clone();
                    r.configs.push(
                        DescribeConfigsResourceResult::default()
                            .with_name(sb(def.name))
                            .with_value(Some(sb(&value)))
                            .with_read_only(false)
                            .with_config_source(source.code())
                            .with_is_sensitive(false)
                            .with_synonyms(if req.include_synonyms {
                                all.iter()
                                    .map(|(n, v, s)| {
                                        DescribeConfigsSynonym::default()
                                            .with_name(sb(n))
                                            .with_value(Some(sb(v)))
                                            .with_source(s.code())
                                    })
                                    .collect()
                            } else {
                                Vec::new()
                            })
                            .with_config_type(if version >= 3 {
                                def.config_type.code()
                            } else {
                                0
                            })
                            .with_documentation(
                                (version >= 3 && req.include_documentation).then(StrBytes::default),
                            ),
                    );
                }
            }
            other => {
                r.error_code = ec::INVALID_REQUEST;
                r.error_message = Some(sb(&format!("Unsupported resource type {other}")));
            }
        }
        results.push(r);
    }
    DescribeConfigsResponse::default().with_results(results)
}

/// The kind of resource a change is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Topic,
    Broker,
    Group,
}

/// IncrementalAlterConfigs `config_operation` (KIP-339).
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// One resource's requested change.
enum Change {
    /// AlterConfigs: the complete new set of dynamic configs (absent names are removed).
    Replace(Vec<(String, Option<String>)>),
    /// IncrementalAlterConfigs: `(name, operation, value)`.
    Incremental(Vec<(String, i8, Option<String>)>),
}

type ApiResult<T> = Result<T, (i16, Option<String>)>;

fn invalid_config(e: &crate::config::ConfigError) -> (i16, Option<String>) {
    (ec::INVALID_CONFIG, Some(e.to_string()))
}

/// Validates and (unless `validate_only`) commits a change of one resource's configs.
async fn alter_resource(
    broker: &Arc<Broker>,
    resource_type: i8,
    name: &str,
    change: Change,
    validate_only: bool,
) -> ApiResult<()> {
    let image = broker.controller.image();
    let (resource, current, kind) = match resource_type {
        RESOURCE_TOPIC => {
            if image.topic(name).is_none() {
                return Err(
                    if gregor_metadata::controller::validate_topic_name(name).is_err() {
                        (ec::INVALID_TOPIC_EXCEPTION, None)
                    } else {
                        (
                            ec::UNKNOWN_TOPIC_OR_PARTITION,
                            Some(format!("Topic {name} does not exist.")),
                        )
                    },
                );
            }
            (
                gregor_metadata::ConfigResource::Topic,
                image.configs_of(gregor_metadata::ConfigResource::Topic, name),
                Kind::Topic,
            )
        }
        RESOURCE_BROKER => {
            if !name.is_empty() && name.parse::<i32>().map_or(true, |id| id < 0) {
                return Err((
                    ec::INVALID_REQUEST,
                    Some(format!(
                        "Unexpected broker id {name}: expected a node id or the empty string"
                    )),
                ));
            }
            (
                gregor_metadata::ConfigResource::Broker,
                image.configs_of(gregor_metadata::ConfigResource::Broker, name),
                Kind::Broker,
            )
        }
        // KIP-848 group configs: any group id, existing or not, but not the default ("").
        RESOURCE_GROUP => {
            if name.is_empty() {
                return Err((
                    ec::INVALID_REQUEST,
                    Some("Default group resources are not allowed.".into()),
                ));
            }
            (
                GROUP_CONFIG_RESOURCE,
                image.configs_of(GROUP_CONFIG_RESOURCE, name),
                Kind::Group,
            )
        }
        other => {
            return Err((
                ec::INVALID_REQUEST,
                Some(format!(
                    "Unsupported resource type {other} for altering configs"
                )),
            ))
        }
    };
    let is_topic = kind == Kind::Topic;
    // Topic values are checked one by one; broker and group configs as the whole resource
    // after the change, as Kafka does (below).
    let validate = |key: &str, value: Option<&str>| -> ApiResult<()> {
        if !is_topic {
            return Ok(());
        }
        match value {
            Some(v) => crate::config::validate_topic_config(key, v).map_err(|e| invalid_config(&e)),
            None => crate::config::topic_config_def(key).map(|_| ()).ok_or((
                ec::INVALID_CONFIG,
                Some(format!("Unknown topic config name: {key}")),
            )),
        }
    };
    let config_type = |key: &str| -> Option<ConfigType> {
        match kind {
            Kind::Topic => crate::config::topic_config_def(key).map(|d| d.config_type),
            Kind::Broker => crate::config::broker_config_type(key).map(|(t, _)| t),
            Kind::Group => crate::broker_config_defs::group_config(key).map(|d| d.config_type),
        }
    };
    // The value a key has before the change: the resource's own override, else its default.
    let base_value = |key: &str| -> String {
        if let Some(v) = current.get(key) {
            return v.clone();
        }
        let dynamic = broker.replica_manager.dynamic_configs();
        match kind {
            Kind::Topic => crate::config::topic_config_def(key)
                .map(|d| broker.config.topic_default_dynamic(&dynamic, d).0)
                .unwrap_or_default(),
            Kind::Broker => broker.config.effective(&dynamic, key).0,
            Kind::Group => crate::broker_config_defs::group_config(key)
                .map(|d| match d.broker_synonym {
                    Some(syn) => broker.config.effective(&dynamic, syn).0,
                    None => d.default.unwrap_or("").to_string(),
                })
                .unwrap_or_default(),
        }
    };
    let mut next = current.clone();
    match change {
        Change::Replace(configs) => {
            next.clear();
            for (key, value) in configs {
                validate(&key, value.as_deref())?;
                if let Some(v) = value {
                    next.insert(key, v);
                }
            }
        }
        Change::Incremental(ops) => {
            let mut seen = std::collections::BTreeSet::new();
            for (key, _, _) in &ops {
                if !seen.insert(key.clone()) {
                    return Err((
                        ec::INVALID_REQUEST,
                        Some(format!("Error due to duplicate config keys: {key}")),
                    ));
                }
            }
            for (key, op, value) in ops {
                match op {
                    OP_SET => {
                        validate(&key, Some(value.as_deref().unwrap_or("")))?;
                        next.insert(key, value.unwrap_or_default());
                    }
                    OP_DELETE => {
                        validate(&key, None)?;
                        next.remove(&key);
                    }
                    OP_APPEND | OP_SUBTRACT => {
                        let verb = if op == OP_APPEND {
                            "APPEND"
                        } else {
                            "SUBTRACT"
                        };
                        match config_type(&key) {
                            Some(ConfigType::List) => {}
                            Some(_) => {
                                return Err((
                                    ec::INVALID_CONFIG,
                                    Some(format!(
                                        "Can't {verb} to key {key} because its type is not LIST."
                                    )),
                                ))
                            }
                            None => {
                                validate(&key, value.as_deref())?;
                                return Err((
                                    ec::INVALID_CONFIG,
                                    Some(format!("Unknown config {key}")),
                                ));
                            }
                        }
                        let mut items: Vec<String> = base_value(&key)
                            .split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(str::to_string)
                            .collect();
                        let given: Vec<String> = value
                            .as_deref()
                            .unwrap_or("")
                            .split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(str::to_string)
                            .collect();
                        if op == OP_APPEND {
                            for g in given {
                                if !items.contains(&g) {
                                    items.push(g);
                                }
                            }
                        } else {
                            items.retain(|i| !given.contains(i));
                        }
                        let joined = items.join(",");
                        validate(&key, Some(&joined))?;
                        next.insert(key, joined);
                    }
                    other => {
                        return Err((
                            ec::INVALID_REQUEST,
                            Some(format!("Unknown config operation {other} for {key}")),
                        ))
                    }
                }
            }
        }
    }
    match kind {
        Kind::Topic => {}
        // Kafka's ConfigAdminManager: a broker change that fails validation is INVALID_REQUEST
        // (KAFKA-13609).
        Kind::Broker => crate::broker_config_defs::validate_dynamic_broker_configs(
            next.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            !name.is_empty(),
        )
        .map_err(|m| (ec::INVALID_REQUEST, Some(m)))
        .and_then(|()| {
            // A TLS listener's new keystore is checked before it is stored (its file must
            // make a config; its certificate keeps its DN and SANs unless allowed).
            let Some(tls) = broker.tls_listeners.get() else {
                return Ok(());
            };
            let own = broker.config.node_id.to_string();
            let current_dynamic = broker.replica_manager.dynamic_configs();
            let mut proposed = current_dynamic.clone();
            if name.is_empty() {
                proposed.cluster_default = next.clone();
            } else if name == own {
                proposed.per_broker = next.clone();
            } else {
                return Ok(());
            }
            tls.validate_change(&current_dynamic, &proposed)
                .map_err(|m| (ec::INVALID_REQUEST, Some(m)))
        })?,
        // Kafka's ControllerConfigurationValidator: GroupConfig.validate, INVALID_CONFIG.
        Kind::Group => {
            let dynamic = broker.replica_manager.dynamic_configs();
            let effective = |k: &str| broker.config.effective(&dynamic, k).0;
            crate::broker_config_defs::validate_group_configs(
                &next,
                |k| effective(k).trim().parse().unwrap_or(0),
                |k| {
                    effective(k)
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect()
                },
            )
            .map_err(|m| (ec::INVALID_CONFIG, Some(m)))?;
        }
    }
    if validate_only {
        return Ok(());
    }
    if kind == Kind::Broker {
        for k in next.keys() {
            if current.get(k) != next.get(k) && !crate::config::acted_on(k) {
                tracing::info!(
                    config = k.as_str(),
                    broker = name,
                    "dynamic broker config stored; gregor does not act on it"
                );
            }
        }
    }
    let mut changes: Vec<(String, Option<String>)> = Vec::new();
    for (k, v) in &next {
        if current.get(k) != Some(v) {
            changes.push((k.clone(), Some(v.clone())));
        }
    }
    for k in current.keys() {
        if !next.contains_key(k) {
            changes.push((k.clone(), None));
        }
    }
    if changes.is_empty() {
        return Ok(());
    }
    broker
        .controller
        .alter_configs(resource, name, changes)
        .await
        .map_err(|e| match e {
            gregor_metadata::ControllerError::ApplyFailed(m) => (
                ec::KAFKA_STORAGE_ERROR,
                Some(format!("configs were stored but applying them failed: {m}")),
            ),
            e => (e.kafka_error_code(), Some(e.to_string())),
        })
}

/// AlterConfigs (key 33, v0-v2): replaces all dynamic configs of each resource.
pub async fn alter_configs(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &gregor_protocol::kafka_protocol::messages::AlterConfigsRequest,
    _version: i16,
) -> gregor_protocol::kafka_protocol::messages::AlterConfigsResponse {
    use gregor_protocol::kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
    let mut responses = Vec::with_capacity(req.resources.len());
    for res in &req.resources {
        let change = Change::Replace(
            res.configs
                .iter()
                .map(|c| {
                    (
                        c.name.to_string(),
                        c.value.as_ref().map(ToString::to_string),
                    )
                })
                .collect(),
        );
        let outcome = match config_authorization_error(
            broker,
            ctx,
            AclOperation::AlterConfigs,
            res.resource_type,
            &res.resource_name,
        ) {
            Some(code) => Err((code, None)),
            None => {
                alter_resource(
                    broker,
                    res.resource_type,
                    &res.resource_name,
                    change,
                    req.validate_only,
                )
                .await
            }
        };
        let (code, message) = outcome.err().unwrap_or((ec::NONE, None));
        responses.push(
            AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(message.as_deref().map(sb))
                .with_resource_type(res.resource_type)
                .with_resource_name(res.resource_name.clone()),
        );
    }
    gregor_protocol::kafka_protocol::messages::AlterConfigsResponse::default()
        .with_responses(responses)
}

/// IncrementalAlterConfigs (key 44, v0-v1, KIP-339).
pub async fn incremental_alter_configs(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &gregor_protocol::kafka_protocol::messages::IncrementalAlterConfigsRequest,
    _version: i16,
) -> gregor_protocol::kafka_protocol::messages::IncrementalAlterConfigsResponse {
    use gregor_protocol::kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
    let mut responses = Vec::with_capacity(req.resources.len());
    for res in &req.resources {
        let change = Change::Incremental(
            res.configs
                .iter()
                .map(|c| {
                    (
                        c.name.to_string(),
                        c.config_operation,
                        c.value.as_ref().map(ToString::to_string),
                    )
                })
                .collect(),
        );
        let outcome = match config_authorization_error(
            broker,
            ctx,
            AclOperation::AlterConfigs,
            res.resource_type,
            &res.resource_name,
        ) {
            Some(code) => Err((code, None)),
            None => {
                alter_resource(
                    broker,
                    res.resource_type,
                    &res.resource_name,
                    change,
                    req.validate_only,
                )
                .await
            }
        };
        let (code, message) = outcome.err().unwrap_or((ec::NONE, None));
        responses.push(
            AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(message.as_deref().map(sb))
                .with_resource_type(res.resource_type)
                .with_resource_name(res.resource_name.clone()),
        );
    }
    gregor_protocol::kafka_protocol::messages::IncrementalAlterConfigsResponse::default()
        .with_responses(responses)
}
