//! The metadata log as a Raft log looks to its users: [`MetadataLog::propose`] hands a batch
//! of records to the quorum and resolves with the offset at which it was committed (or
//! [`MetadataLogError::NotLeader`] with the leader hint), and [`MetadataLog::subscribe`] gives
//! the stream of committed batches, in offset order, that every node applies (Kafka's
//! `RaftClient.scheduleAppend` and `RaftClient.Listener.handleCommit`, KIP-595).
//!
//! [`FileMetadataLog`] is the one-voter quorum: this node is always the leader, and a batch is
//! committed once it is written and fsynced to one local file of frames
//! `[length: u32 BE][crc32c: u32 BE][body]`, one frame per batch, so a batch is
//! all-or-nothing. The body is `0x00` then, per record, `[length: u32 BE][the record in Kafka's
//! framing, crate::codec]`; files of earlier versions hold JSON arrays of
//! [`crate::record::LegacyMetadataRecord`] instead, which are read and converted with
//! [`crate::record::from_legacy`]. On open a torn or corrupt tail (a crash during an append) is truncated
//! away; everything before it is kept. Offsets count records from 0, as in a Kafka log.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use thiserror::Error;
use tokio::sync::mpsc;

use crate::codec::{decode_record, encode_record};
use crate::record::{from_legacy, LegacyMetadataRecord, MetadataRecord};

/// Errors of the metadata log.
#[derive(Debug, Error)]
pub enum MetadataLogError {
    /// File system error.
    #[error("metadata log {path}: {context}: {source}")]
    Io {
        /// The log file.
        path: PathBuf,
        /// What was being done.
        context: &'static str,
        /// The cause.
        source: io::Error,
    },
    /// A record could not be serialised (a bug).
    #[error("cannot encode metadata record: {0}")]
    Encode(String),
    /// This node is not the leader of the metadata quorum, so it cannot commit anything; the
    /// caller retries on the leader (Kafka's `NotLeaderException`, answered to clients as
    /// NOT_CONTROLLER).
    #[error(
        "this node is not the metadata quorum leader (leader: {leader_id:?}, epoch {leader_epoch})"
    )]
    NotLeader {
        /// The leader's node id, when this node knows it.
        leader_id: Option<i32>,
        /// The quorum epoch this node is in.
        leader_epoch: i32,
    },
    /// `propose` was called with no records (a caller bug: there is nothing to commit).
    #[error("an empty batch cannot be proposed")]
    EmptyBatch,
    /// The log was closed (the node is shutting down).
    #[error("the metadata log is closed")]
    Closed,
    /// The quorum member stopped on a storage error (a full disk, say): what failed.
    #[error("the metadata log stopped: {0}")]
    Stopped(String),
    /// The batch could not be written (a full `metadata.log.dir`, say) and is not in the log;
    /// the quorum member keeps running and later proposals may succeed (answered to clients
    /// as KAFKA_STORAGE_ERROR).
    #[error("the metadata log cannot be written: {0}")]
    Storage(String),
}

/// A batch of records committed together: the records at offsets
/// `base_offset..=last_offset()`, appended by the leader of quorum epoch `epoch`.
#[derive(Debug, Clone, PartialEq)]
pub struct CommittedBatch {
    /// Offset of the first record.
    pub base_offset: u64,
    /// The quorum (leader) epoch in which the batch was appended.
    pub epoch: i32,
    /// The records, in order; never empty.
    pub records: Arc<[MetadataRecord]>,
}

impl CommittedBatch {
    /// Offset of the last record of the batch.
    pub fn last_offset(&self) -> u64 {
        self.base_offset + self.records.len().saturating_sub(1) as u64
    }

    /// The offset after the batch: where the next batch starts.
    pub fn next_offset(&self) -> u64 {
        self.base_offset + self.records.len() as u64
    }
}

/// A snapshot of the metadata (KIP-630): the image's records as of `end_offset` (everything
/// committed below it), Kafka's `<end offset>-<epoch>.checkpoint`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetadataSnapshot {
    /// The offset after the last record the snapshot contains.
    pub end_offset: u64,
    /// The quorum epoch of the record at `end_offset - 1`.
    pub epoch: i32,
    /// The records of the image ([`crate::image::MetadataImage::to_records`]).
    pub records: Arc<[MetadataRecord]>,
}

/// What a [`CommittedBatches`] stream delivers (Kafka's `RaftClient.Listener.handleCommit` and
/// `handleLoadSnapshot`).
#[derive(Debug, Clone, PartialEq)]
pub enum Committed {
    /// The next committed batch.
    Batch(CommittedBatch),
    /// A snapshot: the reader replaces its state with it, and batches from its end offset on
    /// follow. Comes first when the log starts from a snapshot, and later when this node
    /// installed a snapshot fetched from the leader (its log no longer holds what came before).
    Snapshot(MetadataSnapshot),
}

impl From<CommittedBatch> for Committed {
    fn from(b: CommittedBatch) -> Self {
        Committed::Batch(b)
    }
}

