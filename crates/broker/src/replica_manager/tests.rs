//! ReplicaManager and Partition without a process: a temp log dir, a metadata image built
//! from records, and a [`ManualClock`] where time matters.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gregor_log::{LogManager, ManualClock, TopicPartition};
use gregor_metadata::{MetadataImage, MetadataRecord};
use gregor_protocol::batch::BatchBuilder;
use gregor_protocol::metadata_records::{PartitionRecord, RegisterBrokerRecord, TopicRecord};
use tempfile::TempDir;
use uuid::Uuid;

use super::*;

const LOCAL: i32 = 1;
const FOLLOWER: i32 = 2;
const T0_MS: i64 = 1_700_000_000_000;

struct Fixture {
    _dir: TempDir,
    clock: Arc<ManualClock>,
    rm: Arc<ReplicaManager>,
    image: MetadataImage,
    topic_id: Uuid,
}

impl Fixture {
    /// One topic `t` with `partitions` partitions led by this broker with `replicas` (all in
    /// the ISR), and broker properties `props`.
    fn new(partitions: i32, replicas: &[i32], props: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut all: BTreeMap<String, String> = props
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        all.insert("log.dirs".into(), dir.path().display().to_string());
        all.insert("node.id".into(), LOCAL.to_string());
        all.insert("num.io.threads".into(), "2".into());
        let (config, _) = BrokerConfig::from_properties(all).expect("config");
        let clock = ManualClock::new(T0_MS);
        let (logs, _) = LogManager::open_with_clock(
            &[dir.path().to_path_buf()],
            Default::default(),
            clock.clone(),
        )
        .expect("log manager");
        let rm = Arc::new(ReplicaManager::new(LOCAL, config, logs));
        let topic_id = Uuid::new_v4();
        let mut image = MetadataImage::default();
        image.apply(&MetadataRecord::Topic(TopicRecord {
            name: "t".into(),
            topic_id,
            ..TopicRecord::default()
        }));
        let mut f = Self {
            _dir: dir,
            clock,
            rm,
            image,
            topic_id,
        };
        for p in 0..partitions {
            f.set_leader(p, LOCAL, 0, replicas);
        }
        f
    }

    fn set_leader(&mut self, partition: i32, leader: i32, leader_epoch: i32, replicas: &[i32]) {
        self.image
            .apply(&MetadataRecord::Partition(PartitionRecord {
                topic_id: self.topic_id,
                partition_id: partition,
                replicas: replicas.to_vec(),
                isr: replicas.to_vec(),
                leader,
                leader_epoch,
                partition_epoch: leader_epoch,
                ..PartitionRecord::default()
            }));
        self.rm.apply_image(&self.image).expect("apply image");
    }

    /// Applies a registration of partition `partition` with its own ISR and partition epoch.
    fn set_partition(
        &mut self,
        partition: i32,
        leader_epoch: i32,
        partition_epoch: i32,
        replicas: &[i32],
        isr: &[i32],
    ) {
        self.image
            .apply(&MetadataRecord::Partition(PartitionRecord {
                topic_id: self.topic_id,
                partition_id: partition,
                replicas: replicas.to_vec(),
                isr: isr.to_vec(),
                leader: LOCAL,
                leader_epoch,
                partition_epoch,
                ..PartitionRecord::default()
            }));
        self.rm.apply_image(&self.image).expect("apply image");
    }

    /// Registers broker `id` (unfenced) with broker epoch `epoch` in the image.
    fn register_broker(&mut self, id: i32, epoch: i64) {
        self.image
            .apply(&MetadataRecord::RegisterBroker(RegisterBrokerRecord {
                broker_id: id,
                broker_epoch: epoch,
                incarnation_id: Uuid::new_v4(),
                fenced: false,
                ..RegisterBrokerRecord::default()
            }));
        self.rm.apply_image(&self.image).expect("apply image");
    }

    fn partition(&self, p: i32) -> Arc<Partition> {
        self.rm.partition("t", p).expect("hosted")
    }

    async fn append(
        &self,
        p: i32,
        acks: i16,
        timeout_ms: i64,
        value_bytes: usize,
    ) -> AppendOutcome {
        let value = vec![b'v'; value_bytes];
        let batch = BatchBuilder::new(0, T0_MS)
            .record(T0_MS, Some(b"k"), Some(&value), &[])
            .build();
        self.rm
            .append_records(
                timeout_ms,
                acks,
                AppendOrigin::Client,
                vec![(TopicPartition::new("t", p), batch)],
            )
            .await
    }

    async fn fetch(&self, params: FetchParams, partitions: &[(i32, i64)]) -> FetchOutcome {
        let parts = partitions
            .iter()
            .map(|(p, offset)| FetchPartition {
                topic_partition: TopicPartition::new("t", *p),
                fetch_offset: *offset,
                partition_max_bytes: i32::MAX,
                current_leader_epoch: -1,
                last_fetched_epoch: -1,
                log_start_offset: -1,
            })
            .collect();
        self.rm.fetch_messages(params, parts).await
    }
}

fn consumer(max_wait_ms: i64) -> FetchParams {
    FetchParams {
        replica_id: -1,
        max_wait_ms,
        min_bytes: 1,
        max_bytes: i32::MAX,
        isolation_level: 0,
        replica_epoch: -1,
        client_metadata: None,
    }
}

fn complete(o: AppendOutcome) -> Vec<PartitionAppendResult> {
    match o {
        AppendOutcome::Complete(r) => r,
        AppendOutcome::Delayed(_) => panic!("expected an immediate result"),
    }
}

fn fetched(o: FetchOutcome) -> Vec<FetchPartitionResult> {
    match o {
        FetchOutcome::Complete(r) => r,
        FetchOutcome::Delayed(_) => panic!("expected an immediate fetch"),
    }
}

/// Waits (yielding, bounded) until `cond` holds.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}");
}

fn purgatories_empty(rm: &ReplicaManager) -> bool {
    let d = rm.delayed_operations();
    d.fetch.watched() == 0
        && d.fetch.delayed() == 0
        && d.fetch.watch_keys() == 0
        && d.produce.watched() == 0
        && d.produce.delayed() == 0
        && d.produce.watch_keys() == 0
        && d.delete_records.watched() == 0
        && d.delete_records.delayed() == 0
        && d.delete_records.watch_keys() == 0
}

#[tokio::test]
async fn append_moves_the_high_watermark_and_fetch_reads_below_it() {
    let f = Fixture::new(1, &[LOCAL], &[]);
    let r = complete(f.append(0, 1, 1000, 10).await);
    assert_eq!(r[0].error_code, ec::NONE);
    assert_eq!(r[0].base_offset, 0);
    let r = complete(f.append(0, -1, 1000, 10).await);
    assert_eq!((r[0].error_code, r[0].base_offset), (ec::NONE, 1));
    let p = f.partition(0);
    assert_eq!((p.high_watermark(), p.log.log_end_offset()), (2, 2));
    let got = fetched(f.fetch(consumer(0), &[(0, 0)]).await);
    assert_eq!(got[0].error_code, ec::NONE);
    assert_eq!(got[0].high_watermark, 2);
    assert!(!got[0].records.is_empty());
    // Unknown partitions and bad acks are per-partition errors.
    let unknown = fetched(f.fetch(consumer(0), &[(7, 0)]).await);
    assert_eq!(unknown[0].error_code, ec::UNKNOWN_TOPIC_OR_PARTITION);
    let r = complete(f.append(0, 2, 1000, 10).await);
    assert_eq!(r[0].error_code, ec::INVALID_REQUIRED_ACKS);
}

#[tokio::test]
async fn acks_all_waits_for_the_follower_and_completes_when_it_fetches() {
    let f = Fixture::new(1, &[LOCAL, FOLLOWER], &[]);
    let AppendOutcome::Delayed(delayed) = f.append(0, -1, 30_000, 10).await else {
        panic!("acks=all with a lagging follower must wait");
    };
    assert_eq!(f.partition(0).high_watermark(), 0);
    assert_eq!(f.rm.delayed_operations().produce.delayed(), 1);
    let waiter = tokio::spawn(delayed.complete());
    // The follower fetches from offset 1: it has the batch, so the high watermark moves.
    let follower = FetchParams {
        replica_id: FOLLOWER,
        ..consumer(0)
    };
    let got = fetched(f.fetch(follower, &[(0, 1)]).await);
    assert_eq!(got[0].error_code, ec::NONE);
    let results = waiter.await.expect("join");
    assert_eq!(results[0].error_code, ec::NONE);
    assert_eq!(f.partition(0).high_watermark(), 1);
    assert!(purgatories_empty(&f.rm));
}

