//! Transaction markers: the COMMIT and ABORT control records a partition leader appends when a
//! transaction ends (KIP-98; Kafka's `ControlRecordType` and `EndTransactionMarker`).
//!
//! A marker is a control batch (attributes bits 4 and 5: transactional and control) holding one
//! record, with the producer id and epoch of the transaction and no sequence (-1):
//!
//! ```text
//! key   = version i16 (0) | type i16 (0 ABORT, 1 COMMIT)
//! value = version i16 (0) | coordinator_epoch i32
//! ```
//!
//! All integers big-endian. Readers accept a higher value version and read its first six
//! bytes, as Kafka does.

use crate::batch::{BatchBuilder, BatchError, BatchHeader, Compression};
use crate::records::decode_records_bounded;

/// Control record type of an ABORT marker (`ControlRecordType.ABORT`).
pub const CONTROL_TYPE_ABORT: i16 = 0;
/// Control record type of a COMMIT marker (`ControlRecordType.COMMIT`).
pub const CONTROL_TYPE_COMMIT: i16 = 1;

/// Size in bytes of a control record key (version + type).
pub const CONTROL_RECORD_KEY_BYTES: usize = 4;
/// Size in bytes of an end-transaction marker value (version + coordinator epoch).
pub const END_TXN_MARKER_VALUE_BYTES: usize = 6;

/// Largest control batch this module decodes (bytes): a marker batch is 78 bytes; anything
/// far larger is not a marker and is not decoded (bounds the allocation of a corrupt file).
pub const MAX_CONTROL_BATCH_BYTES: usize = 4096;

/// How a transaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransactionResult {
    /// The transaction's records are aborted: read_committed consumers skip them.
    Abort,
    /// The transaction's records are committed.
    Commit,
}

impl TransactionResult {
    /// The control record type (0 ABORT, 1 COMMIT).
    pub fn control_type(self) -> i16 {
        match self {
            Self::Abort => CONTROL_TYPE_ABORT,
            Self::Commit => CONTROL_TYPE_COMMIT,
        }
    }

    /// WriteTxnMarkers' `TransactionResult` field: false ABORT, true COMMIT.
    pub fn from_commit_flag(commit: bool) -> Self {
        if commit {
            Self::Commit
        } else {
            Self::Abort
        }
    }
}

/// An end-transaction marker (Kafka's `EndTransactionMarker`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndTxnMarker {
    /// COMMIT or ABORT.
    pub result: TransactionResult,
    /// The epoch of the transaction coordinator that wrote it (its `__transaction_state`
    /// partition's leader epoch); a marker from an older coordinator is fenced.
    pub coordinator_epoch: i32,
}

impl EndTxnMarker {
    /// The control record key bytes.
    pub fn key_bytes(&self) -> [u8; CONTROL_RECORD_KEY_BYTES] {
        let mut k = [0u8; CONTROL_RECORD_KEY_BYTES];
        k[2..4].copy_from_slice(&self.result.control_type().to_be_bytes());
        k
    }

    /// The marker value bytes (version 0).
    pub fn value_bytes(&self) -> [u8; END_TXN_MARKER_VALUE_BYTES] {
        let mut v = [0u8; END_TXN_MARKER_VALUE_BYTES];
        v[2..6].copy_from_slice(&self.coordinator_epoch.to_be_bytes());
        v
    }

    /// Decodes a control record's key and value. `Ok(None)` when the key is another control
    /// type (e.g. KRaft's LEADER_CHANGE).
    ///
    /// # Errors
    /// [`BatchError::Invalid`] for a key or value too short or with a negative version.
    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<Option<Self>, BatchError> {
        if key.len() < CONTROL_RECORD_KEY_BYTES {
            return Err(BatchError::Invalid(format!(
                "control record key of {} bytes, at least {CONTROL_RECORD_KEY_BYTES} expected",
                key.len()
            )));
        }
        let key_version = i16::from_be_bytes([key[0], key[1]]);
        if key_version < 0 {
            return Err(BatchError::Invalid(format!(
                "control record key version {key_version}"
            )));
        }
        let result = match i16::from_be_bytes([key[2], key[3]]) {
            CONTROL_TYPE_ABORT => TransactionResult::Abort,
            CONTROL_TYPE_COMMIT => TransactionResult::Commit,
            _ => return Ok(None),
        };
        let value = value.unwrap_or_default();
        if value.len() < END_TXN_MARKER_VALUE_BYTES {
            return Err(BatchError::Invalid(format!(
                "end transaction marker value of {} bytes, at least {END_TXN_MARKER_VALUE_BYTES} expected",
                value.len()
            )));
        }
        let version = i16::from_be_bytes([value[0], value[1]]);
        if version < 0 {
            return Err(BatchError::Invalid(format!(
                "end transaction marker version {version}"
            )));
        }
        Ok(Some(Self {
            result,
            coordinator_epoch: i32::from_be_bytes([value[2], value[3], value[4], value[5]]),
        }))
    }
}

