//! Fetch from follower (KIP-392) in the replica manager: the leader's preferred read replica
//! and a follower's reads for consumers.

use gregor_protocol::batch::set_partition_leader_epoch;
use gregor_protocol::metadata_records::BrokerEndpoint;

use super::*;
use crate::replication::replica_selector::RACK_AWARE_REPLICA_SELECTOR;

const THIRD: i32 = 3;

/// A consumer fetch v11+ from `rack` on the PLAINTEXT listener.
fn rack_consumer(rack: &str, max_wait_ms: i64) -> FetchParams {
    FetchParams {
        client_metadata: Some(ClientMetadata {
            rack_id: rack.into(),
            client_id: "consumer".into(),
            listener_name: "PLAINTEXT".into(),
        }),
        ..consumer(max_wait_ms)
    }
}

fn register(f: &mut Fixture, id: i32, rack: &str, fenced: bool) {
    f.image
        .apply(&MetadataRecord::RegisterBroker(RegisterBrokerRecord {
            broker_id: id,
            broker_epoch: 10 + i64::from(id),
            incarnation_id: Uuid::new_v4(),
            fenced,
            rack: Some(rack.into()),
            end_points: vec![BrokerEndpoint {
                name: "PLAINTEXT".into(),
                host: "127.0.0.1".into(),
                port: 9000 + id as u16,
                ..BrokerEndpoint::default()
            }],
            ..RegisterBrokerRecord::default()
        }));
    f.rm.apply_image(&f.image).expect("apply image");
}

/// Leader LOCAL (rack r1) with followers FOLLOWER (r2) and THIRD (r3), all in the ISR, and the
/// rack-aware selector configured.
fn rack_aware_leader() -> Fixture {
    let mut f = Fixture::new(
        1,
        &[LOCAL, FOLLOWER, THIRD],
        &[("replica.selector.class", RACK_AWARE_REPLICA_SELECTOR)],
    );
    register(&mut f, LOCAL, "r1", false);
    register(&mut f, FOLLOWER, "r2", false);
    register(&mut f, THIRD, "r3", false);
    f
}

fn batch(base: i64, epoch: i32, records: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(base, T0_MS);
    for _ in 0..records {
        b = b.record(T0_MS, None, Some(&[7u8; 20]), &[]);
    }
    let mut v = b.build();
    set_partition_leader_epoch(&mut v, epoch);
    v
}

async fn fetch_at(
    f: &Fixture,
    params: FetchParams,
    offset: i64,
    current_leader_epoch: i32,
) -> FetchPartitionResult {
    let parts = vec![FetchPartition {
        topic_partition: TopicPartition::new("t", 0),
        fetch_offset: offset,
        partition_max_bytes: i32::MAX,
        current_leader_epoch,
        last_fetched_epoch: -1,
        log_start_offset: -1,
    }];
    fetched(f.rm.fetch_messages(params, parts).await).remove(0)
}

fn record_offsets(records: &gregor_log::FetchRecords) -> Vec<i64> {
    let records = records.to_bytes().expect("records");
    gregor_protocol::batch::Batches::new(&records)
        .map(|b| b.expect("batch").1)
        .flat_map(|h| h.base_offset..=h.base_offset + i64::from(h.last_offset_delta))
        .collect()
}

