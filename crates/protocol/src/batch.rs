//! Record batch v2 (magic 2): a zero-copy view of the 61-byte header, validation, and in-place
//! patching of the fields the broker owns (base offset, partition leader epoch, LogAppendTime).
//!
//! Layout, from the Kafka protocol guide ("Record Batch") and KIP-98:
//!
//! ```text
//! offset  size  field
//!      0     8  baseOffset
//!      8     4  batchLength          (bytes after this field)
//!     12     4  partitionLeaderEpoch
//!     16     1  magic                (2)
//!     17     4  crc                  (CRC-32C of bytes 21..end)
//!     21     2  attributes
//!     23     4  lastOffsetDelta
//!     27     8  baseTimestamp
//!     35     8  maxTimestamp
//!     43     8  producerId
//!     51     2  producerEpoch
//!     53     4  baseSequence
//!     57     4  recordsCount
//!     61     -  records
//! ```
//!
//! Because the CRC covers bytes 21 onward, `baseOffset` and `partitionLeaderEpoch` can be
//! rewritten without recomputing it; setting LogAppendTime changes attributes and maxTimestamp and
//! so requires a new CRC.

use std::borrow::Cow;

use thiserror::Error;

use crate::compression::{compress, CompressionError};

/// Size of the fixed v2 batch header in bytes.
pub const BATCH_HEADER_LEN: usize = 61;
/// Size of `baseOffset` + `batchLength`: the part of the header not counted in `batchLength`.
pub const LOG_OVERHEAD: usize = 12;
/// The only record-batch magic gregor accepts (Kafka 4 dropped v0 and v1 message sets).
pub const MAGIC_V2: i8 = 2;
/// `producerId` of a batch written by a non-idempotent producer.
pub const NO_PRODUCER_ID: i64 = -1;
/// `producerEpoch` of a batch written by a non-idempotent producer.
pub const NO_PRODUCER_EPOCH: i16 = -1;
/// `baseSequence` of a batch written by a non-idempotent producer.
pub const NO_SEQUENCE: i32 = -1;
/// `partitionLeaderEpoch` of a batch that has not been assigned one.
pub const NO_PARTITION_LEADER_EPOCH: i32 = -1;

const OFF_BASE_OFFSET: usize = 0;
const OFF_BATCH_LENGTH: usize = 8;
const OFF_LEADER_EPOCH: usize = 12;
const OFF_MAGIC: usize = 16;
const OFF_CRC: usize = 17;
const OFF_ATTRIBUTES: usize = 21;
const OFF_LAST_OFFSET_DELTA: usize = 23;
const OFF_BASE_TIMESTAMP: usize = 27;
const OFF_MAX_TIMESTAMP: usize = 35;
const OFF_PRODUCER_ID: usize = 43;
const OFF_PRODUCER_EPOCH: usize = 51;
const OFF_BASE_SEQUENCE: usize = 53;
const OFF_RECORDS_COUNT: usize = 57;

const ATTR_COMPRESSION_MASK: i16 = 0x07;
const ATTR_TIMESTAMP_TYPE: i16 = 0x08;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;
const ATTR_DELETE_HORIZON: i16 = 0x40;

pub use crate::compression::Compression;

/// Timestamp type of a batch (attribute bit 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimestampType {
    /// Timestamps set by the producer.
    CreateTime,
    /// Timestamps set by the broker at append (`message.timestamp.type=LogAppendTime`).
    LogAppendTime,
}

