//! Records inside a v2 batch: decoding (with decompression) and the varint readers.
//!
//! Layout of one record, from the Kafka protocol guide, "Record"
//! (<https://kafka.apache.org/documentation/#record>):
//!
//! ```text
//! length: varint                (bytes of everything below)
//! attributes: int8              (unused, 0)
//! timestampDelta: varlong       (ms from the batch's baseTimestamp)
//! offsetDelta: varint           (from the batch's baseOffset)
//! keyLength: varint             (-1 = null key)
//! key: byte[]
//! valueLen: varint              (-1 = null value)
//! value: byte[]
//! headers count: varint
//! headers: [headerKeyLength: varint, headerKey: utf8, headerValueLength: varint (-1 = null),
//!           value: byte[]]
//! ```
//!
//! Varints are zigzag-encoded as in protobuf. The produce path checks every record without
//! building them ([`validate_records_bounded`]) and stores batches as received; decoding into
//! [`Record`]s is for where the broker must look inside a batch (compaction, re-compression,
//! tests).
//!
//! Error kinds: bytes that cannot be decoded (truncation, overlong varints, impossible lengths,
//! invalid UTF-8, codec failures) are [`BatchError::Corrupt`]; well-formed records that break a
//! rule (record count, offset deltas, size limit) are [`BatchError::Invalid`].

use bytes::Bytes;

use crate::batch::{compute_crc, BatchError, BatchHeader, Compression, BATCH_HEADER_LEN, MAGIC_V2};
use crate::compression::{decompress_bounded, CompressionError, DEFAULT_MAX_DECOMPRESSED_BYTES};

/// Smallest possible record body in bytes: attributes, timestampDelta, offsetDelta, key
/// length, value length and header count, one byte each.
const MIN_RECORD_BODY_BYTES: usize = 6;

/// One record of a v2 batch, as decoded by [`decode_records`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Offset of the record minus the batch's `baseOffset`.
    pub offset_delta: i32,
    /// Timestamp of the record minus the batch's `baseTimestamp`, in milliseconds.
    pub timestamp_delta: i64,
    /// Record attributes (currently unused by Kafka, 0).
    pub attributes: i8,
    /// The key bytes, `None` for a null key (length -1).
    pub key: Option<Bytes>,
    /// The value bytes, `None` for a null value (a tombstone in compacted topics).
    pub value: Option<Bytes>,
    /// Headers in wire order: UTF-8 key and value bytes (`None` for a null value).
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// Reads a zigzag varint (at most 5 bytes) from the front of `buf` and advances it.
///
/// # Errors
/// [`BatchError::Corrupt`] when `buf` ends inside the varint, or the varint is longer than 5
/// bytes or holds more than 32 bits.
pub fn get_varint(buf: &mut &[u8]) -> Result<i32, BatchError> {
    let z = get_unsigned(buf, 5, "varint")?;
    let z = u32::try_from(z).map_err(|_| BatchError::Corrupt("varint overflows 32 bits".into()))?;
    Ok(((z >> 1) as i32) ^ -((z & 1) as i32))
}

/// Reads a zigzag varlong (at most 10 bytes) from the front of `buf` and advances it.
///
/// # Errors
/// [`BatchError::Corrupt`] when `buf` ends inside the varlong, or the varlong is longer than 10
/// bytes or holds more than 64 bits.
pub fn get_varlong(buf: &mut &[u8]) -> Result<i64, BatchError> {
    let z = get_unsigned(buf, 10, "varlong")?;
    Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
}

