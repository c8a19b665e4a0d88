//! The state of one transactional id and its transitions, in one place (Kafka's
//! `TransactionMetadata`, `TransactionState` and `TxnTransitMetadata`).
//!
//! A transition is two steps, because the new state must be in the log before it is used:
//! `prepare_*` checks the transition against the current state, marks it as the *pending*
//! state (so no other transition can start meanwhile: CONCURRENT_TRANSACTIONS) and returns the
//! target as a [`TxnTransit`]; the coordinator writes that target to `__transaction_state`,
//! and once the write is committed [`TransactionMetadata::complete_transition`] makes it the
//! current state (or, if the write failed, the pending state is dropped).
//!
//! The legal previous states of each state ([`TransactionState::valid_previous_states`]) are
//! Kafka's:
//!
//! | state | from |
//! |---|---|
//! | Empty | Empty, CompleteCommit, CompleteAbort |
//! | Ongoing | Ongoing, Empty, CompleteCommit, CompleteAbort |
//! | PrepareCommit | Ongoing |
//! | PrepareAbort | Ongoing, PrepareEpochFence, Empty, CompleteCommit, CompleteAbort |
//! | CompleteCommit | PrepareCommit |
//! | CompleteAbort | PrepareAbort |
//! | Dead | Empty, CompleteCommit, CompleteAbort |
//! | PrepareEpochFence | Ongoing |
//!
//! PrepareAbort from Empty, CompleteCommit and CompleteAbort is the *empty abort* of
//! `transaction.version` 2 (KIP-890 part 2): the client cannot know whether a partition leader
//! added a partition for it, so it may abort a transaction the coordinator never saw start.
//!
//! Epochs: a producer epoch never reaches `i16::MAX` (the coordinator must always be able to
//! fence with one more); at `i16::MAX - 1` it is exhausted and the next InitProducerId (or,
//! with `transaction.version` 2, the next EndTxn, KIP-890) moves to a new producer id at
//! epoch 0.

use std::collections::BTreeSet;

use super::records::TransactionLogValue;
pub use super::state::TransactionState;

/// `RecordBatch.NO_PRODUCER_ID`.
pub const NO_PRODUCER_ID: i64 = -1;
/// `RecordBatch.NO_PRODUCER_EPOCH`.
pub const NO_PRODUCER_EPOCH: i16 = -1;

/// A transition that breaks the state machine's rules: a bug (Kafka throws
/// `IllegalStateException`); the request gets UNKNOWN_SERVER_ERROR and the state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("transactional id {transactional_id}: illegal transition from {from} to {to}: {reason}")]
pub struct IllegalTransition {
    /// The transactional id.
    pub transactional_id: String,
    /// The current state.
    pub from: TransactionState,
    /// The target state.
    pub to: TransactionState,
    /// What was wrong.
    pub reason: &'static str,
}

/// A topic partition in a transaction.
pub type TxnPartition = (String, i32);

/// The target of a transition (Kafka's `TxnTransitMetadata`): what is written to the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnTransit {
    /// Producer id after the transition.
    pub producer_id: i64,
    /// The producer id before it (written as `PreviousProducerId`).
    pub prev_producer_id: i64,
    /// KIP-890: the producer id the client moves to after this transaction (epoch overflow).
    pub next_producer_id: i64,
    /// Producer epoch after the transition.
    pub producer_epoch: i16,
    /// The epoch before (KIP-360 retries).
    pub last_producer_epoch: i16,
    /// `transaction.timeout.ms`.
    pub txn_timeout_ms: i32,
    /// The target state.
    pub state: TransactionState,
    /// Partitions after the transition.
    pub partitions: BTreeSet<TxnPartition>,
    /// Transaction start (ms), -1 when none.
    pub txn_start_timestamp_ms: i64,
    /// Time of the transition (ms).
    pub txn_last_update_timestamp_ms: i64,
    /// `transaction.version` of the client (0, 1 or 2).
    pub client_transaction_version: i16,
}

