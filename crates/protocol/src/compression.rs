//! Compression codecs of record batches: gzip, snappy, lz4 and zstd, as Kafka clients use them.
//!
//! The records section of a v2 batch (everything after the 61-byte header) is compressed as a
//! whole with the codec named in attribute bits 0-2 (Kafka protocol guide, "Record Batch";
//! <https://kafka.apache.org/documentation/#recordbatch>). Wire formats, matching Apache Kafka's
//! `org.apache.kafka.common.compress` classes:
//!
//! - **gzip**: an RFC 1952 stream (`GZIPOutputStream`); concatenated members are accepted.
//! - **snappy**: Java clients send snappy-java's *xerial* framing: the 8-byte magic
//!   `\x82SNAPPY\0`, a big-endian i32 version and an i32 minimum compatible version, then
//!   repeated `[big-endian u32 length][raw snappy block]`. librdkafka may send one raw snappy
//!   block instead. Both are decoded; xerial is written, as Java does.
//! - **lz4**: a standard LZ4 frame (Kafka >= 0.10 writes correct header checksums, KIP-57),
//!   written with independent 64 KiB blocks and no content checksum, as
//!   `Lz4BlockOutputStream` does.
//! - **zstd**: a standard Zstandard frame (KIP-110), level 3 as Kafka's default.
//!
//! Decompression is always bounded ([`decompress_bounded`]): a small compressed batch can
//! expand enormously, so output beyond the caller's limit is an error, never an allocation.

use std::io::{Read, Write};

use thiserror::Error;

/// Default bound on the decompressed size of one batch's records, in bytes (64 MiB).
pub const DEFAULT_MAX_DECOMPRESSED_BYTES: usize = 64 * 1024 * 1024;

/// Kafka's default `compression.gzip.level` (-1, zlib's default, which is 6).
const GZIP_LEVEL: u32 = 6;
/// Kafka's default `compression.zstd.level`.
const ZSTD_LEVEL: i32 = 3;
/// The magic that starts xerial-framed snappy (snappy-java's `SnappyOutputStream`).
pub const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
/// Size of the xerial header in bytes: magic, version (i32), minimum compatible version (i32).
const XERIAL_HEADER_LEN: usize = 16;
/// Version and minimum compatible version snappy-java writes.
const XERIAL_VERSION: i32 = 1;
const XERIAL_COMPAT_VERSION: i32 = 1;
/// Uncompressed bytes per xerial block: snappy-java's default block size (32 KiB).
const XERIAL_BLOCK_BYTES: usize = 32 * 1024;

/// Why compressing or decompressing failed. Each variant names the codec.
#[derive(Debug, Error)]
pub enum CompressionError {
    /// The compressed data cannot be decoded.
    #[error("corrupt {} data: {reason}", .codec.name())]
    Corrupt {
        /// The codec that failed.
        codec: Compression,
        /// What the decoder reported.
        reason: String,
    },
    /// The data decompresses to more than the allowed number of bytes.
    #[error(
        "{} data decompresses to more than the limit of {limit_bytes} bytes",
        .codec.name()
    )]
    TooLarge {
        /// The codec in use.
        codec: Compression,
        /// The limit that was exceeded, in bytes.
        limit_bytes: usize,
    },
    /// The encoder failed (only for inputs a codec cannot represent, e.g. over 4 GiB for
    /// snappy, or when out of memory).
    #[error("{} compression failed: {reason}", .codec.name())]
    Compress {
        /// The codec that failed.
        codec: Compression,
        /// What the encoder reported.
        reason: String,
    },
}

/// Compresses `data` with `codec` in the wire format Kafka's Java client writes (see the module
/// docs). [`Compression::None`] returns a copy.
///
/// # Errors
/// [`CompressionError::Compress`] if the encoder fails.
pub fn compress(codec: Compression, data: &[u8]) -> Result<Vec<u8>, CompressionError> {
    compress_with_level(codec, data, None)
}

