//! The metadata loader: the one task on every node that turns committed batches into
//! [`MetadataImage`]s and hands each to the node's publishers (Kafka's `MetadataLoader` and
//! `MetadataPublisher`, KIP-866's loader/publisher split).
//!
//! Batches are applied in offset order; for each the publishers are called one after the
//! other in the order they were installed (the broker installs ReplicaManager first, then the
//! coordinators), and only then is the new image visible through [`LoaderHandle::image`]. So a
//! caller that waits for an offset with [`LoaderHandle::wait_for_offset`] finds the partition
//! logs created and the coordinators loaded. A publisher's failure is logged and reported to
//! waiters of that batch; the loader goes on with the next batch, as Kafka's fault handler does.

use std::sync::Arc;

use thiserror::Error;
use tokio::sync::{mpsc, oneshot, watch};

use crate::image::MetadataImage;
use crate::log::{Committed, CommittedBatch, CommittedBatches, MetadataSnapshot};
use crate::record::MetadataRecord;
use crate::txn_replay::{is_transaction_marker, TransactionalReplay};

/// Gauge: offset of the last metadata record this node applied (Kafka's
/// `last-applied-record-offset`, -1 before any).
pub const LAST_APPLIED_RECORD_OFFSET: &str = "gregor_metadata_last_applied_record_offset";
/// Counter: committed batches some publisher failed to apply (Kafka's
/// `metadata-apply-error-count`).
pub const APPLY_ERRORS_TOTAL: &str = "gregor_metadata_apply_errors_total";

/// What changed between two images: the previous image and the records applied to it. A
/// publisher installed after start-up first gets a delta from the empty image with no records
/// (everything in the image is new to it).
pub struct MetadataDelta<'a> {
    /// The image before the change.
    pub previous: &'a MetadataImage,
    /// The committed records that made the new image; empty for a publisher's first image.
    /// For a snapshot load, the snapshot's records (applied to the empty image, not to
    /// `previous`).
    pub records: &'a [MetadataRecord],
    /// True when the new image was loaded from a snapshot and replaces `previous` whole
    /// (Kafka's `handleLoadSnapshot`): publishers reconcile with the new image (ReplicaManager
    /// creates and deletes logs to match it).
    pub snapshot: bool,
    /// The quorum epoch of the last record the new image holds (of the batch, or the
    /// snapshot's epoch); 0 for a publisher's first image.
    pub epoch: i32,
}

/// A publisher's failure to apply an image.
#[derive(Debug, Error)]
#[error("{publisher}: {message}")]
pub struct PublishError {
    /// The publisher's name.
    pub publisher: String,
    /// What went wrong.
    pub message: String,
}

/// Something on this node that follows the metadata (Kafka's `MetadataPublisher`):
/// ReplicaManager, the coordinators, dynamic configs.
pub trait MetadataPublisher: Send + Sync {
    /// A short name for logs.
    fn name(&self) -> &str;

    /// Called for every committed batch, in offset order, with the image after it. Runs on a
    /// blocking thread; may do file I/O. Must not wait for the loader (it is the loader).
    ///
    /// # Errors
    /// A message for the log and for the request that made the change.
    fn on_metadata_update(
        &self,
        delta: &MetadataDelta<'_>,
        image: &Arc<MetadataImage>,
    ) -> Result<(), String>;
}

/// The latest image every publisher has seen, and the last failure.
#[derive(Clone, Default)]
struct Loaded {
    image: Arc<MetadataImage>,
    /// The last offset of the latest batch some publisher failed on, with the errors.
    last_failure: Option<(u64, String)>,
}

enum LoaderCommand {
    Install(
        Arc<dyn MetadataPublisher>,
        oneshot::Sender<Result<(), PublishError>>,
    ),
}

/// Why waiting for the loader failed.
#[derive(Debug, Error)]
pub enum LoaderError {
    /// The loader stopped (the node is shutting down, or the metadata log closed).
    #[error("the metadata loader has stopped")]
    Stopped,
    /// A publisher could not apply the batch the caller waited for.
    #[error("metadata was committed but applying it on this node failed: {0}")]
    Publish(String),
}

