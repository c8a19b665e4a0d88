//! The bytes of one metadata record in KRaft's `__cluster_metadata` log: Kafka's
//! `MetadataRecordSerde` framing (unsigned varints frame version 1, api key, record version,
//! then the body; KIP-631) at the record version Kafka 4.4 writes for `metadata.version` 33
//! (4.4-IV2, what `kafka-storage format` of 4.4 gives a new cluster).
//!
//! Which version Kafka 4.4 writes (checked against the log of a real 4.4.0 controller,
//! `crates/protocol/tests/data/kraft-4.4.0/`): `RegisterBrokerRecord` v4
//! (`MetadataVersion.registerBrokerRecordVersion`), `PartitionRecord` and
//! `PartitionChangeRecord` v2 (ELR is on in a new 4.4 cluster), every other type its only
//! version 0, except `BrokerRegistrationChangeRecord`, which Kafka's controller writes at the
//! lowest version that holds what changed (v0 to fence or unfence, v1 for controlled shutdown,
//! v2 with log dirs, v3 with cordoned log dirs).

use bytes::Bytes;
use gregor_protocol::metadata_records::{
    decode_framed, encode_framed, ApiMessageAndVersion, MetadataRecordError,
};
use thiserror::Error;

use crate::record::MetadataRecord;

/// Why a record cannot be written, or bytes are not a metadata record.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RecordCodecError {
    /// The record cannot be written at the version Kafka 4.4 uses (a field that version lacks
    /// holds a non-default value, or a string is longer than 32767 bytes).
    #[error("cannot encode {record}: {source}")]
    Encode {
        /// The record type, e.g. `PartitionRecord`.
        record: &'static str,
        /// Why.
        #[source]
        source: MetadataRecordError,
    },
    /// The bytes are not one framed metadata record of a known type and version.
    #[error("cannot decode a metadata record: {0}")]
    Decode(#[source] MetadataRecordError),
}

/// The version Kafka 4.4 writes `record` at for `metadata.version` 33.
///
/// # Errors
/// [`RecordCodecError::Encode`] for a `BrokerRegistrationChangeRecord` that no version holds.
pub fn kafka_version(record: &MetadataRecord) -> Result<i16, RecordCodecError> {
    let t = record.record_type();
    match record {
        MetadataRecord::BrokerRegistrationChange(_) => {
            // The lowest version that holds every field that is not its default.
            let mut last = None;
            for v in t.lowest_version..=t.highest_version {
                match encode_framed(&ApiMessageAndVersion::new(record.clone(), v)) {
                    Ok(_) => return Ok(v),
                    Err(e) => last = Some(e),
                }
            }
            Err(RecordCodecError::Encode {
                record: t.name,
                source: last.unwrap_or(MetadataRecordError::UnsupportedVersion {
                    record: t.name,
                    version: 0,
                    lowest: t.lowest_version,
                    highest: t.highest_version,
                }),
            })
        }
        _ => Ok(t.highest_version),
    }
}

/// Encodes `record` as the value of one record of a metadata batch: Kafka's framing at the
/// version Kafka 4.4 writes (see the module docs).
///
/// # Errors
/// [`RecordCodecError::Encode`] when a field holds what that version cannot carry.
pub fn encode_record(record: &MetadataRecord) -> Result<Bytes, RecordCodecError> {
    let version = kafka_version(record)?;
    encode_framed(&ApiMessageAndVersion::new(record.clone(), version))
        .map(Bytes::from)
        .map_err(|source| RecordCodecError::Encode {
            record: record.record_type().name,
            source,
        })
}

/// Decodes the value of one record of a metadata batch (any version Kafka's schemas list). The
/// version is not kept: [`encode_record`] picks Kafka 4.4's again.
///
/// # Errors
/// [`RecordCodecError::Decode`]: not frame version 1, an unknown api key or version, a
/// truncated or malformed body, or bytes after it. Every length is checked against the bytes
/// left before anything is allocated.
pub fn decode_record(value: &[u8]) -> Result<MetadataRecord, RecordCodecError> {
    decode_framed(value)
        .map(|r| r.record)
        .map_err(RecordCodecError::Decode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_protocol::metadata_records::{
        BrokerRegistrationChangeRecord, NoOpRecord, PartitionChangeRecord, RegisterBrokerRecord,
    };

    fn version_on_wire(bytes: &[u8]) -> u8 {
        // Frame version 1, api key (< 128: one byte), version (one byte).
        bytes[2]
    }

    #[test]
    fn versions_are_those_kafka_4_4_writes() {
        let v = |r: MetadataRecord| version_on_wire(&encode_record(&r).unwrap());
        assert_eq!(v(RegisterBrokerRecord::default().into()), 4);
        assert_eq!(v(PartitionChangeRecord::default().into()), 2);
        assert_eq!(v(NoOpRecord::default().into()), 0);
        let change = |fenced, in_controlled_shutdown| BrokerRegistrationChangeRecord {
            broker_id: 1,
            broker_epoch: 12,
            fenced,
            in_controlled_shutdown,
            ..BrokerRegistrationChangeRecord::default()
        };
        assert_eq!(v(change(-1, 0).into()), 0, "unfence");
        assert_eq!(v(change(1, 0).into()), 0, "fence");
        assert_eq!(v(change(0, 1).into()), 1, "controlled shutdown");
        let cordoned = BrokerRegistrationChangeRecord {
            cordoned_log_dirs: Some(vec![]),
            ..change(0, 0)
        };
        assert_eq!(v(cordoned.into()), 3);
    }

    #[test]
    fn decode_refuses_garbage_and_trailing_bytes() {
        let mut b = encode_record(&NoOpRecord::default().into())
            .unwrap()
            .to_vec();
        assert_eq!(
            decode_record(&b).unwrap(),
            MetadataRecord::NoOp(NoOpRecord::default())
        );
        b.push(0);
        assert!(matches!(
            decode_record(&b),
            Err(RecordCodecError::Decode(
                MetadataRecordError::TrailingBytes { .. }
            ))
        ));
        assert!(decode_record(&[]).is_err());
        assert!(decode_record(&[0, 0, 0]).is_err(), "frame version 0");
        assert!(decode_record(&[1, 99, 0]).is_err(), "unknown api key");
    }
}
