//! The fetcher manager's bookkeeping over real partitions (a temp log dir, images built from
//! records): which partitions are fetched from which leader as the metadata changes, and the
//! high watermark read back from `replication-offset-checkpoint` at start-up. The fetching
//! itself runs against real gregor leaders in `crates/cli/tests/replica_fetcher.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use gregor_log::{LogManager, TopicPartition};
use gregor_metadata::{MetadataImage, MetadataRecord};
use gregor_protocol::batch::{set_partition_leader_epoch, BatchBuilder};
use gregor_protocol::metadata_records::{
    BrokerEndpoint, PartitionRecord, RegisterBrokerRecord, TopicRecord,
};
use tempfile::TempDir;
use uuid::Uuid;

use super::*;
use crate::config::BrokerConfig;

const LOCAL: i32 = 1;

fn config(dir: &TempDir) -> BrokerConfig {
    let props: BTreeMap<String, String> = [
        ("log.dirs", dir.path().display().to_string()),
        ("node.id", LOCAL.to_string()),
        ("num.io.threads", "1".to_string()),
        ("num.replica.fetchers", "2".to_string()),
        ("listeners", "PLAINTEXT://127.0.0.1:0".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    BrokerConfig::from_properties(props).expect("config").0
}

fn register(image: &mut MetadataImage, id: i32, port: u16) {
    image.apply(&MetadataRecord::RegisterBroker(RegisterBrokerRecord {
        broker_id: id,
        broker_epoch: 10 + i64::from(id),
        end_points: vec![BrokerEndpoint {
            name: "PLAINTEXT".into(),
            host: "127.0.0.1".into(),
            port,
            security_protocol: 0,
            ..BrokerEndpoint::default()
        }],
        ..RegisterBrokerRecord::default()
    }));
}

fn set_partition(image: &mut MetadataImage, topic_id: Uuid, p: i32, leader: i32, epoch: i32) {
    image.apply(&MetadataRecord::Partition(PartitionRecord {
        topic_id,
        partition_id: p,
        replicas: vec![1, 2, 3],
        isr: vec![1, 2, 3],
        leader,
        leader_epoch: epoch,
        partition_epoch: epoch,
        ..PartitionRecord::default()
    }));
}

fn image_with_topic(topic_id: Uuid, partitions: i32, leader: i32) -> MetadataImage {
    let mut image = MetadataImage::default();
    // Ports nothing listens on: the fetchers only back off and reconnect.
    register(&mut image, 1, 1);
    register(&mut image, 2, 2);
    register(&mut image, 3, 3);
    image.apply(&MetadataRecord::Topic(TopicRecord {
        name: "t".into(),
        topic_id,
        ..TopicRecord::default()
    }));
    for p in 0..partitions {
        set_partition(&mut image, topic_id, p, leader, 0);
    }
    image
}

/// Partitions led elsewhere join the fetcher of their leader (fetcher id by Kafka's hash);
/// a leader epoch change re-adds them; becoming leader, losing the leader and deletion
/// remove them, and fetchers left without partitions stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetchers_follow_the_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let (logs, _) = LogManager::open(&[dir.path().to_path_buf()], Default::default()).unwrap();
    let rm = ReplicaManager::new(LOCAL, cfg.clone(), logs);
    let fetchers = Arc::new(ReplicaFetcherManager::new(
        FetcherConfig::from_broker(&cfg),
        7,
        rm.io_pool().clone(),
        rm.clock().clone(),
        rm.replication_quotas().clone(),
    ));
    assert_eq!(
        fetchers.config().listener_name.as_deref(),
        Some("PLAINTEXT")
    );
    rm.set_fetchers(fetchers.clone());
    let topic_id = Uuid::new_v4();
    let mut image = image_with_topic(topic_id, 4, 2);
    rm.apply_image(&image).unwrap();
    let tp = |p| TopicPartition::new("t", p);
    for p in 0..4 {
        let (source, id) = fetchers.fetcher_of(&tp(p)).expect("followed");
        assert_eq!(source, 2);
        assert_eq!(id, fetcher_id("t", p, 2));
    }
    let ids: std::collections::BTreeSet<_> = (0..4).map(|p| fetcher_id("t", p, 2)).collect();
    assert_eq!(fetchers.num_fetchers(), ids.len());

    // Partition 0: leader 3 now (another fetcher); 1: this broker leads; 2: no leader;
    // 3: same leader, new epoch (stays with leader 2).
    set_partition(&mut image, topic_id, 0, 3, 1);
    set_partition(&mut image, topic_id, 1, LOCAL, 1);
    set_partition(&mut image, topic_id, 2, -1, 1);
    set_partition(&mut image, topic_id, 3, 2, 1);
    rm.apply_image(&image).unwrap();
    assert_eq!(fetchers.fetcher_of(&tp(0)).map(|k| k.0), Some(3));
    assert_eq!(fetchers.fetcher_of(&tp(1)), None);
    assert_eq!(fetchers.fetcher_of(&tp(2)), None);
    assert_eq!(fetchers.fetcher_of(&tp(3)).map(|k| k.0), Some(2));
    assert!(rm.partition("t", 1).is_some_and(|p| p.is_leader()));
    {
        let all = fetchers.fetchers.lock();
        let total: usize = all.values().map(|f| f.shared.partitions.lock().len()).sum();
        assert_eq!(total, 2);
        // The epoch-1 partition is fetched with its new epoch from its log end offset.
        let key = fetchers.fetcher_of(&tp(3)).unwrap();
        let shared = all.get(&key).unwrap().shared.clone();
        let parts = shared.partitions.lock();
        let f = parts.get(&tp(3)).unwrap();
        assert_eq!(f.state.current_leader_epoch, 1);
        assert_eq!(f.state.fetch_offset, 0);
    }

    // The topic is deleted: every fetcher empties and stops.
    image.apply(&MetadataRecord::RemoveTopic(
        gregor_protocol::metadata_records::RemoveTopicRecord {
            topic_id,
            ..Default::default()
        },
    ));
    rm.apply_image(&image).unwrap();
    assert_eq!(fetchers.fetcher_of(&tp(0)), None);
    assert_eq!(fetchers.fetcher_of(&tp(3)), None);
    assert_eq!(fetchers.num_fetchers(), 0);
    fetchers.shutdown().await;
}

fn batch(base: i64, epoch: i32, records: usize) -> Vec<u8> {
    let mut b = BatchBuilder::new(base, 1_000);
    for _ in 0..records {
        b = b.record(1_000, None, Some(&[7u8; 20]), &[]);
    }
    let mut v = b.build();
    set_partition_leader_epoch(&mut v, epoch);
    v
}

/// `replication-offset-checkpoint` is read when the replica manager starts: each partition
/// created from the metadata starts at its checkpointed high watermark, clipped to its log
/// end offset; a partition without an entry starts at its log start offset.
#[test]
fn high_watermarks_are_restored_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let topic_id = Uuid::new_v4();
    {
        let (logs, _) = LogManager::open(&[dir.path().to_path_buf()], Default::default()).unwrap();
        for (p, n) in [(0, 3), (1, 1), (2, 2)] {
            let log = logs
                .get_or_create(
                    &TopicPartition::new("t", p),
                    *topic_id.as_bytes(),
                    Default::default(),
                )
                .unwrap();
            for i in 0..n {
                log.append_as_follower(&batch(i * 5, 0, 5), 0).unwrap();
            }
        }
        let hws = BTreeMap::from([(0, 9i64), (1, 100)]);
        logs.checkpoint_high_watermarks(|tp| hws.get(&tp.partition).copied())
            .unwrap();
        logs.shutdown().unwrap();
    }
    let (logs, _) = LogManager::open(&[dir.path().to_path_buf()], Default::default()).unwrap();
    let rm = ReplicaManager::new(LOCAL, cfg, logs);
    rm.apply_image(&image_with_topic(topic_id, 3, 2)).unwrap();
    let hw = |p| rm.partition("t", p).map(|p| p.high_watermark());
    assert_eq!(hw(0), Some(9));
    assert_eq!(hw(1), Some(5), "clipped to the log end offset");
    assert_eq!(hw(2), Some(0), "no entry: the log start offset");
    // Written back as it is now.
    checkpoint_high_watermarks(&rm, None).unwrap();
    let text = std::fs::read_to_string(dir.path().join("replication-offset-checkpoint")).unwrap();
    assert_eq!(text, "0\n3\nt 0 9\nt 1 5\nt 2 0\n");
}

