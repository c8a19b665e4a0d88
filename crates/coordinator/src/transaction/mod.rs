//! The transaction coordinator (KIP-98, KIP-360, KIP-447, KIP-664, KIP-890), on the
//! [`CoordinatorRuntime`] over the compacted internal topic `__transaction_state`.
//!
//! Kafka's design (`TransactionCoordinator`, `TransactionStateManager`,
//! `TransactionMarkerChannelManager`), in Kafka's terms:
//! - The coordinator of a transactional id is the leader of partition
//!   `abs(transactionalId.hashCode) % transaction.state.log.num.partitions` of
//!   `__transaction_state`; the partition's leader epoch is the **coordinator epoch** written
//!   into every marker, so a deposed coordinator's markers are refused
//!   (TRANSACTION_COORDINATOR_FENCED).
//! - Every state change of a transactional id ([`metadata`]) is first written to that
//!   partition as a `TransactionLogKey`/`TransactionLogValue` record ([`records`]) and applied
//!   only once committed (the high watermark passed it). On leadership the partition is
//!   replayed; transactions found in PrepareCommit/PrepareAbort have their markers sent again.
//! - EndTxn writes PrepareCommit/PrepareAbort, answers, and then the **marker sender** writes
//!   a COMMIT/ABORT control batch to every partition of the transaction through
//!   WriteTxnMarkers ([`TransactionServices::send_markers`], which the broker implements over
//!   the inter-broker listener, to itself too), with Kafka's retries and error handling, and
//!   finally writes CompleteCommit/CompleteAbort.
//! - Timers: transactions open longer than their `transaction.timeout.ms` are fenced and
//!   aborted every `transaction.abort.timed.out.transaction.cleanup.interval.ms`; idle
//!   transactional ids are removed (tombstones) after `transactional.id.expiration.ms`.
//!
//! All state lives behind one mutex, never held across an await: an operation checks and
//! prepares its transition and appends the record under it, waits for the high watermark
//! outside it, and completes the transition under it again, checking that the coordinator
//! epoch did not change meanwhile (NOT_COORDINATOR otherwise).

pub mod metadata;
pub mod records;
pub mod state;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use gregor_log::clock::SharedClock;
use gregor_protocol::error::ErrorCode;
use parking_lot::Mutex;
use tracing::{debug, info, warn};

use crate::group::{java_string_hash_code, GroupConfigError};
use crate::runtime::{CoordinatorRecord, CoordinatorRuntime, PartitionWriter, PendingWrite};
pub use metadata::{TransactionMetadata, TransactionState, TxnPartition, TxnTransit};

/// The internal topic holding transaction state.
pub const TRANSACTION_STATE_TOPIC_NAME: &str = "__transaction_state";

/// A boxed future, for the broker's services.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Transaction coordinator settings, with Kafka's names and defaults
/// (`TransactionStateManagerConfig`, `TransactionLogConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionConfig {
    /// `transactional.id.expiration.ms` (604800000, 7 days): an id without a transaction and
    /// without updates for this long is removed.
    pub transactional_id_expiration_ms: i64,
    /// `transaction.max.timeout.ms` (900000, 15 min): the largest `transaction.timeout.ms` a
    /// producer may ask for (INVALID_TRANSACTION_TIMEOUT beyond).
    pub transaction_max_timeout_ms: i32,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms` (10000).
    pub abort_timed_out_transaction_cleanup_interval_ms: i64,
    /// `transaction.remove.expired.transaction.cleanup.interval.ms` (3600000).
    pub remove_expired_transaction_cleanup_interval_ms: i64,
    /// `transaction.state.log.num.partitions` (50).
    pub state_log_num_partitions: i32,
    /// `transaction.state.log.replication.factor` (3).
    pub state_log_replication_factor: i16,
    /// `transaction.state.log.min.isr` (2), the topic's `min.insync.replicas`.
    pub state_log_min_isr: i32,
    /// `transaction.state.log.segment.bytes` (104857600).
    pub state_log_segment_bytes: i32,
    /// `request.timeout.ms` (30000): how long a write to `__transaction_state` may wait for
    /// the high watermark (Kafka's `transactionConfig.requestTimeoutMs`).
    pub request_timeout_ms: i64,
}

impl Default for TransactionConfig {
    fn default() -> Self {
        Self {
            transactional_id_expiration_ms: 604_800_000,
            transaction_max_timeout_ms: 900_000,
            abort_timed_out_transaction_cleanup_interval_ms: 10_000,
            remove_expired_transaction_cleanup_interval_ms: 3_600_000,
            state_log_num_partitions: 50,
            state_log_replication_factor: 3,
            state_log_min_isr: 2,
            state_log_segment_bytes: 104_857_600,
            request_timeout_ms: 30_000,
        }
    }
}

impl TransactionConfig {
    /// Reads the settings from broker properties (Kafka's ranges: every value at least 1).
    ///
    /// # Errors
    /// [`GroupConfigError`] (the coordinator crate's config error) for a value out of range.
    pub fn from_properties(props: &BTreeMap<String, String>) -> Result<Self, GroupConfigError> {
        let d = Self::default();
        let num = |k: &str, default: i64, max: i64| -> Result<i64, GroupConfigError> {
            match props.get(k).map(|v| v.trim()) {
                None => Ok(default),
                Some(v) => {
                    let n: i64 = v.parse().map_err(|_| GroupConfigError {
                        name: k.into(),
                        value: v.into(),
                        reason: "not a number".into(),
                    })?;
                    if n < 1 || n > max {
                        return Err(GroupConfigError {
                            name: k.into(),
                            value: v.into(),
                            reason: format!("Value must be in [1, {max}]"),
                        });
                    }
                    Ok(n)
                }
            }
        };
        let int = i64::from(i32::MAX);
        Ok(Self {
            transactional_id_expiration_ms: num(
                "transactional.id.expiration.ms",
                d.transactional_id_expiration_ms,
                int,
            )?,
            transaction_max_timeout_ms: num(
                "transaction.max.timeout.ms",
                i64::from(d.transaction_max_timeout_ms),
                int,
            )? as i32,
            abort_timed_out_transaction_cleanup_interval_ms: num(
                "transaction.abort.timed.out.transaction.cleanup.interval.ms",
                d.abort_timed_out_transaction_cleanup_interval_ms,
                int,
            )?,
            remove_expired_transaction_cleanup_interval_ms: num(
                "transaction.remove.expired.transaction.cleanup.interval.ms",
                d.remove_expired_transaction_cleanup_interval_ms,
                int,
            )?,
            state_log_num_partitions: num(
                "transaction.state.log.num.partitions",
                i64::from(d.state_log_num_partitions),
                int,
            )? as i32,
            state_log_replication_factor: num(
                "transaction.state.log.replication.factor",
                i64::from(d.state_log_replication_factor),
                i64::from(i16::MAX),
            )? as i16,
            state_log_min_isr: num(
                "transaction.state.log.min.isr",
                i64::from(d.state_log_min_isr),
                int,
            )? as i32,
            state_log_segment_bytes: num(
                "transaction.state.log.segment.bytes",
                i64::from(d.state_log_segment_bytes),
                int,
            )? as i32,
            request_timeout_ms: num("request.timeout.ms", d.request_timeout_ms, int)?,
        })
    }
}

/// The markers of one transaction for some of its partitions (one `WritableTxnMarker` per
/// destination broker, Kafka's `TxnMarkerEntry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerRequest {
    /// Producer id.
    pub producer_id: i64,
    /// Producer epoch the markers are written with (the bumped one with transaction.version 2).
    pub producer_epoch: i16,
    /// COMMIT (true) or ABORT.
    pub commit: bool,
    /// This coordinator's epoch (the leader epoch of its `__transaction_state` partition).
    pub coordinator_epoch: i32,
    /// Partitions to write the marker to.
    pub partitions: Vec<TxnPartition>,
}