#[tokio::test]
async fn the_leader_names_the_follower_in_the_consumers_rack_and_sends_no_records() {
    let f = rack_aware_leader();
    for _ in 0..3 {
        complete(f.append(0, 1, 1000, 10).await);
    }
    // Both followers fetch everything: HW 3, both in the ISR with LEO 3.
    follower_fetch_one(&f, follower_fetch(FOLLOWER, -1), 3, -1, -1).await;
    follower_fetch_one(&f, follower_fetch(THIRD, -1), 3, -1, -1).await;
    assert_eq!(f.partition(0).high_watermark(), 3);
    // A fetch in r2 waiting for more than is there: answered at once with the follower.
    let r = fetch_at(&f, rack_consumer("r2", 30_000), 0, 0).await;
    assert_eq!(r.error_code, ec::NONE);
    assert_eq!(r.preferred_read_replica, Some(FOLLOWER));
    assert!(r.records.is_empty(), "no records with a preferred replica");
    assert_eq!((r.high_watermark, r.log_start_offset), (3, 0));
    assert_eq!(
        fetch_at(&f, rack_consumer("r3", 0), 0, -1)
            .await
            .preferred_read_replica,
        Some(THIRD)
    );
    // The leader's rack, no rack, another rack: the leader reads itself (-1 on the wire).
    for rack in ["r1", "", "r9"] {
        let r = fetch_at(&f, rack_consumer(rack, 0), 0, -1).await;
        assert_eq!(r.preferred_read_replica, None, "{rack}");
        assert_eq!(record_offsets(&r.records), vec![0, 1, 2]);
    }
    // Fetch < v11 (no client metadata): the leader.
    let r = fetch_at(&f, consumer(0), 0, -1).await;
    assert_eq!(r.preferred_read_replica, None);
    // The leader-epoch check still applies to the preferred-replica answer.
    let r = fetch_at(&f, rack_consumer("r2", 0), 0, 7).await;
    assert_eq!(r.error_code, ec::UNKNOWN_LEADER_EPOCH);
    assert!(purgatories_empty(&f.rm));
}

#[tokio::test]
async fn a_follower_that_cannot_serve_the_offset_is_not_preferred() {
    let mut f = rack_aware_leader();
    for _ in 0..3 {
        complete(f.append(0, 1, 1000, 10).await);
    }
    // FOLLOWER has fetched up to 1 only: fine for offset 1, not for 2.
    follower_fetch_one(&f, follower_fetch(FOLLOWER, -1), 1, -1, -1).await;
    let preferred = |r: FetchPartitionResult| r.preferred_read_replica;
    assert_eq!(
        preferred(fetch_at(&f, rack_consumer("r2", 0), 1, -1).await),
        Some(FOLLOWER)
    );
    assert_eq!(
        preferred(fetch_at(&f, rack_consumer("r2", 0), 2, -1).await),
        None
    );
    // Out of the committed ISR: never.
    f.set_partition(0, 0, 5, &[LOCAL, FOLLOWER, THIRD], &[LOCAL, THIRD]);
    assert_eq!(
        preferred(fetch_at(&f, rack_consumer("r2", 0), 0, -1).await),
        None
    );
    // Fenced: never (no endpoint).
    f.set_partition(
        0,
        0,
        6,
        &[LOCAL, FOLLOWER, THIRD],
        &[LOCAL, FOLLOWER, THIRD],
    );
    follower_fetch_one(&f, follower_fetch(FOLLOWER, -1), 3, -1, -1).await;
    assert_eq!(
        preferred(fetch_at(&f, rack_consumer("r2", 0), 0, -1).await),
        Some(FOLLOWER)
    );
    register(&mut f, FOLLOWER, "r2", true);
    assert_eq!(
        preferred(fetch_at(&f, rack_consumer("r2", 0), 0, -1).await),
        None
    );
}

#[tokio::test]
async fn without_a_selector_the_leader_serves_every_consumer() {
    let mut f = Fixture::new(1, &[LOCAL, FOLLOWER], &[]);
    register(&mut f, LOCAL, "r1", false);
    register(&mut f, FOLLOWER, "r2", false);
    complete(f.append(0, 1, 1000, 10).await);
    follower_fetch_one(&f, follower_fetch(FOLLOWER, -1), 1, -1, -1).await;
    let r = fetch_at(&f, rack_consumer("r2", 0), 0, -1).await;
    assert_eq!(r.preferred_read_replica, None);
    assert_eq!(record_offsets(&r.records), vec![0]);
}

