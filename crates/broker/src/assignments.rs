//! The AssignmentsManager (Kafka's `AssignmentsManager`, KIP-858): tells the active controller
//! which log directory holds each replica of this broker, so that a directory going offline
//! moves leadership and ISR membership off exactly the replicas in it.
//!
//! A broker with several `log.dirs` is placed replicas with the UNASSIGNED directory; once a
//! metadata change has created or loaded a partition's log here in a directory other than
//! the one its registration names ([`AssignmentsManager::on_metadata`], Kafka's
//! `ReplicaManager.maybeUpdateTopicAssignment`), an assignment is queued, and a task sends
//! them to the active controller in AssignReplicasToDirs (73) requests:
//!
//! - One request in flight, at most [`MAX_ASSIGNMENTS_PER_REQUEST`] (2250) partitions in it;
//!   a partition has one queued assignment, a newer one replaces the older. The queue holds at
//!   most one entry per partition hosted here (no client can grow it).
//! - A send waits [`Backoff::initial`] (100 ms) after the queue stops being empty, so that
//!   the assignments of one metadata change go in one request, and at once when more than a
//!   request's worth is queued. After a failed send or a top-level error (NOT_CONTROLLER,
//!   STALE_BROKER_EPOCH, a timeout) the whole batch is queued again and the next send waits
//!   `initial * 2^failures`, at most [`Backoff::max`] (10 s); Kafka adds 2% jitter, this
//!   does not.
//! - A partition answered with an error is queued again (an assignment of it queued meanwhile
//!   wins); a response that accepted none counts as a failure for the backoff (Kafka starts
//!   over at 100 ms, so a lasting refusal is retried ten times a second); before each send, assignments that no longer apply are dropped: the topic or
//!   partition is gone, this broker is no longer a replica, or the registration already names
//!   that directory.
//!
//! The broker epoch sent is the one this node's metadata image shows for it (Kafka's
//! `image.cluster().brokerEpoch(nodeId)`).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gregor_metadata::MetadataImage;
use gregor_protocol::kafka_protocol::messages::assign_replicas_to_dirs_request::{
    DirectoryData, PartitionData, TopicData,
};
use gregor_protocol::kafka_protocol::messages::{
    AssignReplicasToDirsRequest, AssignReplicasToDirsResponse, BrokerId,
};
use parking_lot::Mutex;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::error_codes as ec;
use crate::replica_manager::ReplicaManager;

/// The most partitions one AssignReplicasToDirs request carries (Kafka's
/// `AssignReplicasToDirsRequest.MAX_ASSIGNMENTS_PER_REQUEST`).
pub const MAX_ASSIGNMENTS_PER_REQUEST: usize = 2250;

/// How long a partition's assignment keeps failing before each failure is logged (Kafka's
/// `MIN_NOISY_FAILURE_INTERVAL_NS`, 2 minutes); before that only at debug level.
const MIN_NOISY_FAILURE_INTERVAL: Duration = Duration::from_secs(120);

use crate::observability::QUEUED_REPLICA_TO_DIR_ASSIGNMENTS;

/// The delays between sends (Kafka's `AssignmentsManager.STANDARD_BACKOFF`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait before a send that follows no failure (batching), and the base of the
    /// exponential backoff after failures: 100 ms.
    pub initial: Duration,
    /// The longest wait after failures: 10 s.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
        }
    }
}

impl Backoff {
    /// The wait before the next send after `failures` failed sends in a row (Kafka's
    /// `AssignmentsManagerDeadlineFunction`): `initial * 2^failures` up to `max` after a
    /// failure; 0 when more than a request's worth is queued; `initial` otherwise.
    pub fn delay(&self, failures: u32, queued: usize) -> Duration {
        if failures > 0 {
            let factor = 2u32.saturating_pow(failures.min(16));
            self.initial.saturating_mul(factor).min(self.max)
        } else if queued > MAX_ASSIGNMENTS_PER_REQUEST {
            Duration::ZERO
        } else {
            self.initial
        }
    }
}

/// A boxed AssignReplicasToDirs call; `Err` is a failed send or a top-level error, retried.
pub type AssignFuture =
    Pin<Box<dyn Future<Output = Result<AssignReplicasToDirsResponse, String>> + Send>>;

/// How the manager reaches the active controller (in the broker:
/// [`crate::controller_channel::ControllerClient::assign_replicas_to_dirs`]).
pub trait AssignmentsClient: Send + Sync + 'static {
    /// Sends one AssignReplicasToDirs request to the active controller.
    fn assign_replicas_to_dirs(&self, request: AssignReplicasToDirsRequest) -> AssignFuture;
}