/// What the transaction coordinator needs from the broker (implemented by the broker over
/// the controller, its metadata image and its inter-broker connections; by tests in memory).
pub trait TransactionServices: Send + Sync + 'static {
    /// A fresh producer id, from the same allocator as idempotent producers' (the
    /// controller's AllocateProducerIds blocks).
    fn generate_producer_id(&self) -> BoxFuture<Result<i64, ErrorCode>>;

    /// Sends WriteTxnMarkers for `request` to the leaders of its partitions and returns one
    /// error code per partition: NONE when written (or when the partition no longer exists,
    /// as Kafka drops markers of deleted partitions), a leader's error, or a retriable code
    /// (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT) when the leader is unknown or did not
    /// answer.
    fn send_markers(&self, request: MarkerRequest) -> BoxFuture<Vec<(TxnPartition, ErrorCode)>>;

    /// The finalized `transaction.version` feature level of the cluster (2 by default in
    /// Kafka 4): the version used for aborts the coordinator starts itself, and whether
    /// `TransactionLogValue` is written flexible (v1, level >= 1).
    fn transaction_version(&self) -> i16;
}

/// The answer of InitProducerId and EndTxn: an error, or the producer id and epoch to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdAndEpoch {
    /// Error (NONE when the id and epoch are valid).
    pub error: ErrorCode,
    /// Producer id, -1 on error.
    pub producer_id: i64,
    /// Producer epoch, -1 on error.
    pub producer_epoch: i16,
}

impl ProducerIdAndEpoch {
    fn error(error: ErrorCode) -> Self {
        Self {
            error,
            producer_id: metadata::NO_PRODUCER_ID,
            producer_epoch: metadata::NO_PRODUCER_EPOCH,
        }
    }

    fn ok(producer_id: i64, producer_epoch: i16) -> Self {
        Self {
            error: ErrorCode::None,
            producer_id,
            producer_epoch,
        }
    }
}

/// A transaction as DescribeTransactions reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedTransaction {
    /// Error: NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, TRANSACTIONAL_ID_NOT_FOUND, ...
    pub error: ErrorCode,
    /// State name.
    pub state: String,
    /// `transaction.timeout.ms`.
    pub timeout_ms: i32,
    /// Start (ms), -1 when none.
    pub start_time_ms: i64,
    /// Producer id.
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// Partitions by topic.
    pub topics: Vec<(String, Vec<i32>)>,
}

/// A transaction as ListTransactions reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedTransaction {
    /// Transactional id.
    pub transactional_id: String,
    /// Producer id.
    pub producer_id: i64,
    /// State name.
    pub state: String,
}

/// ListTransactions filters (KIP-664; v1 duration, v2 id pattern).
#[derive(Debug, Clone, Default)]
pub struct ListFilters {
    /// State names (empty: all).
    pub states: Vec<String>,
    /// Producer ids (empty: all).
    pub producer_ids: Vec<i64>,
    /// Only transactions running longer than this (ms); -1: no filter.
    pub duration_ms: i64,
    /// Only transactional ids matching this regular expression (whole id).
    pub transactional_id_pattern: Option<String>,
}

/// The transactional ids of one loaded `__transaction_state` partition.
struct TxnPartitionState {
    coordinator_epoch: i32,
    txns: HashMap<String, TransactionMetadata>,
}

/// What InitProducerId does next, decided under the state lock.
enum InitStep {
    /// A fresh producer id is needed first (allocated outside the lock).
    NeedProducerId,
    /// The new epoch (or producer id) is appended: wait for it.
    Write(i32, i32, TxnTransit, PendingWrite),
    /// An ongoing transaction is being fenced: its abort is appended.
    Fence(i32, i32, TxnTransit, PendingWrite),
}

/// What EndTxn does next, decided under the state lock.
enum EndStep {
    /// Answered without a write.
    Done(ProducerIdAndEpoch),
    /// A fresh producer id is needed first (epoch overflow with transaction.version 2).
    NeedProducerId,
    /// PrepareCommit/PrepareAbort is appended: wait for it, then send the markers.
    Write(i32, i32, TxnTransit, PendingWrite),
}

/// Marker sending retries back off from this to [`MAX_RETRY_BACKOFF`].
const RETRY_BACKOFF: Duration = Duration::from_millis(100);
const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(1);

/// The transaction coordinator of this broker (the partitions of `__transaction_state` it
/// leads). Shared as `Arc`: marker sending runs as tasks that hold it.
pub struct TransactionCoordinator {
    /// Settings.
    pub config: TransactionConfig,
    runtime: CoordinatorRuntime<()>,
    services: Arc<dyn TransactionServices>,
    state: Mutex<HashMap<i32, TxnPartitionState>>,
}

/// How a write's failure is answered: Kafka's `appendTransactionToLog` mapping (a batch too
/// large is UNKNOWN_SERVER_ERROR here, not INVALID_COMMIT_OFFSET_SIZE as for groups).
fn write_error(e: &crate::CoordinatorError) -> ErrorCode {
    match e.error_code() {
        ErrorCode::InvalidCommitOffsetSize => ErrorCode::UnknownServerError,
        c => c,
    }
}

impl TransactionCoordinator {
    /// A coordinator with no partitions loaded.
    pub fn new(
        config: TransactionConfig,
        writer: Arc<dyn PartitionWriter>,
        services: Arc<dyn TransactionServices>,
        clock: SharedClock,
    ) -> Arc<Self> {
        let runtime = CoordinatorRuntime::new(
            TRANSACTION_STATE_TOPIC_NAME,
            writer,
            clock,
            config.request_timeout_ms,
        );
        Arc::new(Self {
            config,
            runtime,
            services,
            state: Mutex::new(HashMap::new()),
        })
    }

    /// The runtime (partitions, writes).
    pub fn runtime(&self) -> &CoordinatorRuntime<()> {
        &self.runtime
    }

    fn now_ms(&self) -> i64 {
        self.runtime.now_ms()
    }

    /// The partition of `__transaction_state` that holds `transactional_id`:
    /// `Utils.abs(transactionalId.hashCode) % transaction.state.log.num.partitions`.
    pub fn partition_for(&self, transactional_id: &str) -> i32 {
        let h = java_string_hash_code(transactional_id);
        let abs = if h == i32::MIN { 0 } else { h.abs() };
        abs % self.config.state_log_num_partitions
    }

