//! The metadata log file as `FileMetadataLog::open` finds it after a crash: any bytes. Opening
//! must keep the valid prefix and cut the rest, so that a record appended afterwards is read
//! back after a reopen.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use gregor_metadata::log::{FileMetadataLog, MetadataLog, METADATA_LOG_FILE};
use gregor_metadata::record::MetadataRecord;
use libfuzzer_sys::fuzz_target;

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        base.join(format!("gregor-fuzz-metadata-log-{}", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = dir();
    std::fs::create_dir_all(dir).expect("creating the fuzz directory");
    std::fs::write(dir.join(METADATA_LOG_FILE), data).expect("writing the log file");
    let Ok(log) = FileMetadataLog::open(dir) else {
        return;
    };
    let before = log.read_all().expect("reading after open").len();
    let rec = MetadataRecord::ProducerIds {
        broker_id: 1,
        next_producer_id: 1000,
    };
    log.append(std::slice::from_ref(&rec)).expect("appending");
    drop(log);
    let log = FileMetadataLog::open(dir).expect("reopening");
    let all = log.read_all().expect("reading after reopen");
    assert_eq!(all.len(), before + 1, "the appended record was lost");
    assert_eq!(all.last(), Some(&rec));
});