/// An acks=all produce woken by a leadership change but evaluated only later must not be
/// acknowledged if its batch was truncated meanwhile: here the leader becomes a follower,
/// truncates the batch away and takes another leader's record at that offset, then leads again
/// with a high watermark past the offset. Kafka fails the produce when the leader becomes a
/// follower; gregor checks that the batch's epoch still covers its offsets.
#[tokio::test]
async fn acks_all_is_not_acknowledged_when_its_batch_was_truncated_meanwhile() {
    let mut f = Fixture::new(1, &[LOCAL, FOLLOWER], &[]);
    let p = f.partition(0);
    let AppendOutcome::Delayed(delayed) = f.append(0, -1, 30_000, 10).await else {
        panic!("acks=all with a lagging follower must wait");
    };
    // The follower leads (epoch 1) with a record of its own at offset 0.
    f.set_leader(0, FOLLOWER, 1, &[LOCAL, FOLLOWER]);
    assert_eq!(p.role(), Role::Follower);
    p.log.truncate_to(0).expect("truncate");
    let mut other = BatchBuilder::new(0, T0_MS)
        .record(T0_MS, Some(b"k"), Some(b"another leader's record"), &[])
        .build();
    gregor_protocol::batch::set_partition_leader_epoch(&mut other, 1);
    p.log
        .append_as_follower(&other, T0_MS)
        .expect("append as follower");
    // This broker leads again, alone in the ISR: the high watermark passes offset 0.
    f.set_partition(0, 2, 2, &[LOCAL, FOLLOWER], &[LOCAL]);
    assert_eq!(p.role(), Role::Leader);
    assert_eq!(p.high_watermark(), 1);
    let results = delayed.complete().await;
    assert_eq!(
        results[0].error_code,
        ec::NOT_LEADER_OR_FOLLOWER,
        "offset 0 holds another record now"
    );
    // A batch that survived a leadership round trip is still acknowledged.
    let AppendOutcome::Delayed(kept) = ({
        f.set_partition(0, 3, 3, &[LOCAL, FOLLOWER], &[LOCAL, FOLLOWER]);
        f.append(0, -1, 30_000, 10).await
    }) else {
        panic!("must wait");
    };
    f.set_partition(0, 4, 4, &[LOCAL, FOLLOWER], &[LOCAL]);
    let results = kept.complete().await;
    assert_eq!(results[0].error_code, ec::NONE);
    assert_eq!(results[0].base_offset, 1);
}

#[tokio::test]
async fn acks_all_times_out_on_the_clock_and_leaves_the_purgatory() {
    let f = Fixture::new(1, &[LOCAL, FOLLOWER], &[]);
    let AppendOutcome::Delayed(delayed) = f.append(0, -1, 5_000, 10).await else {
        panic!("must wait");
    };
    let waiter = tokio::spawn(delayed.complete());
    let produce = &f.rm.delayed_operations().produce;
    f.clock.advance_ms(4_999);
    assert_eq!(produce.expire_due(), 0);
    f.clock.advance_ms(1);
    assert_eq!(produce.expire_due(), 1);
    let results = waiter.await.expect("join");
    assert_eq!(results[0].error_code, ec::REQUEST_TIMED_OUT);
    // The batch is in the log: base offset as acks=1 would have said.
    assert_eq!(results[0].base_offset, 0);
    assert!(purgatories_empty(&f.rm));
}

#[tokio::test]
async fn leadership_transitions_in_one_place() {
    let mut f = Fixture::new(1, &[LOCAL, FOLLOWER], &[]);
    let p = f.partition(0);
    assert_eq!(p.role(), Role::Leader);
    let AppendOutcome::Delayed(delayed) = f.append(0, -1, 30_000, 10).await else {
        panic!("must wait");
    };
    let waiter = tokio::spawn(delayed.complete());
    // Another broker becomes leader: the waiting produce completes with NOT_LEADER_OR_FOLLOWER.
    f.set_leader(0, FOLLOWER, 1, &[LOCAL, FOLLOWER]);
    assert_eq!(p.role(), Role::Follower);
    assert_eq!(p.leader_epoch(), 1);
    let results = waiter.await.expect("join");
    assert_eq!(results[0].error_code, ec::NOT_LEADER_OR_FOLLOWER);
    let r = complete(f.append(0, 1, 1000, 10).await);
    assert_eq!(r[0].error_code, ec::NOT_LEADER_OR_FOLLOWER);
    let got = fetched(f.fetch(consumer(0), &[(0, 0)]).await);
    assert_eq!(got[0].error_code, ec::NOT_LEADER_OR_FOLLOWER);
    // A stale registration (older leader epoch) is ignored.
    p.make_leader(LeaderAndIsr {
        leader: LOCAL,
        leader_epoch: 0,
        partition_epoch: 0,
        replicas: vec![LOCAL],
        isr: vec![LOCAL],
        min_insync_replicas: 1,
    });
    assert_eq!(p.role(), Role::Follower);
    // No leader.
    f.set_leader(0, -1, 2, &[LOCAL, FOLLOWER]);
    assert_eq!(p.role(), Role::None);
    // Leader again, alone in the ISR: the high watermark catches up with the log end.
    f.set_leader(0, LOCAL, 3, &[LOCAL]);
    assert_eq!(p.role(), Role::Leader);
    assert_eq!(p.high_watermark(), p.log.log_end_offset());
    assert!(purgatories_empty(&f.rm));
}

/// Defect 3 (issue 9): long polls on idle partitions used to leave a waiter on every partition
/// they watched; expired ones must leave every watch list.
#[tokio::test]
async fn many_long_polls_on_idle_partitions_expire_and_leave_every_watch_list_empty() {
    let f = Arc::new(Fixture::new(4, &[LOCAL], &[]));
    let mut waiters = Vec::new();
    for _ in 0..200 {
        let FetchOutcome::Delayed(d) = f
            .fetch(consumer(500), &[(0, 0), (1, 0), (2, 0), (3, 0)])
            .await
        else {
            panic!("an idle partition must make the fetch wait");
        };
        waiters.push(tokio::spawn(d.complete()));
    }
    let fetch = f.rm.delayed_operations().fetch.clone();
    until("200 delayed fetches", || fetch.delayed() == 200).await;
    assert_eq!(fetch.watched(), 800);
    assert_eq!(fetch.watch_keys(), 4);
    f.clock.advance_ms(500);
    assert_eq!(fetch.expire_due(), 200);
    for w in waiters {
        let results = w.await.expect("join");
        assert_eq!(results.len(), 4);
        assert!(results
            .iter()
            .all(|r| r.error_code == ec::NONE && r.records.is_empty()));
    }
    assert!(purgatories_empty(&f.rm));
}

#[tokio::test]
async fn new_data_completes_a_long_poll() {
    let f = Fixture::new(2, &[LOCAL], &[]);
    let FetchOutcome::Delayed(d) = f.fetch(consumer(60_000), &[(0, 0), (1, 0)]).await else {
        panic!("must wait");
    };
    let waiter = tokio::spawn(d.complete());
    let fetch = f.rm.delayed_operations().fetch.clone();
    until("the delayed fetch", || fetch.delayed() == 1).await;
    complete(f.append(1, 1, 1000, 10).await);
    let results = waiter.await.expect("join");
    assert!(results[0].records.is_empty());
    assert!(!results[1].records.is_empty());
    assert_eq!(results[1].high_watermark, 1);
    assert!(purgatories_empty(&f.rm));
}

#[tokio::test]
async fn fetch_max_bytes_caps_the_response_whatever_the_client_asks() {
    let capped = Fixture::new(1, &[LOCAL], &[("fetch.max.bytes", "1024")]);
    let free = Fixture::new(1, &[LOCAL], &[]);
    for f in [&capped, &free] {
        for _ in 0..3 {
            complete(f.append(0, 1, 1000, 600).await);
        }
    }
    let one_batch = {
        let r = fetched(capped.fetch(consumer(0), &[(0, 0)]).await);
        r[0].records.len()
    };
    let all = {
        let r = fetched(free.fetch(consumer(0), &[(0, 0)]).await);
        r[0].records.len()
    };
    // The first batch is returned whole (KIP-74), the next would pass 1024 bytes.
    assert!(one_batch > 600 && one_batch < 1024, "{one_batch}");
    assert_eq!(all, 3 * one_batch);
}