impl Committed {
    /// The batch, or None for a snapshot.
    pub fn into_batch(self) -> Option<CommittedBatch> {
        match self {
            Committed::Batch(b) => Some(b),
            Committed::Snapshot(_) => None,
        }
    }

    /// The offset after what this event brings the reader to.
    pub fn next_offset(&self) -> u64 {
        match self {
            Committed::Batch(b) => b.next_offset(),
            Committed::Snapshot(s) => s.end_offset,
        }
    }
}

/// Committed batches in offset order, from offset 0 (or from a snapshot): first those committed
/// before [`MetadataLog::subscribe`] was called, then each new one as it commits.
pub struct CommittedBatches {
    backlog: VecDeque<Committed>,
    live: mpsc::Receiver<Committed>,
}

impl CommittedBatches {
    /// A stream of `backlog` followed by what arrives on `live`. For implementations of
    /// [`MetadataLog`].
    pub fn new(backlog: Vec<Committed>, live: mpsc::Receiver<Committed>) -> Self {
        Self {
            backlog: backlog.into(),
            live,
        }
    }

    /// A stream of `backlog` batches followed by what arrives on `live`.
    pub fn from_batches(backlog: Vec<CommittedBatch>, live: mpsc::Receiver<Committed>) -> Self {
        Self::new(backlog.into_iter().map(Committed::Batch).collect(), live)
    }

    /// The next committed batch or snapshot; None once the log is closed.
    pub async fn next(&mut self) -> Option<Committed> {
        if let Some(b) = self.backlog.pop_front() {
            return Some(b);
        }
        self.live.recv().await
    }
}

/// What [`MetadataLog::propose`] returns: resolves with the offset of the last record of the
/// batch once it is committed.
pub type ProposeFuture<'a, T = u64> =
    Pin<Box<dyn Future<Output = Result<T, MetadataLogError>> + Send + 'a>>;

/// The metadata log of a quorum. Implementations: [`FileMetadataLog`] (the legacy one-voter
/// file, read for migration; its offsets count records) and [`RaftMetadataLog`] (KRaft,
/// KIP-595; Raft offsets).
pub trait MetadataLog: Send + Sync {
    /// Appends `records` as one batch (all or none) if this node leads the quorum. The future
    /// resolves once the batch is committed, with the offset of its last record; by then the
    /// batch has been sent to every [`CommittedBatches`] stream.
    ///
    /// # Errors
    /// [`MetadataLogError::NotLeader`] with the leader hint on a node that does not lead;
    /// [`MetadataLogError::Io`] when the batch could not be made durable;
    /// [`MetadataLogError::EmptyBatch`] for no records.
    fn propose(&self, records: Vec<MetadataRecord>) -> ProposeFuture<'_>;

    /// The committed batches from offset 0 (or the latest snapshot first, then the batches
    /// after it, [`Committed::Snapshot`]), then each new one as it commits. Each call gives
    /// an independent stream; a stream that is not read holds back commits once
    /// [`STREAM_CAPACITY_BATCHES`] batches wait in it.
    ///
    /// # Errors
    /// [`MetadataLogError::Io`] when the committed batches cannot be read.
    fn subscribe(&self) -> Result<CommittedBatches, MetadataLogError>;

    /// The offset after the last committed record (the high watermark).
    fn high_watermark(&self) -> u64;

    /// The offset the next proposed batch gets when nothing else is proposed before it (the
    /// log end; Kafka's controller's next write offset: a new broker epoch is the offset of its
    /// `RegisterBrokerRecord`). At least [`MetadataLog::high_watermark`].
    fn next_write_offset(&self) -> u64 {
        self.high_watermark()
    }

    /// True while this node leads the quorum (it may commit); a one-voter log always does.
    /// Only the leader runs the controller's timers (Kafka's active controller).
    fn is_leader(&self) -> bool {
        true
    }
}

/// Committed batches that may wait in one subscriber's stream before commits wait for it.
pub const STREAM_CAPACITY_BATCHES: usize = 64;

/// The quorum epoch of the one-voter file log, which never changes leader.
pub const FILE_LOG_EPOCH: i32 = 1;

/// File name of the metadata log inside its directory.
pub const METADATA_LOG_FILE: &str = "metadata.log";

/// Length of a frame header: length and CRC-32C.
const FRAME_HEADER_BYTES: usize = 8;

/// [`MetadataLog`] in a local file: a one-voter quorum whose only member leads.
pub struct FileMetadataLog {
    path: PathBuf,
    file: Arc<File>,
    /// Serialises appends, and the hand-over of each batch to the subscribers, so streams see
    /// batches in offset order.
    writer: tokio::sync::Mutex<Writer>,
    /// What is committed and who must hear of it, changed together so a new subscriber gets
    /// every batch exactly once (from the file or from its channel).
    shared: parking_lot::Mutex<Shared>,
}

