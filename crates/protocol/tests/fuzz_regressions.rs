//! Inputs the fuzz targets in `fuzz/` found, kept as regression tests (issue 9, defect 2).
//!
//! `fuzz_regressions/record_batch/` holds crashing inputs of the `record_batch` target as
//! they were found; each is replayed through the same steps as the target. Findings of the
//! `request` target are written out below with the API and version the target chose.

use bytes::{Bytes, BytesMut};
use gregor_protocol::batch::{
    set_base_offset, set_log_append_time, set_partition_leader_epoch, validate_batch, BatchHeader,
    Batches,
};
use gregor_protocol::records::decode_records_bounded;
use kafka_protocol::messages::{ApiKey, DescribeClusterRequest, RequestKind};
use kafka_protocol::protocol::{Decodable, Encodable};

/// The steps of `fuzz/fuzz_targets/record_batch.rs`.
fn record_batch_steps(data: &[u8]) {
    for item in Batches::new(data) {
        let Ok((at, h)) = item else {
            break;
        };
        let raw = &data[at..at + h.total_size()];
        let _ = (h.last_offset(), h.next_offset(), h.last_sequence());
        let Ok(valid) = validate_batch(raw) else {
            continue;
        };
        let mut patched = raw.to_vec();
        set_base_offset(&mut patched, 1 << 40);
        set_partition_leader_epoch(&mut patched, 7);
        set_log_append_time(&mut patched, 1_700_000_000_000);
        assert!(validate_batch(&patched).is_ok());
        if let Ok(records) = decode_records_bounded(raw, 1 << 20) {
            assert_eq!(records.len(), valid.records_count as usize);
        }
    }
}

#[test]
fn record_batch_findings_replay_without_panicking() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz_regressions/record_batch");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the regression directory exists") {
        let path = entry.expect("a directory entry").path();
        let data = std::fs::read(&path).expect("a readable regression input");
        record_batch_steps(&data);
        n += 1;
    }
    assert!(n > 0, "no inputs in {}", dir.display());
}

/// Found by `record_batch`: a batch whose `baseOffset` is near `i64::MAX` (or `i64::MIN` with a
/// negative delta) made `last_offset` overflow, a panic in debug builds. It wraps, as Java's
/// `DefaultRecordBatch.lastOffset`.
#[test]
fn last_offset_wraps_as_in_kafka() {
    let mut b = gregor_protocol::batch::BatchBuilder::new(0, 0)
        .record(0, None, Some(b"a"), &[])
        .record(0, None, Some(b"b"), &[])
        .build();
    set_base_offset(&mut b, i64::MAX);
    let h = BatchHeader::parse(&b).expect("a header");
    assert_eq!(h.last_offset(), i64::MIN);
    assert_eq!(h.next_offset(), i64::MIN + 1);
}

/// Found by `request` (DescribeCluster v1): this body decoded, but its re-encoding did not
/// decode again. Its tagged fields include one whose tag is 2^31 or more, kept by kafka-protocol
/// as a negative key, which the encoder counted but did not write.
#[test]
fn describe_cluster_finding_round_trips() {
    let body: &[u8] = &[
        0x04, 0x04, 0x04, 0x04, 0x04, 0x26, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0d, 0x04,
        0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04,
        0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x00,
    ];
    let mut b = Bytes::copy_from_slice(body);
    let req = RequestKind::decode(ApiKey::DescribeCluster, &mut b, 1).expect("decodes");
    let mut first = BytesMut::new();
    req.encode(&mut first, 1).expect("encodes");
    let first = first.freeze();
    let back = RequestKind::decode(ApiKey::DescribeCluster, &mut first.clone(), 1)
        .expect("the re-encoding decodes");
    let mut second = BytesMut::new();
    back.encode(&mut second, 1).expect("encodes again");
    assert_eq!(first, second.freeze());
}

