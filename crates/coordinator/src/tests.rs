//! The group coordinator's state machines driven without a broker: an in-memory
//! [`PartitionWriter`] (a log per partition, a high watermark the test moves) and a
//! [`ManualClock`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use gregor_log::clock::{ManualClock, SharedClock};
use gregor_protocol::error::ErrorCode;
use parking_lot::Mutex;
use uuid::Uuid;

use crate::group::assignor::Assignment;
use crate::group::classic::{JoinRequest, LeavingMember};
use crate::group::consumer::HeartbeatRequest;
use crate::group::offsets::{CommitRequest, OffsetToCommit};
use crate::group::{GroupConfig, GroupCoordinator, Timer, Wait};
use crate::runtime::{HighWatermarkFuture, PartitionWriter, TopicMetadata};

/// One partition of the in-memory log: its batches and the offset of each.
#[derive(Default)]
pub(crate) struct MemoryPartition {
    /// (base offset, batch bytes with the base offset patched).
    pub(crate) batches: Vec<(i64, Vec<u8>)>,
    pub(crate) log_end_offset: i64,
    pub(crate) high_watermark: i64,
    pub(crate) leader: bool,
}

/// An in-memory `__consumer_offsets`. With `auto_commit` the high watermark follows every
/// append (one replica); without it the test moves it with [`MemoryWriter::advance_hw`].
#[derive(Default)]
pub(crate) struct MemoryWriter {
    pub(crate) partitions: Mutex<HashMap<i32, MemoryPartition>>,
    pub(crate) auto_commit: std::sync::atomic::AtomicBool,
    pub(crate) fail_appends: Mutex<Option<ErrorCode>>,
    waiters: Mutex<Vec<(i32, i64, tokio::sync::oneshot::Sender<()>)>>,
}

impl MemoryWriter {
    pub(crate) fn new(partitions: i32) -> Arc<Self> {
        let w = Self::default();
        w.auto_commit
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for p in 0..partitions {
            w.partitions.lock().insert(
                p,
                MemoryPartition {
                    leader: true,
                    ..MemoryPartition::default()
                },
            );
        }
        Arc::new(w)
    }

    pub(crate) fn set_leader(&self, partition: i32, leader: bool) {
        if let Some(p) = self.partitions.lock().get_mut(&partition) {
            p.leader = leader;
        }
    }

    /// Moves the high watermark of `partition` to its log end offset and wakes waiters.
    pub(crate) fn advance_hw(&self, partition: i32) {
        let hw = {
            let mut ps = self.partitions.lock();
            let Some(p) = ps.get_mut(&partition) else {
                return;
            };
            p.high_watermark = p.log_end_offset;
            p.high_watermark
        };
        let mut ws = self.waiters.lock();
        let (done, keep): (Vec<_>, Vec<_>) = ws
            .drain(..)
            .partition(|(p, offset, _)| *p == partition && *offset <= hw);
        *ws = keep;
        for (_, _, tx) in done {
            let _ = tx.send(());
        }
    }

    /// Leadership moved before the high watermark passed the pending writes: their waits fail.
    pub(crate) fn drop_waiters(&self) {
        self.waiters.lock().clear();
    }

    pub(crate) fn record_count(&self, partition: i32) -> usize {
        self.partitions.lock().get(&partition).map_or(0, |p| {
            p.batches
                .iter()
                .map(|(_, b)| {
                    gregor_protocol::records::decode_records(b)
                        .map(|r| r.len())
                        .unwrap_or(0)
                })
                .sum()
        })
    }
}

impl PartitionWriter for MemoryWriter {
    fn is_leader(&self, _topic: &str, partition: i32) -> bool {
        self.partitions
            .lock()
            .get(&partition)
            .is_some_and(|p| p.leader)
    }

