//! ReplicaManager: the partitions this broker hosts and the data path into them (Kafka's
//! `ReplicaManager`). [`ReplicaManager::append_records`] and
//! [`ReplicaManager::fetch_messages`] take many partitions at once, whoever asks (a client's
//! Produce or Fetch, a coordinator's write, later followers and transaction markers); they run
//! the disk work as one job on the I/O pool ([`io`]) and park what must wait (acks=all, long
//! polls) in the delayed-operation purgatory ([`purgatory`]), which high-watermark moves, new
//! data, leadership changes and timeouts complete.
//!
//! Replication-ready by design (DESIGN.md): the high watermark is the minimum log end offset over
//! the ISR; with one replica the ISR is {self} and the high watermark follows every append, but
//! through the same code that followers will drive. Leadership is a state per partition
//! ([`partition::Role`]) changed in one place ([`Partition::apply`]).

pub mod io;
pub mod partition;
pub mod purgatory;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use gregor_log::{AppendInfo, FetchRecords, LogError, LogManager, SharedClock, TopicPartition};
use gregor_metadata::{MetadataImage, PartitionRegistration};
use parking_lot::RwLock;
use uuid::Uuid;

use crate::config::{BrokerConfig, DynamicBrokerConfigs, TopicConfigs};
use crate::error_codes as ec;
use crate::observability::{self, InFlight};
use crate::replication::quota::ReplicationQuotas;
use crate::replication::replica_selector::{
    BrokerNode, BrokerNodes, ClientMetadata, ReplicaSelector,
};

pub use io::{IoPool, IoPoolError};
pub use partition::{
    DelayedOperations, LeaderAndIsr, Partition, PartitionState, ReplicationContext, Role,
};
pub use purgatory::{Completion, DelayedOperation, DelayedOperationPurgatory};

/// Milliseconds since the Unix epoch, from the system clock. Components that hold a
/// [`SharedClock`] read that instead.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// How often [`ReplicaManager::retry_log_creation`] runs while some partition's log could not
/// be created (`server`'s `log_creation_retrier` task): 5 s. Kafka has no such retry (a log
/// that cannot be created takes its directory offline until a restart), so no Kafka interval
/// applies; 5 s brings a partition back within seconds of space being freed while costing a
/// `mkdir` and a small write per failed partition and attempt.
pub const LOG_CREATION_RETRY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// A partition of the latest metadata image that this broker replicates but whose log it
/// could not create ([`gregor_log::LogManager::get_or_create`] failed: ENOSPC, EACCES, EIO,
/// something in the way of its directory). The partition is not hosted (produce and fetch
/// answer as for a partition not here) until a retry creates the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogCreationFailure {
    /// The partition.
    pub topic_partition: TopicPartition,
    /// Its topic's id (KIP-516): a topic re-created under the same name is another topic.
    pub topic_id: Uuid,
    /// The log directory it was to be created in (an entry of `log.dirs`), when known.
    pub dir: Option<String>,
    /// What failed, naming the partition, the directory and the cause.
    pub error: String,
}

impl LogCreationFailure {
    fn new(topic_partition: TopicPartition, topic_id: Uuid, error: &LogError) -> Self {
        let dir = match error {
            LogError::CreateLog { dir, .. } => Some(dir.clone()),
            _ => None,
        };
        Self {
            topic_partition,
            topic_id,
            dir,
            error: error.to_string(),
        }
    }
}

/// Why [`ReplicaManager::apply_image`] or [`ReplicaManager::apply_metadata`] did not apply an
/// image whole. Everything else in the image was applied: one partition's failure does not
/// stop the others.
#[derive(Debug, thiserror::Error)]
#[error("{}", describe_apply_error(.not_created, .not_deleted))]
pub struct ApplyError {
    /// The partitions whose logs could not be created; they are kept in
    /// [`ReplicaManager::log_creation_failures`] and retried.
    pub not_created: Vec<LogCreationFailure>,
    /// The partitions that left this broker whose logs could not be deleted, and why.
    pub not_deleted: Vec<(TopicPartition, LogError)>,
}

fn describe_apply_error(
    not_created: &[LogCreationFailure],
    not_deleted: &[(TopicPartition, LogError)],
) -> String {
    let mut parts = Vec::new();
    if !not_created.is_empty() {
        let each: Vec<String> = not_created.iter().map(|f| f.error.clone()).collect();
        parts.push(format!(
            "the logs of {} partition(s) could not be created (retried every {} s and with the next metadata change): {}",
            not_created.len(),
            LOG_CREATION_RETRY_INTERVAL.as_secs(),
            each.join("; ")
        ));
    }
    for (tp, e) in not_deleted {
        parts.push(format!("deleting the log of {tp} failed: {e}"));
    }
    parts.join("; ")
}

/// Who is appending (Kafka's `AppendOrigin`): a client's batches are checked for control
/// batches, sequences and duplicates; a coordinator's (its internal topics' records and
/// WriteTxnMarkers' markers) for producer epochs and transaction state only. Follower appends
/// (`Replication`) do not come through [`ReplicaManager::append_records`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendOrigin {
    /// A producer's Produce request.
    Client,
    /// A coordinator's write: `__consumer_offsets`, `__transaction_state`, transaction
    /// markers.
    Coordinator,
}

impl AppendOrigin {
    fn log_origin(self) -> gregor_log::AppendOrigin {
        match self {
            Self::Client => gregor_log::AppendOrigin::Client,
            Self::Coordinator => gregor_log::AppendOrigin::Coordinator,
        }
    }
}

/// What one partition of an append writes.
#[derive(Debug, Clone)]
pub enum AppendWork {
    /// Record batches as received, with the KIP-890 verification guard of the request's
    /// producer on this partition (`None`: verification off or not needed).
    Records(Vec<u8>, Option<gregor_log::VerificationGuard>),
    /// A transaction marker (WriteTxnMarkers).
    TxnMarker {
        /// The transaction's producer id.
        producer_id: i64,
        /// The producer epoch the coordinator ends it with.
        producer_epoch: i16,
        /// COMMIT or ABORT, and the coordinator epoch.
        marker: gregor_protocol::control::EndTxnMarker,
    },
}

/// The outcome of appending to one partition (Kafka's `PartitionResponse`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionAppendResult {
    /// Kafka error code, 0 on success.
    pub error_code: i16,
    /// Error detail, when there is one.
    pub error_message: Option<String>,
    /// Offset of the first record appended, -1 on error.
    pub base_offset: i64,
    /// The broker time stamped on the records for LogAppendTime topics (ms), else -1.
    pub log_append_time_ms: i64,
    /// The log start offset after the append; on error -1, or the log start offset when
    /// records failed validation (Kafka's `unknownLogAppendInfoWithAdditionalInfo`).
    pub log_start_offset: i64,
    /// KIP-467: the records that failed validation, when the batch was refused for them.
    pub record_errors: Vec<gregor_log::RecordError>,
}

impl PartitionAppendResult {
    /// A result with error `code` (and `message`, if not empty), offsets unknown.
    pub fn error(code: i16, message: Option<String>) -> Self {
        Self {
            error_code: code,
            error_message: message.filter(|m| !m.is_empty()),
            base_offset: -1,
            log_append_time_ms: -1,
            log_start_offset: -1,
            record_errors: Vec::new(),
        }
    }

    fn rejected(r: AppendRejected) -> Self {
        Self {
            log_start_offset: r.log_start_offset,
            record_errors: r.record_errors,
            ..Self::error(r.code, Some(r.message))
        }
    }
}

/// Why [`Partition::append_records_as_leader`] refused an append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendRejected {
    /// Kafka error code.
    pub code: i16,
    /// Error detail ("" for none).
    pub message: String,
    /// KIP-467: the records that failed validation (the batch was refused for them).
    pub record_errors: Vec<gregor_log::RecordError>,
    /// The log start offset to report, -1 when none is (Kafka reports it with record errors).
    pub log_start_offset: i64,
}

impl AppendRejected {
    /// A refusal with `code` and `message`, no record errors.
    pub fn new(code: i16, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            record_errors: Vec::new(),
            log_start_offset: -1,
        }
    }
}

/// A hosted partition, or the error code and message for one that is not
/// ([`ReplicaManager::hosted`]).
pub type Hosted = Result<Arc<Partition>, (i16, String)>;

/// What [`ReplicaManager::append_records`] returns: results now, or a delayed produce
/// (acks=all) whose results come when the high watermark passes every batch or the timeout
/// expires.
pub enum AppendOutcome {
    /// One result per entry, in the entries' order.
    Complete(Vec<PartitionAppendResult>),
    /// An acks=all wait in the produce purgatory.
    Delayed(DelayedProduce),
}

/// The offset an acks=all append waits for the high watermark to reach before it is
/// acknowledged (Kafka's `ProducePartitionStatus.requiredOffset`, `lastOffset + 1`), `None`
/// for acks 0 and 1. A duplicate batch (an idempotent retry, [`AppendInfo::duplicate`]) waits
/// for its original offsets too: it was acknowledged by nobody yet, and its original may still
/// be only on this leader.
pub(crate) fn acks_all_required_offset(required_acks: i16, info: &AppendInfo) -> Option<i64> {
    (required_acks == -1).then_some(info.last_offset + 1)
}

/// The leader epoch of the records at `offset` in `p`'s log: the epoch of the leader epoch
/// cache's last entry starting at or below it; `None` when the cache has none.
fn epoch_of_offset(p: &Partition, offset: i64) -> Option<i32> {
    p.log
        .leader_epoch_entries()
        .iter()
        .rev()
        .find(|e| e.start_offset <= offset)
        .map(|e| e.epoch)
}

/// Sets `r` to a waiting acks=all produce's answer `code` ([`Partition::acks_all_answer`]):
/// NOT_LEADER_OR_FOLLOWER drops the offsets (the batch may be gone from this log); the
/// others (acknowledged, NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT) keep them.
fn answer_produce(r: &mut PartitionAppendResult, code: i16) {
    if code == ec::NOT_LEADER_OR_FOLLOWER {
        *r = PartitionAppendResult::error(code, None);
    } else {
        r.error_code = code;
    }
}

/// One partition of a [`DelayedProduce`]: (index in the results, partition, offset the high
/// watermark must reach, leader epoch of the batch's records).
type ProduceWait = (usize, Arc<Partition>, i64, Option<i32>);