/// As [`compress`], at a KIP-390 level (`compression.gzip.level` 1-9, -1 = default;
/// `compression.zstd.level`; `compression.lz4.level` is accepted but `lz4_flex` has a single
/// level). `None` uses each codec's default, as Kafka.
///
/// # Errors
/// [`CompressionError::Compress`] if the encoder fails.
pub fn compress_with_level(
    codec: Compression,
    data: &[u8],
    level: Option<i32>,
) -> Result<Vec<u8>, CompressionError> {
    let fail = |e: &dyn std::fmt::Display| CompressionError::Compress {
        codec,
        reason: e.to_string(),
    };
    match codec {
        Compression::None => Ok(data.to_vec()),
        Compression::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(
                Vec::with_capacity(data.len() / 2 + 64),
                flate2::Compression::new(
                    level
                        .and_then(|l| u32::try_from(l).ok())
                        .filter(|l| (1..=9).contains(l))
                        .unwrap_or(GZIP_LEVEL),
                ),
            );
            enc.write_all(data).map_err(|e| fail(&e))?;
            enc.finish().map_err(|e| fail(&e))
        }
        Compression::Snappy => xerial_compress(data).map_err(|e| fail(&e)),
        Compression::Lz4 => {
            let info = lz4_flex::frame::FrameInfo::new()
                .block_size(lz4_flex::frame::BlockSize::Max64KB)
                .block_mode(lz4_flex::frame::BlockMode::Independent)
                .content_checksum(false);
            let mut enc = lz4_flex::frame::FrameEncoder::with_frame_info(
                info,
                Vec::with_capacity(data.len() / 2 + 64),
            );
            enc.write_all(data).map_err(|e| fail(&e))?;
            enc.finish().map_err(|e| fail(&e))
        }
        Compression::Zstd => {
            zstd::stream::encode_all(data, level.unwrap_or(ZSTD_LEVEL)).map_err(|e| fail(&e))
        }
    }
}

/// Decompresses `data` with `codec`, allowing at most [`DEFAULT_MAX_DECOMPRESSED_BYTES`] bytes
/// of output. See [`decompress_bounded`].
///
/// # Errors
/// As [`decompress_bounded`].
pub fn decompress(codec: Compression, data: &[u8]) -> Result<Vec<u8>, CompressionError> {
    decompress_bounded(codec, data, DEFAULT_MAX_DECOMPRESSED_BYTES)
}

/// Decompresses `data` with `codec`, producing at most `max_decompressed_bytes` bytes.
/// Snappy accepts both xerial framing and a raw block. [`Compression::None`] returns a copy
/// (subject to the same limit).
///
/// Memory use is bounded by the limit plus the codec's working state (lz4: one block of at
/// most 4 MiB; zstd: its window, which libzstd caps at 128 MiB by default).
///
/// # Errors
/// [`CompressionError::TooLarge`] when the output would exceed `max_decompressed_bytes`;
/// [`CompressionError::Corrupt`] when `data` is not valid for the codec.
pub fn decompress_bounded(
    codec: Compression,
    data: &[u8],
    max_decompressed_bytes: usize,
) -> Result<Vec<u8>, CompressionError> {
    let too_large = CompressionError::TooLarge {
        codec,
        limit_bytes: max_decompressed_bytes,
    };
    match codec {
        Compression::None => {
            if data.len() > max_decompressed_bytes {
                return Err(too_large);
            }
            Ok(data.to_vec())
        }
        Compression::Gzip => read_bounded(
            codec,
            flate2::read::MultiGzDecoder::new(data),
            max_decompressed_bytes,
        ),
        Compression::Snappy => {
            if data.starts_with(&XERIAL_MAGIC) {
                xerial_decompress(data, max_decompressed_bytes)
            } else {
                let mut out = Vec::new();
                snappy_block_into(data, &mut out, max_decompressed_bytes)?;
                Ok(out)
            }
        }
        Compression::Lz4 => {
            check_lz4_frames(data).map_err(|reason| CompressionError::Corrupt { codec, reason })?;
            read_bounded(
                codec,
                lz4_flex::frame::FrameDecoder::new(data),
                max_decompressed_bytes,
            )
        }
        Compression::Zstd => {
            let dec = zstd::stream::read::Decoder::with_buffer(data).map_err(|e| {
                CompressionError::Corrupt {
                    codec,
                    reason: e.to_string(),
                }
            })?;
            read_bounded(codec, dec, max_decompressed_bytes)
        }
    }
}

