//! Snapshots of the metadata image, written by every node (Kafka's `SnapshotGenerator`,
//! KIP-630): a publisher on the loader that counts the bytes of the records applied since
//! the last snapshot and writes the image's records ([`MetadataImage::to_records`]) as the
//! log's snapshot `<next offset>-<epoch of the last applied batch>.checkpoint` once
//! `metadata.log.max.record.bytes.between.snapshots` bytes were applied or
//! `metadata.log.max.snapshot.interval.ms` passed with something applied
//! ([`gregor_raft::MetadataLogConfig::snapshot_due`]). The log then applies its retention
//! (`metadata.max.retention.bytes`/`.ms`: whole segments below the latest snapshot).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use gregor_raft::MetadataLogConfig;

use crate::image::MetadataImage;
use crate::loader::{MetadataDelta, MetadataPublisher};
use crate::log::{MetadataSnapshot, SnapshotSink};

/// Counter: snapshots of the metadata image this node wrote (Kafka's
/// `latest-snapshot-generated-bytes` family).
pub const SNAPSHOTS_WRITTEN_TOTAL: &str = "gregor_metadata_snapshots_written_total";

/// Bytes of applied records since the last snapshot, and when it was.
struct Since {
    bytes: u64,
    at: Instant,
}

/// The snapshot-writing publisher (install it last on the loader).
pub struct SnapshotGenerator {
    sink: Arc<dyn SnapshotSink>,
    config: MetadataLogConfig,
    since: parking_lot::Mutex<Since>,
    /// A snapshot is being written (one at a time, as Kafka's generator).
    writing: Arc<AtomicBool>,
    runtime: tokio::runtime::Handle,
}

impl SnapshotGenerator {
    /// A generator writing to `sink` by `config`'s snapshot rules; writes run on the current
    /// runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn new(sink: Arc<dyn SnapshotSink>, config: MetadataLogConfig) -> Self {
        Self {
            sink,
            config,
            since: parking_lot::Mutex::new(Since {
                bytes: 0,
                at: Instant::now(),
            }),
            writing: Arc::new(AtomicBool::new(false)),
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// Encoded size of `records` in bytes (what they take in the log, without batch headers).
    fn size_of(records: &[crate::record::MetadataRecord]) -> u64 {
        records
            .iter()
            .map(|r| crate::codec::encode_record(r).map_or(0, |v| v.len() as u64))
            .sum()
    }
}

impl MetadataPublisher for SnapshotGenerator {
    fn name(&self) -> &str {
        "SnapshotGenerator"
    }

