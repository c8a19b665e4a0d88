//! The transaction coordinator's APIs (KIP-98; KIP-360, KIP-447, KIP-664, KIP-890):
//! AddPartitionsToTxn (24; v0-3 from clients, v4+ batched from partition leaders, verify-only
//! or adding the partition with `transaction.version` 2), AddOffsetsToTxn (25), EndTxn (26),
//! TxnOffsetCommit (28, to the group coordinator), DescribeTransactions (65) and
//! ListTransactions (66). InitProducerId and FindCoordinator for transactional ids are in
//! `producer_id` and `groups`. <https://kafka.apache.org/protocol#The_Messages_AddPartitionsToTxn>
//!
//! Authorization as Kafka's `KafkaApis`: Write on the transactional id (clients),
//! ClusterAction on the cluster (AddPartitionsToTxn v4+, brokers), Write on topics added by a
//! client, Read on the group and its topics for offsets, Describe on transactional ids for
//! the KIP-664 admin APIs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gregor_coordinator::transaction::{ListFilters, TxnPartition};
use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use gregor_protocol::kafka_protocol::messages::describe_transactions_response::{
    TopicData, TransactionState as DescribedState,
};
use gregor_protocol::kafka_protocol::messages::list_transactions_response::TransactionState as ListedState;
use gregor_protocol::kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use gregor_protocol::kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, ApiKey, DescribeTransactionsRequest, DescribeTransactionsResponse,
    EndTxnRequest, EndTxnResponse, ListTransactionsRequest, ListTransactionsResponse, ProducerId,
    RequestHeader, ResponseKind, TopicName, TransactionalId, TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
};
use tracing::debug;

use super::sb;
use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use crate::group_coordinator::offsets::OffsetToCommit;
use crate::group_coordinator::txn_offsets::TxnCommitRequest;
use crate::group_coordinator::Wait;
use gregor_network::{respond, Handled, RequestContext};

/// A response computed by a future (a coordinator write that waits for the high watermark).
fn deferred(
    header: &RequestHeader,
    api_key: ApiKey,
    fut: impl std::future::Future<Output = ResponseKind> + Send + 'static,
) -> Handled {
    let header = header.clone();
    Handled::Deferred(Box::pin(
        async move { respond(&header, api_key, fut.await) },
    ))
}

/// Clients before these versions do not know PRODUCER_FENCED (90): they get
/// INVALID_PRODUCER_EPOCH, as Kafka answers them.
fn fenced_for_old_clients(code: ErrorCode, version: i16) -> ErrorCode {
    if version < 2 && code == ErrorCode::ProducerFenced {
        ErrorCode::InvalidProducerEpoch
    } else {
        code
    }
}

fn topic_results(
    errors: BTreeMap<String, Vec<(i32, ErrorCode)>>,
) -> Vec<AddPartitionsToTxnTopicResult> {
    errors
        .into_iter()
        .map(|(t, ps)| {
            AddPartitionsToTxnTopicResult::default()
                .with_name(TopicName(sb(&t)))
                .with_results_by_partition(
                    ps.into_iter()
                        .map(|(p, c)| {
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(p)
                                .with_partition_error_code(c.code())
                        })
                        .collect(),
                )
        })
        .collect()
}

fn group_by_topic(
    items: impl IntoIterator<Item = (TxnPartition, ErrorCode)>,
) -> BTreeMap<String, Vec<(i32, ErrorCode)>> {
    let mut m: BTreeMap<String, Vec<(i32, ErrorCode)>> = BTreeMap::new();
    for ((t, p), c) in items {
        m.entry(t).or_default().push((p, c));
    }
    m
}

/// One transaction of an AddPartitionsToTxn: (id, producer id, epoch, verify only, partitions).
type TxnToAdd = (String, i64, i16, bool, Vec<TxnPartition>);