impl TxnTransit {
    /// The record value for this target.
    pub fn to_log_value(&self) -> TransactionLogValue {
        let mut partitions: Vec<(String, Vec<i32>)> = Vec::new();
        if self.state != TransactionState::Empty {
            for (t, p) in &self.partitions {
                match partitions.last_mut() {
                    Some((last, ids)) if last == t => ids.push(*p),
                    _ => partitions.push((t.clone(), vec![*p])),
                }
            }
        }
        TransactionLogValue {
            producer_id: self.producer_id,
            previous_producer_id: self.prev_producer_id,
            next_producer_id: self.next_producer_id,
            producer_epoch: self.producer_epoch,
            transaction_timeout_ms: self.txn_timeout_ms,
            state: self.state,
            partitions,
            last_update_timestamp_ms: self.txn_last_update_timestamp_ms,
            start_timestamp_ms: self.txn_start_timestamp_ms,
            client_transaction_version: self.client_transaction_version,
        }
    }
}

/// Whether transaction.version `tv` bumps the epoch on every transaction (KIP-890 part 2).
pub fn supports_epoch_bump(tv: i16) -> bool {
    tv >= 2
}

/// Whether `epoch` is exhausted: no more bumps on this producer id.
pub fn is_epoch_exhausted(epoch: i16) -> bool {
    epoch >= i16::MAX - 1
}

/// One transactional id's metadata (Kafka's `TransactionMetadata`). Kept in the coordinator's
/// map under its lock; changed only through `prepare_*` / [`Self::complete_transition`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionMetadata {
    /// The transactional id.
    pub transactional_id: String,
    /// Current producer id.
    pub producer_id: i64,
    /// Producer id of the last committed transaction.
    pub previous_producer_id: i64,
    /// Producer id the client moves to after the current transaction (KIP-890 overflow).
    pub next_producer_id: i64,
    /// Current producer epoch (-1 for a new id).
    pub producer_epoch: i16,
    /// Epoch before the last bump, -1 when unknown (KIP-360).
    pub last_producer_epoch: i16,
    /// `transaction.timeout.ms` of the producer.
    pub txn_timeout_ms: i32,
    /// Current state.
    pub state: TransactionState,
    /// Partitions of the open transaction (those still waiting for a marker while completing).
    pub partitions: BTreeSet<TxnPartition>,
    /// When the transaction started (ms), -1 when none.
    pub txn_start_timestamp_ms: i64,
    /// Last update (ms): what `transactional.id.expiration.ms` counts from.
    pub txn_last_update_timestamp_ms: i64,
    /// `transaction.version` the client used for the current state.
    pub client_transaction_version: i16,
    /// The state a transition in progress goes to.
    pub pending_state: Option<TransactionState>,
    /// A fence whose write failed: the next fence does not bump the epoch again.
    pub has_failed_epoch_fence: bool,
}

impl TransactionMetadata {
    /// A new transactional id with `producer_id` and no epoch yet (InitProducerId bumps it to 0).
    pub fn new(transactional_id: &str, producer_id: i64, txn_timeout_ms: i32, now_ms: i64) -> Self {
        Self {
            transactional_id: transactional_id.to_string(),
            producer_id,
            previous_producer_id: NO_PRODUCER_ID,
            next_producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            last_producer_epoch: NO_PRODUCER_EPOCH,
            txn_timeout_ms,
            state: TransactionState::Empty,
            partitions: BTreeSet::new(),
            txn_start_timestamp_ms: -1,
            txn_last_update_timestamp_ms: now_ms,
            client_transaction_version: 0,
            pending_state: None,
            has_failed_epoch_fence: false,
        }
    }

    /// The metadata a loaded record describes (the last epoch is not in the log).
    pub fn from_log_value(transactional_id: &str, v: &TransactionLogValue) -> Self {
        let partitions = if v.state == TransactionState::Empty {
            BTreeSet::new()
        } else {
            v.partitions
                .iter()
                .flat_map(|(t, ids)| ids.iter().map(move |p| (t.clone(), *p)))
                .collect()
        };
        Self {
            transactional_id: transactional_id.to_string(),
            producer_id: v.producer_id,
            previous_producer_id: v.previous_producer_id,
            next_producer_id: v.next_producer_id,
            producer_epoch: v.producer_epoch,
            last_producer_epoch: NO_PRODUCER_EPOCH,
            txn_timeout_ms: v.transaction_timeout_ms,
            state: v.state,
            partitions,
            txn_start_timestamp_ms: v.start_timestamp_ms,
            txn_last_update_timestamp_ms: v.last_update_timestamp_ms,
            client_transaction_version: v.client_transaction_version,
            pending_state: None,
            has_failed_epoch_fence: false,
        }
    }