/// Reads `reader` to its end, failing once more than `limit` bytes come out.
fn read_bounded<R: Read>(
    codec: Compression,
    reader: R,
    limit: usize,
) -> Result<Vec<u8>, CompressionError> {
    let mut out = Vec::new();
    // One byte past the limit tells "exactly at the limit" from "over it".
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(cap)
        .read_to_end(&mut out)
        .map_err(|e| CompressionError::Corrupt {
            codec,
            reason: e.to_string(),
        })?;
    if out.len() > limit {
        return Err(CompressionError::TooLarge {
            codec,
            limit_bytes: limit,
        });
    }
    Ok(out)
}

/// Walks the LZ4 frames in `data` and checks that each is complete (ends with its EndMark and,
/// if flagged, the content checksum) and that nothing follows the last. `lz4_flex` treats a
/// stream that stops before the EndMark as finished; Java's `Lz4BlockInputStream` and liblz4
/// reject it, and so do we. Block contents and checksums are left to the decoder.
/// Layout: <https://github.com/lz4/lz4/blob/dev/doc/lz4_Frame_format.md>.
fn check_lz4_frames(data: &[u8]) -> Result<(), String> {
    const MAGIC: u32 = 0x184D_2204;
    const SKIPPABLE_MASK: u32 = 0xFFFF_FFF0;
    const SKIPPABLE: u32 = 0x184D_2A50;
    fn u32_le(buf: &[u8], at: usize, what: &str) -> Result<u32, String> {
        buf.get(at..at.saturating_add(4))
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| format!("frame ends inside the {what}"))
    }
    let mut pos = 0usize;
    loop {
        let magic = u32_le(data, pos, "magic number")?;
        pos += 4;
        if magic & SKIPPABLE_MASK == SKIPPABLE {
            let len = u32_le(data, pos, "skippable frame size")? as usize;
            pos = pos.saturating_add(4).saturating_add(len);
        } else if magic == MAGIC {
            let flg = *data
                .get(pos)
                .ok_or("frame ends inside the frame descriptor")?;
            let block_checksums = flg & 0x10 != 0;
            let content_size = flg & 0x08 != 0;
            let content_checksum = flg & 0x04 != 0;
            let dict_id = flg & 0x01 != 0;
            // FLG, BD, optional content size and dictionary id, header checksum.
            pos += 2 + if content_size { 8 } else { 0 } + if dict_id { 4 } else { 0 } + 1;
            loop {
                let size = u32_le(data, pos, "block size (missing EndMark)")?;
                pos += 4;
                if size == 0 {
                    break;
                }
                let len = (size & 0x7FFF_FFFF) as usize;
                pos = pos
                    .saturating_add(len)
                    .saturating_add(if block_checksums { 4 } else { 0 });
            }
            if content_checksum {
                u32_le(data, pos, "content checksum")?;
                pos += 4;
            }
        } else {
            return Err(format!("bad lz4 frame magic {magic:#010x}"));
        }
        match pos.cmp(&data.len()) {
            std::cmp::Ordering::Equal => return Ok(()),
            std::cmp::Ordering::Greater => return Err("frame ends inside a block".into()),
            std::cmp::Ordering::Less => {}
        }
    }
}