struct Writer {
    /// Length of the valid prefix of the file: where the next frame goes.
    len: u64,
    next_offset: u64,
}

struct Shared {
    committed_len: u64,
    high_watermark: u64,
    subscribers: Vec<mpsc::Sender<Committed>>,
}

impl FileMetadataLog {
    /// Opens (creating if missing) `<dir>/metadata.log`, truncating a torn or corrupt tail.
    ///
    /// # Errors
    /// [`MetadataLogError::Io`] when the directory or file cannot be created or read.
    pub fn open(dir: &Path) -> Result<Self, MetadataLogError> {
        let path = dir.join(METADATA_LOG_FILE);
        let io = |context: &'static str| {
            let path = path.clone();
            move |source| MetadataLogError::Io {
                path,
                context,
                source,
            }
        };
        std::fs::create_dir_all(dir).map_err(io("creating directory"))?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io("opening"))?;
        let mut data = Vec::new();
        file.read_to_end(&mut data).map_err(io("reading"))?;
        let (batches, valid_len) = decode_frames(&data);
        if valid_len < data.len() {
            tracing::warn!(
                path = %path.display(),
                kept_bytes = valid_len,
                dropped_bytes = data.len() - valid_len,
                "metadata log had a torn or corrupt tail (unclean shutdown during an append); truncated it"
            );
            file.set_len(valid_len as u64).map_err(io("truncating"))?;
            file.sync_all().map_err(io("syncing"))?;
        }
        let next_offset = batches.last().map_or(0, CommittedBatch::next_offset);
        Ok(Self {
            path,
            file: Arc::new(file),
            writer: tokio::sync::Mutex::new(Writer {
                len: valid_len as u64,
                next_offset,
            }),
            shared: parking_lot::Mutex::new(Shared {
                committed_len: valid_len as u64,
                high_watermark: next_offset,
                subscribers: Vec::new(),
            }),
        })
    }

    /// Every committed record in order (for tools and tests; nodes use
    /// [`MetadataLog::subscribe`]).
    ///
    /// # Errors
    /// [`MetadataLogError::Io`] on I/O errors.
    pub fn read_all(&self) -> Result<Vec<MetadataRecord>, MetadataLogError> {
        let committed_len = self.shared.lock().committed_len;
        Ok(self
            .read_committed(committed_len)?
            .into_iter()
            .flat_map(|b| b.records.iter().cloned().collect::<Vec<_>>())
            .collect())
    }

    fn read_committed(&self, committed_len: u64) -> Result<Vec<CommittedBatch>, MetadataLogError> {
        let mut data = vec![0u8; usize::try_from(committed_len).unwrap_or(usize::MAX)];
        self.file
            .read_exact_at(&mut data, 0)
            .map_err(|source| MetadataLogError::Io {
                path: self.path.clone(),
                context: "reading",
                source,
            })?;
        Ok(decode_frames(&data).0)
    }
}

/// Decodes the frames of a metadata log file: the committed batches of the valid prefix (the
/// file log's epoch, offsets counted from 0), and that prefix's length in bytes. Decoding stops
/// at the first torn, corrupt or undecodable frame. A pure function of the bytes, for recovery
/// and for fuzzing.
pub fn decode_frames(data: &[u8]) -> (Vec<CommittedBatch>, usize) {
    let mut out = Vec::new();
    let mut pos = 0;
    let mut next_offset = 0u64;
    while data.len() - pos >= FRAME_HEADER_BYTES {
        let len =
            u32::from_be_bytes([data[pos], data[pos + 1], data[pos + 2], data[pos + 3]]) as usize;
        let crc = u32::from_be_bytes([data[pos + 4], data[pos + 5], data[pos + 6], data[pos + 7]]);
        let Some(body) = data.get(pos + FRAME_HEADER_BYTES..pos + FRAME_HEADER_BYTES + len) else {
            break;
        };
        if crc32c::crc32c(body) != crc {
            break;
        }
        let Some(records) = decode_body(body, next_offset) else {
            break;
        };
        // Old files may hold empty frames; they commit nothing and take no offset.
        if !records.is_empty() {
            let batch = CommittedBatch {
                base_offset: next_offset,
                epoch: FILE_LOG_EPOCH,
                records: records.into(),
            };
            next_offset = batch.next_offset();
            out.push(batch);
        }
        pos += FRAME_HEADER_BYTES + len;
    }
    (out, pos)
}

/// The first byte of a frame body of KIP-631 records (a JSON body starts with `[`).
const KIP631_BODY: u8 = 0;

/// The records of one frame body (the first at `offset`); None when it is not one.
fn decode_body(body: &[u8], offset: u64) -> Option<Vec<MetadataRecord>> {
    match body.split_first() {
        Some((&KIP631_BODY, mut rest)) => {
            let mut records = Vec::new();
            while !rest.is_empty() {
                let len = rest.get(..4)?;
                let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
                // Bounded by the bytes of the body before anything is read.
                let value = rest.get(4..4usize.checked_add(len)?)?;
                records.push(decode_record(value).ok()?);
                rest = &rest[4 + len..];
            }
            Some(records)
        }
        _ => {
            let legacy = serde_json::from_slice::<Vec<LegacyMetadataRecord>>(body).ok()?;
            Some(from_legacy(&legacy, offset))
        }
    }
}

