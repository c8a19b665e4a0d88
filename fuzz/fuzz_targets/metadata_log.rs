//! The metadata log file as `FileMetadataLog::open` finds it after a crash: any bytes.
//! Recovery (`decode_frames`) must keep a valid prefix and stop at the first bad frame, and a
//! frame appended after that prefix (as the log appends after cutting the rest) must be read
//! back, with everything before it unchanged.
#![no_main]

use gregor_metadata::log::{decode_frames, encode_frame};
use gregor_metadata::record::MetadataRecord;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (batches, valid) = decode_frames(data);
    assert!(valid <= data.len(), "the valid prefix is inside the file");
    let (again, again_valid) = decode_frames(&data[..valid]);
    assert_eq!(again_valid, valid, "the valid prefix is valid on its own");
    assert_eq!(again.len(), batches.len());
    let rec: MetadataRecord = gregor_protocol::metadata_records::ProducerIdsRecord {
        broker_id: 1,
        broker_epoch: 3,
        next_producer_id: 1000,
        ..Default::default()
    }
    .into();
    let mut file = data[..valid].to_vec();
    file.extend_from_slice(&encode_frame(std::slice::from_ref(&rec)).expect("encoding"));
    let (after, after_valid) = decode_frames(&file);
    assert_eq!(after_valid, file.len(), "the appended frame is read back");
    assert_eq!(after.len(), batches.len() + 1, "the appended record was lost");
    assert_eq!(after.last().map(|b| &b.records[..]), Some(std::slice::from_ref(&rec)));
});