/// AddPartitionsToTxn (Kafka's `handleAddPartitionsToTxnRequest`).
pub fn add_partitions_to_txn(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: AddPartitionsToTxnRequest,
) -> Handled {
    let version = ctx.header.request_api_version;
    let txns: Vec<TxnToAdd> = if version < 4 {
        vec![(
            req.v3_and_below_transactional_id.to_string(),
            req.v3_and_below_producer_id.0,
            req.v3_and_below_producer_epoch,
            false,
            req.v3_and_below_topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(move |p| (t.name.to_string(), *p)))
                .collect(),
        )]
    } else {
        req.transactions
            .iter()
            .map(|t| {
                (
                    t.transactional_id.to_string(),
                    t.producer_id.0,
                    t.producer_epoch,
                    t.verify_only,
                    t.topics
                        .iter()
                        .flat_map(|tp| tp.partitions.iter().map(move |p| (tp.name.to_string(), *p)))
                        .collect(),
                )
            })
            .collect()
    };
    // Versions 4+ come from brokers only.
    if version >= 4
        && !broker.authorize(
            ctx,
            AclOperation::ClusterAction,
            ResourceType::Cluster,
            CLUSTER_NAME,
        )
    {
        return Handled::Ready(respond(
            &ctx.header,
            ApiKey::AddPartitionsToTxn,
            AddPartitionsToTxnResponse::default()
                .with_error_code(ErrorCode::ClusterAuthorizationFailed.code())
                .into(),
        ));
    }
    let image = broker.controller.image();
    // Per transaction: either the checks' answer now, or the coordinator's call.
    let mut immediate: Vec<(String, Vec<(TxnPartition, ErrorCode)>)> = Vec::new();
    let mut calls = Vec::new();
    for (id, pid, epoch, verify_only, partitions) in txns {
        if version < 4
            && !broker.authorize(ctx, AclOperation::Write, ResourceType::TransactionalId, &id)
        {
            let all = partitions
                .into_iter()
                .map(|tp| (tp, ErrorCode::TransactionalIdAuthorizationFailed))
                .collect();
            immediate.push((id, all));
            continue;
        }
        let mut failed = false;
        let checked: Vec<(TxnPartition, ErrorCode)> = partitions
            .iter()
            .map(|(t, p)| {
                let internal = t.starts_with("__");
                let code = if version < 4
                    && !internal
                    && !broker.authorize(ctx, AclOperation::Write, ResourceType::Topic, t)
                {
                    ErrorCode::TopicAuthorizationFailed
                } else if image.topic(t).and_then(|x| x.partitions.get(p)).is_none() {
                    ErrorCode::UnknownTopicOrPartition
                } else {
                    ErrorCode::None
                };
                failed |= code != ErrorCode::None;
                ((t.clone(), *p), code)
            })
            .collect();
        if failed {
            let all = checked
                .into_iter()
                .map(|(tp, c)| {
                    let c = if c == ErrorCode::None {
                        ErrorCode::OperationNotAttempted
                    } else {
                        c
                    };
                    (tp, c)
                })
                .collect();
            immediate.push((id, all));
            continue;
        }
        calls.push((id, pid, epoch, verify_only, partitions));
    }
    let coordinator = broker.transaction_coordinator.clone();
    deferred(&ctx.header, ApiKey::AddPartitionsToTxn, async move {
        let mut results = immediate;
        for (id, pid, epoch, verify_only, partitions) in calls {
            let r: Vec<(TxnPartition, ErrorCode)> = if verify_only {
                coordinator.verify_partitions(&id, pid, epoch, &partitions)
            } else {
                let set: BTreeSet<TxnPartition> = partitions.iter().cloned().collect();
                // A partition leader adding a partition is KIP-890 part 2 (transaction.version 2).
                let tv = if version >= 4 { 2 } else { 0 };
                let code = coordinator.add_partitions(&id, pid, epoch, &set, tv).await;
                let code = fenced_for_old_clients(code, version);
                partitions.into_iter().map(|tp| (tp, code)).collect()
            };
            results.push((id, r));
        }
        if version < 4 {
            let (_, r) = results.pop().unwrap_or_default();
            AddPartitionsToTxnResponse::default()
                .with_results_by_topic_v3_and_below(topic_results(group_by_topic(r)))
                .into()
        } else {
            AddPartitionsToTxnResponse::default()
                .with_results_by_transaction(
                    results
                        .into_iter()
                        .map(|(id, r)| {
                            AddPartitionsToTxnResult::default()
                                .with_transactional_id(TransactionalId(sb(&id)))
                                .with_topic_results(topic_results(group_by_topic(r)))
                        })
                        .collect(),
                )
                .into()
        }
    })
}

