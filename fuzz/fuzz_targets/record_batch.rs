//! Record batches as a produce request's `records` carries them: walk the batches, validate
//! each (the produce path), patch what the leader patches and check the batch still
//! validates, then decode the records (compacted topics, re-compression, the cleaner) with a
//! 1 MiB bound on the decompressed records.
#![no_main]

use gregor_protocol::batch::{
    set_base_offset, set_log_append_time, set_partition_leader_epoch, validate_batch, Batches,
};
use gregor_protocol::records::decode_records_bounded;
use libfuzzer_sys::fuzz_target;

const MAX_DECOMPRESSED_BYTES: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    for item in Batches::new(data) {
        let Ok((at, h)) = item else {
            break;
        };
        let raw = &data[at..at + h.total_size()];
        let _ = (
            h.last_offset(),
            h.next_offset(),
            h.last_sequence(),
            h.timestamp_type(),
        );
        let Ok(valid) = validate_batch(raw) else {
            continue;
        };
        let mut patched = raw.to_vec();
        set_base_offset(&mut patched, 1 << 40);
        set_partition_leader_epoch(&mut patched, 7);
        set_log_append_time(&mut patched, 1_700_000_000_000);
        let after = validate_batch(&patched);
        assert!(
            after.is_ok(),
            "a valid batch no longer validates after patching: {after:?}"
        );
        if let Ok(records) = decode_records_bounded(raw, MAX_DECOMPRESSED_BYTES) {
            assert_eq!(records.len(), valid.records_count as usize);
        }
    }
});
