//! InitProducerId (key 22) for idempotent producers (KIP-98; KIP-360 for epoch bumps).
//! Transactions (a non-null transactional id) come with the transaction coordinator.

use std::sync::Arc;

use gregor_protocol::kafka_protocol::messages::{
    ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProducerId,
};
use tracing::warn;

use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use crate::error_codes as ec;
use gregor_network::RequestContext;

/// Answers InitProducerId. An idempotent producer (null transactional id) always gets a fresh
/// producer id with epoch 0, as Kafka's `ProducerIdManager` does: a producer that re-initialises
/// (KIP-360) starts a new sequence space under the new id.
///
/// Authorization as Kafka's: `Write` on the transactional id when there is one, else
/// `IdempotentWrite` on the Cluster (Kafka also accepts `Write` on any topic, which needs a
/// by-resource-type query the `Authorizer` trait does not have yet).
pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &InitProducerIdRequest,
    _version: i16,
) -> InitProducerIdResponse {
    let resp = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1)
        .with_ongoing_txn_producer_id(ProducerId(-1))
        .with_ongoing_txn_producer_epoch(-1);
    if let Some(id) = req.transactional_id.as_deref() {
        if !broker.authorize(ctx, AclOperation::Write, ResourceType::TransactionalId, id) {
            return resp.with_error_code(ec::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
        }
    } else if !broker.authorize(
        ctx,
        AclOperation::IdempotentWrite,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) {
        return resp.with_error_code(ec::CLUSTER_AUTHORIZATION_FAILED);
    }
    if req.transactional_id.is_some() {
        // No transaction coordinator yet: fail fast rather than make the client retry forever.
        crate::observability::log_unsupported_once(
            ApiKey::InitProducerId,
            ec::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            "InitProducerId with a transactional id (transactions)",
            ctx.client_id(),
            &ctx.client_software_name,
            ctx.client_address,
        );
        return resp.with_error_code(ec::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    }
    match broker.next_producer_id().await {
        Ok(id) => resp.with_producer_id(ProducerId(id)).with_producer_epoch(0),
        Err(e) => {
            warn!(error = %e, "cannot allocate producer ids");
            resp.with_error_code(ec::COORDINATOR_NOT_AVAILABLE)
        }
    }
}