/// The leader's log start offset fell inside a batch (DeleteRecords): a follower restarted at
/// that offset gets the whole batch, starts its log at the batch's base offset, appends it,
/// and raises its log start offset back to the leader's; its high watermark is the leader's
/// clipped to its log.
#[test]
fn a_follower_restarted_inside_a_batch_takes_the_whole_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (logs, _) = LogManager::open(&[dir.path().to_path_buf()], Default::default()).unwrap();
    let tp = TopicPartition::new("t", 0);
    let topic_id = Uuid::new_v4();
    let log = logs
        .get_or_create(&tp, *topic_id.as_bytes(), Default::default())
        .unwrap();
    let clock = logs.clock().clone();
    let p = Partition::new(
        topic_id,
        tp,
        log.clone(),
        LOCAL,
        crate::replica_manager::DelayedOperations::new(&clock),
        clock,
        crate::replica_manager::partition::ReplicationContext::new(30_000),
    );
    log.append_as_follower(&batch(0, 0, 5), 0).unwrap();
    // Out of range below the leader's log start offset 7: start over there.
    p.truncate_fully_as_follower(7).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (7, 7));
    assert_eq!(p.high_watermark(), 7);
    // The leader answers the fetch at 7 with its batch [5, 9].
    p.append_records_as_follower(&batch(5, 2, 5)).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (5, 10));
    assert!(
        p.update_follower_offsets(8, 7),
        "the log start offset moved"
    );
    assert_eq!(log.log_start_offset(), 7);
    assert_eq!(p.high_watermark(), 8);
    // A batch that does not reach the log end offset is still refused.
    assert!(p.append_records_as_follower(&batch(20, 2, 1)).is_err());
    // Diverging: truncation drops the high watermark with the log end offset.
    p.append_records_as_follower(&batch(10, 2, 5)).unwrap();
    assert!(!p.update_follower_offsets(15, 7));
    assert_eq!(p.high_watermark(), 15);
    assert_eq!(p.truncate_as_follower(10).unwrap(), 10);
    assert_eq!(p.high_watermark(), 10);
}