/// The broker's [`AssignmentsClient`]: the local controller when it is the active one, else
/// the `directory-assignments` controller channel.
pub struct ControllerAssignments(pub Arc<crate::controller_channel::ControllerClient>);

impl AssignmentsClient for ControllerAssignments {
    fn assign_replicas_to_dirs(&self, request: AssignReplicasToDirsRequest) -> AssignFuture {
        let client = self.0.clone();
        Box::pin(async move {
            client
                .assign_replicas_to_dirs(request)
                .await
                .map_err(|e| format!("{} ({e})", e.error_code().name()))
        })
    }
}

/// One replica's directory on its way to the controller (Kafka's `Assignment`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Assignment {
    dir: Uuid,
    /// When it was first queued (failures are logged loudly only after a while).
    submitted: Instant,
}

/// Partitions by (topic id, index).
type Queue = BTreeMap<(Uuid, i32), Assignment>;

/// The queue of assignments and what the last metadata change showed; the task [`start`]
/// spawns sends them.
pub struct AssignmentsManager {
    node_id: i32,
    /// The directory id (`directory.id` of its `meta.properties`) of each log directory.
    dir_ids: Vec<(PathBuf, Uuid)>,
    ready: Mutex<Queue>,
    /// Assignments in the request in flight (for the queue-length gauge only).
    in_flight: std::sync::atomic::AtomicUsize,
    wake: Notify,
    /// The image [`AssignmentsManager::on_metadata`] looked at last: topics it shares with
    /// the next one (the same allocation) did not change.
    last_image: Mutex<Option<Arc<MetadataImage>>>,
}

impl AssignmentsManager {
    /// The manager of broker `node_id`, whose log directories have the ids `dir_ids` (by
    /// configured path).
    pub fn new(node_id: i32, dir_ids: Vec<(PathBuf, Uuid)>) -> Self {
        Self {
            node_id,
            dir_ids,
            ready: Mutex::new(BTreeMap::new()),
            in_flight: std::sync::atomic::AtomicUsize::new(0),
            wake: Notify::new(),
            last_image: Mutex::new(None),
        }
    }

    /// Queues the assignment of partition `partition` of `topic_id` to directory `dir`
    /// (Kafka's `onAssignment`), replacing one queued for the same partition.
    pub fn on_assignment(&self, topic_id: Uuid, partition: i32, dir: Uuid) {
        Self::enqueue(&mut self.ready.lock(), topic_id, partition, dir);
        self.update_gauge();
        self.wake.notify_one();
    }

    /// Puts one assignment in `ready` (the queue's lock held), replacing another directory.
    fn enqueue(ready: &mut Queue, topic_id: Uuid, partition: i32, dir: Uuid) {
        let now = Instant::now();
        let entry = ready.entry((topic_id, partition)).or_insert(Assignment {
            dir,
            submitted: now,
        });
        if entry.dir != dir {
            *entry = Assignment {
                dir,
                submitted: now,
            };
        }
    }

