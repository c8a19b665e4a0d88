//! The controller listeners (`controller.listener.names`), served as Kafka's
//! `ControllerServer` serves them: separately from the broker listeners and before the broker
//! is up, since a quorum of nodes that are all starting must elect a leader before any of them
//! can load its metadata. They answer ApiVersions (listing the controller APIs), the KRaft
//! APIs (Vote, BeginQuorumEpoch, EndQuorumEpoch, Fetch of `__cluster_metadata`,
//! DescribeQuorum) through this node's [`RaftManager`], and DescribeCluster with
//! `EndpointType` 2 (KIP-919: the controllers and the active one, which
//! `kafka-metadata-quorum --bootstrap-controller` asks first).

use std::sync::Arc;

use bytes::Bytes;
use gregor_network::{respond, Handled, RequestContext};
use gregor_protocol::kafka_protocol::messages::api_versions_response::ApiVersion;
use gregor_protocol::kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, BrokerId, DescribeClusterResponse, RequestKind, ResponseKind,
};
use gregor_raft::driver::RaftManager;

use crate::handlers::{kraft, sb};
use gregor_protocol::error::ErrorCode;

/// The APIs of a controller listener besides the KRaft ones.
const CONTROLLER_API_KEYS: &[ApiKey] =
    &[ApiKey::ApiVersions, ApiKey::DescribeCluster, ApiKey::Fetch];

/// [`gregor_network::RequestHandler`] of the controller listeners.
pub struct ControllerApis {
    raft: Arc<RaftManager>,
    cluster_id: String,
}

impl ControllerApis {
    /// The handler answering for `raft` in cluster `cluster_id`.
    pub fn new(raft: Arc<RaftManager>, cluster_id: String) -> Self {
        Self { raft, cluster_id }
    }

    fn api_versions(&self) -> ApiVersionsResponse {
        let mut keys: Vec<ApiVersion> = CONTROLLER_API_KEYS
            .iter()
            .chain(gregor_raft::driver::KRAFT_API_KEYS)
            .filter_map(|k| {
                self.versions(*k).map(|(min, max)| {
                    ApiVersion::default()
                        .with_api_key(*k as i16)
                        .with_min_version(min)
                        .with_max_version(max)
                })
            })
            .collect();
        keys.sort_by_key(|k| k.api_key);
        ApiVersionsResponse::default().with_api_keys(keys)
    }

    fn versions(&self, api_key: ApiKey) -> Option<(i16, i16)> {
        match api_key {
            // KRaft fetchers use v13+ (topic ids).
            ApiKey::Fetch => {
                crate::handlers::supported_versions(ApiKey::Fetch).map(|(_, max)| (13, max))
            }
            ApiKey::ApiVersions | ApiKey::DescribeCluster => {
                crate::handlers::supported_versions(api_key)
            }
            other => kraft::versions(other),
        }
    }

    /// DescribeCluster as Kafka's `ControllerApis` answers it (`AuthHelper.computeDescribeClusterResponse`):
    /// the voters at their controller endpoints and the leader as `ControllerId` (-1 when
    /// unknown); a request for another endpoint type gets MISMATCHED_ENDPOINT_TYPE (an unknown
    /// type UNSUPPORTED_ENDPOINT_TYPE), INVALID_REQUEST at v0.
    fn describe_cluster(&self, endpoint_type: i8, version: i16) -> DescribeClusterResponse {
        let error = |code: ErrorCode, message: String| {
            let code = if version == 0 {
                ErrorCode::InvalidRequest
            } else {
                code
            };
            DescribeClusterResponse::default()
                .with_error_code(code.code())
                .with_error_message(Some(sb(&message)))
        };
        match endpoint_type {
            2 => {}
            1 => {
                return error(
                    ErrorCode::MismatchedEndpointType,
                    "The request was sent to an endpoint of type CONTROLLER, but we wanted an endpoint of type BROKER".into(),
                )
            }
            other => {
                return error(
                    ErrorCode::UnsupportedEndpointType,
                    format!("Unsupported endpoint type {other}"),
                )
            }
        }
        let leader = self.raft.leader_and_epoch().borrow().leader_id;
        DescribeClusterResponse::default()
            .with_cluster_id(sb(&self.cluster_id))
            .with_controller_id(BrokerId(leader.unwrap_or(-1)))
            .with_cluster_authorized_operations(i32::MIN)
            .with_endpoint_type(2)
            .with_brokers(
                self.raft
                    .config()
                    .voter_endpoints
                    .iter()
                    .map(|(&id, (host, port))| {
                        DescribeClusterBroker::default()
                            .with_broker_id(BrokerId(id))
                            .with_host(sb(host))
                            .with_port(i32::from(*port))
                    })
                    .collect(),
            )
    }
}