/// Every record in the valid prefix of a metadata log file, in order (see [`decode_frames`]).
pub fn scan(data: &[u8]) -> (Vec<MetadataRecord>, usize) {
    let (batches, len) = decode_frames(data);
    let records = batches
        .iter()
        .flat_map(|b| b.records.iter().cloned())
        .collect();
    (records, len)
}

/// One frame holding `records`, as [`FileMetadataLog`] appends it.
///
/// # Errors
/// [`MetadataLogError::Encode`] when a record cannot be serialised (a bug).
pub fn encode_frame(records: &[MetadataRecord]) -> Result<Vec<u8>, MetadataLogError> {
    let mut body = vec![KIP631_BODY];
    for r in records {
        let value = encode_record(r).map_err(|e| MetadataLogError::Encode(e.to_string()))?;
        let len = u32::try_from(value.len())
            .map_err(|_| MetadataLogError::Encode(format!("record of {} bytes", value.len())))?;
        body.extend_from_slice(&len.to_be_bytes());
        body.extend_from_slice(&value);
    }
    let len = u32::try_from(body.len())
        .map_err(|_| MetadataLogError::Encode(format!("batch of {} bytes", body.len())))?;
    let mut buf = Vec::with_capacity(body.len() + FRAME_HEADER_BYTES);
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    buf.extend_from_slice(&body);
    Ok(buf)
}

