//! One module per Kafka API family (the broker's `KafkaApis`). Each handler takes the
//! [`RequestContext`] and the decoded request, authorises through the broker's `Authorizer`,
//! calls a service and returns the response body; [`handle`] dispatches and encodes, and
//! [`KafkaApis`] plugs it into `gregor-network`. Version ranges come from the
//! `kafka-protocol` crate (generated from Kafka 4.1's message schemas), so ApiVersions
//! advertises exactly what Apache Kafka accepts for each API gregor implements.

pub mod acls;
pub mod api_versions;
pub mod client_quotas;
pub mod configs;
pub mod consumer_group;
pub mod delete_records;
pub mod describe_log_dirs;
pub mod describe_topic_partitions;
pub mod elect_leaders;
pub mod features;
pub mod fetch;
pub mod forwarding;
pub mod groups;
pub mod kraft;
pub mod list_offsets;
pub mod metadata;
pub mod produce;
pub mod producer_id;
pub mod reassignments;
pub mod scram;
pub mod topics;
pub mod txn;
pub mod txn_partition;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use gregor_protocol::kafka_protocol::messages::ResponseKind;

use gregor_protocol::kafka_protocol::messages::{ApiKey, RequestKind};
use gregor_protocol::kafka_protocol::protocol::StrBytes;

pub use gregor_network::{respond, Handled, RequestContext};

use crate::broker::Broker;
use crate::observability;

/// The APIs gregor implements.
pub const IMPLEMENTED: &[ApiKey] = &[
    ApiKey::Produce,
    ApiKey::Fetch,
    ApiKey::ListOffsets,
    ApiKey::OffsetForLeaderEpoch,
    ApiKey::Metadata,
    ApiKey::ApiVersions,
    ApiKey::CreateTopics,
    ApiKey::DeleteTopics,
    ApiKey::InitProducerId,
    ApiKey::DescribeConfigs,
    ApiKey::CreatePartitions,
    ApiKey::DescribeCluster,
    ApiKey::DeleteRecords,
    ApiKey::AlterConfigs,
    ApiKey::IncrementalAlterConfigs,
    ApiKey::FindCoordinator,
    ApiKey::JoinGroup,
    ApiKey::SyncGroup,
    ApiKey::Heartbeat,
    ApiKey::LeaveGroup,
    ApiKey::OffsetCommit,
    ApiKey::OffsetFetch,
    ApiKey::DescribeGroups,
    ApiKey::ListGroups,
    ApiKey::DeleteGroups,
    ApiKey::OffsetDelete,
    ApiKey::ConsumerGroupHeartbeat,
    ApiKey::ConsumerGroupDescribe,
    ApiKey::ElectLeaders,
    ApiKey::DescribeLogDirs,
    ApiKey::AlterPartitionReassignments,
    ApiKey::ListPartitionReassignments,
    ApiKey::DescribeTopicPartitions,
    ApiKey::UpdateFeatures,
    // The partition leader's side of transactions (`txn_partition`).
    ApiKey::WriteTxnMarkers,
    ApiKey::DescribeProducers,
    // ACLs (`acls`): answered SECURITY_DISABLED without `authorizer.class.name`, as Kafka.
    ApiKey::DescribeAcls,
    ApiKey::CreateAcls,
    ApiKey::DeleteAcls,
    // Forwarded to the active controller (Kafka's broker listener advertises it: its
    // `listeners` are broker and controller), with Kafka 4.4's range 0-2.
    ApiKey::DescribeQuorum,
    // The transaction coordinator (issue 12).
    ApiKey::AddPartitionsToTxn,
    ApiKey::AddOffsetsToTxn,
    ApiKey::EndTxn,
    ApiKey::TxnOffsetCommit,
    ApiKey::DescribeTransactions,
    ApiKey::ListTransactions,
    // Client quotas (KIP-546): describe from the image, alter forwarded to the controller.
    ApiKey::DescribeClientQuotas,
    ApiKey::AlterClientQuotas,
    // Served by the network's SASL authenticator on SASL listeners (`gregor_network::sasl`);
    // reaching the handler (a PLAINTEXT listener, or a handshake on an authenticated
    // connection that may not re-authenticate) they get ILLEGAL_SASL_STATE, as in Kafka.
    ApiKey::SaslHandshake,
    ApiKey::SaslAuthenticate,
    // KIP-554: Describe from the image, Alter forwarded to the controller (`scram`).
    ApiKey::DescribeUserScramCredentials,
    ApiKey::AlterUserScramCredentials,
];

