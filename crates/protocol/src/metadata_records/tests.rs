//! Round trips of every record at every version, framing errors, and byte-exact checks against
//! encodings worked out by hand from Kafka's schemas.

use std::collections::BTreeMap;

use proptest::prelude::*;
use uuid::Uuid;

use super::generated::arbitrary;
use super::*;

pub(crate) fn arb_string() -> impl Strategy<Value = String> {
    "\\PC{0,6}"
}

pub(crate) fn arb_uuid() -> impl Strategy<Value = Uuid> {
    any::<u128>().prop_map(Uuid::from_u128)
}

/// Finite values only: NaN is not equal to itself, so it cannot be compared after a round
/// trip (its bits survive, see `float64_keeps_its_bits`).
pub(crate) fn arb_f64() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(-1.5), -1e15f64..1e15f64]
}

/// Tags from 100 up: no metadata schema defines one there, so they stay unknown at every
/// version. Ascending, as a decoder sees them after an encode.
pub(crate) fn arb_unknown_tagged_fields() -> impl Strategy<Value = Vec<RawTaggedField>> {
    proptest::collection::btree_map(
        100u32..20_000,
        proptest::collection::vec(any::<u8>(), 0..6),
        0..3,
    )
    .prop_map(|m: BTreeMap<u32, Vec<u8>>| {
        m.into_iter()
            .map(|(tag, data)| RawTaggedField { tag, data })
            .collect()
    })
}

fn arb_versioned() -> impl Strategy<Value = (MetadataRecord, i16)> {
    arbitrary::metadata_record().prop_flat_map(|r| {
        let t = r.record_type();
        let versions = t.lowest_version..=t.highest_version;
        (Just(r), versions)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// encode -> decode gives the record back, fields the version lacks read as defaults.
    #[test]
    fn every_record_round_trips_at_every_version((record, version) in arb_versioned()) {
        let mut expected = record.clone();
        expected.clear_absent_fields(version);
        let framed = encode_framed(&ApiMessageAndVersion::new(expected.clone(), version))
            .expect("a record without values the version lacks encodes");
        let decoded = decode_framed(&framed).expect("what we encode decodes");
        prop_assert_eq!(decoded.version, version);
        prop_assert_eq!(&decoded.record, &expected);
        // And encoding is deterministic: the same bytes again.
        prop_assert_eq!(encode_framed(&decoded).expect("re-encode"), framed);
    }

    /// A record holding a value its version cannot carry is refused, not silently cut.
    #[test]
    fn values_the_version_lacks_are_refused((record, version) in arb_versioned()) {
        let mut cleared = record.clone();
        cleared.clear_absent_fields(version);
        let result = encode_framed(&ApiMessageAndVersion::new(record.clone(), version));
        if cleared == record {
            prop_assert!(result.is_ok());
        } else {
            let is_field_not_in_version = matches!(result, Err(MetadataRecordError::FieldNotInVersion { .. }));
            prop_assert!(is_field_not_in_version, "{:?}", result);
        }
    }

    /// Any bytes: an error or a record, never a panic. A record re-encodes, and that encoding
    /// is a fixed point (the first may differ from the input: booleans other than 0/1,
    /// invalid UTF-8 and tagged fields out of tag order are normalised, as by Kafka).
    #[test]
    fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..96)) {
        if let Ok(r) = decode_framed(&buf) {
            let again = encode_framed(&r).expect("a decoded record re-encodes");
            let back = decode_framed(&again).expect("and decodes");
            prop_assert_eq!(encode_framed(&back).expect("re-encodes"), again);
        }
    }

    /// Every prefix of a valid framed record is an error (truncation is detected), and a byte
    /// appended is refused as trailing.
    #[test]
    fn truncation_and_trailing_bytes_are_errors((record, version) in arb_versioned()) {
        let mut record = record;
        record.clear_absent_fields(version);
        let framed = encode_framed(&ApiMessageAndVersion::new(record, version)).expect("encodes");
        for n in 0..framed.len() {
            prop_assert!(decode_framed(&framed[..n]).is_err(), "prefix of {} bytes decoded", n);
        }
        let mut longer = framed.clone();
        longer.push(0);
        let is_trailing = matches!(decode_framed(&longer), Err(MetadataRecordError::TrailingBytes { count: 1, .. }));
        prop_assert!(is_trailing);
    }
}

