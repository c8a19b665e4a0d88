//! The follower's side of an incremental fetch session (KIP-227), as Kafka's
//! `FetchSessionHandler`: the first fetch to a leader is full (`SessionEpoch` 0); when the
//! leader answers with a session id, the following fetches are incremental: they list only the
//! partitions that are new or whose fetch parameters changed (fetch offset, log start offset,
//! leader epochs, max bytes) and forget those no longer fetched (`ForgottenTopicsData`), and
//! the leader answers only partitions with something new. A partition left out of a response
//! has nothing new: the follower keeps its state.
//!
//! Errors, as Kafka's handler: FETCH_SESSION_ID_NOT_FOUND starts over with a new session; any
//! other top-level error, or a lost connection, sends the next fetch full with the old id
//! (which closes that session on the leader).

use std::collections::{BTreeMap, HashMap};

use gregor_protocol::kafka_protocol::messages::fetch_request::{FetchPartition, ForgottenTopic};
use gregor_protocol::kafka_protocol::messages::{FetchRequest, FetchResponse};
use uuid::Uuid;

use crate::error_codes as ec;
use crate::fetch_session::{next_epoch, INITIAL_EPOCH, INVALID_SESSION_ID};

type Key = (Uuid, i32);

/// A follower's fetch session with one leader.
#[derive(Debug, Default)]
pub(super) struct FollowerSession {
    /// The session id (0: none).
    id: i32,
    /// The epoch of the next fetch (0: a full fetch).
    epoch: i32,
    /// The partitions the leader's session holds, as last sent.
    partitions: HashMap<Key, FetchPartition>,
    /// The partitions of the fetch in flight, which the session holds once it is answered.
    pending: Option<HashMap<Key, FetchPartition>>,
}

impl FollowerSession {
    /// The session id and the next epoch.
    #[cfg(test)]
    pub(super) fn state(&self) -> (i32, i32) {
        (self.id, self.epoch)
    }

    /// Turns a full fetch of every partition wanted into this session's next fetch: full at
    /// epoch 0, or the partitions that changed plus the forgotten ones.
    pub(super) fn prepare(&mut self, mut request: FetchRequest) -> FetchRequest {
        let mut wanted: HashMap<Key, FetchPartition> = HashMap::new();
        for t in &request.topics {
            for p in &t.partitions {
                wanted.insert((t.topic_id, p.partition), p.clone());
            }
        }
        request.session_id = self.id;
        if self.epoch == INITIAL_EPOCH {
            request.session_epoch = INITIAL_EPOCH;
        } else {
            request.session_epoch = self.epoch;
            for t in &mut request.topics {
                let id = t.topic_id;
                t.partitions
                    .retain(|p| self.partitions.get(&(id, p.partition)) != Some(p));
            }
            request.topics.retain(|t| !t.partitions.is_empty());
            let mut forgotten: BTreeMap<Uuid, Vec<i32>> = BTreeMap::new();
            for key in self.partitions.keys() {
                if !wanted.contains_key(key) {
                    forgotten.entry(key.0).or_default().push(key.1);
                }
            }
            request.forgotten_topics_data = forgotten
                .into_iter()
                .map(|(topic_id, mut partitions)| {
                    partitions.sort_unstable();
                    ForgottenTopic::default()
                        .with_topic_id(topic_id)
                        .with_partitions(partitions)
                })
                .collect();
        }
        self.pending = Some(wanted);
        request
    }

    /// Takes the leader's answer to the fetch last prepared. Returns false when the fetch failed
    /// as a whole (the caller backs off).
    pub(super) fn on_response(&mut self, response: &FetchResponse) -> bool {
        let sent = self.pending.take().unwrap_or_default();
        if response.error_code != ec::NONE {
            if response.error_code == ec::FETCH_SESSION_ID_NOT_FOUND {
                self.id = INVALID_SESSION_ID;
            }
            self.restart();
            return false;
        }
        if self.epoch == INITIAL_EPOCH {
            self.id = response.session_id;
            if self.id == INVALID_SESSION_ID {
                // No session (the leader's cache is full): keep sending full fetches.
                self.partitions.clear();
            } else {
                self.epoch = next_epoch(INITIAL_EPOCH);
                self.partitions = sent;
            }
        } else {
            self.epoch = next_epoch(self.epoch);
            self.partitions = sent;
        }
        true
    }

    /// The fetch got no answer (connection lost): the next one is full and closes the
    /// session.
    pub(super) fn on_connection_error(&mut self) {
        self.pending = None;
        self.restart();
    }