/// Decodes one raw snappy block, appending to `out`; `out` may not grow past `limit` bytes.
/// The block's declared length is checked before anything is allocated.
fn snappy_block_into(
    block: &[u8],
    out: &mut Vec<u8>,
    limit: usize,
) -> Result<(), CompressionError> {
    let corrupt = |e: snap::Error| CompressionError::Corrupt {
        codec: Compression::Snappy,
        reason: e.to_string(),
    };
    let len = snap::raw::decompress_len(block).map_err(corrupt)?;
    let start = out.len();
    let end =
        start
            .checked_add(len)
            .filter(|&end| end <= limit)
            .ok_or(CompressionError::TooLarge {
                codec: Compression::Snappy,
                limit_bytes: limit,
            })?;
    out.resize(end, 0);
    let written = match out.get_mut(start..end) {
        Some(dst) => snap::raw::Decoder::new()
            .decompress(block, dst)
            .map_err(corrupt)?,
        None => 0,
    };
    if written != len {
        return Err(CompressionError::Corrupt {
            codec: Compression::Snappy,
            reason: format!("block declares {len} bytes but decodes to {written}"),
        });
    }
    Ok(())
}

/// Decodes xerial-framed snappy (`data` starts with [`XERIAL_MAGIC`]).
fn xerial_decompress(data: &[u8], limit: usize) -> Result<Vec<u8>, CompressionError> {
    let corrupt = |reason: String| CompressionError::Corrupt {
        codec: Compression::Snappy,
        reason,
    };
    let mut rest = data.get(XERIAL_HEADER_LEN..).ok_or_else(|| {
        corrupt(format!(
            "xerial header needs {XERIAL_HEADER_LEN} bytes, have {}",
            data.len()
        ))
    })?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (len_bytes, after) = rest.split_first_chunk::<4>().ok_or_else(|| {
            corrupt(format!(
                "xerial block length needs 4 bytes, have {}",
                rest.len()
            ))
        })?;
        let len = u32::from_be_bytes(*len_bytes) as usize;
        if len > after.len() {
            return Err(corrupt(format!(
                "xerial block of {len} bytes but only {} remain",
                after.len()
            )));
        }
        let (block, next) = after.split_at(len);
        snappy_block_into(block, &mut out, limit)?;
        rest = next;
    }
    Ok(out)
}

/// Encodes `data` as xerial-framed snappy in 32 KiB blocks, as snappy-java does.
fn xerial_compress(data: &[u8]) -> Result<Vec<u8>, snap::Error> {
    let mut out = Vec::with_capacity(XERIAL_HEADER_LEN + data.len() / 2 + 64);
    out.extend_from_slice(&XERIAL_MAGIC);
    out.extend_from_slice(&XERIAL_VERSION.to_be_bytes());
    out.extend_from_slice(&XERIAL_COMPAT_VERSION.to_be_bytes());
    let mut enc = snap::raw::Encoder::new();
    for chunk in data.chunks(XERIAL_BLOCK_BYTES) {
        let block = enc.compress_vec(chunk)?;
        let len = u32::try_from(block.len()).map_err(|_| snap::Error::TooBig {
            given: block.len() as u64,
            max: u64::from(u32::MAX),
        })?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&block);
    }
    Ok(out)
}

/// Compression codec in a batch's attributes (bits 0-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    /// No compression.
    None,
    /// gzip (1).
    Gzip,
    /// Snappy (2), xerial-framed from Java clients, raw from some others.
    Snappy,
    /// LZ4 frame (3).
    Lz4,
    /// Zstandard (4).
    Zstd,
}

impl Compression {
    /// The codec for attribute bits 0-2, or `None` for the undefined values 5-7.
    pub fn from_id(id: i16) -> Option<Self> {
        match id {
            0 => Some(Self::None),
            1 => Some(Self::Gzip),
            2 => Some(Self::Snappy),
            3 => Some(Self::Lz4),
            4 => Some(Self::Zstd),
            _ => None,
        }
    }

    /// Attribute bits 0-2 for this codec.
    pub fn id(self) -> i16 {
        match self {
            Self::None => 0,
            Self::Gzip => 1,
            Self::Snappy => 2,
            Self::Lz4 => 3,
            Self::Zstd => 4,
        }
    }