#[test]
fn an_unknown_replica_selector_class_stops_start_up() {
    let props = |v: &str| {
        [("replica.selector.class".to_string(), v.to_string())]
            .into_iter()
            .collect::<BTreeMap<_, _>>()
    };
    let e = BrokerConfig::from_properties(props("com.example.NearestSelector")).unwrap_err();
    assert_eq!(e.name, "replica.selector.class");
    assert!(e.reason.contains("cannot load Java classes"), "{e}");
    let (c, unknown) = BrokerConfig::from_properties(props(RACK_AWARE_REPLICA_SELECTOR)).unwrap();
    assert!(unknown.is_empty());
    assert_eq!(c.replica_selector(), Some(ReplicaSelector::RackAware));
    let (c, _) = BrokerConfig::from_properties(BTreeMap::new()).unwrap();
    assert_eq!(c.replica_selector(), None);
}

/// LOCAL follows FOLLOWER in epoch 1 and holds offsets 0..5 of which the leader said 0..3 are
/// committed.
fn follower_with_data() -> Fixture {
    let mut f = Fixture::new(1, &[LOCAL, FOLLOWER], &[]);
    f.set_leader(0, FOLLOWER, 1, &[LOCAL, FOLLOWER]);
    let p = f.partition(0);
    assert_eq!(p.role(), Role::Follower);
    p.append_records_as_follower(&batch(0, 1, 3))
        .expect("append");
    p.append_records_as_follower(&batch(3, 1, 2))
        .expect("append");
    p.update_follower_offsets(3, 0);
    assert_eq!((p.high_watermark(), p.log.log_end_offset()), (3, 5));
    f
}

#[tokio::test]
async fn a_follower_serves_consumers_up_to_its_own_high_watermark() {
    let f = follower_with_data();
    let r = fetch_at(&f, rack_consumer("r1", 0), 0, 1).await;
    assert_eq!(r.error_code, ec::NONE);
    assert_eq!(
        record_offsets(&r.records),
        vec![0, 1, 2],
        "not above the HW"
    );
    assert_eq!((r.high_watermark, r.last_stable_offset), (3, 3));
    assert_eq!(r.preferred_read_replica, None);
    // At the HW, and between the HW and the log end offset: nothing, no error (Kafka's
    // LocalLog.read); past the log end offset: OFFSET_OUT_OF_RANGE, which sends clients back
    // to the leader.
    for offset in [3, 4, 5] {
        let r = fetch_at(&f, rack_consumer("r1", 0), offset, -1).await;
        assert_eq!((r.error_code, r.records.len()), (ec::NONE, 0), "{offset}");
    }
    let r = fetch_at(&f, rack_consumer("r1", 0), 6, -1).await;
    assert_eq!(r.error_code, ec::OFFSET_OUT_OF_RANGE);
    assert_eq!(r.high_watermark, -1);
    // read_committed: the last stable offset (the HW without transactions).
    let committed = FetchParams {
        isolation_level: 1,
        ..rack_consumer("r1", 0)
    };
    let r = fetch_at(&f, committed, 0, -1).await;
    assert_eq!(record_offsets(&r.records), vec![0, 1, 2]);
}

#[tokio::test]
async fn a_follower_checks_the_consumers_leader_epoch_and_refuses_old_fetches_and_followers() {
    let f = follower_with_data();
    // KIP-320 against the follower's epoch (1).
    let r = fetch_at(&f, rack_consumer("r1", 0), 0, 0).await;
    assert_eq!(r.error_code, ec::FENCED_LEADER_EPOCH);
    let r = fetch_at(&f, rack_consumer("r1", 0), 0, 2).await;
    assert_eq!(r.error_code, ec::UNKNOWN_LEADER_EPOCH);
    // Fetch < v11 (no client metadata): the leader only.
    let r = fetch_at(&f, consumer(0), 0, 1).await;
    assert_eq!(r.error_code, ec::NOT_LEADER_OR_FOLLOWER);
    // Another follower's fetch: refused on a follower.
    let r = fetch_at(&f, follower_fetch(THIRD, -1), 0, 1).await;
    assert_eq!(r.error_code, ec::NOT_LEADER_OR_FOLLOWER);
    // No leader: nobody is served.
    let mut f = f;
    f.set_leader(0, -1, 2, &[LOCAL, FOLLOWER]);
    let r = fetch_at(&f, rack_consumer("r1", 0), 0, -1).await;
    assert_eq!(r.error_code, ec::NOT_LEADER_OR_FOLLOWER);
}

