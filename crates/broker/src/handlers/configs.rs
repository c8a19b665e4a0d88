//! DescribeConfigs (key 32), <https://kafka.apache.org/protocol#The_Messages_DescribeConfigs>,
//! KIP-133 (sources and synonyms) and KIP-226 (config types and documentation, v3+).

use std::sync::Arc;

use gregor_protocol::kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use gregor_protocol::kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use gregor_protocol::kafka_protocol::protocol::StrBytes;

use super::sb;
use crate::config::{ConfigSource, TopicConfigs};
use crate::error_codes as ec;
use crate::server::Broker;

/// `ConfigResource.Type.TOPIC`.
pub const RESOURCE_TOPIC: i8 = 2;
/// `ConfigResource.Type.BROKER`.
pub const RESOURCE_BROKER: i8 = 4;

fn wanted(keys: &Option<Vec<StrBytes>>, name: &str) -> bool {
    keys.as_ref()
        .is_none_or(|k| k.is_empty() || k.iter().any(|k| &**k == name))
}

/// Answers DescribeConfigs for topics and brokers.
pub fn describe_configs(
    broker: &Arc<Broker>,
    req: &DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let mut results = Vec::new();
    for res in &req.resources {
        let mut r = DescribeConfigsResult::default()
            .with_resource_type(res.resource_type)
            .with_resource_name(res.resource_name.clone());
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
                let resolved = TopicConfigs::resolve(&broker.config, &overrides);
                for (def, value, source) in &resolved.entries {
                    if !wanted(&res.configuration_keys, def.name) {
                        continue;
                    }
                    let mut synonyms = Vec::new();
                    if req.include_synonyms {
                        if *source == ConfigSource::DynamicTopic {
                            synonyms.push(
                                DescribeConfigsSynonym::default()
                                    .with_name(sb(def.name))
                                    .with_value(Some(sb(value)))
                                    .with_source(ConfigSource::DynamicTopic.code()),
                            );
                        }
                        if let Some(syn) = def.broker_synonym {
                            let (bv, bs) = broker.config.topic_default(def);
                            if bs == ConfigSource::StaticBroker {
                                synonyms.push(
                                    DescribeConfigsSynonym::default()
                                        .with_name(sb(syn))
                                        .with_value(Some(sb(&bv)))
                                        .with_source(bs.code()),
                                );
                            }
                        }
                        synonyms.push(
                            DescribeConfigsSynonym::default()
                                .with_name(sb(def.broker_synonym.unwrap_or(def.name)))
                                .with_value(Some(sb(def.default)))
                                .with_source(ConfigSource::Default.code()),
                        );
                    }
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
                for (cname, value, source, ty) in broker.config.describe() {
                    if !wanted(&res.configuration_keys, &cname) {
                        continue;
                    }
                    // Cluster-default resources ("") only list dynamic defaults; gregor has
                    // none yet, so they are empty, as on a fresh Kafka cluster.
                    if name.is_empty() {
                        continue;
                    }
                    let synonyms = if req.include_synonyms {
                        vec![DescribeConfigsSynonym::default()
                            .with_name(sb(&cname))
                            .with_value(value.as_deref().map(sb))
                            .with_source(source.code())]
                    } else {
                        vec![]
                    };
                    r.configs.push(
                        DescribeConfigsResourceResult::default()
                            .with_name(sb(&cname))
                            .with_value(value.as_deref().map(sb))
                            .with_read_only(true)
                            .with_config_source(source.code())
                            .with_is_sensitive(false)
                            .with_synonyms(synonyms)
                            .with_config_type(if version >= 3 { ty.code() } else { 0 }),
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