impl MetadataLog for FileMetadataLog {
    fn propose(&self, records: Vec<MetadataRecord>) -> ProposeFuture<'_> {
        Box::pin(async move {
            if records.is_empty() {
                return Err(MetadataLogError::EmptyBatch);
            }
            let frame = encode_frame(&records)?;
            let mut writer = self.writer.lock().await;
            let at = writer.len;
            let file = self.file.clone();
            let written = tokio::task::spawn_blocking(move || {
                // Positional write at the end of the valid prefix: a failed append leaves no
                // partial frame in front of the next one.
                let r = file
                    .write_all_at(&frame, at)
                    .map_err(|e| ("appending", e))
                    .and_then(|()| file.sync_data().map_err(|e| ("syncing", e)));
                if r.is_err() {
                    let _ = file.set_len(at);
                }
                r.map(|()| frame.len() as u64)
            })
            .await
            .map_err(|e| ("appending", io::Error::other(e.to_string())))
            .and_then(|r| r);
            let frame_len = written.map_err(|(context, source)| MetadataLogError::Io {
                path: self.path.clone(),
                context,
                source,
            })?;
            writer.len += frame_len;
            let batch = CommittedBatch {
                base_offset: writer.next_offset,
                epoch: FILE_LOG_EPOCH,
                records: records.into(),
            };
            writer.next_offset = batch.next_offset();
            let subscribers = {
                let mut shared = self.shared.lock();
                shared.committed_len = writer.len;
                shared.high_watermark = writer.next_offset;
                shared.subscribers.retain(|s| !s.is_closed());
                shared.subscribers.clone()
            };
            // Still under the writer lock: the next batch is handed over after this one.
            for s in subscribers {
                let _ = s.send(Committed::Batch(batch.clone())).await;
            }
            Ok(batch.last_offset())
        })
    }

    fn subscribe(&self) -> Result<CommittedBatches, MetadataLogError> {
        let (tx, rx) = mpsc::channel(STREAM_CAPACITY_BATCHES);
        let committed_len = {
            let mut shared = self.shared.lock();
            shared.subscribers.push(tx);
            shared.committed_len
        };
        // Batches committed after the lock above arrive on the channel; those before are in
        // the file's first `committed_len` bytes.
        let backlog = self.read_committed(committed_len)?;
        Ok(CommittedBatches::from_batches(backlog, rx))
    }

    fn high_watermark(&self) -> u64 {
        self.shared.lock().high_watermark
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_protocol::metadata_records::{ConfigRecord, ProducerIdsRecord};

    fn rec(i: usize) -> MetadataRecord {
        ConfigRecord {
            resource_type: crate::record::ConfigResource::Topic.resource_type(),
            resource_name: format!("t{i}"),
            name: "retention.ms".into(),
            value: Some(i.to_string()),
            ..ConfigRecord::default()
        }
        .into()
    }

    #[tokio::test]
    async fn records_survive_reopen_and_torn_tail_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = FileMetadataLog::open(dir.path()).unwrap();
            assert_eq!(log.propose(vec![rec(1), rec(2)]).await.unwrap(), 1);
            assert_eq!(log.propose(vec![rec(3)]).await.unwrap(), 2);
        }
        let path = dir.path().join(METADATA_LOG_FILE);
        let full = std::fs::read(&path).unwrap();
        for cut in 0..full.len() {
            std::fs::write(&path, &full[..cut]).unwrap();
            let log = FileMetadataLog::open(dir.path()).unwrap();
            let got = log.read_all().unwrap();
            assert!(matches!(got.len(), 0 | 2 | 3), "atomic groups");
            assert_eq!(got, (1..=got.len()).map(rec).collect::<Vec<_>>());
            assert_eq!(log.high_watermark(), got.len() as u64);
            let offset = log.propose(vec![rec(got.len() + 1)]).await.unwrap();
            assert_eq!(
                offset,
                got.len() as u64,
                "appends continue after the kept prefix"
            );
            assert_eq!(log.read_all().unwrap().len(), got.len() + 1);
        }
    }

    #[tokio::test]
    async fn stream_gives_backlog_then_live_batches_in_offset_order() {
        let dir = tempfile::tempdir().unwrap();
        let log = FileMetadataLog::open(dir.path()).unwrap();
        log.propose(vec![rec(1), rec(2)]).await.unwrap();
        let mut early = log.subscribe().unwrap();
        log.propose(vec![rec(3)]).await.unwrap();
        let mut late = log.subscribe().unwrap();
        log.propose(vec![rec(4), rec(5), rec(6)]).await.unwrap();
        assert!(
            log.propose(vec![]).await.is_err(),
            "empty batches are refused"
        );
        for stream in [&mut early, &mut late] {
            let mut expected_offset = 0;
            let mut seen = Vec::new();
            for _ in 0..3 {
                let b = stream.next().await.unwrap().into_batch().unwrap();
                assert_eq!(b.base_offset, expected_offset, "no gap, no duplicate");
                assert_eq!(b.epoch, FILE_LOG_EPOCH);
                expected_offset = b.next_offset();
                seen.extend(b.records.iter().cloned());
            }
            assert_eq!(seen, (1..=6).map(rec).collect::<Vec<_>>());
        }
        assert_eq!(log.high_watermark(), 6);
        // Reopening replays the same batches, with the same offsets.
        drop(log);
        let log = FileMetadataLog::open(dir.path()).unwrap();
        let mut s = log.subscribe().unwrap();
        let offsets: Vec<_> = [
            s.next().await.unwrap().into_batch().unwrap(),
            s.next().await.unwrap().into_batch().unwrap(),
            s.next().await.unwrap().into_batch().unwrap(),
        ]
        .iter()
        .map(|b| (b.base_offset, b.last_offset()))
        .collect();
        assert_eq!(offsets, vec![(0, 1), (2, 2), (3, 5)]);
    }

    #[tokio::test]
    async fn concurrent_proposals_reach_the_stream_in_commit_order() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(FileMetadataLog::open(dir.path()).unwrap());
        let mut stream = log.subscribe().unwrap();
        let mut tasks = Vec::new();
        for i in 0..20 {
            let log = log.clone();
            tasks.push(tokio::spawn(async move { log.propose(vec![rec(i)]).await }));
        }
        let mut committed = Vec::new();
        for t in tasks {
            committed.push(t.await.unwrap().unwrap());
        }
        committed.sort_unstable();
        assert_eq!(committed, (0..20).collect::<Vec<u64>>());
        for expected in 0..20 {
            assert_eq!(
                stream
                    .next()
                    .await
                    .unwrap()
                    .into_batch()
                    .unwrap()
                    .base_offset,
                expected
            );
        }
    }

    /// A frame as the synchronous `append` of earlier versions wrote it.
    fn old_frame(json: &str) -> Vec<u8> {
        let mut out = (json.len() as u32).to_be_bytes().to_vec();
        out.extend(crc32c::crc32c(json.as_bytes()).to_be_bytes());
        out.extend(json.as_bytes());
        out
    }

    #[tokio::test]
    async fn files_of_earlier_versions_still_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut data = old_frame(
            r#"[{"type":"RegisterBroker","broker_id":1,"host":"localhost","port":9092,"rack":null}]"#,
        );
        data.extend(old_frame(
            r#"[{"type":"ProducerIds","broker_id":1,"next_producer_id":1000},{"type":"Config","resource":"Broker","resource_name":"","name":"log.cleaner.threads","value":"2"}]"#,
        ));
        std::fs::write(dir.path().join(METADATA_LOG_FILE), &data).unwrap();
        let log = FileMetadataLog::open(dir.path()).unwrap();
        assert_eq!(log.high_watermark(), 3);
        let mut s = log.subscribe().unwrap();
        assert_eq!(s.next().await.unwrap().into_batch().unwrap().base_offset, 0);
        let second = s.next().await.unwrap().into_batch().unwrap();
        assert_eq!((second.base_offset, second.last_offset()), (1, 2));
        assert_eq!(
            second.records[0],
            MetadataRecord::ProducerIds(ProducerIdsRecord {
                broker_id: 1,
                broker_epoch: -1,
                next_producer_id: 1000,
                ..ProducerIdsRecord::default()
            })
        );
        // The legacy registration became Kafka's, with its offset as broker epoch.
        let MetadataRecord::RegisterBroker(b) = &s_first(dir.path()).await else {
            panic!("a broker registration")
        };
        assert_eq!((b.broker_id, b.broker_epoch, b.fenced), (1, 0, true));
        assert_eq!(b.end_points[0].host, "localhost");
        assert_eq!(log.propose(vec![rec(1)]).await.unwrap(), 3);
    }

    async fn s_first(dir: &Path) -> MetadataRecord {
        let log = FileMetadataLog::open(dir).unwrap();
        let mut s = log.subscribe().unwrap();
        s.next().await.unwrap().into_batch().unwrap().records[0].clone()
    }

    #[test]
    fn decode_frames_stops_at_the_first_bad_frame() {
        let mut data = encode_frame(&[rec(1), rec(2)]).unwrap();
        data.extend(encode_frame(&[rec(3)]).unwrap());
        let (batches, len) = decode_frames(&data);
        assert_eq!(len, data.len());
        assert_eq!(batches.len(), 2);
        assert_eq!(batches[1].base_offset, 2);
        assert_eq!(scan(&data).0, vec![rec(1), rec(2), rec(3)]);
        // A frame that claims more bytes than there are stops decoding without allocating.
        let mut huge = u32::MAX.to_be_bytes().to_vec();
        huge.extend([0; 8]);
        assert_eq!(decode_frames(&huge), (vec![], 0));
    }
}

