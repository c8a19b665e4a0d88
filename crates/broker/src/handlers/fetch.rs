//! Fetch (key 1), <https://kafka.apache.org/protocol#The_Messages_Fetch>. Reads are bounded by
//! the high watermark (or the last stable offset for read_committed). A fetch with less than
//! `min_bytes` available waits up to `max_wait_ms`, woken when a high watermark of one of its
//! partitions moves (no polling). `max_bytes` and `partition_max_bytes` are soft for the first
//! batch returned (KIP-74). Empty partitions carry zero-length records, never null. Topic ids
//! from v13 (KIP-516).
//!
//! Incremental fetch sessions (KIP-227, [`crate::fetch_session`]): the request's session id
//! and epoch pick a context first. A session error (unknown id, wrong epoch, topic ids used
//! inconsistently) is answered at once with the top-level error, session id 0 and no
//! partitions. A sessionless fetch (epoch -1, or v0-v6) reads the request's partitions and
//! answers session id 0; a full fetch (epoch 0) reads them and then may get a new session,
//! whose id the response carries; an incremental fetch reads every partition of its session
//! (the request only adds, changes or forgets some) and its response leaves out those with
//! nothing new. Consumers and followers alike; a follower's session is privileged.
//!
//! Fetch from follower (KIP-392): a consumer's fetch from v11 on carries its rack
//! (`client.rack`); with `replica.selector.class` set, the leader may answer a partition with
//! `PreferredReadReplica` and no records, and a follower serves such fetches up to its own high
//! watermark. Older consumer fetches are served by the leader only.
//!
//! Followers (replica id >= 0: `ReplicaState.ReplicaId` from v15, the top-level `ReplicaId`
//! before) need ClusterAction, read up to the log end offset, send their broker epoch (v15,
//! KIP-903), log start offset and `LastFetchedEpoch` (v12); a diverging log is answered with
//! `DivergingEpoch` (Kafka's `Partition.fetchRecords`).

use std::sync::Arc;

use bytes::Bytes;
use gregor_log::TopicPartition;
use gregor_protocol::kafka_protocol::messages::fetch_response::{
    AbortedTransaction, EpochEndOffset, FetchableTopicResponse, PartitionData,
};
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, ProducerId, RequestHeader, ResponseKind,
    TopicName,
};
use gregor_protocol::kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use crate::fetch_session::{
    FetchContext, FetchRequestView, PartitionKey, PartitionOutcome, PartitionParams,
    SessionPartition, TopicKey, INVALID_SESSION_ID, PARTITION_SLACK,
};

use crate::authorizer::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::broker::Broker;
use crate::error_codes as ec;
use crate::observability::record_error;
use crate::replica_manager::{
    FetchOutcome, FetchParams, FetchPartition, FetchPartitionResult, RecordsMode,
};
use crate::replication::replica_selector::ClientMetadata;
use gregor_log::{FetchRecords, FileSlice};
use gregor_network::{respond, Handled, RequestContext};
use gregor_network::{FileRegion, RegionFile, Response, ResponsePart};
use gregor_protocol::fetch_frame::{encode_fetch_response, FramePart};

fn empty_partition(index: i32, code: i16) -> PartitionData {
    PartitionData::default()
        .with_partition_index(index)
        .with_error_code(code)
        .with_high_watermark(-1)
        .with_last_stable_offset(-1)
        .with_log_start_offset(-1)
        .with_preferred_read_replica(BrokerId(-1))
        .with_records(Some(Bytes::new()))
}

/// How the response of a fetch relates to fetch sessions, decided before the read.
enum Mode {
    /// Session id 0, every partition.
    Sessionless,
    /// Every partition; then a new session is tried.
    Full {
        privileged: bool,
        uses_topic_ids: bool,
    },
    /// The partitions with something new, as the session decides.
    Incremental { session_id: i32, request_epoch: i32 },
}

