//! The KRaft APIs (KIP-595): Vote (52), BeginQuorumEpoch (53), EndQuorumEpoch (54),
//! DescribeQuorum (55), FetchSnapshot (59, KIP-630) and Fetch (1) of `__cluster_metadata`, handed to this node's
//! [`gregor_raft::driver::RaftManager`]. Advertised in ApiVersions on controller listeners
//! (`controller.listener.names`); answered on any
//! listener that receives them.

use std::sync::Arc;

use gregor_protocol::kafka_protocol::messages::{ApiKey, FetchRequest, RequestKind};
use gregor_raft::convert::{METADATA_TOPIC_ID, METADATA_TOPIC_NAME};

use crate::broker::Broker;
use gregor_network::{respond, Handled, RequestContext};

/// The KRaft-only APIs and the versions gregor serves (Kafka 4.4's: Vote 0-2,
/// BeginQuorumEpoch 0-1, EndQuorumEpoch 0-1, DescribeQuorum 0-2).
pub fn versions(api_key: ApiKey) -> Option<(i16, i16)> {
    match api_key {
        ApiKey::Vote | ApiKey::DescribeQuorum => Some((0, 2)),
        ApiKey::BeginQuorumEpoch | ApiKey::EndQuorumEpoch | ApiKey::FetchSnapshot => Some((0, 1)),
        _ => None,
    }
}

/// True when a Fetch names the metadata topic (by id from v13, by name before).
pub fn is_metadata_fetch(r: &FetchRequest) -> bool {
    r.topics
        .iter()
        .any(|t| t.topic_id == METADATA_TOPIC_ID || t.topic.0.as_str() == METADATA_TOPIC_NAME)
}

/// Hands `body` to the quorum member; the answer comes when the node gives it (a parked
/// Fetch later). A node without one yet (start-up) closes the connection, as for an API it
/// does not serve.
pub fn handle(broker: &Arc<Broker>, ctx: &RequestContext, body: RequestKind) -> Handled {
    let Some(raft) = broker.raft.get().cloned() else {
        return Handled::CloseConnection;
    };
    let header = ctx.header.clone();
    let api_key = ctx.api_key;
    Handled::Deferred(Box::pin(async move {
        let version = header.request_api_version;
        let response = raft.handle_kafka_request(&body, version).await?;
        respond(&header, api_key, response)
    }))
}