/// Kafka's `DelayedProduce`: an acks=all append waiting for the high watermark.
pub struct DelayedProduce {
    results: Vec<PartitionAppendResult>,
    /// The partitions waited for.
    waits: Vec<ProduceWait>,
    operation: Option<DelayedOperation>,
}

impl DelayedProduce {
    /// Waits for completion and returns one result per entry, in order: REQUEST_TIMED_OUT for
    /// a partition whose high watermark did not reach its batch in time,
    /// NOT_LEADER_OR_FOLLOWER for one whose leadership moved meanwhile or whose batch is no
    /// longer in the log ([`crate::replication::leader::batch_still_there`]),
    /// NOT_ENOUGH_REPLICAS_AFTER_APPEND (20) for one whose high watermark reached the batch
    /// while the ISR was below `min.insync.replicas` (Kafka's
    /// `checkEnoughReplicasReachOffset`).
    pub async fn complete(mut self) -> Vec<PartitionAppendResult> {
        let _delayed = InFlight::new(observability::DELAYED_PRODUCE_REQUESTS);
        if let Some(op) = self.operation.take() {
            op.wait().await;
        }
        for (i, p, target, epoch) in &self.waits {
            // Woken or expired: answered from the state now, whatever it is.
            let code = p
                .acks_all_answer(*epoch, *target, true)
                .unwrap_or(ec::REQUEST_TIMED_OUT);
            answer_produce(&mut self.results[*i], code);
        }
        self.results
    }
}

/// Parameters of a fetch (Kafka's `FetchParams`).
#[derive(Debug, Clone)]
pub struct FetchParams {
    /// -1 for a consumer; a broker id for a follower (reads up to the log end offset and
    /// reports the follower's progress).
    pub replica_id: i32,
    /// How long to wait for `min_bytes` (ms); 0 answers at once.
    pub max_wait_ms: i64,
    /// Bytes to gather before answering early.
    pub min_bytes: i32,
    /// Response size limit in bytes, further capped by the broker's `fetch.max.bytes`. Soft for
    /// the first batch (KIP-74).
    pub max_bytes: i32,
    /// 0 read_uncommitted (up to the high watermark), 1 read_committed (up to the LSO).
    pub isolation_level: i8,
    /// The follower's broker epoch (Fetch v15+ `ReplicaState.ReplicaEpoch`, KIP-903), -1 when
    /// not given.
    pub replica_epoch: i64,
    /// The client's rack and listener, from Fetch v11 on (KIP-392); `None` for older fetches.
    /// A consumer fetch with it may be served by a follower, and its leader may answer with a
    /// preferred read replica.
    pub client_metadata: Option<ClientMetadata>,
}

impl FetchParams {
    /// A follower's fetch (replica id >= 0).
    pub fn is_from_follower(&self) -> bool {
        self.replica_id >= 0
    }

    /// Kafka's `FetchParams.fetchOnlyLeader`: followers' fetches, and consumers' fetches older
    /// than v11 (no client metadata), are served by the leader only.
    pub fn fetch_only_leader(&self) -> bool {
        self.is_from_follower() || self.client_metadata.is_none()
    }
}

/// One partition of a fetch.
#[derive(Debug, Clone)]
pub struct FetchPartition {
    /// The partition.
    pub topic_partition: TopicPartition,
    /// First offset wanted.
    pub fetch_offset: i64,
    /// Size limit for this partition in bytes (soft for the first batch, KIP-74).
    pub partition_max_bytes: i32,
    /// The client's leader epoch, -1 when not given (KIP-320).
    pub current_leader_epoch: i32,
    /// The epoch of the last batch the follower has (Fetch v12+, KIP-595 style truncation
    /// detection), -1 when not given.
    pub last_fetched_epoch: i32,
    /// The follower's log start offset, -1 for consumers.
    pub log_start_offset: i64,
}

/// What a fetch returns for one partition (Kafka's `FetchPartitionData`).
#[derive(Debug, Clone)]
pub struct FetchPartitionResult {
    /// Kafka error code, 0 on success.
    pub error_code: i16,
    /// High watermark, -1 on error.
    pub high_watermark: i64,
    /// Last stable offset, -1 on error.
    pub last_stable_offset: i64,
    /// Log start offset, -1 on error.
    pub log_start_offset: i64,
    /// Whole batches (possibly empty, never null on the wire): in memory, or a pinned range
    /// of a segment file when the fetch asked for [`RecordsMode::FileRegions`].
    pub records: FetchRecords,
    /// Records in those batches (their headers' counts), for `gregor_topic_records_out_total`.
    pub record_count: i64,
    /// For a follower whose `last_fetched_epoch` diverges from this log: the largest epoch
    /// `<=` it here and that epoch's end offset (`DivergingEpoch`); the follower truncates.
    pub diverging_epoch: Option<(i32, i64)>,
    /// The replica the consumer should fetch from instead of this leader
    /// (`PreferredReadReplica`, KIP-392); the result then has no records.
    pub preferred_read_replica: Option<i32>,
    /// For a read_committed consumer (isolation level 1): the aborted transactions overlapping
    /// the records returned (`AbortedTransactions`, from the segments' `.txnindex`); empty
    /// otherwise.
    pub aborted_transactions: Vec<gregor_log::AbortedTxn>,
}

impl FetchPartitionResult {
    fn error(code: i16) -> Self {
        Self {
            error_code: code,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            records: FetchRecords::default(),
            record_count: 0,
            diverging_epoch: None,
            preferred_read_replica: None,
            aborted_transactions: Vec::new(),
        }
    }
}

/// How a fetch returns its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordsMode {
    /// Read into memory (the copying path: in-process callers, transports that are not plain
    /// TCP, `fetch.zero.copy.enable=false`).
    InMemory,
    /// As pinned ranges of the segment files where that pays (see
    /// [`gregor_log::PartitionLog::read_for_fetch`]), sent from the files with `sendfile`.
    FileRegions,
}

/// What [`ReplicaManager::fetch_messages`] returns: data now, or a delayed fetch.
pub enum FetchOutcome {
    /// One result per partition, in the request's order.
    Complete(Vec<FetchPartitionResult>),
    /// A long poll waiting in the fetch purgatory.
    Delayed(DelayedFetch),
}

/// The resolved partitions of one fetch, readable in one I/O job.
struct FetchPlan {
    params: FetchParams,
    /// Whether batches may come back as file ranges.
    mode: RecordsMode,
    /// Response size limit after `fetch.max.bytes`.
    max_bytes: i32,
    /// The leader quota throttles follower fetches (KIP-73).
    quotas: Arc<ReplicationQuotas>,
    partitions: Vec<(FetchPartition, Result<Arc<Partition>, i16>)>,
    /// `replica.selector.class` and the registered brokers, for a consumer fetch with client
    /// metadata (KIP-392); `None` otherwise.
    selector: Option<(ReplicaSelector, Arc<BrokerNodes>)>,
}

struct ReadPass {
    results: Vec<FetchPartitionResult>,
    bytes: usize,
    /// An error, or an answer the client acts on at once (a diverging epoch, a preferred read
    /// replica): the fetch does not wait.
    any_error: bool,
    /// Per partition read: the upper bound and leader epoch the read saw, the baseline that
    /// new data or a leadership change is measured against.
    seen: Vec<(Arc<Partition>, i64, i32)>,
}

impl ReadPass {
    /// What a waiting fetch keeps of a pass that found too little: its baseline, without the
    /// results, which the next pass reads again (so a long poll holds no pinned segment file).
    fn baseline(self) -> Self {
        Self {
            results: Vec::new(),
            ..self
        }
    }
}

/// [`crate::replication::leader::diverging_epoch`] for a follower fetch of `p`.
fn diverging_epoch(
    p: &Partition,
    fp: &FetchPartition,
    log_start_offset: i64,
) -> Result<Option<(i32, i64)>, i16> {
    crate::replication::leader::diverging_epoch(
        p.log.end_offset_for_leader_epoch(fp.last_fetched_epoch),
        fp.last_fetched_epoch,
        fp.fetch_offset,
        log_start_offset,
    )
}

impl FetchPlan {
    fn is_follower_fetch(&self) -> bool {
        self.params.is_from_follower()
    }

    /// Kafka's `readFromLog` on a leader with a replica selector: the consumer's preferred
    /// read replica when it is not this leader, answered without records but with the offsets
    /// (`fetchOffsetSnapshot` after the leader-epoch check, or that check's error).
    fn preferred_replica_answer(
        &self,
        fp: &FetchPartition,
        p: &Partition,
    ) -> Option<FetchPartitionResult> {
        let (selector, brokers) = self.selector.as_ref()?;
        let client = self.params.client_metadata.as_ref()?;
        let id = p.preferred_read_replica(*selector, client, brokers, fp.fetch_offset)?;
        if let Err(code) = p.check_local_replica(fp.current_leader_epoch, false) {
            return Some(FetchPartitionResult::error(code));
        }
        Some(FetchPartitionResult {
            error_code: ec::NONE,
            high_watermark: p.high_watermark(),
            last_stable_offset: p.last_stable_offset(),
            log_start_offset: p.log.log_start_offset(),
            records: FetchRecords::default(),
            record_count: 0,
            diverging_epoch: None,
            preferred_read_replica: Some(id),
            aborted_transactions: Vec::new(),
        })
    }

