//! Idempotent-producer state (Kafka's `ProducerStateManager`, KIP-98): per producer id the
//! epoch and the last five batches' sequence and offset ranges, used to reject gaps and stale
//! epochs and to answer retried batches with their original offsets.
//!
//! # Snapshot files
//!
//! `<20-digit offset>.snapshot` holds the state as of that offset (exclusive), in Kafka's own
//! format (`ProducerStateManager.writeSnapshot`, version 1), so Kafka can read gregor's snapshots
//! and vice versa. All integers big-endian:
//!
//! ```text
//! version i16 (= 1) | crc u32 (CRC-32C of every byte after this field) | count i32 |
//! count x { producer_id i64 | epoch i16 | last_sequence i32 | last_offset i64 |
//!           offset_delta i32 | timestamp i64 | coordinator_epoch i32 |
//!           current_txn_first_offset i64 }
//! ```
//!
//! Like Kafka, a snapshot keeps only the last batch of each producer; batches after the snapshot
//! are replayed from the log's batch headers on load, which restores up to five per producer.
//!
//! Transactions (KIP-98): each producer's open transaction (its first offset,
//! `current_txn_first_offset`), the open transactions of the partition by first offset
//! (`ongoing`), and the transactions a marker completed whose marker is not yet below the high
//! watermark (`unreplicated`): the first unstable offset is the smallest first offset of
//! either, and the last stable offset (LSO) is that or the high watermark, whichever is lower
//! (Kafka's `ProducerStateManager.firstUnstableOffset`). Before a producer's first
//! transactional write to the partition the leader asks the transaction coordinator (KIP-890);
//! the verification state per producer ([`VerificationStateEntry`]) holds the guard that
//! write must carry.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use gregor_protocol::batch::{BatchHeader, NO_PRODUCER_EPOCH};
use gregor_protocol::control::{EndTxnMarker, TransactionResult};

use crate::checkpoint::write_atomically;
use crate::error::{LogError, Result};
use crate::segment::file_name;
use crate::txn_index::AbortedTxn;

/// Batches remembered per producer for duplicate detection (Kafka's
/// `NUM_BATCHES_TO_RETAIN`, matching `max.in.flight.requests.per.connection` <= 5).
pub(crate) const NUM_BATCHES_TO_RETAIN: usize = 5;

const SNAPSHOT_VERSION: i16 = 1;
const SNAPSHOT_ENTRY_BYTES: usize = 46;

/// Who appends (Kafka's `AppendOrigin`): it decides how much of the producer state is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendOrigin {
    /// A producer's Produce request: duplicates, sequences, epochs and transaction state are
    /// checked; control batches are refused.
    Client,
    /// A coordinator's write to its internal topic (its batches carry no sequence): only the
    /// producer epoch and transaction state are checked.
    Coordinator,
}

/// The token that proves the transaction coordinator verified a producer's first
/// transactional write to a partition (Kafka's `VerificationGuard`, KIP-890): the leader
/// creates it before asking the coordinator, and the append must present the same one. The
/// sentinel (0) never verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VerificationGuard(u64);

impl VerificationGuard {
    /// The guard that verifies nothing (Kafka's `VerificationGuard.SENTINEL`).
    pub const SENTINEL: Self = Self(0);

    fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// Whether this is the sentinel.
    pub fn is_sentinel(self) -> bool {
        self == Self::SENTINEL
    }

    /// Kafka's `VerificationGuard.verify`: `presented` is this guard and not the sentinel.
    pub fn verify(self, presented: Self) -> bool {
        !presented.is_sentinel() && presented == self
    }
}

/// Transaction verification in progress for one producer (Kafka's `VerificationStateEntry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VerificationStateEntry {
    /// When verification started (ms): entries older than `producer.id.expiration.ms` expire.
    pub timestamp_ms: i64,
    pub guard: VerificationGuard,
    /// The lowest sequence seen while verifying: a higher one may not be written first (it
    /// would loop in OUT_OF_ORDER_SEQUENCE after the lower one's retriable error).
    pub lowest_sequence: i32,
    pub epoch: i16,
    /// Whether the producer uses transaction.version 2 (Produce v12+, KIP-890 part 2), where
    /// the coordinator bumps the epoch on every EndTxn and writes the markers with the new
    /// epoch (Kafka's `supportsEpochBump`).
    pub supports_epoch_bump: bool,
}

impl VerificationStateEntry {
    fn maybe_update_lowest_sequence_and_epoch(&mut self, sequence: i32, epoch: i16) {
        if epoch == self.epoch && sequence < self.lowest_sequence {
            self.lowest_sequence = sequence;
        }
        if epoch > self.epoch {
            self.epoch = epoch;
            self.lowest_sequence = sequence;
        }
    }
}

/// One appended batch of a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchMetadata {
    pub first_seq: i32,
    pub last_seq: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub timestamp_ms: i64,
}

/// A transaction a marker ended (Kafka's `CompletedTxn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompletedTxn {
    pub producer_id: i64,
    /// The transaction's first offset.
    pub first_offset: i64,
    /// The marker's offset.
    pub last_offset: i64,
    pub aborted: bool,
}