#[tokio::test]
async fn a_fetch_that_wants_more_bytes_keeps_waiting_after_a_small_append() {
    let f = Fixture::new(1, &[LOCAL], &[]);
    let params = FetchParams {
        min_bytes: 100_000,
        ..consumer(10_000)
    };
    let FetchOutcome::Delayed(d) = f.fetch(params, &[(0, 0)]).await else {
        panic!("must wait");
    };
    let waiter = tokio::spawn(d.complete());
    let fetch = f.rm.delayed_operations().fetch.clone();
    until("the delayed fetch", || fetch.delayed() == 1).await;
    complete(f.append(0, 1, 1000, 10).await);
    // The append completes the operation; its read finds too little and it waits again, with
    // the new data as its baseline (no busy loop).
    until("the re-watched fetch", || {
        fetch.delayed() == 1 && fetch.watched() == 1
    })
    .await;
    assert!(!waiter.is_finished());
    f.clock.advance_ms(10_000);
    until("expiry", || fetch.expire_due() == 1 || waiter.is_finished()).await;
    let results = waiter.await.expect("join");
    assert!(
        !results[0].records.is_empty(),
        "the deadline answers with what there is"
    );
    assert!(purgatories_empty(&f.rm));
}

#[tokio::test]
async fn a_coordinator_appends_through_the_same_entry_with_acks_all() {
    let f = Fixture::new(1, &[LOCAL], &[]);
    let batch = BatchBuilder::new(0, T0_MS)
        .record(T0_MS, Some(b"group"), Some(b"state"), &[])
        .build();
    let outcome =
        f.rm.append_records(
            5_000,
            -1,
            AppendOrigin::Coordinator,
            vec![(TopicPartition::new("t", 0), batch)],
        )
        .await;
    // One replica: the high watermark passes the batch at once.
    let r = complete(outcome);
    assert_eq!((r[0].error_code, r[0].base_offset), (ec::NONE, 0));
    assert_eq!(f.partition(0).high_watermark(), 1);
}

#[tokio::test]
async fn a_replica_id_that_is_not_a_follower_is_refused() {
    let f = Fixture::new(1, &[LOCAL, FOLLOWER], &[]);
    complete(f.append(0, 1, 1000, 10).await);
    let stranger = FetchParams {
        replica_id: 9,
        ..consumer(0)
    };
    let got = fetched(f.fetch(stranger, &[(0, 0)]).await);
    assert_eq!(got[0].error_code, ec::NOT_LEADER_OR_FOLLOWER);
    // The follower reads up to the log end offset, beyond the high watermark it holds back.
    let follower = FetchParams {
        replica_id: FOLLOWER,
        ..consumer(0)
    };
    assert_eq!(f.partition(0).high_watermark(), 0);
    let got = fetched(f.fetch(follower, &[(0, 0)]).await);
    assert_eq!(got[0].error_code, ec::NONE);
    assert!(!got[0].records.is_empty());
    // A consumer still sees nothing below the high watermark.
    let got = fetched(f.fetch(consumer(0), &[(0, 0)]).await);
    assert!(got[0].records.is_empty());
}

/// Records the ISR changes partitions submit.
#[derive(Default)]
struct RecordingSender {
    items: parking_lot::Mutex<Vec<crate::replication::leader::IsrChange>>,
}

impl crate::alter_partition::AlterPartitionSender for RecordingSender {
    fn submit(&self, item: crate::alter_partition::AlterPartitionItem) {
        self.items.lock().push(item.change);
    }
}

fn follower_fetch(replica_id: i32, replica_epoch: i64) -> FetchParams {
    FetchParams {
        replica_id,
        replica_epoch,
        ..consumer(0)
    }
}

async fn follower_fetch_one(
    f: &Fixture,
    params: FetchParams,
    offset: i64,
    current_leader_epoch: i32,
    last_fetched_epoch: i32,
) -> FetchPartitionResult {
    let parts = vec![FetchPartition {
        topic_partition: TopicPartition::new("t", 0),
        fetch_offset: offset,
        partition_max_bytes: i32::MAX,
        current_leader_epoch,
        last_fetched_epoch,
        log_start_offset: 0,
    }];
    fetched(f.rm.fetch_messages(params, parts).await).remove(0)
}

#[tokio::test]
async fn a_caught_up_follower_is_proposed_for_the_isr_and_joins_from_the_image() {
    use crate::replication::leader::IsrChangeKind;
    let mut f = Fixture::new(1, &[LOCAL, FOLLOWER, 3], &[]);
    for (id, epoch) in [(LOCAL, 10), (FOLLOWER, 20), (3, 30)] {
        f.register_broker(id, epoch);
    }
    let sender = Arc::new(RecordingSender::default());
    f.rm.replication()
        .set_alter_partition_sender(sender.clone());
    f.set_partition(0, 1, 1, &[LOCAL, FOLLOWER, 3], &[LOCAL, FOLLOWER]);
    complete(f.append(0, 1, 1000, 10).await);
    // 2 fetches everything: the HW moves, 3 (not in the ISR, never fetched) does not hold it.
    let r = follower_fetch_one(&f, follower_fetch(FOLLOWER, 20), 1, 1, -1).await;
    assert_eq!(r.error_code, ec::NONE);
    assert_eq!(f.partition(0).high_watermark(), 1);
    assert!(sender.items.lock().is_empty(), "2 is already in the ISR");
    // 3 catches up: one AlterPartition proposal with broker epochs (KIP-903).
    let r = follower_fetch_one(&f, follower_fetch(3, 30), 1, 1, -1).await;
    assert_eq!(r.error_code, ec::NONE);
    let items = sender.items.lock().clone();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].kind, IsrChangeKind::Expand(3));
    assert_eq!(items[0].new_isr, vec![(LOCAL, 10), (FOLLOWER, 20), (3, 30)]);
    assert_eq!((items[0].leader_epoch, items[0].partition_epoch), (1, 1));
    // Still pending: no second proposal; the committed ISR is unchanged until the image.
    follower_fetch_one(&f, follower_fetch(3, 30), 1, 1, -1).await;
    assert_eq!(sender.items.lock().len(), 1);
    assert_eq!(f.partition(0).state().isr, vec![LOCAL, FOLLOWER]);
    assert!(f.partition(0).pending_isr_change().is_some());
    f.set_partition(0, 1, 2, &[LOCAL, FOLLOWER, 3], &[LOCAL, FOLLOWER, 3]);
    assert_eq!(f.partition(0).state().isr, vec![LOCAL, FOLLOWER, 3]);
    assert!(f.partition(0).pending_isr_change().is_none());
    assert!(!f.partition(0).is_under_replicated());
}

#[tokio::test]
async fn a_lagging_follower_is_proposed_for_removal_after_replica_lag_time_max_ms() {
    use crate::replication::leader::IsrChangeKind;
    let mut f = Fixture::new(
        1,
        &[LOCAL, FOLLOWER],
        &[("replica.lag.time.max.ms", "1000")],
    );
    f.register_broker(LOCAL, 10);
    f.register_broker(FOLLOWER, 20);
    let sender = Arc::new(RecordingSender::default());
    f.rm.replication()
        .set_alter_partition_sender(sender.clone());
    complete(f.append(0, 1, 1000, 10).await);
    follower_fetch_one(&f, follower_fetch(FOLLOWER, 20), 1, -1, -1).await;
    complete(f.append(0, 1, 1000, 10).await);
    f.clock.advance_ms(1000);
    assert_eq!(f.rm.maybe_shrink_isr(), 0, "caught up within the lag");
    f.clock.advance_ms(1);
    assert_eq!(f.rm.maybe_shrink_isr(), 1);
    let items = sender.items.lock().clone();
    assert_eq!(items[0].kind, IsrChangeKind::Shrink(vec![FOLLOWER]));
    assert_eq!(items[0].new_isr, vec![(LOCAL, 10)]);
    // The HW still waits for the committed ISR (the maximal ISR keeps 2).
    assert_eq!(f.partition(0).high_watermark(), 1);
    f.set_partition(0, 0, 1, &[LOCAL, FOLLOWER], &[LOCAL]);
    assert_eq!(
        f.partition(0).high_watermark(),
        2,
        "ISR {{1}}: the HW follows the leader"
    );
    assert!(f.partition(0).is_under_replicated());
}

