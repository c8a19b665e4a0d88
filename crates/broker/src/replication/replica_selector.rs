//! Fetch from follower (KIP-392): which replica a consumer should read a partition from.
//!
//! Kafka loads `replica.selector.class` as a Java plugin (`ReplicaSelector`); gregor cannot
//! load Java classes, so the selectors Kafka ships are built in and named by Kafka's class
//! names ([`ReplicaSelector::from_class_name`]). Kafka 4.4 ships one,
//! `org.apache.kafka.common.replica.RackAwareReplicaSelector`; unset (Kafka's default) means
//! consumers read from the leader only.
//!
//! The leader decides ([`preferred_read_replica`], Kafka's
//! `ReplicaManager.findPreferredReadReplica`) for a consumer's Fetch v11+ (which carries the
//! client's rack, `client.rack`): the candidates are the leader and the followers in the
//! committed ISR whose last fetch showed a log covering the fetch offset (log start offset <=
//! fetch offset <= log end offset); a follower whose broker is fenced, unregistered or has no
//! endpoint on the client's listener has no endpoint and is never chosen. The selector picks one
//! ([`ReplicaSelector::select`]); when it is not the leader, the leader answers with
//! `PreferredReadReplica` and no records, and the client fetches from that replica from then
//! on. Everything here is pure: the caller passes the leader's view of its followers.

use std::collections::BTreeMap;

/// Kafka's rack-aware selector class name, the one `replica.selector.class` value gregor knows.
pub const RACK_AWARE_REPLICA_SELECTOR: &str =
    "org.apache.kafka.common.replica.RackAwareReplicaSelector";

/// A built-in replica selector (Kafka's `ReplicaSelector` implementations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaSelector {
    /// Kafka's `RackAwareReplicaSelector`: a replica in the client's rack (the leader when it
    /// is there, else the most caught-up one), otherwise the leader.
    RackAware,
}

impl ReplicaSelector {
    /// The selector `replica.selector.class` names: `None` when empty (Kafka's default, the
    /// leader serves every consumer fetch).
    ///
    /// # Errors
    /// The reason, for any other class name: gregor cannot load Java classes, so only the
    /// selector Kafka ships is known.
    pub fn from_class_name(class_name: &str) -> Result<Option<Self>, String> {
        match class_name.trim() {
            "" => Ok(None),
            RACK_AWARE_REPLICA_SELECTOR => Ok(Some(Self::RackAware)),
            other => Err(format!(
                "Class {other} cannot be found: gregor cannot load Java classes; the replica \
                 selector it has built in is {RACK_AWARE_REPLICA_SELECTOR} (leave the config \
                 unset to serve consumers from the leader only)"
            )),
        }
    }

    /// Kafka's `ReplicaSelector.select`: the replica of `partition` the client should fetch
    /// from, `None` when there is none.
    pub fn select<'a>(
        self,
        client: &ClientMetadata,
        partition: &'a PartitionView,
    ) -> Option<&'a ReplicaView> {
        match self {
            Self::RackAware => rack_aware_select(client, partition),
        }
    }
}

/// Kafka's `RackAwareReplicaSelector.select`.
fn rack_aware_select<'a>(
    client: &ClientMetadata,
    partition: &'a PartitionView,
) -> Option<&'a ReplicaView> {
    if client.rack_id.is_empty() {
        return Some(&partition.leader);
    }
    let same_rack: Vec<&ReplicaView> = partition
        .replicas
        .iter()
        .filter(|r| r.rack.as_deref() == Some(client.rack_id.as_str()))
        .collect();
    if same_rack.is_empty() || same_rack.iter().any(|r| **r == partition.leader) {
        return Some(&partition.leader);
    }
    same_rack.into_iter().max_by(|a, b| most_caught_up(a, b))
}

