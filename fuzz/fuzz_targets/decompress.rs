//! Each compression codec: the first byte picks the codec (none, gzip, snappy, lz4, zstd), the
//! rest is decompressed with a 1 MiB bound, then compressed and decompressed again, which must
//! give back the same bytes.
#![no_main]

use gregor_protocol::batch::Compression;
use gregor_protocol::compression::{compress, decompress_bounded};
use libfuzzer_sys::fuzz_target;

const MAX_DECOMPRESSED_BYTES: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let [c, rest @ ..] = data else {
        return;
    };
    let Some(codec) = Compression::from_id(i16::from(*c % 5)) else {
        return;
    };
    if let Ok(out) = decompress_bounded(codec, rest, MAX_DECOMPRESSED_BYTES) {
        assert!(out.len() <= MAX_DECOMPRESSED_BYTES);
    }
    let packed = compress(codec, rest).expect("compressing a small input");
    let back = decompress_bounded(codec, &packed, rest.len()).expect("own output decompresses");
    assert_eq!(back, rest, "{codec:?} round trip");
});