/// Why a batch was rejected. The broker maps these to Kafka error codes: `Corrupt` and
/// `CrcMismatch` to CORRUPT_MESSAGE (2), `UnsupportedMagic` to UNSUPPORTED_FOR_MESSAGE_FORMAT
/// (43) or CORRUPT_MESSAGE, `Invalid` to INVALID_RECORD (87).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// Fewer bytes than the header or than `batchLength` announces.
    #[error("truncated record batch: need {needed} bytes, have {available}")]
    Truncated {
        /// Bytes the batch needs.
        needed: usize,
        /// Bytes present.
        available: usize,
    },
    /// A structural field is impossible (negative length, bad count, ...).
    #[error("corrupt record batch: {0}")]
    Corrupt(String),
    /// The stored CRC does not match the CRC-32C of the batch.
    #[error("record batch CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch {
        /// CRC in the header.
        stored: u32,
        /// CRC computed over bytes 21..end.
        computed: u32,
    },
    /// Magic other than 2.
    #[error("unsupported record batch magic {0} (only magic 2 is supported)")]
    UnsupportedMagic(i8),
    /// Well-formed but violates a rule (e.g. offsets not matching the record count).
    #[error("invalid record batch: {0}")]
    Invalid(String),
}

fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn i64_at(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

/// The decoded fixed header of one v2 record batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// First offset of the batch.
    pub base_offset: i64,
    /// Bytes after the `batchLength` field; the whole batch is `batch_length + 12` bytes.
    pub batch_length: i32,
    /// Leader epoch of the leader that appended the batch.
    pub partition_leader_epoch: i32,
    /// Format version (2).
    pub magic: i8,
    /// CRC-32C of bytes 21..end.
    pub crc: u32,
    /// Raw attributes.
    pub attributes: i16,
    /// `lastOffset - baseOffset`.
    pub last_offset_delta: i32,
    /// Timestamp of the first record (ms since epoch).
    pub base_timestamp: i64,
    /// Largest record timestamp (ms since epoch), or the append time for LogAppendTime.
    pub max_timestamp: i64,
    /// Producer id, -1 if not idempotent.
    pub producer_id: i64,
    /// Producer epoch, -1 if not idempotent.
    pub producer_epoch: i16,
    /// Sequence of the first record, -1 if not idempotent.
    pub base_sequence: i32,
    /// Number of records.
    pub records_count: i32,
}

impl BatchHeader {
    /// Parses the header at the start of `buf`. Only checks that 61 bytes are present; use
    /// [`validate_batch`] for a full check.
    ///
    /// # Errors
    /// [`BatchError::Truncated`] when `buf` is shorter than the header.
    pub fn parse(buf: &[u8]) -> Result<Self, BatchError> {
        if buf.len() < BATCH_HEADER_LEN {
            return Err(BatchError::Truncated {
                needed: BATCH_HEADER_LEN,
                available: buf.len(),
            });
        }
        Ok(Self {
            base_offset: i64_at(buf, OFF_BASE_OFFSET),
            batch_length: i32_at(buf, OFF_BATCH_LENGTH),
            partition_leader_epoch: i32_at(buf, OFF_LEADER_EPOCH),
            magic: buf[OFF_MAGIC] as i8,
            crc: u32_at(buf, OFF_CRC),
            attributes: i16_at(buf, OFF_ATTRIBUTES),
            last_offset_delta: i32_at(buf, OFF_LAST_OFFSET_DELTA),
            base_timestamp: i64_at(buf, OFF_BASE_TIMESTAMP),
            max_timestamp: i64_at(buf, OFF_MAX_TIMESTAMP),
            producer_id: i64_at(buf, OFF_PRODUCER_ID),
            producer_epoch: i16_at(buf, OFF_PRODUCER_EPOCH),
            base_sequence: i32_at(buf, OFF_BASE_SEQUENCE),
            records_count: i32_at(buf, OFF_RECORDS_COUNT),
        })
    }

    /// Total size of the batch in bytes (`batch_length + 12`).
    pub fn total_size(&self) -> usize {
        self.batch_length as usize + LOG_OVERHEAD
    }

    /// `base_offset + last_offset_delta`, wrapping on overflow as Kafka's
    /// `DefaultRecordBatch.lastOffset` does (Java arithmetic): the header is unvalidated input
    /// and a `baseOffset` near `i64::MAX` must not panic.
    pub fn last_offset(&self) -> i64 {
        self.base_offset
            .wrapping_add(i64::from(self.last_offset_delta))
    }