/// Kafka's `ReplicaView.comparator()`: larger log end offset, then shorter time since caught
/// up, then larger broker id is "more caught up".
fn most_caught_up(a: &ReplicaView, b: &ReplicaView) -> std::cmp::Ordering {
    a.log_end_offset
        .cmp(&b.log_end_offset)
        .then(
            b.time_since_last_caught_up_ms
                .cmp(&a.time_since_last_caught_up_ms),
        )
        .then(a.endpoint_id().cmp(&b.endpoint_id()))
}

/// What a Fetch v11+ tells about the client (Kafka's `ClientMetadata`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientMetadata {
    /// The client's rack (`client.rack`, Fetch `RackId`); empty when not set.
    pub rack_id: String,
    /// The client id of the request header.
    pub client_id: String,
    /// The listener the request came in on; replicas are named by their endpoint on it.
    pub listener_name: String,
}

/// One replica as the selector sees it (Kafka's `ReplicaView`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaView {
    /// The broker id.
    pub broker_id: i32,
    /// Whether the broker has a usable endpoint on the client's listener (Kafka's non-empty
    /// `Node`); a replica without one has no rack either.
    pub has_endpoint: bool,
    /// `broker.rack` of the broker, when it has an endpoint and a rack.
    pub rack: Option<String>,
    /// The replica's log end offset (the leader's own; a follower's from its last fetch).
    pub log_end_offset: i64,
    /// Milliseconds since the replica was last caught up with the leader; 0 for the leader.
    pub time_since_last_caught_up_ms: i64,
}

impl ReplicaView {
    /// Kafka's `endpoint().id()`: the broker id, -1 without an endpoint (`Node.noNode()`).
    fn endpoint_id(&self) -> i32 {
        if self.has_endpoint {
            self.broker_id
        } else {
            -1
        }
    }
}

/// The candidates of one partition (Kafka's `PartitionView`): `replicas` includes `leader`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionView {
    /// The leader and the eligible followers.
    pub replicas: Vec<ReplicaView>,
    /// The leader.
    pub leader: ReplicaView,
}

/// A registered broker as far as replica selection needs it (from the metadata image).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerNode {
    /// Fenced brokers have no endpoint for clients (Kafka's `getPartitionReplicaEndpoints`).
    pub fenced: bool,
    /// `broker.rack`.
    pub rack: Option<String>,
    /// The names of its listeners with a host and a port.
    pub listeners: Vec<String>,
}

/// Every registered broker by id, from the latest metadata image.
pub type BrokerNodes = BTreeMap<i32, BrokerNode>;

/// A follower's state as the leader last saw it (from [`super::leader::FollowerState`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerView {
    /// The follower's broker id.
    pub broker_id: i32,
    /// Its log start offset from its last fetch (-1 before one).
    pub log_start_offset: i64,
    /// Its log end offset from its last fetch (-1 before one).
    pub log_end_offset: i64,
    /// When it was last caught up with the leader (ms since the epoch).
    pub last_caught_up_time_ms: i64,
}

/// The leader's side of one consumer fetch, for [`preferred_read_replica`].
#[derive(Debug, Clone)]
pub struct LeaderView<'a> {
    /// This broker's id.
    pub leader_id: i32,
    /// The leader's log end offset.
    pub log_end_offset: i64,
    /// The committed ISR.
    pub isr: &'a [i32],
    /// The followers (every replica but the leader).
    pub followers: Vec<FollowerView>,
}