/// Errors Kafka's `KafkaApis.handleFetch` and `ReplicaManager` find before reading the log.
fn refused_before_read(code: i16) -> bool {
    matches!(
        code,
        ec::UNKNOWN_TOPIC_OR_PARTITION
            | ec::UNKNOWN_TOPIC_ID
            | ec::NOT_LEADER_OR_FOLLOWER
            | ec::FENCED_LEADER_EPOCH
            | ec::UNKNOWN_LEADER_EPOCH
            | ec::TOPIC_AUTHORIZATION_FAILED
    )
}

/// A partition's answer; its records go in the frame (`records` in memory) or apart from it
/// (a file range, returned with its length, which the encoder writes in its place).
fn partition_data(
    index: i32,
    r: FetchPartitionResult,
    isolation_level: i8,
) -> (PartitionData, Option<FileSlice>) {
    if r.error_code != ec::NONE {
        record_error(ApiKey::Fetch, r.error_code);
    }
    let diverging = r.diverging_epoch.map_or_else(
        || EpochEndOffset::default().with_epoch(-1).with_end_offset(-1),
        |(epoch, end_offset)| {
            EpochEndOffset::default()
                .with_epoch(epoch)
                .with_end_offset(end_offset)
        },
    );
    let data = PartitionData::default()
        .with_diverging_epoch(diverging)
        .with_partition_index(index)
        .with_error_code(r.error_code)
        .with_high_watermark(r.high_watermark)
        .with_last_stable_offset(r.last_stable_offset)
        .with_log_start_offset(r.log_start_offset)
        .with_preferred_read_replica(BrokerId(r.preferred_read_replica.unwrap_or(-1)))
        .with_aborted_transactions(
            // As Kafka: partitions refused before the read (unknown, not led here, fenced)
            // carry the default empty list; read results carry a list for read_committed (the
            // aborted transactions of the range returned) and null for read_uncommitted.
            (isolation_level == 1 || refused_before_read(r.error_code)).then(|| {
                r.aborted_transactions
                    .iter()
                    .map(|a| {
                        AbortedTransaction::default()
                            .with_producer_id(ProducerId(a.producer_id))
                            .with_first_offset(a.first_offset)
                    })
                    .collect()
            }),
        );
    match r.records {
        FetchRecords::Memory(b) => (data.with_records(Some(b)), None),
        FetchRecords::File(f) => (data.with_records(Some(Bytes::new())), Some(f)),
    }
}

/// What the session rules look at in one partition's answer (its records in the frame, or in
/// `file`).
fn outcome(p: &PartitionData, file: Option<&FileSlice>) -> PartitionOutcome {
    PartitionOutcome {
        error_code: p.error_code,
        high_watermark: p.high_watermark,
        last_stable_offset: p.last_stable_offset,
        log_start_offset: p.log_start_offset,
        records_bytes: file
            .map_or_else(|| p.records.as_ref().map_or(0, Bytes::len), FileSlice::len),
        diverging_epoch: p.diverging_epoch.epoch >= 0,
        preferred_read_replica: p.preferred_read_replica.0 >= 0,
    }
}