/// How many recent committed data batches [`RaftMetadataLog`] remembers (by Raft last offset)
/// for proposals that commit before their caller asks.
const RECENT_BATCHES: usize = 4096;

/// [`MetadataLog`] on the KRaft quorum (KIP-595): `__cluster_metadata-0` replicated by a
/// [`gregor_raft::driver::RaftManager`], one record value per [`MetadataRecord`]
/// ([`crate::codec`]).
///
/// Offsets are the Raft log's: a [`CommittedBatch`] starts at its batch's base offset in
/// `__cluster_metadata-0`, so control batches (LeaderChange, one per epoch) leave gaps between
/// committed batches, as in Kafka (a broker epoch is the offset of its `RegisterBrokerRecord`).
/// A committed batch is decoded once, by a distributor task that feeds every subscriber; the
/// latest snapshot and the batches committed after it are kept in memory for new subscribers.
/// A record that does not decode is logged and replaced by a `NoOpRecord`, so offsets stay
/// the log's.
pub struct RaftMetadataLog {
    manager: Arc<gregor_raft::driver::RaftManager>,
    shared: Arc<parking_lot::Mutex<RaftShared>>,
    position: tokio::sync::watch::Receiver<i64>,
    distributor: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct RaftShared {
    /// The latest snapshot delivered or written, and the batches committed after it.
    snapshot: Option<MetadataSnapshot>,
    history: Vec<CommittedBatch>,
    /// The offset after the last metadata record (or snapshot) distributed: the metadata high
    /// watermark ([`MetadataLog::high_watermark`]).
    next_offset: u64,
    /// Raft offset after the last distributed data batch or snapshot.
    raft_next: i64,
    /// Raft last offsets of recently distributed data batches.
    recent: std::collections::BTreeSet<i64>,
    /// Proposals by Raft last offset, answered true once their batch is distributed.
    waiters: std::collections::BTreeMap<i64, Vec<tokio::sync::oneshot::Sender<bool>>>,
    subscribers: Vec<mpsc::Sender<Committed>>,
    closed: bool,
}

impl RaftShared {
    fn close(&mut self) {
        self.closed = true;
        self.subscribers.clear();
        for (_, ws) in std::mem::take(&mut self.waiters) {
            for w in ws {
                let _ = w.send(false);
            }
        }
    }

    /// Answers the proposals below `raft_next`: true when `committed` says their batch is in.
    fn answer_waiters(&mut self, committed: impl Fn(&Self, i64) -> bool) {
        while let Some(entry) = self.waiters.first_entry() {
            if *entry.key() >= self.raft_next {
                break;
            }
            let (offset, ws) = entry.remove_entry();
            let answer = committed(self, offset);
            for w in ws {
                let _ = w.send(answer);
            }
        }
    }
}

/// Writes snapshots of the metadata image (implemented by [`RaftMetadataLog`]; used by
/// [`crate::snapshot::SnapshotGenerator`]).
pub trait SnapshotSink: Send + Sync {
    /// Writes `snapshot` as the log's snapshot `<end_offset>-<epoch>.checkpoint` and lets the
    /// log apply its retention. Resolves with false when the log already had a snapshot at or
    /// past `end_offset`.
    ///
    /// # Errors
    /// [`MetadataLogError::Encode`] when a record cannot be serialised or the log refuses the
    /// snapshot (an id above the high watermark or with the wrong epoch);
    /// [`MetadataLogError::Closed`].
    fn write_snapshot(&self, snapshot: MetadataSnapshot) -> ProposeFuture<'_, bool>;
}

impl RaftMetadataLog {
    /// The error for a quorum member that is gone: [`MetadataLogError::Stopped`] with its
    /// storage error when it stopped on one, [`MetadataLogError::Closed`] otherwise.
    fn closed(&self) -> MetadataLogError {
        self.manager
            .failure()
            .map_or(MetadataLogError::Closed, MetadataLogError::Stopped)
    }