/// AddOffsetsToTxn: adds the group's `__consumer_offsets` partition to the transaction.
pub fn add_offsets_to_txn(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &AddOffsetsToTxnRequest,
) -> Handled {
    let version = ctx.header.request_api_version;
    let id = req.transactional_id.to_string();
    let group = req.group_id.to_string();
    let error = |c: ErrorCode| {
        Handled::Ready(respond(
            &ctx.header,
            ApiKey::AddOffsetsToTxn,
            AddOffsetsToTxnResponse::default()
                .with_error_code(c.code())
                .into(),
        ))
    };
    if !broker.authorize(ctx, AclOperation::Write, ResourceType::TransactionalId, &id) {
        return error(ErrorCode::TransactionalIdAuthorizationFailed);
    }
    if !broker.authorize(ctx, AclOperation::Read, ResourceType::Group, &group) {
        return error(ErrorCode::GroupAuthorizationFailed);
    }
    let partition = broker.group_coordinator.partition_for(&group);
    let (pid, epoch) = (req.producer_id.0, req.producer_epoch);
    let coordinator = broker.transaction_coordinator.clone();
    deferred(&ctx.header, ApiKey::AddOffsetsToTxn, async move {
        let set: BTreeSet<TxnPartition> = [(
            gregor_coordinator::group::GROUP_METADATA_TOPIC_NAME.to_string(),
            partition,
        )]
        .into();
        let code = coordinator.add_partitions(&id, pid, epoch, &set, 0).await;
        AddOffsetsToTxnResponse::default()
            .with_error_code(fenced_for_old_clients(code, version).code())
            .into()
    })
}

/// EndTxn: commit or abort; v5+ is KIP-890 part 2 (the answer carries the producer id and
/// epoch for the next transaction).
pub fn end_txn(broker: &Arc<Broker>, ctx: &RequestContext, req: &EndTxnRequest) -> Handled {
    let version = ctx.header.request_api_version;
    let id = req.transactional_id.to_string();
    if !broker.authorize(ctx, AclOperation::Write, ResourceType::TransactionalId, &id) {
        return Handled::Ready(respond(
            &ctx.header,
            ApiKey::EndTxn,
            EndTxnResponse::default()
                .with_error_code(ErrorCode::TransactionalIdAuthorizationFailed.code())
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
                .into(),
        ));
    }
    let (pid, epoch, commit) = (req.producer_id.0, req.producer_epoch, req.committed);
    let tv = if version >= 5 { 2 } else { 0 };
    let coordinator = broker.transaction_coordinator.clone();
    deferred(&ctx.header, ApiKey::EndTxn, async move {
        let r = coordinator
            .end_transaction(&id, pid, epoch, commit, tv)
            .await;
        EndTxnResponse::default()
            .with_error_code(fenced_for_old_clients(r.error, version).code())
            .with_producer_id(ProducerId(r.producer_id))
            .with_producer_epoch(r.producer_epoch)
            .into()
    })
}

/// Makes sure `partition` of `__consumer_offsets` is in the producer's transaction before its
/// offsets are written (KIP-890): TxnOffsetCommit v5+ adds it (`transaction.version` 2, the
/// client sends no AddOffsetsToTxn), older versions verify that AddOffsetsToTxn added it. The
/// transaction coordinator is asked directly when it is this broker, else with
/// AddPartitionsToTxn v5 on the inter-broker listener. Errors as TxnOffsetCommit answers them.
async fn ensure_offsets_partition_in_transaction(
    broker: &Arc<Broker>,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    partition: i32,
    add: bool,
    version: i16,
) -> ErrorCode {
    let tp: TxnPartition = (
        gregor_coordinator::group::GROUP_METADATA_TOPIC_NAME.to_string(),
        partition,
    );
    let c = &broker.transaction_coordinator;
    let code = if add {
        let set: BTreeSet<TxnPartition> = [tp].into();
        c.add_partitions(transactional_id, producer_id, producer_epoch, &set, 2)
            .await
    } else {
        c.verify_partitions(transactional_id, producer_id, producer_epoch, &[tp])
            .first()
            .map_or(ErrorCode::UnknownServerError, |(_, code)| *code)
    };
    let code = if code == ErrorCode::NotCoordinator {
        remote_add_partitions(
            broker,
            transactional_id,
            producer_id,
            producer_epoch,
            partition,
            !add,
        )
        .await
    } else {
        code
    };
    match code {
        ErrorCode::None => ErrorCode::None,
        // The client looks for the group coordinator again and retries.
        ErrorCode::NotCoordinator
        | ErrorCode::CoordinatorNotAvailable
        | ErrorCode::CoordinatorLoadInProgress
        | ErrorCode::ConcurrentTransactions
        | ErrorCode::RequestTimedOut => ErrorCode::CoordinatorNotAvailable,
        ErrorCode::ProducerFenced | ErrorCode::InvalidProducerEpoch => {
            ErrorCode::InvalidProducerEpoch
        }
        ErrorCode::TransactionAbortable if version < 4 => ErrorCode::InvalidTxnState,
        other => other,
    }
}