/// Handle to the running loader. Cheap to clone.
#[derive(Clone)]
pub struct LoaderHandle {
    commands: mpsc::Sender<LoaderCommand>,
    loaded: watch::Receiver<Loaded>,
}

impl LoaderHandle {
    /// The image after the last batch every publisher has seen.
    pub fn image(&self) -> Arc<MetadataImage> {
        self.loaded.borrow().image.clone()
    }

    /// Waits until the batch whose last record is at `offset` has been applied and published.
    ///
    /// # Errors
    /// [`LoaderError::Publish`] when a publisher failed on that batch;
    /// [`LoaderError::Stopped`] when the loader stopped first.
    pub async fn wait_for_offset(&self, offset: u64) -> Result<Arc<MetadataImage>, LoaderError> {
        let mut rx = self.loaded.clone();
        let loaded = rx
            .wait_for(|l| l.image.offset > offset)
            .await
            .map_err(|_| LoaderError::Stopped)?
            .clone();
        match loaded.last_failure {
            Some((failed, message)) if failed == offset => Err(LoaderError::Publish(message)),
            _ => Ok(loaded.image),
        }
    }

    /// Waits until the image has every record below `high_watermark` (at start-up, the log's
    /// high watermark: the node has caught up with what was committed before it started).
    ///
    /// # Errors
    /// [`LoaderError::Stopped`].
    pub async fn wait_for_catch_up(&self, high_watermark: u64) -> Result<(), LoaderError> {
        let mut rx = self.loaded.clone();
        rx.wait_for(|l| l.image.offset >= high_watermark)
            .await
            .map(|_| ())
            .map_err(|_| LoaderError::Stopped)
    }

    /// Adds a publisher after those installed before. It is first called with the current
    /// image (from the empty one), then with every later batch; returns after that first call.
    ///
    /// # Errors
    /// The publisher's failure on the current image (it stays installed);
    /// [`LoaderError::Stopped`] when the loader has stopped.
    pub async fn install_publisher(
        &self,
        publisher: Arc<dyn MetadataPublisher>,
    ) -> Result<(), LoaderError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(LoaderCommand::Install(publisher, tx))
            .await
            .map_err(|_| LoaderError::Stopped)?;
        rx.await
            .map_err(|_| LoaderError::Stopped)?
            .map_err(|e| LoaderError::Publish(e.to_string()))
    }
}

/// Starts the loader on `batches` (from offset 0). It stops when the stream ends or `shutdown`
/// turns true.
pub fn start_loader(
    batches: CommittedBatches,
    shutdown: watch::Receiver<bool>,
) -> (LoaderHandle, tokio::task::JoinHandle<()>) {
    let (loaded_tx, loaded_rx) = watch::channel(Loaded::default());
    let (commands_tx, commands_rx) = mpsc::channel(8);
    let task = tokio::spawn(run(batches, commands_rx, loaded_tx, shutdown));
    (
        LoaderHandle {
            commands: commands_tx,
            loaded: loaded_rx,
        },
        task,
    )
}