/// Follower-side replication throttle (KIP-73, Kafka's `shouldFollowerThrottle`): while the
/// follower quota is exceeded, a throttled partition that is not in sync is left out of the
/// fetch (the fetcher looks again after `replica.fetch.backoff.ms`); an in-sync one stays in.
/// Appended bytes of throttled partitions are recorded, and the lag follows the leader's HW.
#[test]
fn the_follower_leaves_throttled_out_of_sync_partitions_out_of_its_fetch() {
    use gregor_protocol::kafka_protocol::messages::fetch_response::{
        FetchableTopicResponse, PartitionData,
    };
    use gregor_protocol::kafka_protocol::messages::FetchResponse;

    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let (logs, _) = LogManager::open(&[dir.path().to_path_buf()], Default::default()).unwrap();
    let rm = ReplicaManager::new(LOCAL, cfg.clone(), logs);
    let topic_id = Uuid::new_v4();
    rm.apply_image(&image_with_topic(topic_id, 2, 2)).unwrap();
    let quotas = rm.replication_quotas().clone();
    quotas.follower.update_quota(100);
    quotas
        .follower
        .set_throttled(std::collections::HashMap::from([(
            "t".to_string(),
            crate::replication::quota::ThrottledPartitions::Some([0].into()),
        )]));
    let ctx = FetcherContext {
        config: FetcherConfig::from_broker(&cfg),
        broker_epoch: AtomicI64::new(7),
        io: rm.io_pool().clone(),
        clock: rm.clock().clone(),
        log_start_moved: AtomicBool::new(false),
        quotas: quotas.clone(),
    };
    let shared = FetcherShared {
        partitions: Mutex::new(
            (0..2)
                .map(|p| {
                    let partition = rm.partition("t", p).unwrap();
                    (
                        TopicPartition::new("t", p),
                        FollowedPartition {
                            partition,
                            topic_id,
                            leader: 2,
                            state: PartitionFetchState::new(0, 0, None),
                            lag: None,
                        },
                    )
                })
                .collect(),
        ),
        wake: Notify::new(),
    };
    let fetched = |shared: &FetcherShared| -> Vec<i32> {
        let now = ctx.clock.now_ms();
        let (request, _, _) = fetcher::build_fetch(&ctx, shared, now);
        request
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| p.partition))
            .collect()
    };
    // Under the rate: both partitions are fetched.
    assert_eq!(fetched(&shared), vec![0, 1]);

    // A response for both: partition 0's bytes are recorded (throttled), 1's are not.
    let records = batch(0, 0, 3);
    let response = FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
        .with_topic_id(topic_id)
        .with_partitions(
            (0..2)
                .map(|p| {
                    PartitionData::default()
                        .with_partition_index(p)
                        .with_high_watermark(10)
                        .with_log_start_offset(0)
                        .with_records(Some(bytes::Bytes::from(records.clone())))
                })
                .collect(),
        )]);
    let sent = BTreeMap::from([
        (TopicPartition::new("t", 0), (0i64, 0i32)),
        (TopicPartition::new("t", 1), (0i64, 0i32)),
    ]);
    fetcher::apply_fetch_response(&ctx, &shared, &sent, response);
    assert_eq!(quotas.follower.bytes_recorded(), records.len() as u64);
    assert!(quotas.follower.is_quota_exceeded());
    assert_eq!(
        shared.partitions.lock()[&TopicPartition::new("t", 0)].lag,
        Some(7),
        "the leader's HW 10 minus the next offset 3"
    );
    // Above the rate: the throttled, lagging partition 0 is left out, 1 is not throttled.
    let now = ctx.clock.now_ms();
    let (_, _, next_due) = fetcher::build_fetch(&ctx, &shared, now);
    assert!(next_due.is_some_and(|d| d > now && d <= now + ctx.config.backoff_ms));
    assert_eq!(fetched(&shared), vec![1]);
    // In sync (it reached the leader's HW): never throttled.
    shared
        .partitions
        .lock()
        .get_mut(&TopicPartition::new("t", 0))
        .unwrap()
        .lag = Some(0);
    assert_eq!(fetched(&shared), vec![0, 1]);
}