/// A default request and response of `api_key`, to probe which versions the codec handles.
fn defaults(api_key: ApiKey) -> Option<(RequestKind, ResponseKind)> {
    use gregor_protocol::kafka_protocol::messages::*;
    Some(match api_key {
        ApiKey::Produce => (
            ProduceRequest::default().into(),
            ProduceResponse::default().into(),
        ),
        ApiKey::Fetch => (
            FetchRequest::default().into(),
            FetchResponse::default().into(),
        ),
        ApiKey::ListOffsets => (
            ListOffsetsRequest::default().into(),
            ListOffsetsResponse::default().into(),
        ),
        ApiKey::OffsetForLeaderEpoch => (
            OffsetForLeaderEpochRequest::default().into(),
            OffsetForLeaderEpochResponse::default().into(),
        ),
        ApiKey::Metadata => (
            MetadataRequest::default().into(),
            MetadataResponse::default().into(),
        ),
        ApiKey::ApiVersions => (
            ApiVersionsRequest::default().into(),
            ApiVersionsResponse::default().into(),
        ),
        ApiKey::CreateTopics => (
            CreateTopicsRequest::default().into(),
            CreateTopicsResponse::default().into(),
        ),
        ApiKey::DeleteTopics => (
            DeleteTopicsRequest::default().into(),
            DeleteTopicsResponse::default().into(),
        ),
        ApiKey::InitProducerId => (
            InitProducerIdRequest::default().into(),
            InitProducerIdResponse::default().into(),
        ),
        ApiKey::DescribeConfigs => (
            DescribeConfigsRequest::default().into(),
            DescribeConfigsResponse::default().into(),
        ),
        ApiKey::CreatePartitions => (
            CreatePartitionsRequest::default().into(),
            CreatePartitionsResponse::default().into(),
        ),
        ApiKey::DescribeLogDirs => (
            DescribeLogDirsRequest::default().into(),
            DescribeLogDirsResponse::default().into(),
        ),
        ApiKey::DescribeTopicPartitions => (
            DescribeTopicPartitionsRequest::default().into(),
            DescribeTopicPartitionsResponse::default().into(),
        ),
        ApiKey::ElectLeaders => (
            ElectLeadersRequest::default().into(),
            ElectLeadersResponse::default().into(),
        ),
        ApiKey::UpdateFeatures => (
            UpdateFeaturesRequest::default().into(),
            UpdateFeaturesResponse::default().into(),
        ),
        ApiKey::AlterPartitionReassignments => (
            AlterPartitionReassignmentsRequest::default().into(),
            AlterPartitionReassignmentsResponse::default().into(),
        ),
        ApiKey::ListPartitionReassignments => (
            ListPartitionReassignmentsRequest::default().into(),
            ListPartitionReassignmentsResponse::default().into(),
        ),
        ApiKey::DeleteRecords => (
            DeleteRecordsRequest::default().into(),
            DeleteRecordsResponse::default().into(),
        ),
        ApiKey::AlterConfigs => (
            AlterConfigsRequest::default().into(),
            AlterConfigsResponse::default().into(),
        ),
        ApiKey::IncrementalAlterConfigs => (
            IncrementalAlterConfigsRequest::default().into(),
            IncrementalAlterConfigsResponse::default().into(),
        ),
        ApiKey::DescribeCluster => (
            DescribeClusterRequest::default().into(),
            DescribeClusterResponse::default().into(),
        ),
        ApiKey::FindCoordinator => (
            FindCoordinatorRequest::default().into(),
            FindCoordinatorResponse::default().into(),
        ),
        ApiKey::JoinGroup => (
            JoinGroupRequest::default().into(),
            JoinGroupResponse::default().into(),
        ),
        ApiKey::SyncGroup => (
            SyncGroupRequest::default().into(),
            SyncGroupResponse::default().into(),
        ),
        ApiKey::Heartbeat => (
            HeartbeatRequest::default().into(),
            HeartbeatResponse::default().into(),
        ),
        ApiKey::LeaveGroup => (
            LeaveGroupRequest::default().into(),
            LeaveGroupResponse::default().into(),
        ),
        ApiKey::OffsetCommit => (
            OffsetCommitRequest::default().into(),
            OffsetCommitResponse::default().into(),
        ),
        ApiKey::OffsetFetch => (
            OffsetFetchRequest::default().into(),
            OffsetFetchResponse::default().into(),
        ),
        ApiKey::DescribeGroups => (
            DescribeGroupsRequest::default().into(),
            DescribeGroupsResponse::default().into(),
        ),
        ApiKey::ListGroups => (
            ListGroupsRequest::default().into(),
            ListGroupsResponse::default().into(),
        ),
        ApiKey::DeleteGroups => (
            DeleteGroupsRequest::default().into(),
            DeleteGroupsResponse::default().into(),
        ),
        ApiKey::OffsetDelete => (
            OffsetDeleteRequest::default().into(),
            OffsetDeleteResponse::default().into(),
        ),
        ApiKey::ConsumerGroupHeartbeat => (
            ConsumerGroupHeartbeatRequest::default().into(),
            ConsumerGroupHeartbeatResponse::default().into(),
        ),
        ApiKey::ConsumerGroupDescribe => (
            ConsumerGroupDescribeRequest::default().into(),
            ConsumerGroupDescribeResponse::default().into(),
        ),
        ApiKey::AddPartitionsToTxn => (
            AddPartitionsToTxnRequest::default().into(),
            AddPartitionsToTxnResponse::default().into(),
        ),
        ApiKey::AddOffsetsToTxn => (
            AddOffsetsToTxnRequest::default().into(),
            AddOffsetsToTxnResponse::default().into(),
        ),
        ApiKey::EndTxn => (
            EndTxnRequest::default().into(),
            EndTxnResponse::default().into(),
        ),
        ApiKey::TxnOffsetCommit => (
            TxnOffsetCommitRequest::default().into(),
            TxnOffsetCommitResponse::default().into(),
        ),
        ApiKey::DescribeTransactions => (
            DescribeTransactionsRequest::default().into(),
            DescribeTransactionsResponse::default().into(),
        ),
        ApiKey::ListTransactions => (
            ListTransactionsRequest::default().into(),
            ListTransactionsResponse::default().into(),
        ),
        ApiKey::WriteTxnMarkers => (
            WriteTxnMarkersRequest::default().into(),
            WriteTxnMarkersResponse::default().into(),
        ),
        ApiKey::DescribeProducers => (
            DescribeProducersRequest::default().into(),
            DescribeProducersResponse::default().into(),
        ),
        ApiKey::DescribeClientQuotas => (
            DescribeClientQuotasRequest::default().into(),
            DescribeClientQuotasResponse::default().into(),
        ),
        ApiKey::AlterClientQuotas => (
            AlterClientQuotasRequest::default().into(),
            AlterClientQuotasResponse::default().into(),
        ),
        ApiKey::DescribeUserScramCredentials => (
            DescribeUserScramCredentialsRequest::default().into(),
            DescribeUserScramCredentialsResponse::default().into(),
        ),
        ApiKey::AlterUserScramCredentials => (
            AlterUserScramCredentialsRequest::default().into(),
            AlterUserScramCredentialsResponse::default().into(),
        ),
        ApiKey::SaslHandshake => (
            SaslHandshakeRequest::default().into(),
            SaslHandshakeResponse::default().into(),
        ),
        ApiKey::SaslAuthenticate => (
            SaslAuthenticateRequest::default().into(),
            SaslAuthenticateResponse::default().into(),
        ),
        ApiKey::DescribeAcls => (
            DescribeAclsRequest::default().into(),
            DescribeAclsResponse::default().into(),
        ),
        ApiKey::CreateAcls => (
            CreateAclsRequest::default().into(),
            CreateAclsResponse::default().into(),
        ),
        ApiKey::DeleteAcls => (
            DeleteAclsRequest::default().into(),
            DeleteAclsResponse::default().into(),
        ),
        _ => return None,
    })
}

