//! One module per Kafka API family. Each handler takes the decoded request and returns the
//! response body; [`handle`] dispatches and encodes. Version ranges come from the
//! `kafka-protocol` crate (generated from Kafka 4.1's message schemas), so ApiVersions
//! advertises exactly what Apache Kafka accepts for each API gregor implements.

pub mod api_versions;
pub mod configs;
pub mod fetch;
pub mod list_offsets;
pub mod metadata;
pub mod produce;
pub mod producer_id;
pub mod topics;

use std::sync::Arc;

use gregor_protocol::kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind};
use gregor_protocol::kafka_protocol::protocol::StrBytes;

use crate::server::{respond, Broker, Handled};

/// The APIs gregor implements.
pub const IMPLEMENTED: &[ApiKey] = &[
    ApiKey::Produce,
    ApiKey::Fetch,
    ApiKey::ListOffsets,
    ApiKey::Metadata,
    ApiKey::ApiVersions,
    ApiKey::CreateTopics,
    ApiKey::DeleteTopics,
    ApiKey::InitProducerId,
    ApiKey::DescribeConfigs,
    ApiKey::CreatePartitions,
    ApiKey::DescribeCluster,
];

/// The version range gregor accepts for `api_key`, or None if not implemented.
pub fn supported_versions(api_key: ApiKey) -> Option<(i16, i16)> {
    IMPLEMENTED.contains(&api_key).then(|| {
        let r = api_key.valid_versions();
        (r.min, r.max)
    })
}

/// Runs the handler for one request.
pub async fn handle(
    broker: &Arc<Broker>,
    header: &RequestHeader,
    api_key: ApiKey,
    body: RequestKind,
) -> Handled {
    let v = header.request_api_version;
    let ready = |b| Handled::Ready(respond(header, api_key, b));
    match body {
        RequestKind::ApiVersions(r) => ready(api_versions::handle(&r, v).into()),
        RequestKind::Metadata(r) => ready(metadata::handle(broker, r, v).into()),
        RequestKind::DescribeCluster(r) => ready(metadata::describe_cluster(broker, &r, v).into()),
        RequestKind::CreateTopics(r) => ready(topics::create_topics(broker, r, v).into()),
        RequestKind::DeleteTopics(r) => ready(topics::delete_topics(broker, r, v).into()),
        RequestKind::CreatePartitions(r) => ready(topics::create_partitions(broker, r, v).into()),
        RequestKind::DescribeConfigs(r) => ready(configs::describe_configs(broker, &r, v).into()),
        RequestKind::InitProducerId(r) => ready(producer_id::handle(broker, &r, v).into()),
        RequestKind::ListOffsets(r) => ready(list_offsets::handle(broker, r, v).into()),
        RequestKind::Produce(r) => produce::handle(broker, header.clone(), r),
        RequestKind::Fetch(r) => fetch::handle(broker, header.clone(), r),
        other => {
            // decode_request only lets through versions of implemented APIs.
            tracing::error!(
                ?api_key,
                "no handler for {:?}",
                std::mem::discriminant(&other)
            );
            Handled::Ready(None)
        }
    }
}

/// A `StrBytes` from a `&str`.
pub fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}