/// Reads an unsigned LEB128 value of at most `max_bytes` bytes.
fn get_unsigned(buf: &mut &[u8], max_bytes: u32, what: &str) -> Result<u64, BatchError> {
    let mut value: u64 = 0;
    for i in 0..max_bytes {
        let Some((&b, rest)) = buf.split_first() else {
            return Err(BatchError::Corrupt(format!("truncated {what}")));
        };
        *buf = rest;
        let shift = 7 * i;
        let bits = u64::from(b & 0x7f);
        // Bits that would fall off the top of a u64 mean the value overflows.
        if shift + 7 > 64 && bits >> (64 - shift) != 0 {
            return Err(BatchError::Corrupt(format!("{what} overflows 64 bits")));
        }
        value |= bits << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(BatchError::Corrupt(format!(
        "{what} is longer than {max_bytes} bytes"
    )))
}

/// Decodes every record of one whole v2 batch (header included), decompressing the records
/// section with at most [`DEFAULT_MAX_DECOMPRESSED_BYTES`] bytes of output. See
/// [`decode_records_bounded`].
///
/// # Errors
/// As [`decode_records_bounded`].
pub fn decode_records(batch: &[u8]) -> Result<Vec<Record>, BatchError> {
    decode_records_bounded(batch, DEFAULT_MAX_DECOMPRESSED_BYTES)
}

/// Decodes every record of one whole v2 batch: `batch` holds exactly one batch, its 61-byte
/// header included. The records section is decompressed per the batch's codec, producing at
/// most `max_decompressed_bytes` bytes.
///
/// Checks, beyond decoding each field: `batchLength` matches `batch.len()`, magic 2, the
/// CRC-32C, a defined codec, the number of records equals `recordsCount`, each record's length
/// prefix matches its content exactly, no bytes follow the last record, offset deltas are
/// non-negative and strictly increasing, and the last one is at most `lastOffsetDelta`
/// (compaction may drop trailing records and keeps the batch's last offset). Gaps
/// between offset deltas are allowed: compaction leaves them. A batch with `recordsCount` 0
/// and no records bytes (what compaction keeps for producer state) decodes to no records.
///
/// # Errors
/// [`BatchError::Truncated`], [`BatchError::UnsupportedMagic`] and
/// [`BatchError::CrcMismatch`] for the framing; [`BatchError::Corrupt`] for undecodable bytes
/// and [`BatchError::Invalid`] for rule violations, with a message naming the record (e.g.
/// "record 3: key length -5").
pub fn decode_records_bounded(
    batch: &[u8],
    max_decompressed_bytes: usize,
) -> Result<Vec<Record>, BatchError> {
    let (h, section, count) = records_section(batch, max_decompressed_bytes, Crc::Check)?;
    let all = match section {
        Section::Empty => return Ok(Vec::new()),
        Section::Borrowed(b) => Bytes::copy_from_slice(b),
        Section::Decompressed(v) => Bytes::from(v),
    };
    // The count comes from the wire: never reserve more than the bytes could hold.
    let mut out = Vec::with_capacity(count.min(all.len() / (MIN_RECORD_BODY_BYTES + 1)));
    walk_records(&all, count, h.last_offset_delta, |raw| {
        out.push(raw.to_record(&all)?);
        Ok(())
    })?;
    Ok(out)
}

/// What [`validate_records_bounded`] learned about a batch's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordsSummary {
    /// Records found (equal to the header's `recordsCount`).
    pub count: usize,
    /// Whether some record has a null key (refused by compacted topics).
    pub any_null_key: bool,
}

/// One record as [`inspect_records_bounded`] shows it: what the broker's per-record checks
/// (Kafka's `LogValidator.validateRecord`: a key on compacted topics, the timestamp range)
/// need, without the key and value bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView {
    /// Position of the record in its batch, from 0 (KIP-467's `batch_index`).
    pub index: usize,
    /// Offset of the record minus the batch's `baseOffset`.
    pub offset_delta: i32,
    /// Timestamp of the record minus the batch's `baseTimestamp`, in milliseconds.
    pub timestamp_delta: i64,
    /// Length of the key in bytes, `None` for a null key.
    pub key_len: Option<usize>,
    /// Length of the value in bytes, `None` for a null value.
    pub value_len: Option<usize>,
}

/// Checks every record of one whole v2 batch as [`decode_records_bounded`] does, without
/// building the records: an uncompressed batch is walked in place (no copy, no allocation),
/// a compressed one is decompressed once (at most `max_decompressed_bytes`) and walked. This is
/// the produce path's record-level validation (Kafka's `LogValidator`, which iterates every
/// record of every batch a client sends): it refuses a batch whose record count does not match
/// its records, whose records do not decode, or whose offset deltas are not increasing.
///
/// # Errors
/// As [`decode_records_bounded`].
pub fn validate_records_bounded(
    batch: &[u8],
    max_decompressed_bytes: usize,
) -> Result<RecordsSummary, BatchError> {
    let mut summary = RecordsSummary {
        count: 0,
        any_null_key: false,
    };
    inspect_records_bounded(batch, max_decompressed_bytes, |r| {
        summary.count += 1;
        summary.any_null_key |= r.key_len.is_none();
    })?;
    Ok(summary)
}

/// As [`validate_records_bounded`], handing each record, in batch order, to `f` once the
/// record has decoded. `f` may run for some records of a batch that turns out to be invalid
/// further on; the error then says so.
///
/// # Errors
/// As [`decode_records_bounded`].
pub fn inspect_records_bounded(
    batch: &[u8],
    max_decompressed_bytes: usize,
    f: impl FnMut(RecordView),
) -> Result<(), BatchError> {
    inspect_section(batch, max_decompressed_bytes, Crc::Check, f)
}

