//! Re-encoding stored batches: what the cleaner writes for a batch that lost records
//! (Kafka's `MemoryRecords.buildRetainedRecordsInto` and `DefaultRecordBatch.writeEmptyHeader`)
//! and what `compression.type` needs to re-compress a produced batch (Kafka's
//! `LogValidator.buildRecordsAndAssignOffsets`).
//!
//! A rebuilt batch keeps the original's base offset, `lastOffsetDelta` (so the producer's last
//! sequence survives compaction, as Kafka's `overrideLastOffset`), partition leader epoch,
//! producer id/epoch/base sequence, timestamp type and transactional/control bits; records keep
//! their offset deltas and absolute timestamps.

use gregor_protocol::batch::{
    compute_crc, put_varint, put_varlong, BatchHeader, Compression, TimestampType,
    BATCH_HEADER_LEN, LOG_OVERHEAD, MAGIC_V2,
};
use gregor_protocol::compression::{compress_with_level, CompressionError};
use gregor_protocol::records::Record;

/// Attribute bits 0-2: the codec.
const ATTR_COMPRESSION_MASK: i16 = 0x07;
/// Attribute bit 6: `baseTimestamp` holds the delete horizon (KIP-534).
pub(crate) const ATTR_DELETE_HORIZON: i16 = 0x40;
/// Byte offset of the CRC field.
const OFF_CRC: usize = 17;

fn put_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        Some(b) => {
            put_varint(out, b.len() as i32);
            out.extend_from_slice(b);
        }
        None => put_varint(out, -1),
    }
}

/// Absolute timestamp (ms) of `r` in a batch whose header is `h`.
pub(crate) fn record_timestamp(h: &BatchHeader, r: &Record) -> i64 {
    if h.timestamp_type() == TimestampType::LogAppendTime {
        h.max_timestamp
    } else {
        h.base_timestamp.saturating_add(r.timestamp_delta)
    }
}

/// Builds a batch like `original` holding `records` (a subset of its records, in order),
/// compressed with `codec` at `level` (KIP-390; `None`: the codec's default). With `delete_horizon_ms` the batch's base timestamp is the delete
/// horizon and attribute bit 6 is set (KIP-534); record timestamps are unchanged.
///
/// # Errors
/// [`CompressionError`] if the codec fails.
pub(crate) fn rebuild_batch(
    original: &BatchHeader,
    records: &[Record],
    codec: Compression,
    level: Option<i32>,
    delete_horizon_ms: Option<i64>,
) -> Result<Vec<u8>, CompressionError> {
    let stamps: Vec<i64> = records
        .iter()
        .map(|r| record_timestamp(original, r))
        .collect();
    let base_timestamp = delete_horizon_ms
        .or_else(|| stamps.first().copied())
        .unwrap_or(original.max_timestamp);
    let max_timestamp = if original.timestamp_type() == TimestampType::LogAppendTime {
        original.max_timestamp
    } else {
        stamps
            .iter()
            .copied()
            .max()
            .unwrap_or(original.max_timestamp)
    };
    let mut section = Vec::new();
    let mut body = Vec::new();
    for (r, ts) in records.iter().zip(&stamps) {
        body.clear();
        body.push(r.attributes as u8);
        put_varlong(&mut body, ts.wrapping_sub(base_timestamp));
        put_varint(&mut body, r.offset_delta);
        put_bytes(&mut body, r.key.as_deref());
        put_bytes(&mut body, r.value.as_deref());
        put_varint(&mut body, r.headers.len() as i32);
        for (k, v) in &r.headers {
            put_bytes(&mut body, Some(k.as_bytes()));
            put_bytes(&mut body, v.as_deref());
        }
        put_varint(&mut section, body.len() as i32);
        section.extend_from_slice(&body);
    }
    let section = match codec {
        Compression::None => section,
        _ => compress_with_level(codec, &section, level)?,
    };
    let mut attributes =
        (original.attributes & !(ATTR_COMPRESSION_MASK | ATTR_DELETE_HORIZON)) | codec.id();
    if delete_horizon_ms.is_some() {
        attributes |= ATTR_DELETE_HORIZON;
    }
    Ok(assemble(
        original,
        attributes,
        base_timestamp,
        max_timestamp,
        records.len() as i32,
        &section,
    ))
}

