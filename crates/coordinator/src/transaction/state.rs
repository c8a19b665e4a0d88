//! A transactional id's state, Kafka's `TransactionState`: its log id, its name, and which
//! states it may follow (the transition table of [`super::metadata`]). Apart from
//! `metadata`, so that the record codec (`records`) and the state machine both use it without
//! importing each other.

use std::fmt;

/// A transactional id's state (Kafka's `TransactionState`; the id is what the log stores, the
/// name what DescribeTransactions and ListTransactions report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TransactionState {
    /// No transaction in progress (after InitProducerId).
    Empty,
    /// Partitions were added: a transaction is open.
    Ongoing,
    /// EndTxn(commit) is in the log; markers are being written.
    PrepareCommit,
    /// EndTxn(abort), a timeout or a fence is in the log; markers are being written.
    PrepareAbort,
    /// Every partition has its COMMIT marker.
    CompleteCommit,
    /// Every partition has its ABORT marker.
    CompleteAbort,
    /// The transactional id expired (`transactional.id.expiration.ms`) and is being removed.
    Dead,
    /// An ongoing transaction is being fenced (a new producer, or its timeout): a transient
    /// state, always followed by PrepareAbort, never written as the current state.
    PrepareEpochFence,
}

impl TransactionState {
    /// Every state.
    pub const ALL: [TransactionState; 8] = [
        Self::Empty,
        Self::Ongoing,
        Self::PrepareCommit,
        Self::PrepareAbort,
        Self::CompleteCommit,
        Self::CompleteAbort,
        Self::Dead,
        Self::PrepareEpochFence,
    ];

    /// The id stored in `TransactionLogValue.TransactionStatus`.
    pub fn id(self) -> i8 {
        match self {
            Self::Empty => 0,
            Self::Ongoing => 1,
            Self::PrepareCommit => 2,
            Self::PrepareAbort => 3,
            Self::CompleteCommit => 4,
            Self::CompleteAbort => 5,
            Self::Dead => 6,
            Self::PrepareEpochFence => 7,
        }
    }

    /// The state with `id`, None for an unknown id.
    pub fn from_id(id: i8) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.id() == id)
    }

    /// Kafka's name (DescribeTransactions, ListTransactions, `kafka-transactions`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Empty => "Empty",
            Self::Ongoing => "Ongoing",
            Self::PrepareCommit => "PrepareCommit",
            Self::PrepareAbort => "PrepareAbort",
            Self::CompleteCommit => "CompleteCommit",
            Self::CompleteAbort => "CompleteAbort",
            Self::Dead => "Dead",
            Self::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    /// The state named `name` (exact, as Kafka's `fromName`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The states a transition to `self` may start from.
    pub fn valid_previous_states(self) -> &'static [TransactionState] {
        use TransactionState::*;
        match self {
            Empty => &[Empty, CompleteCommit, CompleteAbort],
            Ongoing => &[Ongoing, Empty, CompleteCommit, CompleteAbort],
            PrepareCommit => &[Ongoing],
            PrepareAbort => &[
                Ongoing,
                PrepareEpochFence,
                Empty,
                CompleteCommit,
                CompleteAbort,
            ],
            CompleteCommit => &[PrepareCommit],
            CompleteAbort => &[PrepareAbort],
            Dead => &[Empty, CompleteAbort, CompleteCommit],
            PrepareEpochFence => &[Ongoing],
        }
    }

    /// Whether the transactional id may expire in this state (no transaction open).
    pub fn is_expiration_allowed(self) -> bool {
        matches!(
            self,
            Self::Empty | Self::CompleteCommit | Self::CompleteAbort
        )
    }
}

impl fmt::Display for TransactionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
