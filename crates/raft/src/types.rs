//! The small value types of the quorum: node ids, `(offset, epoch)` pairs, the durable election
//! state (Kafka's `quorum-state` file) and the voter set.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A node id (`node.id`): a voter (controller) or an observer (broker). Ids are `>= 0`; Kafka
/// uses -1 on the wire for "none", which this crate models as `Option<NodeId>`.
pub type NodeId = i32;

/// An offset together with the leader epoch it belongs to, ordered as Kafka's
/// `OffsetAndEpoch.compareTo`: first by epoch, then by offset. A Vote is granted only to a
/// candidate whose `(last epoch, end offset)` is at least the voter's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OffsetAndEpoch {
    /// The offset (for a log end, the offset of the next record).
    pub offset: i64,
    /// The leader epoch.
    pub epoch: i32,
}

impl OffsetAndEpoch {
    /// `(offset, epoch)`.
    pub const fn new(offset: i64, epoch: i32) -> Self {
        Self { offset, epoch }
    }
}

impl Ord for OffsetAndEpoch {
    fn cmp(&self, other: &Self) -> Ordering {
        self.epoch
            .cmp(&other.epoch)
            .then(self.offset.cmp(&other.offset))
    }
}

impl PartialOrd for OffsetAndEpoch {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The election state a node must make durable before it acts on it: Kafka's `quorum-state`
/// file (`FileQuorumStateStore`: `leaderEpoch`, `leaderId`, `votedId`). A driver completes an
/// [`crate::Action::PersistElectionState`] before executing the actions after it, as Kafka
/// writes the file before answering a Vote or sending one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct ElectionState {
    /// The leader epoch (`leaderEpoch`).
    pub epoch: i32,
    /// The elected leader of `epoch`, if known (`leaderId`, -1 in the file when unknown).
    pub leader_id: Option<NodeId>,
    /// The candidate this node voted for in `epoch`, if any (`votedId`); at most one per epoch.
    pub voted_id: Option<NodeId>,
}

impl fmt::Display for ElectionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "epoch {} leader {:?} voted {:?}",
            self.epoch, self.leader_id, self.voted_id
        )
    }
}

/// Each voter's `(host, port)` from `controller.quorum.voters`.
pub type VoterEndpoints = BTreeMap<NodeId, (String, u16)>;

/// Errors in a static voter set (`controller.quorum.voters`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VoterSetError {
    /// No voter at all.
    #[error("controller.quorum.voters is empty")]
    Empty,
    /// A negative node id.
    #[error("invalid voter id {0}: node ids are >= 0")]
    NegativeId(i32),
    /// One entry of `controller.quorum.voters` is not `{id}@{host}:{port}`.
    #[error("invalid controller.quorum.voters entry {entry:?}: {reason}")]
    BadEntry {
        /// The entry as written.
        entry: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The same id twice.
    #[error("voter id {0} appears more than once in controller.quorum.voters")]
    Duplicate(i32),
}

/// The voters of the quorum. Today the static set of `controller.quorum.voters` (`kraft.version`
/// 0, KIP-595); KIP-853 will make it a versioned set read from `VotersRecord`s in the log, which
/// is why the core asks this type (and not a plain set) who votes and what a majority is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoterSet {
    voters: BTreeSet<NodeId>,
}

impl VoterSet {
    /// A voter set of the given ids.
    ///
    /// # Errors
    /// [`VoterSetError::Empty`] or [`VoterSetError::NegativeId`].
    pub fn new(ids: impl IntoIterator<Item = NodeId>) -> Result<Self, VoterSetError> {
        let mut voters = BTreeSet::new();
        for id in ids {
            if id < 0 {
                return Err(VoterSetError::NegativeId(id));
            }
            voters.insert(id);
        }
        if voters.is_empty() {
            return Err(VoterSetError::Empty);
        }
        Ok(Self { voters })
    }