#[tokio::test]
async fn acks_all_needs_min_insync_replicas_capped_at_the_replication_factor() {
    let mut f = Fixture::new(1, &[LOCAL, FOLLOWER], &[("min.insync.replicas", "2")]);
    f.set_partition(0, 0, 1, &[LOCAL, FOLLOWER], &[LOCAL]);
    let r = complete(f.append(0, -1, 1000, 10).await);
    assert_eq!(r[0].error_code, ec::NOT_ENOUGH_REPLICAS);
    assert_eq!(
        f.partition(0).log.log_end_offset(),
        0,
        "refused before the append"
    );
    assert!(f.partition(0).is_under_min_isr());
    // acks=1 is not checked; the HW does not move under min ISR (KIP-966).
    let r = complete(f.append(0, 1, 1000, 10).await);
    assert_eq!(r[0].error_code, ec::NONE);
    assert_eq!(f.partition(0).high_watermark(), 0);
    // min.insync.replicas 3 with two replicas counts as 2.
    let mut f = Fixture::new(1, &[LOCAL, FOLLOWER], &[("min.insync.replicas", "3")]);
    f.set_partition(0, 0, 1, &[LOCAL, FOLLOWER], &[LOCAL, FOLLOWER]);
    let AppendOutcome::Delayed(d) = f.append(0, -1, 30_000, 10).await else {
        panic!("must wait for the follower");
    };
    let waiter = tokio::spawn(d.complete());
    follower_fetch_one(&f, follower_fetch(FOLLOWER, -1), 1, -1, -1).await;
    assert_eq!(waiter.await.expect("join")[0].error_code, ec::NONE);
}

#[tokio::test]
async fn a_follower_with_a_diverging_epoch_gets_the_epoch_end_offset() {
    let mut f = Fixture::new(1, &[LOCAL, FOLLOWER], &[]);
    complete(f.append(0, 1, 1000, 10).await);
    complete(f.append(0, 1, 1000, 10).await);
    // Re-elected at epoch 3: the epoch cache records (3, LEO=2) before any epoch-3 record.
    f.set_partition(0, 3, 3, &[LOCAL, FOLLOWER], &[LOCAL, FOLLOWER]);
    let entries = f.partition(0).log.leader_epoch_entries();
    assert_eq!(
        entries
            .iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect::<Vec<_>>(),
        vec![(0, 0), (3, 2)]
    );
    complete(f.append(0, 1, 1000, 10).await);
    // A follower that has epoch 2 up to offset 5 (a leader this one never saw): it must
    // truncate to the end of epoch 0 here, offset 2.
    let r = follower_fetch_one(&f, follower_fetch(FOLLOWER, -1), 5, 3, 2).await;
    assert_eq!(r.error_code, ec::NONE);
    assert_eq!(r.diverging_epoch, Some((0, 2)));
    assert!(r.records.is_empty());
    assert_eq!(
        f.partition(0).follower_log_end_offset(FOLLOWER),
        Some(-1),
        "no progress recorded"
    );
    // In line with the leader: records, no divergence.
    let r = follower_fetch_one(&f, follower_fetch(FOLLOWER, -1), 2, 3, 0).await;
    assert_eq!((r.error_code, r.diverging_epoch), (ec::NONE, None));
    assert!(!r.records.is_empty());
    assert_eq!(f.partition(0).follower_log_end_offset(FOLLOWER), Some(2));
    // An epoch this log cannot place (newer than any): OFFSET_OUT_OF_RANGE.
    let r = follower_fetch_one(&f, follower_fetch(FOLLOWER, -1), 3, 3, 9).await;
    assert_eq!(r.error_code, ec::OFFSET_OUT_OF_RANGE);
}

#[tokio::test]
async fn follower_fetches_are_fenced_by_epochs() {
    let mut f = Fixture::new(1, &[LOCAL, FOLLOWER], &[]);
    f.register_broker(FOLLOWER, 20);
    f.set_partition(0, 4, 4, &[LOCAL, FOLLOWER], &[LOCAL, FOLLOWER]);
    let r = follower_fetch_one(&f, follower_fetch(FOLLOWER, 20), 0, 3, -1).await;
    assert_eq!(r.error_code, ec::FENCED_LEADER_EPOCH);
    let r = follower_fetch_one(&f, follower_fetch(FOLLOWER, 20), 0, 5, -1).await;
    assert_eq!(r.error_code, ec::UNKNOWN_LEADER_EPOCH);
    // Not a replica: UNKNOWN_LEADER_EPOCH with a leader epoch, else NOT_LEADER_OR_FOLLOWER.
    let r = follower_fetch_one(&f, follower_fetch(9, -1), 0, 4, -1).await;
    assert_eq!(r.error_code, ec::UNKNOWN_LEADER_EPOCH);
    let r = follower_fetch_one(&f, follower_fetch(9, -1), 0, -1, -1).await;
    assert_eq!(r.error_code, ec::NOT_LEADER_OR_FOLLOWER);
    // A stale broker epoch (an earlier incarnation of the follower, KIP-903).
    let r = follower_fetch_one(&f, follower_fetch(FOLLOWER, 19), 0, 4, -1).await;
    assert_eq!(r.error_code, ec::NOT_LEADER_OR_FOLLOWER);
    let r = follower_fetch_one(&f, follower_fetch(FOLLOWER, 20), 0, 4, -1).await;
    assert_eq!(r.error_code, ec::NONE);
}

#[tokio::test]
async fn list_offsets_latest_waits_for_a_new_leaders_high_watermark() {
    let mut f = Fixture::new(1, &[LOCAL, FOLLOWER], &[]);
    complete(f.append(0, 1, 1000, 10).await);
    // Leader again in epoch 1 at LEO 1 while the HW is still 0 (the follower never fetched).
    f.set_partition(0, 1, 1, &[LOCAL, FOLLOWER], &[LOCAL, FOLLOWER]);
    let latest = || (TopicPartition::new("t", 0), partition::LATEST_TIMESTAMP, -1);
    let r = f.rm.fetch_offsets(Some(0), vec![latest()]).await;
    assert_eq!(r[0], Err(ec::OFFSET_NOT_AVAILABLE));
    // A follower (no isolation level) gets the log end offset at once.
    let r = f.rm.fetch_offsets(None, vec![latest()]).await;
    assert_eq!(r[0].map(|(_, offset, _)| offset), Ok(1));
    follower_fetch_one(&f, follower_fetch(FOLLOWER, -1), 1, 1, 0).await;
    assert_eq!(f.partition(0).high_watermark(), 1);
    let r = f.rm.fetch_offsets(Some(0), vec![latest()]).await;
    assert_eq!(r[0].map(|(_, offset, epoch)| (offset, epoch)), Ok((1, 1)));
}

#[tokio::test]
async fn offset_for_leader_epoch_answers_from_the_epoch_cache_as_the_leader() {
    let mut f = Fixture::new(1, &[LOCAL, FOLLOWER], &[]);
    complete(f.append(0, 1, 1000, 10).await);
    complete(f.append(0, 1, 1000, 10).await);
    f.set_partition(0, 2, 2, &[LOCAL, FOLLOWER], &[LOCAL, FOLLOWER]);
    complete(f.append(0, 1, 1000, 10).await);
    let p = f.partition(0);
    // Epoch 0 ends where epoch 2 starts; 1 was never seen here (its floor is 0); the latest
    // epoch ends at the log end offset; a newer one is unknown.
    assert_eq!(p.last_offset_for_leader_epoch(2, 0), Ok((0, 2)));
    assert_eq!(p.last_offset_for_leader_epoch(-1, 1), Ok((0, 2)));
    assert_eq!(p.last_offset_for_leader_epoch(2, 2), Ok((2, 3)));
    assert_eq!(p.last_offset_for_leader_epoch(2, 5), Ok((-1, -1)));
    assert_eq!(
        p.last_offset_for_leader_epoch(1, 0),
        Err(ec::FENCED_LEADER_EPOCH)
    );
    assert_eq!(
        p.last_offset_for_leader_epoch(3, 0),
        Err(ec::UNKNOWN_LEADER_EPOCH)
    );
    f.set_leader(0, FOLLOWER, 3, &[LOCAL, FOLLOWER]);
    assert_eq!(
        p.last_offset_for_leader_epoch(3, 0),
        Err(ec::NOT_LEADER_OR_FOLLOWER)
    );
}

