//! The coordinator runtime (Kafka's `CoordinatorRuntime`, KIP-848's "new group coordinator"
//! design): what every coordinator whose state lives in an internal topic needs.
//!
//! - **Partitions.** A coordinator serves the partitions of its topic that this broker leads.
//!   [`CoordinatorRuntime::begin_load`] marks a partition as loading (requests get
//!   COORDINATOR_LOAD_IN_PROGRESS), [`CoordinatorRuntime::replay`] reads its records back from
//!   the log start offset to the log end offset, [`CoordinatorRuntime::complete_load`] makes it
//!   active, and [`CoordinatorRuntime::unload`] forgets it when this broker resigns
//!   (NOT_COORDINATOR from then on). The coordinator on top keeps the state itself.
//! - **Writes.** [`CoordinatorRuntime::append`] appends records as one batch through the
//!   [`PartitionWriter`] and returns a [`PendingWrite`]; the write is committed, and only then
//!   answered, once the partition's high watermark passes it
//!   ([`CoordinatorRuntime::committed`], [`CoordinatorRuntime::complete_when_committed`]).
//! - **Timers.** Session timeouts, rebalance delays and the like are deadlines in milliseconds
//!   on the injected [`Clock`]: [`CoordinatorRuntime::schedule`] queues one,
//!   [`CoordinatorRuntime::expired_timers`] hands back those due, and
//!   [`CoordinatorRuntime::run_timers`] drives them in production. Tests move a
//!   `ManualClock` and fire timers themselves; nothing sleeps.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gregor_log::clock::SharedClock;
use gregor_protocol::batch::{BatchBuilder, Batches};
use gregor_protocol::error::ErrorCode;
use parking_lot::Mutex;
use tokio::sync::{watch, Notify};
use tracing::warn;
use uuid::Uuid;

use crate::error::CoordinatorError;

/// One record to append: key and value (None is a tombstone).
pub type CoordinatorRecord = (Vec<u8>, Option<Vec<u8>>);

/// A future that completes when a partition's high watermark reaches an offset.
pub type HighWatermarkFuture = Pin<Box<dyn Future<Output = Result<(), ErrorCode>> + Send>>;

/// How a coordinator reads and writes the partitions of its internal topic. The broker
/// implements it over its replica manager; tests implement it in memory. Implementations
/// must not call back into the coordinator.
pub trait PartitionWriter: Send + Sync + 'static {
    /// True when this broker leads `topic`-`partition`.
    fn is_leader(&self, topic: &str, partition: i32) -> bool;

    /// Appends one record batch (v2, base offset 0) as the partition's leader, with
    /// acks=all's checks (`min.insync.replicas`). Returns the offset after the batch: the
    /// write is committed once the high watermark reaches it.
    ///
    /// # Errors
    /// The Kafka error and a message (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS,
    /// RECORD_LIST_TOO_LARGE, KAFKA_STORAGE_ERROR, ...).
    fn append(
        &self,
        topic: &str,
        partition: i32,
        batch: &mut [u8],
    ) -> Result<i64, (ErrorCode, String)>;

    /// The partition's high watermark, None when it is not hosted here.
    fn high_watermark(&self, topic: &str, partition: i32) -> Option<i64>;

    /// The partition's log start offset, None when it is not hosted here.
    fn log_start_offset(&self, topic: &str, partition: i32) -> Option<i64>;

    /// Whole batches from `offset`, below the high watermark, about `max_bytes` (at least one
    /// batch); empty at the high watermark.
    ///
    /// # Errors
    /// The Kafka error and a message (the log's read errors).
    fn read(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: usize,
    ) -> Result<Bytes, (ErrorCode, String)>;

    /// The partition's log end offset, None when it is not hosted here. Loading replays up to
    /// it (see [`PartitionWriter::read_for_load`]); the default is the high watermark.
    fn log_end_offset(&self, topic: &str, partition: i32) -> Option<i64> {
        self.high_watermark(topic, partition)
    }

    /// Whole batches from `offset` for loading a coordinator partition: as
    /// [`PartitionWriter::read`] but up to the log end offset, as Kafka's coordinator loaders
    /// read. A new leader's high watermark may lag what its log holds from the previous
    /// leader, which that leader may already have answered as committed; the new leader never
    /// truncates its own log. The default reads below the high watermark.
    ///
    /// # Errors
    /// As [`PartitionWriter::read`].
    fn read_for_load(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: usize,
    ) -> Result<Bytes, (ErrorCode, String)> {
        self.read(topic, partition, offset, max_bytes)
    }

    /// Completes when the high watermark of `topic`-`partition` reaches `offset`: Ok, or
    /// REQUEST_TIMED_OUT after `timeout_ms`, or NOT_LEADER_OR_FOLLOWER when this broker stops
    /// leading the partition first.
    fn wait_for_high_watermark(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        timeout_ms: i64,
    ) -> HighWatermarkFuture;
}

