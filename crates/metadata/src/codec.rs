//! PROVISIONAL (task A): the record codec's signatures, serde_json inside, so the KRaft
//! adapter builds. Replaced at merge by the KIP-631 codec.

use crate::record::MetadataRecord;

/// A record that cannot be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[error("metadata record codec: {0}")]
pub struct RecordCodecError(pub String);

/// Encodes one record as the value of a record in `__cluster_metadata`.
///
/// # Errors
/// [`RecordCodecError`] when the record cannot be serialised.
pub fn encode_record(record: &MetadataRecord) -> Result<bytes::Bytes, RecordCodecError> {
    serde_json::to_vec(record)
        .map(bytes::Bytes::from)
        .map_err(|e| RecordCodecError(e.to_string()))
}

/// Decodes one record value.
///
/// # Errors
/// [`RecordCodecError`] when the bytes are not a record.
pub fn decode_record(bytes: &[u8]) -> Result<MetadataRecord, RecordCodecError> {
    serde_json::from_slice(bytes).map_err(|e| RecordCodecError(e.to_string()))
}