/// Builds the marker batch Kafka's `MemoryRecords.withEndTransactionMarker` builds: base
/// offset 0, one record at `timestamp_ms`, producer id and epoch, sequence -1, transactional
/// and control attributes, no compression. The leader assigns its offset and leader epoch.
pub fn end_txn_marker_batch(
    producer_id: i64,
    producer_epoch: i16,
    marker: EndTxnMarker,
    timestamp_ms: i64,
) -> Vec<u8> {
    BatchBuilder::new(0, timestamp_ms)
        .producer(producer_id, producer_epoch, -1)
        .transactional(true, true)
        .compression(Compression::None)
        .record(
            timestamp_ms,
            Some(&marker.key_bytes()[..]),
            Some(&marker.value_bytes()[..]),
            &[],
        )
        .build()
}

/// The end-transaction marker of the control batch `batch` (its header `h`, the whole batch in
/// `batch`): `Ok(None)` for an empty control batch (what the cleaner leaves of a removed
/// transaction) or another control type.
///
/// # Errors
/// [`BatchError`] when `h` is not a control batch, the batch is larger than
/// [`MAX_CONTROL_BATCH_BYTES`], or its first record does not decode.
pub fn parse_end_txn_marker(
    h: &BatchHeader,
    batch: &[u8],
) -> Result<Option<EndTxnMarker>, BatchError> {
    if !h.is_control() {
        return Err(BatchError::Invalid("not a control batch".into()));
    }
    if batch.len() > MAX_CONTROL_BATCH_BYTES {
        return Err(BatchError::Invalid(format!(
            "control batch of {} bytes exceeds {MAX_CONTROL_BATCH_BYTES}",
            batch.len()
        )));
    }
    let records = decode_records_bounded(batch, MAX_CONTROL_BATCH_BYTES)?;
    let Some(first) = records.first() else {
        return Ok(None);
    };
    let Some(key) = first.key.as_deref() else {
        return Err(BatchError::Invalid("control record without a key".into()));
    };
    EndTxnMarker::decode(key, first.value.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::validate_batch;

    #[test]
    fn marker_batch_round_trips_with_kafkas_layout() {
        let marker = EndTxnMarker {
            result: TransactionResult::Abort,
            coordinator_epoch: 7,
        };
        let b = end_txn_marker_batch(42, 3, marker, 1_000);
        let h = validate_batch(&b).unwrap();
        assert!(h.is_control() && h.is_transactional());
        assert_eq!(
            (h.producer_id, h.producer_epoch, h.base_sequence),
            (42, 3, -1)
        );
        assert_eq!(h.records_count, 1);
        assert_eq!(parse_end_txn_marker(&h, &b).unwrap(), Some(marker));
        let records = decode_records_bounded(&b, 4096).unwrap();
        assert_eq!(records[0].key.as_deref(), Some(&[0u8, 0, 0, 0][..]));
        assert_eq!(records[0].value.as_deref(), Some(&[0u8, 0, 0, 0, 0, 7][..]));
        // Kafka's marker batch is 78 bytes.
        assert_eq!(b.len(), 78);
    }

    #[test]
    fn other_control_types_and_bad_values() {
        assert_eq!(EndTxnMarker::decode(&[0, 0, 0, 2], None).unwrap(), None);
        assert!(EndTxnMarker::decode(&[0, 0, 0], Some(&[0; 6])).is_err());
        assert!(EndTxnMarker::decode(&[0, 0, 0, 1], Some(&[0; 5])).is_err());
        assert!(EndTxnMarker::decode(&[0xff, 0xff, 0, 1], Some(&[0; 6])).is_err());
        // A newer value version is read as version 0.
        let m = EndTxnMarker::decode(&[0, 0, 0, 1], Some(&[0, 1, 0, 0, 0, 9, 1, 2])).unwrap();
        assert_eq!(
            m,
            Some(EndTxnMarker {
                result: TransactionResult::Commit,
                coordinator_epoch: 9
            })
        );
    }
}