/// The topics a coordinator needs to know about (KIP-848 assignors read subscribed topics'
/// ids and partition counts). The broker implements it over its metadata image.
pub trait TopicMetadata: Send + Sync + 'static {
    /// Topic id and partition count of `name`, None when the topic does not exist.
    fn topic(&self, name: &str) -> Option<(Uuid, i32)>;

    /// The value of group config `name` (KIP-848 `GroupConfig`, e.g.
    /// `consumer.session.timeout.ms`) set for group `group_id` with AlterConfigs, None when the
    /// group has no such override (the coordinator's own setting applies).
    fn group_config(&self, group_id: &str, name: &str) -> Option<String> {
        let _ = (group_id, name);
        None
    }
}

/// A coordinator partition's state in the runtime. Partitions absent from the runtime are not
/// coordinated here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionStatus {
    /// Being replayed: requests get COORDINATOR_LOAD_IN_PROGRESS.
    Loading,
    /// Loaded: requests are served.
    Active,
}

/// A write appended to the log, not necessarily committed yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingWrite {
    /// Partition written to.
    pub partition: i32,
    /// The offset after the write: committed when the high watermark reaches it (0 for an
    /// empty write, which is committed at once).
    pub end_offset: i64,
}

/// One thing [`CoordinatorRuntime::replay_batches`] read, in offset order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayItem<'a> {
    /// A record with a key (a None value is a tombstone).
    Record {
        /// Key.
        key: &'a [u8],
        /// Value.
        value: Option<&'a [u8]>,
        /// The producer whose transaction wrote it, None outside a transaction.
        producer_id: Option<i64>,
        /// Offset of the record.
        offset: i64,
    },
    /// A transaction marker (control batch): the producer's transaction committed or aborted.
    Marker {
        /// Producer id.
        producer_id: i64,
        /// COMMIT (true) or ABORT.
        commit: bool,
        /// Offset of the marker.
        offset: i64,
    },
}

/// What a [`CoordinatorRuntime::replay`] read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadSummary {
    /// Records with a key that were applied.
    pub records: u64,
    /// The offset the replay stopped at (the log end offset when it started, unless a read
    /// failed).
    pub end_offset: i64,
}

struct TimerQueue<T> {
    /// Keyed by (deadline ms, sequence): due timers fire in deadline order, equal deadlines in
    /// scheduling order.
    queue: BTreeMap<(i64, u64), T>,
    next_seq: u64,
}

/// The runtime of one coordinator over the partitions of its internal topic. `T` is the
/// coordinator's timer type.
pub struct CoordinatorRuntime<T> {
    topic: String,
    writer: Arc<dyn PartitionWriter>,
    clock: SharedClock,
    commit_timeout_ms: i64,
    partitions: Mutex<HashMap<i32, PartitionStatus>>,
    timers: Mutex<TimerQueue<T>>,
    timers_changed: Notify,
}

/// Bytes read per step while replaying a partition.
const LOAD_READ_BYTES: usize = 1 << 20;

