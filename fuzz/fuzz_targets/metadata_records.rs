//! Any bytes as a KIP-631 framed metadata record (`decode_framed`) and as a
//! `__cluster_metadata` segment or snapshot (`MetadataLogBatches`): errors, never panics or
//! allocations beyond the input's size. What decodes is re-encoded, and the re-encoding is a
//! fixed point (the first may normalise: booleans other than 0/1, invalid UTF-8, tag order);
//! a decoded batch rebuilt from its records decodes to the same records.
#![no_main]

use gregor_protocol::metadata_records::log::{
    build_control_batch, build_metadata_batch, decode_batch, BatchRecords, MetadataLogBatches,
};
use gregor_protocol::metadata_records::{decode_framed, encode_framed, MetadataRecordError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = decode_framed(data) {
        match encode_framed(&record) {
            Ok(again) => {
                let back = decode_framed(&again).expect("what we encode decodes");
                assert_eq!(encode_framed(&back).expect("and re-encodes"), again);
            }
            // Invalid UTF-8 read as U+FFFD (3 bytes) can push a string past 32767 bytes, as
            // in Kafka, which then refuses to write it too.
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
            BatchRecords::Metadata(records) => build_metadata_batch(
                h.base_offset,
                h.partition_leader_epoch,
                h.base_timestamp,
                records,
            ),
            BatchRecords::Control(records) => build_control_batch(
                h.base_offset,
                h.partition_leader_epoch,
                h.base_timestamp,
                records,
            ),
        };
        if let Ok(rebuilt) = rebuilt {
            let (_, again) = decode_batch(&rebuilt).expect("a rebuilt batch decodes");
            // Debug, not ==: a float64 NaN (ClientQuotaRecord) is not equal to itself.
            assert_eq!(format!("{again:?}"), format!("{:?}", batch.records));
        }
    }
});