    /// Offset after the batch (wrapping, as [`BatchHeader::last_offset`]).
    pub fn next_offset(&self) -> i64 {
        self.last_offset().wrapping_add(1)
    }

    /// Codec from attribute bits 0-2, `None` if the bits hold an undefined codec.
    pub fn compression(&self) -> Option<Compression> {
        Compression::from_id(self.attributes & ATTR_COMPRESSION_MASK)
    }

    /// Timestamp type from attribute bit 3.
    pub fn timestamp_type(&self) -> TimestampType {
        if self.attributes & ATTR_TIMESTAMP_TYPE != 0 {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        }
    }

    /// Attribute bit 4 (KIP-98).
    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }

    /// Attribute bit 5: a transaction marker batch.
    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }

    /// Attribute bit 6: `base_timestamp` holds the delete horizon (KIP-534).
    pub fn has_delete_horizon(&self) -> bool {
        self.attributes & ATTR_DELETE_HORIZON != 0
    }

    /// True when the batch carries a producer id (idempotent or transactional producer).
    pub fn has_producer_id(&self) -> bool {
        self.producer_id >= 0
    }

    /// Sequence of the last record, wrapping at `i32::MAX` as Kafka does.
    pub fn last_sequence(&self) -> i32 {
        if self.base_sequence == NO_SEQUENCE {
            return NO_SEQUENCE;
        }
        let last = i64::from(self.base_sequence) + i64::from(self.last_offset_delta);
        if last > i64::from(i32::MAX) {
            (last - i64::from(i32::MAX) - 1) as i32
        } else {
            last as i32
        }
    }
}

/// Computes the CRC-32C the header of `batch` should hold (bytes 21..end).
pub fn compute_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(&batch[OFF_ATTRIBUTES..])
}

/// Validates one complete batch that starts at `buf[0]` and returns its header.
///
/// Checks: enough bytes for the header and for `batchLength`, magic 2, CRC-32C, a defined
/// codec, `recordsCount >= 0`, `lastOffsetDelta` consistent with the record count
/// (`recordsCount - 1` for a batch the producer built; Kafka's `LogValidator` rejects others with
/// INVALID_RECORD), and `batchLength` at least the header size.
///
/// # Errors
/// The first [`BatchError`] found.
pub fn validate_batch(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    let h = BatchHeader::parse(buf)?;
    if h.batch_length < (BATCH_HEADER_LEN - LOG_OVERHEAD) as i32 {
        return Err(BatchError::Corrupt(format!(
            "batch length {} is smaller than the v2 header",
            h.batch_length
        )));
    }
    if h.magic != MAGIC_V2 {
        return Err(BatchError::UnsupportedMagic(h.magic));
    }
    let total = h.total_size();
    if buf.len() < total {
        return Err(BatchError::Truncated {
            needed: total,
            available: buf.len(),
        });
    }
    let computed = compute_crc(&buf[..total]);
    if computed != h.crc {
        return Err(BatchError::CrcMismatch {
            stored: h.crc,
            computed,
        });
    }
    if h.compression().is_none() {
        return Err(BatchError::Corrupt(format!(
            "unknown compression codec id {}",
            h.attributes & ATTR_COMPRESSION_MASK
        )));
    }
    if h.records_count < 0 {
        return Err(BatchError::Corrupt(format!(
            "negative record count {}",
            h.records_count
        )));
    }
    if h.records_count == 0 {
        return Err(BatchError::Invalid("batch has no records".into()));
    }
    if h.last_offset_delta != h.records_count - 1 {
        return Err(BatchError::Invalid(format!(
            "last offset delta {} does not match record count {}",
            h.last_offset_delta, h.records_count
        )));
    }
    Ok(h)
}