    /// The log over `manager`: starts the distributor task (on the current runtime) reading
    /// the committed batches from the latest snapshot (or the start) of the Raft log.
    pub fn start(manager: Arc<gregor_raft::driver::RaftManager>) -> Self {
        let shared = Arc::new(parking_lot::Mutex::new(RaftShared::default()));
        let stream = manager.committed(0);
        let position = stream.position();
        let distributor = tokio::spawn(distribute(stream, shared.clone()));
        Self {
            manager,
            shared,
            position,
            distributor,
        }
    }

    /// The quorum member under this log.
    pub fn manager(&self) -> &Arc<gregor_raft::driver::RaftManager> {
        &self.manager
    }

    /// Waits until the quorum's high watermark is known and every batch below it has been
    /// distributed: what this node must apply before it serves (Kafka's broker waits to catch
    /// up with the metadata log before it starts). Returns [`MetadataLog::high_watermark`].
    ///
    /// # Errors
    /// [`MetadataLogError::Closed`] when the quorum stops first ([`MetadataLogError::Stopped`]
    /// when it stopped on a storage error).
    pub async fn catch_up(&self) -> Result<u64, MetadataLogError> {
        let mut hw = self.manager.high_watermark();
        let target = *hw.wait_for(|&h| h >= 0).await.map_err(|_| self.closed())?;
        let mut position = self.position.clone();
        position
            .wait_for(|&p| p >= target)
            .await
            .map_err(|_| self.closed())?;
        Ok(self.high_watermark())
    }

    /// Waits until every batch below Raft offset `raft_offset` (another node's high
    /// watermark, say the active controller's) has been committed here and distributed, and
    /// returns the metadata offset ([`MetadataLog::high_watermark`]) the loader must reach to
    /// have applied them.
    ///
    /// # Errors
    /// [`MetadataLogError::Closed`] when the quorum stops first.
    pub async fn wait_for_raft_offset(&self, raft_offset: i64) -> Result<u64, MetadataLogError> {
        let mut position = self.position.clone();
        position
            .wait_for(|&p| p >= raft_offset)
            .await
            .map_err(|_| self.closed())?;
        Ok(self.high_watermark())
    }

    /// Stops the quorum member (a leader resigns; the log is closed cleanly) and the
    /// distributor; open streams end.
    pub async fn shutdown(&self) {
        self.manager.shutdown().await;
        self.distributor.abort();
        self.shared.lock().close();
    }
}

/// Decodes record values; an undecodable one is logged and becomes a `NoOpRecord` (it takes its
/// offset and changes nothing).
fn decode_values(values: &[bytes::Bytes], base_offset: i64) -> Vec<MetadataRecord> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            crate::codec::decode_record(v).unwrap_or_else(|e| {
                tracing::error!(
                    offset = base_offset + i as i64,
                    error = %e,
                    "undecodable metadata record skipped"
                );
                MetadataRecord::NoOp(gregor_protocol::metadata_records::NoOpRecord::default())
            })
        })
        .collect()
}

async fn distribute(
    mut stream: gregor_raft::driver::CommittedStream,
    shared: Arc<parking_lot::Mutex<RaftShared>>,
) {
    loop {
        let event = match stream.next().await {
            Ok(gregor_raft::driver::Committed::Batch(batch)) => {
                let records = decode_values(&batch.values, batch.base_offset);
                if records.is_empty() {
                    continue;
                }
                Committed::Batch(CommittedBatch {
                    base_offset: u64::try_from(batch.base_offset).unwrap_or(0),
                    epoch: batch.epoch,
                    records: records.into(),
                })
            }
            Ok(gregor_raft::driver::Committed::Snapshot(s)) => {
                tracing::info!(
                    end_offset = s.id.offset,
                    epoch = s.id.epoch,
                    records = s.values.len(),
                    "loading the metadata snapshot"
                );
                Committed::Snapshot(MetadataSnapshot {
                    end_offset: u64::try_from(s.id.offset).unwrap_or(0),
                    epoch: s.id.epoch,
                    records: decode_values(&s.values, 0).into(),
                })
            }
            Err(e) => {
                if e != gregor_raft::driver::DriverError::Shutdown {
                    tracing::error!(error = %e, "reading committed metadata failed; the metadata stream stops");
                }
                shared.lock().close();
                return;
            }
        };
        let subscribers = {
            let mut s = shared.lock();
            let next = i64::try_from(event.next_offset()).unwrap_or(i64::MAX);
            s.next_offset = s.next_offset.max(event.next_offset());
            s.raft_next = s.raft_next.max(next);
            match &event {
                Committed::Batch(b) => {
                    s.history.push(b.clone());
                    s.recent.insert(next - 1);
                    while s.recent.len() > RECENT_BATCHES {
                        s.recent.pop_first();
                    }
                    s.answer_waiters(|s, o| s.recent.contains(&o));
                }
                Committed::Snapshot(snap) => {
                    s.history.clear();
                    s.snapshot = Some(snap.clone());
                    // A proposal below a snapshot installed from the leader was committed (the
                    // driver checked it was still in the log at its commit).
                    s.answer_waiters(|_, _| true);
                }
            }
            s.subscribers.retain(|t| !t.is_closed());
            s.subscribers.clone()
        };
        for t in subscribers {
            let _ = t.send(event.clone()).await;
        }
    }
}

