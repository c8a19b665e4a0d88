//! Metadata records in v2 record batches: what a `__cluster_metadata-0/*.log` segment, a
//! `<offset>-<epoch>.checkpoint` snapshot (KIP-630) and `bootstrap.checkpoint` hold.
//!
//! KRaft (KIP-595) writes two kinds of batches, both with no producer id, no compression by
//! default and the leader epoch in `partitionLeaderEpoch`:
//! - **data batches**: records with a null key whose value is one framed metadata record
//!   ([`super::encode_framed`]); one batch is one atomic append, offsets contiguous;
//! - **control batches** (attribute bit 5): records whose key is `version: int16 = 0,
//!   type: int16` (Kafka's `ControlRecordType`) and whose value is the control message at
//!   version 0, whose own first field is its data version: LeaderChange (2), SnapshotHeader
//!   (3), SnapshotFooter (4), KRaftVersion (5, KIP-853), KRaftVoters (6, KIP-853). The
//!   message structs come from `kafka-protocol`.
//!
//! [`MetadataLogBatches`] walks a whole segment or snapshot; [`build_metadata_batch`] and
//! [`build_control_batch`] write batches that Kafka's `kafka-dump-log
//! --cluster-metadata-decoder` and its raft layer read.

use bytes::Bytes;
use kafka_protocol::messages::{
    KRaftVersionRecord, LeaderChangeMessage, SnapshotFooterRecord, SnapshotHeaderRecord,
    VotersRecord,
};
use kafka_protocol::protocol::{Decodable, Encodable};
use thiserror::Error;

use super::{decode_framed, encode_framed, ApiMessageAndVersion, MetadataRecordError};
use crate::batch::{set_partition_leader_epoch, BatchBuilder, BatchError, BatchHeader, Batches};
use crate::records::decode_records_bounded;

/// Kafka's `ControlRecordType` ids: the second `int16` of a control record's key.
pub mod control_record_type {
    /// Transaction abort marker (not used in the metadata log).
    pub const ABORT: i16 = 0;
    /// Transaction commit marker (not used in the metadata log).
    pub const COMMIT: i16 = 1;
    /// `LeaderChangeMessage`: a new leader's first record of its epoch (KIP-595).
    pub const LEADER_CHANGE: i16 = 2;
    /// `SnapshotHeaderRecord`: the first record of a snapshot (KIP-630).
    pub const SNAPSHOT_HEADER: i16 = 3;
    /// `SnapshotFooterRecord`: the last record of a snapshot (KIP-630).
    pub const SNAPSHOT_FOOTER: i16 = 4;
    /// `KRaftVersionRecord`: the finalized `kraft.version` (KIP-853).
    pub const KRAFT_VERSION: i16 = 5;
    /// `VotersRecord`: the voter set (KIP-853).
    pub const KRAFT_VOTERS: i16 = 6;
}

/// The only control record key version (`CURRENT_CONTROL_RECORD_KEY_VERSION`).
const CONTROL_KEY_VERSION: i16 = 0;

/// The version every KRaft control message is read and written at (Kafka's
/// `ControlRecordUtils.*_CURRENT_VERSION`, all 0).
const CONTROL_MESSAGE_VERSION: i16 = 0;

/// Most bytes a compressed metadata batch may inflate to (Kafka's metadata batches are at most
/// `controller.quorum.append.max.bytes`-ish, far below this).
const MAX_DECOMPRESSED_BATCH_BYTES: usize = 64 << 20;