/// Iterates over the batches laid end to end in a buffer (a produce request's `records`, or a
/// range read from a segment). Yields `(position, header)`; stops at the end of the buffer.
/// A trailing partial batch yields [`BatchError::Truncated`] once, then the iterator ends.
/// Headers are parsed, not validated: call [`validate_batch`] on each where needed.
pub struct Batches<'a> {
    buf: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> Batches<'a> {
    /// Starts at the beginning of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self {
            buf,
            pos: 0,
            done: false,
        }
    }
}

impl Iterator for Batches<'_> {
    type Item = Result<(usize, BatchHeader), BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.pos >= self.buf.len() {
            return None;
        }
        let rest = &self.buf[self.pos..];
        let h = match BatchHeader::parse(rest) {
            Ok(h) => h,
            Err(e) => {
                self.done = true;
                return Some(Err(e));
            }
        };
        if h.batch_length < (BATCH_HEADER_LEN - LOG_OVERHEAD) as i32 {
            self.done = true;
            return Some(Err(BatchError::Corrupt(format!(
                "batch length {} is smaller than the v2 header",
                h.batch_length
            ))));
        }
        let total = h.total_size();
        if rest.len() < total {
            self.done = true;
            return Some(Err(BatchError::Truncated {
                needed: total,
                available: rest.len(),
            }));
        }
        let at = self.pos;
        self.pos += total;
        Some(Ok((at, h)))
    }
}