impl<T: Send + 'static> CoordinatorRuntime<T> {
    /// A runtime for `topic` that writes through `writer`, reads time from `clock`, and fails
    /// writes not committed within `commit_timeout_ms` (`offsets.commit.timeout.ms`).
    pub fn new(
        topic: impl Into<String>,
        writer: Arc<dyn PartitionWriter>,
        clock: SharedClock,
        commit_timeout_ms: i64,
    ) -> Self {
        Self {
            topic: topic.into(),
            writer,
            clock,
            commit_timeout_ms,
            partitions: Mutex::new(HashMap::new()),
            timers: Mutex::new(TimerQueue {
                queue: BTreeMap::new(),
                next_seq: 0,
            }),
            timers_changed: Notify::new(),
        }
    }

    /// The internal topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Now, in milliseconds since the epoch, on the runtime's clock.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The partition writer.
    pub fn writer(&self) -> &Arc<dyn PartitionWriter> {
        &self.writer
    }

    fn not_coordinator(&self, partition: i32) -> CoordinatorError {
        CoordinatorError::NotCoordinator {
            topic: self.topic.clone(),
            partition,
        }
    }

    /// Checks that `partition` is loaded and still led by this broker.
    ///
    /// # Errors
    /// [`CoordinatorError::LoadInProgress`] while it loads, [`CoordinatorError::NotCoordinator`]
    /// when it is not coordinated here.
    pub fn check_active(&self, partition: i32) -> Result<(), CoordinatorError> {
        match self.partitions.lock().get(&partition) {
            Some(PartitionStatus::Active) if self.writer.is_leader(&self.topic, partition) => {
                Ok(())
            }
            Some(PartitionStatus::Loading) => Err(CoordinatorError::LoadInProgress {
                topic: self.topic.clone(),
                partition,
            }),
            _ => Err(self.not_coordinator(partition)),
        }
    }

    /// The status of `partition`, None when it is not coordinated here.
    pub fn status(&self, partition: i32) -> Option<PartitionStatus> {
        self.partitions.lock().get(&partition).copied()
    }

    /// The partitions loaded or loading, in order.
    pub fn partitions(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.partitions.lock().keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Marks `partition` as loading. False when it is already loading or active (nothing to
    /// do: leadership events may repeat).
    pub fn begin_load(&self, partition: i32) -> bool {
        let mut p = self.partitions.lock();
        if p.contains_key(&partition) {
            return false;
        }
        p.insert(partition, PartitionStatus::Loading);
        true
    }

    /// Marks a loading `partition` as active.
    pub fn complete_load(&self, partition: i32) {
        let mut p = self.partitions.lock();
        if let Some(s) = p.get_mut(&partition) {
            *s = PartitionStatus::Active;
        }
    }

    /// Forgets `partition` (this broker resigned as its leader). True when it was loaded or
    /// loading.
    pub fn unload(&self, partition: i32) -> bool {
        self.partitions.lock().remove(&partition).is_some()
    }

    /// Replays `partition` from its log start offset to its log end offset
    /// ([`PartitionWriter::read_for_load`]), calling `apply(key, value)` for every record with a key (a None value is a tombstone), in
    /// offset order. Control batches are skipped, and so is a batch that does not decode (with
    /// a log line); a read error stops the replay there.
    ///
    /// # Errors
    /// [`CoordinatorError::NotCoordinator`] when the partition is not hosted here.
    pub fn replay(
        &self,
        partition: i32,
        mut apply: impl FnMut(&[u8], Option<&[u8]>),
    ) -> Result<LoadSummary, CoordinatorError> {
        self.replay_batches(partition, |item| {
            if let ReplayItem::Record { key, value, .. } = item {
                apply(key, value);
            }
        })
    }

    /// Replays `partition` as [`CoordinatorRuntime::replay`] does, also handing over which
    /// producer wrote each record of a transactional batch and the transaction markers
    /// (control batches: COMMIT or ABORT of a producer's transaction), in offset order, so a
    /// coordinator can rebuild state that a transaction's outcome decides (pending
    /// transactional offset commits, KIP-98).
    ///
    /// # Errors
    /// [`CoordinatorError::NotCoordinator`] when the partition is not hosted here.
    pub fn replay_batches(
        &self,
        partition: i32,
        mut apply: impl FnMut(ReplayItem<'_>),
    ) -> Result<LoadSummary, CoordinatorError> {
        let topic = &self.topic;
        let (Some(mut offset), Some(end)) = (
            self.writer.log_start_offset(topic, partition),
            self.writer.log_end_offset(topic, partition),
        ) else {
            return Err(self.not_coordinator(partition));
        };
        let mut summary = LoadSummary::default();
        while offset < end {
            let records = match self
                .writer
                .read_for_load(topic, partition, offset, LOAD_READ_BYTES)
            {
                Ok(r) => r,
                Err((code, msg)) => {
                    warn!(partition, offset, %code, %msg, "cannot read {topic}; the rest of this partition is skipped");
                    break;
                }
            };
            if records.is_empty() {
                break;
            }
            let mut next = offset;
            for item in Batches::new(&records) {
                let Ok((at, h)) = item else { break };
                next = h.next_offset();
                let Some(batch) = records.get(at..at + h.total_size()) else {
                    break;
                };
                let recs = match gregor_protocol::records::decode_records(batch) {
                    Ok(r) => r,
                    Err(e) => {
                        warn!(partition, offset = h.base_offset, error = %e, "skipping an undecodable batch of {topic}");
                        continue;
                    }
                };
                if h.is_control() {
                    // A control record's key: version (int16) and type (int16: 0 ABORT,
                    // 1 COMMIT); other types (leader change) are not markers.
                    for r in recs {
                        let Some(key) = r.key.as_deref() else {
                            continue;
                        };
                        if key.len() < 4 {
                            continue;
                        }
                        let kind = i16::from_be_bytes([key[2], key[3]]);
                        if kind == 0 || kind == 1 {
                            apply(ReplayItem::Marker {
                                producer_id: h.producer_id,
                                commit: kind == 1,
                                offset: h.base_offset,
                            });
                        }
                    }
                    continue;
                }
                let producer_id = h.is_transactional().then_some(h.producer_id);
                for r in recs {
                    let Some(key) = r.key.as_deref() else {
                        continue;
                    };
                    summary.records += 1;
                    apply(ReplayItem::Record {
                        key,
                        value: r.value.as_deref(),
                        producer_id,
                        offset: h.base_offset + i64::from(r.offset_delta),
                    });
                }
            }
            if next <= offset {
                break;
            }
            offset = next;
        }
        summary.end_offset = offset;
        Ok(summary)
    }

    /// Appends `records` to `partition` as one batch (timestamps from the runtime's clock).
    /// The write is applied to the log but committed only when the high watermark passes it.
    ///
    /// # Errors
    /// [`CoordinatorError::NotCoordinator`] when this broker does not lead the partition,
    /// [`CoordinatorError::Append`] with the writer's error otherwise.
    pub fn append(
        &self,
        partition: i32,
        records: &[CoordinatorRecord],
    ) -> Result<PendingWrite, CoordinatorError> {
        self.append_batch(partition, records, None)
    }

    /// Appends `records` as one transactional batch of producer `producer_id` at
    /// `producer_epoch` (no sequence, as Kafka's coordinators write them): the records take
    /// effect only when that producer's COMMIT marker follows them (transactional offset
    /// commits, KIP-98).
    ///
    /// # Errors
    /// As [`CoordinatorRuntime::append`].
    pub fn append_transactional(
        &self,
        partition: i32,
        records: &[CoordinatorRecord],
        producer_id: i64,
        producer_epoch: i16,
    ) -> Result<PendingWrite, CoordinatorError> {
        self.append_batch(partition, records, Some((producer_id, producer_epoch)))
    }

    fn append_batch(
        &self,
        partition: i32,
        records: &[CoordinatorRecord],
        producer: Option<(i64, i16)>,
    ) -> Result<PendingWrite, CoordinatorError> {
        if records.is_empty() {
            return Ok(PendingWrite {
                partition,
                end_offset: 0,
            });
        }
        let now = self.now_ms();
        let mut b = BatchBuilder::new(0, now);
        if let Some((producer_id, producer_epoch)) = producer {
            b = b
                .producer(producer_id, producer_epoch, -1)
                .transactional(true, false);
        }
        for (k, v) in records {
            b = b.record(now, Some(k), v.as_deref(), &[]);
        }
        let mut buf = b.build();
        match self.writer.append(&self.topic, partition, &mut buf) {
            Ok(end_offset) => Ok(PendingWrite {
                partition,
                end_offset,
            }),
            Err((code, message)) => {
                warn!(partition, %code, %message, "appending to {} failed", self.topic);
                Err(CoordinatorError::Append { code, message })
            }
        }
    }

    /// True when the high watermark has passed `write`.
    pub fn is_committed(&self, write: &PendingWrite) -> bool {
        write.end_offset <= 0
            || self
                .writer
                .high_watermark(&self.topic, write.partition)
                .is_some_and(|hw| hw >= write.end_offset)
    }

    /// Completes when `write` is committed.
    ///
    /// # Errors
    /// [`CoordinatorError::CommitTimeout`] after `offsets.commit.timeout.ms`,
    /// [`CoordinatorError::Append`] with NOT_LEADER_OR_FOLLOWER when leadership moved first.
    pub fn committed(
        &self,
        write: PendingWrite,
    ) -> impl Future<Output = Result<(), CoordinatorError>> + Send + 'static {
        let ready = self.is_committed(&write);
        let wait = (!ready).then(|| {
            self.writer.wait_for_high_watermark(
                &self.topic,
                write.partition,
                write.end_offset,
                self.commit_timeout_ms,
            )
        });
        let topic = self.topic.clone();
        let timeout_ms = self.commit_timeout_ms;
        async move {
            let Some(wait) = wait else { return Ok(()) };
            wait.await.map_err(|code| match code {
                ErrorCode::RequestTimedOut => CoordinatorError::CommitTimeout {
                    topic,
                    partition: write.partition,
                    timeout_ms,
                },
                code => CoordinatorError::Append {
                    code,
                    message: "waiting for the high watermark".into(),
                },
            })
        }
    }

    /// Calls `on_commit` when `write` is committed (or failed to be): at once when the high
    /// watermark has already passed it, else from a task that waits for it.
    pub fn complete_when_committed(
        &self,
        write: PendingWrite,
        on_commit: impl FnOnce(Result<(), CoordinatorError>) + Send + 'static,
    ) {
        if self.is_committed(&write) {
            on_commit(Ok(()));
            return;
        }
        let fut = self.committed(write);
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(async move { on_commit(fut.await) });
            }
            Err(_) => on_commit(Err(CoordinatorError::CommitTimeout {
                topic: self.topic.clone(),
                partition: write.partition,
                timeout_ms: 0,
            })),
        }
    }

    /// Schedules `timer` to fire `delay_ms` from now.
    pub fn schedule(&self, delay_ms: i64, timer: T) {
        self.schedule_at(self.now_ms().saturating_add(delay_ms.max(0)), timer);
    }

    /// Schedules `timer` to fire at `deadline_ms` (clock time).
    pub fn schedule_at(&self, deadline_ms: i64, timer: T) {
        let mut t = self.timers.lock();
        let seq = t.next_seq;
        t.next_seq += 1;
        let earliest = t.queue.keys().next().map(|k| k.0);
        t.queue.insert((deadline_ms, seq), timer);
        drop(t);
        if earliest.is_none_or(|e| deadline_ms < e) {
            self.timers_changed.notify_one();
        }
    }

    /// Removes and returns the timers due at `now_ms`, earliest first.
    pub fn expired_timers(&self, now_ms: i64) -> Vec<T> {
        let mut t = self.timers.lock();
        let later = t.queue.split_off(&(now_ms.saturating_add(1), 0));
        let due = std::mem::replace(&mut t.queue, later);
        due.into_values().collect()
    }

    /// The earliest deadline queued.
    pub fn next_timer_deadline(&self) -> Option<i64> {
        self.timers.lock().queue.keys().next().map(|k| k.0)
    }

    /// Timers queued.
    pub fn pending_timers(&self) -> usize {
        self.timers.lock().queue.len()
    }

    /// Fires timers as they fall due, calling `fire` for each outside any lock, until
    /// `shutdown` changes. Sleeps until the earliest deadline or until an earlier one is
    /// scheduled.
    pub async fn run_timers(&self, fire: impl Fn(T), mut shutdown: watch::Receiver<bool>) {
        loop {
            for t in self.expired_timers(self.now_ms()) {
                fire(t);
            }
            let wait_ms = self
                .next_timer_deadline()
                .map(|d| d.saturating_sub(self.now_ms()).max(1));
            let sleep = async {
                match wait_ms {
                    Some(ms) => tokio::time::sleep(Duration::from_millis(ms as u64)).await,
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = sleep => {}
                () = self.timers_changed.notified() => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}