/// AddPartitionsToTxn v5 to the transaction coordinator of `transactional_id` on another
/// broker (Kafka's `AddPartitionsToTxnManager`), for one `__consumer_offsets` partition.
async fn remote_add_partitions(
    broker: &Arc<Broker>,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    partition: i32,
    verify_only: bool,
) -> ErrorCode {
    use gregor_protocol::kafka_protocol::messages::add_partitions_to_txn_request::{
        AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
    };
    use gregor_protocol::kafka_protocol::messages::RequestKind;
    let image = broker.controller.image();
    let txn_partition = broker
        .transaction_coordinator
        .partition_for(transactional_id);
    let leader = image
        .topic(gregor_coordinator::transaction::TRANSACTION_STATE_TOPIC_NAME)
        .and_then(|t| t.partitions.get(&txn_partition))
        .map_or(-1, |p| p.leader);
    if leader == broker.config.node_id {
        return ErrorCode::NotCoordinator;
    }
    let listener = broker.config.inter_broker_listener_name();
    let Some(address) = image
        .brokers
        .get(&leader)
        .filter(|b| !b.fenced)
        .and_then(|b| match &listener {
            Some(name) => b.endpoint(name),
            None => b.endpoints.first(),
        })
        .map(|e| format!("{}:{}", e.host, e.port))
    else {
        return ErrorCode::CoordinatorNotAvailable;
    };
    let timeout = std::time::Duration::from_millis(
        u64::try_from(broker.config.transactions.request_timeout_ms).unwrap_or(30_000),
    );
    let body = AddPartitionsToTxnRequest::default().with_transactions(vec![
        AddPartitionsToTxnTransaction::default()
            .with_transactional_id(TransactionalId(sb(transactional_id)))
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(producer_epoch)
            .with_verify_only(verify_only)
            .with_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(sb(
                    gregor_coordinator::group::GROUP_METADATA_TOPIC_NAME,
                )))
                .with_partitions(vec![partition])]),
    ]);
    let sent = async {
        let mut conn = crate::replica_fetcher::connection::BrokerConnection::connect(
            &broker.inter_broker_security(),
            &address,
            format!("broker-{}-txn-verification", broker.config.node_id),
            timeout,
            1024 * 1024,
        )
        .await?;
        conn.request(
            ApiKey::AddPartitionsToTxn,
            5,
            RequestKind::AddPartitionsToTxn(body),
        )
        .await
    }
    .await;
    match sent {
        Ok(ResponseKind::AddPartitionsToTxn(r)) => {
            if r.error_code != 0 {
                return ErrorCode::for_code(r.error_code);
            }
            r.results_by_transaction
                .iter()
                .flat_map(|t| t.topic_results.iter())
                .flat_map(|t| t.results_by_partition.iter())
                .map(|p| ErrorCode::for_code(p.partition_error_code))
                .next()
                .unwrap_or(ErrorCode::UnknownServerError)
        }
        Ok(_) => ErrorCode::UnknownServerError,
        Err(e) => {
            debug!(error = %e, "AddPartitionsToTxn to the transaction coordinator failed");
            ErrorCode::CoordinatorNotAvailable
        }
    }
}