    /// Assignments waiting or in flight.
    pub fn pending(&self) -> usize {
        self.ready.lock().len() + self.in_flight.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn update_gauge(&self) {
        metrics::gauge!(QUEUED_REPLICA_TO_DIR_ASSIGNMENTS).set(self.pending() as f64);
    }

    /// The id of the log directory holding a partition's log directory `log_dir`.
    pub fn dir_id_of(&self, log_dir: &Path) -> Option<Uuid> {
        let parent = log_dir.parent()?;
        self.dir_ids
            .iter()
            .find(|(p, _)| p == parent)
            .map(|(_, id)| *id)
    }

    /// After `replicas` applied `image` (the metadata publisher calls it): every partition
    /// hosted here whose registration changed since the last image (all of them the first
    /// time, and when `metadata.version` changed) and names another directory for this
    /// broker than the one holding its log gets an assignment queued (Kafka's
    /// `maybeUpdateTopicAssignment` over the delta's local changes). Nothing before
    /// `metadata.version` 3.7-IV2.
    pub fn on_metadata(&self, image: &Arc<MetadataImage>, replicas: &ReplicaManager) {
        let previous = self.last_image.lock().replace(image.clone());
        let previous = previous.filter(|p| p.metadata_version() == image.metadata_version());
        self.scan(image, previous.as_deref(), replicas);
    }

    /// After logs were created outside a metadata change (the retry of a failed creation,
    /// [`ReplicaManager::retry_log_creation`]): every partition hosted here is looked at
    /// against `image` (the latest), as [`AssignmentsManager::on_metadata`] does for the
    /// partitions a change touched.
    pub fn on_logs_created(&self, image: &MetadataImage, replicas: &ReplicaManager) {
        self.scan(image, None, replicas);
    }

    /// Queues the assignments of the partitions of `image`'s topics that are not the same
    /// allocation in `previous` (all without one).
    fn scan(
        &self,
        image: &MetadataImage,
        previous: Option<&MetadataImage>,
        replicas: &ReplicaManager,
    ) {
        if !image.is_directory_assignment_supported() {
            return;
        }
        let mut queued = 0usize;
        let mut ready = self.ready.lock();
        for (id, t) in &image.topics {
            if previous.is_some_and(|p| p.topics.get(id).is_some_and(|old| Arc::ptr_eq(old, t))) {
                continue;
            }
            for (index, p) in &t.partitions {
                let Some(i) = p.replicas.iter().position(|r| *r == self.node_id) else {
                    continue;
                };
                let Some(registered) = p.directories.get(i).copied() else {
                    continue;
                };
                let Some(hosted) = replicas.partition(&t.name, *index) else {
                    continue;
                };
                if hosted.topic_id != t.topic_id {
                    continue;
                }
                let Some(actual) = self.dir_id_of(hosted.log.dir()) else {
                    continue;
                };
                if actual != registered {
                    tracing::debug!(topic = %t.name, partition = index, dir = %actual,
                        %registered, "queueing a replica's directory assignment");
                    Self::enqueue(&mut ready, t.topic_id, *index, actual);
                    queued += 1;
                }
            }
        }
        drop(ready);
        if queued > 0 {
            self.update_gauge();
            self.wake.notify_one();
            tracing::info!(
                partitions = queued,
                "queued directory assignments (AssignReplicasToDirs, KIP-858)"
            );
        }
    }

    /// Takes up to [`MAX_ASSIGNMENTS_PER_REQUEST`] assignments that still apply in `image`
    /// (Kafka's `Assignment.valid`, and not already what the registration says); drops the
    /// others. Returns the batch and how many were dropped.
    fn take_batch(&self, image: &MetadataImage) -> (Queue, usize) {
        let mut ready = self.ready.lock();
        let mut batch = Queue::new();
        let mut dropped = 0;
        while batch.len() < MAX_ASSIGNMENTS_PER_REQUEST {
            let Some(((topic_id, index), a)) = ready.pop_first() else {
                break;
            };
            let registered = image
                .topic_by_id(&topic_id)
                .and_then(|t| t.partitions.get(&index))
                .and_then(|p| {
                    let i = p.replicas.iter().position(|r| *r == self.node_id)?;
                    Some(p.directories.get(i).copied())
                });
            match registered {
                Some(dir) if dir != Some(a.dir) => {
                    batch.insert((topic_id, index), a);
                }
                _ => dropped += 1,
            }
        }
        (batch, dropped)
    }

    /// Queues `a` for `key` again unless a newer assignment of the partition is queued.
    fn requeue(&self, key: (Uuid, i32), a: Assignment) {
        self.ready.lock().entry(key).or_insert(a);
    }
}

/// Kafka's `buildRequestData`: assignments grouped by directory, then by topic id.
pub fn build_request(
    node_id: i32,
    broker_epoch: i64,
    assignments: impl IntoIterator<Item = (Uuid, i32, Uuid)>,
) -> AssignReplicasToDirsRequest {
    let mut by_dir: BTreeMap<Uuid, BTreeMap<Uuid, Vec<i32>>> = BTreeMap::new();
    for (topic_id, partition, dir) in assignments {
        by_dir
            .entry(dir)
            .or_default()
            .entry(topic_id)
            .or_default()
            .push(partition);
    }
    AssignReplicasToDirsRequest::default()
        .with_broker_id(BrokerId(node_id))
        .with_broker_epoch(broker_epoch)
        .with_directories(
            by_dir
                .into_iter()
                .map(|(dir, topics)| {
                    DirectoryData::default().with_id(dir).with_topics(
                        topics
                            .into_iter()
                            .map(|(topic_id, partitions)| {
                                TopicData::default()
                                    .with_topic_id(topic_id)
                                    .with_partitions(
                                        partitions
                                            .into_iter()
                                            .map(|p| {
                                                PartitionData::default().with_partition_index(p)
                                            })
                                            .collect(),
                                    )
                            })
                            .collect(),
                    )
                })
                .collect(),
        )
}

/// Starts the task that sends `manager`'s assignments through `client`, with the broker
/// epoch and the validity of each assignment from `image` (this node's latest metadata).
/// The task ends when `shutdown` turns true.
pub fn start(
    manager: Arc<AssignmentsManager>,
    image: Arc<dyn Fn() -> Arc<MetadataImage> + Send + Sync>,
    client: Arc<dyn AssignmentsClient>,
    backoff: Backoff,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut failures = 0u32;
        loop {
            if manager.ready.lock().is_empty() {
                tokio::select! {
                    () = manager.wake.notified() => {}
                    _ = shutdown.changed() => return,
                }
                continue;
            }
            let delay = backoff.delay(failures, manager.ready.lock().len());
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => return,
            }
            let image = image();
            let (batch, dropped) = manager.take_batch(&image);
            if dropped > 0 {
                tracing::debug!(
                    dropped,
                    "dropped directory assignments that no longer apply"
                );
            }
            if batch.is_empty() {
                manager.update_gauge();
                continue;
            }
            let Some(epoch) = image.brokers.get(&manager.node_id).map(|b| b.epoch) else {
                // Not registered in this node's metadata yet: wait for it.
                failures = failures.saturating_add(1);
                for (key, a) in batch {
                    manager.requeue(key, a);
                }
                continue;
            };
            let request = build_request(
                manager.node_id,
                epoch,
                batch.iter().map(|((t, p), a)| (*t, *p, a.dir)),
            );
            manager
                .in_flight
                .store(batch.len(), std::sync::atomic::Ordering::Relaxed);
            let result = tokio::select! {
                r = client.assign_replicas_to_dirs(request) => r,
                _ = shutdown.changed() => return,
            };
            failures = handle_response(&manager, result, batch, failures);
            manager
                .in_flight
                .store(0, std::sync::atomic::Ordering::Relaxed);
            manager.update_gauge();
        }
    })
}