    /// Whether `timeout_ms` is a valid `transaction.timeout.ms` (1 ..= max).
    pub fn validate_transaction_timeout_ms(&self, timeout_ms: i32) -> bool {
        timeout_ms > 0 && timeout_ms <= self.config.transaction_max_timeout_ms
    }

    /// The loaded partition of `transactional_id` and its coordinator epoch.
    fn lookup(
        &self,
        st: &HashMap<i32, TxnPartitionState>,
        transactional_id: &str,
    ) -> Result<(i32, i32), ErrorCode> {
        let p = self.partition_for(transactional_id);
        self.runtime.check_active(p).map_err(|e| e.error_code())?;
        match st.get(&p) {
            Some(ps) => Ok((p, ps.coordinator_epoch)),
            None => Err(ErrorCode::NotCoordinator),
        }
    }

    fn log_value_version(&self) -> i16 {
        if self.services.transaction_version() >= 1 {
            records::TRANSACTION_LOG_VALUE_VERSION
        } else {
            0
        }
    }

    fn record(&self, transactional_id: &str, transit: &TxnTransit) -> CoordinatorRecord {
        let value = (transit.state != TransactionState::Dead)
            .then(|| records::value(&transit.to_log_value(), self.log_value_version()));
        (records::key(transactional_id), value)
    }

    /// Appends `transit` (under the state lock, so records are written in state order).
    fn append(
        &self,
        partition: i32,
        transactional_id: &str,
        transit: &TxnTransit,
    ) -> Result<PendingWrite, ErrorCode> {
        self.runtime
            .append(partition, &[self.record(transactional_id, transit)])
            .map_err(|e| write_error(&e))
    }

    /// Waits for `write` and completes `transit` on `transactional_id` if the coordinator
    /// epoch is still `coordinator_epoch` (Kafka's `appendTransactionToLog` callback). On a
    /// failed write the pending state is dropped, except for COORDINATOR_NOT_AVAILABLE when
    /// `keep_pending_on_unavailable` (the caller retries the same transition).
    async fn finish_write(
        &self,
        partition: i32,
        coordinator_epoch: i32,
        transactional_id: &str,
        transit: &TxnTransit,
        write: PendingWrite,
        keep_pending_on_unavailable: bool,
    ) -> Result<(), ErrorCode> {
        let committed = self
            .runtime
            .committed(write)
            .await
            .map_err(|e| write_error(&e));
        let mut st = self.state.lock();
        let Some(ps) = st
            .get_mut(&partition)
            .filter(|ps| ps.coordinator_epoch == coordinator_epoch)
        else {
            return Err(ErrorCode::NotCoordinator);
        };
        let Some(md) = ps.txns.get_mut(transactional_id) else {
            return Err(ErrorCode::NotCoordinator);
        };
        match committed {
            Ok(()) => {
                if transit.state == TransactionState::Dead {
                    if md.pending_state == Some(TransactionState::Dead) {
                        ps.txns.remove(transactional_id);
                    }
                    return Ok(());
                }
                md.complete_transition(transit).map_err(|e| {
                    warn!(error = %e, "transaction state transition failed");
                    ErrorCode::UnknownServerError
                })
            }
            Err(code) => {
                if !(keep_pending_on_unavailable && code == ErrorCode::CoordinatorNotAvailable) {
                    md.pending_state = None;
                }
                info!(transactional_id, %code, to = %transit.state, "writing the transaction state failed");
                Err(code)
            }
        }
    }

    /// InitProducerId with a transactional id (Kafka's `handleInitProducerId`): a new id gets
    /// a producer id from the allocator and epoch 0; an existing one has its epoch bumped,
    /// which fences older producer instances; `expected` is KIP-360's (producer id, epoch) of
    /// a producer recovering from an error. An ongoing transaction is fenced and aborted
    /// first and the producer gets CONCURRENT_TRANSACTIONS (it retries). When the epoch is
    /// exhausted the id moves to a new producer id.
    ///
    /// Errors: INVALID_REQUEST (empty id), INVALID_TRANSACTION_TIMEOUT, NOT_COORDINATOR,
    /// COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS, PRODUCER_FENCED,
    /// COORDINATOR_NOT_AVAILABLE (the write was not committed in time).
    pub async fn init_producer_id(
        self: &Arc<Self>,
        transactional_id: &str,
        transaction_timeout_ms: i32,
        expected: Option<(i64, i16)>,
    ) -> ProducerIdAndEpoch {
        if transactional_id.is_empty() {
            return ProducerIdAndEpoch::error(ErrorCode::InvalidRequest);
        }
        if !self.validate_transaction_timeout_ms(transaction_timeout_ms) {
            return ProducerIdAndEpoch::error(ErrorCode::InvalidTransactionTimeout);
        }
        let mut fresh_producer_id: Option<i64> = None;
        // At most: allocate for a new id, then for an exhausted epoch.
        for _ in 0..3 {
            let step = self.prepare_init(
                transactional_id,
                transaction_timeout_ms,
                expected,
                &mut fresh_producer_id,
            );
            match step {
                Err(code) => return ProducerIdAndEpoch::error(code),
                Ok(InitStep::NeedProducerId) => match self.services.generate_producer_id().await {
                    Ok(pid) => fresh_producer_id = Some(pid),
                    Err(code) => return ProducerIdAndEpoch::error(code),
                },
                Ok(InitStep::Write(p, ce, transit, write)) => {
                    return match self
                        .finish_write(p, ce, transactional_id, &transit, write, false)
                        .await
                    {
                        Ok(()) => {
                            info!(
                                transactional_id,
                                producer_id = transit.producer_id,
                                producer_epoch = transit.producer_epoch,
                                partition = p,
                                "initialized transactional id"
                            );
                            ProducerIdAndEpoch::ok(transit.producer_id, transit.producer_epoch)
                        }
                        Err(code) => ProducerIdAndEpoch::error(code),
                    };
                }
                Ok(InitStep::Fence(p, ce, abort, write)) => {
                    let r = self
                        .after_prepare_written(p, ce, transactional_id, abort, write, false)
                        .await;
                    return ProducerIdAndEpoch::error(if r.error == ErrorCode::None {
                        ErrorCode::ConcurrentTransactions
                    } else {
                        r.error
                    });
                }
            }
        }
        ProducerIdAndEpoch::error(ErrorCode::ConcurrentTransactions)
    }