/// A varint whose fifth byte still has its continuation bit used to end silently, so the next
/// byte was read as the following field. Kafka's `ByteUtils.readUnsignedVarint` rejects it; so
/// does the patched kafka-protocol (found reading the decoder while fixing the finding above).
#[test]
fn overlong_varint_is_rejected() {
    // DescribeCluster v1: two flags, then a tagged-field count of six varint bytes.
    let body: &[u8] = &[0x00, 0x01, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00];
    let mut b = Bytes::copy_from_slice(body);
    let err = RequestKind::decode(ApiKey::DescribeCluster, &mut b, 1)
        .expect_err("an over-long varint must not decode");
    assert!(
        format!("{err:#}").contains("Varint is too long"),
        "unexpected error {err:#}"
    );
}

/// The other half of the same finding: an unknown tagged field whose tag is 2^31 or more
/// (kept as a negative key) was counted but not written when the request was encoded, so the
/// encoding did not decode. Now it is written after the other tags, as Kafka writes raw tags.
#[test]
fn unknown_tag_above_i32_max_survives_a_round_trip() {
    // DescribeCluster v1: include_cluster_authorized_operations, endpoint_type, then one
    // tagged field with tag 2^32 - 1 and two bytes of data.
    let body: &[u8] = &[
        0x01, 0x01, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x02, 0xaa, 0xbb,
    ];
    let mut b = Bytes::copy_from_slice(body);
    let req = DescribeClusterRequest::decode(&mut b, 1).expect("decodes");
    assert_eq!(req.unknown_tagged_fields.len(), 1);
    let mut out = BytesMut::new();
    req.encode(&mut out, 1).expect("encodes");
    assert_eq!(&out[..], body);
    let back = DescribeClusterRequest::decode(&mut out.freeze(), 1).expect("decodes again");
    assert_eq!(back, req);
}

/// The steps of `fuzz/fuzz_targets/metadata_records.rs`.
fn metadata_records_steps(data: &[u8]) {
    use gregor_protocol::metadata_records::log::{
        build_control_batch, build_metadata_batch, decode_batch, BatchRecords, MetadataLogBatches,
    };
    use gregor_protocol::metadata_records::{decode_framed, encode_framed, MetadataRecordError};
    if let Ok(record) = decode_framed(data) {
        match encode_framed(&record) {
            Ok(again) => {
                let back = decode_framed(&again).expect("what we encode decodes");
                assert_eq!(encode_framed(&back).expect("and re-encodes"), again);
            }
            Err(MetadataRecordError::StringTooLong { .. }) => {}
            Err(e) => panic!("a decoded record does not re-encode: {e}"),
        }
    }
    for batch in MetadataLogBatches::new(data) {
        let Ok(batch) = batch else {
            break;
        };
        let h = batch.header;
        let rebuilt = match &batch.records {
            BatchRecords::Metadata(r) => {
                build_metadata_batch(h.base_offset, h.partition_leader_epoch, h.base_timestamp, r)
            }
            BatchRecords::Control(r) => {
                build_control_batch(h.base_offset, h.partition_leader_epoch, h.base_timestamp, r)
            }
        };
        if let Ok(rebuilt) = rebuilt {
            let (_, again) = decode_batch(&rebuilt).expect("a rebuilt batch decodes");
            assert_eq!(format!("{again:?}"), format!("{:?}", batch.records));
        }
    }
}

/// The `metadata_records` target's committed seeds (every record type at every version, a
/// segment, the Kafka-written fixture) through the target's steps, on the stable toolchain.
/// 300 s of fuzzing from them (`cargo xtask fuzz --target metadata_records --seconds 300
/// --dev`, 2026-12-01) found nothing to add here.
#[test]
fn metadata_records_corpus_replays_without_panicking() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/metadata_records");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the corpus directory exists") {
        let path = entry.expect("a directory entry").path();
        let data = std::fs::read(&path).expect("a readable seed");
        metadata_records_steps(&data);
        // Every prefix too: truncated records and torn segment tails.
        for cut in [1, 2, 3, data.len() / 2, data.len().saturating_sub(1)] {
            metadata_records_steps(&data[..cut.min(data.len())]);
        }
        n += 1;
    }
    assert!(n > 30, "only {n} seeds in {}", dir.display());
}