impl MetadataLog for RaftMetadataLog {
    fn propose(&self, records: Vec<MetadataRecord>) -> ProposeFuture<'_> {
        Box::pin(async move {
            if records.is_empty() {
                return Err(MetadataLogError::EmptyBatch);
            }
            let values = records
                .iter()
                .map(crate::codec::encode_record)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| MetadataLogError::Encode(e.to_string()))?;
            let raft_last = self.manager.propose(values).await.map_err(|e| match e {
                gregor_raft::driver::DriverError::NotLeader { leader_id, epoch } => {
                    MetadataLogError::NotLeader {
                        leader_id,
                        leader_epoch: epoch,
                    }
                }
                gregor_raft::driver::DriverError::Shutdown => self.closed(),
                gregor_raft::driver::DriverError::Storage(e) => MetadataLogError::Storage(e),
                other => MetadataLogError::Encode(other.to_string()),
            })?;
            let offset = u64::try_from(raft_last).map_err(|_| MetadataLogError::Closed)?;
            let rx = {
                let mut s = self.shared.lock();
                if s.raft_next > raft_last {
                    let below_snapshot = s
                        .snapshot
                        .as_ref()
                        .is_some_and(|snap| snap.end_offset > offset);
                    return if below_snapshot || s.recent.contains(&raft_last) {
                        Ok(offset)
                    } else {
                        Err(MetadataLogError::Closed)
                    };
                }
                if s.closed {
                    return Err(MetadataLogError::Closed);
                }
                let (tx, rx) = tokio::sync::oneshot::channel();
                s.waiters.entry(raft_last).or_default().push(tx);
                rx
            };
            if rx.await.unwrap_or(false) {
                Ok(offset)
            } else {
                Err(MetadataLogError::Closed)
            }
        })
    }

    fn subscribe(&self) -> Result<CommittedBatches, MetadataLogError> {
        let (tx, rx) = mpsc::channel(STREAM_CAPACITY_BATCHES);
        let mut s = self.shared.lock();
        if s.closed {
            return Err(MetadataLogError::Closed);
        }
        s.subscribers.push(tx);
        let backlog = s
            .snapshot
            .iter()
            .cloned()
            .map(Committed::Snapshot)
            .chain(s.history.iter().cloned().map(Committed::Batch))
            .collect();
        Ok(CommittedBatches::new(backlog, rx))
    }

    fn high_watermark(&self) -> u64 {
        self.shared.lock().next_offset
    }

    fn next_write_offset(&self) -> u64 {
        u64::try_from(self.manager.log_end_offset())
            .unwrap_or(0)
            .max(self.high_watermark())
    }

    fn is_leader(&self) -> bool {
        self.manager.leader_and_epoch().borrow().leader_id == Some(self.manager.node_id())
    }
}

impl SnapshotSink for RaftMetadataLog {
    fn write_snapshot(&self, snapshot: MetadataSnapshot) -> ProposeFuture<'_, bool> {
        Box::pin(async move {
            let values = snapshot
                .records
                .iter()
                .map(crate::codec::encode_record)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| MetadataLogError::Encode(e.to_string()))?;
            let id = gregor_raft::OffsetAndEpoch::new(
                i64::try_from(snapshot.end_offset).unwrap_or(i64::MAX),
                snapshot.epoch,
            );
            let written = self
                .manager
                .write_snapshot(id, values)
                .await
                .map_err(|e| match e {
                    gregor_raft::driver::DriverError::Shutdown => self.closed(),
                    other => MetadataLogError::Encode(other.to_string()),
                })?;
            // New subscribers start from the snapshot; the batches below it are dropped.
            let mut s = self.shared.lock();
            let newer = s
                .snapshot
                .as_ref()
                .is_none_or(|old| old.end_offset < snapshot.end_offset);
            if newer && snapshot.end_offset <= s.next_offset {
                let end = snapshot.end_offset;
                s.history.retain(|b| b.base_offset >= end);
                s.snapshot = Some(snapshot);
            }
            Ok(written)
        })
    }
}

impl Drop for RaftMetadataLog {
    fn drop(&mut self) {
        self.distributor.abort();
    }
}
