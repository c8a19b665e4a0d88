//! Per-record timestamps of a stored batch, for exact ListOffsets-by-timestamp answers.

use gregor_protocol::batch::{
    BatchError, BatchHeader, Compression, TimestampType, BATCH_HEADER_LEN,
};

/// `(offset, timestamp_ms)` of every record of `batch` (whole batch bytes, header included).
/// LogAppendTime batches report the batch's max timestamp for every record, as Kafka does.
pub(crate) fn record_timestamps(
    batch: &[u8],
    h: &BatchHeader,
) -> Result<Vec<(i64, i64)>, BatchError> {
    if h.timestamp_type() == TimestampType::LogAppendTime {
        return Ok((h.base_offset..=h.last_offset())
            .map(|o| (o, h.max_timestamp))
            .collect());
    }
    match h.compression() {
        Some(Compression::None) => uncompressed_timestamps(batch, h),
        _ => compressed_timestamps(batch, h),
    }
}

fn compressed_timestamps(batch: &[u8], h: &BatchHeader) -> Result<Vec<(i64, i64)>, BatchError> {
    let records = gregor_protocol::records::decode_records(batch)?;
    Ok(records
        .iter()
        .map(|r| {
            (
                h.base_offset + i64::from(r.offset_delta),
                h.base_timestamp + r.timestamp_delta,
            )
        })
        .collect())
}

/// Walks the records of an uncompressed batch reading only each record's length, timestamp
/// delta and offset delta.
fn uncompressed_timestamps(batch: &[u8], h: &BatchHeader) -> Result<Vec<(i64, i64)>, BatchError> {
    let end = h.total_size().min(batch.len());
    let mut buf = batch.get(BATCH_HEADER_LEN..end).unwrap_or(&[]);
    let count = usize::try_from(h.records_count).unwrap_or(0);
    let mut out = Vec::with_capacity(count.min(buf.len()));
    for _ in 0..count {
        let len = read_varint(&mut buf)?;
        let len = usize::try_from(len)
            .map_err(|_| BatchError::Corrupt(format!("negative record length {len}")))?;
        if len > buf.len() {
            return Err(BatchError::Corrupt("record extends past the batch".into()));
        }
        let (mut rec, rest) = buf.split_at(len);
        buf = rest;
        if rec.is_empty() {
            return Err(BatchError::Corrupt("empty record".into()));
        }
        rec = &rec[1..]; // attributes
        let ts_delta = read_varlong(&mut rec)?;
        let offset_delta = read_varint(&mut rec)?;
        out.push((
            h.base_offset + i64::from(offset_delta),
            h.base_timestamp.wrapping_add(ts_delta),
        ));
    }
    Ok(out)
}

fn read_varlong(buf: &mut &[u8]) -> Result<i64, BatchError> {
    let mut z: u64 = 0;
    for i in 0..10 {
        let Some((&b, rest)) = buf.split_first() else {
            return Err(BatchError::Corrupt("truncated varint".into()));
        };
        *buf = rest;
        z |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((z >> 1) as i64 ^ -((z & 1) as i64));
        }
    }
    Err(BatchError::Corrupt("varint longer than 10 bytes".into()))
}

fn read_varint(buf: &mut &[u8]) -> Result<i32, BatchError> {
    let v = read_varlong(buf)?;
    i32::try_from(v).map_err(|_| BatchError::Corrupt(format!("varint {v} out of i32 range")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_protocol::batch::{validate_batch, BatchBuilder};

    #[test]
    fn uncompressed_record_timestamps() {
        let b = BatchBuilder::new(0, 1_000)
            .record(1_000, Some(b"k"), Some(b"v"), &[])
            .record(900, None, Some(&[1u8; 300]), &[("h".into(), None)])
            .record(5_000, None, None, &[])
            .build();
        let h = validate_batch(&b).unwrap();
        assert_eq!(
            record_timestamps(&b, &h).unwrap(),
            vec![(0, 1_000), (1, 900), (2, 5_000)]
        );
    }
}