/// The response: the partitions' answers (slots hold an error found before the read or the
/// index of the partition's replica manager result), filtered and numbered by the session.
/// Consecutive partitions of one topic share a topic entry, as Kafka's `FetchResponse.of`.
/// Also, per partition in the response's order, the file range its records are sent from
/// (`None`: in the frame).
fn respond_to(
    broker: &Broker,
    mode: Mode,
    partitions: &[SessionPartition],
    slots: &[Result<usize, i16>],
    results: Vec<FetchPartitionResult>,
    isolation_level: i8,
    version: i16,
) -> (FetchResponse, Vec<Option<FileSlice>>) {
    let mut results: Vec<Option<FetchPartitionResult>> = results.into_iter().map(Some).collect();
    let data: Vec<(PartitionData, Option<FileSlice>)> = partitions
        .iter()
        .zip(slots)
        .map(|(p, slot)| {
            let code = match slot {
                Ok(i) => match results.get_mut(*i).and_then(Option::take) {
                    Some(r) => return partition_data(p.key.partition, r, isolation_level),
                    None => ec::UNKNOWN_SERVER_ERROR,
                },
                Err(code) => *code,
            };
            record_error(ApiKey::Fetch, code);
            (empty_partition(p.key.partition, code), None)
        })
        .collect();
    let cache = &broker.fetch_sessions;
    let (session_id, include) = match mode {
        Mode::Sessionless => (INVALID_SESSION_ID, None),
        Mode::Full {
            privileged,
            uses_topic_ids,
        } => {
            let answered: Vec<(SessionPartition, PartitionOutcome)> = partitions
                .iter()
                .cloned()
                .zip(data.iter().map(|(d, f)| outcome(d, f.as_ref())))
                .collect();
            let id = cache.create_session(
                privileged,
                uses_topic_ids,
                &answered,
                &|| session_partition_limit(broker),
                cache.now_ms(),
            );
            (id, None)
        }
        Mode::Incremental {
            session_id,
            request_epoch,
        } => {
            let outcomes: Vec<PartitionOutcome> =
                data.iter().map(|(d, f)| outcome(d, f.as_ref())).collect();
            match cache.complete_incremental(session_id, request_epoch, partitions, &outcomes) {
                Ok(include) => (session_id, Some(include)),
                Err(code) => {
                    record_error(ApiKey::Fetch, code);
                    let body = FetchResponse::default()
                        .with_error_code(code)
                        .with_session_id(session_id);
                    return (body, Vec::new());
                }
            }
        }
    };
    let mut topics: Vec<FetchableTopicResponse> = Vec::new();
    let mut files = Vec::new();
    let mut last: Option<&TopicKey> = None;
    for (i, (p, (d, file))) in partitions.iter().zip(data).enumerate() {
        if include.as_ref().is_some_and(|inc| !inc[i]) {
            continue;
        }
        files.push(file);
        match topics.last_mut() {
            Some(t) if last == Some(&p.key.topic) => t.partitions.push(d),
            _ => {
                let name = match (&p.key.topic, version >= 13) {
                    (TopicKey::Name(n), false) => TopicName(StrBytes::from_string(n.to_string())),
                    _ => TopicName::default(),
                };
                topics.push(
                    FetchableTopicResponse::default()
                        .with_topic(name)
                        .with_topic_id(p.topic_id)
                        .with_partitions(vec![d]),
                );
                last = Some(&p.key.topic);
            }
        }
    }
    let body = FetchResponse::default()
        .with_session_id(session_id)
        .with_responses(topics);
    (body, files)
}

/// A segment file range as the network sends it.
struct SegmentRegion(FileSlice);

impl RegionFile for SegmentRegion {
    fn file(&self) -> &std::fs::File {
        self.0.file()
    }

    fn is_intact(&self) -> bool {
        self.0.is_intact()
    }
}

/// Encodes the response: with no file range, as every response is
/// ([`gregor_network::respond`]); with some, as a frame whose record sets are sent from their
/// files ([`gregor_protocol::fetch_frame`]), the copying path's bytes but for where they
/// come from. An encoding failure (a gregor bug) is logged and the request gets no response.
fn encode(header: &RequestHeader, body: FetchResponse, files: Vec<Option<FileSlice>>) -> Handled {
    if files.iter().all(Option::is_none) {
        return Handled::Ready(respond(header, ApiKey::Fetch, ResponseKind::Fetch(body)));
    }
    let external = files.into_iter().map(|f| {
        f.map(|slice| {
            let len = slice.len();
            (slice, len)
        })
    });
    match encode_fetch_response(
        header.request_api_version,
        header.correlation_id,
        &body,
        external,
    ) {
        Ok(frame) => Handled::ReadyResponse(Response::new(
            frame
                .parts
                .into_iter()
                .map(|p| match p {
                    FramePart::Bytes(b) => ResponsePart::Bytes(b),
                    FramePart::Records(slice) => {
                        let (position, len) = (slice.position(), slice.len());
                        ResponsePart::File(FileRegion::new(
                            Box::new(SegmentRegion(slice)),
                            position,
                            len,
                        ))
                    }
                })
                .collect(),
        )),
        Err(e) => {
            tracing::error!(error = %e, "response encoding failed");
            Handled::Ready(None)
        }
    }
}