async fn run(
    mut batches: CommittedBatches,
    mut commands: mpsc::Receiver<LoaderCommand>,
    loaded: watch::Sender<Loaded>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut publishers: Vec<Arc<dyn MetadataPublisher>> = Vec::new();
    let mut image = Arc::new(MetadataImage::default());
    let mut replay = TransactionalReplay::default();
    let mut pending: Option<Pending> = None;
    metrics::describe_gauge!(
        LAST_APPLIED_RECORD_OFFSET,
        "Offset of the last metadata record this node applied (-1 before any)."
    );
    metrics::describe_counter!(
        APPLY_ERRORS_TOTAL,
        "Committed metadata batches that a publisher (ReplicaManager, a coordinator) failed to apply on this node."
    );
    let last_applied = metrics::gauge!(LAST_APPLIED_RECORD_OFFSET);
    let apply_errors = metrics::counter!(APPLY_ERRORS_TOTAL);
    last_applied.set(-1.0);
    apply_errors.increment(0);
    loop {
        tokio::select! {
            batch = batches.next() => {
                let Some(batch) = batch else { return };
                let Some(change) = replay_committed(&image, &batch, &mut replay, &mut pending) else {
                    // Inside an open metadata transaction: nothing is published until it ends.
                    continue;
                };
                let (next, failure) = publish(&image, change, &publishers).await;
                image = next;
                last_applied.set(batch.next_offset() as f64 - 1.0);
                if failure.is_some() {
                    apply_errors.increment(1);
                }
                loaded.send_modify(|l| {
                    l.image = image.clone();
                    if failure.is_some() {
                        l.last_failure = failure;
                    }
                });
            }
            command = commands.recv() => {
                let Some(LoaderCommand::Install(publisher, reply)) = command else { continue };
                let p = publisher.clone();
                let img = image.clone();
                let outcome = tokio::task::spawn_blocking(move || {
                    let empty = MetadataImage::default();
                    let delta = MetadataDelta { previous: &empty, records: &[], snapshot: false, epoch: 0 };
                    p.on_metadata_update(&delta, &img)
                })
                .await
                .unwrap_or_else(|e| Err(format!("panicked: {e}")))
                .map_err(|message| PublishError {
                    publisher: publisher.name().to_string(),
                    message,
                });
                publishers.push(publisher);
                let _ = reply.send(outcome);
            }
            _ = shutdown.changed() => return,
        }
    }
}

/// The image `snapshot` holds: its records applied to the empty image, at its end offset.
pub fn image_from_snapshot(snapshot: &MetadataSnapshot) -> MetadataImage {
    let mut image = MetadataImage::default();
    for r in snapshot.records.iter() {
        image.apply(r);
    }
    image.offset = snapshot.end_offset;
    image
}

/// `image` with `batch` applied: its records from the batch's base offset on (the offsets
/// between, a Raft log's control batches, hold no metadata record).
pub fn apply_batch(image: &MetadataImage, batch: &CommittedBatch) -> MetadataImage {
    let mut next = image.clone();
    if next.offset > batch.base_offset {
        tracing::error!(
            image_offset = next.offset,
            batch_offset = batch.base_offset,
            "metadata batch out of order; applying it anyway"
        );
    }
    next.offset = next.offset.max(batch.base_offset);
    for r in batch.records.iter() {
        next.apply(r);
    }
    next
}

/// What the loader built past the published image while a metadata transaction (KIP-868) is
/// open: the image with the records so far, and those records (the delta to publish).
struct Pending {
    image: MetadataImage,
    records: Vec<MetadataRecord>,
}

/// An image to publish and what made it.
struct Change {
    next: MetadataImage,
    records: Arc<[MetadataRecord]>,
    snapshot: bool,
    epoch: i32,
    /// The offset of the last record (or the snapshot's) it holds.
    last_offset: u64,
}

/// Applies `committed` to the published `image` (or replaces it with a snapshot). `None`
/// while a metadata transaction is open after it: its records wait in `pending` and are
/// published with the batch that ends it (or dropped by an abort), as Kafka's
/// `MetadataBatchLoader` publishes no part of a transaction.
fn replay_committed(
    image: &MetadataImage,
    committed: &Committed,
    replay: &mut TransactionalReplay,
    pending: &mut Option<Pending>,
) -> Option<Change> {
    let last_offset = committed.next_offset().saturating_sub(1);
    match committed {
        Committed::Batch(batch) => {
            if pending.is_none()
                && replay.open_since().is_none()
                && !batch.records.iter().any(is_transaction_marker)
            {
                return Some(Change {
                    next: apply_batch(image, batch),
                    records: batch.records.clone(),
                    snapshot: false,
                    epoch: batch.epoch,
                    last_offset,
                });
            }
            let Pending {
                image: mut next,
                mut records,
            } = pending.take().unwrap_or_else(|| Pending {
                image: image.clone(),
                records: Vec::new(),
            });
            replay.replay(&mut next, batch, Some(&mut records), |_, _| {});
            if replay.open_since().is_some() {
                *pending = Some(Pending {
                    image: next,
                    records,
                });
                return None;
            }
            Some(Change {
                next,
                records: records.into(),
                snapshot: false,
                epoch: batch.epoch,
                last_offset,
            })
        }
        Committed::Snapshot(s) => {
            tracing::info!(
                end_offset = s.end_offset,
                epoch = s.epoch,
                previous_offset = image.offset,
                "metadata image loaded from a snapshot"
            );
            replay.reset();
            *pending = None;
            Some(Change {
                next: image_from_snapshot(s),
                records: s.records.clone(),
                snapshot: true,
                epoch: s.epoch,
                last_offset,
            })
        }
    }
}