/// Why bytes are not a metadata log, or records cannot be put in a batch.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MetadataLogError {
    /// The batch itself is broken (truncated, CRC, magic, record framing).
    #[error("batch at byte {position}: {source}")]
    Batch {
        /// Byte position of the batch in the input.
        position: usize,
        /// What is wrong.
        #[source]
        source: BatchError,
    },
    /// A data record's value is not a metadata record.
    #[error("metadata record at offset {offset}: {source}")]
    Record {
        /// Offset of the record.
        offset: i64,
        /// What is wrong.
        #[source]
        source: MetadataRecordError,
    },
    /// A control record's key or value cannot be read.
    #[error("control record at offset {offset}: {reason}")]
    Control {
        /// Offset of the record.
        offset: i64,
        /// What is wrong.
        reason: String,
    },
    /// A data record without a value (KRaft never writes one).
    #[error("metadata record at offset {offset} has a null value")]
    NullValue {
        /// Offset of the record.
        offset: i64,
    },
    /// Record offsets inside a KRaft batch must be contiguous (KRaft's batches are never
    /// compacted).
    #[error("record at offset delta {offset_delta} of the batch at offset {base_offset} should be at delta {expected}")]
    OffsetGap {
        /// Base offset of the batch.
        base_offset: i64,
        /// The record's offset delta.
        offset_delta: i32,
        /// The delta it should have.
        expected: i32,
    },
    /// A batch needs at least one record.
    #[error("a metadata batch needs at least one record")]
    EmptyBatch,
    /// A record could not be encoded.
    #[error("encoding a metadata record: {0}")]
    Encode(#[from] MetadataRecordError),
    /// A control message could not be encoded.
    #[error("encoding a control record: {0}")]
    EncodeControl(String),
}

/// One KRaft control record.
#[derive(Debug, Clone, PartialEq)]
pub enum ControlRecord {
    /// A leader's first record in its epoch, with the voters that elected it.
    LeaderChange(LeaderChangeMessage),
    /// A snapshot's first record.
    SnapshotHeader(SnapshotHeaderRecord),
    /// A snapshot's last record.
    SnapshotFooter(SnapshotFooterRecord),
    /// The finalized `kraft.version`.
    KRaftVersion(KRaftVersionRecord),
    /// The voter set.
    KRaftVoters(VotersRecord),
    /// Any other type (transaction markers, or a type newer than this code): kept raw, and
    /// skipped by KRaft as Kafka does with `ControlRecordType.UNKNOWN`.
    Other {
        /// The control record type.
        record_type: i16,
        /// The raw value.
        value: Option<Bytes>,
    },
}

impl ControlRecord {
    /// The `ControlRecordType` id of this record.
    pub fn record_type(&self) -> i16 {
        match self {
            ControlRecord::LeaderChange(_) => control_record_type::LEADER_CHANGE,
            ControlRecord::SnapshotHeader(_) => control_record_type::SNAPSHOT_HEADER,
            ControlRecord::SnapshotFooter(_) => control_record_type::SNAPSHOT_FOOTER,
            ControlRecord::KRaftVersion(_) => control_record_type::KRAFT_VERSION,
            ControlRecord::KRaftVoters(_) => control_record_type::KRAFT_VOTERS,
            ControlRecord::Other { record_type, .. } => *record_type,
        }
    }

    /// The record's key: key version 0 and the type.
    pub fn key(&self) -> [u8; 4] {
        let mut k = [0u8; 4];
        k[..2].copy_from_slice(&CONTROL_KEY_VERSION.to_be_bytes());
        k[2..].copy_from_slice(&self.record_type().to_be_bytes());
        k
    }

    /// The record's value: the message at version 0 (raw for [`ControlRecord::Other`]).
    ///
    /// # Errors
    /// [`MetadataLogError::EncodeControl`] if `kafka-protocol` refuses the message (a field
    /// out of range for version 0).
    pub fn value(&self) -> Result<Option<Vec<u8>>, MetadataLogError> {
        fn enc<M: Encodable>(m: &M) -> Result<Option<Vec<u8>>, MetadataLogError> {
            let mut out = Vec::new();
            m.encode(&mut out, CONTROL_MESSAGE_VERSION)
                .map_err(|e| MetadataLogError::EncodeControl(e.to_string()))?;
            Ok(Some(out))
        }
        match self {
            ControlRecord::LeaderChange(m) => enc(m),
            ControlRecord::SnapshotHeader(m) => enc(m),
            ControlRecord::SnapshotFooter(m) => enc(m),
            ControlRecord::KRaftVersion(m) => enc(m),
            ControlRecord::KRaftVoters(m) => enc(m),
            ControlRecord::Other { value, .. } => Ok(value.as_ref().map(|v| v.to_vec())),
        }
    }