    fn append(
        &self,
        _topic: &str,
        partition: i32,
        batch: &mut [u8],
    ) -> Result<i64, (ErrorCode, String)> {
        if let Some(code) = *self.fail_appends.lock() {
            return Err((code, "injected".into()));
        }
        let auto = self.auto_commit.load(std::sync::atomic::Ordering::SeqCst);
        let mut ps = self.partitions.lock();
        let Some(p) = ps.get_mut(&partition) else {
            return Err((ErrorCode::UnknownTopicOrPartition, String::new()));
        };
        if !p.leader {
            return Err((ErrorCode::NotLeaderOrFollower, String::new()));
        }
        let header = gregor_protocol::batch::Batches::new(batch)
            .next()
            .and_then(Result::ok)
            .map(|(_, h)| h)
            .ok_or((ErrorCode::CorruptMessage, "no batch".to_string()))?;
        let count = i64::from(header.last_offset_delta) + 1;
        let base = p.log_end_offset;
        batch[..8].copy_from_slice(&base.to_be_bytes());
        p.batches.push((base, batch.to_vec()));
        p.log_end_offset = base + count;
        if auto {
            p.high_watermark = p.log_end_offset;
        }
        Ok(p.log_end_offset)
    }

    fn high_watermark(&self, _topic: &str, partition: i32) -> Option<i64> {
        self.partitions
            .lock()
            .get(&partition)
            .map(|p| p.high_watermark)
    }

    fn log_start_offset(&self, _topic: &str, partition: i32) -> Option<i64> {
        self.partitions.lock().get(&partition).map(|_| 0)
    }

    fn read(
        &self,
        _topic: &str,
        partition: i32,
        offset: i64,
        _max_bytes: usize,
    ) -> Result<Bytes, (ErrorCode, String)> {
        let ps = self.partitions.lock();
        let Some(p) = ps.get(&partition) else {
            return Err((ErrorCode::UnknownTopicOrPartition, String::new()));
        };
        let mut out = Vec::new();
        for (base, b) in &p.batches {
            if *base >= offset && *base < p.high_watermark {
                out.extend_from_slice(b);
            }
        }
        Ok(Bytes::from(out))
    }

    fn wait_for_high_watermark(
        &self,
        _topic: &str,
        partition: i32,
        offset: i64,
        _timeout_ms: i64,
    ) -> HighWatermarkFuture {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.waiters.lock().push((partition, offset, tx));
        Box::pin(async move { rx.await.map_err(|_| ErrorCode::NotLeaderOrFollower) })
    }
}

/// Topics for KIP-848 subscriptions.
#[derive(Default)]
pub(crate) struct MemoryTopics(pub(crate) Mutex<BTreeMap<String, (Uuid, i32)>>);

impl TopicMetadata for MemoryTopics {
    fn topic(&self, name: &str) -> Option<(Uuid, i32)> {
        self.0.lock().get(name).copied()
    }
}

/// A coordinator over an in-memory log, with its clock and topics.
pub(crate) struct Harness {
    pub(crate) coordinator: GroupCoordinator,
    pub(crate) writer: Arc<MemoryWriter>,
    pub(crate) topics: Arc<MemoryTopics>,
    pub(crate) clock: Arc<ManualClock>,
}

/// A coordinator with every partition of `config` led here but none loaded.
pub(crate) fn coordinator(config: GroupConfig) -> Harness {
    let writer = MemoryWriter::new(config.offsets_topic_num_partitions);
    let topics = Arc::new(MemoryTopics::default());
    let clock = ManualClock::new(1_000_000);
    let shared: SharedClock = clock.clone();
    let coordinator = GroupCoordinator::new(config, writer.clone(), topics.clone(), shared);
    Harness {
        coordinator,
        writer,
        topics,
        clock,
    }
}

/// A harness with `partitions` partitions of `__consumer_offsets`, all loaded.
fn loaded(partitions: i32) -> Harness {
    let config = GroupConfig {
        offsets_topic_num_partitions: partitions,
        ..GroupConfig::default()
    };
    let h = coordinator(config);
    for p in 0..partitions {
        h.coordinator.on_became_leader(p);
    }
    h
}

fn join_request(group: &str, member: &str) -> JoinRequest {
    JoinRequest {
        group_id: group.into(),
        member_id: member.into(),
        group_instance_id: None,
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 20_000,
        protocol_type: "consumer".into(),
        protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        require_known_member_id: true,
        reason: None,
    }
}