    /// Kafka's name for the codec (`compression.type` value).
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gzip => "gzip",
            Self::Snappy => "snappy",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    fn sample(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i % 251) as u8 ^ (i / 1000) as u8)
            .collect()
    }

    #[test]
    fn every_codec_round_trips() {
        for codec in ALL {
            for len in [
                0,
                1,
                100,
                XERIAL_BLOCK_BYTES,
                3 * XERIAL_BLOCK_BYTES + 17,
                200_000,
            ] {
                let data = sample(len);
                let c = compress(codec, &data).unwrap();
                assert_eq!(decompress(codec, &c).unwrap(), data, "{codec:?} len {len}");
            }
        }
    }

    #[test]
    fn exact_limit_is_accepted_and_one_more_byte_rejected() {
        let data = vec![7u8; 10_000];
        for codec in ALL {
            let c = compress(codec, &data).unwrap();
            assert_eq!(decompress_bounded(codec, &c, 10_000).unwrap(), data);
            let err = decompress_bounded(codec, &c, 9_999).unwrap_err();
            assert!(
                matches!(
                    err,
                    CompressionError::TooLarge {
                        limit_bytes: 9_999,
                        ..
                    }
                ),
                "{codec:?}: {err}"
            );
            assert!(err.to_string().contains("9999"), "{err}");
            assert!(err.to_string().contains(codec.name()), "{err}");
        }
    }

    #[test]
    fn zip_bomb_is_rejected_without_expanding() {
        // 64 MiB of zeros compresses to a few KiB with every codec.
        let zeros = vec![0u8; 64 * 1024 * 1024];
        for codec in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let c = compress(codec, &zeros).unwrap();
            assert!(c.len() < zeros.len() / 10);
            assert!(matches!(
                decompress_bounded(codec, &c, 1024 * 1024),
                Err(CompressionError::TooLarge { .. })
            ));
        }
    }

    #[test]
    fn python_gzip_vector_decodes() {
        // gzip.compress(b"hello", mtime=0) from CPython 3.
        let v = [
            31, 139, 8, 0, 0, 0, 0, 0, 2, 3, 203, 72, 205, 201, 201, 7, 0, 134, 166, 16, 54, 5, 0,
            0, 0,
        ];
        assert_eq!(decompress(Compression::Gzip, &v).unwrap(), b"hello");
    }

    #[test]
    fn liblz4_vectors_decode() {
        let text = b"hello kafka hello kafka hello kafka";
        // `lz4 -B4 --no-frame-crc` (liblz4 CLI): FLG 0x60, BD 0x40, the exact frame
        // descriptor Java's Lz4BlockOutputStream writes.
        let plain = [
            4, 34, 77, 24, 96, 64, 130, 21, 0, 0, 0, 206, 104, 101, 108, 108, 111, 32, 107, 97,
            102, 107, 97, 32, 12, 0, 80, 107, 97, 102, 107, 97, 0, 0, 0, 0,
        ];
        // `lz4` defaults: with a content checksum.
        let checksummed = [
            4, 34, 77, 24, 100, 64, 167, 21, 0, 0, 0, 206, 104, 101, 108, 108, 111, 32, 107, 97,
            102, 107, 97, 32, 12, 0, 80, 107, 97, 102, 107, 97, 0, 0, 0, 0, 97, 196, 246, 223,
        ];
        assert_eq!(decompress(Compression::Lz4, &plain).unwrap(), text);
        assert_eq!(decompress(Compression::Lz4, &checksummed).unwrap(), text);
        // Our encoder writes the same frame descriptor (magic, FLG, BD, header checksum).
        let ours = compress(Compression::Lz4, text).unwrap();
        assert_eq!(ours.get(..7), plain.get(..7));
        let mut bad = checksummed;
        bad[36] ^= 1;
        assert!(decompress(Compression::Lz4, &bad).is_err());
    }

    #[test]
    fn zstd_cli_vector_decodes() {
        // `zstd` CLI (libzstd 1.5) on the same text.
        let v = [
            40, 181, 47, 253, 36, 35, 149, 0, 0, 96, 104, 101, 108, 108, 111, 32, 107, 97, 102,
            107, 97, 32, 1, 0, 175, 75, 18, 195, 46, 28, 98,
        ];
        assert_eq!(
            decompress(Compression::Zstd, &v).unwrap(),
            b"hello kafka hello kafka hello kafka"
        );
    }

    /// A raw snappy block written by hand from the format description: varint uncompressed
    /// length 5, then a literal tag `(5 - 1) << 2` and the five bytes.
    const RAW_HELLO: [u8; 7] = [5, 0x10, b'h', b'e', b'l', b'l', b'o'];

    #[test]
    fn raw_snappy_decodes() {
        assert_eq!(
            decompress(Compression::Snappy, &RAW_HELLO).unwrap(),
            b"hello"
        );
        let block = snap::raw::Encoder::new()
            .compress_vec(&sample(100_000))
            .unwrap();
        assert_eq!(
            decompress(Compression::Snappy, &block).unwrap(),
            sample(100_000)
        );
    }

    #[test]
    fn hand_built_xerial_snappy_decodes() {
        let mut v = XERIAL_MAGIC.to_vec();
        v.extend_from_slice(&1i32.to_be_bytes());
        v.extend_from_slice(&1i32.to_be_bytes());
        // Two blocks: "hello" written by hand, then a block from snap's raw encoder.
        v.extend_from_slice(&(RAW_HELLO.len() as u32).to_be_bytes());
        v.extend_from_slice(&RAW_HELLO);
        let second = snap::raw::Encoder::new().compress_vec(b" world").unwrap();
        v.extend_from_slice(&(second.len() as u32).to_be_bytes());
        v.extend_from_slice(&second);
        assert_eq!(decompress(Compression::Snappy, &v).unwrap(), b"hello world");
        // A header with no blocks is an empty stream.
        assert_eq!(
            decompress(Compression::Snappy, &v[..XERIAL_HEADER_LEN]).unwrap(),
            b""
        );
    }

    #[test]
    fn xerial_encoding_matches_snappy_java_layout() {
        let data = sample(XERIAL_BLOCK_BYTES + 1);
        let c = compress(Compression::Snappy, &data).unwrap();
        assert_eq!(c.get(..8), Some(&XERIAL_MAGIC[..]));
        assert_eq!(c.get(8..16), Some(&[0, 0, 0, 1, 0, 0, 0, 1][..]));
        let first_len = u32::from_be_bytes(c[16..20].try_into().unwrap()) as usize;
        let first = &c[20..20 + first_len];
        assert_eq!(
            snap::raw::decompress_len(first).unwrap(),
            XERIAL_BLOCK_BYTES
        );
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let data = sample(5_000);
        for codec in ALL {
            let c = compress(codec, &data).unwrap();
            for cut in 0..c.len() {
                let r = decompress(codec, &c[..cut]);
                if codec == Compression::None {
                    continue;
                }
                // A cut exactly at a xerial block boundary is still a valid (shorter) stream.
                if let Ok(out) = r {
                    assert!(out.len() < data.len(), "{codec:?} cut {cut}");
                }
            }
        }
    }

    #[test]
    fn garbage_is_corrupt_and_names_the_codec() {
        for codec in [Compression::Gzip, Compression::Lz4, Compression::Zstd] {
            let err = decompress(codec, b"definitely not compressed").unwrap_err();
            assert!(matches!(err, CompressionError::Corrupt { .. }), "{err}");
            assert!(err.to_string().contains(codec.name()), "{err}");
        }
        let mut v = XERIAL_MAGIC.to_vec();
        v.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 99, 1]);
        let err = decompress(Compression::Snappy, &v).unwrap_err();
        assert!(err.to_string().contains("snappy"), "{err}");
    }
}