    /// Decodes a control record from its key and value, as Kafka's `ControlRecordUtils`: the
    /// key's type picks the message, read at version 0; unknown types are kept raw.
    ///
    /// # Errors
    /// [`MetadataLogError::Control`] for a key shorter than 4 bytes or with a negative key
    /// version, a missing value, or a value that is not the message (or has bytes after it).
    pub fn decode(
        offset: i64,
        key: Option<&[u8]>,
        value: Option<&Bytes>,
    ) -> Result<Self, MetadataLogError> {
        let bad = |reason: String| MetadataLogError::Control { offset, reason };
        let key = key.unwrap_or_default();
        if key.len() < 4 {
            return Err(bad(format!(
                "key of {} bytes; a control record key has at least 4",
                key.len()
            )));
        }
        let key_version = i16::from_be_bytes([key[0], key[1]]);
        if key_version < 0 {
            return Err(bad(format!("negative key version {key_version}")));
        }
        let record_type = i16::from_be_bytes([key[2], key[3]]);
        fn dec<M: Decodable>(
            value: Option<&Bytes>,
            what: &str,
            bad: impl Fn(String) -> MetadataLogError,
        ) -> Result<M, MetadataLogError> {
            let mut buf = value
                .cloned()
                .ok_or_else(|| bad(format!("{what} without a value")))?;
            let m = M::decode(&mut buf, CONTROL_MESSAGE_VERSION)
                .map_err(|e| bad(format!("{what}: {e}")))?;
            if !buf.is_empty() {
                return Err(bad(format!("{} bytes follow the {what}", buf.len())));
            }
            Ok(m)
        }
        Ok(match record_type {
            control_record_type::LEADER_CHANGE => {
                ControlRecord::LeaderChange(dec(value, "LeaderChangeMessage", bad)?)
            }
            control_record_type::SNAPSHOT_HEADER => {
                ControlRecord::SnapshotHeader(dec(value, "SnapshotHeaderRecord", bad)?)
            }
            control_record_type::SNAPSHOT_FOOTER => {
                ControlRecord::SnapshotFooter(dec(value, "SnapshotFooterRecord", bad)?)
            }
            control_record_type::KRAFT_VERSION => {
                ControlRecord::KRaftVersion(dec(value, "KRaftVersionRecord", bad)?)
            }
            control_record_type::KRAFT_VOTERS => {
                ControlRecord::KRaftVoters(dec(value, "VotersRecord", bad)?)
            }
            other => ControlRecord::Other {
                record_type: other,
                value: value.cloned(),
            },
        })
    }
}

/// The records of one batch of the metadata log.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchRecords {
    /// A control batch.
    Control(Vec<ControlRecord>),
    /// A data batch of metadata records.
    Metadata(Vec<ApiMessageAndVersion>),
}

impl BatchRecords {
    /// Number of records.
    pub fn len(&self) -> usize {
        match self {
            BatchRecords::Control(r) => r.len(),
            BatchRecords::Metadata(r) => r.len(),
        }
    }

    /// No records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One decoded batch of a metadata log segment or snapshot. Record `i` has offset
/// `header.base_offset + i`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetadataBatch {
    /// Byte position of the batch in the input.
    pub position: usize,
    /// The batch header (`partition_leader_epoch` is the KRaft epoch that wrote it).
    pub header: BatchHeader,
    /// Its records.
    pub records: BatchRecords,
}