/// Marks the only log dir of `rm` full, as an append failing with ENOSPC does.
fn fill_dir(rm: &ReplicaManager) {
    rm.logs().dir_health()[0].record_write_error(&gregor_log::LogError::Io {
        context: "appending to the test's segment".into(),
        source: std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error()),
    });
}

/// A follower never fetches into an offline log dir (Kafka's `handleLogDirFailure` removes the
/// fetchers, `makeFollowers`/`applyDelta` skip offline logs): a dir going offline removes its
/// partitions from their fetchers, a new image (a leader epoch change) does not add them
/// back, and once the full dir has room again they are fetched again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_in_an_offline_dir_are_not_fetched() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let (logs, _) = LogManager::open(&[dir.path().to_path_buf()], Default::default()).unwrap();
    let rm = ReplicaManager::new(LOCAL, cfg.clone(), logs);
    let fetchers = Arc::new(ReplicaFetcherManager::new(
        FetcherConfig::from_broker(&cfg),
        7,
        rm.io_pool().clone(),
        rm.clock().clone(),
        rm.replication_quotas().clone(),
    ));
    rm.set_fetchers(fetchers.clone());
    let topic_id = Uuid::new_v4();
    let mut image = image_with_topic(topic_id, 3, 2);
    rm.apply_image(&image).unwrap();
    let tp = |p| TopicPartition::new("t", p);
    let followed = || {
        (0..3)
            .filter(|p| fetchers.fetcher_of(&tp(*p)).is_some())
            .count()
    };
    assert_eq!(followed(), 3);

    fill_dir(&rm);
    rm.on_log_dirs_changed(&image);
    assert_eq!(
        followed(),
        0,
        "no fetcher for a partition in an offline dir"
    );
    assert_eq!(fetchers.num_fetchers(), 0, "idle fetchers stop");
    // A new leader epoch, and a partition that moves to another leader: still not fetched.
    set_partition(&mut image, topic_id, 0, 2, 1);
    set_partition(&mut image, topic_id, 1, 3, 1);
    rm.apply_image(&image).unwrap();
    assert_eq!(followed(), 0);
    assert!(rm
        .partition("t", 1)
        .is_some_and(|p| p.state().role == Role::Follower));

    // The dir has room again: every follower is fetched, from its current leader and epoch.
    assert!(rm.logs().check_dir_health(), "the full dir is back online");
    rm.on_log_dirs_changed(&image);
    assert_eq!(followed(), 3);
    assert_eq!(fetchers.fetcher_of(&tp(1)).map(|k| k.0), Some(3));
    fetchers.shutdown().await;
}