/// The version range gregor accepts for `api_key`, or None if not implemented: Kafka 4.1's
/// range (`ApiKey::valid_versions`), narrowed to the versions the `kafka-protocol` codec can
/// actually encode and decode (it declares InitProducerId v6 valid but its message codec stops
/// at v5, for example). Advertising a version we cannot decode would make clients fail.
pub fn supported_versions(api_key: ApiKey) -> Option<(i16, i16)> {
    if let Some(v) = kraft::versions(api_key) {
        return Some(v);
    }
    static RANGES: OnceLock<HashMap<i16, (i16, i16)>> = OnceLock::new();
    RANGES
        .get_or_init(|| {
            let mut m = HashMap::new();
            for key in IMPLEMENTED {
                let Some((req, resp)) = defaults(*key) else {
                    continue;
                };
                let r = key.valid_versions();
                let works = |v: i16| {
                    let mut b = BytesMut::new();
                    req.encode(&mut b, v).is_ok() && resp.encode(&mut b, v).is_ok()
                };
                let min = (r.min..=r.max).find(|v| works(*v));
                let max = (r.min..=r.max).rev().find(|v| works(*v));
                if let (Some(min), Some(max)) = (min, max) {
                    m.insert(*key as i16, (min, max));
                }
            }
            m
        })
        .get(&(api_key as i16))
        .copied()
}