fn ready<T>(w: Wait<T>) -> T {
    match w {
        Wait::Ready(t) => t,
        Wait::Pending(mut rx) => rx.try_recv().expect("answered"),
    }
}

fn commit(group: &str, offset: i64) -> CommitRequest {
    CommitRequest {
        group_id: group.into(),
        generation_id_or_member_epoch: -1,
        member_id: String::new(),
        group_instance_id: None,
        retention_time_ms: -1,
        api_version: 9,
        offsets: vec![OffsetToCommit {
            topic: "t".into(),
            partition: 0,
            offset,
            leader_epoch: -1,
            metadata: Some("m".into()),
        }],
    }
}

fn fetched(c: &GroupCoordinator, group: &str) -> i64 {
    c.fetch_offsets(group, Some(vec![("t".into(), vec![0])]), None)
        .expect("fetch")[0]
        .offset
}

const NONE: i16 = ErrorCode::None.code();

#[test]
fn classic_join_sync_heartbeat_session_timeout_and_leave() {
    let h = loaded(1);
    let c = &h.coordinator;
    // KIP-394: a new member first gets its id.
    let r = ready(c.join_group(join_request("g", "")));
    assert_eq!(r.error_code, ErrorCode::MemberIdRequired.code());
    let member = r.member_id.to_string();
    // The join waits for KIP-134's initial delay (3 s), on the coordinator's clock.
    let Wait::Pending(mut join) = c.join_group(join_request("g", &member)) else {
        panic!("the first join waits for group.initial.rebalance.delay.ms");
    };
    h.clock.advance_ms(2_999);
    c.fire_expired_timers();
    assert!(join.try_recv().is_err(), "still within the initial delay");
    h.clock.advance_ms(1);
    c.fire_expired_timers();
    let r = join.try_recv().expect("join completed");
    assert_eq!(r.error_code, NONE);
    assert_eq!(r.generation_id, 1);
    assert_eq!(r.leader.as_str(), member);
    assert_eq!(r.members.len(), 1, "the leader gets the members");

    // A heartbeat during CompletingRebalance is fine; the leader's SyncGroup makes it Stable.
    assert_eq!(c.heartbeat("g", 1, &member, None), NONE);
    assert_eq!(
        c.heartbeat("g", 0, &member, None),
        ErrorCode::IllegalGeneration.code()
    );
    let s = ready(c.sync_group(
        "g",
        1,
        &member,
        None,
        None,
        None,
        vec![(member.clone(), Bytes::from_static(b"assignment"))],
    ));
    assert_eq!(s.error_code, NONE);
    assert_eq!(&s.assignment[..], b"assignment");
    assert_eq!(c.groups()["g"].state_name(), "Stable");
    // The group's metadata record was written.
    assert_eq!(h.writer.record_count(0), 1);

    // Heartbeats keep the member; silence for a session timeout removes it.
    h.clock.advance_ms(9_000);
    assert_eq!(c.heartbeat("g", 1, &member, None), NONE);
    h.clock.advance_ms(9_000);
    c.fire_expired_timers();
    let still_member = match &c.groups()["g"].kind {
        crate::group::GroupKind::Classic(g) => g.members.contains_key(&member),
        crate::group::GroupKind::Consumer(_) => false,
    };
    assert!(still_member, "the heartbeat 9 s ago renewed the session");
    h.clock.advance_ms(1_001);
    c.fire_expired_timers();
    assert_eq!(
        c.heartbeat("g", 1, &member, None),
        ErrorCode::UnknownMemberId.code()
    );
    assert_eq!(c.groups()["g"].state_name(), "Empty");
    match &c.groups()["g"].kind {
        crate::group::GroupKind::Classic(g) => assert_eq!(g.generation_id, 2),
        crate::group::GroupKind::Consumer(_) => panic!("a classic group"),
    }

    // Join again and leave during the initial delay: the waiting JoinGroup is answered
    // UNKNOWN_MEMBER_ID, and the rebalance ends Empty when the delay runs out.
    let r = ready(c.join_group(join_request("g", "")));
    let member = r.member_id.to_string();
    let Wait::Pending(mut join) = c.join_group(join_request("g", &member)) else {
        panic!("waits for the initial delay");
    };
    let (code, per_member) = c.leave_group(
        "g",
        &[LeavingMember {
            member_id: member.clone(),
            group_instance_id: None,
        }],
    );
    assert_eq!((code, per_member), (NONE, vec![NONE]));
    let r = join.try_recv().expect("answered");
    assert_eq!(r.error_code, ErrorCode::UnknownMemberId.code());
    assert_eq!(c.groups()["g"].state_name(), "PreparingRebalance");
    h.clock.advance_ms(3_000);
    c.fire_expired_timers();
    assert_eq!(c.groups()["g"].state_name(), "Empty");
}