/// A fetcher drops a partition whose dir went offline when it applies a response for it (the
/// next fetch forgets it), without waiting for the broker's dir check; the manager then adds
/// it again once the dir is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetcher_drops_a_partition_whose_dir_went_offline() {
    use gregor_protocol::kafka_protocol::messages::fetch_response::{
        FetchableTopicResponse, PartitionData,
    };
    use gregor_protocol::kafka_protocol::messages::FetchResponse;

    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    let (logs, _) = LogManager::open(&[dir.path().to_path_buf()], Default::default()).unwrap();
    let rm = ReplicaManager::new(LOCAL, cfg.clone(), logs);
    let fetchers = Arc::new(ReplicaFetcherManager::new(
        FetcherConfig::from_broker(&cfg),
        7,
        rm.io_pool().clone(),
        rm.clock().clone(),
        rm.replication_quotas().clone(),
    ));
    rm.set_fetchers(fetchers.clone());
    let topic_id = Uuid::new_v4();
    let image = image_with_topic(topic_id, 1, 2);
    rm.apply_image(&image).unwrap();
    let tp = TopicPartition::new("t", 0);
    let key = fetchers.fetcher_of(&tp).expect("followed");
    let shared = fetchers.fetchers.lock()[&key].shared.clone();
    assert!(shared.partitions.lock().contains_key(&tp));

    fill_dir(&rm);
    let response = FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
        .with_topic_id(topic_id)
        .with_partitions(vec![PartitionData::default()
            .with_partition_index(0)
            .with_high_watermark(3)
            .with_log_start_offset(0)
            .with_records(Some(bytes::Bytes::from(batch(0, 0, 3))))])]);
    let sent = BTreeMap::from([(tp.clone(), (0i64, 0i32))]);
    fetcher::apply_fetch_response(&fetchers.ctx, &shared, &sent, response);
    assert!(
        !shared.partitions.lock().contains_key(&tp),
        "the fetcher dropped it"
    );
    let (request, _, _) = fetcher::build_fetch(&fetchers.ctx, &shared, rm.clock().now_ms());
    assert!(request.topics.is_empty(), "nothing left to fetch");
    assert_eq!(rm.partition("t", 0).unwrap().log.log_end_offset(), 0);

    assert!(rm.logs().check_dir_health());
    rm.on_log_dirs_changed(&image);
    let key = fetchers.fetcher_of(&tp).expect("followed again");
    let shared = fetchers.fetchers.lock()[&key].shared.clone();
    assert!(shared.partitions.lock().contains_key(&tp));
    fetchers.shutdown().await;
}