    /// One pass over every partition: KIP-74 (the first batch whole), `max_bytes` over the
    /// response, `partition_max_bytes` per partition. For a follower (Kafka's
    /// `Partition.fetchRecords`): the replica must be a follower of the partition, a
    /// `last_fetched_epoch` this log diverges from answers `DivergingEpoch` without records,
    /// reads go to the log end offset, and with `update_fetch_state` the follower's progress
    /// is recorded after the read (not on a delayed fetch's re-reads, as Kafka). A consumer's
    /// fetch with client metadata (v11+) may be answered with a preferred read replica by a
    /// leader, and is served by a follower up to the follower's high watermark (KIP-392). Runs
    /// on an I/O thread.
    fn read(&self, update_fetch_state: bool) -> ReadPass {
        let mut remaining = self.max_bytes.max(0) as usize;
        let mut bytes = 0usize;
        let mut min_one_batch = true;
        let mut any_error = false;
        let mut results = Vec::with_capacity(self.partitions.len());
        let mut seen = Vec::with_capacity(self.partitions.len());
        let from_follower = self.is_follower_fetch();
        let fetch_only_leader = self.params.fetch_only_leader();
        for (fp, p) in &self.partitions {
            let p = match p {
                Ok(p) => p,
                Err(code) => {
                    any_error = true;
                    results.push(FetchPartitionResult::error(*code));
                    continue;
                }
            };
            if let Some(answer) = self.preferred_replica_answer(fp, p) {
                any_error = true;
                results.push(answer);
                continue;
            }
            if let Err(code) = p.check_local_replica(fp.current_leader_epoch, fetch_only_leader) {
                any_error = true;
                results.push(FetchPartitionResult::error(code));
                continue;
            }
            // Kafka's followerReplicaOrThrow.
            if from_follower && !p.is_follower_replica(self.params.replica_id) {
                any_error = true;
                results.push(FetchPartitionResult::error(
                    crate::replication::leader::LeaderState::unknown_replica_error(
                        fp.current_leader_epoch >= 0,
                    ),
                ));
                continue;
            }
            let limit = (fp.partition_max_bytes.max(0) as usize).min(remaining);
            // Offsets as of before the read (Kafka's readRecords), so appends during the read
            // do not keep a follower from catching up.
            let hw = p.high_watermark();
            let lso = p.last_stable_offset();
            let log_start = p.log.log_start_offset();
            let leo = p.log.log_end_offset();
            let epoch = p.leader_epoch();
            let upper = p.fetch_upper_bound(self.params.isolation_level, from_follower);
            seen.push((p.clone(), upper, epoch));
            if from_follower && fp.last_fetched_epoch >= 0 {
                match diverging_epoch(p, fp, log_start) {
                    Ok(None) => {}
                    Ok(Some(diverging)) => {
                        results.push(FetchPartitionResult {
                            error_code: ec::NONE,
                            high_watermark: hw,
                            last_stable_offset: lso,
                            log_start_offset: log_start,
                            records: FetchRecords::default(),
                            record_count: 0,
                            diverging_epoch: Some(diverging),
                            preferred_read_replica: None,
                            aborted_transactions: Vec::new(),
                        });
                        // An answer the follower acts on at once.
                        any_error = true;
                        continue;
                    }
                    Err(code) => {
                        any_error = true;
                        results.push(FetchPartitionResult::error(code));
                        continue;
                    }
                }
            }
            let from_file = self.mode == RecordsMode::FileRegions;
            match p.read_for_fetch(fp.fetch_offset, limit, upper, min_one_batch, from_file) {
                Ok(info) => {
                    if from_follower && update_fetch_state {
                        if let Err(code) = p.update_follower_fetch_state(
                            self.params.replica_id,
                            fp.fetch_offset,
                            fp.log_start_offset,
                            self.params.replica_epoch,
                            leo,
                        ) {
                            any_error = true;
                            results.push(FetchPartitionResult::error(code));
                            continue;
                        }
                    }
                    // Kafka's shouldLeaderThrottle: an out-of-sync follower of a throttled
                    // partition gets no records while the leader quota is exceeded.
                    let (records, record_count) = if from_follower
                        && !info.records.is_empty()
                        && self.quotas.leader.should_throttle(
                            p.in_committed_isr(self.params.replica_id),
                            &fp.topic_partition.topic,
                            fp.topic_partition.partition,
                        ) {
                        (FetchRecords::default(), 0)
                    } else {
                        (info.records, info.record_count)
                    };
                    let n = records.len();
                    if n > 0 {
                        min_one_batch = false;
                    }
                    // Kafka's LocalLog.addAbortedTransactions: the aborted transactions of the
                    // range returned, for a read_committed consumer.
                    let aborted_transactions =
                        if !from_follower && self.params.isolation_level == 1 && n > 0 {
                            // The offset after the last batch returned; for a range sent
                            // from the file, the read's bound (the LSO), which covers it: as
                            // Kafka's bound (the next segment's base offset or the log end
                            // offset) the list may name more, and consumers filter by offset.
                            let returned_upper = match &records {
                                FetchRecords::Memory(b) => gregor_protocol::batch::Batches::new(b)
                                    .filter_map(Result::ok)
                                    .last()
                                    .map_or(fp.fetch_offset, |(_, h)| h.next_offset()),
                                FetchRecords::File(_) => upper,
                            };
                            match p
                                .log
                                .collect_aborted_transactions(fp.fetch_offset, returned_upper)
                            {
                                Ok(a) => a,
                                Err(e) => {
                                    tracing::warn!(partition = %fp.topic_partition, error = %e,
                                    "reading the transaction index failed");
                                    any_error = true;
                                    results.push(FetchPartitionResult::error(e.kafka_error_code()));
                                    continue;
                                }
                            }
                        } else {
                            Vec::new()
                        };
                    remaining = remaining.saturating_sub(n);
                    bytes += n;
                    results.push(FetchPartitionResult {
                        error_code: ec::NONE,
                        high_watermark: hw,
                        last_stable_offset: lso,
                        log_start_offset: log_start,
                        records,
                        record_count,
                        diverging_epoch: None,
                        preferred_read_replica: None,
                        aborted_transactions,
                    });
                }
                Err(e) => {
                    any_error = true;
                    let code = match &e {
                        LogError::OffsetOutOfRange { .. } => ec::OFFSET_OUT_OF_RANGE,
                        other => other.kafka_error_code(),
                    };
                    // As Kafka's ReplicaManager on a failed read: offsets unknown (-1).
                    results.push(FetchPartitionResult::error(code));
                }
            }
        }
        ReadPass {
            results,
            bytes,
            any_error,
            seen,
        }
    }

    fn satisfied(&self, pass: &ReadPass) -> bool {
        pass.any_error
            || pass.bytes >= self.params.min_bytes.max(0) as usize
            || self.params.max_wait_ms <= 0
            || self.partitions.is_empty()
    }

    /// Counts what is returned to consumers in the topic byte/record counters; for a
    /// follower, records the bytes of throttled partitions in the leader quota (Kafka's
    /// `sizeOfThrottledPartitions`, in sync or not).
    fn record_metrics(&self, results: &[FetchPartitionResult]) {
        if self.is_follower_fetch() {
            let throttled: usize = self
                .partitions
                .iter()
                .zip(results)
                .filter(|((fp, _), _)| {
                    self.quotas
                        .leader
                        .is_throttled(&fp.topic_partition.topic, fp.topic_partition.partition)
                })
                .map(|(_, r)| r.records.len())
                .sum();
            self.quotas.leader.record(throttled as u64);
            return;
        }
        for ((_, p), r) in self.partitions.iter().zip(results) {
            let (Ok(p), false) = (p, r.records.is_empty()) else {
                continue;
            };
            // Bytes sent from a file count as bytes out like bytes from memory.
            p.metrics.bytes_out.increment(r.records.len() as u64);
            p.metrics
                .records_out
                .increment(r.record_count.max(0) as u64);
        }
    }

    /// Kafka's `DelayedFetch.tryComplete`, without disk I/O: since `pass` read, a partition's
    /// readable end moved (past what that read could see, or back, as a follower's high
    /// watermark may after a truncation), its leader epoch changed or this replica stopped
    /// serving the fetch (no longer leader, or for a consumer reading a follower, no longer a
    /// replica).
    fn try_complete_check(&self, pass: &ReadPass) -> purgatory::TryComplete {
        let seen = pass.seen.clone();
        let isolation = self.params.isolation_level;
        let from_follower = self.is_follower_fetch();
        let fetch_only_leader = self.params.fetch_only_leader();
        Box::new(move || {
            seen.iter().any(|(p, upper, epoch)| {
                !p.serves_reads(fetch_only_leader)
                    || p.leader_epoch() != *epoch
                    || p.fetch_upper_bound(isolation, from_follower) != *upper
            })
        })
    }
}

/// Kafka's `DelayedFetch`: a long poll waiting for `min_bytes`, woken by new data, a
/// high-watermark move or a leadership change, until `max_wait_ms`.
pub struct DelayedFetch {
    plan: Arc<FetchPlan>,
    /// The read that found too little; its baseline decides what counts as new data.
    last_pass: ReadPass,
    io: Arc<IoPool>,
    purgatory: Arc<DelayedOperationPurgatory>,
    clock: SharedClock,
    deadline_ms: i64,
}

impl DelayedFetch {
    /// Waits until enough data, an error or the deadline, then reads and returns one result
    /// per partition in order.
    pub async fn complete(mut self) -> Vec<FetchPartitionResult> {
        let _delayed = InFlight::new(observability::DELAYED_FETCH_REQUESTS);
        let keys: Vec<TopicPartition> = self
            .plan
            .partitions
            .iter()
            .map(|(fp, _)| fp.topic_partition.clone())
            .collect();
        loop {
            let remaining_ms = self.deadline_ms.saturating_sub(self.clock.now_ms());
            let expired = match self.purgatory.try_complete_else_watch(
                keys.clone(),
                remaining_ms,
                self.plan.try_complete_check(&self.last_pass),
            ) {
                Some(op) => op.wait().await == Completion::Expired,
                None => remaining_ms <= 0,
            };
            let plan = self.plan.clone();
            let pass = match self.io.run(move || plan.read(false)).await {
                Ok(pass) => pass,
                Err(e) => {
                    tracing::error!(error = %e, "fetch read failed");
                    let results = self
                        .plan
                        .partitions
                        .iter()
                        .map(|_| FetchPartitionResult::error(ec::UNKNOWN_SERVER_ERROR))
                        .collect();
                    return results;
                }
            };
            if expired || self.plan.satisfied(&pass) {
                self.plan.record_metrics(&pass.results);
                return pass.results;
            }
            self.last_pass = pass.baseline();
        }
    }
}

/// The follower side of replication as the replica manager drives it around each metadata
/// image (Kafka's `applyDelta`, which removes fetchers before `makeLeader`/`makeFollower` and
/// adds them after): the replica fetchers implement it, and the broker installs them at
/// start-up ([`ReplicaManager::set_fetchers`]).
pub trait ReplicaFetchers: Send + Sync {
    /// Before `image` is applied: every followed partition whose leader or leader epoch
    /// changes, that `local_broker` leads or that has no leader, that no longer has
    /// `local_broker` as a replica, or whose topic was deleted or re-created stops being
    /// fetched. Waits for an append in progress on that partition, so no follower append
    /// lands after the partition's role changed or it was deleted.
    /// With `scope`, only partitions of the topics it names are looked at (the others did not
    /// change).
    fn before_image(
        &self,
        image: &MetadataImage,
        local_broker: i32,
        scope: Option<&HashSet<String>>,
    );