    /// InitProducerId's checks and transition under the state lock, with its append; a new
    /// producer id is taken from `fresh_producer_id` (NeedProducerId when there is none).
    fn prepare_init(
        &self,
        transactional_id: &str,
        transaction_timeout_ms: i32,
        expected: Option<(i64, i16)>,
        fresh_producer_id: &mut Option<i64>,
    ) -> Result<InitStep, ErrorCode> {
        let mut st = self.state.lock();
        let (p, ce) = self.lookup(&st, transactional_id)?;
        let now = self.now_ms();
        let ps = st.get_mut(&p).ok_or(ErrorCode::NotCoordinator)?;
        if !ps.txns.contains_key(transactional_id) {
            let Some(pid) = fresh_producer_id.take() else {
                return Ok(InitStep::NeedProducerId);
            };
            ps.txns.insert(
                transactional_id.to_string(),
                TransactionMetadata::new(transactional_id, pid, transaction_timeout_ms, now),
            );
        }
        let md = ps
            .txns
            .get_mut(transactional_id)
            .ok_or(ErrorCode::NotCoordinator)?;
        if md.pending_transition_in_progress() {
            return Err(ErrorCode::ConcurrentTransactions);
        }
        if let Some((pid, epoch)) = expected {
            let valid = md.producer_epoch == metadata::NO_PRODUCER_EPOCH
                || pid == md.producer_id
                || (pid == md.previous_producer_id && metadata::is_epoch_exhausted(epoch));
            if !valid {
                return Err(ErrorCode::ProducerFenced);
            }
        }
        let illegal = |e: metadata::IllegalTransition| {
            warn!(error = %e, "InitProducerId");
            ErrorCode::UnknownServerError
        };
        let transit = match md.state {
            TransactionState::PrepareAbort | TransactionState::PrepareCommit => {
                return Err(ErrorCode::ConcurrentTransactions)
            }
            TransactionState::CompleteAbort
            | TransactionState::CompleteCommit
            | TransactionState::Empty => {
                if md.is_producer_epoch_exhausted()
                    && expected.is_none_or(|(_, e)| e == md.producer_epoch)
                {
                    let Some(pid) = fresh_producer_id.take() else {
                        return Ok(InitStep::NeedProducerId);
                    };
                    md.prepare_producer_id_rotation(
                        pid,
                        transaction_timeout_ms,
                        now,
                        expected.is_some(),
                    )
                    .map_err(illegal)?
                } else {
                    match md
                        .prepare_increment_producer_epoch(
                            transaction_timeout_ms,
                            expected.map(|(_, e)| e),
                            now,
                        )
                        .map_err(illegal)?
                    {
                        Ok(t) => t,
                        Err(()) => return Err(ErrorCode::ProducerFenced),
                    }
                }
            }
            TransactionState::Ongoing => {
                // Fence the producer and abort its transaction; this epoch is never
                // handed out: the client retries and bumps again.
                let fence = md.prepare_fence_producer_epoch().map_err(illegal)?;
                let abort = Self::prepare_fenced_abort(md, &fence, now).map_err(illegal)?;
                let write = match self.append(p, transactional_id, &abort) {
                    Ok(w) => w,
                    Err(code) => {
                        md.pending_state = None;
                        md.has_failed_epoch_fence = true;
                        return Err(code);
                    }
                };
                return Ok(InitStep::Fence(p, ce, abort, write));
            }
            TransactionState::Dead | TransactionState::PrepareEpochFence => {
                warn!(
                    transactional_id,
                    state = %md.state,
                    "InitProducerId found an illegal current state"
                );
                return Err(ErrorCode::UnknownServerError);
            }
        };
        match self.append(p, transactional_id, &transit) {
            Ok(w) => Ok(InitStep::Write(p, ce, transit, w)),
            Err(code) => {
                md.pending_state = None;
                Err(code)
            }
        }
    }

    /// Turns a prepared epoch fence into PrepareAbort at the fenced epoch (Kafka's
    /// `endTransaction` with `isEpochFence`): the abort markers carry the bumped epoch, so
    /// the fenced producer's late writes are refused; no second bump.
    fn prepare_fenced_abort(
        md: &mut TransactionMetadata,
        fence: &TxnTransit,
        now: i64,
    ) -> Result<TxnTransit, metadata::IllegalTransition> {
        md.pending_state = None;
        md.producer_epoch = fence.producer_epoch;
        md.last_producer_epoch = metadata::NO_PRODUCER_EPOCH;
        md.prepare_abort_or_commit(
            TransactionState::PrepareAbort,
            0,
            metadata::NO_PRODUCER_ID,
            now,
            false,
        )
    }

    /// AddPartitionsToTxn v0-v3 from a client, v4+ from a partition leader adding a partition
    /// to a transaction (`transaction.version` 2, KIP-890 part 2), and AddOffsetsToTxn (the
    /// group's `__consumer_offsets` partition): Ongoing with these partitions, written before
    /// the answer. `client_transaction_version` is 2 for the implicit add of KIP-890.
    ///
    /// Errors: INVALID_REQUEST, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
    /// INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED, CONCURRENT_TRANSACTIONS,
    /// COORDINATOR_NOT_AVAILABLE.
    pub async fn add_partitions(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &BTreeSet<TxnPartition>,
        client_transaction_version: i16,
    ) -> ErrorCode {
        if transactional_id.is_empty() {
            return ErrorCode::InvalidRequest;
        }
        let prepared = self.prepare_add(
            transactional_id,
            producer_id,
            producer_epoch,
            partitions,
            client_transaction_version,
        );
        match prepared {
            Err(code) => code,
            Ok((p, ce, transit, write)) => {
                match self
                    .finish_write(p, ce, transactional_id, &transit, write, false)
                    .await
                {
                    Ok(()) => ErrorCode::None,
                    Err(code) => code,
                }
            }
        }
    }

    /// AddPartitionsToTxn's checks and transition under the state lock, with its append;
    /// `Err(NONE)` when the partitions are already in the transaction.
    fn prepare_add(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &BTreeSet<TxnPartition>,
        client_transaction_version: i16,
    ) -> Result<(i32, i32, TxnTransit, PendingWrite), ErrorCode> {
        let mut st = self.state.lock();
        let (p, ce) = self.lookup(&st, transactional_id)?;
        let now = self.now_ms();
        let md = st
            .get_mut(&p)
            .and_then(|ps| ps.txns.get_mut(transactional_id))
            .ok_or(ErrorCode::InvalidProducerIdMapping)?;
        if md.producer_id != producer_id {
            return Err(ErrorCode::InvalidProducerIdMapping);
        }
        if md.producer_epoch != producer_epoch {
            return Err(ErrorCode::ProducerFenced);
        }
        if md.pending_transition_in_progress()
            || matches!(
                md.state,
                TransactionState::PrepareCommit | TransactionState::PrepareAbort
            )
        {
            return Err(ErrorCode::ConcurrentTransactions);
        }
        if md.state == TransactionState::Ongoing && partitions.is_subset(&md.partitions) {
            return Err(ErrorCode::None);
        }
        let transit = md
            .prepare_add_partitions(partitions, now, client_transaction_version)
            .map_err(|e| {
                warn!(error = %e, "AddPartitionsToTxn");
                ErrorCode::UnknownServerError
            })?;
        match self.append(p, transactional_id, &transit) {
            Ok(w) => Ok((p, ce, transit, w)),
            Err(code) => {
                md.pending_state = None;
                Err(code)
            }
        }
    }