/// TxnOffsetCommit (Kafka's `handleTxnOffsetCommitRequest`): the offsets are written in the
/// producer's transaction to the group's `__consumer_offsets` partition and become visible
/// with its COMMIT marker.
pub fn txn_offset_commit(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: TxnOffsetCommitRequest,
) -> Handled {
    let version = ctx.header.request_api_version;
    let id = req.transactional_id.to_string();
    let group = req.group_id.to_string();
    let all = |code: ErrorCode| -> Vec<(String, Vec<(i32, ErrorCode)>)> {
        req.topics
            .iter()
            .map(|t| {
                (
                    t.name.to_string(),
                    t.partitions
                        .iter()
                        .map(|p| (p.partition_index, code))
                        .collect(),
                )
            })
            .collect()
    };
    let response = move |topics: Vec<(String, Vec<(i32, ErrorCode)>)>| -> ResponseKind {
        TxnOffsetCommitResponse::default()
            .with_topics(
                topics
                    .into_iter()
                    .map(|(t, ps)| {
                        TxnOffsetCommitResponseTopic::default()
                            .with_name(TopicName(sb(&t)))
                            .with_partitions(
                                ps.into_iter()
                                    .map(|(p, c)| {
                                        let c = if version < 2
                                            && c == ErrorCode::CoordinatorLoadInProgress
                                        {
                                            ErrorCode::CoordinatorNotAvailable
                                        } else {
                                            c
                                        };
                                        TxnOffsetCommitResponsePartition::default()
                                            .with_partition_index(p)
                                            .with_error_code(c.code())
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            )
            .into()
    };
    if !broker.authorize(ctx, AclOperation::Write, ResourceType::TransactionalId, &id) {
        let r = response(all(ErrorCode::TransactionalIdAuthorizationFailed));
        return Handled::Ready(respond(&ctx.header, ApiKey::TxnOffsetCommit, r));
    }
    if !broker.authorize(ctx, AclOperation::Read, ResourceType::Group, &group) {
        let r = response(all(ErrorCode::GroupAuthorizationFailed));
        return Handled::Ready(respond(&ctx.header, ApiKey::TxnOffsetCommit, r));
    }
    let image = broker.controller.image();
    let mut answered: Vec<(String, Vec<(i32, ErrorCode)>)> = Vec::new();
    let mut offsets: Vec<OffsetToCommit> = Vec::new();
    for t in &req.topics {
        let name = t.name.to_string();
        let code = if !broker.authorize(ctx, AclOperation::Read, ResourceType::Topic, &name) {
            Some(ErrorCode::TopicAuthorizationFailed)
        } else if image.topic(&name).is_none() {
            Some(ErrorCode::UnknownTopicOrPartition)
        } else {
            None
        };
        if let Some(code) = code {
            answered.push((
                name,
                t.partitions
                    .iter()
                    .map(|p| (p.partition_index, code))
                    .collect(),
            ));
            continue;
        }
        for p in &t.partitions {
            if image
                .topic(&name)
                .and_then(|x| x.partitions.get(&p.partition_index))
                .is_none()
            {
                answered.push((
                    name.clone(),
                    vec![(p.partition_index, ErrorCode::UnknownTopicOrPartition)],
                ));
                continue;
            }
            offsets.push(OffsetToCommit {
                topic: name.clone(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: if version >= 2 {
                    p.committed_leader_epoch
                } else {
                    -1
                },
                metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
            });
        }
    }
    let commit = TxnCommitRequest {
        group_id: group.clone(),
        producer_id: req.producer_id.0,
        producer_epoch: req.producer_epoch,
        generation_id: if version >= 3 { req.generation_id } else { -1 },
        member_id: if version >= 3 {
            req.member_id.to_string()
        } else {
            String::new()
        },
        group_instance_id: if version >= 3 {
            req.group_instance_id.as_ref().map(|i| i.to_string())
        } else {
            None
        },
        offsets,
    };
    let broker = broker.clone();
    deferred(&ctx.header, ApiKey::TxnOffsetCommit, async move {
        let mut topics = answered;
        if commit.offsets.is_empty() {
            return response(merge(topics));
        }
        let keys: Vec<(String, i32)> = commit
            .offsets
            .iter()
            .map(|o| (o.topic.clone(), o.partition))
            .collect();
        let partition = broker.group_coordinator.partition_for(&group);
        let check = ensure_offsets_partition_in_transaction(
            &broker,
            &id,
            commit.producer_id,
            commit.producer_epoch,
            partition,
            version >= 5,
            version,
        )
        .await;
        let codes: Vec<ErrorCode> = if check != ErrorCode::None {
            vec![check; keys.len()]
        } else {
            let wait = broker
                .group_coordinator
                .commit_transactional_offsets(commit);
            let raw = match wait {
                Wait::Ready(r) => r,
                Wait::Pending(rx) => rx.await.unwrap_or_else(|_| {
                    vec![ErrorCode::CoordinatorNotAvailable.code(); keys.len()]
                }),
            };
            raw.into_iter().map(ErrorCode::for_code).collect()
        };
        for ((t, p), c) in keys.into_iter().zip(codes) {
            topics.push((t, vec![(p, c)]));
        }
        response(merge(topics))
    })
}

/// Merges per-topic answers given in pieces, keeping the order topics first appear in.
fn merge(items: Vec<(String, Vec<(i32, ErrorCode)>)>) -> Vec<(String, Vec<(i32, ErrorCode)>)> {
    let mut out: Vec<(String, Vec<(i32, ErrorCode)>)> = Vec::new();
    for (t, ps) in items {
        match out.iter_mut().find(|(name, _)| *name == t) {
            Some((_, existing)) => existing.extend(ps),
            None => out.push((t, ps)),
        }
    }
    out
}

/// DescribeTransactions (KIP-664): Describe on each transactional id; the partitions of
/// topics the principal may not describe are left out, as Kafka does.
pub fn describe_transactions(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let states = req
        .transactional_ids
        .iter()
        .map(|id| {
            let id = id.to_string();
            let base = DescribedState::default().with_transactional_id(TransactionalId(sb(&id)));
            if !broker.authorize(
                ctx,
                AclOperation::Describe,
                ResourceType::TransactionalId,
                &id,
            ) {
                return base
                    .with_error_code(ErrorCode::TransactionalIdAuthorizationFailed.code())
                    .with_transaction_state(sb(""))
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1)
                    .with_transaction_start_time_ms(-1);
            }
            let d = broker.transaction_coordinator.describe(&id);
            base.with_error_code(d.error.code())
                .with_transaction_state(sb(&d.state))
                .with_transaction_timeout_ms(d.timeout_ms)
                .with_transaction_start_time_ms(d.start_time_ms)
                .with_producer_id(ProducerId(d.producer_id))
                .with_producer_epoch(d.producer_epoch)
                .with_topics(
                    d.topics
                        .into_iter()
                        .filter(|(t, _)| {
                            broker.authorize(ctx, AclOperation::Describe, ResourceType::Topic, t)
                        })
                        .map(|(t, ps)| {
                            TopicData::default()
                                .with_topic(TopicName(sb(&t)))
                                .with_partitions(ps)
                        })
                        .collect(),
                )
        })
        .collect();
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

/// ListTransactions (KIP-664; v1 duration filter, v2 transactional id pattern): the
/// transactions of the `__transaction_state` partitions this broker coordinates, those the
/// principal may describe.
pub fn list_transactions(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    req: &ListTransactionsRequest,
) -> ListTransactionsResponse {
    let version = ctx.header.request_api_version;
    let filters = ListFilters {
        states: req.state_filters.iter().map(|s| s.to_string()).collect(),
        producer_ids: req.producer_id_filters.iter().map(|p| p.0).collect(),
        duration_ms: if version >= 1 {
            req.duration_filter
        } else {
            -1
        },
        transactional_id_pattern: if version >= 2 {
            req.transactional_id_pattern.as_ref().map(|p| p.to_string())
        } else {
            None
        },
    };
    match broker.transaction_coordinator.list(&filters) {
        Err(code) => ListTransactionsResponse::default().with_error_code(code.code()),
        Ok((listed, unknown)) => ListTransactionsResponse::default()
            .with_unknown_state_filters(unknown.iter().map(|s| sb(s)).collect())
            .with_transaction_states(
                listed
                    .into_iter()
                    .filter(|t| {
                        broker.authorize(
                            ctx,
                            AclOperation::Describe,
                            ResourceType::TransactionalId,
                            &t.transactional_id,
                        )
                    })
                    .map(|t| {
                        ListedState::default()
                            .with_transactional_id(TransactionalId(sb(&t.transactional_id)))
                            .with_producer_id(ProducerId(t.producer_id))
                            .with_transaction_state(sb(&t.state))
                    })
                    .collect(),
            ),
    }
}