#[test]
fn kip848_heartbeat_epochs_and_session_timeout() {
    let h = loaded(1);
    let c = &h.coordinator;
    h.topics
        .0
        .lock()
        .insert("t".into(), (Uuid::from_u128(1), 4));
    let hb = |member: &str, epoch: i32, owned: Option<Assignment>| {
        ready(c.consumer_group_heartbeat(HeartbeatRequest {
            group_id: "cg".into(),
            member_id: member.into(),
            member_epoch: epoch,
            instance_id: None,
            rack_id: None,
            rebalance_timeout_ms: 30_000,
            subscribed_topic_names: (epoch == 0).then(|| vec!["t".into()]),
            subscribed_topic_regex: None,
            server_assignor: None,
            owned,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            version: 0,
        }))
    };
    let r = hb("", 0, Some(Assignment::new()));
    assert_eq!(r.error_code, NONE);
    let a = r.member_id.clone().expect("member id");
    assert_eq!(r.member_epoch, 1, "joining bumps the group epoch to 1");
    let assigned = r.assignment.expect("an assignment");
    assert_eq!(assigned[&Uuid::from_u128(1)].len(), 4);

    // A second member joins: epoch 2; the first must give up half before b gets them.
    let r = hb("", 0, Some(Assignment::new()));
    let b = r.member_id.clone().expect("member id");
    assert_eq!(r.member_epoch, 2);
    let r = hb(&a, 1, Some(assigned.clone()));
    assert_eq!(r.error_code, NONE);
    assert_eq!(r.member_epoch, 1, "a keeps epoch 1 until it revoked");
    let kept = r.assignment.expect("the reduced assignment");
    assert_eq!(kept[&Uuid::from_u128(1)].len(), 2);
    let r = hb(&a, 1, Some(kept.clone()));
    assert_eq!(r.member_epoch, 2, "revoked: a reaches the group epoch");

    // A stale epoch is fenced (an older one than the member's previous epoch).
    let r = hb(&a, 7, Some(kept.clone()));
    assert_eq!(r.error_code, ErrorCode::FencedMemberEpoch.code());

    // b stops heartbeating: after group.consumer.session.timeout.ms (45 s) it is removed and
    // the group epoch moves on.
    h.clock.advance_ms(44_000);
    c.fire_expired_timers();
    let r = hb(&a, 2, Some(kept.clone()));
    assert_eq!(r.member_epoch, 2, "b is still a member");
    h.clock.advance_ms(1_001);
    c.fire_expired_timers();
    let r = hb(&b, 2, Some(Assignment::new()));
    assert_eq!(r.error_code, ErrorCode::UnknownMemberId.code());
    let r = hb(&a, 2, Some(kept));
    assert_eq!(r.member_epoch, 3, "b's removal bumped the group epoch");
}