/// As [`inspect_records_bounded`], for one whole batch that
/// [`validate_batch`](crate::batch::validate_batch) has accepted: its CRC-32C, which that
/// checked, is not computed a second time (on the produce path the CRC was a tenth of the
/// broker's CPU while it was computed twice per batch). Everything else is checked as there.
///
/// # Errors
/// As [`decode_records_bounded`].
pub fn inspect_validated_records_bounded(
    batch: &[u8],
    max_decompressed_bytes: usize,
    f: impl FnMut(RecordView),
) -> Result<(), BatchError> {
    inspect_section(batch, max_decompressed_bytes, Crc::AlreadyChecked, f)
}

fn inspect_section(
    batch: &[u8],
    max_decompressed_bytes: usize,
    crc: Crc,
    mut f: impl FnMut(RecordView),
) -> Result<(), BatchError> {
    let (h, section, count) = records_section(batch, max_decompressed_bytes, crc)?;
    let records: &[u8] = match &section {
        Section::Empty => return Ok(()),
        Section::Borrowed(b) => b,
        Section::Decompressed(v) => v,
    };
    let mut index = 0;
    walk_records(records, count, h.last_offset_delta, |raw| {
        f(RecordView {
            index,
            offset_delta: raw.offset_delta,
            timestamp_delta: raw.timestamp_delta,
            key_len: raw.key.map(<[u8]>::len),
            value_len: raw.value.map(<[u8]>::len),
        });
        index += 1;
        Ok(())
    })
}

/// A batch's records section, ready to walk.
enum Section<'a> {
    /// `recordsCount` 0 and no bytes.
    Empty,
    /// Uncompressed: the bytes inside the batch.
    Borrowed(&'a [u8]),
    /// Decompressed into a new buffer.
    Decompressed(Vec<u8>),
}

/// Whether [`records_section`] computes the batch's CRC-32C.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Crc {
    Check,
    /// The caller validated this very batch with `validate_batch`.
    AlreadyChecked,
}

/// Checks the batch framing (length, magic, CRC unless already checked, codec, count) and
/// returns its header, its records section (decompressed if needed) and the record count.
fn records_section(
    batch: &[u8],
    max_decompressed_bytes: usize,
    crc: Crc,
) -> Result<(BatchHeader, Section<'_>, usize), BatchError> {
    let h = BatchHeader::parse(batch)?;
    if h.magic != MAGIC_V2 {
        return Err(BatchError::UnsupportedMagic(h.magic));
    }
    let total = usize::try_from(h.batch_length)
        .ok()
        .and_then(|l| l.checked_add(crate::batch::LOG_OVERHEAD))
        .filter(|&t| t >= BATCH_HEADER_LEN)
        .ok_or_else(|| {
            BatchError::Corrupt(format!(
                "batch length {} is smaller than the v2 header",
                h.batch_length
            ))
        })?;
    if batch.len() < total {
        return Err(BatchError::Truncated {
            needed: total,
            available: batch.len(),
        });
    }
    if batch.len() > total {
        return Err(BatchError::Corrupt(format!(
            "{} bytes follow the batch of {total} bytes",
            batch.len() - total
        )));
    }
    if crc == Crc::Check {
        let computed = compute_crc(batch);
        if computed != h.crc {
            return Err(BatchError::CrcMismatch {
                stored: h.crc,
                computed,
            });
        }
    }
    let codec = h.compression().ok_or_else(|| {
        BatchError::Corrupt(format!(
            "unknown compression codec id {}",
            h.attributes & 0x07
        ))
    })?;
    let count = usize::try_from(h.records_count)
        .map_err(|_| BatchError::Corrupt(format!("negative record count {}", h.records_count)))?;
    let section = batch.get(BATCH_HEADER_LEN..).unwrap_or_default();
    if count == 0 && section.is_empty() {
        return Ok((h, Section::Empty, 0));
    }
    let section = match codec {
        Compression::None => {
            if section.len() > max_decompressed_bytes {
                return Err(BatchError::Invalid(format!(
                    "records section of {} bytes exceeds the limit of {max_decompressed_bytes} bytes",
                    section.len()
                )));
            }
            Section::Borrowed(section)
        }
        _ => Section::Decompressed(
            decompress_bounded(codec, section, max_decompressed_bytes).map_err(|e| match e {
                CompressionError::TooLarge { .. } => BatchError::Invalid(e.to_string()),
                _ => BatchError::Corrupt(e.to_string()),
            })?,
        ),
    };
    Ok((h, section, count))
}