/// The broker's [`gregor_network::RequestHandler`]: dispatches to the handlers and records the
/// per-request metrics (`gregor_requests_total`, queue, processing, remote and send times).
pub struct KafkaApis {
    broker: Arc<Broker>,
}

impl KafkaApis {
    /// The request handler of `broker`.
    pub fn new(broker: Arc<Broker>) -> Self {
        Self { broker }
    }
}

impl gregor_network::RequestHandler for KafkaApis {
    fn supported_versions(&self, api_key: ApiKey) -> Option<(i16, i16)> {
        supported_versions(api_key)
    }

    async fn handle(&self, ctx: &RequestContext, body: RequestKind) -> Handled {
        let m = observability::request_metrics(ctx.api_key, ctx.api_version());
        m.requests.increment(1);
        let started = Instant::now();
        m.queue
            .record(started.duration_since(ctx.received_at).as_secs_f64());
        let handled = handle(&self.broker, ctx, body).await;
        m.processing.record(started.elapsed().as_secs_f64());
        match handled {
            Handled::Deferred(fut) => Handled::Deferred(Box::pin(async move {
                let waited = Instant::now();
                let out = fut.await;
                m.remote.record(waited.elapsed().as_secs_f64());
                out
            })),
            Handled::DeferredResponse(fut) => Handled::DeferredResponse(Box::pin(async move {
                let waited = Instant::now();
                let out = fut.await;
                m.remote.record(waited.elapsed().as_secs_f64());
                out
            })),
            other => other,
        }
    }

    /// On the I/O pool (`num.io.threads`), as the log reads: a zero-copy fetch response's
    /// `splice` waits for the disk when the segment is not in the page cache, and then holds
    /// an I/O thread, not an async worker; the pool's threads bound how many such waits run at
    /// once. A job refused because the pool is shut down is dropped (its connection closes).
    fn run_blocking(&self, job: Box<dyn FnOnce() + Send + 'static>) {
        let _ = self.broker.replica_manager.io_pool().submit(job);
    }

    /// While another I/O thread is idle: a transfer that waits for its client then delays no
    /// log append or read.
    fn transfer_may_wait(&self) -> bool {
        self.broker.replica_manager.io_pool().idle_threads() > 0
    }

    fn unsupported_api_versions(&self, correlation_id: i32) -> Option<Bytes> {
        api_versions::unsupported_version_response(correlation_id)
    }

    fn response_sent(&self, ctx: &RequestContext, send_time: Duration) {
        observability::request_metrics(ctx.api_key, ctx.api_version())
            .send
            .record(send_time.as_secs_f64());
    }
}