/// Decodes one whole batch (`batch` holds exactly it): CRC and record framing checked, records
/// decompressed, and each record decoded as a control record or a framed metadata record.
///
/// # Errors
/// [`MetadataLogError::Batch`] (with `position` 0) for a broken batch, and the record errors of
/// [`MetadataLogError`].
pub fn decode_batch(batch: &[u8]) -> Result<(BatchHeader, BatchRecords), MetadataLogError> {
    let at = |source| MetadataLogError::Batch {
        position: 0,
        source,
    };
    let header = BatchHeader::parse(batch).map_err(at)?;
    let records = decode_records_bounded(batch, MAX_DECOMPRESSED_BATCH_BYTES).map_err(at)?;
    let mut expected = 0i32;
    for r in &records {
        if r.offset_delta != expected {
            return Err(MetadataLogError::OffsetGap {
                base_offset: header.base_offset,
                offset_delta: r.offset_delta,
                expected,
            });
        }
        expected = expected.saturating_add(1);
    }
    let offset = |i: usize| header.base_offset.wrapping_add(i as i64);
    let out = if header.is_control() {
        let mut out = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            out.push(ControlRecord::decode(
                offset(i),
                r.key.as_deref(),
                r.value.as_ref(),
            )?);
        }
        BatchRecords::Control(out)
    } else {
        let mut out = Vec::with_capacity(records.len());
        for (i, r) in records.iter().enumerate() {
            let value = r
                .value
                .as_ref()
                .ok_or(MetadataLogError::NullValue { offset: offset(i) })?;
            out.push(
                decode_framed(value).map_err(|source| MetadataLogError::Record {
                    offset: offset(i),
                    source,
                })?,
            );
        }
        BatchRecords::Metadata(out)
    };
    Ok((header, out))
}

/// The batches of a metadata log segment (`__cluster_metadata-0/<offset>.log`) or snapshot
/// (`*.checkpoint`), front to back. Stops after the first error, which it yields; a torn
/// tail is [`BatchError::Truncated`].
pub struct MetadataLogBatches<'a> {
    buf: &'a [u8],
    batches: Batches<'a>,
    /// Byte position after the last batch read.
    next_position: usize,
    failed: bool,
}

impl<'a> MetadataLogBatches<'a> {
    /// Iterates the batches laid end to end in `buf` (a whole segment or snapshot file).
    pub fn new(buf: &'a [u8]) -> Self {
        Self {
            buf,
            batches: Batches::new(buf),
            next_position: 0,
            failed: false,
        }
    }
}

impl Iterator for MetadataLogBatches<'_> {
    type Item = Result<MetadataBatch, MetadataLogError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let item = match self.batches.next()? {
            Err(source) => Err(MetadataLogError::Batch {
                position: self.next_position,
                source,
            }),
            Ok((position, h)) => {
                self.next_position = position + h.total_size();
                let raw = &self.buf[position..self.next_position];
                decode_batch(raw)
                    .map(|(header, records)| MetadataBatch {
                        position,
                        header,
                        records,
                    })
                    .map_err(|e| match e {
                        MetadataLogError::Batch { source, .. } => {
                            MetadataLogError::Batch { position, source }
                        }
                        other => other,
                    })
            }
        };
        self.failed = item.is_err();
        Some(item)
    }
}

fn finish(
    builder: BatchBuilder,
    leader_epoch: i32,
    count: usize,
) -> Result<Vec<u8>, MetadataLogError> {
    if count == 0 {
        return Err(MetadataLogError::EmptyBatch);
    }
    let mut b = builder.build();
    set_partition_leader_epoch(&mut b, leader_epoch);
    Ok(b)
}