/// The most partitions one fetch session may hold: the cluster's, plus a slack for topics a
/// client knows before this broker (bounds the cache's memory, see [`crate::fetch_session`]).
fn session_partition_limit(broker: &Broker) -> usize {
    let image = broker.controller.image();
    image
        .topics
        .values()
        .map(|t| t.partitions.len())
        .sum::<usize>()
        + PARTITION_SLACK
}

/// The request's partitions, keyed by topic id (v13+) or name.
fn requested_partitions(
    req: &FetchRequest,
    version: i16,
    replica_id: i32,
    resolve: &dyn Fn(&Uuid) -> Option<Arc<str>>,
) -> Vec<SessionPartition> {
    let mut out = Vec::new();
    for t in &req.topics {
        let (topic, name) = if version >= 13 {
            (TopicKey::Id(t.topic_id), resolve(&t.topic_id))
        } else {
            let n: Arc<str> = Arc::from(t.topic.0.as_str());
            (TopicKey::Name(n.clone()), Some(n))
        };
        for fp in &t.partitions {
            out.push(SessionPartition {
                key: PartitionKey {
                    topic: topic.clone(),
                    partition: fp.partition,
                },
                name: name.clone(),
                topic_id: t.topic_id,
                params: PartitionParams {
                    fetch_offset: fp.fetch_offset,
                    log_start_offset: if replica_id >= 0 {
                        fp.log_start_offset
                    } else {
                        -1
                    },
                    max_bytes: fp.partition_max_bytes,
                    current_leader_epoch: fp.current_leader_epoch,
                    last_fetched_epoch: if version >= 12 {
                        fp.last_fetched_epoch
                    } else {
                        -1
                    },
                },
            });
        }
    }
    out
}

/// `ForgottenTopicsData` (v7+), keyed as the request's partitions.
fn forgotten_partitions(req: &FetchRequest, version: i16) -> Vec<PartitionKey> {
    let mut out = Vec::new();
    if version < 7 {
        return out;
    }
    for t in &req.forgotten_topics_data {
        let topic = if version >= 13 {
            TopicKey::Id(t.topic_id)
        } else {
            TopicKey::Name(Arc::from(t.topic.0.as_str()))
        };
        out.extend(t.partitions.iter().map(|&partition| PartitionKey {
            topic: topic.clone(),
            partition,
        }));
    }
    out
}