#[test]
fn offsets_commit_fetch_and_survive_unload_and_reload() {
    let h = loaded(2);
    let c = &h.coordinator;
    assert_eq!(ready(c.commit_offsets(commit("simple", 42))), vec![NONE]);
    assert_eq!(fetched(c, "simple"), 42);
    assert_eq!(fetched(c, "other"), -1);
    let p = c.partition_for("simple");

    // Losing leadership drops the partition's groups: NOT_COORDINATOR.
    h.writer.set_leader(p, false);
    c.on_resigned(p);
    assert_eq!(
        c.fetch_offsets("simple", None, None).err(),
        Some(ErrorCode::NotCoordinator.code())
    );
    assert!(c.groups().get("simple").is_none());

    // While a partition loads, its groups answer COORDINATOR_LOAD_IN_PROGRESS.
    assert!(c.runtime().begin_load(p));
    assert_eq!(
        c.check_coordinator("simple").err(),
        Some(ErrorCode::CoordinatorLoadInProgress.code())
    );
    c.runtime().unload(p);

    // Leading again replays the partition: the offset is back.
    h.writer.set_leader(p, true);
    c.on_became_leader(p);
    assert_eq!(fetched(c, "simple"), 42);
}

#[test]
fn append_errors_map_to_coordinator_codes() {
    let h = loaded(1);
    let c = &h.coordinator;
    *h.writer.fail_appends.lock() = Some(ErrorCode::NotEnoughReplicas);
    assert_eq!(
        ready(c.commit_offsets(commit("g", 1))),
        vec![ErrorCode::CoordinatorNotAvailable.code()]
    );
    *h.writer.fail_appends.lock() = Some(ErrorCode::NotLeaderOrFollower);
    assert_eq!(
        ready(c.commit_offsets(commit("g", 1))),
        vec![ErrorCode::NotCoordinator.code()]
    );
    *h.writer.fail_appends.lock() = None;
    assert_eq!(fetched(c, "g"), -1, "a failed commit is not applied");
}

#[tokio::test]
async fn an_offset_commit_is_answered_when_the_high_watermark_passes_it() {
    let h = loaded(1);
    let c = &h.coordinator;
    h.writer
        .auto_commit
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let Wait::Pending(rx) = c.commit_offsets(commit("g", 9)) else {
        panic!("not committed yet: the answer must wait");
    };
    let answer = tokio::spawn(rx);
    tokio::task::yield_now().await;
    assert!(!answer.is_finished(), "waits for the high watermark");
    h.writer.advance_hw(0);
    let errors = answer.await.expect("task").expect("answered");
    assert_eq!(errors, vec![NONE]);
}

#[tokio::test]
async fn timers_run_on_the_runtime_in_deadline_order() {
    let h = coordinator(GroupConfig::default());
    let rt = h.coordinator.runtime();
    let now = rt.now_ms();
    let t = |id| Timer::Rebalance {
        group_id: "g".into(),
        id,
        delay_ms: 0,
    };
    rt.schedule_at(now + 20, t(2));
    rt.schedule_at(now + 10, t(1));
    rt.schedule_at(now + 30, t(3));
    assert_eq!(rt.next_timer_deadline(), Some(now + 10));
    assert!(rt.expired_timers(now + 9).is_empty());
    assert_eq!(rt.expired_timers(now + 20), vec![t(1), t(2)]);
    assert_eq!(rt.pending_timers(), 1);
}

#[tokio::test]
async fn a_commit_that_loses_leadership_before_the_high_watermark_is_not_coordinator() {
    let h = loaded(1);
    let c = &h.coordinator;
    h.writer
        .auto_commit
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let Wait::Pending(rx) = c.commit_offsets(commit("g", 9)) else {
        panic!("not committed yet");
    };
    let answer = tokio::spawn(rx);
    tokio::task::yield_now().await;
    h.writer.drop_waiters();
    let errors = answer.await.expect("task").expect("answered");
    assert_eq!(errors, vec![ErrorCode::NotCoordinator.code()]);
}