    fn restart(&mut self) {
        self.epoch = INITIAL_EPOCH;
        self.partitions.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_protocol::kafka_protocol::messages::fetch_request::FetchTopic;

    fn topic(id: Uuid, partitions: Vec<FetchPartition>) -> FetchTopic {
        FetchTopic::default()
            .with_topic_id(id)
            .with_partitions(partitions)
    }

    fn part(p: i32, offset: i64) -> FetchPartition {
        FetchPartition::default()
            .with_partition(p)
            .with_fetch_offset(offset)
            .with_current_leader_epoch(3)
            .with_partition_max_bytes(1 << 20)
    }

    fn wanted(parts: &[(u128, i32, i64)]) -> FetchRequest {
        let mut topics: BTreeMap<u128, Vec<FetchPartition>> = BTreeMap::new();
        for (t, p, o) in parts {
            topics.entry(*t).or_default().push(part(*p, *o));
        }
        FetchRequest::default().with_topics(
            topics
                .into_iter()
                .map(|(t, ps)| topic(Uuid::from_u128(t), ps))
                .collect(),
        )
    }

    fn listed(r: &FetchRequest) -> Vec<(u128, i32, i64)> {
        r.topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(move |p| (t.topic_id.as_u128(), p.partition, p.fetch_offset))
            })
            .collect()
    }

    fn forgotten(r: &FetchRequest) -> Vec<(u128, i32)> {
        r.forgotten_topics_data
            .iter()
            .flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id.as_u128(), *p)))
            .collect()
    }

    fn ok(session_id: i32) -> FetchResponse {
        FetchResponse::default().with_session_id(session_id)
    }

    #[test]
    fn full_then_incremental_fetches() {
        let mut s = FollowerSession::default();
        let r = s.prepare(wanted(&[(1, 0, 10), (1, 1, 20), (2, 0, 30)]));
        assert_eq!((r.session_id, r.session_epoch), (0, 0));
        assert_eq!(listed(&r).len(), 3, "full: every partition");
        assert!(s.on_response(&ok(77)));
        assert_eq!(s.state(), (77, 1));

        // Only partition (1, 1) moved.
        let r = s.prepare(wanted(&[(1, 0, 10), (1, 1, 25), (2, 0, 30)]));
        assert_eq!((r.session_id, r.session_epoch), (77, 1));
        assert_eq!(listed(&r), vec![(1, 1, 25)]);
        assert!(forgotten(&r).is_empty());
        assert!(s.on_response(&ok(77)));
        assert_eq!(s.state(), (77, 2));

        // Nothing moved: an empty incremental fetch.
        let r = s.prepare(wanted(&[(1, 0, 10), (1, 1, 25), (2, 0, 30)]));
        assert_eq!((listed(&r), r.session_epoch), (vec![], 2));
        assert!(s.on_response(&ok(77)));

        // (2, 0) is no longer fetched (backing off), (3, 0) is new.
        let r = s.prepare(wanted(&[(1, 0, 10), (1, 1, 25), (3, 0, 0)]));
        assert_eq!(listed(&r), vec![(3, 0, 0)]);
        assert_eq!(forgotten(&r), vec![(2, 0)]);
        assert!(s.on_response(&ok(77)));
        // (2, 0) comes back: listed again in full.
        let r = s.prepare(wanted(&[(1, 0, 10), (1, 1, 25), (2, 0, 30), (3, 0, 0)]));
        assert_eq!(listed(&r), vec![(2, 0, 30)]);
        assert!(s.on_response(&ok(77)));
        assert_eq!(s.state(), (77, 5));
    }

    #[test]
    fn errors_restart_the_session_as_kafka_does() {
        let mut s = FollowerSession::default();
        s.prepare(wanted(&[(1, 0, 0)]));
        assert!(s.on_response(&ok(5)));
        // A wrong epoch: the next fetch is full and closes session 5.
        s.prepare(wanted(&[(1, 0, 1)]));
        assert!(!s.on_response(
            &FetchResponse::default().with_error_code(ec::INVALID_FETCH_SESSION_EPOCH)
        ));
        let r = s.prepare(wanted(&[(1, 0, 1)]));
        assert_eq!((r.session_id, r.session_epoch, listed(&r).len()), (5, 0, 1));
        assert!(s.on_response(&ok(6)));
        // An unknown session: a new one, naming none.
        s.prepare(wanted(&[(1, 0, 2)]));
        assert!(!s.on_response(
            &FetchResponse::default().with_error_code(ec::FETCH_SESSION_ID_NOT_FOUND)
        ));
        let r = s.prepare(wanted(&[(1, 0, 2)]));
        assert_eq!((r.session_id, r.session_epoch), (0, 0));
        assert!(s.on_response(&ok(0)));
        // The leader had no room: full fetches go on.
        assert_eq!(s.state(), (0, 0));
        let r = s.prepare(wanted(&[(1, 0, 2)]));
        assert_eq!((r.session_id, r.session_epoch, listed(&r).len()), (0, 0, 1));
        assert!(s.on_response(&ok(9)));
        // A lost connection: full again, closing session 9.
        s.prepare(wanted(&[(1, 0, 3)]));
        s.on_connection_error();
        let r = s.prepare(wanted(&[(1, 0, 3)]));
        assert_eq!((r.session_id, r.session_epoch, listed(&r).len()), (9, 0, 1));
    }
}