    fn on_metadata_update(
        &self,
        delta: &MetadataDelta<'_>,
        image: &Arc<MetadataImage>,
    ) -> Result<(), String> {
        let mut since = self.since.lock();
        if delta.snapshot {
            // The image came from a snapshot: nothing new to write yet.
            since.bytes = 0;
            since.at = Instant::now();
            return Ok(());
        }
        since.bytes += Self::size_of(delta.records);
        let elapsed_ms = i64::try_from(since.at.elapsed().as_millis()).unwrap_or(i64::MAX);
        if image.offset == 0
            || !self.config.snapshot_due(since.bytes, elapsed_ms)
            || self.writing.swap(true, Ordering::AcqRel)
        {
            return Ok(());
        }
        since.bytes = 0;
        since.at = Instant::now();
        drop(since);
        let (sink, writing, image, epoch) = (
            self.sink.clone(),
            self.writing.clone(),
            image.clone(),
            delta.epoch,
        );
        self.runtime.spawn(async move {
            let snapshot = MetadataSnapshot {
                end_offset: image.offset,
                epoch,
                records: image.to_records().into(),
            };
            match sink.write_snapshot(snapshot).await {
                Ok(true) => metrics::counter!(SNAPSHOTS_WRITTEN_TOTAL).increment(1),
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    end_offset = image.offset,
                    epoch,
                    error = %e,
                    "writing a metadata snapshot failed"
                ),
            }
            writing.store(false, Ordering::Release);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{MetadataLogError, ProposeFuture};
    use crate::record::MetadataRecord;
    use gregor_protocol::metadata_records::{ConfigRecord, NoOpRecord};

    #[derive(Default)]
    struct Recorder(parking_lot::Mutex<Vec<MetadataSnapshot>>);

    impl SnapshotSink for Recorder {
        fn write_snapshot(&self, snapshot: MetadataSnapshot) -> ProposeFuture<'_, bool> {
            self.0.lock().push(snapshot);
            Box::pin(async { Ok::<_, MetadataLogError>(true) })
        }
    }

    fn config(value_len: usize) -> MetadataRecord {
        ConfigRecord {
            resource_type: crate::record::ConfigResource::Broker.resource_type(),
            resource_name: String::new(),
            name: "c".into(),
            value: Some("x".repeat(value_len)),
            ..Default::default()
        }
        .into()
    }

    async fn wait_for(rec: &Recorder, n: usize) {
        for _ in 0..500 {
            if rec.0.lock().len() >= n {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        panic!("{n} snapshots expected, got {}", rec.0.lock().len());
    }

    fn publish(
        g: &SnapshotGenerator,
        image: &mut Arc<MetadataImage>,
        records: &[MetadataRecord],
        epoch: i32,
    ) {
        let mut next = (**image).clone();
        next.offset += 1; // a control batch before it
        for r in records {
            next.apply(r);
        }
        let next = Arc::new(next);
        let delta = MetadataDelta {
            previous: image,
            records,
            snapshot: false,
            epoch,
        };
        g.on_metadata_update(&delta, &next).unwrap();
        *image = next;
    }

    #[tokio::test]
    async fn a_snapshot_is_due_after_max_record_bytes() {
        let sink = Arc::new(Recorder::default());
        let g = SnapshotGenerator::new(
            sink.clone(),
            MetadataLogConfig {
                max_record_bytes_between_snapshots: 1000,
                ..MetadataLogConfig::default()
            },
        );
        let mut image = Arc::new(MetadataImage::default());
        let record_bytes = SnapshotGenerator::size_of(&[config(100)]);
        let needed = 1000_u64.div_ceil(record_bytes);
        for i in 1..needed {
            publish(&g, &mut image, &[config(100)], 3);
            tokio::task::yield_now().await;
            assert!(sink.0.lock().is_empty(), "not due after {i} records");
        }
        publish(&g, &mut image, &[config(100)], 4);
        wait_for(&sink, 1).await;
        let s = sink.0.lock()[0].clone();
        assert_eq!((s.end_offset, s.epoch), (image.offset, 4));
        assert_eq!(s.records[..], image.to_records()[..]);
        // The count starts again.
        publish(&g, &mut image, &[config(100)], 4);
        tokio::task::yield_now().await;
        assert_eq!(sink.0.lock().len(), 1);
        // A snapshot load resets it as well.
        let delta = MetadataDelta {
            previous: &image,
            records: &[],
            snapshot: true,
            epoch: 4,
        };
        g.on_metadata_update(&delta, &image).unwrap();
        for _ in 1..needed {
            publish(&g, &mut image, &[config(100)], 4);
        }
        tokio::task::yield_now().await;
        assert_eq!(sink.0.lock().len(), 1);
    }

    #[tokio::test]
    async fn a_snapshot_is_due_after_the_interval_when_something_was_applied() {
        let sink = Arc::new(Recorder::default());
        let g = SnapshotGenerator::new(
            sink.clone(),
            MetadataLogConfig {
                max_snapshot_interval_ms: 50,
                ..MetadataLogConfig::default()
            },
        );
        let mut image = Arc::new(MetadataImage::default());
        publish(
            &g,
            &mut image,
            &[MetadataRecord::NoOp(NoOpRecord::default())],
            1,
        );
        tokio::task::yield_now().await;
        assert!(sink.0.lock().is_empty(), "not before the interval");
        g.since.lock().at = Instant::now() - std::time::Duration::from_millis(60);
        // Nothing applied in the delta but bytes are pending from before: due now.
        publish(&g, &mut image, &[], 1);
        wait_for(&sink, 1).await;
        // Past the interval again, but nothing applied since: not due.
        g.since.lock().at = Instant::now() - std::time::Duration::from_millis(60);
        let delta = MetadataDelta {
            previous: &image,
            records: &[],
            snapshot: false,
            epoch: 1,
        };
        g.on_metadata_update(&delta, &image).unwrap();
        tokio::task::yield_now().await;
        assert_eq!(sink.0.lock().len(), 1);
    }
}