/// Runs the handler for one request.
pub async fn handle(broker: &Arc<Broker>, ctx: &RequestContext, body: RequestKind) -> Handled {
    let header = &ctx.header;
    let api_key = ctx.api_key;
    let v = header.request_api_version;
    let started = Instant::now();
    // Answers at once, throttled by `request_percentage` (Kafka's `sendResponseMaybeThrottle`:
    // every API but replication, WriteTxnMarkers, AlterPartition and acks=0 Produce, none of
    // which answers here). Handlers that encode their own responses (the group and
    // transaction coordinators', forwarded admin requests) go through `maybe_throttle`.
    let ready = |mut b: ResponseKind| {
        let image = broker.controller.image();
        let throttle = broker.client_quotas.throttle_request(&image, ctx, started);
        if throttle > 0 {
            set_throttle_time_ms(&mut b, i32::try_from(throttle).unwrap_or(i32::MAX));
        }
        Handled::Ready(respond(header, api_key, b))
    };
    match body {
        RequestKind::ApiVersions(r) => {
            let controller = broker
                .config
                .quorum
                .is_controller_listener(&ctx.listener_name);
            let image = broker.controller.image();
            let resp = api_versions::handle_on(&r, v, controller);
            let kraft_version = crate::metadata_publisher::kraft_version(&broker.config);
            ready(api_versions::with_features(resp, Some(&image), kraft_version).into())
        }
        RequestKind::Fetch(r) if kraft::is_metadata_fetch(&r) => {
            kraft::handle(broker, ctx, RequestKind::Fetch(r))
        }
        body @ (RequestKind::Vote(_)
        | RequestKind::BeginQuorumEpoch(_)
        | RequestKind::EndQuorumEpoch(_)
        | RequestKind::FetchSnapshot(_)) => kraft::handle(broker, ctx, body),
        RequestKind::Metadata(r) => ready(metadata::handle(broker, ctx, r, v).await.into()),
        // Kafka's `handleSaslHandshakeRequest`/`handleSaslAuthenticateRequest`: a SASL request
        // that reaches the API layer is out of place.
        RequestKind::SaslHandshake(_) => ready(
            gregor_protocol::kafka_protocol::messages::SaslHandshakeResponse::default()
                .with_error_code(gregor_protocol::error::ErrorCode::IllegalSaslState.code())
                .into(),
        ),
        RequestKind::SaslAuthenticate(_) => ready(
            gregor_protocol::kafka_protocol::messages::SaslAuthenticateResponse::default()
                .with_error_code(gregor_protocol::error::ErrorCode::IllegalSaslState.code())
                .with_error_message(Some(StrBytes::from_static_str(
                    "SaslAuthenticate request received after successful authentication",
                )))
                .into(),
        ),
        RequestKind::DescribeCluster(r) => {
            ready(metadata::describe_cluster(broker, ctx, &r, v).into())
        }
        body @ (RequestKind::CreateTopics(_)
        | RequestKind::DeleteTopics(_)
        | RequestKind::CreatePartitions(_)
        | RequestKind::AlterConfigs(_)
        | RequestKind::IncrementalAlterConfigs(_)
        | RequestKind::ElectLeaders(_)
        | RequestKind::UpdateFeatures(_)
        | RequestKind::AlterPartitionReassignments(_)
        | RequestKind::ListPartitionReassignments(_)
        | RequestKind::DescribeQuorum(_)
        | RequestKind::AlterClientQuotas(_)
        | RequestKind::AlterUserScramCredentials(_)
        | RequestKind::CreateAcls(_)
        | RequestKind::DeleteAcls(_)) => maybe_throttle(
            broker,
            ctx,
            started,
            forwarding::handle(broker, ctx, body).await,
        ),
        RequestKind::DescribeClientQuotas(r) => {
            ready(client_quotas::describe_client_quotas(broker, ctx, &r).into())
        }
        RequestKind::DescribeUserScramCredentials(r) => {
            ready(scram::describe(broker, ctx, &r).into())
        }
        RequestKind::DescribeAcls(r) => ready(acls::describe_acls(broker, ctx, &r).into()),
        RequestKind::DescribeConfigs(r) => {
            ready(configs::describe_configs(broker, ctx, &r, v).into())
        }
        RequestKind::DescribeTopicPartitions(r) => {
            ready(describe_topic_partitions::handle(broker, ctx, &r).into())
        }
        RequestKind::DescribeLogDirs(r) => {
            ready(describe_log_dirs::describe_log_dirs(broker, ctx, &r).into())
        }
        RequestKind::DeleteRecords(r) => {
            ready(delete_records::handle(broker, ctx, &r, v).await.into())
        }
        RequestKind::InitProducerId(r) => maybe_throttle(
            broker,
            ctx,
            started,
            producer_id::handle_request(broker, ctx, &r, v).await,
        ),
        RequestKind::ListOffsets(r) => ready(list_offsets::handle(broker, ctx, r, v).await.into()),
        RequestKind::OffsetForLeaderEpoch(r) => {
            ready(list_offsets::offset_for_leader_epoch(broker, ctx, &r).into())
        }
        RequestKind::Produce(r) => produce::handle(broker, ctx, r).await,
        RequestKind::Fetch(r) => fetch::handle(broker, ctx, r).await,
        RequestKind::FindCoordinator(r) => {
            ready(groups::find_coordinator(broker, ctx, &r, v).await.into())
        }
        RequestKind::JoinGroup(r) => {
            maybe_throttle(broker, ctx, started, groups::join_group(broker, ctx, r))
        }
        RequestKind::SyncGroup(r) => {
            maybe_throttle(broker, ctx, started, groups::sync_group(broker, ctx, r))
        }
        RequestKind::Heartbeat(r) => ready(groups::heartbeat(broker, ctx, &r, v).into()),
        RequestKind::LeaveGroup(r) => ready(groups::leave_group(broker, ctx, &r, v).into()),
        RequestKind::OffsetCommit(r) => {
            maybe_throttle(broker, ctx, started, groups::offset_commit(broker, ctx, &r))
        }
        RequestKind::OffsetFetch(r) => ready(groups::offset_fetch(broker, ctx, &r, v).into()),
        RequestKind::DescribeGroups(r) => ready(groups::describe_groups(broker, ctx, &r, v).into()),
        RequestKind::ListGroups(r) => ready(groups::list_groups(broker, ctx, &r, v).into()),
        RequestKind::DeleteGroups(r) => ready(groups::delete_groups(broker, ctx, &r, v).into()),
        RequestKind::OffsetDelete(r) => ready(groups::offset_delete(broker, ctx, &r, v).into()),
        RequestKind::ConsumerGroupHeartbeat(r) => maybe_throttle(
            broker,
            ctx,
            started,
            consumer_group::heartbeat(broker, ctx, &r),
        ),
        RequestKind::ConsumerGroupDescribe(r) => {
            ready(consumer_group::describe(broker, ctx, &r, v).into())
        }
        RequestKind::AddPartitionsToTxn(r) => maybe_throttle(
            broker,
            ctx,
            started,
            txn::add_partitions_to_txn(broker, ctx, r),
        ),
        RequestKind::AddOffsetsToTxn(r) => maybe_throttle(
            broker,
            ctx,
            started,
            txn::add_offsets_to_txn(broker, ctx, &r),
        ),
        RequestKind::EndTxn(r) => {
            maybe_throttle(broker, ctx, started, txn::end_txn(broker, ctx, &r))
        }
        RequestKind::TxnOffsetCommit(r) => {
            maybe_throttle(broker, ctx, started, txn::txn_offset_commit(broker, ctx, r))
        }
        RequestKind::DescribeTransactions(r) => {
            ready(txn::describe_transactions(broker, ctx, &r).into())
        }
        RequestKind::ListTransactions(r) => ready(txn::list_transactions(broker, ctx, &r).into()),
        RequestKind::WriteTxnMarkers(r) => txn_partition::write_txn_markers(broker, ctx, r).await,
        RequestKind::DescribeProducers(r) => {
            ready(txn_partition::describe_producers(broker, ctx, &r).into())
        }
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

/// Sets `throttle_time_ms` of a response that has one (to the larger of its own and
/// `throttle_ms`); SaslHandshake and SaslAuthenticate have none.
pub fn set_throttle_time_ms(response: &mut ResponseKind, throttle_ms: i32) {
    macro_rules! set {
        ($($kind:ident),* $(,)?) => {
            match response {
                $(ResponseKind::$kind(r) => {
                    r.throttle_time_ms = r.throttle_time_ms.max(throttle_ms);
                })*
                _ => {}
            }
        };
    }
    set!(
        ApiVersions,
        Metadata,
        DescribeCluster,
        DescribeClientQuotas,
        DescribeUserScramCredentials,
        DescribeAcls,
        DescribeConfigs,
        DescribeTopicPartitions,
        DescribeLogDirs,
        DeleteRecords,
        ListOffsets,
        OffsetForLeaderEpoch,
        FindCoordinator,
        Heartbeat,
        LeaveGroup,
        OffsetFetch,
        DescribeGroups,
        ListGroups,
        DeleteGroups,
        OffsetDelete,
        ConsumerGroupDescribe,
        DescribeTransactions,
        ListTransactions,
        DescribeProducers,
        JoinGroup,
        SyncGroup,
        OffsetCommit,
        ConsumerGroupHeartbeat,
        InitProducerId,
        AddPartitionsToTxn,
        AddOffsetsToTxn,
        EndTxn,
        TxnOffsetCommit,
        CreateTopics,
        DeleteTopics,
        CreatePartitions,
        AlterConfigs,
        IncrementalAlterConfigs,
        ElectLeaders,
        UpdateFeatures,
        AlterPartitionReassignments,
        ListPartitionReassignments,
        AlterClientQuotas,
        AlterUserScramCredentials,
        CreateAcls,
        DeleteAcls,
    );
}

/// `request_percentage` (KIP-124) for a handler that answers with an encoded response, now
/// or later (Kafka's `sendMaybeThrottle`, `sendResponseMaybeThrottle` and, for requests
/// forwarded to the controller, `sendForwardedResponse`): when the response is ready, the
/// immediate part's time (from `started` until the handler returned) is recorded against the
/// client's quota; a throttle time above 0 goes into the response's `throttle_time_ms` (the
/// larger of it and the one already there, such as the controller's for a forwarded request)
/// and mutes the connection for it. The time a deferred part waits (a rebalance, the
/// coordinator's log write) is not recorded, as Kafka records request handler thread time.
fn maybe_throttle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    started: Instant,
    handled: Handled,
) -> Handled {
    let immediate = started.elapsed();
    match handled {
        Handled::Ready(Some(encoded)) => {
            Handled::Ready(Some(throttle_encoded(broker, ctx, immediate, encoded)))
        }
        Handled::Deferred(fut) => {
            let (broker, ctx) = (broker.clone(), ctx.clone());
            Handled::Deferred(Box::pin(async move {
                let encoded = fut.await?;
                Some(throttle_encoded(&broker, &ctx, immediate, encoded))
            }))
        }
        other => other,
    }
}

/// Records `immediate` against `request_percentage` and, when that throttles, puts the throttle
/// time into the encoded response (decoded and encoded again; only throttled responses pay it).
fn throttle_encoded(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    immediate: Duration,
    encoded: Bytes,
) -> Bytes {
    let image = broker.controller.image();
    let throttle = broker
        .client_quotas
        .throttle_request_time(&image, ctx, immediate);
    if throttle <= 0 {
        return encoded;
    }
    let throttle = i32::try_from(throttle).unwrap_or(i32::MAX);
    match with_throttle_time_ms(ctx, &encoded, throttle) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(api_key = ?ctx.api_key, error = %e, "could not set throttle_time_ms in a response");
            encoded
        }
    }
}