fn topic_id() -> Uuid {
    Uuid::from_u128(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10)
}

/// TopicRecord v0 worked out by hand: frame 1, key 2, version 0, COMPACT_STRING "foo",
/// 16-byte uuid, no tagged fields.
#[test]
fn topic_record_bytes() {
    let r = ApiMessageAndVersion::new(
        TopicRecord {
            name: "foo".into(),
            topic_id: topic_id(),
            ..TopicRecord::default()
        },
        0,
    );
    let bytes = encode_framed(&r).unwrap();
    let mut expected = vec![1, 2, 0, 4, b'f', b'o', b'o'];
    expected.extend_from_slice(topic_id().as_bytes());
    expected.push(0);
    assert_eq!(bytes, expected);
    assert_eq!(decode_framed(&bytes).unwrap(), r);
}

/// PartitionChangeRecord v0 with only the leader changed: partition id, topic id, then one
/// tagged field, tag 1 (Leader), 4 bytes. The ISR (tag 0, default null) is not written.
#[test]
fn partition_change_writes_only_changed_tagged_fields() {
    let r = PartitionChangeRecord {
        partition_id: 3,
        topic_id: topic_id(),
        leader: 7,
        ..PartitionChangeRecord::default()
    };
    assert_eq!(
        PartitionChangeRecord::default().leader,
        -2,
        "-2: leader unchanged"
    );
    assert_eq!(PartitionChangeRecord::default().leader_recovery_state, -1);
    let bytes = encode_framed(&ApiMessageAndVersion::new(r.clone(), 0)).unwrap();
    let mut expected = vec![1, 5, 0, 0, 0, 0, 3];
    expected.extend_from_slice(topic_id().as_bytes());
    expected.extend_from_slice(&[1, 1, 4, 0, 0, 0, 7]);
    assert_eq!(bytes, expected);
    let back = decode_framed(&bytes).unwrap();
    assert_eq!(back.record, MetadataRecord::PartitionChange(r));
}

/// A tag that belongs to a field of a later version is an error at an earlier one, as in
/// Kafka ("Tag 8 is not valid for version 0"): PartitionChangeRecord's Directories (tag 8) is
/// v1+.
#[test]
fn tag_of_a_later_version_is_refused() {
    let mut bytes = vec![1, 5, 0, 0, 0, 0, 3];
    bytes.extend_from_slice(topic_id().as_bytes());
    bytes.extend_from_slice(&[1, 8, 1, 1]); // tag 8, size 1, an empty compact array
    assert_eq!(
        decode_framed(&bytes),
        Err(MetadataRecordError::TagNotValidForVersion {
            record: "PartitionChangeRecord",
            tag: 8,
            version: 0
        })
    );
    bytes[2] = 1; // version 1 has Directories
    let r = decode_framed(&bytes).unwrap();
    let MetadataRecord::PartitionChange(pc) = r.record else {
        panic!("not a PartitionChangeRecord")
    };
    assert_eq!(pc.directories, Some(vec![]));
}

#[test]
fn unknown_tagged_fields_are_kept_and_written_back() {
    let mut bytes = vec![1, 2, 0, 2, b'x'];
    bytes.extend_from_slice(topic_id().as_bytes());
    bytes.extend_from_slice(&[2, 5, 1, 0xaa, 9, 0]);
    let r = decode_framed(&bytes).unwrap();
    let MetadataRecord::Topic(t) = &r.record else {
        panic!("not a TopicRecord")
    };
    assert_eq!(
        t.unknown_tagged_fields,
        vec![
            RawTaggedField {
                tag: 5,
                data: vec![0xaa]
            },
            RawTaggedField {
                tag: 9,
                data: vec![]
            }
        ]
    );
    assert_eq!(encode_framed(&r).unwrap(), bytes);
}