#[tokio::test]
async fn a_delayed_fetch_on_a_follower_completes_when_its_high_watermark_moves() {
    let f = follower_with_data();
    let p = f.partition(0);
    let params = FetchParams {
        min_bytes: 1,
        ..rack_consumer("r1", 30_000)
    };
    let parts = vec![FetchPartition {
        topic_partition: TopicPartition::new("t", 0),
        fetch_offset: 3,
        partition_max_bytes: i32::MAX,
        current_leader_epoch: 1,
        last_fetched_epoch: -1,
        log_start_offset: -1,
    }];
    let FetchOutcome::Delayed(d) = f.rm.fetch_messages(params, parts).await else {
        panic!("records 3 and 4 are above the follower's HW: the fetch waits");
    };
    let waiter = tokio::spawn(d.complete());
    until("the fetch waits", || {
        f.rm.delayed_operations().fetch.delayed() == 1
    })
    .await;
    // More data from the leader without a HW move does not complete it...
    p.append_records_as_follower(&batch(5, 1, 1))
        .expect("append");
    p.update_follower_offsets(3, 0);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished(), "nothing readable yet");
    // ...the leader's HW reaching the follower does.
    p.update_follower_offsets(5, 0);
    let got = waiter.await.expect("join");
    assert_eq!(got[0].error_code, ec::NONE);
    assert_eq!(record_offsets(&got[0].records), vec![3, 4]);
    assert_eq!(got[0].high_watermark, 5);
    assert!(purgatories_empty(&f.rm));
}

#[tokio::test]
async fn a_delayed_consumer_fetch_on_a_follower_completes_when_it_stops_being_a_replica() {
    let mut f = follower_with_data();
    let FetchOutcome::Delayed(d) = f.fetch(rack_consumer("r1", 30_000), &[(0, 3)]).await else {
        panic!("nothing above the HW is readable: the fetch waits");
    };
    let waiter = tokio::spawn(d.complete());
    until("the fetch waits", || {
        f.rm.delayed_operations().fetch.delayed() == 1
    })
    .await;
    f.set_leader(0, -1, 2, &[LOCAL, FOLLOWER]);
    let got = waiter.await.expect("join");
    assert_eq!(got[0].error_code, ec::NOT_LEADER_OR_FOLLOWER);
    assert!(purgatories_empty(&f.rm));
}

#[tokio::test]
async fn list_offsets_and_offset_for_leader_epoch_stay_with_the_leader() {
    let f = follower_with_data();
    let latest = || (TopicPartition::new("t", 0), partition::LATEST_TIMESTAMP, 1);
    // Consumers and followers: the leader only (Kafka's fetchOnlyFromLeader).
    let r = f.rm.fetch_offsets(Some(0), vec![latest()]).await;
    assert_eq!(r[0], Err(ec::NOT_LEADER_OR_FOLLOWER));
    let r = f.rm.fetch_offsets_from(None, true, vec![latest()]).await;
    assert_eq!(r[0], Err(ec::NOT_LEADER_OR_FOLLOWER));
    // The debugging replica id (-2): a follower answers, from its log end offset.
    let r = f.rm.fetch_offsets_from(None, false, vec![latest()]).await;
    assert_eq!(r[0].map(|(_, offset, _)| offset), Ok(5));
    let r =
        f.rm.fetch_offsets_from(None, false, vec![(TopicPartition::new("t", 0), 0, 0)])
            .await;
    assert_eq!(
        r[0],
        Err(ec::FENCED_LEADER_EPOCH),
        "the epoch is still checked"
    );
    assert_eq!(
        f.partition(0).last_offset_for_leader_epoch(1, 1),
        Err(ec::NOT_LEADER_OR_FOLLOWER)
    );
}