/// State of one producer id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProducerEntry {
    pub producer_epoch: i16,
    pub batches: VecDeque<BatchMetadata>,
    /// The coordinator epoch of the last marker, -1 before any.
    pub coordinator_epoch: i32,
    /// First offset of the open transaction, -1 when none.
    pub current_txn_first_offset: i64,
    /// Timestamp (ms) of the last batch or marker: expiry counts from it.
    pub last_timestamp_ms: i64,
}

impl ProducerEntry {
    fn empty() -> Self {
        Self {
            producer_epoch: NO_PRODUCER_EPOCH,
            batches: VecDeque::new(),
            coordinator_epoch: -1,
            current_txn_first_offset: -1,
            last_timestamp_ms: -1,
        }
    }

    fn last_seq(&self) -> i32 {
        self.batches.back().map_or(-1, |b| b.last_seq)
    }

    fn push(&mut self, b: BatchMetadata) {
        if self.batches.len() == NUM_BATCHES_TO_RETAIN {
            self.batches.pop_front();
        }
        self.batches.push_back(b);
    }

    /// Kafka's `maybeUpdateProducerEpoch`: a new epoch forgets the old epoch's batches.
    fn set_epoch(&mut self, epoch: i16) {
        if epoch != self.producer_epoch {
            self.batches.clear();
            self.producer_epoch = epoch;
        }
    }

    /// Applies a data batch without checks; returns the first offset of the transaction it
    /// opens, if it opens one.
    fn apply_data(&mut self, h: &BatchHeader) -> Option<i64> {
        self.set_epoch(h.producer_epoch);
        self.push(BatchMetadata {
            first_seq: h.base_sequence,
            last_seq: h.last_sequence(),
            first_offset: h.base_offset,
            last_offset: h.last_offset(),
            timestamp_ms: h.max_timestamp,
        });
        self.last_timestamp_ms = h.max_timestamp;
        if h.is_transactional() && self.current_txn_first_offset < 0 {
            self.current_txn_first_offset = h.base_offset;
            return Some(h.base_offset);
        }
        None
    }

    /// Applies a marker of `epoch` at `offset` without checks (Kafka's `appendEndTxnMarker`
    /// after its checks): the open transaction, if any, is completed.
    fn apply_marker(
        &mut self,
        producer_id: i64,
        epoch: i16,
        marker: EndTxnMarker,
        offset: i64,
        timestamp_ms: i64,
    ) -> Option<CompletedTxn> {
        let completed = (self.current_txn_first_offset >= 0).then_some(CompletedTxn {
            producer_id,
            first_offset: self.current_txn_first_offset,
            last_offset: offset,
            aborted: marker.result == TransactionResult::Abort,
        });
        self.set_epoch(epoch);
        self.coordinator_epoch = marker.coordinator_epoch;
        self.current_txn_first_offset = -1;
        self.last_timestamp_ms = timestamp_ms;
        completed
    }
}

fn next_sequence(last_seq: i32) -> i32 {
    if last_seq == i32::MAX {
        0
    } else {
        last_seq + 1
    }
}

/// Producer state of one partition.
pub(crate) struct ProducerStateManager {
    dir: PathBuf,
    producers: HashMap<i64, ProducerEntry>,
    /// Open transactions: first offset -> producer id (Kafka's `ongoingTxns`).
    ongoing: BTreeMap<i64, i64>,
    /// Completed transactions whose marker the high watermark has not passed yet: first
    /// offset -> (producer id, marker offset) (Kafka's `unreplicatedTxns`).
    unreplicated: BTreeMap<i64, (i64, i64)>,
    /// Producers whose first transactional write to the partition is being verified.
    verification: HashMap<i64, VerificationStateEntry>,
}

/// Result of checking an append against producer state.
pub(crate) enum ProducerCheck {
    /// A retry of a batch already in the log.
    Duplicate(BatchMetadata),
    /// Valid: what to install once the batches are written.
    Valid(PendingUpdate),
}

/// The producer-state change of a checked append, installed by
/// [`ProducerStateManager::commit`] once the batches are written.
pub(crate) struct PendingUpdate {
    entries: HashMap<i64, ProducerEntry>,
    /// Transactions the append opens: (first offset, producer id).
    started: Vec<(i64, i64)>,
    /// Producers that wrote transactional batches: (producer id, whether a marker, epoch).
    transactional: Vec<(i64, bool, i16)>,
    /// Transactions the append's markers complete, in order.
    completed: Vec<CompletedTxn>,
}

/// The last record of a producer with state (Kafka's `LastRecord`): what the cleaner must keep
/// so that the producer's state survives compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LastRecord {
    /// The last offset of its last data batch, `None` when its epoch has no batch (its last
    /// record is a marker, written with that epoch).
    pub last_data_offset: Option<i64>,
    /// Its current epoch.
    pub producer_epoch: i16,
}