/// Kafka's `DefaultRecordBatch.writeEmptyHeader`: a batch with no records that keeps the
/// original's offsets, producer fields and max timestamp, kept by the cleaner so that the last
/// sequence of an active producer survives.
pub(crate) fn empty_batch(original: &BatchHeader) -> Vec<u8> {
    let attributes = original.attributes & !(ATTR_COMPRESSION_MASK | ATTR_DELETE_HORIZON);
    assemble(
        original,
        attributes,
        original.max_timestamp,
        original.max_timestamp,
        0,
        &[],
    )
}

fn assemble(
    original: &BatchHeader,
    attributes: i16,
    base_timestamp: i64,
    max_timestamp: i64,
    count: i32,
    section: &[u8],
) -> Vec<u8> {
    let mut b = Vec::with_capacity(BATCH_HEADER_LEN + section.len());
    b.extend_from_slice(&original.base_offset.to_be_bytes());
    let batch_length = (BATCH_HEADER_LEN - LOG_OVERHEAD + section.len()) as i32;
    b.extend_from_slice(&batch_length.to_be_bytes());
    b.extend_from_slice(&original.partition_leader_epoch.to_be_bytes());
    b.push(MAGIC_V2 as u8);
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&attributes.to_be_bytes());
    b.extend_from_slice(&original.last_offset_delta.to_be_bytes());
    b.extend_from_slice(&base_timestamp.to_be_bytes());
    b.extend_from_slice(&max_timestamp.to_be_bytes());
    b.extend_from_slice(&original.producer_id.to_be_bytes());
    b.extend_from_slice(&original.producer_epoch.to_be_bytes());
    b.extend_from_slice(&original.base_sequence.to_be_bytes());
    b.extend_from_slice(&count.to_be_bytes());
    b.extend_from_slice(section);
    let crc = compute_crc(&b);
    b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_protocol::batch::{validate_batch, BatchBuilder};
    use gregor_protocol::records::decode_records;

    #[test]
    fn rebuilt_batch_keeps_offsets_producer_fields_and_timestamps() {
        let raw = BatchBuilder::new(100, 1_000)
            .producer(7, 2, 40)
            .record(1_000, Some(b"a"), Some(b"1"), &[])
            .record(
                1_005,
                Some(b"b"),
                None,
                &[("h".into(), Some(b"x".to_vec()))],
            )
            .record(1_010, Some(b"c"), Some(b"3"), &[])
            .compression(Compression::Gzip)
            .build();
        let h = validate_batch(&raw).unwrap();
        let recs = decode_records(&raw).unwrap();
        let kept = vec![recs[1].clone()];
        let out = rebuild_batch(&h, &kept, Compression::Gzip, None, Some(99_999)).unwrap();
        let h2 = crate::segment::validate_stored_batch(&out).unwrap();
        assert_eq!(h2.base_offset, 100);
        assert_eq!(h2.last_offset(), 102);
        assert_eq!(h2.last_sequence(), 42);
        assert_eq!((h2.producer_id, h2.producer_epoch), (7, 2));
        assert_eq!(h2.compression(), Some(Compression::Gzip));
        assert!(h2.has_delete_horizon());
        assert_eq!(h2.base_timestamp, 99_999);
        assert_eq!(h2.max_timestamp, 1_005);
        let back = decode_records(&out).unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].offset_delta, 1);
        assert_eq!(record_timestamp(&h2, &back[0]), 1_005);
        assert_eq!(back[0].headers, recs[1].headers);
        for (codec, level) in [(Compression::Zstd, Some(19)), (Compression::Gzip, Some(1))] {
            let out = rebuild_batch(&h, &recs, codec, level, None).unwrap();
            assert_eq!(decode_records(&out).unwrap().len(), 3);
        }
        let empty = empty_batch(&h);
        let he = crate::segment::validate_stored_batch(&empty).unwrap();
        assert_eq!(
            (he.records_count, he.last_offset(), he.last_sequence()),
            (0, 102, 42)
        );
        assert!(decode_records(&empty).unwrap().is_empty());
    }
}