/// Handles Fetch: picks the fetch session context, resolves topic ids, hands the partitions to
/// [`ReplicaManager::fetch_messages`](crate::replica_manager::ReplicaManager::fetch_messages)
/// and encodes its results. The first read happens before this returns; a long poll is
/// deferred. Needs `Read` on each topic, or `ClusterAction` on the Cluster for a follower
/// (`replica_id >= 0`); partitions not authorised get TOPIC_AUTHORIZATION_FAILED, as Kafka's
/// `KafkaApis.handleFetch`. Session errors (FETCH_SESSION_ID_NOT_FOUND,
/// INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR) are top-level.
pub async fn handle(broker: &Arc<Broker>, ctx: &RequestContext, req: FetchRequest) -> Handled {
    let started = std::time::Instant::now();
    let header = ctx.header.clone();
    let version = header.request_api_version;
    let reply = move |header: &RequestHeader, body: FetchResponse| {
        respond(header, ApiKey::Fetch, ResponseKind::Fetch(body))
    };
    // Zero-copy on plain TCP connections unless the broker forces the copying path.
    let records_mode = if ctx.sends_files && broker.config.fetch_zero_copy_enable {
        RecordsMode::FileRegions
    } else {
        RecordsMode::InMemory
    };
    let replica_id = if version >= 15 {
        req.replica_state.replica_id.0
    } else {
        req.replica_id.0
    };
    let image = broker.controller.image();
    let resolve = |id: &Uuid| image.topic_by_id(id).map(|ti| Arc::from(ti.name.as_str()));
    let requested = requested_partitions(&req, version, replica_id, &resolve);
    let forgotten = forgotten_partitions(&req, version);
    let view = FetchRequestView {
        version,
        session_id: req.session_id,
        epoch: req.session_epoch,
        is_follower: replica_id >= 0,
        partitions: &requested,
        forgotten: &forgotten,
    };
    let sessions = &broker.fetch_sessions;
    let context = sessions.new_context(
        &view,
        &resolve,
        &|| session_partition_limit(broker),
        sessions.now_ms(),
    );
    let (partitions, mode) = match context {
        FetchContext::SessionError(code) => {
            record_error(ApiKey::Fetch, code);
            let body = FetchResponse::default()
                .with_error_code(code)
                .with_session_id(INVALID_SESSION_ID);
            return Handled::Ready(reply(&header, body));
        }
        FetchContext::Sessionless => (requested, Mode::Sessionless),
        FetchContext::Full {
            privileged,
            uses_topic_ids,
        } => (
            requested,
            Mode::Full {
                privileged,
                uses_topic_ids,
            },
        ),
        FetchContext::Incremental {
            session_id,
            request_epoch,
            partitions,
        } => (
            partitions,
            Mode::Incremental {
                session_id,
                request_epoch,
            },
        ),
    };
    let follower_authorized = replica_id < 0
        || broker.authorize(
            ctx,
            AclOperation::ClusterAction,
            ResourceType::Cluster,
            CLUSTER_NAME,
        );
    let mut entries = Vec::new();
    // Per entry: whether the partition exists in the metadata (a broker that is not one of
    // its replicas answers NOT_LEADER_OR_FOLLOWER, as Kafka's getPartitionOrError).
    let mut in_image = Vec::new();
    let mut unresolved = false;
    // Topic authorisation, decided once per run of partitions of one topic.
    let mut authorized_topic: Option<(&str, bool)> = None;
    let slots: Vec<Result<usize, i16>> = partitions
        .iter()
        .map(|p| {
            let Some(name) = p.name.as_deref() else {
                unresolved = true;
                return Err(ec::UNKNOWN_TOPIC_ID);
            };
            let authorized = follower_authorized
                && (replica_id >= 0
                    || match authorized_topic {
                        Some((n, ok)) if n == name => ok,
                        _ => {
                            let ok = broker.authorize(
                                ctx,
                                AclOperation::Read,
                                ResourceType::Topic,
                                name,
                            );
                            authorized_topic = Some((name, ok));
                            ok
                        }
                    });
            if !authorized {
                unresolved = true;
                return Err(ec::TOPIC_AUTHORIZATION_FAILED);
            }
            let partition = p.key.partition;
            in_image.push(
                image
                    .topic(name)
                    .is_some_and(|ti| ti.partitions.contains_key(&partition)),
            );
            entries.push(FetchPartition {
                topic_partition: TopicPartition::new(name.to_string(), partition),
                fetch_offset: p.params.fetch_offset,
                partition_max_bytes: p.params.max_bytes,
                current_leader_epoch: p.params.current_leader_epoch,
                last_fetched_epoch: p.params.last_fetched_epoch,
                log_start_offset: p.params.log_start_offset,
            });
            Ok(entries.len() - 1)
        })
        .collect();
    // A consumer asks for no more than its quota lets through in one window (Kafka's
    // `getMaxValueInQuotaWindow`), or every fetch would be throttled.
    let (max_bytes, min_bytes) = if replica_id < 0 {
        let window_max = broker.client_quotas.fetch.max_value_in_quota_window(
            &image,
            &ctx.principal.name,
            ctx.client_id(),
        );
        let max = if window_max < f64::from(req.max_bytes) {
            window_max.max(0.0) as i32
        } else {
            req.max_bytes
        };
        (max, req.min_bytes.min(max))
    } else {
        (req.max_bytes, req.min_bytes)
    };
    drop(image);
    let isolation_level = req.isolation_level;
    let params = FetchParams {
        replica_id,
        // A partition in error answers at once, as Kafka does.
        max_wait_ms: if unresolved {
            0
        } else {
            i64::from(req.max_wait_ms)
        },
        min_bytes,
        max_bytes,
        isolation_level,
        replica_epoch: if version >= 15 {
            req.replica_state.replica_epoch
        } else {
            -1
        },
        // Kafka's KafkaApis.handleFetchRequest: v11 added the preferred replica logic.
        client_metadata: (version >= 11).then(|| ClientMetadata {
            rack_id: req.rack_id.to_string(),
            client_id: header
                .client_id
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            listener_name: ctx.listener_name.clone(),
        }),
    };
    let incremental = matches!(mode, Mode::Incremental { .. });
    let quota = (replica_id < 0).then(|| ctx.clone());
    match broker
        .replica_manager
        .fetch_messages_as(params, entries, records_mode)
        .await
    {
        FetchOutcome::Complete(mut results) => {
            not_a_replica(&mut results, &in_image);
            let (body, files) = respond_to(
                broker,
                mode,
                &partitions,
                &slots,
                results,
                isolation_level,
                version,
            );
            let (body, files) = throttle(broker, quota.as_ref(), started, incremental, body, files);
            encode(&header, body, files)
        }
        FetchOutcome::Delayed(delayed) => {
            let broker = broker.clone();
            Handled::DeferredResponse(Box::pin(async move {
                let mut results = delayed.complete().await;
                not_a_replica(&mut results, &in_image);
                let (body, files) = respond_to(
                    &broker,
                    mode,
                    &partitions,
                    &slots,
                    results,
                    isolation_level,
                    version,
                );
                let (body, files) =
                    throttle(&broker, quota.as_ref(), started, incremental, body, files);
                match encode(&header, body, files) {
                    Handled::ReadyResponse(r) => Some(r),
                    Handled::Ready(b) => b.map(Response::from),
                    _ => None,
                }
            }))
        }
    }
}

