//! Regression tests for issue 9, defect 1: no count or length read off the wire may size an
//! allocation beyond what the bytes present can back.
//!
//! This test binary installs a global allocator that refuses any single allocation above
//! [`LIMIT_BYTES`] while it is armed (the process then aborts with "memory allocation of N bytes
//! failed", which is what a broker would do). Every request type kafka-protocol knows, at every
//! version it knows (a superset of what the broker advertises), is encoded, grown so that nested
//! arrays hold an element, and then each position of the body is overwritten with the largest
//! array count / length the wire allows (int32 0x7fffffff, unsigned varint 0xffffffff, int16
//! 0x7fff). Decoding these frames of a few hundred bytes must fail or succeed without asking for
//! more than [`LIMIT_BYTES`] at once. The same is checked for record batches, compression codecs
//! and frames of the internal record schemas this crate decodes.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use bytes::BytesMut;
use gregor_protocol::batch::{BatchBuilder, Compression};
use gregor_protocol::frame::{decode_request, DecodedRequest};
use kafka_protocol::messages::{ApiKey, RequestHeader};
use kafka_protocol::protocol::{Encodable, StrBytes};

include!("support/requests.rs");

/// Largest single allocation allowed while armed, in bytes. The frames decoded here are at
/// most a few KiB; kafka-protocol's patched arrays reserve at most 64 KiB up front.
const LIMIT_BYTES: usize = 1 << 20;

static ARMED: AtomicBool = AtomicBool::new(false);
static LARGEST_BYTES: AtomicUsize = AtomicUsize::new(0);

/// [`System`], refusing allocations above [`LIMIT_BYTES`] while [`ARMED`].
struct Limited;

// SAFETY: every call is forwarded to `System` unchanged, except that an oversized request while
// armed returns null, which `GlobalAlloc` allows (it signals allocation failure).
unsafe impl GlobalAlloc for Limited {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            LARGEST_BYTES.fetch_max(layout.size(), Ordering::Relaxed);
            if layout.size() > LIMIT_BYTES {
                return std::ptr::null_mut();
            }
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            LARGEST_BYTES.fetch_max(layout.size(), Ordering::Relaxed);
            if layout.size() > LIMIT_BYTES {
                return std::ptr::null_mut();
            }
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through `alloc`/`realloc` above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            LARGEST_BYTES.fetch_max(new_size, Ordering::Relaxed);
            if new_size > LIMIT_BYTES {
                return std::ptr::null_mut();
            }
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Limited = Limited;

/// Tests arm the allocator one at a time (the harness runs tests on several threads).
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `f` with the allocator armed; returns the largest single allocation it asked for.
fn armed<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST_BYTES.store(0, Ordering::Relaxed);
    ARMED.store(true, Ordering::SeqCst);
    let out = f();
    ARMED.store(false, Ordering::SeqCst);
    (out, LARGEST_BYTES.load(Ordering::Relaxed))
}

fn all_versions(_: ApiKey) -> Option<(i16, i16)> {
    Some((i16::MIN, i16::MAX))
}

fn header(api_key: ApiKey, version: i16) -> BytesMut {
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(api_key as i16)
        .with_request_api_version(version)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("alloc-test")))
        .encode(&mut buf, api_key.request_header_version(version))
        .expect("a default header encodes");
    buf
}

/// Every body of `bodies` with each position overwritten by a maximal count or length.
fn hostile_variants(body: &[u8]) -> Vec<Vec<u8>> {
    const MAXIMA: [&[u8]; 4] = [
        &[0x7f, 0xff, 0xff, 0xff],       // int32 array count / bytes length
        &[0xff, 0xff, 0xff, 0xff, 0x0f], // unsigned varint 2^32 - 1 (compact)
        &[0xff, 0xff, 0xff, 0x7f],       // unsigned varint 2^28 - 1
        &[0x7f, 0xff],                   // int16 string length
    ];
    let mut out = Vec::new();
    for at in 0..=body.len() {
        for m in MAXIMA {
            // Overwrite in place, and insert (a varint count may be one byte in the original).
            let mut v = body[..at].to_vec();
            v.extend_from_slice(m);
            v.extend_from_slice(body.get(at + m.len()..).unwrap_or_default());
            out.push(v);
            let mut v = body[..at].to_vec();
            v.extend_from_slice(m);
            v.extend_from_slice(body.get(at + 1..).unwrap_or_default());
            out.push(v);
        }
    }
    out
}