/// `encoded` (size prefix, response header, body of `ctx`'s API and version) with its
/// `throttle_time_ms` raised to `throttle_ms`.
fn with_throttle_time_ms(
    ctx: &RequestContext,
    encoded: &Bytes,
    throttle_ms: i32,
) -> Result<Bytes, String> {
    use gregor_protocol::kafka_protocol::messages::ResponseHeader;
    use gregor_protocol::kafka_protocol::protocol::Decodable;
    let version = ctx.header.request_api_version;
    let mut rest = encoded.slice(4.min(encoded.len())..);
    let header = ResponseHeader::decode(&mut rest, ctx.api_key.response_header_version(version))
        .map_err(|e| e.to_string())?;
    let mut body =
        ResponseKind::decode(ctx.api_key, &mut rest, version).map_err(|e| e.to_string())?;
    set_throttle_time_ms(&mut body, throttle_ms);
    gregor_protocol::frame::encode_response(ctx.api_key, version, header.correlation_id, &body)
        .map_err(|e| e.to_string())
}

/// A `StrBytes` from a `&str`.
pub fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_implemented_api_is_advertised_within_kafkas_range() {
        for key in IMPLEMENTED {
            let (min, max) = supported_versions(*key).expect("advertised");
            let r = key.valid_versions();
            assert!(r.min <= min && max <= r.max && min <= max, "{key:?}");
        }
        // The kafka-protocol codec stops InitProducerId at v5.
        assert_eq!(supported_versions(ApiKey::InitProducerId), Some((0, 5)));
        assert_eq!(supported_versions(ApiKey::Produce), Some((3, 13)));
    }
}