/// Rewrites `baseOffset` in place (not covered by the CRC).
pub fn set_base_offset(batch: &mut [u8], base_offset: i64) {
    batch[OFF_BASE_OFFSET..OFF_BASE_OFFSET + 8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Rewrites `partitionLeaderEpoch` in place (not covered by the CRC).
pub fn set_partition_leader_epoch(batch: &mut [u8], epoch: i32) {
    batch[OFF_LEADER_EPOCH..OFF_LEADER_EPOCH + 4].copy_from_slice(&epoch.to_be_bytes());
}

/// Marks the batch LogAppendTime with `append_time_ms` as its max timestamp and recomputes the
/// CRC, as Kafka's `LogValidator` does for `message.timestamp.type=LogAppendTime`.
pub fn set_log_append_time(batch: &mut [u8], append_time_ms: i64) {
    let attrs = i16_at(batch, OFF_ATTRIBUTES) | ATTR_TIMESTAMP_TYPE;
    batch[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attrs.to_be_bytes());
    batch[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8].copy_from_slice(&append_time_ms.to_be_bytes());
    let crc = compute_crc(batch);
    batch[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Builds the raw bytes of a v2 batch, uncompressed unless [`BatchBuilder::compression`] says
/// otherwise. Meant for tests and for the broker's own internal writes (e.g. control records,
/// re-compression); clients build their own batches.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    base_offset: i64,
    base_timestamp: i64,
    max_timestamp: i64,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    attributes: i16,
    records: Vec<u8>,
    count: i32,
    next_offset_delta: i32,
    last_offset_delta: i32,
    compression: Compression,
}

/// A header of one record (key and value are raw bytes; `None` is a null value).
pub type RecordHeader = (String, Option<Vec<u8>>);

impl BatchBuilder {
    /// An empty batch starting at `base_offset` whose first record has `base_timestamp` (ms).
    pub fn new(base_offset: i64, base_timestamp: i64) -> Self {
        Self {
            base_offset,
            base_timestamp,
            max_timestamp: base_timestamp,
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            base_sequence: NO_SEQUENCE,
            attributes: 0,
            records: Vec::new(),
            count: 0,
            next_offset_delta: 0,
            last_offset_delta: 0,
            compression: Compression::None,
        }
    }

    /// Sets the idempotent-producer fields.
    pub fn producer(mut self, producer_id: i64, producer_epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = producer_id;
        self.producer_epoch = producer_epoch;
        self.base_sequence = base_sequence;
        self
    }

    /// Sets the transactional (bit 4) and control (bit 5) attributes.
    pub fn transactional(mut self, transactional: bool, control: bool) -> Self {
        if transactional {
            self.attributes |= ATTR_TRANSACTIONAL;
        }
        if control {
            self.attributes |= ATTR_CONTROL;
        }
        self
    }

    /// Compresses the records section with `codec` and sets attribute bits 0-2 accordingly.
    /// The default is [`Compression::None`].
    pub fn compression(mut self, codec: Compression) -> Self {
        self.compression = codec;
        self
    }

    /// Appends a record with the given timestamp (ms), key, value and headers, at the offset
    /// delta after the previous record's (0 for the first).
    pub fn record(
        self,
        timestamp_ms: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[RecordHeader],
    ) -> Self {
        let offset_delta = self.next_offset_delta;
        self.record_at_offset_delta(offset_delta, timestamp_ms, key, value, headers)
    }

    /// Appends a record at an explicit `offset_delta`, as in a compacted batch whose offsets
    /// have gaps. The caller keeps offset deltas increasing; the batch's `lastOffsetDelta` is
    /// the last record's.
    pub fn record_at_offset_delta(
        mut self,
        offset_delta: i32,
        timestamp_ms: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[RecordHeader],
    ) -> Self {
        let mut body = Vec::new();
        body.push(0u8); // attributes
        put_varlong(&mut body, timestamp_ms - self.base_timestamp);
        put_varint(&mut body, offset_delta);
        put_bytes(&mut body, key);
        put_bytes(&mut body, value);
        put_varint(&mut body, headers.len() as i32);
        for (k, v) in headers {
            put_bytes(&mut body, Some(k.as_bytes()));
            put_bytes(&mut body, v.as_deref());
        }
        put_varint(&mut self.records, body.len() as i32);
        self.records.extend_from_slice(&body);
        self.count += 1;
        self.last_offset_delta = offset_delta;
        self.next_offset_delta = offset_delta.wrapping_add(1);
        self.max_timestamp = self.max_timestamp.max(timestamp_ms);
        self
    }

    /// The finished batch, CRC included, compressed with the configured codec. Should the codec
    /// fail (only possible for a records section over 4 GiB with snappy, or out of memory), the
    /// batch is built uncompressed instead; use [`BatchBuilder::try_build`] to see the error.
    pub fn build(self) -> Vec<u8> {
        match self.encode(self.compression) {
            Ok(b) => b,
            Err(_) => self.encode(Compression::None).unwrap_or_default(),
        }
    }

    /// The finished batch, CRC included, compressed with the configured codec.
    ///
    /// # Errors
    /// [`CompressionError`] if the codec fails.
    pub fn try_build(self) -> Result<Vec<u8>, CompressionError> {
        self.encode(self.compression)
    }

    fn encode(&self, codec: Compression) -> Result<Vec<u8>, CompressionError> {
        let section: Cow<'_, [u8]> = match codec {
            Compression::None => Cow::Borrowed(&self.records),
            _ => Cow::Owned(compress(codec, &self.records)?),
        };
        let attributes = (self.attributes & !ATTR_COMPRESSION_MASK) | codec.id();
        let mut b = Vec::with_capacity(BATCH_HEADER_LEN + section.len());
        b.extend_from_slice(&self.base_offset.to_be_bytes());
        let batch_length = (BATCH_HEADER_LEN - LOG_OVERHEAD + section.len()) as i32;
        b.extend_from_slice(&batch_length.to_be_bytes());
        b.extend_from_slice(&NO_PARTITION_LEADER_EPOCH.to_be_bytes());
        b.push(MAGIC_V2 as u8);
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&attributes.to_be_bytes());
        b.extend_from_slice(&self.last_offset_delta.to_be_bytes());
        b.extend_from_slice(&self.base_timestamp.to_be_bytes());
        b.extend_from_slice(&self.max_timestamp.to_be_bytes());
        b.extend_from_slice(&self.producer_id.to_be_bytes());
        b.extend_from_slice(&self.producer_epoch.to_be_bytes());
        b.extend_from_slice(&self.base_sequence.to_be_bytes());
        b.extend_from_slice(&self.count.to_be_bytes());
        b.extend_from_slice(&section);
        let crc = compute_crc(&b);
        b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
        Ok(b)
    }
}

/// Writes a zigzag varint (protobuf style), as record fields use.
pub fn put_varint(out: &mut Vec<u8>, v: i32) {
    let mut z = ((v << 1) ^ (v >> 31)) as u32;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// Writes a zigzag varlong.
pub fn put_varlong(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn put_bytes(out: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, b.len() as i32);
            out.extend_from_slice(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize) -> Vec<u8> {
        let mut b = BatchBuilder::new(0, 1_000).producer(7, 0, 10);
        for i in 0..n {
            b = b.record(
                1_000 + i as i64,
                Some(format!("k{i}").as_bytes()),
                Some(b"value"),
                &[("h".into(), Some(b"v".to_vec()))],
            );
        }
        b.build()
    }

    #[test]
    fn built_batch_validates() {
        let b = sample(3);
        let h = validate_batch(&b).unwrap();
        assert_eq!(h.records_count, 3);
        assert_eq!(h.last_offset_delta, 2);
        assert_eq!(h.max_timestamp, 1_002);
        assert_eq!(h.producer_id, 7);
        assert_eq!(h.last_sequence(), 12);
        assert_eq!(h.total_size(), b.len());
    }

    #[test]
    fn patching_offset_and_epoch_keeps_crc_valid() {
        let mut b = sample(2);
        set_base_offset(&mut b, 42);
        set_partition_leader_epoch(&mut b, 5);
        let h = validate_batch(&b).unwrap();
        assert_eq!(h.base_offset, 42);
        assert_eq!(h.partition_leader_epoch, 5);
        assert_eq!(h.last_offset(), 43);
    }

    #[test]
    fn log_append_time_recomputes_crc() {
        let mut b = sample(2);
        set_log_append_time(&mut b, 99_999);
        let h = validate_batch(&b).unwrap();
        assert_eq!(h.timestamp_type(), TimestampType::LogAppendTime);
        assert_eq!(h.max_timestamp, 99_999);
    }

    #[test]
    fn flipped_byte_fails_crc() {
        let mut b = sample(2);
        let last = b.len() - 1;
        b[last] ^= 1;
        assert!(matches!(
            validate_batch(&b),
            Err(BatchError::CrcMismatch { .. })
        ));
    }

    #[test]
    fn wrong_magic_is_rejected() {
        let mut b = sample(1);
        b[OFF_MAGIC] = 1;
        assert_eq!(validate_batch(&b), Err(BatchError::UnsupportedMagic(1)));
    }

    #[test]
    fn wrong_last_offset_delta_is_invalid() {
        let mut b = sample(2);
        b[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4].copy_from_slice(&5i32.to_be_bytes());
        let crc = compute_crc(&b);
        b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(validate_batch(&b), Err(BatchError::Invalid(_))));
    }

    #[test]
    fn iterator_walks_batches_and_flags_torn_tail() {
        let mut buf = sample(1);
        buf.extend(sample(2));
        let whole = buf.len();
        buf.extend(&sample(1)[..20]);
        let items: Vec<_> = Batches::new(&buf).collect();
        assert_eq!(items.len(), 3);
        assert!(items[0].is_ok() && items[1].is_ok());
        assert!(matches!(items[2], Err(BatchError::Truncated { .. })));
        let (pos, h) = items[1].clone().unwrap();
        assert_eq!(pos + h.total_size(), whole);
    }

    #[test]
    fn sequence_wraps() {
        let b = BatchBuilder::new(0, 0)
            .producer(1, 0, i32::MAX)
            .record(0, None, Some(b"a"), &[])
            .record(0, None, Some(b"b"), &[])
            .build();
        assert_eq!(BatchHeader::parse(&b).unwrap().last_sequence(), 0);
    }
}