    /// AddPartitionsToTxn v4+ with `VerifyOnly` (KIP-890 part 1): whether each partition is
    /// already in the producer's ongoing transaction (NONE) or not (TRANSACTION_ABORTABLE).
    /// Errors for the whole transaction (every partition gets it): INVALID_REQUEST,
    /// NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, INVALID_PRODUCER_ID_MAPPING,
    /// PRODUCER_FENCED, CONCURRENT_TRANSACTIONS.
    pub fn verify_partitions(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[TxnPartition],
    ) -> Vec<(TxnPartition, ErrorCode)> {
        let all = |code: ErrorCode| partitions.iter().map(|tp| (tp.clone(), code)).collect();
        if transactional_id.is_empty() {
            return all(ErrorCode::InvalidRequest);
        }
        let st = self.state.lock();
        let p = match self.lookup(&st, transactional_id) {
            Ok((p, _)) => p,
            Err(code) => return all(code),
        };
        let Some(md) = st.get(&p).and_then(|ps| ps.txns.get(transactional_id)) else {
            return all(ErrorCode::InvalidProducerIdMapping);
        };
        if md.producer_id != producer_id {
            return all(ErrorCode::InvalidProducerIdMapping);
        }
        if md.producer_epoch != producer_epoch {
            return all(ErrorCode::ProducerFenced);
        }
        if matches!(
            md.state,
            TransactionState::PrepareCommit | TransactionState::PrepareAbort
        ) {
            return all(ErrorCode::ConcurrentTransactions);
        }
        partitions
            .iter()
            .map(|tp| {
                let code = if md.partitions.contains(tp) {
                    ErrorCode::None
                } else {
                    ErrorCode::TransactionAbortable
                };
                (tp.clone(), code)
            })
            .collect()
    }

    /// EndTxn (Kafka's `handleEndTransaction`): writes PrepareCommit/PrepareAbort, answers
    /// once it is committed, and then sends the markers. `client_transaction_version` is 2
    /// for EndTxn v5+ (KIP-890 part 2: the epoch is bumped with every transaction and the
    /// answer carries the producer id and epoch for the next one), else 0. A retry of a
    /// completed commit (abort) answers NONE.
    ///
    /// Errors: INVALID_REQUEST, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
    /// INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED, CONCURRENT_TRANSACTIONS, INVALID_TXN_STATE,
    /// COORDINATOR_NOT_AVAILABLE.
    pub async fn end_transaction(
        self: &Arc<Self>,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        client_transaction_version: i16,
    ) -> ProducerIdAndEpoch {
        if transactional_id.is_empty() {
            return ProducerIdAndEpoch::error(ErrorCode::InvalidRequest);
        }
        let mut next_producer_id: Option<i64> = None;
        for _ in 0..2 {
            let step = self.prepare_end(
                transactional_id,
                producer_id,
                producer_epoch,
                commit,
                client_transaction_version,
                next_producer_id,
            );
            match step {
                EndStep::Done(r) => return r,
                EndStep::NeedProducerId => match self.services.generate_producer_id().await {
                    Ok(id) => next_producer_id = Some(id),
                    Err(code) => return ProducerIdAndEpoch::error(code),
                },
                EndStep::Write(p, ce, transit, write) => {
                    return self
                        .after_prepare_written(p, ce, transactional_id, transit, write, true)
                        .await;
                }
            }
        }
        ProducerIdAndEpoch::error(ErrorCode::ConcurrentTransactions)
    }

    /// EndTxn's checks and transition under the state lock, with its append (Kafka's
    /// `endTransaction` before the append); `next_producer_id` is a fresh id for an
    /// exhausted epoch with transaction.version 2 (NeedProducerId when there is none).
    fn prepare_end(
        &self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        client_transaction_version: i16,
        next_producer_id: Option<i64>,
    ) -> EndStep {
        let err = |c| EndStep::Done(ProducerIdAndEpoch::error(c));
        let mut st = self.state.lock();
        let (p, ce) = match self.lookup(&st, transactional_id) {
            Ok(x) => x,
            Err(c) => return err(c),
        };
        let now = self.now_ms();
        let Some(md) = st
            .get_mut(&p)
            .and_then(|ps| ps.txns.get_mut(transactional_id))
        else {
            return err(ErrorCode::InvalidProducerIdMapping);
        };
        // KIP-890 part 2: with transaction.version 2 every EndTxn bumps the epoch, so a
        // retry comes with the epoch before the bump; Kafka's table of what EndTxn answers
        // in Empty/CompleteAbort/CompleteCommit (KAFKA-14563): a retry of the completed
        // result is NONE, an abort with the current epoch is an *empty abort* (the
        // client cannot know whether a leader added a partition), anything else
        // INVALID_TXN_STATE.
        let v2 = metadata::supports_epoch_bump(md.client_transaction_version);
        let request_v2 = metadata::supports_epoch_bump(client_transaction_version);
        let retry_on_overflow = v2
            && md.previous_producer_id == producer_id
            && producer_epoch == i16::MAX - 1
            && md.producer_epoch == 0;
        let retry_on_epoch_bump =
            v2 && i32::from(md.producer_epoch) == i32::from(producer_epoch) + 1;
        let current_epoch = producer_epoch == md.producer_epoch;
        let valid_epoch = if v2 {
            match md.state {
                TransactionState::Ongoing
                | TransactionState::Empty
                | TransactionState::Dead
                | TransactionState::PrepareEpochFence => current_epoch,
                TransactionState::PrepareCommit | TransactionState::PrepareAbort => {
                    retry_on_epoch_bump
                }
                TransactionState::CompleteCommit | TransactionState::CompleteAbort => {
                    retry_on_epoch_bump || retry_on_overflow || current_epoch
                }
            }
        } else {
            current_epoch
        };
        // With transaction.version < 2 the epoch check above makes every call on a
        // completed transaction a retry.
        let is_retry = !v2 || retry_on_epoch_bump || retry_on_overflow;
        if md.producer_id != producer_id && !retry_on_overflow {
            return err(ErrorCode::InvalidProducerIdMapping);
        }
        // Pending first (KAFKA-18464): an abort right after a commit waits for it
        // rather than fencing the producer.
        if md.pending_transition_in_progress() {
            return err(ErrorCode::ConcurrentTransactions);
        }
        if !valid_epoch {
            return err(ErrorCode::ProducerFenced);
        }
        let current = || EndStep::Done(ProducerIdAndEpoch::ok(md.producer_id, md.producer_epoch));
        let invalid = || {
            debug!(transactional_id, state = %md.state, commit, "EndTxn in a state that does not allow it");
            err(ErrorCode::InvalidTxnState)
        };
        let mut empty_abort = false;
        match md.state {
            TransactionState::Ongoing => {}
            TransactionState::CompleteCommit if commit => {
                return if is_retry { current() } else { invalid() }
            }
            TransactionState::CompleteAbort if !commit && is_retry => return current(),
            TransactionState::CompleteCommit
            | TransactionState::CompleteAbort
            | TransactionState::Empty
                if !commit && request_v2 && current_epoch && !(v2 && is_retry) =>
            {
                empty_abort = true;
            }
            TransactionState::PrepareCommit if commit => {
                return err(ErrorCode::ConcurrentTransactions)
            }
            TransactionState::PrepareAbort if !commit => {
                return err(ErrorCode::ConcurrentTransactions)
            }
            _ => return invalid(),
        }
        let bump = request_v2;
        let next = if bump && md.is_producer_epoch_exhausted() {
            match next_producer_id {
                Some(id) => id,
                None => return EndStep::NeedProducerId,
            }
        } else {
            metadata::NO_PRODUCER_ID
        };
        let target = if commit {
            TransactionState::PrepareCommit
        } else {
            TransactionState::PrepareAbort
        };
        let transit = match md.prepare_abort_or_commit(
            target,
            client_transaction_version,
            next,
            now,
            empty_abort,
        ) {
            Ok(t) => t,
            Err(e) => {
                warn!(error = %e, "EndTxn");
                return err(ErrorCode::UnknownServerError);
            }
        };
        match self.append(p, transactional_id, &transit) {
            Ok(w) => EndStep::Write(p, ce, transit, w),
            Err(code) => {
                md.pending_state = None;
                err(code)
            }
        }
    }