/// Kafka's `ReplicaManager.findPreferredReadReplica` on the leader, for a consumer fetch
/// (callers never ask for a follower's fetch): the candidates are the leader and the followers
/// in the committed ISR with `log start offset <= fetch_offset <= log end offset`; the
/// selector picks one. Returns the chosen broker id when it is a follower with an endpoint on
/// the client's listener, `None` when the leader should serve the fetch itself.
pub fn preferred_read_replica(
    selector: ReplicaSelector,
    client: &ClientMetadata,
    leader: &LeaderView<'_>,
    brokers: &BrokerNodes,
    fetch_offset: i64,
    now_ms: i64,
) -> Option<i32> {
    let node = |id: i32| -> (bool, Option<String>) {
        match brokers.get(&id) {
            Some(b) if !b.fenced && b.listeners.contains(&client.listener_name) => {
                (true, b.rack.clone())
            }
            _ => (false, None),
        }
    };
    let (has_endpoint, rack) = node(leader.leader_id);
    let leader_view = ReplicaView {
        broker_id: leader.leader_id,
        has_endpoint,
        rack,
        log_end_offset: leader.log_end_offset,
        time_since_last_caught_up_ms: 0,
    };
    let mut replicas: Vec<ReplicaView> = leader
        .followers
        .iter()
        // Out-of-sync followers may lag without bound: a consumer sent there would fall behind
        // (Kafka's comment), so only the ISR, and only logs that hold the fetch offset.
        .filter(|f| {
            leader.isr.contains(&f.broker_id)
                && f.log_end_offset >= fetch_offset
                && f.log_start_offset <= fetch_offset
        })
        .map(|f| {
            let (has_endpoint, rack) = node(f.broker_id);
            ReplicaView {
                broker_id: f.broker_id,
                has_endpoint,
                rack,
                log_end_offset: f.log_end_offset,
                time_since_last_caught_up_ms: now_ms.saturating_sub(f.last_caught_up_time_ms),
            }
        })
        .collect();
    replicas.push(leader_view.clone());
    let partition = PartitionView {
        replicas,
        leader: leader_view,
    };
    selector
        .select(client, &partition)
        .filter(|r| r.has_endpoint && **r != partition.leader)
        .map(|r| r.broker_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;

    fn client(rack: &str) -> ClientMetadata {
        ClientMetadata {
            rack_id: rack.into(),
            client_id: "c".into(),
            listener_name: "PLAINTEXT".into(),
        }
    }

    /// Brokers 1..=4 in racks r1..r4 (broker 4 also in r3), all with a PLAINTEXT listener.
    fn brokers() -> BrokerNodes {
        [(1, "r1"), (2, "r2"), (3, "r3"), (4, "r3")]
            .into_iter()
            .map(|(id, rack)| {
                (
                    id,
                    BrokerNode {
                        fenced: false,
                        rack: Some(rack.into()),
                        listeners: vec!["PLAINTEXT".into()],
                    },
                )
            })
            .collect()
    }

    fn follower(id: i32, start: i64, end: i64, caught_up_ago_ms: i64) -> FollowerView {
        FollowerView {
            broker_id: id,
            log_start_offset: start,
            log_end_offset: end,
            last_caught_up_time_ms: NOW - caught_up_ago_ms,
        }
    }

    fn pick(
        rack: &str,
        isr: &[i32],
        followers: Vec<FollowerView>,
        brokers: &BrokerNodes,
        fetch_offset: i64,
    ) -> Option<i32> {
        let leader = LeaderView {
            leader_id: 1,
            log_end_offset: 100,
            isr,
            followers,
        };
        preferred_read_replica(
            ReplicaSelector::RackAware,
            &client(rack),
            &leader,
            brokers,
            fetch_offset,
            NOW,
        )
    }

    #[test]
    fn class_names() {
        assert_eq!(ReplicaSelector::from_class_name(""), Ok(None));
        assert_eq!(ReplicaSelector::from_class_name("  "), Ok(None));
        assert_eq!(
            ReplicaSelector::from_class_name(RACK_AWARE_REPLICA_SELECTOR),
            Ok(Some(ReplicaSelector::RackAware))
        );
        let e = ReplicaSelector::from_class_name("com.example.MySelector").unwrap_err();
        assert!(e.contains("com.example.MySelector"), "{e}");
        assert!(e.contains("cannot load Java classes"), "{e}");
        // Kafka 4.4 ships no LeaderSelector: unset is "the leader only".
        assert!(
            ReplicaSelector::from_class_name("org.apache.kafka.common.replica.LeaderSelector")
                .is_err()
        );
    }

    #[test]
    fn a_follower_in_the_clients_rack_is_preferred() {
        let b = brokers();
        let f = || vec![follower(2, 0, 100, 0), follower(3, 0, 90, 0)];
        assert_eq!(pick("r2", &[1, 2, 3], f(), &b, 50), Some(2));
        assert_eq!(pick("r3", &[1, 2, 3], f(), &b, 50), Some(3));
        // The leader's rack, an unknown rack, no rack: the leader serves (None).
        assert_eq!(pick("r1", &[1, 2, 3], f(), &b, 50), None);
        assert_eq!(pick("elsewhere", &[1, 2, 3], f(), &b, 50), None);
        assert_eq!(pick("", &[1, 2, 3], f(), &b, 50), None);
    }

    #[test]
    fn only_in_sync_followers_whose_log_holds_the_fetch_offset() {
        let b = brokers();
        // Not in the committed ISR.
        assert_eq!(
            pick("r2", &[1, 3], vec![follower(2, 0, 100, 0)], &b, 50),
            None
        );
        // Log end offset below the fetch offset (equal is fine: the consumer waits there).
        assert_eq!(
            pick("r2", &[1, 2], vec![follower(2, 0, 49, 0)], &b, 50),
            None
        );
        assert_eq!(
            pick("r2", &[1, 2], vec![follower(2, 0, 50, 0)], &b, 50),
            Some(2)
        );
        // Log start offset above the fetch offset.
        assert_eq!(
            pick("r2", &[1, 2], vec![follower(2, 51, 100, 0)], &b, 50),
            None
        );
        // Before its first fetch (both offsets unknown, -1).
        assert_eq!(
            pick("r2", &[1, 2], vec![follower(2, -1, -1, 0)], &b, 0),
            None
        );
    }

    #[test]
    fn fenced_unregistered_or_listenerless_brokers_are_never_chosen() {
        let mut b = brokers();
        b.get_mut(&2).unwrap().fenced = true;
        assert_eq!(
            pick("r2", &[1, 2], vec![follower(2, 0, 100, 0)], &b, 50),
            None
        );
        let mut b = brokers();
        b.get_mut(&2).unwrap().listeners = vec!["INTERNAL".into()];
        assert_eq!(
            pick("r2", &[1, 2], vec![follower(2, 0, 100, 0)], &b, 50),
            None
        );
        let mut b = brokers();
        b.remove(&2);
        assert_eq!(
            pick("r2", &[1, 2], vec![follower(2, 0, 100, 0)], &b, 50),
            None
        );
    }

    #[test]
    fn the_most_caught_up_replica_of_the_rack_wins() {
        let b = brokers();
        // Brokers 3 and 4 share r3: the larger log end offset first...
        let f = vec![follower(3, 0, 90, 0), follower(4, 0, 95, 0)];
        assert_eq!(pick("r3", &[1, 3, 4], f, &b, 50), Some(4));
        // ...then the shorter time since caught up...
        let f = vec![follower(3, 0, 95, 10), follower(4, 0, 95, 500)];
        assert_eq!(pick("r3", &[1, 3, 4], f, &b, 50), Some(3));
        // ...then the larger broker id.
        let f = vec![follower(3, 0, 95, 10), follower(4, 0, 95, 10)];
        assert_eq!(pick("r3", &[1, 3, 4], f, &b, 50), Some(4));
    }

    #[test]
    fn the_leader_in_the_clients_rack_serves_itself() {
        let mut b = brokers();
        b.get_mut(&2).unwrap().rack = Some("r1".into());
        // Broker 2 shares the leader's rack r1 and is ahead of nobody: the leader stays.
        assert_eq!(
            pick("r1", &[1, 2], vec![follower(2, 0, 100, 0)], &b, 50),
            None
        );
    }
}