/// Walks exactly `count` records filling all of `records`, handing each to `f`. Checks the
/// count, that offset deltas are non-negative and strictly increasing, that the last is at
/// most `last_offset_delta`, and that nothing follows the last record.
fn walk_records<'a>(
    records: &'a [u8],
    count: usize,
    last_offset_delta: i32,
    mut f: impl FnMut(RawRecord<'a>) -> Result<(), BatchError>,
) -> Result<(), BatchError> {
    let mut rest: &'a [u8] = records;
    let mut prev_offset_delta: Option<i32> = None;
    for i in 0..count {
        if rest.is_empty() {
            return Err(BatchError::Invalid(format!(
                "batch header says {count} records but the records end after {i}"
            )));
        }
        let at = records.len() - rest.len();
        let record = scan_record(&mut rest).map_err(|e| in_record(i, e))?;
        if record.offset_delta < 0 {
            return Err(BatchError::Invalid(format!(
                "record {i}: negative offset delta {}",
                record.offset_delta
            )));
        }
        if let Some(prev) = prev_offset_delta {
            if record.offset_delta <= prev {
                return Err(BatchError::Invalid(format!(
                    "record {i} (at byte {at}): offset delta {} does not follow {prev}",
                    record.offset_delta
                )));
            }
        }
        prev_offset_delta = Some(record.offset_delta);
        f(record).map_err(|e| in_record(i, e))?;
    }
    if !rest.is_empty() {
        return Err(BatchError::Invalid(format!(
            "{} bytes follow the last of {count} records",
            rest.len()
        )));
    }
    match prev_offset_delta {
        // The last record may sit below `lastOffsetDelta`: the cleaner keeps the original
        // batch's last offset when it drops trailing records (Kafka's
        // `MemoryRecordsBuilder.overrideLastOffset`), so only a larger delta is an error.
        Some(last) if last > last_offset_delta => Err(BatchError::Invalid(format!(
            "last record has offset delta {last} but the batch header says {last_offset_delta}"
        ))),
        _ => Ok(()),
    }
}

fn in_record(i: usize, e: BatchError) -> BatchError {
    match e {
        BatchError::Corrupt(m) => BatchError::Corrupt(format!("record {i}: {m}")),
        BatchError::Invalid(m) => BatchError::Invalid(format!("record {i}: {m}")),
        other => other,
    }
}

/// One record as slices of the records section; its headers are checked but left encoded.
struct RawRecord<'a> {
    attributes: u8,
    timestamp_delta: i64,
    offset_delta: i32,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    header_count: usize,
    /// The encoded headers, already checked by [`scan_record`].
    headers: &'a [u8],
}

impl RawRecord<'_> {
    /// The record with zero-copy slices of `all` (the section the slices point into).
    fn to_record(&self, all: &Bytes) -> Result<Record, BatchError> {
        let mut body = self.headers;
        // Each header takes at least two bytes (two lengths).
        let mut headers = Vec::with_capacity(self.header_count.min(body.len() / 2));
        for j in 0..self.header_count {
            let (key, value) = scan_header(&mut body, j)?;
            let key = std::str::from_utf8(key)
                .map_err(|e| BatchError::Corrupt(format!("header {j}: key is not UTF-8: {e}")))?
                .to_owned();
            headers.push((key, value.map(|v| all.slice_ref(v))));
        }
        Ok(Record {
            offset_delta: self.offset_delta,
            timestamp_delta: self.timestamp_delta,
            attributes: self.attributes as i8,
            key: self.key.map(|k| all.slice_ref(k)),
            value: self.value.map(|v| all.slice_ref(v)),
            headers,
        })
    }
}

/// Scans one record at the front of `rest`, advancing `rest`; every field, header included,
/// is checked.
fn scan_record<'a>(rest: &mut &'a [u8]) -> Result<RawRecord<'a>, BatchError> {
    let length = get_varint(rest)?;
    let length = usize::try_from(length)
        .map_err(|_| BatchError::Corrupt(format!("record length {length}")))?;
    if length > rest.len() {
        return Err(BatchError::Corrupt(format!(
            "record length {length} but only {} bytes remain",
            rest.len()
        )));
    }
    let (mut body, after) = rest.split_at(length);
    *rest = after;

    let Some((&attributes, tail)) = body.split_first() else {
        return Err(BatchError::Corrupt("record length 0".into()));
    };
    body = tail;
    let timestamp_delta = get_varlong(&mut body)?;
    let offset_delta = get_varint(&mut body)?;
    let key = get_nullable_slice(&mut body, "key")?;
    let value = get_nullable_slice(&mut body, "value")?;
    let header_count = get_varint(&mut body)?;
    let header_count = usize::try_from(header_count)
        .map_err(|_| BatchError::Corrupt(format!("header count {header_count}")))?;
    let headers = body;
    for j in 0..header_count {
        let (key, _) = scan_header(&mut body, j)?;
        std::str::from_utf8(key)
            .map_err(|e| BatchError::Corrupt(format!("header {j}: key is not UTF-8: {e}")))?;
    }
    if !body.is_empty() {
        return Err(BatchError::Corrupt(format!(
            "record length {length} leaves {} bytes unread",
            body.len()
        )));
    }
    Ok(RawRecord {
        attributes,
        timestamp_delta,
        offset_delta,
        key,
        value,
        header_count,
        headers,
    })
}