    /// After PrepareCommit/PrepareAbort was appended: waits for it, prepares the completion
    /// and starts the marker sender. Returns what EndTxn answers.
    async fn after_prepare_written(
        self: &Arc<Self>,
        partition: i32,
        coordinator_epoch: i32,
        transactional_id: &str,
        transit: TxnTransit,
        write: PendingWrite,
        from_client: bool,
    ) -> ProducerIdAndEpoch {
        let commit = transit.state == TransactionState::PrepareCommit;
        let fence = !from_client;
        if let Err(code) = self
            .finish_write(
                partition,
                coordinator_epoch,
                transactional_id,
                &transit,
                write,
                false,
            )
            .await
        {
            if fence {
                let mut st = self.state.lock();
                if let Some(md) = st
                    .get_mut(&partition)
                    .filter(|ps| ps.coordinator_epoch == coordinator_epoch)
                    .and_then(|ps| ps.txns.get_mut(transactional_id))
                {
                    md.has_failed_epoch_fence = true;
                }
            }
            return ProducerIdAndEpoch::error(code);
        }
        let started = {
            let mut st = self.state.lock();
            let Some(md) = st
                .get_mut(&partition)
                .filter(|ps| ps.coordinator_epoch == coordinator_epoch)
                .and_then(|ps| ps.txns.get_mut(transactional_id))
            else {
                return ProducerIdAndEpoch::error(ErrorCode::NotCoordinator);
            };
            if md.pending_transition_in_progress() {
                return ProducerIdAndEpoch::error(ErrorCode::ConcurrentTransactions);
            }
            let complete = match md.prepare_complete(self.now_ms()) {
                Ok(t) => t,
                Err(e) => {
                    warn!(error = %e, "completing a transaction");
                    return ProducerIdAndEpoch::error(ErrorCode::UnknownServerError);
                }
            };
            let answer = if md.next_producer_id != metadata::NO_PRODUCER_ID {
                ProducerIdAndEpoch::ok(md.next_producer_id, 0)
            } else {
                ProducerIdAndEpoch::ok(md.producer_id, md.producer_epoch)
            };
            let markers = MarkerRequest {
                producer_id: md.producer_id,
                producer_epoch: md.producer_epoch,
                commit,
                coordinator_epoch,
                partitions: md.partitions.iter().cloned().collect(),
            };
            (answer, markers, complete)
        };
        let (answer, markers, complete) = started;
        self.spawn_marker_sender(partition, transactional_id.to_string(), markers, complete);
        answer
    }