/// Kafka's `prepareRebalance`: the first rebalance of an empty group ends on the delayed-join
/// timer even when `group.initial.rebalance.delay.ms` is 0, so a member joining right after
/// the first (before the timer fires) is in generation 1 with it. gregor completed that join
/// inline when the delay was 0, and generation 1 had the first member alone.
#[test]
fn initial_rebalance_with_no_delay_still_ends_on_the_timer() {
    let config = GroupConfig {
        offsets_topic_num_partitions: 1,
        initial_rebalance_delay_ms: 0,
        ..GroupConfig::default()
    };
    let h = coordinator(config);
    h.coordinator.on_became_leader(0);
    let c = &h.coordinator;
    let a = ready(c.join_group(join_request("g", "")))
        .member_id
        .to_string();
    let b = ready(c.join_group(join_request("g", "")))
        .member_id
        .to_string();
    let Wait::Pending(mut join_a) = c.join_group(join_request("g", &a)) else {
        panic!("the first join of an empty group waits for the delayed-join timer");
    };
    let Wait::Pending(mut join_b) = c.join_group(join_request("g", &b)) else {
        panic!("the second member waits with the first");
    };
    assert!(join_a.try_recv().is_err());
    // The timer is due at once; a member that joined meanwhile extends it by 0 ms once.
    c.fire_expired_timers();
    c.fire_expired_timers();
    let (ra, rb) = (
        join_a.try_recv().expect("a answered"),
        join_b.try_recv().expect("b answered"),
    );
    assert_eq!((ra.error_code, rb.error_code), (NONE, NONE));
    assert_eq!((ra.generation_id, rb.generation_id), (1, 1));
    assert_eq!(
        ra.members.len() + rb.members.len(),
        2,
        "the leader sees both"
    );
}

/// Kafka waits the whole `group.initial.rebalance.delay.ms` for the first rebalance even when
/// the members' rebalance timeout is shorter (it only bounds the extensions); gregor cut the
/// delay to the rebalance timeout.
#[test]
fn initial_rebalance_delay_is_not_cut_to_the_rebalance_timeout() {
    let h = loaded(1);
    let c = &h.coordinator;
    let a = ready(c.join_group(join_request("g", "")))
        .member_id
        .to_string();
    let mut req = join_request("g", &a);
    req.rebalance_timeout_ms = 1_000;
    let Wait::Pending(mut join) = c.join_group(req) else {
        panic!("the first join waits");
    };
    h.clock.advance_ms(1_000);
    c.fire_expired_timers();
    assert!(
        join.try_recv().is_err(),
        "still within the 3 s initial delay"
    );
    h.clock.advance_ms(2_000);
    c.fire_expired_timers();
    assert_eq!(join.try_recv().expect("answered").generation_id, 1);
}

fn txn_commit(
    group: &str,
    producer_id: i64,
    generation_id: i32,
    member_id: &str,
    offset: i64,
) -> crate::group::txn_offsets::TxnCommitRequest {
    crate::group::txn_offsets::TxnCommitRequest {
        group_id: group.into(),
        producer_id,
        producer_epoch: 0,
        generation_id,
        member_id: member_id.into(),
        group_instance_id: None,
        offsets: vec![OffsetToCommit {
            topic: "t".into(),
            partition: 0,
            offset,
            leader_epoch: -1,
            metadata: None,
        }],
    }
}

fn stable_offset(c: &GroupCoordinator, group: &str) -> (i64, i16) {
    let f = c
        .fetch_offsets_stable(group, Some(vec![("t".into(), vec![0])]), None, true)
        .expect("fetched");
    (f[0].offset, f[0].error_code)
}

/// Appends a transaction marker as the partition leader would (control batch, KIP-98
/// layout: key version 0 + type, value version 0 + coordinator epoch).
fn append_marker(h: &Harness, partition: i32, producer_id: i64, commit: bool) {
    let key = [0u8, 0, 0, u8::from(commit)];
    let value = [0u8, 0, 0, 0, 0, 7];
    let mut batch = gregor_protocol::batch::BatchBuilder::new(0, 0)
        .producer(producer_id, 0, -1)
        .transactional(true, true)
        .record(0, Some(&key), Some(&value), &[])
        .build();
    h.writer
        .append(
            crate::group::GROUP_METADATA_TOPIC_NAME,
            partition,
            &mut batch,
        )
        .expect("marker appended");
}