    /// After `image` is applied: every partition of `partitions` (the hosted ones the image
    /// was applied to) that this broker follows is fetched from its leader.
    fn after_image(&self, image: &MetadataImage, partitions: &[Arc<Partition>]);

    /// A log dir went offline or came back (`partitions`: every hosted one, `image`: the
    /// latest, for the leaders' addresses): partitions in an offline dir stop being fetched,
    /// followers in an online one are fetched from their leaders.
    fn on_log_dirs_changed(&self, image: &MetadataImage, partitions: &[Arc<Partition>]);
}

/// The partitions hosted here, keyed by topic name and index, and the data path into them.
pub struct ReplicaManager {
    local_broker: i32,
    config: BrokerConfig,
    logs: Arc<LogManager>,
    /// By topic, then index: a lookup by `&str` allocates nothing (produce and fetch look up
    /// every partition they touch).
    partitions: RwLock<BTreeMap<String, BTreeMap<i32, Arc<Partition>>>>,
    /// Dynamic broker configs of the latest image applied (KIP-226).
    dynamic_configs: RwLock<DynamicBrokerConfigs>,
    clock: SharedClock,
    delayed: Arc<DelayedOperations>,
    io: Arc<IoPool>,
    replication: Arc<ReplicationContext>,
    /// The replica fetchers, installed at start-up ([`ReplicaManager::set_fetchers`]).
    fetchers: std::sync::OnceLock<Arc<dyn ReplicaFetchers>>,
    /// High watermarks read from `replication-offset-checkpoint`, taken by each partition as
    /// it is created.
    checkpointed_high_watermarks:
        parking_lot::Mutex<std::collections::HashMap<TopicPartition, i64>>,
    /// Replication throttles (KIP-73), updated from each image's configs.
    quotas: Arc<ReplicationQuotas>,
    /// `replica.selector.class` (KIP-392), `None`: consumers read from leaders only.
    replica_selector: Option<ReplicaSelector>,
    /// The registered brokers (rack, fencing, listeners) of the latest image, for the replica
    /// selector.
    broker_nodes: RwLock<Arc<BrokerNodes>>,
    /// The image last applied without error by [`ReplicaManager::apply_metadata`], which the
    /// next one is compared with; None after an error or an [`ReplicaManager::apply_image`].
    applied: parking_lot::Mutex<Option<Arc<MetadataImage>>>,
    /// Held while an image is applied: the metadata loader's images and the retries of
    /// [`ReplicaManager::retry_log_creation`] apply one at a time.
    applying: parking_lot::Mutex<()>,
    /// The latest image handed to [`ReplicaManager::apply_metadata`] (or
    /// [`ReplicaManager::apply_image`]) while some partition of it has no log: what
    /// [`ReplicaManager::retry_log_creation`] applies again. Never older than what was applied.
    latest: parking_lot::Mutex<Option<Arc<MetadataImage>>>,
    /// The partitions of the latest image whose logs could not be created, by partition.
    creation_failures: parking_lot::Mutex<BTreeMap<TopicPartition, LogCreationFailure>>,
    /// How KIP-890 verifications reach transaction coordinators (Kafka's
    /// `AddPartitionsToTxnManager`), installed at start-up.
    txn_verifier: RwLock<Option<Arc<dyn crate::txn_verification::AddPartitionsToTxnSender>>>,
    /// The ids (`directory.id`) of this broker's log directories, set at start-up
    /// ([`ReplicaManager::set_log_dir_ids`]); None: no replica's directory is checked.
    log_dir_ids: std::sync::OnceLock<Vec<Uuid>>,
    /// Replicas of the latest image with no log here whose registration names a log
    /// directory this broker does not have (KIP-858): not created, by partition, with that
    /// directory's id ([`ReplicaManager::missing_dir_of`]).
    in_missing_dirs: parking_lot::Mutex<BTreeMap<TopicPartition, Uuid>>,
    /// The missing directories already warned about (one WARN per directory and process).
    warned_missing_dirs: parking_lot::Mutex<HashSet<Uuid>>,
}

impl ReplicaManager {
    /// Wraps the opened logs, with an I/O pool of `num.io.threads`. Time (LogAppendTime,
    /// delayed-operation deadlines, retention, flushes) comes from the log manager's clock
    /// ([`LogManager::open_with_clock`]), so the logs and the replica manager share one clock.
    /// Partitions are attached by [`ReplicaManager::apply_image`].
    pub fn new(local_broker: i32, config: BrokerConfig, logs: LogManager) -> Self {
        let clock = logs.clock().clone();
        let io = Arc::new(IoPool::new(config.num_io_threads()));
        let checkpointed = logs.read_high_watermark_checkpoints();
        let quotas = Arc::new(ReplicationQuotas::new(
            clock.clone(),
            config.replication_quota_window_num(),
            config.replication_quota_window_size_seconds(),
        ));
        Self {
            quotas,
            replica_selector: config.replica_selector(),
            broker_nodes: RwLock::new(Arc::new(BrokerNodes::new())),
            applied: parking_lot::Mutex::new(None),
            applying: parking_lot::Mutex::new(()),
            latest: parking_lot::Mutex::new(None),
            creation_failures: parking_lot::Mutex::new(BTreeMap::new()),
            txn_verifier: RwLock::new(None),
            log_dir_ids: std::sync::OnceLock::new(),
            in_missing_dirs: parking_lot::Mutex::new(BTreeMap::new()),
            warned_missing_dirs: parking_lot::Mutex::new(HashSet::new()),
            replication: ReplicationContext::new(config.replica_lag_time_max_ms()),
            fetchers: std::sync::OnceLock::new(),
            checkpointed_high_watermarks: parking_lot::Mutex::new(checkpointed),
            local_broker,
            delayed: DelayedOperations::new(&clock),
            clock,
            config,
            logs: Arc::new(logs),
            partitions: RwLock::new(BTreeMap::new()),
            dynamic_configs: RwLock::new(DynamicBrokerConfigs::default()),
            io,
        }
    }

    /// Installs the replica fetchers (once; later calls are ignored).
    pub fn set_fetchers(&self, fetchers: Arc<dyn ReplicaFetchers>) {
        let _ = self.fetchers.set(fetchers);
    }

    /// Sets the ids (`directory.id`) of this broker's log directories (once, before the first
    /// image; later calls are ignored). From then on a replica with no log here whose
    /// registration names another directory is not created ([`ReplicaManager::missing_dir_of`]).
    pub fn set_log_dir_ids(&self, ids: Vec<Uuid>) {
        let _ = self.log_dir_ids.set(ids);
    }

    /// The log directory ids (KIP-858) that replicas hosted here are assigned to but none of
    /// `log.dirs` has (a disk not mounted, a dir moved away), with how many replicas each:
    /// those replicas are offline (KAFKA_STORAGE_ERROR) until the dir is back.
    pub fn missing_dirs(&self) -> BTreeMap<Uuid, usize> {
        let mut out = BTreeMap::new();
        for dir in self.in_missing_dirs.lock().values() {
            *out.entry(*dir).or_insert(0) += 1;
        }
        out
    }

    /// The directory `reg` assigns this broker's replica to when this broker does not have it
    /// (KIP-858): a real directory id that is none of [`ReplicaManager::set_log_dir_ids`]'s, or
    /// `LOST`. Such a replica's log is in a directory that is missing (a disk that did not
    /// mount, a directory replaced by an empty one): creating an empty log elsewhere would
    /// report it to the controller and lose the records once the directory is back, so it
    /// stays offline. `UNASSIGNED` and `MIGRATING` (no directory said yet) are never missing.
    /// Kafka 4.x refuses to start with a log dir that has no `meta.properties`, so it never
    /// meets the case; its `Partition.createLogInAssignedDirectoryId` skips the creation of a
    /// replica assigned to a directory it does not have while some directory is offline.
    pub fn missing_dir_of(&self, reg: &PartitionRegistration) -> Option<Uuid> {
        let ids = self.log_dir_ids.get()?;
        let i = reg.replicas.iter().position(|r| *r == self.local_broker)?;
        let dir = *reg.directories.get(i)?;
        let unknown = dir == gregor_metadata::record::DIRECTORY_UNASSIGNED
            || dir == gregor_metadata::record::DIRECTORY_MIGRATING;
        (!unknown && !ids.contains(&dir)).then_some(dir)
    }

    /// Tells the replica fetchers that a log dir went offline or came back
    /// ([`ReplicaFetchers::on_log_dirs_changed`]), between two metadata images (never while
    /// one is applied).
    pub fn on_log_dirs_changed(&self, image: &MetadataImage) {
        let _applying = self.applying.lock();
        if let Some(f) = self.fetchers.get() {
            f.on_log_dirs_changed(image, &self.partitions());
        }
    }

    /// This broker's replication throttles (KIP-73): the leader side is applied in
    /// [`ReplicaManager::fetch_messages`], the follower side by the replica fetchers.
    pub fn replication_quotas(&self) -> &Arc<ReplicationQuotas> {
        &self.quotas
    }

    /// The partition `topic`-`index`, if hosted here.
    pub fn partition(&self, topic: &str, index: i32) -> Option<Arc<Partition>> {
        self.partitions.read().get(topic)?.get(&index).cloned()
    }

    /// The partition `tp` if hosted here, else why not: KAFKA_STORAGE_ERROR (56) with the
    /// cause when the latest image gives this broker a replica whose log could not be created
    /// ([`ReplicaManager::log_creation_failures`]; Kafka's `HostedPartition.Offline`, a replica
    /// whose log directory failed), else UNKNOWN_TOPIC_OR_PARTITION with no message (handlers
    /// answer NOT_LEADER_OR_FOLLOWER instead for a partition the metadata has).
    pub fn hosted(&self, tp: &TopicPartition) -> Hosted {
        if let Some(p) = self.partition(&tp.topic, tp.partition) {
            return Ok(p);
        }
        if let Some(dir) = self.in_missing_dirs.lock().get(tp) {
            return Err((
                ec::KAFKA_STORAGE_ERROR,
                format!(
                    "the replica's log directory {} is not on this broker",
                    crate::storage::kafka_uuid_string(*dir)
                ),
            ));
        }
        match self.creation_failures.lock().get(tp) {
            Some(f) => Err((ec::KAFKA_STORAGE_ERROR, f.error.clone())),
            None => Err((ec::UNKNOWN_TOPIC_OR_PARTITION, String::new())),
        }
    }