#[test]
fn framing_errors_name_what_is_wrong() {
    assert_eq!(
        decode_framed(&[0, 2, 0]),
        Err(MetadataRecordError::UnsupportedFrameVersion(0))
    );
    assert_eq!(
        decode_framed(&[1, 99, 0]),
        Err(MetadataRecordError::UnknownApiKey(99))
    );
    assert_eq!(
        decode_framed(&[1, 2, 1]),
        Err(MetadataRecordError::UnsupportedVersion {
            record: "TopicRecord",
            version: 1,
            lowest: 0,
            highest: 0
        })
    );
    assert_eq!(
        decode_framed(&[1, 2, 0, 4, b'f']),
        Err(MetadataRecordError::Truncated {
            record: "TopicRecord",
            field: "Name"
        })
    );
    assert!(matches!(
        decode_framed(&[1, 2, 0, 0]),
        Err(MetadataRecordError::Invalid {
            record: "TopicRecord",
            field: "Name",
            ..
        })
    ));
    assert_eq!(
        decode_framed(&[]),
        Err(MetadataRecordError::Truncated {
            record: "metadata record frame",
            field: "frame version"
        })
    );
    // A 2^31-element array in a few bytes is refused before anything is allocated.
    let mut bytes = vec![1, 3, 0, 0, 0, 0, 0];
    bytes.extend_from_slice(topic_id().as_bytes());
    bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x07]);
    assert!(matches!(
        decode_framed(&bytes),
        Err(MetadataRecordError::Invalid {
            record: "PartitionRecord",
            field: "Replicas",
            ..
        })
    ));
    assert!(matches!(
        encode_framed(&ApiMessageAndVersion::new(NoOpRecord::default(), 1)),
        Err(MetadataRecordError::UnsupportedVersion { .. })
    ));
    assert!(matches!(
        encode_framed(&ApiMessageAndVersion::new(
            TopicRecord {
                name: "x".repeat(40_000),
                ..TopicRecord::default()
            },
            0
        )),
        Err(MetadataRecordError::StringTooLong { len: 40_000, .. })
    ));
}

#[test]
fn defaults_follow_the_schemas() {
    let b = RegisterBrokerRecord::default();
    assert!(b.fenced, "RegisterBrokerRecord.Fenced defaults to true");
    assert!(!b.in_controlled_shutdown);
    assert_eq!(b.rack, Some(String::new()));
    assert_eq!(b.cordoned_log_dirs, None);
    let p = PartitionRecord::default();
    assert_eq!(
        (p.partition_id, p.leader, p.leader_epoch, p.partition_epoch),
        (-1, -1, -1, -1)
    );
    assert_eq!(p.eligible_leader_replicas, None);
    assert_eq!(ProducerIdsRecord::default().broker_epoch, -1);
    assert_eq!(ConfigRecord::default().value, Some(String::new()));
    assert_eq!(AbortTransactionRecord::default().reason, None);
    assert_eq!(BrokerRegistrationChangeRecord::default().fenced, 0);
}

#[test]
fn float64_keeps_its_bits() {
    let r = ClientQuotaRecord {
        value: f64::NAN,
        ..ClientQuotaRecord::default()
    };
    let bytes = encode_framed(&ApiMessageAndVersion::new(r, 0)).unwrap();
    let MetadataRecord::ClientQuota(back) = decode_framed(&bytes).unwrap().record else {
        panic!("not a ClientQuotaRecord")
    };
    assert_eq!(back.value.to_bits(), f64::NAN.to_bits());
}

#[test]
fn the_type_table_covers_every_api_key_once() {
    let mut keys: Vec<u16> = METADATA_RECORD_TYPES.iter().map(|t| t.api_key).collect();
    keys.dedup();
    assert_eq!(keys.len(), METADATA_RECORD_TYPES.len());
    for t in &METADATA_RECORD_TYPES {
        assert_eq!(
            MetadataRecordType::from_api_key(u32::from(t.api_key)),
            Some(t)
        );
    }
    // What Kafka 4.4.0 defines.
    assert_eq!(METADATA_RECORD_TYPES.len(), 27);
    let rb = MetadataRecordType::from_api_key(0).unwrap();
    assert_eq!(
        (rb.name, rb.lowest_version, rb.highest_version),
        ("RegisterBrokerRecord", 0, 4)
    );
}