#[test]
fn transactional_offsets_are_pending_until_the_commit_marker() {
    let h = loaded(1);
    let c = &h.coordinator;
    assert_eq!(
        ready(c.commit_transactional_offsets(txn_commit("g", 42, -1, "", 10))),
        vec![NONE]
    );
    // Pending: not returned, and UNSTABLE_OFFSET_COMMIT with require_stable (KIP-447).
    assert_eq!(fetched(c, "g"), -1);
    assert_eq!(
        stable_offset(c, "g"),
        (-1, ErrorCode::UnstableOffsetCommit.code())
    );
    assert!(c.has_pending_transactional_offset("g", "t", 0));
    // Another producer's marker changes nothing.
    c.complete_transaction(0, 43, true);
    assert_eq!(fetched(c, "g"), -1);
    c.complete_transaction(0, 42, true);
    assert_eq!(fetched(c, "g"), 10);
    assert_eq!(stable_offset(c, "g"), (10, NONE));
    // An aborted transaction's offsets are dropped.
    ready(c.commit_transactional_offsets(txn_commit("g", 44, -1, "", 20)));
    c.complete_transaction(0, 44, false);
    assert_eq!(stable_offset(c, "g"), (10, NONE));
}

#[test]
fn transactional_offsets_are_rebuilt_on_load_with_their_markers() {
    let h = loaded(1);
    let c = &h.coordinator;
    ready(c.commit_transactional_offsets(txn_commit("committed", 1, -1, "", 5)));
    append_marker(&h, 0, 1, true);
    ready(c.commit_transactional_offsets(txn_commit("aborted", 2, -1, "", 6)));
    append_marker(&h, 0, 2, false);
    ready(c.commit_transactional_offsets(txn_commit("open", 3, -1, "", 7)));
    c.on_resigned(0);
    c.on_became_leader(0);
    assert_eq!(stable_offset(c, "committed"), (5, NONE));
    assert_eq!(stable_offset(c, "aborted"), (-1, NONE));
    assert_eq!(
        stable_offset(c, "open"),
        (-1, ErrorCode::UnstableOffsetCommit.code())
    );
    // The open transaction still completes after the load.
    c.complete_transaction(0, 3, true);
    assert_eq!(stable_offset(c, "open"), (7, NONE));
}

#[test]
fn transactional_commits_are_fenced_by_generation_and_member() {
    let h = loaded(1);
    let c = &h.coordinator;
    // An unknown group with group metadata (KIP-447) is a zombie: ILLEGAL_GENERATION.
    assert_eq!(
        ready(c.commit_transactional_offsets(txn_commit("nope", 1, 3, "m", 1))),
        vec![ErrorCode::IllegalGeneration.code()]
    );
    // A KIP-848 group with one member at epoch 1.
    h.topics
        .0
        .lock()
        .insert("t".into(), (Uuid::from_u128(1), 1));
    let r = ready(c.consumer_group_heartbeat(HeartbeatRequest {
        group_id: "cg".into(),
        member_id: String::new(),
        member_epoch: 0,
        instance_id: None,
        rack_id: None,
        rebalance_timeout_ms: 30_000,
        subscribed_topic_names: Some(vec!["t".into()]),
        subscribed_topic_regex: None,
        server_assignor: None,
        owned: Some(Assignment::new()),
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        version: 0,
    }));
    let member = r.member_id.expect("member id");
    assert_eq!(
        ready(c.commit_transactional_offsets(txn_commit("cg", 1, 1, "ghost", 1))),
        vec![ErrorCode::UnknownMemberId.code()]
    );
    assert_eq!(
        ready(c.commit_transactional_offsets(txn_commit("cg", 1, 0, &member, 1))),
        vec![ErrorCode::IllegalGeneration.code()]
    );
    assert_eq!(
        ready(c.commit_transactional_offsets(txn_commit("cg", 1, r.member_epoch, &member, 1))),
        vec![NONE]
    );
    // The batch is transactional, of the producer.
    let parts = h.writer.partitions.lock();
    let (_, last) = parts[&0].batches.last().expect("a batch");
    let header = gregor_protocol::batch::BatchHeader::parse(last).expect("header");
    assert!(header.is_transactional() && !header.is_control());
    assert_eq!((header.producer_id, header.base_sequence), (1, -1));
}