/// Scans header `j` at the front of `body`: its key bytes and nullable value.
#[allow(clippy::type_complexity)]
fn scan_header<'a>(
    body: &mut &'a [u8],
    j: usize,
) -> Result<(&'a [u8], Option<&'a [u8]>), BatchError> {
    let key_len = get_varint(body)?;
    let key_len = usize::try_from(key_len)
        .map_err(|_| BatchError::Corrupt(format!("header {j}: key length {key_len}")))?;
    let key = take(body, key_len).ok_or_else(|| {
        BatchError::Corrupt(format!(
            "header {j}: key length {key_len} but only {} bytes remain",
            body.len()
        ))
    })?;
    let value = get_nullable_slice(body, &format!("header {j}: value"))?;
    Ok((key, value))
}

/// Splits `n` bytes off the front of `buf`, or `None` if fewer remain.
fn take<'a>(buf: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if n > buf.len() {
        return None;
    }
    let (head, tail) = buf.split_at(n);
    *buf = tail;
    Some(head)
}

/// Reads a varint length (-1 = null) and that many bytes.
fn get_nullable_slice<'a>(buf: &mut &'a [u8], what: &str) -> Result<Option<&'a [u8]>, BatchError> {
    let len = get_varint(buf)?;
    if len == -1 {
        return Ok(None);
    }
    let n =
        usize::try_from(len).map_err(|_| BatchError::Corrupt(format!("{what} length {len}")))?;
    let bytes = take(buf, n).ok_or_else(|| {
        BatchError::Corrupt(format!(
            "{what} length {len} but only {} bytes remain",
            buf.len()
        ))
    })?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{put_varint, put_varlong, validate_batch, BatchBuilder, RecordHeader};
    use proptest::prelude::*;

    const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];
    const OFF_CRC: usize = 17;
    const OFF_RECORDS_COUNT: usize = 57;
    const OFF_LAST_OFFSET_DELTA: usize = 23;

    /// Rewrites `batchLength` and the CRC after a test edited `b`.
    fn reseal(b: &mut [u8]) {
        let len = (b.len() - crate::batch::LOG_OVERHEAD) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        let crc = compute_crc(b);
        b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    }

    /// A v2 batch around a hand-written records section.
    fn raw_batch(section: &[u8], count: i32, last_offset_delta: i32) -> Vec<u8> {
        let mut b = BatchBuilder::new(0, 0).build();
        b[OFF_RECORDS_COUNT..OFF_RECORDS_COUNT + 4].copy_from_slice(&count.to_be_bytes());
        b[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4]
            .copy_from_slice(&last_offset_delta.to_be_bytes());
        b.extend_from_slice(section);
        reseal(&mut b);
        b
    }

    fn record_bytes(offset_delta: i32, key_len: i32, key: &[u8]) -> Vec<u8> {
        let mut body = vec![0u8];
        put_varlong(&mut body, 0);
        put_varint(&mut body, offset_delta);
        put_varint(&mut body, key_len);
        body.extend_from_slice(key);
        put_varint(&mut body, -1);
        put_varint(&mut body, 0);
        let mut r = Vec::new();
        put_varint(&mut r, body.len() as i32);
        r.extend_from_slice(&body);
        r
    }

    fn sample(codec: Compression) -> Vec<u8> {
        BatchBuilder::new(100, 1_000)
            .compression(codec)
            .record(1_000, Some(b"k0"), Some(b"v0"), &[])
            .record(
                1_005,
                None,
                Some(b"v1"),
                &[("h".into(), Some(b"x".to_vec())), ("n".into(), None)],
            )
            .record(990, Some(b"k2"), None, &[])
            .build()
    }

    #[test]
    fn varints_round_trip_at_the_edges() {
        for v in [0, 1, -1, 63, -64, 64, i32::MAX, i32::MIN] {
            let mut buf = Vec::new();
            put_varint(&mut buf, v);
            let mut s = &buf[..];
            assert_eq!(get_varint(&mut s).unwrap(), v);
            assert!(s.is_empty());
        }
        for v in [0, -1, i64::from(i32::MAX) + 1, i64::MAX, i64::MIN] {
            let mut buf = Vec::new();
            put_varlong(&mut buf, v);
            let mut s = &buf[..];
            assert_eq!(get_varlong(&mut s).unwrap(), v);
            assert!(s.is_empty());
        }
    }

    #[test]
    fn overlong_and_truncated_varints_are_rejected() {
        let mut s: &[u8] = &[0x80, 0x80, 0x80, 0x80, 0x80, 0x00];
        assert!(get_varint(&mut s)
            .unwrap_err()
            .to_string()
            .contains("5 bytes"));
        // Five bytes but more than 32 bits.
        let mut s: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0x1f];
        assert!(get_varint(&mut s).is_err());
        let mut s: &[u8] = &[
            0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0,
        ];
        assert!(get_varlong(&mut s)
            .unwrap_err()
            .to_string()
            .contains("10 bytes"));
        // Ten bytes but more than 64 bits.
        let mut s: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert!(get_varlong(&mut s)
            .unwrap_err()
            .to_string()
            .contains("64 bits"));
        let mut s: &[u8] = &[0x80];
        assert!(get_varint(&mut s)
            .unwrap_err()
            .to_string()
            .contains("truncated"));
        let mut s: &[u8] = &[];
        assert!(get_varlong(&mut s).is_err());
    }

    #[test]
    fn decodes_every_codec() {
        for codec in ALL {
            let b = sample(codec);
            let h = validate_batch(&b).unwrap();
            assert_eq!(h.compression(), Some(codec));
            let rs = decode_records(&b).unwrap();
            assert_eq!(rs.len(), 3, "{codec:?}");
            assert_eq!(rs[0].key.as_deref(), Some(&b"k0"[..]));
            assert_eq!(rs[1].key, None);
            assert_eq!(rs[1].timestamp_delta, 5);
            assert_eq!(
                rs[1].headers,
                vec![
                    ("h".to_string(), Some(Bytes::from_static(b"x"))),
                    ("n".to_string(), None)
                ]
            );
            assert_eq!(rs[2].value, None);
            assert_eq!(rs[2].timestamp_delta, -10);
            assert_eq!(rs[2].offset_delta, 2);
        }
    }

    #[test]
    fn compacted_batch_with_gaps_decodes() {
        for codec in ALL {
            let b = BatchBuilder::new(0, 0)
                .compression(codec)
                .record_at_offset_delta(1, 0, Some(b"a"), Some(b"1"), &[])
                .record_at_offset_delta(4, 0, Some(b"b"), Some(b"2"), &[])
                .build();
            let h = BatchHeader::parse(&b).unwrap();
            assert_eq!(h.last_offset_delta, 4);
            let rs = decode_records(&b).unwrap();
            assert_eq!(
                rs.iter().map(|r| r.offset_delta).collect::<Vec<_>>(),
                [1, 4]
            );
        }
    }

    #[test]
    fn empty_batch_left_by_compaction_decodes_to_nothing() {
        let mut b = raw_batch(&[], 0, 7);
        // Compaction keeps the original codec bits on an empty batch.
        b[22] |= Compression::Zstd.id() as u8;
        reseal(&mut b);
        assert_eq!(decode_records(&b).unwrap(), vec![]);
    }

    #[test]
    fn hand_written_batch_decodes() {
        // Not from our builder: records section written field by field.
        let mut section = record_bytes(0, 3, b"abc");
        section.extend(record_bytes(1, -1, b""));
        let rs = decode_records(&raw_batch(&section, 2, 1)).unwrap();
        assert_eq!(rs[0].key.as_deref(), Some(&b"abc"[..]));
        assert_eq!(rs[1].key, None);
        assert_eq!(rs[1].value, None);
    }

    fn err_of(section: &[u8], count: i32, last: i32) -> String {
        decode_records(&raw_batch(section, count, last))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn structural_errors_name_the_record() {
        let mut s = record_bytes(0, 1, b"a");
        s.extend(record_bytes(1, 1, b"b"));
        s.extend(record_bytes(2, 1, b"c"));
        s.extend(record_bytes(3, -5, b""));
        let e = err_of(&s, 4, 3);
        assert!(e.contains("record 3: key length -5"), "{e}");

        let one = record_bytes(0, 1, b"a");
        assert!(err_of(&one, 2, 1).contains("says 2 records"));
        let mut two = one.clone();
        two.extend(record_bytes(1, 1, b"b"));
        assert!(err_of(&two, 1, 0).contains("bytes follow the last of 1 records"));
        let mut late = one.clone();
        late.extend(record_bytes(7, 1, b"b"));
        assert!(err_of(&late, 2, 5).contains("offset delta 7 but the batch header says 5"));

        let mut dup = one.clone();
        dup.extend(record_bytes(0, 1, b"b"));
        assert!(err_of(&dup, 2, 0).contains("record 1 (at byte"));

        // Record length one byte longer than its content: it swallows the next record's byte.
        let mut long = one.clone();
        long[0] += 2;
        long.push(0);
        let e = err_of(&long, 1, 0);
        assert!(
            e.contains("record 0: record length") && e.contains("unread"),
            "{e}"
        );

        // Key length beyond the record.
        let e = err_of(&record_bytes(0, 40, b"a"), 1, 0);
        assert!(e.contains("record 0: key length 40"), "{e}");

        // Invalid UTF-8 header key.
        // attributes, timestampDelta 0, offsetDelta 0, null key, null value, one header.
        let mut body = vec![0u8, 0, 0, 1, 1, 2];
        // Header key of 2 bytes that are not UTF-8, null value.
        body.extend([4, 0xff, 0xfe, 1]);
        let mut r = Vec::new();
        put_varint(&mut r, body.len() as i32);
        r.extend(body);
        assert!(err_of(&r, 1, 0).contains("header 0: key is not UTF-8"));
    }

    #[test]
    fn framing_errors() {
        let b = sample(Compression::None);
        let mut extra = b.clone();
        extra.push(0);
        assert!(matches!(
            decode_records(&extra),
            Err(BatchError::Corrupt(_))
        ));
        let mut bad = b.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(matches!(
            decode_records(&bad),
            Err(BatchError::CrcMismatch { .. })
        ));
        let mut magic = b;
        magic[16] = 1;
        assert_eq!(decode_records(&magic), Err(BatchError::UnsupportedMagic(1)));
    }

    #[test]
    fn validated_inspection_checks_everything_but_the_crc() {
        let views = |b: &[u8], validated: bool| {
            let mut v = Vec::new();
            let r = if validated {
                inspect_validated_records_bounded(b, 1 << 20, |r| v.push(r))
            } else {
                inspect_records_bounded(b, 1 << 20, |r| v.push(r))
            };
            r.map(|()| v)
        };
        for codec in ALL {
            let b = sample(codec);
            let all = views(&b, false).unwrap();
            assert_eq!(all.len(), 3);
            assert_eq!(views(&b, true).unwrap(), all, "{codec:?}");
            // A wrong CRC: only the caller's validate_batch, skipped here, would see it.
            let mut bad = b.clone();
            bad[OFF_CRC] ^= 0xff;
            assert!(matches!(
                views(&bad, false),
                Err(BatchError::CrcMismatch { .. })
            ));
            assert!(validate_batch(&bad).is_err());
            assert_eq!(views(&bad, true).unwrap(), all, "{codec:?}");
        }
        // Record-level checks still apply: a count the records do not match, a section over
        // the limit.
        let one = record_bytes(0, 1, b"a");
        let b = raw_batch(&one, 2, 1);
        let e = views(&b, true).unwrap_err();
        assert!(e.to_string().contains("says 2 records"), "{e}");
        let value = vec![b'x'; 2 << 20];
        let big = BatchBuilder::new(0, 0)
            .record(0, None, Some(&value), &[])
            .build();
        assert!(matches!(views(&big, true), Err(BatchError::Invalid(_))));
    }

    #[test]
    fn over_limit_records_are_rejected() {
        let value = vec![b'x'; 100_000];
        for codec in ALL {
            let b = BatchBuilder::new(0, 0)
                .compression(codec)
                .record(0, None, Some(&value), &[])
                .build();
            assert_eq!(decode_records(&b).unwrap().len(), 1);
            let e = decode_records_bounded(&b, 50_000).unwrap_err();
            assert!(matches!(e, BatchError::Invalid(_)), "{codec:?}: {e}");
            assert!(e.to_string().contains("50000"), "{e}");
        }
    }

    #[test]
    fn truncation_at_every_byte_is_an_error() {
        for codec in ALL {
            let b = sample(codec);
            for cut in 0..b.len() {
                // As received: header intact, bytes missing.
                assert!(decode_records(&b[..cut]).is_err(), "{codec:?} cut {cut}");
                // Resealed, so the parser itself sees the short records section.
                if cut > BATCH_HEADER_LEN {
                    let mut t = b[..cut].to_vec();
                    reseal(&mut t);
                    assert!(decode_records(&t).is_err(), "{codec:?} resealed cut {cut}");
                }
            }
        }
    }

    fn arb_bytes() -> impl Strategy<Value = Option<Vec<u8>>> {
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40))
    }

    type Spec = (i64, Option<Vec<u8>>, Option<Vec<u8>>, Vec<RecordHeader>);

    fn arb_record() -> impl Strategy<Value = Spec> {
        (
            -1_000_000i64..1_000_000,
            arb_bytes(),
            arb_bytes(),
            proptest::collection::vec((".{0,8}", arb_bytes()), 0..4),
        )
    }

    fn arb_codec() -> impl Strategy<Value = Compression> {
        proptest::sample::select(ALL.to_vec())
    }

    /// A compressed batch that inflates past the limit is refused, not stored (a gzip bomb:
    /// 4 MiB of zeros in a few KB), whatever its codec.
    #[test]
    fn validation_refuses_a_batch_that_decompresses_past_the_limit() {
        let zeros = vec![0u8; 4 << 20];
        for codec in ALL {
            let b = BatchBuilder::new(0, 0)
                .compression(codec)
                .record(0, None, Some(&zeros), &[])
                .build();
            let e = validate_records_bounded(&b, 1 << 20).unwrap_err();
            assert!(matches!(e, BatchError::Invalid(_)), "{codec:?}: {e}");
            assert_eq!(
                validate_records_bounded(&b, 8 << 20).unwrap().count,
                1,
                "{codec:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn built_batches_decode_identically(
            specs in proptest::collection::vec(arb_record(), 1..20),
            codec in arb_codec(),
        ) {
            let base_ts = 1_700_000_000_000i64;
            let mut builder = BatchBuilder::new(5, base_ts).compression(codec);
            for (ts, k, v, hs) in &specs {
                builder = builder.record(base_ts + ts, k.as_deref(), v.as_deref(), hs);
            }
            let b = builder.build();
            let h = validate_batch(&b).unwrap();
            prop_assert_eq!(h.compression(), Some(codec));
            let rs = decode_records(&b).unwrap();
            prop_assert_eq!(rs.len(), specs.len());
            let summary = validate_records_bounded(&b, DEFAULT_MAX_DECOMPRESSED_BYTES).unwrap();
            prop_assert_eq!(summary.count, specs.len());
            prop_assert_eq!(summary.any_null_key, specs.iter().any(|s| s.1.is_none()));
            for (i, (r, (ts, k, v, hs))) in rs.iter().zip(&specs).enumerate() {
                prop_assert_eq!(r.offset_delta, i as i32);
                prop_assert_eq!(r.timestamp_delta, *ts);
                prop_assert_eq!(r.attributes, 0);
                prop_assert_eq!(r.key.as_deref(), k.as_deref());
                prop_assert_eq!(r.value.as_deref(), v.as_deref());
                let got: Vec<(String, Option<Vec<u8>>)> = r
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_ref().map(|v| v.to_vec())))
                    .collect();
                prop_assert_eq!(&got, hs);
            }
        }

        #[test]
        fn mutated_records_never_panic(
            specs in proptest::collection::vec(arb_record(), 1..5),
            codec in arb_codec(),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        ) {
            let mut builder = BatchBuilder::new(0, 0).compression(codec);
            for (ts, k, v, hs) in &specs {
                builder = builder.record(*ts, k.as_deref(), v.as_deref(), hs);
            }
            let mut b = builder.build();
            let section = b.len() - BATCH_HEADER_LEN;
            for (at, x) in flips {
                b[BATCH_HEADER_LEN + at % section] ^= x | 1;
            }
            reseal(&mut b);
            // The produce path's validator accepts exactly what the decoder accepts.
            let decoded = decode_records(&b);
            let validated = validate_records_bounded(&b, DEFAULT_MAX_DECOMPRESSED_BYTES);
            match (&decoded, &validated) {
                (Ok(rs), Ok(summary)) => {
                    prop_assert_eq!(rs.len(), summary.count);
                    prop_assert_eq!(rs.iter().any(|r| r.key.is_none()), summary.any_null_key);
                }
                (Err(d), Err(v)) => prop_assert_eq!(d.to_string(), v.to_string()),
                _ => prop_assert!(false, "decode {:?} but validate {:?}", decoded, validated),
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_records(&data);
            let mut b = raw_batch(&data, 3, 2);
            let _ = decode_records(&b);
            b[22] |= Compression::Snappy.id() as u8;
            reseal(&mut b);
            let _ = decode_records(&b);
        }
    }
}