    fn spawn_marker_sender(
        self: &Arc<Self>,
        partition: i32,
        transactional_id: String,
        markers: MarkerRequest,
        complete: TxnTransit,
    ) {
        let this = self.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(async move {
                    this.send_markers_and_complete(partition, &transactional_id, markers, complete)
                        .await;
                });
            }
            Err(_) => warn!(
                transactional_id,
                "no async runtime to send transaction markers on; they are sent on the next load"
            ),
        }
    }

    /// The marker sender of one transaction (Kafka's `TransactionMarkerChannelManager` and
    /// `TransactionMarkerRequestCompletionHandler`): writes the markers to the partitions
    /// still waiting for one, retrying those whose leader failed, and then writes the
    /// completion. Stops when this broker is no longer the coordinator at this epoch, or a
    /// leader answers INVALID_PRODUCER_EPOCH / TRANSACTION_COORDINATOR_FENCED (a newer
    /// producer or coordinator owns the transaction).
    async fn send_markers_and_complete(
        &self,
        partition: i32,
        transactional_id: &str,
        markers: MarkerRequest,
        complete: TxnTransit,
    ) {
        let ce = markers.coordinator_epoch;
        let mut backoff = RETRY_BACKOFF;
        // Some(remaining partitions) while this coordinator still owns the completion.
        let remaining = |st: &HashMap<i32, TxnPartitionState>| -> Option<Vec<TxnPartition>> {
            let md = st
                .get(&partition)
                .filter(|ps| ps.coordinator_epoch == ce)?
                .txns
                .get(transactional_id)?;
            (md.pending_state == Some(complete.state))
                .then(|| md.partitions.iter().cloned().collect())
        };
        loop {
            let Some(todo) = remaining(&self.state.lock()) else {
                info!(
                    transactional_id,
                    "no longer the coordinator at this epoch; markers cancelled"
                );
                return;
            };
            if todo.is_empty() {
                break;
            }
            let results = self
                .services
                .send_markers(MarkerRequest {
                    partitions: todo,
                    ..markers.clone()
                })
                .await;
            let mut retry = false;
            {
                let mut st = self.state.lock();
                if remaining(&st).is_none() {
                    info!(
                        transactional_id,
                        "no longer the coordinator at this epoch; markers cancelled"
                    );
                    return;
                }
                let Some(md) = st
                    .get_mut(&partition)
                    .and_then(|ps| ps.txns.get_mut(transactional_id))
                else {
                    return;
                };
                for (tp, code) in results {
                    match code {
                        ErrorCode::None
                        | ErrorCode::UnsupportedForMessageFormat
                        | ErrorCode::UnsupportedVersion => {
                            md.partitions.remove(&tp);
                        }
                        ErrorCode::InvalidProducerEpoch
                        | ErrorCode::TransactionCoordinatorFenced => {
                            info!(transactional_id, topic = %tp.0, partition = tp.1, %code, "transaction marker permanently refused; no more markers are sent for this transaction");
                            return;
                        }
                        ErrorCode::UnknownTopicOrPartition
                        | ErrorCode::NotLeaderOrFollower
                        | ErrorCode::NotEnoughReplicas
                        | ErrorCode::NotEnoughReplicasAfterAppend
                        | ErrorCode::RequestTimedOut
                        | ErrorCode::KafkaStorageError => {
                            debug!(transactional_id, topic = %tp.0, partition = tp.1, %code, "transaction marker failed; retrying");
                            retry = true;
                        }
                        other => {
                            // Kafka treats these as fatal (IllegalStateException); gregor logs
                            // and keeps retrying rather than leaving the transaction hanging.
                            warn!(transactional_id, topic = %tp.0, partition = tp.1, code = %other, "unexpected error writing a transaction marker; retrying");
                            retry = true;
                        }
                    }
                }
            }
            if retry {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_RETRY_BACKOFF);
            } else {
                backoff = RETRY_BACKOFF;
            }
        }
        // Every marker is written: CompleteCommit/CompleteAbort, retried while the partition
        // is unavailable (Kafka's `tryAppendToLog`).
        loop {
            let appended = {
                let st = self.state.lock();
                if remaining(&st).is_none() {
                    return;
                }
                self.append(partition, transactional_id, &complete)
            };
            let write = match appended {
                Ok(w) => w,
                Err(ErrorCode::CoordinatorNotAvailable) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_RETRY_BACKOFF);
                    continue;
                }
                Err(code) => {
                    info!(transactional_id, %code, "cannot write the transaction's completion");
                    return;
                }
            };
            match self
                .finish_write(partition, ce, transactional_id, &complete, write, true)
                .await
            {
                Ok(()) => {
                    debug!(transactional_id, state = %complete.state, "transaction completed");
                    return;
                }
                Err(ErrorCode::CoordinatorNotAvailable) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_RETRY_BACKOFF);
                }
                Err(code) => {
                    info!(transactional_id, %code, "cannot write the transaction's completion");
                    return;
                }
            }
        }
    }

    /// DescribeTransactions for one id (KIP-664).
    pub fn describe(&self, transactional_id: &str) -> DescribedTransaction {
        let mut d = DescribedTransaction {
            error: ErrorCode::None,
            state: String::new(),
            timeout_ms: 0,
            start_time_ms: -1,
            producer_id: -1,
            producer_epoch: -1,
            topics: Vec::new(),
        };
        if transactional_id.is_empty() {
            d.error = ErrorCode::InvalidRequest;
            return d;
        }
        let st = self.state.lock();
        let p = match self.lookup(&st, transactional_id) {
            Ok((p, _)) => p,
            Err(code) => {
                d.error = code;
                return d;
            }
        };
        match st.get(&p).and_then(|ps| ps.txns.get(transactional_id)) {
            Some(md) if md.state != TransactionState::Dead => {
                d.state = md.state.name().to_string();
                d.timeout_ms = md.txn_timeout_ms;
                d.start_time_ms = md.txn_start_timestamp_ms;
                d.producer_id = md.producer_id;
                d.producer_epoch = md.producer_epoch;
                for (t, p) in &md.partitions {
                    match d.topics.last_mut() {
                        Some((last, ids)) if last == t => ids.push(*p),
                        _ => d.topics.push((t.clone(), vec![*p])),
                    }
                }
            }
            _ => d.error = ErrorCode::TransactionalIdNotFound,
        }
        d
    }

    /// ListTransactions (KIP-664): the transactions of every partition loaded here, filtered;
    /// the state filters gregor does not know are returned apart. COORDINATOR_LOAD_IN_PROGRESS
    /// while a partition loads; INVALID_REQUEST for a pattern that is not a regular expression.
    pub fn list(
        &self,
        filters: &ListFilters,
    ) -> Result<(Vec<ListedTransaction>, Vec<String>), ErrorCode> {
        let loading = self
            .runtime
            .partitions()
            .into_iter()
            .any(|p| self.runtime.status(p) == Some(crate::runtime::PartitionStatus::Loading));
        if loading {
            return Err(ErrorCode::CoordinatorLoadInProgress);
        }
        let mut states = Vec::new();
        let mut unknown = Vec::new();
        for s in &filters.states {
            match TransactionState::from_name(s) {
                Some(st) => states.push(st),
                None => unknown.push(s.clone()),
            }
        }
        let pattern = match &filters.transactional_id_pattern {
            Some(p) if !p.is_empty() => Some(
                regex::Regex::new(&format!("^(?:{p})$")).map_err(|_| ErrorCode::InvalidRequest)?,
            ),
            _ => None,
        };
        let now = self.now_ms();
        let st = self.state.lock();
        let mut out = Vec::new();
        for ps in st.values() {
            for md in ps.txns.values() {
                if md.state == TransactionState::Dead
                    || (!filters.producer_ids.is_empty()
                        && !filters.producer_ids.contains(&md.producer_id))
                    || (!filters.states.is_empty() && !states.contains(&md.state))
                    || (filters.duration_ms >= 0
                        && now.saturating_sub(md.txn_start_timestamp_ms) <= filters.duration_ms)
                    || pattern
                        .as_ref()
                        .is_some_and(|re| !re.is_match(&md.transactional_id))
                {
                    continue;
                }
                out.push(ListedTransaction {
                    transactional_id: md.transactional_id.clone(),
                    producer_id: md.producer_id,
                    state: md.state.name().to_string(),
                });
            }
        }
        out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        Ok((out, unknown))
    }

    /// Fences and aborts every transaction open longer than its `transaction.timeout.ms`
    /// (Kafka's `abortTimedOutTransactions`); returns how many aborts were written. Their
    /// markers are sent by tasks.
    pub async fn abort_timed_out_transactions(self: &Arc<Self>) -> usize {
        let now = self.now_ms();
        let timed_out: Vec<(String, i64)> = {
            let st = self.state.lock();
            st.values()
                .flat_map(|ps| ps.txns.values())
                .filter(|md| {
                    !md.pending_transition_in_progress()
                        && md.state == TransactionState::Ongoing
                        && md
                            .txn_start_timestamp_ms
                            .saturating_add(i64::from(md.txn_timeout_ms))
                            < now
                })
                .map(|md| (md.transactional_id.clone(), md.producer_id))
                .collect()
        };
        let mut aborted = 0;
        for (id, producer_id) in timed_out {
            let prepared = {
                let mut st = self.state.lock();
                let Ok((p, ce)) = self.lookup(&st, &id) else {
                    continue;
                };
                let Some(md) = st.get_mut(&p).and_then(|ps| ps.txns.get_mut(&id)) else {
                    continue;
                };
                if md.producer_id != producer_id
                    || md.pending_transition_in_progress()
                    || md.state != TransactionState::Ongoing
                {
                    continue;
                }
                let abort = md
                    .prepare_fence_producer_epoch()
                    .and_then(|fence| Self::prepare_fenced_abort(md, &fence, self.now_ms()));
                let abort = match abort {
                    Ok(a) => a,
                    Err(e) => {
                        warn!(error = %e, "aborting a timed-out transaction");
                        md.pending_state = None;
                        continue;
                    }
                };
                match self.append(p, &id, &abort) {
                    Ok(w) => (p, ce, abort, w),
                    Err(code) => {
                        md.pending_state = None;
                        md.has_failed_epoch_fence = true;
                        warn!(transactional_id = id, %code, "cannot abort a timed-out transaction");
                        continue;
                    }
                }
            };
            let (p, ce, abort, write) = prepared;
            let r = self
                .after_prepare_written(p, ce, &id, abort, write, false)
                .await;
            if r.error == ErrorCode::None {
                info!(
                    transactional_id = id,
                    "aborted a transaction that exceeded its transaction.timeout.ms"
                );
                aborted += 1;
            }
        }
        aborted
    }

    /// Removes transactional ids without a transaction that were not updated for
    /// `transactional.id.expiration.ms` (tombstones, Kafka's `removeExpiredTransactionalIds`);
    /// returns how many were removed.
    pub async fn remove_expired_transactional_ids(&self) -> usize {
        let now = self.now_ms();
        let expiration = self.config.transactional_id_expiration_ms;
        let mut writes = Vec::new();
        {
            let mut st = self.state.lock();
            for (p, ps) in st.iter_mut() {
                if self.runtime.check_active(*p).is_err() {
                    continue;
                }
                let mut ids = Vec::new();
                let mut recs = Vec::new();
                for md in ps.txns.values_mut() {
                    if md.pending_transition_in_progress()
                        || !md.state.is_expiration_allowed()
                        || md.txn_last_update_timestamp_ms > now.saturating_sub(expiration)
                    {
                        continue;
                    }
                    if let Ok(t) = md.prepare_dead() {
                        recs.push(self.record(&md.transactional_id, &t));
                        ids.push((md.transactional_id.clone(), t));
                    }
                }
                if ids.is_empty() {
                    continue;
                }
                match self.runtime.append(*p, &recs) {
                    Ok(w) => writes.push((*p, ps.coordinator_epoch, ids, w)),
                    Err(e) => {
                        warn!(partition = p, error = %e, "cannot write tombstones of expired transactional ids");
                        for (id, _) in ids {
                            if let Some(md) = ps.txns.get_mut(&id) {
                                md.pending_state = None;
                            }
                        }
                    }
                }
            }
        }
        let mut removed = 0;
        for (p, ce, ids, write) in writes {
            for (id, t) in &ids {
                if self.finish_write(p, ce, id, t, write, false).await.is_ok() {
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            info!(
                removed,
                "removed expired transactional ids (transactional.id.expiration.ms)"
            );
        }
        removed
    }

    /// Runs the timed-out transaction aborts and the expiration of transactional ids at
    /// their intervals until `shutdown` changes.
    pub async fn run_periodic(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let ms = |v: i64| Duration::from_millis(u64::try_from(v.max(1)).unwrap_or(u64::MAX));
        let mut abort = tokio::time::interval(ms(self
            .config
            .abort_timed_out_transaction_cleanup_interval_ms));
        let mut expire = tokio::time::interval(ms(self
            .config
            .remove_expired_transaction_cleanup_interval_ms));
        abort.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        expire.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = abort.tick() => { self.abort_timed_out_transactions().await; }
                _ = expire.tick() => { self.remove_expired_transactional_ids().await; }
                _ = shutdown.changed() => return,
            }
        }
    }

    /// Called when this broker becomes the leader of `partition` of `__transaction_state` at
    /// `leader_epoch` (the coordinator epoch): its transactional ids are rebuilt from its
    /// records, and the transactions found in PrepareCommit/PrepareAbort have their markers
    /// sent again. Requests get COORDINATOR_LOAD_IN_PROGRESS meanwhile. A repeated call with
    /// the same epoch does nothing; a new epoch reloads.
    pub fn on_became_leader(self: &Arc<Self>, partition: i32, leader_epoch: i32) {
        {
            let st = self.state.lock();
            if st
                .get(&partition)
                .is_some_and(|ps| ps.coordinator_epoch == leader_epoch)
            {
                return;
            }
        }
        self.runtime.unload(partition);
        self.state.lock().remove(&partition);
        if !self.runtime.begin_load(partition) {
            return;
        }
        let started = std::time::Instant::now();
        let mut txns: HashMap<String, TransactionMetadata> = HashMap::new();
        let summary = self.runtime.replay(partition, |key, value| {
            let id = match records::decode_key(key) {
                Ok(records::TransactionLogKey::Transaction { transactional_id }) => {
                    transactional_id
                }
                Ok(records::TransactionLogKey::Unknown(v)) => {
                    debug!(version = v, "skipping a {TRANSACTION_STATE_TOPIC_NAME} key of an unknown version");
                    return;
                }
                Err(e) => {
                    warn!(error = %e, "skipping an undecodable {TRANSACTION_STATE_TOPIC_NAME} key");
                    return;
                }
            };
            match value {
                None => {
                    txns.remove(&id);
                }
                Some(v) => match records::decode_value(v) {
                    Ok(v) => {
                        txns.insert(id.clone(), TransactionMetadata::from_log_value(&id, &v));
                    }
                    Err(e) => {
                        warn!(transactional_id = id, error = %e, "skipping an undecodable {TRANSACTION_STATE_TOPIC_NAME} value")
                    }
                },
            }
        });
        if let Err(e) = summary {
            warn!(partition, error = %e, "cannot load {TRANSACTION_STATE_TOPIC_NAME}");
            self.runtime.unload(partition);
            return;
        }
        let now = self.now_ms();
        let mut to_complete = Vec::new();
        for md in txns.values_mut() {
            if matches!(
                md.state,
                TransactionState::PrepareCommit | TransactionState::PrepareAbort
            ) {
                match md.prepare_complete(now) {
                    Ok(t) => to_complete.push((
                        md.transactional_id.clone(),
                        MarkerRequest {
                            producer_id: md.producer_id,
                            producer_epoch: md.producer_epoch,
                            commit: md.state == TransactionState::PrepareCommit,
                            coordinator_epoch: leader_epoch,
                            partitions: md.partitions.iter().cloned().collect(),
                        },
                        t,
                    )),
                    Err(e) => warn!(error = %e, "completing a loaded transaction"),
                }
            }
        }
        let n = txns.len();
        self.state.lock().insert(
            partition,
            TxnPartitionState {
                coordinator_epoch: leader_epoch,
                txns,
            },
        );
        self.runtime.complete_load(partition);
        info!(
            partition,
            coordinator_epoch = leader_epoch,
            transactional_ids = n,
            completing = to_complete.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "loaded {TRANSACTION_STATE_TOPIC_NAME}"
        );
        for (id, markers, complete) in to_complete {
            self.spawn_marker_sender(partition, id, markers, complete);
        }
    }

    /// Called when this broker stops leading `partition` of `__transaction_state`: its
    /// transactional ids are dropped; marker senders of its transactions stop.
    pub fn on_resigned(&self, partition: i32) {
        self.runtime.unload(partition);
        if let Some(ps) = self.state.lock().remove(&partition) {
            info!(
                partition,
                transactional_ids = ps.txns.len(),
                "unloaded {TRANSACTION_STATE_TOPIC_NAME}"
            );
        }
    }

    /// The metadata of `transactional_id` if loaded here (tests, metrics).
    pub fn transaction(&self, transactional_id: &str) -> Option<TransactionMetadata> {
        let p = self.partition_for(transactional_id);
        self.state
            .lock()
            .get(&p)
            .and_then(|ps| ps.txns.get(transactional_id))
            .cloned()
    }
}

#[cfg(test)]
mod tests;
