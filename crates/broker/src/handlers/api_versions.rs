//! ApiVersions (key 18), <https://kafka.apache.org/protocol#The_Messages_ApiVersions>,
//! KIP-35 and KIP-511 (client software name and version; answering unknown versions with v0).

use bytes::Bytes;
use gregor_metadata::MetadataImage;
use gregor_protocol::frame;
use gregor_protocol::kafka_protocol::messages::api_versions_response::{
    ApiVersion, FinalizedFeatureKey, SupportedFeatureKey,
};
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, ResponseKind,
};

use super::{supported_versions, IMPLEMENTED};
use crate::error_codes as ec;

fn api_keys() -> Vec<ApiVersion> {
    let mut keys: Vec<ApiVersion> = IMPLEMENTED
        .iter()
        .filter_map(|k| {
            supported_versions(*k).map(|(min, max)| {
                ApiVersion::default()
                    .with_api_key(*k as i16)
                    .with_min_version(min)
                    .with_max_version(max)
            })
        })
        .collect();
    keys.sort_by_key(|k| k.api_key);
    keys
}

/// KIP-511: client software name and version must match
/// `[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?`.
fn valid_software_field(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_alphanumeric();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'.';
    match b {
        [] => false,
        [one] => edge(one),
        [first, mid @ .., last] => edge(first) && edge(last) && mid.iter().all(inner),
    }
}

/// Answers ApiVersions on a broker listener.
pub fn handle(req: &ApiVersionsRequest, version: i16) -> ApiVersionsResponse {
    handle_on(req, version, false)
}

/// Answers ApiVersions; on a controller listener (`controller`) the KRaft APIs (Vote,
/// BeginQuorumEpoch, EndQuorumEpoch, FetchSnapshot) are listed too (DescribeQuorum is on
/// every listener: a broker forwards it to the active controller).
pub fn handle_on(req: &ApiVersionsRequest, version: i16, controller: bool) -> ApiVersionsResponse {
    let mut keys = api_keys();
    if controller {
        for k in gregor_raft::driver::KRAFT_API_KEYS {
            if keys.iter().any(|v| v.api_key == *k as i16) {
                continue;
            }
            if let Some((min, max)) = super::kraft::versions(*k) {
                keys.push(
                    ApiVersion::default()
                        .with_api_key(*k as i16)
                        .with_min_version(min)
                        .with_max_version(max),
                );
            }
        }
        keys.sort_by_key(|k| k.api_key);
    }
    let mut resp = ApiVersionsResponse::default().with_api_keys(keys);
    if version >= 3
        && (!valid_software_field(&req.client_software_name)
            || !valid_software_field(&req.client_software_version))
    {
        resp.error_code = ec::INVALID_REQUEST;
    }
    resp
}

/// Adds the feature flags (KIP-584) of ApiVersions v3+: the feature levels this node supports
/// (`SUPPORTED_FEATURES`, as in its BrokerRegistration) and the cluster's finalized levels
/// from the metadata `image` (FeatureLevelRecords; a level of 0 is not listed) plus the
/// quorum's `kraft_version` when above 0 (it is not a FeatureLevelRecord; Kafka's
/// `KRaftMetadataCache.features` adds it the same way), with the image's offset as the
/// finalized-features epoch (-1 when no image is loaded yet). This is what `kafka-features
/// describe` and clients' `describeFeatures` read; an UpdateFeatures shows here once this
/// node's loader applied it.
pub fn with_features(
    mut resp: ApiVersionsResponse,
    image: Option<&MetadataImage>,
    kraft_version: i16,
) -> ApiVersionsResponse {
    resp.supported_features = gregor_metadata::cluster_control::SUPPORTED_FEATURES
        .iter()
        .map(|(name, min, max)| {
            SupportedFeatureKey::default()
                .with_name((*name).to_string().into())
                .with_min_version(*min)
                .with_max_version(*max)
        })
        .collect();
    match image {
        Some(image) if image.metadata_version().is_some() => {
            resp.finalized_features_epoch = i64::try_from(image.offset).unwrap_or(i64::MAX);
            resp.finalized_features = image
                .features
                .iter()
                .filter(|(_, level)| **level > 0)
                .map(|(name, level)| {
                    FinalizedFeatureKey::default()
                        .with_name(name.clone().into())
                        .with_min_version_level(*level)
                        .with_max_version_level(*level)
                })
                .collect();
            if kraft_version > 0 && !image.features.contains_key("kraft.version") {
                resp.finalized_features.push(
                    FinalizedFeatureKey::default()
                        .with_name("kraft.version".to_string().into())
                        .with_min_version_level(kraft_version)
                        .with_max_version_level(kraft_version),
                );
            }
        }
        _ => resp.finalized_features_epoch = -1,
    }
    resp
}

/// The v0 response to an ApiVersions request at a version gregor does not know: error
/// UNSUPPORTED_VERSION plus the supported ApiVersions range, so the client can retry at a
/// version both sides know (KIP-511); like Kafka, only ApiVersions' own range is listed.
pub fn unsupported_version_response(correlation_id: i32) -> Option<Bytes> {
    let body = ApiVersionsResponse::default()
        .with_error_code(ec::UNSUPPORTED_VERSION)
        .with_api_keys(
            api_keys()
                .into_iter()
                .filter(|k| k.api_key == ApiKey::ApiVersions as i16)
                .collect(),
        );
    frame::encode_response(
        ApiKey::ApiVersions,
        0,
        correlation_id,
        &ResponseKind::ApiVersions(body),
    )
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_quorum_is_on_every_listener_the_other_kraft_apis_on_controller_listeners() {
        let req = ApiVersionsRequest::default();
        let range = |r: &ApiVersionsResponse, k: ApiKey| {
            let found: Vec<_> = r
                .api_keys
                .iter()
                .filter(|v| v.api_key == k as i16)
                .map(|v| (v.min_version, v.max_version))
                .collect();
            assert!(found.len() <= 1, "{k:?} listed {} times", found.len());
            found.first().copied()
        };
        let broker = handle_on(&req, 3, false);
        assert_eq!(range(&broker, ApiKey::DescribeQuorum), Some((0, 2)));
        for k in [
            ApiKey::Vote,
            ApiKey::BeginQuorumEpoch,
            ApiKey::EndQuorumEpoch,
            ApiKey::FetchSnapshot,
        ] {
            assert_eq!(range(&broker, k), None, "{k:?} on a broker listener");
        }
        let controller = handle_on(&req, 3, true);
        assert_eq!(range(&controller, ApiKey::DescribeQuorum), Some((0, 2)));
        assert_eq!(range(&controller, ApiKey::Vote), Some((0, 2)));
        assert_eq!(range(&controller, ApiKey::FetchSnapshot), Some((0, 1)));
    }

    #[test]
    fn software_names() {
        assert!(valid_software_field("librdkafka"));
        assert!(valid_software_field("2.12.0"));
        assert!(valid_software_field("apache-kafka-java"));
        assert!(!valid_software_field(""));
        assert!(!valid_software_field("-x"));
        assert!(!valid_software_field("a b"));
    }
}