/// Calls every publisher, in order, on a blocking thread with `change`; returns the new image
/// and the publishers' failures.
async fn publish(
    image: &Arc<MetadataImage>,
    change: Change,
    publishers: &[Arc<dyn MetadataPublisher>],
) -> (Arc<MetadataImage>, Option<(u64, String)>) {
    let Change {
        next,
        records,
        snapshot,
        epoch,
        last_offset,
    } = change;
    let next = Arc::new(next);
    let (previous, published) = (image.clone(), next.clone());
    let publishers = publishers.to_vec();
    let failure = tokio::task::spawn_blocking(move || {
        let delta = MetadataDelta {
            previous: &previous,
            records: &records,
            snapshot,
            epoch,
        };
        let mut errors = Vec::new();
        for p in &publishers {
            if let Err(message) = p.on_metadata_update(&delta, &published) {
                tracing::error!(
                    publisher = p.name(),
                    offset = last_offset,
                    error = %message,
                    "applying committed metadata failed; continuing with the next batch"
                );
                errors.push(format!("{}: {message}", p.name()));
            }
        }
        errors
    })
    .await
    .unwrap_or_else(|e| {
        // A publisher panicked: the image still moves on, so the node does not stall.
        tracing::error!(error = %e, offset = last_offset, "a metadata publisher panicked");
        vec![format!("a publisher panicked: {e}")]
    });
    let failure = (!failure.is_empty()).then(|| (last_offset, failure.join("; ")));
    (next, failure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::CommittedBatch;
    use crate::record::ConfigResource;
    use parking_lot::Mutex;

    fn config(i: u64) -> MetadataRecord {
        gregor_protocol::metadata_records::ConfigRecord {
            resource_type: ConfigResource::Broker.resource_type(),
            resource_name: String::new(),
            name: format!("c{i}"),
            value: Some(i.to_string()),
            ..Default::default()
        }
        .into()
    }

    fn batch(base_offset: u64, len: u64) -> CommittedBatch {
        CommittedBatch {
            base_offset,
            epoch: 1,
            records: (base_offset..base_offset + len).map(config).collect(),
        }
    }

    /// What a publisher saw: (name, previous offset, records in the delta, new offset).
    type Calls = Arc<Mutex<Vec<(&'static str, u64, usize, u64)>>>;

    struct Recorder {
        name: &'static str,
        calls: Calls,
        fail_at_offset: Option<u64>,
    }

    impl MetadataPublisher for Recorder {
        fn name(&self) -> &str {
            self.name
        }

        fn on_metadata_update(
            &self,
            delta: &MetadataDelta<'_>,
            image: &Arc<MetadataImage>,
        ) -> Result<(), String> {
            self.calls.lock().push((
                self.name,
                delta.previous.offset,
                delta.records.len(),
                image.offset,
            ));
            if self.fail_at_offset == Some(image.offset) {
                return Err("disk full".into());
            }
            Ok(())
        }
    }

    fn recorder(name: &'static str, calls: &Calls, fail_at_offset: Option<u64>) -> Arc<Recorder> {
        Arc::new(Recorder {
            name,
            calls: calls.clone(),
            fail_at_offset,
        })
    }

    #[tokio::test]
    async fn batches_are_applied_in_order_and_publishers_called_in_install_order() {
        let (tx, rx) = mpsc::channel(8);
        // Two batches committed before start-up, then live ones.
        let stream = CommittedBatches::from_batches(vec![batch(0, 2), batch(2, 1)], rx);
        let (_shutdown_tx, shutdown) = watch::channel(false);
        let (loader, task) = start_loader(stream, shutdown);
        loader.wait_for_catch_up(3).await.unwrap();
        assert_eq!(loader.image().offset, 3);
        assert_eq!(
            loader.image().configs_of(ConfigResource::Broker, "").len(),
            3
        );

        let calls: Calls = Arc::default();
        loader
            .install_publisher(recorder("replica manager", &calls, None))
            .await
            .unwrap();
        loader
            .install_publisher(recorder("coordinators", &calls, None))
            .await
            .unwrap();
        // Each starts from the empty image with the whole current image.
        assert_eq!(
            calls.lock().clone(),
            vec![("replica manager", 0, 0, 3), ("coordinators", 0, 0, 3)]
        );
        calls.lock().clear();

        tx.send(batch(3, 2).into()).await.unwrap();
        tx.send(batch(5, 1).into()).await.unwrap();
        let image = loader.wait_for_offset(5).await.unwrap();
        assert_eq!(image.offset, 6);
        assert_eq!(
            calls.lock().clone(),
            vec![
                ("replica manager", 3, 2, 5),
                ("coordinators", 3, 2, 5),
                ("replica manager", 5, 1, 6),
                ("coordinators", 5, 1, 6),
            ]
        );
        drop(tx);
        task.await.unwrap();
        assert!(matches!(
            loader.wait_for_offset(6).await,
            Err(LoaderError::Stopped)
        ));
    }

    #[tokio::test]
    async fn a_failing_publisher_fails_the_waiters_of_that_batch_only() {
        let (tx, rx) = mpsc::channel(8);
        let (_shutdown_tx, shutdown) = watch::channel(false);
        let (loader, _task) = start_loader(CommittedBatches::new(vec![], rx), shutdown);
        let calls: Calls = Arc::default();
        loader
            .install_publisher(recorder("replica manager", &calls, Some(2)))
            .await
            .unwrap();
        loader
            .install_publisher(recorder("coordinators", &calls, None))
            .await
            .unwrap();
        tx.send(batch(0, 2).into()).await.unwrap();
        let e = loader.wait_for_offset(1).await.unwrap_err();
        assert!(e.to_string().contains("disk full"), "{e}");
        // The publishers after the failing one still saw the batch.
        assert!(calls.lock().contains(&("coordinators", 0, 2, 2)));
        tx.send(batch(2, 1).into()).await.unwrap();
        assert_eq!(loader.wait_for_offset(2).await.unwrap().offset, 3);
    }

    /// A snapshot installed from the leader replaces the image whole (Kafka's
    /// `handleLoadSnapshot`): publishers get the old image as `previous` and the snapshot's
    /// image, so what the snapshot no longer has is gone for them.
    #[tokio::test]
    async fn a_snapshot_replaces_the_image_and_publishers_see_the_whole_change() {
        let (tx, rx) = mpsc::channel(8);
        let (_shutdown_tx, shutdown) = watch::channel(false);
        let (loader, _task) = start_loader(CommittedBatches::new(vec![], rx), shutdown);
        /// (snapshot load, configs before, configs after, image offset) per call.
        type Seen = Arc<Mutex<Vec<(bool, usize, usize, u64)>>>;
        let seen: Seen = Arc::default();
        struct Snap(Seen);
        impl MetadataPublisher for Snap {
            fn name(&self) -> &str {
                "snap"
            }
            fn on_metadata_update(
                &self,
                delta: &MetadataDelta<'_>,
                image: &Arc<MetadataImage>,
            ) -> Result<(), String> {
                let configs = |i: &MetadataImage| i.configs_of(ConfigResource::Broker, "").len();
                self.0.lock().push((
                    delta.snapshot,
                    configs(delta.previous),
                    configs(image),
                    image.offset,
                ));
                Ok(())
            }
        }
        loader
            .install_publisher(Arc::new(Snap(seen.clone())))
            .await
            .unwrap();
        // Batches with a gap between them (a control batch at offset 3).
        tx.send(batch(1, 2).into()).await.unwrap();
        tx.send(batch(4, 2).into()).await.unwrap();
        assert_eq!(loader.wait_for_offset(5).await.unwrap().offset, 6);
        // The leader's snapshot at 40 holds configs c100 and c101 only.
        tx.send(Committed::Snapshot(MetadataSnapshot {
            end_offset: 40,
            epoch: 3,
            records: vec![config(100), config(101)].into(),
        }))
        .await
        .unwrap();
        let image = loader.wait_for_offset(39).await.unwrap();
        assert_eq!(image.offset, 40);
        let names: Vec<String> = image
            .configs_of(ConfigResource::Broker, "")
            .keys()
            .cloned()
            .collect();
        assert_eq!(names, vec!["c100".to_string(), "c101".to_string()]);
        tx.send(batch(41, 1).into()).await.unwrap();
        assert_eq!(loader.wait_for_offset(41).await.unwrap().offset, 42);
        assert_eq!(
            seen.lock().clone(),
            vec![
                (false, 0, 0, 0),
                (false, 0, 2, 3),
                (false, 2, 4, 6),
                (true, 4, 2, 40),
                (false, 2, 3, 42),
            ]
        );
    }

    /// A metadata transaction (KIP-868) is published whole when it ends, and not at all when
    /// it is aborted; the records around it are published as usual.
    #[tokio::test]
    async fn publishers_see_a_metadata_transaction_whole_or_not_at_all() {
        use gregor_protocol::metadata_records::{
            AbortTransactionRecord, BeginTransactionRecord, EndTransactionRecord,
        };
        let begin = || -> MetadataRecord { BeginTransactionRecord::default().into() };
        let (tx, rx) = mpsc::channel(8);
        let (_shutdown_tx, shutdown) = watch::channel(false);
        let (loader, _task) = start_loader(CommittedBatches::new(vec![], rx), shutdown);
        /// (configs in the image, records in the delta, image offset) per call.
        type Seen = Arc<Mutex<Vec<(usize, usize, u64)>>>;
        let seen: Seen = Arc::default();
        struct See(Seen);
        impl MetadataPublisher for See {
            fn name(&self) -> &str {
                "see"
            }
            fn on_metadata_update(
                &self,
                delta: &MetadataDelta<'_>,
                image: &Arc<MetadataImage>,
            ) -> Result<(), String> {
                let configs = image.configs_of(ConfigResource::Broker, "").len();
                self.0
                    .lock()
                    .push((configs, delta.records.len(), image.offset));
                Ok(())
            }
        }
        loader
            .install_publisher(Arc::new(See(seen.clone())))
            .await
            .unwrap();
        let send = |base_offset: u64, records: Vec<MetadataRecord>| {
            let tx = tx.clone();
            async move {
                tx.send(
                    CommittedBatch {
                        base_offset,
                        epoch: 1,
                        records: records.into(),
                    }
                    .into(),
                )
                .await
                .unwrap();
            }
        };
        // c0, then a transaction of c1..c3 over two batches, committed.
        send(0, vec![config(0), begin(), config(1)]).await;
        send(3, vec![config(2), config(3)]).await;
        send(5, vec![EndTransactionRecord::default().into()]).await;
        assert_eq!(loader.wait_for_offset(5).await.unwrap().offset, 6);
        // A transaction of c4 aborted, then c5 in the same batch as the abort.
        send(6, vec![begin(), config(4)]).await;
        send(8, vec![AbortTransactionRecord::default().into(), config(5)]).await;
        let image = loader.wait_for_offset(9).await.unwrap();
        let names: Vec<String> = image
            .configs_of(ConfigResource::Broker, "")
            .keys()
            .cloned()
            .collect();
        assert_eq!(names, ["c0", "c1", "c2", "c3", "c5"]);
        // Only once each transaction ended; its delta holds the records it applied.
        assert_eq!(seen.lock().clone(), vec![(0, 0, 0), (4, 4, 6), (5, 1, 10)]);
    }

    #[tokio::test]
    async fn shutdown_stops_the_loader() {
        let (_tx, rx) = mpsc::channel(8);
        let (shutdown_tx, shutdown) = watch::channel(false);
        let (loader, task) = start_loader(CommittedBatches::new(vec![], rx), shutdown);
        shutdown_tx.send(true).unwrap();
        task.await.unwrap();
        assert!(matches!(
            loader.wait_for_offset(0).await,
            Err(LoaderError::Stopped)
        ));
    }
}