    /// All hosted partitions.
    pub fn partitions(&self) -> Vec<Arc<Partition>> {
        self.partitions
            .read()
            .values()
            .flat_map(|t| t.values().cloned())
            .collect()
    }

    /// This broker's dynamic configs as of the latest metadata image.
    pub fn dynamic_configs(&self) -> DynamicBrokerConfigs {
        self.dynamic_configs.read().clone()
    }

    /// The broker configuration.
    pub fn broker_config(&self) -> &BrokerConfig {
        &self.config
    }

    /// The clock the replica manager reads.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Now on the replica manager's clock, in ms since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// What the partitions share for replication (lag limit, brokers' liveness, the
    /// AlterPartition sender).
    pub fn replication(&self) -> &Arc<ReplicationContext> {
        &self.replication
    }

    /// Kafka's `ReplicaManager.maybeShrinkIsr` (the `isr-expiration` task, every
    /// `replica.lag.time.max.ms / 2`): every partition led here proposes removing its
    /// out-of-sync followers. Returns how many proposed a change.
    pub fn maybe_shrink_isr(&self) -> usize {
        self.partitions()
            .iter()
            .filter(|p| p.maybe_shrink_isr())
            .count()
    }

    /// Runs [`ReplicaManager::maybe_shrink_isr`] every `replica.lag.time.max.ms / 2` until
    /// `shutdown` turns true.
    pub async fn run_isr_expiration(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let period = std::time::Duration::from_millis(
            (self.replication.replica_lag_time_max_ms() / 2).max(1) as u64,
        );
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = shutdown.changed() => return,
            }
            if *shutdown.borrow() {
                return;
            }
            self.maybe_shrink_isr();
        }
    }

    /// The fetch and produce purgatories.
    pub fn delayed_operations(&self) -> &Arc<DelayedOperations> {
        &self.delayed
    }

    /// The I/O pool (`num.io.threads`) that runs log work off the async workers.
    pub fn io_pool(&self) -> &Arc<IoPool> {
        &self.io
    }

    /// Kafka's `ReplicaManager.appendRecords`: appends one record batch set per partition, all
    /// partitions in one job on the I/O pool (so the caller's request order is the append
    /// order), then applies `required_acks`:
    /// - `0` and `1`: results at once (the caller sends no response for acks=0);
    /// - `-1` (all): a [`DelayedProduce`] in the produce purgatory that completes when the high
    ///   watermark passes each appended batch, or after `timeout_ms` (REQUEST_TIMED_OUT).
    ///
    /// Results are in the entries' order. Per-partition errors: INVALID_REQUIRED_ACKS for acks
    /// other than -1, 0, 1; UNKNOWN_TOPIC_OR_PARTITION when not hosted here;
    /// NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS and the log's validation errors from
    /// [`Partition::append_records_as_leader`]; UNKNOWN_SERVER_ERROR if the I/O job failed.
    pub async fn append_records(
        &self,
        timeout_ms: i64,
        required_acks: i16,
        origin: AppendOrigin,
        entries: Vec<(TopicPartition, Vec<u8>)>,
    ) -> AppendOutcome {
        let entries = entries
            .into_iter()
            .map(|(tp, records)| (tp, AppendWork::Records(records, None)))
            .collect();
        self.append_entries(timeout_ms, required_acks, origin, entries)
            .await
    }

    /// [`ReplicaManager::append_records`] for any [`AppendWork`]: record batches with their
    /// transaction verification guards, and transaction markers (which WriteTxnMarkers
    /// appends with acks=all and origin Coordinator). Per partition, the log's transaction
    /// errors too: INVALID_TXN_STATE, INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED.
    pub async fn append_entries(
        &self,
        timeout_ms: i64,
        required_acks: i16,
        origin: AppendOrigin,
        entries: Vec<(TopicPartition, AppendWork)>,
    ) -> AppendOutcome {
        if !matches!(required_acks, -1..=1) {
            return AppendOutcome::Complete(
                entries
                    .iter()
                    .map(|_| PartitionAppendResult::error(ec::INVALID_REQUIRED_ACKS, None))
                    .collect(),
            );
        }
        let work: Vec<(Hosted, AppendWork)> = entries
            .into_iter()
            .map(|(tp, w)| (self.hosted(&tp), w))
            .collect();
        let n = work.len();
        let job = move || {
            work.into_iter()
                .map(|(p, w)| {
                    let p = p.map_err(|(code, message)| AppendRejected::new(code, message))?;
                    let info = match w {
                        AppendWork::Records(mut records, guard) => p
                            .append_records_as_leader_from(
                                &mut records,
                                required_acks,
                                origin.log_origin(),
                                guard,
                            )?,
                        AppendWork::TxnMarker {
                            producer_id,
                            producer_epoch,
                            marker,
                        } => p.append_txn_marker_as_leader(producer_id, producer_epoch, marker)?,
                    };
                    let epoch = epoch_of_offset(&p, info.last_offset);
                    Ok::<_, AppendRejected>((p, info, epoch))
                })
                .collect::<Vec<_>>()
        };
        let appended = match self.io.run(job).await {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, ?origin, "append failed");
                return AppendOutcome::Complete(
                    (0..n)
                        .map(|_| PartitionAppendResult::error(ec::UNKNOWN_SERVER_ERROR, None))
                        .collect(),
                );
            }
        };
        let mut results = Vec::with_capacity(n);
        let mut waits = Vec::new();
        for (i, a) in appended.into_iter().enumerate() {
            match a {
                Ok((p, info, epoch)) => {
                    // A duplicate (an idempotent producer's retry) carries the original
                    // batch's offsets and waits for them like the original did: the retry of a
                    // batch appended but not yet replicated (the first attempt timed out on a
                    // leader cut from its followers) must not be acknowledged before the high
                    // watermark passes it (Kafka's ReplicaManager waits on `lastOffset + 1`
                    // whatever the append found).
                    if let Some(offset) = acks_all_required_offset(required_acks, &info) {
                        waits.push((i, p, offset, epoch));
                    }
                    results.push(PartitionAppendResult {
                        error_code: ec::NONE,
                        error_message: None,
                        base_offset: info.first_offset,
                        log_append_time_ms: info.log_append_time_ms,
                        log_start_offset: info.log_start_offset,
                        record_errors: Vec::new(),
                    });
                }
                Err(rejected) => {
                    tracing::debug!(?origin, code = rejected.code, message = %rejected.message, "append rejected");
                    results.push(PartitionAppendResult::rejected(rejected));
                }
            }
        }
        // Already replicated (a single replica, or followers ahead): answered now, with
        // NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank below min ISR meanwhile.
        waits.retain(
            |(i, p, target, epoch)| match p.acks_all_answer(*epoch, *target, false) {
                Some(code) => {
                    answer_produce(&mut results[*i], code);
                    false
                }
                None => true,
            },
        );
        if waits.is_empty() {
            return AppendOutcome::Complete(results);
        }
        let keys = waits
            .iter()
            .map(|(_, p, _, _)| p.topic_partition().clone())
            .collect();
        let watched: Vec<(Arc<Partition>, i64, Option<i32>)> = waits
            .iter()
            .map(|(_, p, t, e)| (p.clone(), *t, *e))
            .collect();
        // Kafka's DelayedProduce.tryComplete: every partition reached its offset
        // (checkEnoughReplicasReachOffset) or has an error (no longer led here).
        let check = Box::new(move || {
            watched
                .iter()
                .all(|(p, target, epoch)| p.acks_all_answer(*epoch, *target, false).is_some())
        });
        let operation = self
            .delayed
            .produce
            .try_complete_else_watch(keys, timeout_ms, check);
        AppendOutcome::Delayed(DelayedProduce {
            results,
            waits,
            operation,
        })
    }

    /// Kafka's `ReplicaManager.maybeStartTransactionVerificationForPartition`: the
    /// verification guard of `producer_id`'s first transactional write to `tp` (the
    /// sentinel when its transaction of `producer_epoch` is already open there, so nothing
    /// needs verifying), or the error of a partition not hosted here.
    ///
    /// # Errors
    /// UNKNOWN_TOPIC_OR_PARTITION, KAFKA_STORAGE_ERROR for a replica whose log could not
    /// be created, INVALID_PRODUCER_EPOCH for an epoch older than the producer's there.
    pub fn maybe_start_transaction_verification(
        &self,
        tp: &TopicPartition,
        producer_id: i64,
        sequence: i32,
        producer_epoch: i16,
        supports_epoch_bump: bool,
    ) -> Result<gregor_log::VerificationGuard, i16> {
        let p = self.hosted(tp).map_err(|(code, _)| code)?;
        p.log
            .maybe_start_transaction_verification(
                producer_id,
                sequence,
                producer_epoch,
                supports_epoch_bump,
            )
            .map_err(|e| e.kafka_error_code())
    }

    /// Installs how KIP-890 verifications reach transaction coordinators (start-up installs
    /// the network sender; a test may replace it). Until one is installed, produce requests
    /// with transactional batches are answered as for an unreachable coordinator.
    pub fn set_txn_verifier(
        &self,
        sender: Arc<dyn crate::txn_verification::AddPartitionsToTxnSender>,
    ) {
        *self.txn_verifier.write() = Some(sender);
    }

    /// The installed KIP-890 verification sender.
    pub fn txn_verifier(
        &self,
    ) -> Option<Arc<dyn crate::txn_verification::AddPartitionsToTxnSender>> {
        self.txn_verifier.read().clone()
    }

    /// Kafka's `ReplicaManager.fetchMessages`: reads every partition in one job on the I/O
    /// pool, bounded by the high watermark (consumers, isolation 0), the last stable offset
    /// (isolation 1) or the log end offset (followers, whose fetch offset also records their
    /// progress and may move the high watermark). The response is limited to
    /// `min(params.max_bytes, fetch.max.bytes)` and each partition to its
    /// `partition_max_bytes`, except that the first batch found is returned whole (KIP-74).
    ///
    /// Completes at once on any partition error, when `min_bytes` are available, or when
    /// `max_wait_ms` is 0; otherwise returns a [`DelayedFetch`] in the fetch purgatory.
    /// Per-partition errors: UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER,
    /// FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH (KIP-320), OFFSET_OUT_OF_RANGE, the log's
    /// read errors; offsets are -1 on error.
    pub async fn fetch_messages(
        &self,
        params: FetchParams,
        partitions: Vec<FetchPartition>,
    ) -> FetchOutcome {
        self.fetch_messages_as(params, partitions, RecordsMode::InMemory)
            .await
    }

    /// [`ReplicaManager::fetch_messages`] returning the batches as `mode` says: the same
    /// batches either way, in memory or as pinned ranges of the segment files that the
    /// response sends without copying (zero-copy fetch on plain TCP connections).
    pub async fn fetch_messages_as(
        &self,
        params: FetchParams,
        partitions: Vec<FetchPartition>,
        mode: RecordsMode,
    ) -> FetchOutcome {
        let max_bytes = if params.replica_id >= 0 {
            params.max_bytes
        } else {
            params.max_bytes.min(self.config.fetch_max_bytes())
        };
        let max_wait_ms = params.max_wait_ms;
        let selector = self
            .replica_selector
            .filter(|_| !params.is_from_follower() && params.client_metadata.is_some())
            .map(|s| (s, self.broker_nodes.read().clone()));
        let plan = Arc::new(FetchPlan {
            params,
            mode,
            quotas: self.quotas.clone(),
            selector,
            max_bytes,
            partitions: partitions
                .into_iter()
                .map(|fp| {
                    let p = self.hosted(&fp.topic_partition).map_err(|(code, _)| code);
                    (fp, p)
                })
                .collect(),
        });
        let reader = plan.clone();
        let pass = match self.io.run(move || reader.read(true)).await {
            Ok(pass) => pass,
            Err(e) => {
                tracing::error!(error = %e, "fetch read failed");
                return FetchOutcome::Complete(
                    plan.partitions
                        .iter()
                        .map(|_| FetchPartitionResult::error(ec::UNKNOWN_SERVER_ERROR))
                        .collect(),
                );
            }
        };
        if plan.satisfied(&pass) {
            plan.record_metrics(&pass.results);
            return FetchOutcome::Complete(pass.results);
        }
        FetchOutcome::Delayed(DelayedFetch {
            deadline_ms: self.clock.now_ms().saturating_add(max_wait_ms),
            plan,
            last_pass: pass.baseline(),
            io: self.io.clone(),
            purgatory: self.delayed.fetch.clone(),
            clock: self.clock.clone(),
        })
    }

    /// Kafka's `ReplicaManager.fetchOffset` for ListOffsets: looks up every
    /// (partition, timestamp, current leader epoch) in one job on the I/O pool (the time index
    /// and segments are read). Results in order: (timestamp, offset, leader epoch) or a Kafka
    /// error code (UNKNOWN_TOPIC_OR_PARTITION, the leader check's, INVALID_REQUEST, the log's);
    /// see [`Partition::fetch_offset_for_timestamp`]. `isolation_level` is the consumer's, or
    /// None for a follower or debugging client (read to the log end offset). Only the leader
    /// answers.
    pub async fn fetch_offsets(
        &self,
        isolation_level: Option<i8>,
        lookups: Vec<(TopicPartition, i64, i32)>,
    ) -> Vec<Result<(i64, i64, i32), i16>> {
        self.fetch_offsets_from(isolation_level, true, lookups)
            .await
    }

    /// [`ReplicaManager::fetch_offsets`], answered by a follower too unless
    /// `fetch_only_from_leader` (Kafka: every ListOffsets but one with the debugging replica id
    /// -2 needs the leader).
    pub async fn fetch_offsets_from(
        &self,
        isolation_level: Option<i8>,
        fetch_only_from_leader: bool,
        lookups: Vec<(TopicPartition, i64, i32)>,
    ) -> Vec<Result<(i64, i64, i32), i16>> {
        let n = lookups.len();
        let work: Vec<(Result<Arc<Partition>, i16>, i64, i32)> = lookups
            .into_iter()
            .map(|(tp, ts, epoch)| (self.hosted(&tp).map_err(|(code, _)| code), ts, epoch))
            .collect();
        let job = move || {
            work.into_iter()
                .map(|(p, ts, epoch)| {
                    p?.fetch_offset_for_timestamp(
                        ts,
                        isolation_level,
                        epoch,
                        fetch_only_from_leader,
                    )
                })
                .collect::<Vec<_>>()
        };
        self.io.run(job).await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "ListOffsets lookup failed");
            vec![Err(ec::UNKNOWN_SERVER_ERROR); n]
        })
    }

    /// DeleteRecords for many partitions (Kafka's `ReplicaManager.deleteRecords`, KIP-107):
    /// moves each leader's log start offset in one job on the I/O pool (see
    /// [`ReplicaManager::delete_records`]), then, like Kafka's `DelayedDeleteRecords`, waits up
    /// to `timeout_ms` until every live replica's log start offset reached the requested
    /// offset (the low watermark, [`Partition::low_watermark_if_leader`]; followers take the
    /// leader's log start offset from their next fetch and report theirs in the one after).
    ///
    /// One result per entry, in order. Errors: UNKNOWN_TOPIC_OR_PARTITION when not hosted here,
    /// the deletion's own errors, NOT_LEADER_OR_FOLLOWER when leadership moved while waiting,
    /// REQUEST_TIMED_OUT (with the low watermark after the deletion) when a live replica did
    /// not catch up in time.
    pub async fn delete_records_many(
        &self,
        timeout_ms: i64,
        offsets: Vec<(TopicPartition, i64)>,
    ) -> Vec<DeleteRecordsResult> {
        let n = offsets.len();
        let work: Vec<(Hosted, i64)> = offsets
            .into_iter()
            .map(|(tp, offset)| (self.hosted(&tp), offset))
            .collect();
        let logs = self.logs.clone();
        let job = move || {
            work.into_iter()
                .map(|(p, offset)| {
                    let p = p?;
                    let (requested, low) = delete_records_on(&logs, &p, offset)?;
                    Ok((p, requested, low))
                })
                .collect::<Vec<_>>()
        };
        let deleted = match self.io.run(job).await {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "DeleteRecords failed");
                return (0..n)
                    .map(|_| DeleteRecordsResult::error(ec::UNKNOWN_SERVER_ERROR, e.to_string()))
                    .collect();
            }
        };
        let mut results = Vec::with_capacity(n);
        let mut waits: Vec<(usize, Arc<Partition>, i64)> = Vec::new();
        for (i, d) in deleted.into_iter().enumerate() {
            match d {
                Ok((p, requested, low)) => {
                    results.push(DeleteRecordsResult {
                        error_code: ec::NONE,
                        low_watermark: low,
                        message: None,
                    });
                    if low < requested {
                        waits.push((i, p, requested));
                    }
                }
                Err((code, message)) => results.push(DeleteRecordsResult::error(code, message)),
            }
        }
        if waits.is_empty() {
            return results;
        }
        let keys = waits
            .iter()
            .map(|(_, p, _)| p.topic_partition().clone())
            .collect();
        let watched: Vec<(Arc<Partition>, i64)> =
            waits.iter().map(|(_, p, r)| (p.clone(), *r)).collect();
        // Kafka's DelayedDeleteRecords.tryComplete: every partition's low watermark reached
        // its offset, or it is no longer led here.
        let check = Box::new(move || {
            watched.iter().all(|(p, requested)| {
                p.low_watermark_if_leader()
                    .is_none_or(|low| low >= *requested)
            })
        });
        if let Some(op) = self
            .delayed
            .delete_records
            .try_complete_else_watch(keys, timeout_ms, check)
        {
            op.wait().await;
        }
        for (i, p, requested) in waits {
            let r = &mut results[i];
            match p.low_watermark_if_leader() {
                None => *r = DeleteRecordsResult::error(ec::NOT_LEADER_OR_FOLLOWER, String::new()),
                Some(low) if low >= requested => r.low_watermark = low,
                Some(_) => r.error_code = ec::REQUEST_TIMED_OUT,
            }
        }
        results
    }

    /// Kafka's `UnifiedLog.removeExpiredProducers` on every partition: drops the state of
    /// producers idle for `producer.id.expiration.ms` at `now_ms` (not those with an open
    /// transaction) and verification entries as old. Blocking: run it on the I/O pool.
    pub fn remove_expired_producers(&self, now_ms: i64) {
        let expiration_ms = self.config.producer_id_expiration_ms();
        for p in self.partitions() {
            p.log.remove_expired_producers(now_ms, expiration_ms);
        }
    }

    /// Runs retention on every hosted partition (Kafka's `LogManager.cleanupLogs`, every
    /// `log.retention.check.interval.ms`): deletes segments past `retention.ms`,
    /// `retention.bytes` or below the log start offset, bounded by each partition's high
    /// watermark, and checkpoints the log start offsets when they moved. Errors are logged
    /// per partition. Blocking: run it on the I/O pool.
    pub fn run_retention(&self, now_ms: i64) {
        let mut moved = false;
        for p in self.partitions() {
            match p.log.delete_old_segments(now_ms, p.high_watermark()) {
                Ok(r) => moved |= r.deleted_segments > 0,
                Err(e) => {
                    tracing::error!(topic = %p.topic, partition = p.index, error = %e, "retention failed");
                }
            }
        }
        if moved {
            if let Err(e) = self.logs.checkpoint_log_start_offsets() {
                tracing::error!(error = %e, "writing log-start-offset-checkpoint failed");
            }
        }
    }

    /// DeleteRecords for one partition (Kafka's `Partition.deleteRecordsOnLeader`): moves the
    /// log start offset to `offset` (-1: the high watermark) and persists it. Returns the
    /// offset asked for (with -1 resolved) and the low watermark now
    /// ([`Partition::low_watermark_if_leader`]), which followers raise as they catch up.
    /// Blocking (it writes a checkpoint).
    ///
    /// # Errors
    /// Kafka error codes: NOT_LEADER_OR_FOLLOWER, POLICY_VIOLATION (44) when `cleanup.policy`
    /// does not contain `delete`, OFFSET_OUT_OF_RANGE for an offset beyond the high watermark
    /// or negative, KAFKA_STORAGE_ERROR.
    pub fn delete_records(&self, p: &Partition, offset: i64) -> Result<(i64, i64), (i16, String)> {
        delete_records_on(&self.logs, p, offset)
    }

    /// The log manager.
    pub fn logs(&self) -> &LogManager {
        &self.logs
    }

    /// Brings hosted partitions in line with a metadata image: creates logs for new
    /// partitions this broker replicates, applies each partition's leader and ISR
    /// ([`Partition::apply`]), and deletes the logs of partitions whose topic is gone (KIP-516:
    /// matched by topic id, so a re-created topic of the same name gets fresh logs). Visits
    /// every topic; [`ReplicaManager::apply_metadata`] visits only what changed.
    ///
    /// A partition whose log cannot be created (a full disk, a permission, an I/O error) does
    /// not stop the others: it is remembered ([`ReplicaManager::log_creation_failures`]), not
    /// hosted, and created by a later apply (the next image, which is then applied whole) or
    /// by [`ReplicaManager::retry_log_creation`] (every [`LOG_CREATION_RETRY_INTERVAL`]), so
    /// that freeing space makes it appear without a metadata change. A later creation clears
    /// the entry, as does the partition leaving the image. Compared with Kafka 4.4: there a
    /// log that cannot be created (`LogManager.getOrCreateLog`, `PartitionMetadataFile`)
    /// reports its directory to the `LogDirFailureChannel`, which takes the whole directory
    /// offline (every partition in it stops being served, the controller is told through the
    /// heartbeat's offline dirs, KIP-858, and the broker halts when no directory is left or it
    /// held the metadata log), the partition is marked offline and never retried until a
    /// restart. Here only a lack of space marks the directory (full, which heals by itself,
    /// see [`gregor_log::LogDirHealth`]), and the partition is retried.
    ///
    /// # Errors
    /// [`ApplyError`] naming every partition whose log could not be created or deleted; the
    /// rest of the image is applied.
    pub fn apply_image(&self, image: &MetadataImage) -> Result<(), ApplyError> {
        let _applying = self.applying.lock();
        *self.applied.lock() = None;
        let result = self.apply_scoped(image, None);
        *self.latest.lock() = result
            .as_ref()
            .err()
            .filter(|e| !e.not_created.is_empty())
            .map(|_| Arc::new(image.clone()));
        result
    }

    /// [`ReplicaManager::apply_image`] for the images the metadata loader publishes, doing
    /// work in proportion to what changed rather than to every partition (Kafka's
    /// `applyDelta` on a `TopicsDelta`): after an image was applied without error, the next
    /// one visits only the topics whose registration changed, appeared or went away. Topics
    /// an image shares unchanged with the one before it are the same allocation
    /// ([`MetadataImage::topics`]), so finding them costs a pointer comparison per topic. A
    /// change of configs or of brokers, a snapshot (`full`), or an earlier error makes it visit
    /// everything, as `apply_image`.
    ///
    /// # Errors
    /// As [`ReplicaManager::apply_image`]; the next image is then applied whole.
    pub fn apply_metadata(&self, image: &Arc<MetadataImage>, full: bool) -> Result<(), ApplyError> {
        let _applying = self.applying.lock();
        let previous = self.applied.lock().take();
        let scope = match previous {
            Some(prev) if !full => changed_topics(&prev, image),
            _ => None,
        };
        let result = self.apply_scoped(image, scope.as_ref());
        let pending = !self.creation_failures.lock().is_empty();
        *self.latest.lock() = pending.then(|| image.clone());
        result?;
        *self.applied.lock() = Some(image.clone());
        Ok(())
    }

    /// Tries again to create the logs of [`ReplicaManager::log_creation_failures`]: applies the
    /// latest image again to their topics. The broker runs it every
    /// [`LOG_CREATION_RETRY_INTERVAL`] while any is pending (blocking: run it on the I/O pool).
    /// Returns how many partitions it created.
    ///
    /// # Errors
    /// As [`ReplicaManager::apply_image`], for the partitions still failing.
    pub fn retry_log_creation(&self) -> Result<usize, ApplyError> {
        let _applying = self.applying.lock();
        let before = self.creation_failures.lock().len();
        let topics: HashSet<String> = self
            .creation_failures
            .lock()
            .keys()
            .map(|tp| tp.topic.clone())
            .collect();
        let Some(image) = self.latest.lock().clone() else {
            return Ok(0);
        };
        if topics.is_empty() {
            return Ok(0);
        }
        let result = self.apply_scoped(&image, Some(&topics));
        let after = self.creation_failures.lock().len();
        if after == 0 {
            *self.latest.lock() = None;
        }
        result.map(|()| before.saturating_sub(after))
    }

    /// Whether some partition's log could not be created ([`LogCreationFailure`]).
    pub fn has_log_creation_failures(&self) -> bool {
        !self.creation_failures.lock().is_empty()
    }

    /// The partitions of the latest image whose logs could not be created here, in partition
    /// order.
    pub fn log_creation_failures(&self) -> Vec<LogCreationFailure> {
        self.creation_failures.lock().values().cloned().collect()
    }

    /// The partitions of topic `topic` with id `topic_id` whose logs could not be created
    /// here, in partition order.
    pub fn log_creation_failures_of(&self, topic: &str, topic_id: Uuid) -> Vec<LogCreationFailure> {
        self.creation_failures
            .lock()
            .range(TopicPartition::new(topic, i32::MIN)..=TopicPartition::new(topic, i32::MAX))
            .map(|(_, f)| f)
            .filter(|f| f.topic_id == topic_id)
            .cloned()
            .collect()
    }

    /// Whether every partition of `topic` (as `image` has it) that this broker replicates is
    /// hosted here with the topic's id.
    pub fn hosts_local_replicas(&self, image: &MetadataImage, topic: &str) -> bool {
        let Some(t) = image.topic(topic) else {
            return false;
        };
        t.partitions
            .iter()
            .filter(|(_, p)| p.replicas.contains(&self.local_broker))
            .all(|(i, _)| {
                self.partition(topic, *i)
                    .is_some_and(|p| p.topic_id == t.topic_id)
            })
    }

    /// The work of [`ReplicaManager::apply_image`], for every topic (`scope` None) or only for
    /// the topics named in `scope` (whose configs and brokers did not change).
    fn apply_scoped(
        &self,
        image: &MetadataImage,
        scope: Option<&HashSet<String>>,
    ) -> Result<(), ApplyError> {
        let mut not_created = Vec::new();
        let mut not_deleted = Vec::new();
        let dynamic = if scope.is_some() {
            self.dynamic_configs.read().clone()
        } else {
            let dynamic = DynamicBrokerConfigs::from_image(image, self.local_broker);
            *self.dynamic_configs.write() = dynamic.clone();
            self.quotas.apply_configs(
                &dynamic,
                image.topics.values().map(|t| {
                    (
                        t.name.as_str(),
                        image.configs_of(gregor_metadata::ConfigResource::Topic, &t.name),
                    )
                }),
                self.local_broker,
            );
            if self.replica_selector.is_some() {
                *self.broker_nodes.write() = Arc::new(broker_nodes(image));
            }
            self.replication.set_brokers(
                image
                    .brokers
                    .values()
                    .map(|b| {
                        (
                            b.broker_id,
                            crate::replication::leader::BrokerLiveness {
                                broker_epoch: b.epoch,
                                fenced: b.fenced,
                                in_controlled_shutdown: b.in_controlled_shutdown,
                            },
                        )
                    })
                    .collect(),
            );
            dynamic
        };
        // The topics to visit: all, or those named in `scope` that the image still has.
        let topics: Vec<&gregor_metadata::TopicImage> = match scope {
            None => image.topics.values().map(|t| &**t).collect(),
            Some(names) => names.iter().filter_map(|n| image.topic(n)).collect(),
        };
        // The effective configs are resolved once per topic hosted here and shared by its
        // partitions. Resolving and cloning them per partition made a metadata change take
        // 21-28 ms with 5,000 hosted partitions (so about 0.5 s with 100,000), 4-8 ms now.
        let mut wanted: BTreeMap<(&str, i32), (Uuid, &PartitionRegistration, Arc<TopicSettings>)> =
            BTreeMap::new();
        for t in topics {
            let mut settings: Option<Arc<TopicSettings>> = None;
            for (idx, p) in &t.partitions {
                if !p.replicas.contains(&self.local_broker) {
                    continue;
                }
                let settings = settings
                    .get_or_insert_with(|| {
                        let overrides =
                            image.configs_of(gregor_metadata::ConfigResource::Topic, &t.name);
                        let configs =
                            TopicConfigs::resolve_dynamic(&self.config, &dynamic, &overrides);
                        Arc::new(TopicSettings {
                            log_config: configs.log_config(),
                            min_insync_replicas: configs
                                .get("min.insync.replicas")
                                .parse::<usize>()
                                .unwrap_or(1),
                        })
                    })
                    .clone();
                wanted.insert((t.name.as_str(), *idx), (t.topic_id, p, settings));
            }
        }
        // A failure is forgotten once its partition (under that topic id) leaves the image.
        self.creation_failures.lock().retain(|tp, f| {
            scope.is_some_and(|names| !names.contains(&tp.topic))
                || wanted
                    .get(&(tp.topic.as_str(), tp.partition))
                    .is_some_and(|(id, _, _)| *id == f.topic_id)
        });
        self.in_missing_dirs.lock().retain(|tp, _| {
            scope.is_some_and(|names| !names.contains(&tp.topic))
                || wanted.contains_key(&(tp.topic.as_str(), tp.partition))
        });
        let mut missing: BTreeMap<Uuid, usize> = BTreeMap::new();
        // Partitions that stop following their leader leave their fetcher first (Kafka's
        // applyDelta), so no follower append lands after a role change or deletion.
        if let Some(f) = self.fetchers.get() {
            f.before_image(image, self.local_broker, scope);
        }
        let current: Vec<((String, i32), Arc<Partition>)> = {
            let partitions = self.partitions.read();
            let hosted = |(topic, t): (&String, &BTreeMap<i32, Arc<Partition>>)| {
                t.iter()
                    .map(|(i, p)| ((topic.clone(), *i), p.clone()))
                    .collect::<Vec<_>>()
            };
            match scope {
                None => partitions.iter().flat_map(hosted).collect(),
                Some(names) => names
                    .iter()
                    .filter_map(|n| partitions.get_key_value(n))
                    .flat_map(hosted)
                    .collect(),
            }
        };
        for (key, p) in current {
            let keep = wanted
                .get(&(key.0.as_str(), key.1))
                .is_some_and(|(id, _, _)| *id == p.topic_id);
            if !keep {
                {
                    let mut partitions = self.partitions.write();
                    if let Some(t) = partitions.get_mut(&key.0) {
                        t.remove(&key.1);
                        if t.is_empty() {
                            partitions.remove(&key.0);
                        }
                    }
                }
                p.make_offline(p.leader_epoch());
                let tp = TopicPartition::new(key.0.clone(), key.1);
                if let Err(e) = self.logs.delete(&tp) {
                    not_deleted.push((tp, e));
                }
            }
        }
        let mut visited = Vec::with_capacity(wanted.len());
        for ((topic, index), (topic_id, reg, settings)) in wanted {
            let leader_and_isr = LeaderAndIsr {
                leader: reg.leader,
                leader_epoch: reg.leader_epoch,
                partition_epoch: reg.partition_epoch,
                replicas: reg.replicas.clone(),
                isr: reg.isr.clone(),
                min_insync_replicas: settings.min_insync_replicas,
            };
            if let Some(p) = self.partition(topic, index) {
                // Topic and dynamic broker config changes (AlterConfigs) reach the log here.
                if p.log.config() != settings.log_config {
                    p.log.update_config(settings.log_config.clone());
                }
                p.apply(leader_and_isr);
                visited.push(p);
                continue;
            }
            let tp = TopicPartition::new(topic.to_string(), index);
            if self.logs.get(&tp).is_none() {
                if let Some(dir) = self.missing_dir_of(reg) {
                    *missing.entry(dir).or_default() += 1;
                    self.in_missing_dirs.lock().insert(tp, dir);
                    continue;
                }
            }
            self.in_missing_dirs.lock().remove(&tp);
            // The directory the metadata places this replica in (KIP-858): a log registered
            // in a failed directory is not created again elsewhere.
            let registered_dir = reg
                .replicas
                .iter()
                .position(|r| *r == self.local_broker)
                .and_then(|i| reg.directories.get(i))
                .filter(|d| {
                    **d != gregor_metadata::record::DIRECTORY_UNASSIGNED
                        && **d != gregor_metadata::record::DIRECTORY_MIGRATING
                })
                .map(|d| *d.as_bytes());
            let log = match self.logs.get_or_create_in(
                &tp,
                *topic_id.as_bytes(),
                settings.log_config.clone(),
                registered_dir,
            ) {
                Ok(log) => log,
                // Its log may be in a failed dir (KIP-112's offline replica): not a creation
                // to retry; the dir's one ERROR line said so, and the controller does not
                // elect this replica (its dir is offline).
                Err(e @ gregor_log::LogError::LogDirOffline { .. }) => {
                    tracing::debug!(partition = %tp, error = %e,
                        "replica offline: its registered log dir failed");
                    continue;
                }
                Err(e) => {
                    let failure = LogCreationFailure::new(tp.clone(), topic_id, &e);
                    self.creation_failures.lock().insert(tp, failure.clone());
                    not_created.push(failure);
                    continue;
                }
            };
            if self.creation_failures.lock().remove(&tp).is_some() {
                tracing::info!(partition = %tp, log_dir = %log.dir().display(),
                    "created the partition's log, which could not be created before");
            }
            // Logs loaded at start-up were opened with the broker defaults.
            log.update_config(settings.log_config.clone());
            let p = Partition::new(
                topic_id,
                tp,
                log,
                self.local_broker,
                self.delayed.clone(),
                self.clock.clone(),
                self.replication.clone(),
            );
            let checkpointed = self
                .checkpointed_high_watermarks
                .lock()
                .remove(p.topic_partition());
            if let Some(hw) = checkpointed {
                p.init_high_watermark(hw);
            }
            p.apply(leader_and_isr);
            self.partitions
                .write()
                .entry(topic.to_string())
                .or_default()
                .insert(index, p.clone());
            visited.push(p);
        }
        self.warn_missing_dirs(&missing);
        // New leader epochs are written together, in parallel (a restart or a topic creation
        // makes this broker leader of thousands of partitions at once).
        self.logs.write_leader_epoch_checkpoints();
        if let Some(f) = self.fetchers.get() {
            f.after_image(image, &visited);
        }
        if not_created.is_empty() && not_deleted.is_empty() {
            Ok(())
        } else {
            Err(ApplyError {
                not_created,
                not_deleted,
            })
        }
    }
}