    /// Parses `controller.quorum.voters`: comma-separated `{id}@{host}:{port}` entries
    /// (`QuorumConfig.parseVoterConnections`). Returns the set and each voter's `host:port`.
    ///
    /// # Errors
    /// [`VoterSetError`] for a malformed entry, a duplicate id or an empty list.
    pub fn parse_quorum_voters(value: &str) -> Result<(Self, VoterEndpoints), VoterSetError> {
        let mut endpoints = BTreeMap::new();
        for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = |reason| VoterSetError::BadEntry {
                entry: entry.to_string(),
                reason,
            };
            let (id, address) = entry.split_once('@').ok_or_else(|| bad("missing '@'"))?;
            // One voter per entry (Kafka splits on ',' and wants exactly one '@'): a list
            // joined with another separator must not read as one voter at a strange host.
            if address.contains('@') {
                return Err(bad("more than one '@' (voters are separated by ',')"));
            }
            if address.chars().any(|c| c.is_whitespace() || c == ';') {
                return Err(bad(
                    "the address has a ';' or a space (voters are separated by ',')",
                ));
            }
            let id: NodeId = id.trim().parse().map_err(|_| bad("id is not an integer"))?;
            if id < 0 {
                return Err(VoterSetError::NegativeId(id));
            }
            let (host, port) = address
                .rsplit_once(':')
                .ok_or_else(|| bad("missing ':port'"))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.is_empty() {
                return Err(bad("empty host"));
            }
            let port: u16 = port.parse().map_err(|_| bad("port is not a u16"))?;
            if endpoints.insert(id, (host.to_string(), port)).is_some() {
                return Err(VoterSetError::Duplicate(id));
            }
        }
        let set = Self::new(endpoints.keys().copied())?;
        Ok((set, endpoints))
    }

    /// True when `id` votes.
    pub fn contains(&self, id: NodeId) -> bool {
        self.voters.contains(&id)
    }

    /// The voter ids, ascending.
    pub fn ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.voters.iter().copied()
    }

    /// Number of voters.
    pub fn len(&self) -> usize {
        self.voters.len()
    }

    /// Never true: a voter set has at least one voter.
    pub fn is_empty(&self) -> bool {
        self.voters.is_empty()
    }

    /// Votes (or replicas) needed for a majority: `len / 2 + 1`.
    pub fn majority(&self) -> usize {
        self.voters.len() / 2 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voters_joined_with_another_separator_are_refused() {
        for bad in [
            "1@127.0.0.1:9093;2@127.0.0.1:9094",
            "1@127.0.0.1:9093 2@127.0.0.1:9094",
        ] {
            assert!(
                matches!(
                    VoterSet::parse_quorum_voters(bad),
                    Err(VoterSetError::BadEntry { .. })
                ),
                "{bad}"
            );
        }
        let (set, endpoints) =
            VoterSet::parse_quorum_voters("1@127.0.0.1:9093, 2@[::1]:9094").unwrap();
        assert_eq!(set.len(), 2);
        assert_eq!(endpoints[&2], ("::1".to_string(), 9094));
    }

    #[test]
    fn offset_and_epoch_orders_by_epoch_first() {
        assert!(OffsetAndEpoch::new(100, 1) < OffsetAndEpoch::new(0, 2));
        assert!(OffsetAndEpoch::new(5, 3) < OffsetAndEpoch::new(6, 3));
        assert_eq!(
            OffsetAndEpoch::new(5, 3).cmp(&OffsetAndEpoch::new(5, 3)),
            Ordering::Equal
        );
    }

    #[test]
    fn parses_controller_quorum_voters() {
        let (set, endpoints) =
            VoterSet::parse_quorum_voters("1@localhost:9093, 2@[::1]:9094,3@h3:9095").unwrap();
        assert_eq!(set.ids().collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(set.majority(), 2);
        assert_eq!(endpoints[&2], ("::1".to_string(), 9094));
        assert!(matches!(
            VoterSet::parse_quorum_voters("1@h:1,1@h:2"),
            Err(VoterSetError::Duplicate(1))
        ));
        assert!(matches!(
            VoterSet::parse_quorum_voters("x@h:1"),
            Err(VoterSetError::BadEntry { .. })
        ));
        assert!(matches!(
            VoterSet::parse_quorum_voters("1@h"),
            Err(VoterSetError::BadEntry { .. })
        ));
        assert_eq!(VoterSet::parse_quorum_voters(""), Err(VoterSetError::Empty));
        assert_eq!(VoterSet::new([0, -1]), Err(VoterSetError::NegativeId(-1)));
    }

    #[test]
    fn majority_of_three_and_five() {
        assert_eq!(VoterSet::new([1, 2, 3]).unwrap().majority(), 2);
        assert_eq!(VoterSet::new([1, 2, 3, 4, 5]).unwrap().majority(), 3);
        assert_eq!(VoterSet::new([7]).unwrap().majority(), 1);
    }
}