#[tokio::test]
async fn a_waiting_follower_fetch_completes_on_an_append() {
    let f = Fixture::new(1, &[LOCAL, FOLLOWER], &[]);
    let params = FetchParams {
        max_wait_ms: 30_000,
        ..follower_fetch(FOLLOWER, -1)
    };
    let FetchOutcome::Delayed(d) = f.fetch(params, &[(0, 0)]).await else {
        panic!("nothing to read: the follower's fetch waits");
    };
    let waiter = tokio::spawn(d.complete());
    until("the fetch waits", || {
        f.rm.delayed_operations().fetch.delayed() == 1
    })
    .await;
    complete(f.append(0, 1, 1000, 10).await);
    let got = waiter.await.expect("join");
    assert_eq!(got[0].error_code, ec::NONE);
    assert!(!got[0].records.is_empty());
    assert_eq!(
        got[0].high_watermark, 0,
        "the follower has not confirmed it yet"
    );
    assert!(purgatories_empty(&f.rm));
}

#[tokio::test]
async fn log_append_time_comes_from_the_injected_clock() {
    let f = Fixture::new(
        1,
        &[LOCAL],
        &[("log.message.timestamp.type", "LogAppendTime")],
    );
    f.clock.advance_ms(1_234);
    let r = complete(f.append(0, 1, 1000, 10).await);
    assert_eq!(r[0].error_code, ec::NONE);
    assert_eq!(r[0].log_append_time_ms, T0_MS + 1_234);
}

/// An idempotent producer's retry of an acks=all batch that was appended but never replicated
/// (the first attempt timed out on a leader cut from its followers) is a duplicate: it must
/// wait for the original offsets like the original did, not be acknowledged at once. Acking it
/// at once lost acknowledged records in the chaos test (seeds 1001 and 42): the isolated
/// leader acknowledged the retries, and the new leader's log never had them.
#[tokio::test]
async fn an_idempotent_retry_of_an_unreplicated_batch_waits_for_the_high_watermark() {
    let f = Fixture::new(1, &[LOCAL, FOLLOWER], &[]);
    let batch = BatchBuilder::new(0, T0_MS)
        .producer(7, 0, 0)
        .record(T0_MS, Some(b"k"), Some(b"j-5606"), &[])
        .build();
    let send = |timeout_ms: i64| {
        f.rm.append_records(
            timeout_ms,
            -1,
            AppendOrigin::Client,
            vec![(TopicPartition::new("t", 0), batch.clone())],
        )
    };
    let AppendOutcome::Delayed(first) = send(5_000).await else {
        panic!("acks=all with a lagging follower must wait");
    };
    let first = tokio::spawn(first.complete());
    let produce = &f.rm.delayed_operations().produce;
    f.clock.advance_ms(5_000);
    assert_eq!(produce.expire_due(), 1);
    assert_eq!(
        first.await.expect("join")[0].error_code,
        ec::REQUEST_TIMED_OUT
    );
    // The retry: the same producer id, epoch and sequence.
    let AppendOutcome::Delayed(retry) = send(5_000).await else {
        panic!("the retry of an unreplicated batch was answered at once");
    };
    assert_eq!(f.partition(0).high_watermark(), 0);
    assert_eq!(
        f.partition(0).log.log_end_offset(),
        1,
        "nothing appended twice"
    );
    let retry = tokio::spawn(retry.complete());
    // Not replicated before the timeout: the retry times out too.
    f.clock.advance_ms(5_000);
    assert_eq!(produce.expire_due(), 1);
    let r = retry.await.expect("join");
    assert_eq!(r[0].error_code, ec::REQUEST_TIMED_OUT);
    assert_eq!(r[0].base_offset, 0, "the original batch's offset");
    // Once the follower has it, a further retry completes with the original offset.
    let AppendOutcome::Delayed(again) = send(30_000).await else {
        panic!("still not replicated");
    };
    let again = tokio::spawn(again.complete());
    let follower = FetchParams {
        replica_id: FOLLOWER,
        ..consumer(0)
    };
    assert_eq!(
        fetched(f.fetch(follower, &[(0, 1)]).await)[0].error_code,
        ec::NONE
    );
    let r = again.await.expect("join");
    assert_eq!((r[0].error_code, r[0].base_offset), (ec::NONE, 0));
    assert!(purgatories_empty(&f.rm));
}

/// Leader-side replication throttle (KIP-73, Kafka's `shouldLeaderThrottle`): once the bytes
/// of throttled partitions sent to followers exceed `leader.replication.throttled.rate`, an
/// out-of-ISR follower of a throttled partition gets no records, an ISR member still does,
/// and both come back when the rate falls (on the injected clock) or the throttle goes.
#[tokio::test]
async fn the_leader_throttles_out_of_sync_followers_of_throttled_partitions() {
    use gregor_protocol::metadata_records::ConfigRecord;
    let mut f = Fixture::new(1, &[LOCAL, FOLLOWER, 3], &[]);
    for (id, epoch) in [(LOCAL, 10), (FOLLOWER, 20), (3, 30)] {
        f.register_broker(id, epoch);
    }
    let sender = Arc::new(RecordingSender::default());
    f.rm.replication()
        .set_alter_partition_sender(sender.clone());
    f.set_partition(0, 1, 1, &[LOCAL, FOLLOWER, 3], &[LOCAL, FOLLOWER]);
    let config =
        |f: &mut Fixture, resource_type: i8, resource: &str, name: &str, v: Option<&str>| {
            f.image.apply(&MetadataRecord::Config(ConfigRecord {
                resource_type,
                resource_name: resource.into(),
                name: name.into(),
                value: v.map(str::to_string),
                ..ConfigRecord::default()
            }));
            f.rm.apply_image(&f.image).expect("apply image");
        };
    config(
        &mut f,
        4,
        "1",
        "leader.replication.throttled.rate",
        Some("1000"),
    );
    config(
        &mut f,
        2,
        "t",
        "leader.replication.throttled.replicas",
        Some("0:1"),
    );
    complete(f.append(0, 1, 1000, 10_000).await);
    let quotas = f.rm.replication_quotas().clone();
    let quota = &quotas.leader;

    // The ISR member reads (never throttled) and its bytes count: the rate is now above 1000
    // B/s. The HW follows the ISR.
    let r = follower_fetch_one(&f, follower_fetch(FOLLOWER, 20), 0, 1, -1).await;
    assert!(r.records.len() > 10_000);
    assert_eq!(quota.bytes_recorded(), r.records.len() as u64);
    follower_fetch_one(&f, follower_fetch(FOLLOWER, 20), 1, 1, -1).await;
    assert_eq!(f.partition(0).high_watermark(), 1);
    assert!(quota.is_quota_exceeded());
    // 3 (not in the ISR) gets nothing, with the offsets of a normal answer, and holds
    // nothing back.
    let r = follower_fetch_one(&f, follower_fetch(3, 30), 0, 1, -1).await;
    assert_eq!(r.error_code, ec::NONE);
    assert!(r.records.is_empty());
    assert_eq!(r.high_watermark, 1);
    assert_eq!(f.partition(0).follower_log_end_offset(3), Some(0));
    let r = follower_fetch_one(&f, follower_fetch(FOLLOWER, 20), 0, 1, -1).await;
    assert!(r.records.len() > 10_000, "the ISR member is not throttled");
    assert_eq!(quota.throttled_total(), 1);
    // 11 windows without traffic: the rate is gone and 3 reads.
    f.clock.advance_ms(11_000);
    assert!(!quota.is_quota_exceeded());
    let r = follower_fetch_one(&f, follower_fetch(3, 30), 0, 1, -1).await;
    assert!(r.records.len() > 10_000);
    // Exceeded again, but the topic config is removed: no longer throttled.
    assert!(quota.is_quota_exceeded());
    config(
        &mut f,
        2,
        "t",
        "leader.replication.throttled.replicas",
        None,
    );
    let before = quota.bytes_recorded();
    let r = follower_fetch_one(&f, follower_fetch(3, 30), 0, 1, -1).await;
    assert!(r.records.len() > 10_000);
    assert_eq!(
        quota.bytes_recorded(),
        before,
        "unthrottled partitions are not recorded"
    );
    assert_eq!(quota.throttled_total(), 1);
}
#[cfg(test)]
#[path = "fetch_from_follower_tests.rs"]
mod fetch_from_follower_tests;

