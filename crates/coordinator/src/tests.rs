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

use crate::group::{GroupConfig, GroupCoordinator};
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