impl gregor_network::RequestHandler for ControllerApis {
    fn supported_versions(&self, api_key: ApiKey) -> Option<(i16, i16)> {
        self.versions(api_key)
    }

    async fn handle(&self, ctx: &RequestContext, body: RequestKind) -> Handled {
        let header = ctx.header.clone();
        let api_key = ctx.api_key;
        let version = header.request_api_version;
        match body {
            RequestKind::ApiVersions(_) => Handled::Ready(respond(
                &header,
                api_key,
                ResponseKind::ApiVersions(self.api_versions()),
            )),
            RequestKind::DescribeCluster(r) => Handled::Ready(respond(
                &header,
                api_key,
                ResponseKind::DescribeCluster(self.describe_cluster(r.endpoint_type, version)),
            )),
            body => {
                let raft = self.raft.clone();
                Handled::Deferred(Box::pin(async move {
                    let response = raft.handle_kafka_request(&body, version).await?;
                    respond(&header, api_key, response)
                }))
            }
        }
    }

    fn unsupported_api_versions(&self, correlation_id: i32) -> Option<Bytes> {
        crate::handlers::api_versions::unsupported_version_response(correlation_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_raft::driver::{RaftManagerConfig, Transport};
    use gregor_raft::{Message, MetadataLogConfig, NodeId, QuorumConfig, VoterSet};

    struct NoPeers;

    impl Transport for NoPeers {
        fn send(&self, _to: NodeId, _message: Message) {}
    }

    #[tokio::test]
    async fn describe_cluster_lists_the_controllers_and_refuses_the_broker_endpoint_type() {
        let dir = tempfile::tempdir().unwrap();
        let raft = RaftManager::start(
            RaftManagerConfig {
                quorum: QuorumConfig::new(1, VoterSet::new([1]).unwrap()),
                metadata_log_dir: dir.path().to_path_buf(),
                log: MetadataLogConfig::default(),
                voter_endpoints: [(1, ("127.0.0.1".to_string(), 9093))].into_iter().collect(),
                controller_listener_name: "CONTROLLER".into(),
            },
            |_| NoPeers,
        )
        .unwrap();
        let mut leader = raft.leader_and_epoch();
        leader.wait_for(|l| l.leader_id == Some(1)).await.unwrap();
        let apis = ControllerApis::new(raft.clone(), "c1".into());
        let ok = apis.describe_cluster(2, 1);
        assert_eq!(ok.error_code, 0);
        assert_eq!((ok.controller_id.0, ok.endpoint_type), (1, 2));
        assert_eq!(ok.brokers.len(), 1);
        assert_eq!(
            (ok.brokers[0].host.as_str(), ok.brokers[0].port),
            ("127.0.0.1", 9093)
        );
        assert_eq!(
            apis.describe_cluster(1, 1).error_code,
            ErrorCode::MismatchedEndpointType.code()
        );
        assert_eq!(
            apis.describe_cluster(1, 0).error_code,
            ErrorCode::InvalidRequest.code()
        );
        assert_eq!(
            apis.describe_cluster(7, 1).error_code,
            ErrorCode::UnsupportedEndpointType.code()
        );
        let versions = apis.api_versions();
        let keys: Vec<i16> = versions.api_keys.iter().map(|k| k.api_key).collect();
        for k in [1, 18, 52, 53, 54, 55, 60] {
            assert!(keys.contains(&k), "api key {k} in {keys:?}");
        }
        assert!(!keys.contains(&0), "no Produce on a controller listener");
        raft.shutdown().await;
    }
}