/// A follower's fetch from `offset` reporting log start offset `log_start_offset`.
async fn follower_fetch_with_start(
    f: &Fixture,
    replica_id: i32,
    offset: i64,
    log_start_offset: i64,
) {
    let parts = vec![FetchPartition {
        topic_partition: TopicPartition::new("t", 0),
        fetch_offset: offset,
        partition_max_bytes: i32::MAX,
        current_leader_epoch: 1,
        last_fetched_epoch: -1,
        log_start_offset,
    }];
    let params = follower_fetch(replica_id, -1);
    let r = fetched(f.rm.fetch_messages(params, parts).await).remove(0);
    assert_eq!(r.error_code, ec::NONE, "follower {replica_id} fetch");
}

/// DeleteRecords answers once every live replica's log start offset reached the offset
/// (Kafka's `DelayedDeleteRecords` and `lowWatermarkIfLeader`), REQUEST_TIMED_OUT with the
/// leader's low watermark when one did not in time, and a fenced replica does not hold it.
#[tokio::test]
async fn delete_records_waits_for_every_live_replicas_log_start_offset() {
    let mut f = Fixture::new(1, &[LOCAL, FOLLOWER, 3], &[]);
    for (id, epoch) in [(LOCAL, 10), (FOLLOWER, 20), (3, 30)] {
        f.register_broker(id, epoch);
    }
    f.set_partition(0, 1, 1, &[LOCAL, FOLLOWER, 3], &[LOCAL, FOLLOWER, 3]);
    for _ in 0..4 {
        complete(f.append(0, 1, 1000, 10).await);
    }
    follower_fetch_with_start(&f, FOLLOWER, 4, 0).await;
    follower_fetch_with_start(&f, 3, 4, 0).await;
    assert_eq!(f.partition(0).high_watermark(), 4);
    let tp = TopicPartition::new("t", 0);

    // Nobody reports the new start: the request times out with the low watermark it has.
    let r = f.rm.delete_records_many(50, vec![(tp.clone(), 2)]).await;
    assert_eq!(
        (r[0].error_code, r[0].low_watermark),
        (ec::REQUEST_TIMED_OUT, 0)
    );
    assert_eq!(f.partition(0).log.log_start_offset(), 2);
    assert_eq!(f.rm.delayed_operations().delete_records.delayed(), 0);

    // It completes when the last live follower reports a start at or past it.
    let rm = f.rm.clone();
    let request = tp.clone();
    let waiter =
        tokio::spawn(async move { rm.delete_records_many(30_000, vec![(request, 3)]).await });
    until("the delayed DeleteRecords", || {
        f.rm.delayed_operations().delete_records.delayed() == 1
    })
    .await;
    follower_fetch_with_start(&f, FOLLOWER, 4, 3).await;
    assert_eq!(f.rm.delayed_operations().delete_records.delayed(), 1);
    follower_fetch_with_start(&f, 3, 4, 2).await;
    assert_eq!(f.rm.delayed_operations().delete_records.delayed(), 1);
    follower_fetch_with_start(&f, 3, 4, 3).await;
    let r = waiter.await.expect("join");
    assert_eq!((r[0].error_code, r[0].low_watermark), (ec::NONE, 3));

    // Already there: answered at once. -1 means the high watermark.
    let r =
        f.rm.delete_records_many(30_000, vec![(tp.clone(), 1)])
            .await;
    assert_eq!((r[0].error_code, r[0].low_watermark), (ec::NONE, 3));

    // A fenced replica does not hold the low watermark back.
    f.image
        .apply(&MetadataRecord::RegisterBroker(RegisterBrokerRecord {
            broker_id: 3,
            broker_epoch: 30,
            incarnation_id: Uuid::new_v4(),
            fenced: true,
            ..RegisterBrokerRecord::default()
        }));
    f.rm.apply_image(&f.image).expect("apply image");
    let rm = f.rm.clone();
    let request = tp.clone();
    let waiter =
        tokio::spawn(async move { rm.delete_records_many(30_000, vec![(request, -1)]).await });
    until("the delayed DeleteRecords", || {
        f.rm.delayed_operations().delete_records.delayed() == 1
    })
    .await;
    follower_fetch_with_start(&f, FOLLOWER, 4, 4).await;
    let r = waiter.await.expect("join");
    assert_eq!((r[0].error_code, r[0].low_watermark), (ec::NONE, 4));

    // A leadership change ends the wait with NOT_LEADER_OR_FOLLOWER.
    complete(f.append(0, 1, 1000, 10).await);
    follower_fetch_with_start(&f, FOLLOWER, 5, 4).await;
    follower_fetch_with_start(&f, 3, 5, 4).await;
    assert_eq!(f.partition(0).high_watermark(), 5);
    let rm = f.rm.clone();
    let request = tp.clone();
    let waiter =
        tokio::spawn(async move { rm.delete_records_many(30_000, vec![(request, 5)]).await });
    until("the delayed DeleteRecords", || {
        f.rm.delayed_operations().delete_records.delayed() == 1
    })
    .await;
    f.set_leader(0, FOLLOWER, 2, &[LOCAL, FOLLOWER, 3]);
    let r = waiter.await.expect("join");
    assert_eq!(r[0].error_code, ec::NOT_LEADER_OR_FOLLOWER);
    assert!(purgatories_empty(&f.rm));
}