/// Client quotas on a consumer's fetch (Kafka's `handleFetchRequest`; `ctx` is None for a
/// follower, which is exempt): the response's size (its encoded fields plus its record sets)
/// is recorded against `consumer_byte_rate` and the request's time against
/// `request_percentage`. A throttled fetch gets the throttled response of its fetch context
/// (Kafka's `getThrottledResponse`): no partitions, the throttle time, and no session id unless
/// the session is incremental; its bytes are not counted. The connection is muted for the
/// throttle time (KIP-219).
fn throttle(
    broker: &Broker,
    ctx: Option<&RequestContext>,
    started: std::time::Instant,
    incremental: bool,
    body: FetchResponse,
    files: Vec<Option<FileSlice>>,
) -> (FetchResponse, Vec<Option<FileSlice>>) {
    use gregor_protocol::kafka_protocol::protocol::Encodable;
    let Some(ctx) = ctx else {
        return (body, files);
    };
    let version = ctx.api_version();
    let size = body.compute_size(version).unwrap_or(0)
        + files.iter().flatten().map(|f| f.len()).sum::<usize>();
    let image = broker.controller.image();
    let throttle_time_ms = broker
        .client_quotas
        .throttle_fetch(&image, ctx, size, started);
    if throttle_time_ms <= 0 {
        return (body, files);
    }
    let throttle_time_ms = i32::try_from(throttle_time_ms).unwrap_or(i32::MAX);
    let session_id = if incremental && body.error_code == ec::NONE {
        body.session_id
    } else {
        INVALID_SESSION_ID
    };
    let throttled = if body.error_code != ec::NONE {
        body.with_throttle_time_ms(throttle_time_ms)
    } else {
        FetchResponse::default()
            .with_throttle_time_ms(throttle_time_ms)
            .with_session_id(session_id)
    };
    (throttled, Vec::new())
}

/// Kafka's `getPartitionOrError`: a partition this broker does not host but the metadata
/// knows (this broker is not one of its replicas, e.g. a stale preferred read replica or
/// leader) is NOT_LEADER_OR_FOLLOWER, which sends clients to refresh their metadata;
/// UNKNOWN_TOPIC_OR_PARTITION stays for partitions the metadata does not have.
fn not_a_replica(results: &mut [FetchPartitionResult], in_image: &[bool]) {
    for (r, known) in results.iter_mut().zip(in_image) {
        if *known && r.error_code == ec::UNKNOWN_TOPIC_OR_PARTITION {
            r.error_code = ec::NOT_LEADER_OR_FOLLOWER;
        }
    }
}