impl ReplicaManager {
    /// One WARN per missing directory and process, naming it and how many replicas of the
    /// image it holds (`missing`: directory id -> replicas not created for it).
    fn warn_missing_dirs(&self, missing: &BTreeMap<Uuid, usize>) {
        let mut warned = self.warned_missing_dirs.lock();
        for (dir, replicas) in missing {
            if !warned.insert(*dir) {
                continue;
            }
            // As `meta.properties` writes them (Kafka's base64 form), so the operator can
            // find the directory holding it.
            let ids: Vec<String> = self
                .log_dir_ids
                .get()
                .map(|ids| {
                    ids.iter()
                        .map(|id| crate::storage::kafka_uuid_string(*id))
                        .collect()
                })
                .unwrap_or_default();
            tracing::warn!(directory_id = %crate::storage::kafka_uuid_string(*dir), replicas,
                log_dirs = ?self.logs.log_dirs(), directory_ids = ?ids,
                "replicas are assigned to a log directory this broker does not have (a disk \
                 that did not mount, or a directory replaced by an empty one): they stay \
                 offline (KAFKA_STORAGE_ERROR) and no empty log is created for them; mount the \
                 directory holding that directory.id in its meta.properties and restart the \
                 broker, or reassign the replicas");
        }
    }
}