/// A replica manager over a fresh temp dir, as broker `LOCAL`.
fn bare_replica_manager() -> (TempDir, ReplicaManager) {
    let dir = tempfile::tempdir().expect("temp dir");
    let props: BTreeMap<String, String> = [
        ("log.dirs", dir.path().display().to_string()),
        ("node.id", LOCAL.to_string()),
        ("num.io.threads", "2".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let (config, _) = BrokerConfig::from_properties(props).expect("config");
    let (logs, _) = LogManager::open_with_clock(
        &[dir.path().to_path_buf()],
        Default::default(),
        ManualClock::new(T0_MS),
    )
    .expect("log manager");
    (dir, ReplicaManager::new(LOCAL, config, logs))
}

/// What a replica manager hosts, comparable between two of them: per partition its topic id,
/// leadership state and log config.
fn hosted(rm: &ReplicaManager) -> Vec<String> {
    let mut out: Vec<String> = rm
        .partitions()
        .iter()
        .map(|p| {
            let s = p.state();
            format!(
                "{} {} {:?} leader={} epoch={} pepoch={} replicas={:?} isr={:?} minisr={} {:?}",
                p.topic_partition(),
                p.topic_id,
                s.role,
                s.leader,
                s.leader_epoch,
                s.partition_epoch,
                s.replicas,
                s.isr,
                s.min_insync_replicas,
                p.log.config()
            )
        })
        .collect();
    out.sort();
    out
}

/// `apply_metadata`, which visits only the topics that changed since the image it applied
/// last, leaves the partitions exactly as `apply_image` of the same image, which visits all,
/// through a seeded random run of topic creations, deletions, re-creations under the same
/// name, reassignments onto and off this broker, leader and ISR changes, topic and broker
/// config changes and broker registrations.
#[test]
fn applying_only_what_changed_ends_where_applying_everything_does() {
    use gregor_protocol::metadata_records::{
        ConfigRecord, PartitionChangeRecord, RemoveTopicRecord,
    };
    let (_d1, delta_rm) = bare_replica_manager();
    let (_d2, full_rm) = bare_replica_manager();
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut image = Arc::new(MetadataImage::default());
    let names = ["a", "b", "c", "d", "e"];
    let mut scoped_steps = 0;
    for step in 0..400 {
        let mut next = (*image).clone();
        let mut records = Vec::new();
        let name = names[rand(names.len() as u64) as usize];
        let replicas = |r: u64| -> Vec<i32> {
            match r {
                0 => vec![LOCAL],
                1 => vec![LOCAL, FOLLOWER],
                2 => vec![FOLLOWER, LOCAL],
                _ => vec![FOLLOWER],
            }
        };
        match (next.topic_ids.get(name).copied(), rand(7)) {
            (None, _) => {
                let topic_id = Uuid::new_v4();
                records.push(MetadataRecord::Topic(TopicRecord {
                    name: name.into(),
                    topic_id,
                    ..TopicRecord::default()
                }));
                for p in 0..(1 + rand(3) as i32) {
                    let r = replicas(rand(4));
                    records.push(MetadataRecord::Partition(PartitionRecord {
                        topic_id,
                        partition_id: p,
                        leader: r[0],
                        isr: r.clone(),
                        replicas: r,
                        ..PartitionRecord::default()
                    }));
                }
            }
            (Some(topic_id), 0) => {
                records.push(MetadataRecord::RemoveTopic(RemoveTopicRecord {
                    topic_id,
                    ..RemoveTopicRecord::default()
                }));
            }
            (Some(topic_id), 1 | 2) => {
                let r = replicas(rand(4));
                records.push(MetadataRecord::PartitionChange(PartitionChangeRecord {
                    topic_id,
                    partition_id: 0,
                    leader: r[0],
                    isr: Some(r.clone()),
                    replicas: Some(r),
                    ..PartitionChangeRecord::default()
                }));
            }
            (Some(topic_id), 3) => {
                let isr = if rand(2) == 0 {
                    vec![LOCAL]
                } else {
                    vec![LOCAL, FOLLOWER]
                };
                records.push(MetadataRecord::PartitionChange(PartitionChangeRecord {
                    topic_id,
                    partition_id: 0,
                    leader: -2,
                    isr: Some(isr),
                    ..PartitionChangeRecord::default()
                }));
            }
            (Some(_), 4) => {
                records.push(MetadataRecord::Config(ConfigRecord {
                    resource_type: 2,
                    resource_name: name.into(),
                    name: "retention.ms".into(),
                    value: Some((1000 + rand(5) * 1000).to_string()),
                    ..ConfigRecord::default()
                }));
            }
            (Some(_), 5) => {
                records.push(MetadataRecord::Config(ConfigRecord {
                    resource_type: 4,
                    resource_name: String::new(),
                    name: "log.retention.bytes".into(),
                    value: Some((1u64 << (20 + rand(4))).to_string()),
                    ..ConfigRecord::default()
                }));
            }
            (Some(_), _) => {
                records.push(MetadataRecord::RegisterBroker(RegisterBrokerRecord {
                    broker_id: FOLLOWER,
                    broker_epoch: step,
                    incarnation_id: Uuid::new_v4(),
                    fenced: rand(2) == 0,
                    ..RegisterBrokerRecord::default()
                }));
            }
        }
        for r in &records {
            next.apply(r);
        }
        let next = Arc::new(next);
        if changed_topics(&image, &next).is_some() {
            scoped_steps += 1;
        }
        delta_rm
            .apply_metadata(&next, false)
            .expect("apply only what changed");
        full_rm.apply_image(&next).expect("apply everything");
        assert_eq!(
            hosted(&delta_rm),
            hosted(&full_rm),
            "step {step}: {records:?}"
        );
        image = next;
    }
    // Most steps took the path that visits only the changed topics.
    assert!(scoped_steps > 200, "{scoped_steps} of 400 steps scoped");
}

/// A change to one topic of an image names only that topic; a config or broker change names
/// none (everything is visited).
#[test]
fn changed_topics_names_only_the_topics_a_change_touched() {
    use gregor_protocol::metadata_records::ConfigRecord;
    let mut image = MetadataImage::default();
    let mut ids = Vec::new();
    for name in ["a", "b", "c"] {
        let topic_id = Uuid::new_v4();
        ids.push(topic_id);
        image.apply(&MetadataRecord::Topic(TopicRecord {
            name: name.into(),
            topic_id,
            ..TopicRecord::default()
        }));
        image.apply(&MetadataRecord::Partition(PartitionRecord {
            topic_id,
            partition_id: 0,
            leader: LOCAL,
            isr: vec![LOCAL],
            replicas: vec![LOCAL],
            ..PartitionRecord::default()
        }));
    }
    let mut next = image.clone();
    next.apply(&MetadataRecord::Partition(PartitionRecord {
        topic_id: ids[1],
        partition_id: 1,
        leader: LOCAL,
        isr: vec![LOCAL],
        replicas: vec![LOCAL],
        ..PartitionRecord::default()
    }));
    let names = changed_topics(&image, &next).expect("only topics changed");
    assert_eq!(names, HashSet::from(["b".to_string()]));
    let mut configs = next.clone();
    configs.apply(&MetadataRecord::Config(ConfigRecord {
        resource_type: 2,
        resource_name: "c".into(),
        name: "retention.ms".into(),
        value: Some("1000".into()),
        ..ConfigRecord::default()
    }));
    assert_eq!(changed_topics(&next, &configs), None);
}

/// A partition whose log cannot be created (a file where its directory should be) does not
/// stop the others of the image: they are hosted, the failure is remembered with the topic id
/// and the cause, and once the fault is gone a retry, with no metadata change, creates it. A
/// failure is forgotten when its topic is deleted.
#[test]
fn a_partition_whose_log_cannot_be_created_does_not_stop_the_others_and_is_retried() {
    use gregor_protocol::metadata_records::RemoveTopicRecord;
    let (dir, rm) = bare_replica_manager();
    let topic_id = Uuid::new_v4();
    let mut image = MetadataImage::default();
    image.apply(&MetadataRecord::Topic(TopicRecord {
        name: "t".into(),
        topic_id,
        ..TopicRecord::default()
    }));
    for p in 0..3 {
        image.apply(&MetadataRecord::Partition(PartitionRecord {
            topic_id,
            partition_id: p,
            leader: LOCAL,
            isr: vec![LOCAL],
            replicas: vec![LOCAL],
            ..PartitionRecord::default()
        }));
    }
    let in_the_way = dir.path().join("t-1");
    std::fs::write(&in_the_way, b"not a directory").expect("fault");
    let image = Arc::new(image);

    let err = rm
        .apply_metadata(&image, false)
        .expect_err("t-1 cannot be created");
    assert_eq!(err.not_created.len(), 1, "{err}");
    assert!(err.not_deleted.is_empty(), "{err}");
    let failure = &err.not_created[0];
    assert_eq!(failure.topic_partition, TopicPartition::new("t", 1));
    assert_eq!(failure.topic_id, topic_id);
    assert_eq!(
        failure.dir.as_deref(),
        Some(dir.path().display().to_string().as_str())
    );
    assert!(err.to_string().contains("t-1"), "{err}");
    assert!(failure.error.contains("File exists"), "{}", failure.error);
    // The partitions before and after the failing one are applied.
    for p in [0, 2] {
        let hosted = rm.partition("t", p).expect("hosted");
        assert!(hosted.is_leader(), "t-{p} leads");
    }
    assert!(rm.partition("t", 1).is_none());
    assert!(rm.has_log_creation_failures());
    assert_eq!(rm.log_creation_failures(), vec![failure.clone()]);
    assert_eq!(
        rm.log_creation_failures_of("t", topic_id),
        vec![failure.clone()]
    );
    assert!(rm.log_creation_failures_of("t", Uuid::new_v4()).is_empty());
    assert!(!rm.hosts_local_replicas(&image, "t"));

    // Still in the way: the retry fails the same way and creates nothing.
    let again = rm.retry_log_creation().expect_err("still failing");
    assert_eq!(again.not_created.len(), 1, "{again}");
    assert!(rm.partition("t", 1).is_none());

    std::fs::remove_file(&in_the_way).expect("remove the fault");
    assert_eq!(rm.retry_log_creation().expect("created"), 1);
    let p1 = rm.partition("t", 1).expect("t-1 hosted after the retry");
    assert!(p1.is_leader());
    assert_eq!(p1.topic_id, topic_id);
    assert!(in_the_way.join("partition.metadata").is_file());
    assert!(!rm.has_log_creation_failures());
    assert!(rm.hosts_local_replicas(&image, "t"));
    assert_eq!(rm.retry_log_creation().expect("nothing to do"), 0);

    // A failure of a topic that is then deleted is forgotten, and what is in the way stays.
    std::fs::write(dir.path().join("t-3"), b"not a directory").expect("fault");
    let mut next = (*image).clone();
    next.apply(&MetadataRecord::Partition(PartitionRecord {
        topic_id,
        partition_id: 3,
        leader: LOCAL,
        isr: vec![LOCAL],
        replicas: vec![LOCAL],
        ..PartitionRecord::default()
    }));
    let next = Arc::new(next);
    rm.apply_metadata(&next, false)
        .expect_err("t-3 cannot be created");
    assert_eq!(rm.log_creation_failures().len(), 1);
    let mut gone = (*next).clone();
    gone.apply(&MetadataRecord::RemoveTopic(RemoveTopicRecord {
        topic_id,
        ..RemoveTopicRecord::default()
    }));
    rm.apply_metadata(&Arc::new(gone), false)
        .expect("the deletion applies");
    assert!(!rm.has_log_creation_failures());
    assert!(rm.partitions().is_empty());
    assert!(dir.path().join("t-3").is_file());
    assert!(!dir.path().join("t-0").exists());
}

/// A replica whose log could not be created is answered KAFKA_STORAGE_ERROR by produce, fetch,
/// ListOffsets and DeleteRecords (Kafka's offline partition), with the cause on produce; a
/// partition this broker knows nothing of stays UNKNOWN_TOPIC_OR_PARTITION; once the retry
/// creates the log, it is written and read.
#[tokio::test]
async fn a_replica_whose_log_could_not_be_created_answers_kafka_storage_error() {
    let (dir, rm) = bare_replica_manager();
    let topic_id = Uuid::new_v4();
    let mut image = MetadataImage::default();
    image.apply(&MetadataRecord::Topic(TopicRecord {
        name: "t".into(),
        topic_id,
        ..TopicRecord::default()
    }));
    image.apply(&MetadataRecord::Partition(PartitionRecord {
        topic_id,
        partition_id: 0,
        leader: LOCAL,
        isr: vec![LOCAL],
        replicas: vec![LOCAL],
        ..PartitionRecord::default()
    }));
    let in_the_way = dir.path().join("t-0");
    std::fs::write(&in_the_way, b"not a directory").expect("fault");
    rm.apply_metadata(&Arc::new(image), false)
        .expect_err("t-0 cannot be created");

    let batch = BatchBuilder::new(0, T0_MS)
        .record(T0_MS, Some(b"k"), Some(b"v"), &[])
        .build();
    let produce = |p: i32| {
        rm.append_records(
            5_000,
            -1,
            AppendOrigin::Client,
            vec![(TopicPartition::new("t", p), batch.clone())],
        )
    };
    let r = complete(produce(0).await).remove(0);
    assert_eq!(r.error_code, ec::KAFKA_STORAGE_ERROR);
    let message = r.error_message.unwrap_or_default();
    assert!(
        message.contains("t-0") && message.contains("File exists"),
        "{message}"
    );
    let r = complete(produce(7).await).remove(0);
    assert_eq!(r.error_code, ec::UNKNOWN_TOPIC_OR_PARTITION);

    let fetch = |p: i32| FetchPartition {
        topic_partition: TopicPartition::new("t", p),
        fetch_offset: 0,
        partition_max_bytes: i32::MAX,
        current_leader_epoch: -1,
        last_fetched_epoch: -1,
        log_start_offset: -1,
    };
    let r = fetched(
        rm.fetch_messages(consumer(0), vec![fetch(0), fetch(7)])
            .await,
    );
    assert_eq!(r[0].error_code, ec::KAFKA_STORAGE_ERROR);
    assert_eq!(r[1].error_code, ec::UNKNOWN_TOPIC_OR_PARTITION);

    let r = rm
        .fetch_offsets_from(
            None,
            true,
            vec![
                (TopicPartition::new("t", 0), -1, -1),
                (TopicPartition::new("t", 7), -1, -1),
            ],
        )
        .await;
    assert_eq!(
        r,
        vec![
            Err(ec::KAFKA_STORAGE_ERROR),
            Err(ec::UNKNOWN_TOPIC_OR_PARTITION)
        ]
    );
    let r = rm
        .delete_records_many(1_000, vec![(TopicPartition::new("t", 0), 0)])
        .await;
    assert_eq!(r[0].error_code, ec::KAFKA_STORAGE_ERROR);

    std::fs::remove_file(&in_the_way).expect("remove the fault");
    assert_eq!(rm.retry_log_creation().expect("created"), 1);
    let r = complete(produce(0).await).remove(0);
    assert_eq!((r.error_code, r.base_offset), (ec::NONE, 0));
    let r = fetched(rm.fetch_messages(consumer(0), vec![fetch(0)]).await);
    assert_eq!((r[0].error_code, r[0].high_watermark), (ec::NONE, 1));
}

/// KIP-858: a replica assigned to a log directory this broker does not have (a disk that did
/// not mount) gets no empty log: it answers KAFKA_STORAGE_ERROR and no partition directory
/// is created, while replicas in a present directory, unassigned ones and a log that exists
/// here anyway are hosted.
#[test]
fn a_replica_in_a_missing_log_dir_gets_no_empty_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut props = BTreeMap::new();
    props.insert("log.dirs".to_string(), dir.path().display().to_string());
    props.insert("node.id".to_string(), LOCAL.to_string());
    let (config, _) = BrokerConfig::from_properties(props).expect("config");
    let (logs, _) =
        LogManager::open(&[dir.path().to_path_buf()], Default::default()).expect("log manager");
    let rm = ReplicaManager::new(LOCAL, config, logs);
    let (present, missing) = (Uuid::new_v4(), Uuid::new_v4());
    rm.set_log_dir_ids(vec![present]);
    let topic_id = Uuid::new_v4();
    let mut image = MetadataImage::default();
    image.apply(&MetadataRecord::Topic(TopicRecord {
        name: "t".into(),
        topic_id,
        ..TopicRecord::default()
    }));
    let lost = gregor_metadata::record::DIRECTORY_LOST;
    let unassigned = gregor_metadata::record::DIRECTORY_UNASSIGNED;
    for (p, d) in [
        (0, present),
        (1, missing),
        (2, unassigned),
        (3, missing),
        (4, lost),
    ] {
        image.apply(&MetadataRecord::Partition(PartitionRecord {
            topic_id,
            partition_id: p,
            replicas: vec![LOCAL],
            isr: vec![LOCAL],
            directories: vec![d],
            leader: LOCAL,
            ..PartitionRecord::default()
        }));
    }
    // Partition 3's log is here although its registration names the missing dir: it is used.
    rm.logs()
        .get_or_create(
            &TopicPartition::new("t", 3),
            *topic_id.as_bytes(),
            Default::default(),
        )
        .expect("log 3");
    rm.apply_image(&image).expect("applied");
    for p in [0, 2, 3] {
        assert!(rm.partition("t", p).is_some(), "t-{p} hosted");
    }
    for p in [1, 4] {
        assert!(rm.partition("t", p).is_none(), "t-{p} not hosted");
        assert!(
            !dir.path().join(format!("t-{p}")).exists(),
            "no log created for t-{p}"
        );
        match rm.hosted(&TopicPartition::new("t", p)) {
            Err((code, message)) => {
                assert_eq!(code, ec::KAFKA_STORAGE_ERROR);
                assert!(message.contains("not on this broker"), "{message}");
            }
            Ok(_) => panic!("t-{p} hosted"),
        }
    }
    assert_eq!(
        rm.missing_dir_of(&image.topics[&topic_id].partitions[&1]),
        Some(missing)
    );
    // Once the image assigns it to a present dir (a reassignment), the replica is created.
    image.apply(&MetadataRecord::Partition(PartitionRecord {
        topic_id,
        partition_id: 1,
        replicas: vec![LOCAL],
        isr: vec![LOCAL],
        directories: vec![present],
        leader: LOCAL,
        leader_epoch: 1,
        partition_epoch: 1,
        ..PartitionRecord::default()
    }));
    rm.apply_image(&image).expect("applied");
    assert!(rm.partition("t", 1).is_some());
    assert!(rm.hosted(&TopicPartition::new("t", 1)).is_ok());
}