/// Kafka's `handleResponse`: a failed send or a top-level error queues the whole batch again
/// and counts a failure; otherwise failures start over and each partition answered with an
/// error (or not answered) is queued again. Returns the failures in a row now.
fn handle_response(
    manager: &AssignmentsManager,
    result: Result<AssignReplicasToDirsResponse, String>,
    mut batch: Queue,
    failures: u32,
) -> u32 {
    let response = match result {
        Ok(r) if r.error_code == ec::NONE => r,
        Ok(r) => {
            tracing::warn!(
                assignments = batch.len(),
                error_code = r.error_code,
                "AssignReplicasToDirs: top-level error, retrying"
            );
            for (key, a) in batch {
                manager.requeue(key, a);
            }
            return failures.saturating_add(1);
        }
        Err(e) => {
            tracing::warn!(assignments = batch.len(), error = %e,
                "AssignReplicasToDirs: send failed, retrying");
            for (key, a) in batch {
                manager.requeue(key, a);
            }
            return failures.saturating_add(1);
        }
    };
    let mut answered: HashMap<(Uuid, i32), i16> = HashMap::new();
    for d in &response.directories {
        for t in &d.topics {
            for p in &t.partitions {
                answered.insert((t.topic_id, p.partition_index), p.error_code);
            }
        }
    }
    let mut assigned = 0usize;
    for (key, code) in answered {
        let Some(a) = batch.remove(&key) else {
            tracing::warn!(topic_id = %key.0, partition = key.1,
                "AssignReplicasToDirs: the response names a partition the request did not");
            continue;
        };
        if code == ec::NONE {
            assigned += 1;
            continue;
        }
        if a.submitted.elapsed() >= MIN_NOISY_FAILURE_INTERVAL {
            tracing::warn!(topic_id = %key.0, partition = key.1, error_code = code,
                "AssignReplicasToDirs: assignment refused, retrying");
        } else {
            tracing::debug!(topic_id = %key.0, partition = key.1, error_code = code,
                "AssignReplicasToDirs: assignment refused, retrying");
        }
        manager.requeue(key, a);
    }
    for (key, a) in batch {
        tracing::warn!(topic_id = %key.0, partition = key.1,
            "AssignReplicasToDirs: no answer for a partition, retrying");
        manager.requeue(key, a);
    }
    if assigned > 0 {
        tracing::info!(
            partitions = assigned,
            "the controller recorded the directories of replicas"
        );
        return 0;
    }
    // Every partition refused: Kafka starts over at the short delay, which retries a lasting
    // refusal ten times a second; back off as after a failed send until one is accepted.
    failures.saturating_add(1)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use gregor_metadata::record::DIRECTORY_UNASSIGNED;
    use gregor_metadata::{BrokerRegistration, PartitionRegistration, TopicImage};
    use gregor_protocol::kafka_protocol::messages::assign_replicas_to_dirs_response as resp;
    use gregor_protocol::metadata_records::RegisterBrokerRecord;

    use super::*;

    const NODE: i32 = 1;

    /// Answers each request with the next scripted answer (or echoes success when none is
    /// left) and records the requests.
    struct Scripted {
        answers: Mutex<Vec<Result<AssignReplicasToDirsResponse, String>>>,
        requests: Arc<Mutex<Vec<AssignReplicasToDirsRequest>>>,
        calls: AtomicUsize,
    }

    impl Scripted {
        fn new(answers: Vec<Result<AssignReplicasToDirsResponse, String>>) -> Arc<Self> {
            Arc::new(Self {
                answers: Mutex::new(answers),
                requests: Arc::default(),
                calls: AtomicUsize::new(0),
            })
        }
    }

    /// Success for every partition of `r`.
    fn all_ok(r: &AssignReplicasToDirsRequest) -> AssignReplicasToDirsResponse {
        answer(r, |_, _| ec::NONE)
    }

    /// The answer to `r` with `code(topic, partition)` per partition.
    fn answer(
        r: &AssignReplicasToDirsRequest,
        code: impl Fn(Uuid, i32) -> i16,
    ) -> AssignReplicasToDirsResponse {
        AssignReplicasToDirsResponse::default().with_directories(
            r.directories
                .iter()
                .map(|d| {
                    resp::DirectoryData::default().with_id(d.id).with_topics(
                        d.topics
                            .iter()
                            .map(|t| {
                                resp::TopicData::default()
                                    .with_topic_id(t.topic_id)
                                    .with_partitions(
                                        t.partitions
                                            .iter()
                                            .map(|p| {
                                                resp::PartitionData::default()
                                                    .with_partition_index(p.partition_index)
                                                    .with_error_code(code(
                                                        t.topic_id,
                                                        p.partition_index,
                                                    ))
                                            })
                                            .collect(),
                                    )
                            })
                            .collect(),
                    )
                })
                .collect(),
        )
    }

    impl AssignmentsClient for Scripted {
        fn assign_replicas_to_dirs(&self, request: AssignReplicasToDirsRequest) -> AssignFuture {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.requests.lock().push(request.clone());
            let mut answers = self.answers.lock();
            let next = if answers.is_empty() {
                Ok(all_ok(&request))
            } else {
                answers.remove(0)
            };
            Box::pin(async move { next })
        }
    }

    /// An image where broker `NODE` (epoch 42) is a replica of partitions 0..n of topic
    /// `topic`, each naming UNASSIGNED for it.
    fn image(topic: Uuid, n: i32) -> MetadataImage {
        let mut image = MetadataImage::default();
        image
            .features
            .insert(gregor_metadata::image::METADATA_VERSION_FEATURE.into(), 33);
        image.brokers.insert(
            NODE,
            BrokerRegistration::from_record(&RegisterBrokerRecord {
                broker_id: NODE,
                broker_epoch: 42,
                ..RegisterBrokerRecord::default()
            }),
        );
        let partitions = (0..n)
            .map(|i| {
                (
                    i,
                    PartitionRegistration {
                        replicas: vec![NODE, 2],
                        directories: vec![DIRECTORY_UNASSIGNED; 2],
                        isr: vec![NODE, 2],
                        removing_replicas: vec![],
                        adding_replicas: vec![],
                        leader: NODE,
                        leader_recovery_state: 0,
                        leader_epoch: 0,
                        partition_epoch: 0,
                        elr: vec![],
                        last_known_elr: vec![],
                    },
                )
            })
            .collect();
        image.topics.insert(
            topic,
            Arc::new(TopicImage {
                name: "t".into(),
                topic_id: topic,
                partitions,
            }),
        );
        image.topic_ids.insert("t".into(), topic);
        image
    }

    fn fast() -> Backoff {
        Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(40),
        }
    }

    struct Running {
        manager: Arc<AssignmentsManager>,
        image: Arc<Mutex<Arc<MetadataImage>>>,
        stop: watch::Sender<bool>,
        task: JoinHandle<()>,
    }

    fn run(image: MetadataImage, client: Arc<Scripted>) -> Running {
        run_with(image, client, fast())
    }

    fn run_with(image: MetadataImage, client: Arc<Scripted>, backoff: Backoff) -> Running {
        let manager = Arc::new(AssignmentsManager::new(NODE, Vec::new()));
        let image = Arc::new(Mutex::new(Arc::new(image)));
        let (stop, rx) = watch::channel(false);
        let source = image.clone();
        let task = start(
            manager.clone(),
            Arc::new(move || source.lock().clone()),
            client,
            backoff,
            rx,
        );
        Running {
            manager,
            image,
            stop,
            task,
        }
    }

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// (directory, topic, partition) of every assignment in `r`, sorted.
    fn contents(r: &AssignReplicasToDirsRequest) -> Vec<(Uuid, Uuid, i32)> {
        let mut out: Vec<_> = r
            .directories
            .iter()
            .flat_map(|d| {
                d.topics.iter().flat_map(move |t| {
                    t.partitions
                        .iter()
                        .map(move |p| (d.id, t.topic_id, p.partition_index))
                })
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn the_delay_batches_then_backs_off_exponentially_up_to_the_maximum() {
        let b = Backoff::default();
        assert_eq!(b.delay(0, 1), Duration::from_millis(100));
        assert_eq!(b.delay(0, MAX_ASSIGNMENTS_PER_REQUEST + 1), Duration::ZERO);
        assert_eq!(b.delay(1, 1), Duration::from_millis(200));
        assert_eq!(b.delay(3, 1), Duration::from_millis(800));
        assert_eq!(b.delay(7, 1), Duration::from_secs(10));
        assert_eq!(b.delay(u32::MAX, 1), Duration::from_secs(10));
    }

    /// Assignments queued together go in one request, grouped by directory and topic, with
    /// the broker epoch of the image; a newer assignment of a partition replaces the older.
    #[tokio::test]
    async fn queued_assignments_go_in_one_request_with_the_images_broker_epoch() {
        let topic = Uuid::new_v4();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let client = Scripted::new(vec![]);
        let r = run(image(topic, 3), client.clone());
        r.manager.on_assignment(topic, 0, b);
        r.manager.on_assignment(topic, 0, a);
        r.manager.on_assignment(topic, 1, b);
        r.manager.on_assignment(topic, 2, a);
        until("the request", || !client.requests.lock().is_empty()).await;
        until("the queue to empty", || r.manager.pending() == 0).await;
        let requests = client.requests.lock().clone();
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert_eq!(
            (requests[0].broker_id.0, requests[0].broker_epoch),
            (NODE, 42)
        );
        let mut want = vec![(a, topic, 0), (a, topic, 2), (b, topic, 1)];
        want.sort();
        assert_eq!(contents(&requests[0]), want);
        assert_eq!(requests[0].directories.len(), 2, "one entry per directory");
        r.stop.send(true).unwrap();
        r.task.await.unwrap();
    }

    /// A failed send and a top-level error (STALE_BROKER_EPOCH) queue the batch again; a
    /// partition error queues that partition only; a newer assignment queued while a request
    /// is in flight is not overwritten by the retry.
    #[tokio::test]
    async fn failures_are_retried_until_the_controller_accepts() {
        let topic = Uuid::new_v4();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let first = build_request(NODE, 42, [(topic, 0, a), (topic, 1, a)]);
        let client = Scripted::new(vec![
            Err("no active controller known".into()),
            Ok(AssignReplicasToDirsResponse::default()
                .with_error_code(gregor_protocol::error::ErrorCode::StaleBrokerEpoch.code())),
            Ok(answer(&first, |_, p| {
                if p == 1 {
                    ec::NOT_LEADER_OR_FOLLOWER
                } else {
                    ec::NONE
                }
            })),
        ]);
        let r = run(image(topic, 2), client.clone());
        r.manager.on_assignment(topic, 0, a);
        r.manager.on_assignment(topic, 1, a);
        until("four requests", || client.calls.load(Ordering::SeqCst) >= 4).await;
        until("the queue to empty", || r.manager.pending() == 0).await;
        let requests = client.requests.lock().clone();
        assert_eq!(requests.len(), 4, "{requests:?}");
        for req in &requests[..3] {
            assert_eq!(contents(req), vec![(a, topic, 0), (a, topic, 1)]);
        }
        assert_eq!(
            contents(&requests[3]),
            vec![(a, topic, 1)],
            "the refused one"
        );

        // Replaced while waiting for its retry: the newer directory is sent.
        let client2 = Scripted::new(vec![Err("timeout".into())]);
        let r2 = run(image(topic, 1), client2.clone());
        r2.manager.on_assignment(topic, 0, a);
        until("the first request", || {
            client2.calls.load(Ordering::SeqCst) >= 1
        })
        .await;
        r2.manager.on_assignment(topic, 0, b);
        until("the newer directory sent", || {
            client2
                .requests
                .lock()
                .iter()
                .any(|r| contents(r) == vec![(b, topic, 0)])
        })
        .await;
        until("the queue to empty", || r2.manager.pending() == 0).await;
        let requests = client2.requests.lock().clone();
        let first_b = requests
            .iter()
            .position(|r| contents(r) == vec![(b, topic, 0)])
            .unwrap();
        assert_eq!(
            first_b,
            requests.len() - 1,
            "the failed assignment is not retried over the newer one: {requests:?}"
        );
        for r in [r, r2] {
            r.stop.send(true).unwrap();
            r.task.await.unwrap();
        }
    }

    /// A response that refuses every partition backs off as a failed send does; one that
    /// accepts any starts over.
    #[test]
    fn a_response_refusing_every_partition_backs_off() {
        let topic = Uuid::new_v4();
        let a = Uuid::new_v4();
        let manager = AssignmentsManager::new(NODE, Vec::new());
        let request = build_request(NODE, 42, [(topic, 0, a), (topic, 1, a)]);
        let batch = |m: &AssignmentsManager| {
            m.on_assignment(topic, 0, a);
            m.on_assignment(topic, 1, a);
            m.take_batch(&image(topic, 2)).0
        };
        let refused = answer(&request, |_, _| ec::NOT_LEADER_OR_FOLLOWER);
        assert_eq!(
            handle_response(&manager, Ok(refused.clone()), batch(&manager), 3),
            4
        );
        let one_accepted = answer(&request, |_, p| {
            if p == 0 {
                ec::NONE
            } else {
                ec::NOT_LEADER_OR_FOLLOWER
            }
        });
        assert_eq!(
            handle_response(&manager, Ok(one_accepted), batch(&manager), 4),
            0
        );
    }

    /// Assignments that no longer apply are dropped before a send: the topic was deleted,
    /// this broker left the replicas, or the registration already names the directory.
    #[tokio::test]
    async fn assignments_that_no_longer_apply_are_dropped() {
        let topic = Uuid::new_v4();
        let dir = Uuid::new_v4();
        let mut img = image(topic, 3);
        let t = Arc::make_mut(img.topics.get_mut(&topic).unwrap());
        t.partitions.get_mut(&1).unwrap().replicas = vec![2, 3];
        t.partitions.get_mut(&2).unwrap().directories = vec![dir, DIRECTORY_UNASSIGNED];
        let client = Scripted::new(vec![]);
        let r = run(img, client.clone());
        for p in 0..3 {
            r.manager.on_assignment(topic, p, dir);
        }
        r.manager.on_assignment(Uuid::new_v4(), 0, dir);
        r.manager.on_assignment(topic, 9, dir);
        until("the request", || !client.requests.lock().is_empty()).await;
        until("the queue to empty", || r.manager.pending() == 0).await;
        assert_eq!(
            contents(&client.requests.lock()[0]),
            vec![(dir, topic, 0)],
            "only partition 0 still needs its assignment"
        );
        // Deleted while its answer was an error: dropped at the retry, nothing more sent.
        let client2 = Scripted::new(vec![Ok(AssignReplicasToDirsResponse::default()
            .with_directories(vec![resp::DirectoryData::default()
                .with_id(dir)
                .with_topics(vec![resp::TopicData::default()
                    .with_topic_id(topic)
                    .with_partitions(vec![resp::PartitionData::default()
                        .with_partition_index(0)
                        .with_error_code(ec::UNKNOWN_TOPIC_ID)])])]))]);
        // Retries wait long enough for the image to change first.
        let slow = Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(1),
        };
        let r2 = run_with(image(topic, 1), client2.clone(), slow);
        r2.manager.on_assignment(topic, 0, dir);
        until("the request", || client2.calls.load(Ordering::SeqCst) >= 1).await;
        let brokers = r2.image.lock().brokers.clone();
        *r2.image.lock() = Arc::new(MetadataImage {
            brokers,
            ..MetadataImage::default()
        });
        until("the queue to empty", || r2.manager.pending() == 0).await;
        assert_eq!(
            client2.calls.load(Ordering::SeqCst),
            1,
            "dropped, not sent again"
        );
        for r in [r, r2] {
            r.stop.send(true).unwrap();
            r.task.await.unwrap();
        }
    }

    /// A metadata change that creates logs (or the first image, over loaded logs) queues the
    /// directory of each one whose registration names another directory for this broker;
    /// topics the next image shares unchanged are not looked at again, a registration that
    /// names the log's directory queues nothing, and nothing is queued before
    /// metadata.version 3.7-IV2.
    #[test]
    fn a_metadata_change_queues_the_logs_whose_registration_names_another_dir() {
        use gregor_metadata::MetadataRecord;
        use gregor_protocol::metadata_records::{PartitionRecord, TopicRecord};

        let root = tempfile::tempdir().unwrap();
        let dirs = [root.path().join("a"), root.path().join("b")];
        let ids = [Uuid::new_v4(), Uuid::new_v4()];
        let props = [
            (
                "log.dirs".to_string(),
                format!("{},{}", dirs[0].display(), dirs[1].display()),
            ),
            ("node.id".to_string(), NODE.to_string()),
        ];
        let (config, _) =
            crate::config::BrokerConfig::from_properties(props.into_iter().collect()).unwrap();
        let (logs, _) = gregor_log::LogManager::open_with_clock(
            &dirs,
            gregor_log::LogConfig::default(),
            gregor_log::ManualClock::new(0),
        )
        .unwrap();
        let rm = ReplicaManager::new(NODE, config, logs);
        let manager = AssignmentsManager::new(
            NODE,
            dirs.iter().cloned().zip(ids.iter().copied()).collect(),
        );
        let topic = Uuid::new_v4();
        let mut image = MetadataImage::default();
        image
            .features
            .insert(gregor_metadata::image::METADATA_VERSION_FEATURE.into(), 33);
        image.apply(&MetadataRecord::Topic(TopicRecord {
            name: "t".into(),
            topic_id: topic,
            ..TopicRecord::default()
        }));
        let partition = |p: i32, dir: Uuid| {
            MetadataRecord::Partition(PartitionRecord {
                partition_id: p,
                topic_id: topic,
                replicas: vec![NODE],
                isr: vec![NODE],
                leader: NODE,
                directories: vec![dir],
                ..PartitionRecord::default()
            })
        };
        for p in 0..2 {
            image.apply(&partition(p, DIRECTORY_UNASSIGNED));
        }
        let first = Arc::new(image.clone());
        rm.apply_metadata(&first, false).unwrap();
        manager.on_metadata(&first, &rm);
        let actual = |p: i32| {
            manager
                .dir_id_of(rm.partition("t", p).unwrap().log.dir())
                .unwrap()
        };
        let queued = |m: &AssignmentsManager| -> Vec<(i32, Uuid)> {
            m.ready
                .lock()
                .iter()
                .map(|((_, p), a)| (*p, a.dir))
                .collect()
        };
        assert_eq!(queued(&manager), vec![(0, actual(0)), (1, actual(1))]);
        assert_ne!(actual(0), actual(1), "one log per directory");

        // The same topics again: not looked at.
        manager.ready.lock().clear();
        let mut same = (*first).clone();
        same.offset += 1;
        let same = Arc::new(same);
        rm.apply_metadata(&same, false).unwrap();
        manager.on_metadata(&same, &rm);
        assert!(queued(&manager).is_empty());

        // Partition 0 assigned where its log is; partition 1 still UNASSIGNED.
        image.apply(&partition(0, actual(0)));
        let next = Arc::new(image.clone());
        rm.apply_metadata(&next, false).unwrap();
        manager.on_metadata(&next, &rm);
        assert_eq!(queued(&manager), vec![(1, actual(1))]);

        // Before 3.7-IV2 nothing is queued, even on a fresh manager.
        let old = AssignmentsManager::new(
            NODE,
            dirs.iter().cloned().zip(ids.iter().copied()).collect(),
        );
        let mut before = (*next).clone();
        before
            .features
            .insert(gregor_metadata::image::METADATA_VERSION_FEATURE.into(), 16);
        old.on_metadata(&Arc::new(before), &rm);
        assert!(queued(&old).is_empty());
    }

    /// More than a request's worth goes in several requests of at most 2250 partitions.
    #[tokio::test]
    async fn a_request_carries_at_most_2250_assignments() {
        let topic = Uuid::new_v4();
        let dir = Uuid::new_v4();
        let n = MAX_ASSIGNMENTS_PER_REQUEST + 10;
        let client = Scripted::new(vec![]);
        let r = run(image(topic, n as i32), client.clone());
        for p in 0..n {
            r.manager.on_assignment(topic, p as i32, dir);
        }
        until("the queue to empty", || r.manager.pending() == 0).await;
        let sizes: Vec<usize> = client
            .requests
            .lock()
            .iter()
            .map(|r| contents(r).len())
            .collect();
        assert_eq!(sizes, vec![MAX_ASSIGNMENTS_PER_REQUEST, 10]);
        r.stop.send(true).unwrap();
        r.task.await.unwrap();
    }
}