/// A producer as DescribeProducers shows it (KIP-664).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerSummary {
    /// The producer id.
    pub producer_id: i64,
    /// Its current epoch.
    pub producer_epoch: i16,
    /// The last sequence written, -1 if none.
    pub last_sequence: i32,
    /// Timestamp (ms) of its last batch or marker, -1 if none.
    pub last_timestamp_ms: i64,
    /// The coordinator epoch of its last marker, -1 if none.
    pub coordinator_epoch: i32,
    /// First offset of its open transaction, -1 if none.
    pub current_txn_start_offset: i64,
}

impl ProducerStateManager {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            producers: HashMap::new(),
            ongoing: BTreeMap::new(),
            unreplicated: BTreeMap::new(),
            verification: HashMap::new(),
        }
    }

    /// Number of known producers.
    pub(crate) fn len(&self) -> usize {
        self.producers.len()
    }

    /// Kafka's `UnifiedLog.hasOngoingTransaction(producerId, producerEpoch)`: the producer has
    /// an open transaction here *of this epoch*. With transaction.version 2 the coordinator
    /// bumps the epoch on every EndTxn, so a write of a newer epoch while the previous
    /// transaction is still open here (its marker on its way) belongs to the next
    /// transaction, which must be verified, not taken for the open one (KAFKA-18575).
    fn has_ongoing_transaction(&self, producer_id: i64, producer_epoch: i16) -> bool {
        self.producers
            .get(&producer_id)
            .is_some_and(|e| e.current_txn_first_offset >= 0 && e.producer_epoch == producer_epoch)
    }

    /// Kafka's `UnifiedLog.maybeStartTransactionVerification`: the sentinel when the producer
    /// already has an open transaction of `epoch` here (no verification needed), else its
    /// verification guard, created on first call and kept (with the lowest sequence seen)
    /// until its first transactional write or a marker ends it, or it expires.
    /// `supports_epoch_bump` is true for transaction.version 2 producers (Produce v12+).
    ///
    /// # Errors
    /// `InvalidProducerEpoch` when `epoch` is older than the producer's epoch here (a fenced
    /// or late producer: refused before the coordinator is asked, KAFKA-19690).
    pub(crate) fn maybe_start_verification(
        &mut self,
        producer_id: i64,
        sequence: i32,
        epoch: i16,
        supports_epoch_bump: bool,
        now_ms: i64,
    ) -> Result<VerificationGuard> {
        if let Some(e) = self.producers.get(&producer_id) {
            if epoch < e.producer_epoch {
                return Err(LogError::InvalidProducerEpoch {
                    producer_id,
                    producer_epoch: epoch,
                    current_epoch: e.producer_epoch,
                });
            }
        }
        if self.has_ongoing_transaction(producer_id, epoch) {
            return Ok(VerificationGuard::SENTINEL);
        }
        let e = self
            .verification
            .entry(producer_id)
            .or_insert_with(|| VerificationStateEntry {
                timestamp_ms: now_ms,
                guard: VerificationGuard::fresh(),
                lowest_sequence: sequence,
                epoch,
                supports_epoch_bump,
            });
        e.maybe_update_lowest_sequence_and_epoch(sequence, epoch);
        Ok(e.guard)
    }

    /// Checks batches (with offsets already assigned in `headers`; `markers[i]` is the
    /// end-transaction marker of `headers[i]` when it is a control batch) as Kafka's
    /// `ProducerAppendInfo` does. From a client: a retried batch (same producer, epoch and
    /// sequence range as one of the last five) is a duplicate; a new epoch must start at
    /// sequence 0 and a known producer continue at last + 1 (wrapping at `i32::MAX`), else
    /// `OutOfOrderSequence` (a producer with no state here may start at any sequence, as in
    /// Kafka), and no sequence may pass the lowest one seen while verifying. From anyone: an
    /// older epoch is `InvalidProducerEpoch`; a transactional data batch of a producer with no
    /// open transaction needs `verification` to verify against its guard when verification is
    /// on (`Some`), else `InvalidTxnState`; a non-transactional batch while its transaction is
    /// open is `InvalidTxnState`; a marker from a coordinator epoch older than the producer's
    /// last marker's is `TransactionCoordinatorFenced`. A marker completes the producer's open
    /// transaction, if it has one (a marker of a producer with no open transaction here
    /// changes neither the LSO nor the transaction index).
    pub(crate) fn check_batches(
        &self,
        headers: &[BatchHeader],
        markers: &[Option<EndTxnMarker>],
        origin: AppendOrigin,
        verification: Option<VerificationGuard>,
    ) -> Result<ProducerCheck> {
        if origin == AppendOrigin::Client {
            for h in headers
                .iter()
                .filter(|h| h.has_producer_id() && !h.is_control())
            {
                if let Some(e) = self.producers.get(&h.producer_id) {
                    if e.producer_epoch == h.producer_epoch {
                        if let Some(b) = e.batches.iter().find(|b| {
                            b.first_seq == h.base_sequence && b.last_seq == h.last_sequence()
                        }) {
                            return Ok(ProducerCheck::Duplicate(*b));
                        }
                    }
                }
            }
        }
        let mut update = PendingUpdate {
            entries: HashMap::new(),
            started: Vec::new(),
            transactional: Vec::new(),
            completed: Vec::new(),
        };
        for (i, h) in headers.iter().enumerate() {
            if !h.has_producer_id() {
                continue;
            }
            if let Some(presented) = verification {
                // Kafka's batchMissingRequiredVerification, against the state before this
                // append (`hasOngoingTransaction` of the batch's epoch); an older epoch is
                // refused first with the error a client recovers from (KAFKA-19690).
                if h.is_transactional()
                    && !h.is_control()
                    && !self.has_ongoing_transaction(h.producer_id, h.producer_epoch)
                {
                    if let Some(e) = self.producers.get(&h.producer_id) {
                        if h.producer_epoch < e.producer_epoch {
                            return Err(LogError::InvalidProducerEpoch {
                                producer_id: h.producer_id,
                                producer_epoch: h.producer_epoch,
                                current_epoch: e.producer_epoch,
                            });
                        }
                    }
                    if !self
                        .verification
                        .get(&h.producer_id)
                        .is_some_and(|v| v.guard.verify(presented))
                    {
                        return Err(LogError::InvalidTxnState(
                            "Record was not part of an ongoing transaction".into(),
                        ));
                    }
                }
            }
            let entry = update.entries.entry(h.producer_id).or_insert_with(|| {
                self.producers
                    .get(&h.producer_id)
                    .cloned()
                    .unwrap_or_else(ProducerEntry::empty)
            });
            if h.producer_epoch < entry.producer_epoch {
                return Err(LogError::InvalidProducerEpoch {
                    producer_id: h.producer_id,
                    producer_epoch: h.producer_epoch,
                    current_epoch: entry.producer_epoch,
                });
            }
            if h.is_transactional() {
                update
                    .transactional
                    .push((h.producer_id, h.is_control(), h.producer_epoch));
            }
            if h.is_control() {
                // An empty control batch (what the cleaner leaves of a removed transaction)
                // changes nothing.
                let Some(marker) = markers.get(i).copied().flatten() else {
                    continue;
                };
                if entry.coordinator_epoch > marker.coordinator_epoch {
                    return Err(LogError::TransactionCoordinatorFenced(format!(
                        "Invalid coordinator epoch for producerId {} at offset {}: {} (zombie), {} (current)",
                        h.producer_id, h.base_offset, marker.coordinator_epoch, entry.coordinator_epoch
                    )));
                }
                if let Some(c) = entry.apply_marker(
                    h.producer_id,
                    h.producer_epoch,
                    marker,
                    h.base_offset,
                    h.max_timestamp,
                ) {
                    update.completed.push(c);
                }
                continue;
            }
            if origin == AppendOrigin::Client {
                if let Some(v) = self.verification.get(&h.producer_id) {
                    if h.base_sequence > v.lowest_sequence {
                        return Err(LogError::OutOfOrderSequence {
                            producer_id: h.producer_id,
                            producer_epoch: h.producer_epoch,
                            first_sequence: h.base_sequence,
                            expected_sequence: v.lowest_sequence,
                        });
                    }
                }
                // Kafka's `ProducerAppendInfo.checkSequence`: a new epoch starts at 0, except
                // for a producer with no state here (new, or whose batches were all removed
                // by retention or DeleteRecords), which may start anywhere.
                let unknown = entry.producer_epoch == NO_PRODUCER_EPOCH;
                let expected = if h.producer_epoch != entry.producer_epoch {
                    0
                } else {
                    next_sequence(entry.last_seq())
                };
                if !unknown && h.base_sequence != expected {
                    return Err(LogError::OutOfOrderSequence {
                        producer_id: h.producer_id,
                        producer_epoch: h.producer_epoch,
                        first_sequence: h.base_sequence,
                        expected_sequence: expected,
                    });
                }
            }
            if entry.current_txn_first_offset >= 0 && !h.is_transactional() {
                return Err(LogError::InvalidTxnState(format!(
                    "Expected transactional write from producer {} at offset {}",
                    h.producer_id, h.base_offset
                )));
            }
            if let Some(first) = entry.apply_data(h) {
                update.started.push((first, h.producer_id));
            }
        }
        Ok(ProducerCheck::Valid(update))
    }

    /// Installs the update of [`ProducerStateManager::check_batches`] once its batches are
    /// written, in Kafka's order: producers, the transactions started, then each completed
    /// transaction. Returns the aborted transactions to record in the transaction index of
    /// the segment the batches went to (with the LSO after each, computed before it
    /// completes).
    pub(crate) fn commit(&mut self, update: PendingUpdate) -> Vec<AbortedTxn> {
        self.producers.extend(update.entries);
        for (first, pid) in update.started {
            self.ongoing.insert(first, pid);
        }
        // Kafka's `UnifiedLog.updateProducers`: whether data or marker, the verification is
        // over (the transaction has a first offset here, or ended); except a transaction.version
        // 2 marker of the epoch being verified: the coordinator wrote it with the epoch it
        // bumped, which is the next transaction's, so the verification belongs to that next
        // transaction and its first write must still find the guard (KAFKA-18654).
        for (pid, is_marker, epoch) in update.transactional {
            let next_transaction_started = is_marker
                && self
                    .verification
                    .get(&pid)
                    .is_some_and(|v| v.supports_epoch_bump && v.epoch == epoch);
            if !next_transaction_started {
                self.verification.remove(&pid);
            }
        }
        let mut aborted = Vec::new();
        for c in &update.completed {
            if let Some(a) = self.aborted_entry(c) {
                aborted.push(a);
            }
            self.complete_txn(c);
        }
        aborted
    }

    /// Kafka's `lastStableOffset(completedTxn)`: the LSO once `completed` ends, before
    /// [`ProducerStateManager::complete_txn`] (the first offset of the earliest other open
    /// transaction, or the marker's offset + 1). What the transaction index records.
    pub(crate) fn last_stable_offset_after(&self, completed: &CompletedTxn) -> i64 {
        self.ongoing
            .iter()
            .find(|(_, pid)| **pid != completed.producer_id)
            .map_or(completed.last_offset + 1, |(first, _)| *first)
    }

    /// Kafka's `completeTxn`: the transaction leaves the open ones and waits for the high
    /// watermark to pass its marker.
    pub(crate) fn complete_txn(&mut self, completed: &CompletedTxn) {
        if self.ongoing.remove(&completed.first_offset).is_none() {
            tracing::warn!(
                producer_id = completed.producer_id,
                first_offset = completed.first_offset,
                "completed a transaction that was not open in producer state"
            );
            return;
        }
        self.unreplicated.insert(
            completed.first_offset,
            (completed.producer_id, completed.last_offset),
        );
    }

    /// The aborted-transaction entry of `completed` if it aborted (for the transaction
    /// index), computed before [`ProducerStateManager::complete_txn`].
    pub(crate) fn aborted_entry(&self, completed: &CompletedTxn) -> Option<AbortedTxn> {
        completed.aborted.then(|| AbortedTxn {
            producer_id: completed.producer_id,
            first_offset: completed.first_offset,
            last_offset: completed.last_offset,
            last_stable_offset: self.last_stable_offset_after(completed),
        })
    }

    /// The first offset that is not stable: of the earliest open transaction, or of the
    /// earliest completed one whose marker is not below the high watermark yet.
    pub(crate) fn first_unstable_offset(&self) -> Option<i64> {
        let ongoing = self.ongoing.keys().next().copied();
        let unreplicated = self.unreplicated.keys().next().copied();
        match (ongoing, unreplicated) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a completed transaction waits for the high watermark.
    pub(crate) fn has_unreplicated(&self) -> bool {
        !self.unreplicated.is_empty()
    }

    /// Kafka's `onHighWatermarkUpdated`: transactions whose marker is below `high_watermark`
    /// are stable.
    pub(crate) fn on_high_watermark_updated(&mut self, high_watermark: i64) {
        self.unreplicated
            .retain(|_, (_, last)| *last >= high_watermark);
    }

    /// Kafka's `onLogStartOffsetIncremented`: completed transactions below the new log start
    /// are gone.
    pub(crate) fn on_log_start_offset_incremented(&mut self, log_start_offset: i64) {
        self.unreplicated
            .retain(|_, (_, last)| *last >= log_start_offset);
    }

    /// Applies a batch read back from the log (no checks): a data batch, or a control batch
    /// with its marker (`None` for an empty control batch). Returns the transaction a marker
    /// completes; the caller records it ([`ProducerStateManager::aborted_entry`] for the
    /// transaction index, then [`ProducerStateManager::complete_txn`]).
    pub(crate) fn replay(
        &mut self,
        h: &BatchHeader,
        marker: Option<EndTxnMarker>,
    ) -> Option<CompletedTxn> {
        if !h.has_producer_id() {
            return None;
        }
        let entry = self
            .producers
            .entry(h.producer_id)
            .or_insert_with(ProducerEntry::empty);
        if h.is_control() {
            let marker = marker?;
            self.verification.remove(&h.producer_id);
            return entry.apply_marker(
                h.producer_id,
                h.producer_epoch,
                marker,
                h.base_offset,
                h.max_timestamp,
            );
        }
        if let Some(first) = entry.apply_data(h) {
            self.ongoing.insert(first, h.producer_id);
        }
        if h.is_transactional() {
            self.verification.remove(&h.producer_id);
        }
        None
    }

    /// Forgets producers whose last batch or marker is `expiration_ms` or more before
    /// `now_ms` and that have no open transaction (Kafka's `isProducerExpired`), and
    /// verification states that old. Returns how many producers were removed.
    pub(crate) fn remove_expired(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers.retain(|_, e| {
            e.current_txn_first_offset >= 0
                || now_ms.saturating_sub(e.last_timestamp_ms) < expiration_ms
        });
        self.verification
            .retain(|_, v| now_ms.saturating_sub(v.timestamp_ms) < expiration_ms);
        before - self.producers.len()
    }

    /// Last offset of the newest batch of each producer that has one.
    pub(crate) fn last_records(&self) -> HashMap<i64, LastRecord> {
        self.producers
            .iter()
            .map(|(pid, e)| {
                (
                    *pid,
                    LastRecord {
                        last_data_offset: e.batches.back().map(|b| b.last_offset),
                        producer_epoch: e.producer_epoch,
                    },
                )
            })
            .collect()
    }

    /// Every producer, by id (DescribeProducers).
    pub(crate) fn summaries(&self) -> Vec<ProducerSummary> {
        let mut out: Vec<ProducerSummary> = self
            .producers
            .iter()
            .map(|(pid, e)| ProducerSummary {
                producer_id: *pid,
                producer_epoch: e.producer_epoch,
                last_sequence: e.last_seq(),
                last_timestamp_ms: e.last_timestamp_ms,
                coordinator_epoch: e.coordinator_epoch,
                current_txn_start_offset: e.current_txn_first_offset,
            })
            .collect();
        out.sort_unstable_by_key(|s| s.producer_id);
        out
    }

    /// Drops every producer and transaction (before a full rebuild).
    pub(crate) fn clear(&mut self) {
        self.producers.clear();
        self.ongoing.clear();
        self.unreplicated.clear();
        self.verification.clear();
    }

    /// Snapshot offsets present in the directory, ascending.
    pub(crate) fn list_snapshots(&self) -> Result<Vec<i64>> {
        let mut out = Vec::new();
        let rd = std::fs::read_dir(&self.dir).map_err(|e| LogError::io("listing", &self.dir, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| LogError::io("listing", &self.dir, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(stem) = name.strip_suffix(".snapshot") {
                if stem.len() == 20 {
                    if let Ok(o) = stem.parse::<i64>() {
                        out.push(o);
                    }
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    fn snapshot_path(&self, offset: i64) -> PathBuf {
        self.dir.join(file_name(offset, "snapshot"))
    }

    /// Deletes the snapshot at `offset` (missing is fine).
    pub(crate) fn delete_snapshot(&self, offset: i64) -> Result<()> {
        let p = self.snapshot_path(offset);
        match std::fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(LogError::io("deleting", &p, e)),
        }
    }

    /// Writes `<offset>.snapshot` and keeps only the newest three snapshots.
    pub(crate) fn take_snapshot(&self, offset: i64, sync: bool) -> Result<()> {
        let mut body = Vec::with_capacity(4 + self.producers.len() * SNAPSHOT_ENTRY_BYTES);
        let mut ids: Vec<_> = self.producers.keys().copied().collect();
        ids.sort_unstable();
        body.extend_from_slice(&(ids.len() as i32).to_be_bytes());
        for pid in ids {
            let e = &self.producers[&pid];
            let last = e.batches.back().copied().unwrap_or(BatchMetadata {
                first_seq: -1,
                last_seq: -1,
                first_offset: -1,
                last_offset: -1,
                timestamp_ms: -1,
            });
            body.extend_from_slice(&pid.to_be_bytes());
            body.extend_from_slice(&e.producer_epoch.to_be_bytes());
            body.extend_from_slice(&last.last_seq.to_be_bytes());
            body.extend_from_slice(&last.last_offset.to_be_bytes());
            let offset_delta = (last.last_offset - last.first_offset) as i32;
            body.extend_from_slice(&offset_delta.to_be_bytes());
            body.extend_from_slice(&e.last_timestamp_ms.to_be_bytes());
            body.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
            body.extend_from_slice(&e.current_txn_first_offset.to_be_bytes());
        }
        let mut file = Vec::with_capacity(6 + body.len());
        file.extend_from_slice(&SNAPSHOT_VERSION.to_be_bytes());
        file.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        file.extend_from_slice(&body);
        write_atomically(&self.snapshot_path(offset), &file, sync)?;
        let snaps = self.list_snapshots()?;
        if snaps.len() > 3 {
            for o in &snaps[..snaps.len() - 3] {
                self.delete_snapshot(*o)?;
            }
        }
        Ok(())
    }

    /// Replaces the state with the snapshot at `offset`.
    ///
    /// # Errors
    /// [`LogError::CorruptFile`] for a bad version, length or CRC (the caller deletes the file
    /// and falls back to an older snapshot or a full replay).
    pub(crate) fn load_snapshot(&mut self, offset: i64) -> Result<()> {
        let path = self.snapshot_path(offset);
        let raw = std::fs::read(&path).map_err(|e| LogError::io("reading", &path, e))?;
        let corrupt = |reason: &str| LogError::CorruptFile {
            path: path.display().to_string(),
            reason: reason.to_string(),
        };
        if raw.len() < 10 {
            return Err(corrupt("shorter than the snapshot header"));
        }
        let version = i16::from_be_bytes([raw[0], raw[1]]);
        if version != SNAPSHOT_VERSION {
            return Err(corrupt("unsupported snapshot version"));
        }
        let crc = u32::from_be_bytes([raw[2], raw[3], raw[4], raw[5]]);
        if crc32c::crc32c(&raw[6..]) != crc {
            return Err(corrupt("CRC mismatch"));
        }
        let count = i32::from_be_bytes([raw[6], raw[7], raw[8], raw[9]]);
        let entries = &raw[10..];
        if count < 0 || entries.len() != count as usize * SNAPSHOT_ENTRY_BYTES {
            return Err(corrupt("entry count does not match the file length"));
        }
        let mut producers = HashMap::with_capacity(count as usize);
        for e in entries.chunks_exact(SNAPSHOT_ENTRY_BYTES) {
            let i64_at = |at: usize| {
                let mut a = [0u8; 8];
                a.copy_from_slice(&e[at..at + 8]);
                i64::from_be_bytes(a)
            };
            let i32_at = |at: usize| i32::from_be_bytes([e[at], e[at + 1], e[at + 2], e[at + 3]]);
            let pid = i64_at(0);
            let epoch = i16::from_be_bytes([e[8], e[9]]);
            let last_seq = i32_at(10);
            let last_offset = i64_at(14);
            let offset_delta = i32_at(22);
            let timestamp_ms = i64_at(26);
            let mut entry = ProducerEntry {
                producer_epoch: epoch,
                batches: VecDeque::new(),
                coordinator_epoch: i32_at(34),
                current_txn_first_offset: i64_at(38),
                last_timestamp_ms: timestamp_ms,
            };
            if last_offset >= 0 {
                let first_seq = i64::from(last_seq) - i64::from(offset_delta);
                let first_seq = if first_seq < 0 {
                    (first_seq + i64::from(i32::MAX) + 1) as i32
                } else {
                    first_seq as i32
                };
                entry.batches.push_back(BatchMetadata {
                    first_seq,
                    last_seq,
                    first_offset: last_offset - i64::from(offset_delta),
                    last_offset,
                    timestamp_ms,
                });
            }
            producers.insert(pid, entry);
        }
        self.clear();
        for (pid, e) in &producers {
            if e.current_txn_first_offset >= 0 {
                self.ongoing.insert(e.current_txn_first_offset, *pid);
            }
        }
        self.producers = producers;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_protocol::batch::{set_base_offset, validate_batch, BatchBuilder};

    fn header(pid: i64, epoch: i16, seq: i32, n: usize, base_offset: i64) -> BatchHeader {
        let mut b = BatchBuilder::new(0, 1).producer(pid, epoch, seq);
        for _ in 0..n {
            b = b.record(1, None, Some(b"v"), &[]);
        }
        let mut v = b.build();
        set_base_offset(&mut v, base_offset);
        validate_batch(&v).unwrap()
    }

    fn append(m: &mut ProducerStateManager, h: BatchHeader) -> Result<Option<BatchMetadata>> {
        match m.check_batches(&[h], &[None], AppendOrigin::Client, None)? {
            ProducerCheck::Duplicate(b) => Ok(Some(b)),
            ProducerCheck::Valid(u) => {
                m.commit(u);
                Ok(None)
            }
        }
    }

    #[test]
    fn sequences_epochs_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = ProducerStateManager::new(dir.path());
        // A producer with no state may start at any sequence (Kafka's checkSequence).
        assert_eq!(append(&mut m, header(2, 0, 5, 1, 0)).unwrap(), None);
        assert!(matches!(
            append(&mut m, header(2, 0, 7, 1, 1)),
            Err(LogError::OutOfOrderSequence {
                expected_sequence: 6,
                ..
            })
        ));
        assert_eq!(append(&mut m, header(1, 0, 0, 3, 0)).unwrap(), None);
        assert_eq!(append(&mut m, header(1, 0, 3, 2, 3)).unwrap(), None);
        let dup = append(&mut m, header(1, 0, 0, 3, 99)).unwrap().unwrap();
        assert_eq!((dup.first_offset, dup.last_offset), (0, 2));
        assert!(matches!(
            append(&mut m, header(1, 0, 6, 1, 5)),
            Err(LogError::OutOfOrderSequence {
                expected_sequence: 5,
                ..
            })
        ));
        // New epoch must start at 0; then the old one is fenced.
        assert!(append(&mut m, header(1, 1, 5, 1, 5)).is_err());
        assert_eq!(append(&mut m, header(1, 1, 0, 1, 5)).unwrap(), None);
        assert!(matches!(
            append(&mut m, header(1, 0, 5, 1, 6)),
            Err(LogError::InvalidProducerEpoch {
                current_epoch: 1,
                ..
            })
        ));
        // Only the last five batches are remembered.
        for i in 1..=5 {
            append(&mut m, header(1, 1, i, 1, 5 + i64::from(i))).unwrap();
        }
        assert!(append(&mut m, header(1, 1, 0, 1, 0)).is_err());
        assert!(append(&mut m, header(1, 1, 1, 1, 0)).unwrap().is_some());
    }

    #[test]
    fn sequence_wraps_at_max() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = ProducerStateManager::new(dir.path());
        m.replay(&header(2, 0, i32::MAX - 1, 2, 0), None);
        assert_eq!(append(&mut m, header(2, 0, 0, 1, 2)).unwrap(), None);
    }

    #[test]
    fn snapshot_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = ProducerStateManager::new(dir.path());
        append(&mut m, header(1, 0, 0, 3, 0)).unwrap();
        append(&mut m, header(2, 4, 0, 2, 3)).unwrap();
        m.take_snapshot(5, true).unwrap();
        let mut n = ProducerStateManager::new(dir.path());
        assert_eq!(n.list_snapshots().unwrap(), vec![5]);
        n.load_snapshot(5).unwrap();
        assert_eq!(n.len(), 2);
        let dup = append(&mut n, header(2, 4, 0, 2, 9)).unwrap().unwrap();
        assert_eq!((dup.first_offset, dup.last_offset), (3, 4));
        assert!(append(&mut n, header(1, 0, 3, 1, 5)).unwrap().is_none());
        // Corruption is detected.
        let p = dir.path().join(file_name(5, "snapshot"));
        let mut raw = std::fs::read(&p).unwrap();
        raw[12] ^= 1;
        std::fs::write(&p, raw).unwrap();
        assert!(n.load_snapshot(5).is_err());
    }

    fn txn_header(pid: i64, epoch: i16, seq: i32, n: usize, base_offset: i64) -> BatchHeader {
        let mut b = BatchBuilder::new(0, 1)
            .producer(pid, epoch, seq)
            .transactional(true, false);
        for _ in 0..n {
            b = b.record(1, None, Some(b"v"), &[]);
        }
        let mut v = b.build();
        set_base_offset(&mut v, base_offset);
        validate_batch(&v).unwrap()
    }

    fn marker_header(pid: i64, epoch: i16, base_offset: i64) -> BatchHeader {
        let mut v = gregor_protocol::control::end_txn_marker_batch(
            pid,
            epoch,
            EndTxnMarker {
                result: TransactionResult::Abort,
                coordinator_epoch: 0,
            },
            1,
        );
        set_base_offset(&mut v, base_offset);
        validate_batch(&v).unwrap()
    }

    fn abort() -> Option<EndTxnMarker> {
        Some(EndTxnMarker {
            result: TransactionResult::Abort,
            coordinator_epoch: 0,
        })
    }

    /// The first unstable offset and the LSO recorded with an abort follow Kafka's
    /// `ProducerStateManager`: the earliest open transaction, completed ones until the high
    /// watermark passes their marker, and the next other open transaction for the index.
    #[test]
    fn open_and_unreplicated_transactions() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = ProducerStateManager::new(dir.path());
        let apply =
            |m: &mut ProducerStateManager, h: BatchHeader, marker: Option<EndTxnMarker>| match m
                .check_batches(&[h], &[marker], AppendOrigin::Coordinator, None)
                .unwrap()
            {
                ProducerCheck::Valid(u) => m.commit(u),
                ProducerCheck::Duplicate(_) => panic!("duplicate"),
            };
        assert!(apply(&mut m, txn_header(1, 0, 0, 2, 10), None).is_empty());
        assert!(apply(&mut m, txn_header(2, 0, 0, 1, 12), None).is_empty());
        assert_eq!(m.first_unstable_offset(), Some(10));
        let aborted = apply(&mut m, marker_header(1, 0, 13), abort());
        assert_eq!(
            aborted,
            vec![AbortedTxn {
                producer_id: 1,
                first_offset: 10,
                last_offset: 13,
                last_stable_offset: 12
            }]
        );
        assert_eq!(m.first_unstable_offset(), Some(10));
        m.on_high_watermark_updated(14);
        assert_eq!(m.first_unstable_offset(), Some(12));
        // The open transaction survives a snapshot; completed ones are not in it.
        m.take_snapshot(14, false).unwrap();
        let mut n = ProducerStateManager::new(dir.path());
        n.load_snapshot(14).unwrap();
        assert_eq!(n.first_unstable_offset(), Some(12));
        // A producer with an open transaction never expires; its verification state does.
        assert_eq!(n.remove_expired(i64::MAX, 1), 1);
        assert_eq!(n.first_unstable_offset(), Some(12));
        let g = n.maybe_start_verification(9, 0, 0, false, 100).unwrap();
        assert!(!g.is_sentinel());
        n.remove_expired(200, 50);
        assert!(n.verification.is_empty());
        // Replay of the same batches gives the same state.
        let mut r = ProducerStateManager::new(dir.path());
        for (h, marker) in [
            (txn_header(1, 0, 0, 2, 10), None),
            (txn_header(2, 0, 0, 1, 12), None),
            (marker_header(1, 0, 13), abort()),
        ] {
            if let Some(c) = r.replay(&h, marker) {
                assert_eq!(r.aborted_entry(&c), Some(aborted[0]));
                r.complete_txn(&c);
            }
        }
        r.on_high_watermark_updated(14);
        assert_eq!(r.first_unstable_offset(), Some(12));
    }
}