/// One uncompressed data batch of `records` as KRaft writes it: offsets from `base_offset`,
/// `partitionLeaderEpoch` = `leader_epoch`, every record at `append_time_ms` (ms since the
/// epoch) with a null key and its framed record as value, no producer id.
///
/// # Errors
/// [`MetadataLogError::EmptyBatch`] for no records, [`MetadataLogError::Encode`] when a
/// record cannot be written at its version.
pub fn build_metadata_batch(
    base_offset: i64,
    leader_epoch: i32,
    append_time_ms: i64,
    records: &[ApiMessageAndVersion],
) -> Result<Vec<u8>, MetadataLogError> {
    let mut b = BatchBuilder::new(base_offset, append_time_ms);
    for r in records {
        b = b.record(append_time_ms, None, Some(&encode_framed(r)?), &[]);
    }
    finish(b, leader_epoch, records.len())
}

/// One control batch of `records`, laid out as [`build_metadata_batch`] but with the control
/// attribute set and each record's key and value from [`ControlRecord::key`] and
/// [`ControlRecord::value`].
///
/// # Errors
/// [`MetadataLogError::EmptyBatch`], [`MetadataLogError::EncodeControl`].
pub fn build_control_batch(
    base_offset: i64,
    leader_epoch: i32,
    append_time_ms: i64,
    records: &[ControlRecord],
) -> Result<Vec<u8>, MetadataLogError> {
    let mut b = BatchBuilder::new(base_offset, append_time_ms).transactional(false, true);
    for r in records {
        let value = r.value()?;
        b = b.record(append_time_ms, Some(&r.key()), value.as_deref(), &[]);
    }
    finish(b, leader_epoch, records.len())
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::voters_record::{Endpoint, KRaftVersionFeature, Voter};
    use kafka_protocol::protocol::StrBytes;

    use super::*;
    use crate::metadata_records::{FeatureLevelRecord, NoOpRecord, TopicRecord};

    fn voters() -> VotersRecord {
        VotersRecord::default().with_voters(vec![Voter::default()
            .with_voter_id(1.into())
            .with_voter_directory_id(uuid::Uuid::from_u128(9))
            .with_endpoints(vec![Endpoint::default()
                .with_name(StrBytes::from_static_str("CONTROLLER"))
                .with_host(StrBytes::from_static_str("localhost"))
                .with_port(9093)])
            .with_k_raft_version_feature(
                KRaftVersionFeature::default()
                    .with_min_supported_version(0)
                    .with_max_supported_version(1),
            )])
    }

    #[test]
    fn a_segment_of_control_and_data_batches_reads_back() {
        let control = vec![
            ControlRecord::SnapshotHeader(
                SnapshotHeaderRecord::default().with_last_contained_log_timestamp(5),
            ),
            ControlRecord::KRaftVersion(KRaftVersionRecord::default().with_k_raft_version(1)),
            ControlRecord::KRaftVoters(voters()),
        ];
        let data = vec![
            ApiMessageAndVersion::new(
                FeatureLevelRecord {
                    name: "metadata.version".into(),
                    feature_level: 27,
                    ..FeatureLevelRecord::default()
                },
                0,
            ),
            ApiMessageAndVersion::new(
                TopicRecord {
                    name: "t".into(),
                    topic_id: uuid::Uuid::from_u128(3),
                    ..TopicRecord::default()
                },
                0,
            ),
        ];
        let mut seg = build_control_batch(0, 1, 1_000, &control).unwrap();
        seg.extend(build_metadata_batch(3, 1, 1_001, &data).unwrap());
        seg.extend(
            build_metadata_batch(
                5,
                2,
                1_002,
                &[ApiMessageAndVersion::latest(NoOpRecord::default())],
            )
            .unwrap(),
        );
        let batches: Vec<_> = MetadataLogBatches::new(&seg)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(batches.len(), 3);
        assert!(batches[0].header.is_control());
        assert_eq!(batches[0].records, BatchRecords::Control(control));
        assert_eq!(batches[1].header.base_offset, 3);
        assert_eq!(batches[1].header.partition_leader_epoch, 1);
        assert_eq!(batches[1].records, BatchRecords::Metadata(data));
        assert_eq!(batches[2].header.partition_leader_epoch, 2);
        assert_eq!(
            batches[2].position,
            batches[1].position + batches[1].header.total_size()
        );
    }

    #[test]
    fn errors_say_where() {
        let good = build_metadata_batch(
            0,
            1,
            0,
            &[ApiMessageAndVersion::latest(NoOpRecord::default())],
        )
        .unwrap();
        let mut seg = good.clone();
        seg.extend_from_slice(&good[..30]);
        let items: Vec<_> = MetadataLogBatches::new(&seg).collect();
        assert_eq!(items.len(), 2);
        assert!(items[0].is_ok());
        assert!(matches!(
            &items[1],
            Err(MetadataLogError::Batch {
                position,
                source: BatchError::Truncated { .. }
            }) if *position == good.len()
        ));
        // A data record whose value is not a framed record.
        let bad = BatchBuilder::new(7, 0)
            .record(0, None, Some(&[1, 200, 1]), &[])
            .build();
        assert!(matches!(
            decode_batch(&bad),
            Err(MetadataLogError::Record {
                offset: 7,
                source: MetadataRecordError::UnknownApiKey(200)
            })
        ));
        let bad = BatchBuilder::new(7, 0)
            .transactional(false, true)
            .record(0, Some(&[0, 0]), None, &[])
            .build();
        assert!(matches!(
            decode_batch(&bad),
            Err(MetadataLogError::Control { offset: 7, .. })
        ));
        assert_eq!(
            build_metadata_batch(0, 0, 0, &[]),
            Err(MetadataLogError::EmptyBatch)
        );
    }

    use proptest::prelude::*;

    proptest! {
        /// Any records at any of their versions, in batches laid end to end, read back as
        /// written (fields a version lacks as defaults), with contiguous offsets.
        #[test]
        fn batches_of_any_records_read_back(
            batches in proptest::collection::vec(
                proptest::collection::vec(
                    crate::metadata_records::generated::arbitrary::metadata_record()
                        .prop_flat_map(|r| {
                            let t = r.record_type();
                            (Just(r), t.lowest_version..=t.highest_version)
                        }),
                    1..5,
                ),
                1..4,
            )
        ) {
            let mut segment = Vec::new();
            let mut expected = Vec::new();
            let mut offset = 0i64;
            for (epoch, records) in batches.into_iter().enumerate() {
                let records: Vec<ApiMessageAndVersion> = records
                    .into_iter()
                    .map(|(mut r, v)| {
                        r.clear_absent_fields(v);
                        ApiMessageAndVersion::new(r, v)
                    })
                    .collect();
                let epoch = i32::try_from(epoch).unwrap();
                segment.extend(build_metadata_batch(offset, epoch, 7, &records).unwrap());
                expected.push((offset, epoch, records.clone()));
                offset += i64::try_from(records.len()).unwrap();
            }
            let got: Vec<_> = MetadataLogBatches::new(&segment)
                .collect::<Result<_, _>>()
                .unwrap();
            prop_assert_eq!(got.len(), expected.len());
            for (b, (offset, epoch, records)) in got.into_iter().zip(expected) {
                prop_assert_eq!(b.header.base_offset, offset);
                prop_assert_eq!(b.header.partition_leader_epoch, epoch);
                prop_assert_eq!(b.records, BatchRecords::Metadata(records));
            }
        }
    }

    #[test]
    fn unknown_control_types_are_kept_raw() {
        let other = ControlRecord::Other {
            record_type: 42,
            value: Some(Bytes::from_static(b"xyz")),
        };
        let b = build_control_batch(0, 0, 0, std::slice::from_ref(&other)).unwrap();
        assert_eq!(
            decode_batch(&b).unwrap().1,
            BatchRecords::Control(vec![other])
        );
    }
}