/// The names of the topics that differ between `prev` and `next` (registration changed,
/// created, deleted, or re-created under a new id), or None when more than topics changed
/// (configs, brokers or features), which every partition must see. A topic both images hold
/// in the same allocation is unchanged: an image shares unchanged topics with the one it was
/// built from, and `prev`, alive here, keeps its allocations from being reused.
fn changed_topics(prev: &MetadataImage, next: &MetadataImage) -> Option<HashSet<String>> {
    if prev.configs != next.configs
        || prev.brokers != next.brokers
        || prev.features != next.features
    {
        return None;
    }
    let mut names = HashSet::new();
    for (id, t) in &next.topics {
        if !prev.topics.get(id).is_some_and(|p| Arc::ptr_eq(p, t)) {
            names.insert(t.name.clone());
        }
    }
    for (id, t) in &prev.topics {
        if !next.topics.contains_key(id) {
            names.insert(t.name.clone());
        }
    }
    Some(names)
}

/// What a hosted partition takes from its topic's effective configs, resolved once per topic
/// in [`ReplicaManager::apply_image`].
struct TopicSettings {
    log_config: gregor_log::LogConfig,
    /// `min.insync.replicas`.
    min_insync_replicas: usize,
}

/// The registered brokers of `image` as the replica selector sees them (Kafka's
/// `getPartitionReplicaEndpoints`: fenced brokers and endpoints without a host or port are
/// not endpoints).
fn broker_nodes(image: &MetadataImage) -> BrokerNodes {
    image
        .brokers
        .values()
        .map(|b| {
            (
                b.broker_id,
                BrokerNode {
                    fenced: b.fenced,
                    rack: b.rack.clone(),
                    listeners: b
                        .endpoints
                        .iter()
                        .filter(|e| !e.host.is_empty())
                        .map(|e| e.name.clone())
                        .collect(),
                },
            )
        })
        .collect()
}

