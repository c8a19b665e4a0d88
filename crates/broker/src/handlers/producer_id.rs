//! InitProducerId (key 22): idempotent producers (KIP-98; KIP-360 for epoch bumps) get a
//! fresh producer id here; transactional producers (a non-null transactional id) are answered
//! by the transaction coordinator (`gregor_coordinator::transaction`).

use std::sync::Arc;

use gregor_protocol::kafka_protocol::messages::{
    ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProducerId,
};
use tracing::warn;

use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use crate::error_codes as ec;
use gregor_network::{respond, Handled, RequestContext};

/// Answers InitProducerId: a transactional producer through the transaction coordinator
/// (after the write of its new epoch is committed, so deferred), an idempotent one at once.
pub async fn handle_request(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &InitProducerIdRequest,
    version: i16,
) -> Handled {
    if let Some(id) = req.transactional_id.as_deref() {
        if broker.authorize(ctx, AclOperation::Write, ResourceType::TransactionalId, id) {
            let id = id.to_string();
            // KIP-360 (v3+): a producer recovering from an error sends its id and epoch.
            let expected = (version >= 3 && req.producer_id.0 >= 0)
                .then_some((req.producer_id.0, req.producer_epoch));
            let timeout_ms = req.transaction_timeout_ms;
            let coordinator = broker.transaction_coordinator.clone();
            let header = ctx.header.clone();
            return Handled::Deferred(Box::pin(async move {
                let r = coordinator
                    .init_producer_id(&id, timeout_ms, expected)
                    .await;
                // Clients before v4 do not know PRODUCER_FENCED.
                let code = if version < 4
                    && r.error == gregor_protocol::error::ErrorCode::ProducerFenced
                {
                    gregor_protocol::error::ErrorCode::InvalidProducerEpoch
                } else {
                    r.error
                };
                let resp = InitProducerIdResponse::default()
                    .with_error_code(code.code())
                    .with_producer_id(ProducerId(r.producer_id))
                    .with_producer_epoch(r.producer_epoch)
                    .with_ongoing_txn_producer_id(ProducerId(-1))
                    .with_ongoing_txn_producer_epoch(-1);
                respond(&header, ApiKey::InitProducerId, resp.into())
            }));
        }
    }
    let resp = handle(broker, ctx, req, version).await;
    Handled::Ready(respond(&ctx.header, ApiKey::InitProducerId, resp.into()))
}

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
    ) && !broker.authorize_by_resource_type(ctx, AclOperation::Write, ResourceType::Topic)
    {
        // KIP-679: Write on any topic is enough for an idempotent producer.
        return resp.with_error_code(ec::CLUSTER_AUTHORIZATION_FAILED);
    }
    if req.transactional_id.is_some() {
        // Authorized transactional producers are answered by the transaction coordinator
        // (`handle_request`); this one may not use its id.
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