#[test]
fn every_request_type_and_version_decodes_hostile_counts_within_the_limit() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut frames = 0usize;
    let mut combos = 0usize;
    let mut all_combos = 0usize;
    let mut worst = (0usize, String::new());
    for api_key in ApiKey::iter() {
        let range = api_key.valid_versions();
        for version in range.min..=range.max {
            all_combos += 1;
            let bodies = grown_bodies(api_key, version);
            if bodies.is_empty() {
                continue;
            }
            combos += 1;
            let head = header(api_key, version);
            for body in &bodies {
                for hostile in hostile_variants(body) {
                    let mut f = head.clone();
                    f.extend_from_slice(&hostile);
                    let f = f.freeze();
                    let len = f.len();
                    let (_, largest) = armed(|| {
                        let _ = decode_request(f, &all_versions);
                    });
                    frames += 1;
                    if largest > worst.0 {
                        worst = (largest, format!("{api_key:?} v{version}, {len} bytes"));
                    }
                }
            }
        }
    }
    // A default request may not encode at a version where one of its defaults is not
    // representable; nearly all do.
    assert!(
        combos * 10 >= all_combos * 9,
        "only {combos} of {all_combos} api key/version pairs encoded"
    );
    assert!(
        worst.0 <= LIMIT_BYTES,
        "largest allocation {} bytes ({})",
        worst.0,
        worst.1
    );
    eprintln!(
        "{frames} hostile frames over {combos} api key/versions; largest allocation {} bytes ({})",
        worst.0, worst.1
    );
}

#[test]
fn produce_with_nested_hostile_partition_count_is_malformed_not_an_abort() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Produce v8 (non-flexible): transactional id null, acks, timeout, one topic "t" whose
    // partition array claims 2^31 - 1 entries.
    let mut f = header(ApiKey::Produce, 8);
    f.extend_from_slice(&[0xff, 0xff, 0, 1, 0, 0, 0x75, 0x30, 0, 0, 0, 1, 0, 1, b't']);
    f.extend_from_slice(&[0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
    let (res, largest) = armed(|| decode_request(f.freeze(), &all_versions));
    assert!(largest <= LIMIT_BYTES, "allocated {largest} bytes");
    match res {
        Err(e) => assert!(
            e.to_string()
                .contains("Tried to allocate a collection of size 2147483647"),
            "unexpected error {e}"
        ),
        Ok(DecodedRequest::Request { .. }) => panic!("a 2^31 - 1 partition array decoded"),
        Ok(other) => panic!("unexpected {other:?}"),
    }
}

#[test]
fn record_batch_and_record_decoding_stay_within_the_limit() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let batch = BatchBuilder::new(0, 1_000)
        .record(
            1_000,
            Some(b"k"),
            Some(b"v"),
            &[("h".into(), Some(b"x".to_vec()))],
        )
        .record(1_001, None, Some(b"w"), &[])
        .build();
    let mut largest_seen = 0;
    for body in hostile_variants(&batch[61..]) {
        let mut b = batch[..61].to_vec();
        b.extend_from_slice(&body);
        // Fix up batchLength and the CRC so that decoding gets past the framing checks.
        let len = (b.len() - 12) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        let crc = gregor_protocol::batch::compute_crc(&b);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        let (_, largest) = armed(|| {
            let _ = gregor_protocol::batch::validate_batch(&b);
            let _ = gregor_protocol::records::decode_records_bounded(&b, LIMIT_BYTES / 2);
        });
        largest_seen = largest_seen.max(largest);
    }
    assert!(
        largest_seen <= LIMIT_BYTES,
        "allocated {largest_seen} bytes"
    );
}

#[test]
fn decompression_of_small_inputs_is_bounded_by_the_caller_limit() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // 16 MiB of zeros compresses to a few KiB with every codec; a 256 KiB limit must stop it.
    let zeros = vec![0u8; 16 << 20];
    for codec in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let small = gregor_protocol::compression::compress(codec, &zeros).expect("compresses");
        let (res, largest) =
            armed(|| gregor_protocol::compression::decompress_bounded(codec, &small, 256 << 10));
        assert!(
            matches!(
                res,
                Err(gregor_protocol::compression::CompressionError::TooLarge { .. })
            ),
            "{codec:?}: {res:?}"
        );
        assert!(
            largest <= LIMIT_BYTES,
            "{codec:?} allocated {largest} bytes"
        );
    }
}