    /// Whether a transition is in progress.
    pub fn pending_transition_in_progress(&self) -> bool {
        self.pending_state.is_some()
    }

    /// Whether the current producer id's epochs are used up.
    pub fn is_producer_epoch_exhausted(&self) -> bool {
        is_epoch_exhausted(self.producer_epoch)
    }

    /// Whether a transaction is open or completing.
    pub fn has_pending_transaction(&self) -> bool {
        matches!(
            self.state,
            TransactionState::Ongoing
                | TransactionState::PrepareAbort
                | TransactionState::PrepareCommit
        )
    }

    fn illegal(&self, to: TransactionState, reason: &'static str) -> IllegalTransition {
        IllegalTransition {
            transactional_id: self.transactional_id.clone(),
            from: self.state,
            to,
            reason,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn prepare_transition(
        &mut self,
        state: TransactionState,
        producer_id: i64,
        next_producer_id: i64,
        producer_epoch: i16,
        last_producer_epoch: i16,
        txn_timeout_ms: i32,
        partitions: BTreeSet<TxnPartition>,
        txn_start_timestamp_ms: i64,
        now_ms: i64,
        client_transaction_version: i16,
    ) -> Result<TxnTransit, IllegalTransition> {
        if self.pending_state.is_some() {
            return Err(self.illegal(state, "another transition is pending"));
        }
        if producer_id < 0 {
            return Err(self.illegal(state, "negative producer id"));
        }
        if state != TransactionState::Dead && producer_epoch < 0 {
            return Err(self.illegal(state, "negative producer epoch"));
        }
        if !state.valid_previous_states().contains(&self.state) {
            return Err(self.illegal(state, "not a valid previous state"));
        }
        self.pending_state = Some(state);
        Ok(TxnTransit {
            producer_id,
            prev_producer_id: self.producer_id,
            next_producer_id,
            producer_epoch,
            last_producer_epoch,
            txn_timeout_ms,
            state,
            partitions,
            txn_start_timestamp_ms,
            txn_last_update_timestamp_ms: now_ms,
            client_transaction_version,
        })
    }

    /// Fences the producer of an ongoing transaction (a new InitProducerId, or its timeout):
    /// the epoch is bumped (not again after a fence whose write failed) and the transaction
    /// will be aborted with it, so the old producer's writes and EndTxn are refused.
    ///
    /// # Errors
    /// [`IllegalTransition`] when not Ongoing, or the epoch is `i16::MAX`.
    pub fn prepare_fence_producer_epoch(&mut self) -> Result<TxnTransit, IllegalTransition> {
        if self.producer_epoch == i16::MAX {
            return Err(self.illegal(TransactionState::PrepareEpochFence, "epoch would overflow"));
        }
        let bumped = if self.has_failed_epoch_fence {
            self.producer_epoch
        } else {
            self.producer_epoch + 1
        };
        self.prepare_transition(
            TransactionState::PrepareEpochFence,
            self.producer_id,
            NO_PRODUCER_ID,
            bumped,
            NO_PRODUCER_EPOCH,
            self.txn_timeout_ms,
            self.partitions.clone(),
            self.txn_start_timestamp_ms,
            self.txn_last_update_timestamp_ms,
            self.client_transaction_version,
        )
    }

    /// InitProducerId on the current producer id (KIP-360): bumps the epoch. `expected_epoch`
    /// is the epoch a recovering producer sends (None for a new producer instance). Returns
    /// `Ok(Err(()))` when that epoch is fenced (PRODUCER_FENCED).
    ///
    /// # Errors
    /// [`IllegalTransition`] when the epoch is exhausted or the state does not allow Empty.
    #[allow(clippy::type_complexity)]
    pub fn prepare_increment_producer_epoch(
        &mut self,
        new_txn_timeout_ms: i32,
        expected_epoch: Option<i16>,
        now_ms: i64,
    ) -> Result<Result<TxnTransit, ()>, IllegalTransition> {
        if self.is_producer_epoch_exhausted() {
            return Err(self.illegal(TransactionState::Empty, "producer epoch exhausted"));
        }
        let bumped = self.producer_epoch + 1;
        let (epoch, last_epoch) = match expected_epoch {
            None => (bumped, NO_PRODUCER_EPOCH),
            Some(e) if self.producer_epoch == NO_PRODUCER_EPOCH || e == self.producer_epoch => {
                (bumped, self.producer_epoch)
            }
            // A retry of a bump whose answer was lost: the current epoch, no new bump.
            Some(e) if e == self.last_producer_epoch => {
                (self.producer_epoch, self.last_producer_epoch)
            }
            Some(_) => return Ok(Err(())),
        };
        self.prepare_transition(
            TransactionState::Empty,
            self.producer_id,
            NO_PRODUCER_ID,
            epoch,
            last_epoch,
            new_txn_timeout_ms,
            BTreeSet::new(),
            -1,
            now_ms,
            0,
        )
        .map(Ok)
    }

    /// InitProducerId when the epoch is exhausted: a new producer id at epoch 0.
    ///
    /// # Errors
    /// [`IllegalTransition`] while a transaction is pending.
    pub fn prepare_producer_id_rotation(
        &mut self,
        new_producer_id: i64,
        new_txn_timeout_ms: i32,
        now_ms: i64,
        record_last_epoch: bool,
    ) -> Result<TxnTransit, IllegalTransition> {
        if self.has_pending_transaction() {
            return Err(self.illegal(TransactionState::Empty, "a transaction is pending"));
        }
        let last = if record_last_epoch {
            self.producer_epoch
        } else {
            NO_PRODUCER_EPOCH
        };
        self.prepare_transition(
            TransactionState::Empty,
            new_producer_id,
            NO_PRODUCER_ID,
            0,
            last,
            new_txn_timeout_ms,
            BTreeSet::new(),
            -1,
            now_ms,
            0,
        )
    }

    /// AddPartitionsToTxn / AddOffsetsToTxn (and the TV2 implicit add): Ongoing with more
    /// partitions; a transaction starting now gets `now_ms` as its start.
    ///
    /// # Errors
    /// [`IllegalTransition`] from a state that cannot go to Ongoing.
    pub fn prepare_add_partitions(
        &mut self,
        added: &BTreeSet<TxnPartition>,
        now_ms: i64,
        client_transaction_version: i16,
    ) -> Result<TxnTransit, IllegalTransition> {
        let start = match self.state {
            TransactionState::Empty
            | TransactionState::CompleteAbort
            | TransactionState::CompleteCommit => now_ms,
            _ => self.txn_start_timestamp_ms,
        };
        let mut partitions = self.partitions.clone();
        partitions.extend(added.iter().cloned());
        self.prepare_transition(
            TransactionState::Ongoing,
            self.producer_id,
            NO_PRODUCER_ID,
            self.producer_epoch,
            self.last_producer_epoch,
            self.txn_timeout_ms,
            partitions,
            start,
            now_ms,
            client_transaction_version,
        )
    }

    /// EndTxn: PrepareCommit or PrepareAbort. With `transaction.version` 2 the epoch is bumped
    /// (KIP-890 part 2) and `next_producer_id` (>= 0 when the epoch is exhausted) is the id the
    /// producer moves to once the markers are written. `no_partition_added` is the empty abort
    /// of transaction.version 2 (from Empty or a completed transaction): it starts now.
    ///
    /// # Errors
    /// [`IllegalTransition`] when not Ongoing (or fencing, for an abort; or an empty abort).
    pub fn prepare_abort_or_commit(
        &mut self,
        state: TransactionState,
        client_transaction_version: i16,
        next_producer_id: i64,
        now_ms: i64,
        no_partition_added: bool,
    ) -> Result<TxnTransit, IllegalTransition> {
        let (epoch, last_epoch) = if supports_epoch_bump(client_transaction_version) {
            (self.producer_epoch.saturating_add(1), self.producer_epoch)
        } else {
            (self.producer_epoch, self.last_producer_epoch)
        };
        let start = if no_partition_added {
            now_ms
        } else {
            self.txn_start_timestamp_ms
        };
        self.prepare_transition(
            state,
            self.producer_id,
            next_producer_id,
            epoch,
            last_epoch,
            self.txn_timeout_ms,
            self.partitions.clone(),
            start,
            now_ms,
            client_transaction_version,
        )
    }

    /// Every marker is written: CompleteCommit or CompleteAbort. After a KIP-890 overflow
    /// the producer id becomes `next_producer_id` at epoch 0.
    ///
    /// # Errors
    /// [`IllegalTransition`] when not PrepareCommit/PrepareAbort.
    pub fn prepare_complete(&mut self, now_ms: i64) -> Result<TxnTransit, IllegalTransition> {
        let state = if self.state == TransactionState::PrepareCommit {
            TransactionState::CompleteCommit
        } else {
            TransactionState::CompleteAbort
        };
        self.has_failed_epoch_fence = false;
        let (producer_id, epoch) = if supports_epoch_bump(self.client_transaction_version)
            && self.next_producer_id != NO_PRODUCER_ID
        {
            (self.next_producer_id, 0)
        } else {
            (self.producer_id, self.producer_epoch)
        };
        self.prepare_transition(
            state,
            producer_id,
            NO_PRODUCER_ID,
            epoch,
            self.producer_epoch,
            self.txn_timeout_ms,
            BTreeSet::new(),
            self.txn_start_timestamp_ms,
            now_ms,
            self.client_transaction_version,
        )
    }

    /// The transactional id expired: Dead (written as a tombstone).
    ///
    /// # Errors
    /// [`IllegalTransition`] while a transaction is open.
    pub fn prepare_dead(&mut self) -> Result<TxnTransit, IllegalTransition> {
        self.prepare_transition(
            TransactionState::Dead,
            self.producer_id,
            NO_PRODUCER_ID,
            self.producer_epoch,
            self.last_producer_epoch,
            self.txn_timeout_ms,
            BTreeSet::new(),
            self.txn_start_timestamp_ms,
            self.txn_last_update_timestamp_ms,
            self.client_transaction_version,
        )
    }

    /// Whether `t`'s epoch and producer id continue the current ones (Kafka's
    /// `validProducerEpoch`).
    fn valid_producer_epoch(&self, t: &TxnTransit) -> bool {
        let v2 = supports_epoch_bump(t.client_transaction_version);
        let complete = matches!(
            t.state,
            TransactionState::CompleteCommit | TransactionState::CompleteAbort
        );
        let prepare = matches!(
            t.state,
            TransactionState::PrepareCommit | TransactionState::PrepareAbort
        );
        let overflow_complete = v2 && complete && t.producer_epoch == 0;
        let epoch = if overflow_complete || (v2 && prepare) {
            t.last_producer_epoch
        } else {
            t.producer_epoch
        };
        let producer_id = if overflow_complete {
            t.prev_producer_id
        } else {
            t.producer_id
        };
        epoch == self.producer_epoch && producer_id == self.producer_id
    }

    fn valid_producer_epoch_bump(&self, t: &TxnTransit) -> bool {
        t.producer_epoch == self.producer_epoch.wrapping_add(1)
            || (t.producer_epoch == 0 && t.producer_id != self.producer_id)
    }

    /// Makes the pending transition `t` the current state, after its record was committed.
    ///
    /// # Errors
    /// [`IllegalTransition`] when `t` is not the pending transition or does not continue the
    /// current state (the metadata is unchanged then).
    pub fn complete_transition(&mut self, t: &TxnTransit) -> Result<(), IllegalTransition> {
        let Some(to) = self.pending_state else {
            return Err(self.illegal(t.state, "no transition pending"));
        };
        if to != t.state {
            return Err(self.illegal(t.state, "not the pending transition"));
        }
        match to {
            TransactionState::Empty => {
                if (self.producer_epoch != t.producer_epoch && !self.valid_producer_epoch_bump(t))
                    || !t.partitions.is_empty()
                    || t.txn_start_timestamp_ms != -1
                {
                    return Err(self.illegal(to, "unexpected epoch, partitions or start"));
                }
                self.txn_timeout_ms = t.txn_timeout_ms;
                self.producer_epoch = t.producer_epoch;
                self.last_producer_epoch = t.last_producer_epoch;
                self.producer_id = t.producer_id;
                self.previous_producer_id = t.prev_producer_id;
            }
            TransactionState::Ongoing => {
                if !self.valid_producer_epoch(t)
                    || !self.partitions.is_subset(&t.partitions)
                    || self.txn_timeout_ms != t.txn_timeout_ms
                {
                    return Err(self.illegal(to, "unexpected epoch, partitions or timeout"));
                }
                self.txn_start_timestamp_ms = t.txn_start_timestamp_ms;
                self.partitions.extend(t.partitions.iter().cloned());
            }
            TransactionState::PrepareCommit | TransactionState::PrepareAbort => {
                // An empty abort (transaction.version 2) starts with its PrepareAbort.
                let empty_abort = to == TransactionState::PrepareAbort
                    && matches!(
                        self.state,
                        TransactionState::Empty
                            | TransactionState::CompleteCommit
                            | TransactionState::CompleteAbort
                    );
                if !self.valid_producer_epoch(t)
                    || self.partitions != t.partitions
                    || self.txn_timeout_ms != t.txn_timeout_ms
                    || (!empty_abort && self.txn_start_timestamp_ms != t.txn_start_timestamp_ms)
                {
                    return Err(self.illegal(to, "unexpected epoch, partitions or timestamps"));
                }
                self.txn_start_timestamp_ms = t.txn_start_timestamp_ms;
                if supports_epoch_bump(t.client_transaction_version) {
                    self.producer_epoch = t.producer_epoch;
                    self.last_producer_epoch = t.last_producer_epoch;
                    self.next_producer_id = t.next_producer_id;
                }
            }
            TransactionState::CompleteCommit | TransactionState::CompleteAbort => {
                if !self.valid_producer_epoch(t)
                    || self.txn_timeout_ms != t.txn_timeout_ms
                    || t.txn_start_timestamp_ms == -1
                {
                    return Err(self.illegal(to, "unexpected epoch, timeout or start"));
                }
                self.txn_start_timestamp_ms = t.txn_start_timestamp_ms;
                self.partitions.clear();
                if supports_epoch_bump(t.client_transaction_version) {
                    self.producer_epoch = t.producer_epoch;
                    self.last_producer_epoch = t.last_producer_epoch;
                    self.previous_producer_id = t.prev_producer_id;
                    self.producer_id = t.producer_id;
                    self.next_producer_id = t.next_producer_id;
                }
            }
            TransactionState::PrepareEpochFence | TransactionState::Dead => {
                return Err(self.illegal(to, "never completed as a current state"));
            }
        }
        self.client_transaction_version = t.client_transaction_version;
        self.txn_last_update_timestamp_ms = t.txn_last_update_timestamp_ms;
        self.pending_state = None;
        self.state = to;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TransactionState::*;

    fn tp(t: &str, p: i32) -> TxnPartition {
        (t.to_string(), p)
    }

    fn new_md() -> TransactionMetadata {
        let mut m = TransactionMetadata::new("t1", 100, 60_000, 0);
        let t = m
            .prepare_increment_producer_epoch(60_000, None, 1)
            .unwrap()
            .unwrap();
        m.complete_transition(&t).unwrap();
        m
    }

    #[test]
    fn ids_and_names_are_kafkas() {
        let ids: Vec<i8> = TransactionState::ALL.iter().map(|s| s.id()).collect();
        assert_eq!(ids, vec![0, 1, 2, 3, 4, 5, 6, 7]);
        for s in TransactionState::ALL {
            assert_eq!(TransactionState::from_id(s.id()), Some(s));
            assert_eq!(TransactionState::from_name(s.name()), Some(s));
        }
        assert_eq!(TransactionState::from_id(8), None);
        assert_eq!(TransactionState::from_name("ongoing"), None);
    }

    /// Every (from, to) pair: the transition table is exactly Kafka's.
    #[test]
    fn transition_table() {
        let allowed = |from: TransactionState, to: TransactionState| {
            to.valid_previous_states().contains(&from)
        };
        let table = [
            (Empty, vec![Empty, Ongoing, Dead, PrepareAbort]),
            (
                Ongoing,
                vec![Ongoing, PrepareCommit, PrepareAbort, PrepareEpochFence],
            ),
            (PrepareCommit, vec![CompleteCommit]),
            (PrepareAbort, vec![CompleteAbort]),
            (CompleteCommit, vec![Empty, Ongoing, Dead, PrepareAbort]),
            (CompleteAbort, vec![Empty, Ongoing, Dead, PrepareAbort]),
            (Dead, vec![]),
            (PrepareEpochFence, vec![PrepareAbort]),
        ];
        for (from, tos) in table {
            for to in TransactionState::ALL {
                assert_eq!(allowed(from, to), tos.contains(&to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn init_then_transaction_commit() {
        let mut m = new_md();
        assert_eq!((m.producer_id, m.producer_epoch, m.state), (100, 0, Empty));
        let added: BTreeSet<_> = [tp("a", 0), tp("a", 1)].into();
        let t = m.prepare_add_partitions(&added, 10, 0).unwrap();
        // Pending: another transition is refused.
        assert!(m.prepare_add_partitions(&added, 11, 0).is_err());
        m.complete_transition(&t).unwrap();
        assert_eq!((m.state, m.txn_start_timestamp_ms), (Ongoing, 10));
        let t = m
            .prepare_abort_or_commit(PrepareCommit, 0, -1, 20, false)
            .unwrap();
        m.complete_transition(&t).unwrap();
        assert_eq!(m.producer_epoch, 0);
        let t = m.prepare_complete(30).unwrap();
        assert_eq!(t.state, CompleteCommit);
        m.complete_transition(&t).unwrap();
        assert!(m.partitions.is_empty());
        assert_eq!((m.state, m.producer_epoch), (CompleteCommit, 0));
    }

    #[test]
    fn transaction_version_2_bumps_the_epoch_per_transaction() {
        let mut m = new_md();
        let t = m
            .prepare_add_partitions(&[tp("a", 0)].into(), 10, 2)
            .unwrap();
        m.complete_transition(&t).unwrap();
        let t = m
            .prepare_abort_or_commit(PrepareAbort, 2, -1, 20, false)
            .unwrap();
        assert_eq!((t.producer_epoch, t.last_producer_epoch), (1, 0));
        m.complete_transition(&t).unwrap();
        assert_eq!(m.producer_epoch, 1);
        let t = m.prepare_complete(30).unwrap();
        m.complete_transition(&t).unwrap();
        assert_eq!(
            (m.state, m.producer_id, m.producer_epoch),
            (CompleteAbort, 100, 1)
        );
    }

    #[test]
    fn epoch_overflow_with_transaction_version_2_moves_to_the_next_producer_id() {
        let mut m = new_md();
        m.producer_epoch = i16::MAX - 2;
        let t = m
            .prepare_add_partitions(&[tp("a", 0)].into(), 10, 2)
            .unwrap();
        m.complete_transition(&t).unwrap();
        let t = m
            .prepare_abort_or_commit(PrepareCommit, 2, 555, 20, false)
            .unwrap();
        m.complete_transition(&t).unwrap();
        assert_eq!((m.producer_epoch, m.next_producer_id), (i16::MAX - 1, 555));
        let t = m.prepare_complete(30).unwrap();
        m.complete_transition(&t).unwrap();
        assert_eq!((m.producer_id, m.producer_epoch), (555, 0));
        assert_eq!(m.previous_producer_id, 100);
    }

    #[test]
    fn empty_abort_with_transaction_version_2() {
        let mut m = new_md();
        let t = m
            .prepare_abort_or_commit(PrepareAbort, 2, -1, 50, true)
            .unwrap();
        assert_eq!((t.txn_start_timestamp_ms, t.producer_epoch), (50, 1));
        m.complete_transition(&t).unwrap();
        let t = m.prepare_complete(60).unwrap();
        m.complete_transition(&t).unwrap();
        assert_eq!((m.state, m.producer_epoch), (CompleteAbort, 1));
    }

    #[test]
    fn kip_360_retries_and_fencing() {
        let mut m = new_md();
        // The producer at epoch 0 re-initialises: bumped to 1, last epoch 0.
        let t = m
            .prepare_increment_producer_epoch(60_000, Some(0), 5)
            .unwrap()
            .unwrap();
        m.complete_transition(&t).unwrap();
        assert_eq!((m.producer_epoch, m.last_producer_epoch), (1, 0));
        // The same request again (its answer was lost): epoch 1 again, no bump.
        let t = m
            .prepare_increment_producer_epoch(60_000, Some(0), 6)
            .unwrap()
            .unwrap();
        assert_eq!(t.producer_epoch, 1);
        m.pending_state = None;
        // An older epoch is fenced.
        assert_eq!(
            m.prepare_increment_producer_epoch(60_000, Some(7), 6)
                .unwrap(),
            Err(())
        );
        assert_eq!(m.pending_state, None);
    }

    #[test]
    fn fencing_an_ongoing_transaction() {
        let mut m = new_md();
        let t = m
            .prepare_add_partitions(&[tp("a", 0)].into(), 10, 0)
            .unwrap();
        m.complete_transition(&t).unwrap();
        let fence = m.prepare_fence_producer_epoch().unwrap();
        assert_eq!((fence.state, fence.producer_epoch), (PrepareEpochFence, 1));
        // The fence is never completed: the coordinator turns it into PrepareAbort.
        assert!(m.complete_transition(&fence).is_err());
        m.pending_state = None;
        m.producer_epoch = fence.producer_epoch;
        m.last_producer_epoch = NO_PRODUCER_EPOCH;
        let t = m
            .prepare_abort_or_commit(PrepareAbort, 0, -1, 20, false)
            .unwrap();
        m.complete_transition(&t).unwrap();
        assert_eq!((m.state, m.producer_epoch), (PrepareAbort, 1));
    }

    #[test]
    fn illegal_transitions_are_errors() {
        let mut m = new_md();
        // Empty cannot commit.
        assert!(m
            .prepare_abort_or_commit(PrepareCommit, 0, -1, 1, false)
            .is_err());
        assert_eq!(m.pending_state, None);
        // An exhausted epoch cannot be bumped.
        m.producer_epoch = i16::MAX - 1;
        assert!(m.prepare_increment_producer_epoch(1, None, 1).is_err());
        // Rotation gives epoch 0 on a new id.
        let t = m.prepare_producer_id_rotation(200, 1, 2, true).unwrap();
        m.complete_transition(&t).unwrap();
        assert_eq!(
            (m.producer_id, m.producer_epoch, m.last_producer_epoch),
            (200, 0, i16::MAX - 1)
        );
        // Dead only from a state without a transaction.
        let t = m.prepare_dead().unwrap();
        assert_eq!(t.state, Dead);
        assert!(m.complete_transition(&t).is_err());
    }

    #[test]
    fn log_value_groups_partitions_by_topic() {
        let mut m = new_md();
        let t = m
            .prepare_add_partitions(&[tp("b", 1), tp("a", 0), tp("a", 3)].into(), 10, 0)
            .unwrap();
        let v = t.to_log_value();
        assert_eq!(
            v.partitions,
            vec![("a".to_string(), vec![0, 3]), ("b".to_string(), vec![1])]
        );
        let back = TransactionMetadata::from_log_value("t1", &v);
        assert_eq!(back.partitions, t.partitions);
        assert_eq!(back.state, Ongoing);
    }
}