/// Kafka's `Partition.deleteRecordsOnLeader`; see [`ReplicaManager::delete_records`].
fn delete_records_on(
    logs: &LogManager,
    p: &Partition,
    offset: i64,
) -> Result<(i64, i64), (i16, String)> {
    if !p.is_leader() {
        return Err((ec::NOT_LEADER_OR_FOLLOWER, String::new()));
    }
    let tp = format!("{}-{}", p.topic, p.index);
    if !p.log.config().cleanup_delete {
        return Err((
            ec::POLICY_VIOLATION,
            format!("Records of partition {tp} can not be deleted due to the configured policy"),
        ));
    }
    let hw = p.high_watermark();
    let offset = if offset == -1 { hw } else { offset };
    if offset < 0 || offset > hw {
        return Err((
            ec::OFFSET_OUT_OF_RANGE,
            format!(
                "Cannot increment the log start offset to {offset} of partition {tp} since it is larger than the high watermark {hw}"
            ),
        ));
    }
    p.log
        .maybe_increment_log_start_offset(offset)
        .map_err(|e| (e.kafka_error_code(), e.to_string()))?;
    match logs.checkpoint_log_start_offsets() {
        Ok(()) => {}
        // A full disk must not stop DeleteRecords, the way to free space through Kafka's
        // APIs: the new log start offset holds in memory, retention deletes the segments
        // below it (renames, needing no space) and writes the checkpoint again. Kafka writes
        // this checkpoint on a timer, not per request, so a crash before then loses the
        // move in Kafka too.
        Err(e) if e.is_out_of_space() => {
            tracing::warn!(partition = %tp, error = %e,
                "log-start-offset-checkpoint not written for lack of space; retention writes it once segments are deleted");
        }
        Err(e) => return Err((e.kafka_error_code(), e.to_string())),
    }
    let low = p
        .low_watermark_if_leader()
        .ok_or((ec::NOT_LEADER_OR_FOLLOWER, String::new()))?;
    Ok((offset, low))
}

/// One partition's DeleteRecords answer ([`ReplicaManager::delete_records_many`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRecordsResult {
    /// Kafka error code.
    pub error_code: i16,
    /// The low watermark (-1 with most errors).
    pub low_watermark: i64,
    /// A message for the log, with errors.
    pub message: Option<String>,
}

impl DeleteRecordsResult {
    fn error(error_code: i16, message: String) -> Self {
        Self {
            error_code,
            low_watermark: -1,
            message: Some(message),
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod io_stall_tests;
