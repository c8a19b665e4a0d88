//! The wire reader and writer of Kafka's generated message schemas, for the schemas gregor
//! encodes itself: the internal records of `__consumer_offsets` and `__transaction_state`,
//! and the KIP-631 metadata records. The request and response messages come from
//! `kafka-protocol` instead.
//!
//! Primitive types as the protocol guide defines them
//! (<https://kafka.apache.org/protocol#protocol_types>): big-endian integers, unsigned varints,
//! `STRING`/`NULLABLE_STRING` (int16 length), `BYTES` (int32 length), and for flexible versions
//! (KIP-482) `COMPACT_STRING`, `COMPACT_ARRAY` (unsigned varint length + 1) and tagged fields.
//!
//! [`Reader`] never trusts a length: every length and element count read off the input is
//! checked against the bytes that remain before anything is allocated, so a corrupt or hostile
//! record costs at most its own size.

use thiserror::Error;
use uuid::Uuid;

/// Input that does not follow the schema.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// Fewer bytes remain than the named field needs.
    #[error("truncated {0}")]
    Truncated(&'static str),
    /// The named field holds a value out of range (a negative or oversized length, a null
    /// where the schema forbids one, a varint longer than 5 bytes, an unknown version).
    #[error("invalid {0}")]
    Invalid(&'static str),
}

/// Reads primitive types from a byte slice, front to back.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }

    /// The next `n` bytes.
    ///
    /// # Errors
    /// [`WireError::Truncated`] when fewer than `n` remain.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated(what));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    /// `INT8`.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn i8(&mut self, what: &'static str) -> Result<i8, WireError> {
        Ok(i8::from_be_bytes(self.array(what)?))
    }

    /// `INT16`.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn i16(&mut self, what: &'static str) -> Result<i16, WireError> {
        Ok(i16::from_be_bytes(self.array(what)?))
    }

    /// `INT32`.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn i32(&mut self, what: &'static str) -> Result<i32, WireError> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    /// `INT64`.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn i64(&mut self, what: &'static str) -> Result<i64, WireError> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    /// `UUID`.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn uuid(&mut self, what: &'static str) -> Result<Uuid, WireError> {
        Ok(Uuid::from_bytes(self.array(what)?))
    }

    /// `UNSIGNED_VARINT` (at most 5 bytes).
    ///
    /// # Errors
    /// [`WireError::Truncated`], or [`WireError::Invalid`] for a sixth continuation byte.
    pub fn uvarint(&mut self, what: &'static str) -> Result<u32, WireError> {
        let mut v: u32 = 0;
        for i in 0..5 {
            let b = self.take(1, what)?[0];
            v |= u32::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(WireError::Invalid(what))
    }

    /// Checks that `count` elements of at least `min_size` bytes each can still follow.
    fn bounded(&self, count: usize, min_size: usize, what: &'static str) -> Result<(), WireError> {
        if count.saturating_mul(min_size.max(1)) > self.buf.len() {
            return Err(WireError::Invalid(what));
        }
        Ok(())
    }

    /// `NULLABLE_STRING`: None for length -1. Invalid UTF-8 is replaced, as Java decodes it.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn nullable_string(&mut self, what: &'static str) -> Result<Option<String>, WireError> {
        let len = self.i16(what)?;
        if len < 0 {
            return Ok(None);
        }
        let b = self.take(len as usize, what)?;
        Ok(Some(String::from_utf8_lossy(b).into_owned()))
    }

    /// `STRING`.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::Invalid`] for a null.
    pub fn string(&mut self, what: &'static str) -> Result<String, WireError> {
        self.nullable_string(what)?.ok_or(WireError::Invalid(what))
    }

    /// `BYTES` / `NULLABLE_BYTES`: a null reads as empty.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], WireError> {
        let len = self.i32(what)?;
        if len < 0 {
            return Ok(&[]);
        }
        self.take(len as usize, what)
    }

    /// An `INT32` array length (`ARRAY`): None for -1, else the count, checked against the bytes
    /// left assuming each element takes at least `min_size` bytes.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::Invalid`] for a count the input cannot hold.
    pub fn array_len(
        &mut self,
        what: &'static str,
        min_size: usize,
    ) -> Result<Option<usize>, WireError> {
        let n = self.i32(what)?;
        if n < 0 {
            return Ok(None);
        }
        let n = n as usize;
        self.bounded(n, min_size, what)?;
        Ok(Some(n))
    }

    /// A compact length (`COMPACT_STRING`, `COMPACT_BYTES`, `COMPACT_ARRAY`): None for null
    /// (0 on the wire), else the length, checked against the bytes left assuming each element
    /// takes at least `min_size` bytes (1 for strings and bytes).
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::Invalid`] for a length the input cannot hold.
    pub fn compact_len(
        &mut self,
        what: &'static str,
        min_size: usize,
    ) -> Result<Option<usize>, WireError> {
        let n = self.uvarint(what)? as usize;
        if n == 0 {
            return Ok(None);
        }
        let n = n - 1;
        self.bounded(n, min_size, what)?;
        Ok(Some(n))
    }

    /// `COMPACT_NULLABLE_STRING`.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::Invalid`].
    pub fn compact_nullable_string(
        &mut self,
        what: &'static str,
    ) -> Result<Option<String>, WireError> {
        match self.compact_len(what, 1)? {
            None => Ok(None),
            Some(n) => Ok(Some(
                String::from_utf8_lossy(self.take(n, what)?).into_owned(),
            )),
        }
    }

    /// `COMPACT_STRING`.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::Invalid`] for a null.
    pub fn compact_string(&mut self, what: &'static str) -> Result<String, WireError> {
        self.compact_nullable_string(what)?
            .ok_or(WireError::Invalid(what))
    }

    /// `COMPACT_BYTES` / `COMPACT_NULLABLE_BYTES`: a null reads as None.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::Invalid`].
    pub fn compact_bytes(&mut self, what: &'static str) -> Result<Option<&'a [u8]>, WireError> {
        match self.compact_len(what, 1)? {
            None => Ok(None),
            Some(n) => self.take(n, what).map(Some),
        }
    }

    /// Reads a tagged-field section (KIP-482), calling `on_field(tag, data)` for each field;
    /// the caller decodes the tags it knows and ignores the others.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::Invalid`], or the callback's error.
    pub fn tagged_fields(
        &mut self,
        mut on_field: impl FnMut(u32, &'a [u8]) -> Result<(), WireError>,
    ) -> Result<(), WireError> {
        let n = self.uvarint("tagged fields")? as usize;
        // Each field takes at least two bytes (tag and size).
        self.bounded(n, 2, "tagged fields")?;
        for _ in 0..n {
            let tag = self.uvarint("tag")?;
            let size = self.uvarint("tag size")? as usize;
            let data = self.take(size, "tagged field")?;
            on_field(tag, data)?;
        }
        Ok(())
    }

    /// Skips a tagged-field section.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::Invalid`].
    pub fn skip_tagged_fields(&mut self) -> Result<(), WireError> {
        self.tagged_fields(|_, _| Ok(()))
    }
}

/// Writes primitive types to a growing buffer.
#[derive(Debug, Clone, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty writer with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: Vec::with_capacity(capacity),
        }
    }

    /// The bytes written.
    pub fn into_inner(self) -> Vec<u8> {
        self.buf
    }

    /// The bytes written so far.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    /// Raw bytes, no length.
    pub fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// `INT8`.
    pub fn i8(&mut self, v: i8) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    /// `INT16`.
    pub fn i16(&mut self, v: i16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    /// `INT32`.
    pub fn i32(&mut self, v: i32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    /// `INT64`.
    pub fn i64(&mut self, v: i64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    /// `UUID`.
    pub fn uuid(&mut self, v: &Uuid) {
        self.buf.extend_from_slice(v.as_bytes());
    }

    /// `UNSIGNED_VARINT`.
    pub fn uvarint(&mut self, mut v: u32) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    /// `STRING`; a string longer than 32767 bytes is cut there (Kafka refuses to write one).
    pub fn string(&mut self, s: &str) {
        let b = s.as_bytes();
        let len = b.len().min(i16::MAX as usize);
        self.i16(len as i16);
        self.buf.extend_from_slice(&b[..len]);
    }

    /// `NULLABLE_STRING`.
    pub fn nullable_string(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.string(s),
            None => self.i16(-1),
        }
    }

    /// `BYTES`.
    pub fn bytes(&mut self, b: &[u8]) {
        self.i32(i32::try_from(b.len()).unwrap_or(i32::MAX));
        self.buf.extend_from_slice(b);
    }

    /// An `INT32` array length.
    pub fn array_len(&mut self, n: usize) {
        self.i32(i32::try_from(n).unwrap_or(i32::MAX));
    }

    /// A compact length (`COMPACT_*`): `n + 1`.
    pub fn compact_len(&mut self, n: usize) {
        self.uvarint(u32::try_from(n).unwrap_or(u32::MAX - 1) + 1);
    }

    /// A compact null (`COMPACT_NULLABLE_*`).
    pub fn compact_null(&mut self) {
        self.uvarint(0);
    }

    /// `COMPACT_STRING`.
    pub fn compact_string(&mut self, s: &str) {
        self.compact_len(s.len());
        self.buf.extend_from_slice(s.as_bytes());
    }

    /// `COMPACT_NULLABLE_STRING`.
    pub fn compact_nullable_string(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.compact_string(s),
            None => self.compact_null(),
        }
    }

    /// `COMPACT_BYTES`.
    pub fn compact_bytes(&mut self, b: &[u8]) {
        self.compact_len(b.len());
        self.buf.extend_from_slice(b);
    }

    /// An empty tagged-field section.
    pub fn no_tagged_fields(&mut self) {
        self.buf.push(0);
    }

    /// A tagged-field section with the given `(tag, data)` fields, in tag order as the
    /// caller gives them.
    pub fn tagged_fields(&mut self, fields: &[(u32, &[u8])]) {
        self.uvarint(u32::try_from(fields.len()).unwrap_or(u32::MAX));
        for (tag, data) in fields {
            self.uvarint(*tag);
            self.uvarint(u32::try_from(data.len()).unwrap_or(u32::MAX));
            self.buf.extend_from_slice(data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_every_type() {
        let id = Uuid::from_u128(7);
        let mut w = Writer::new();
        w.i8(-3);
        w.i16(-2);
        w.i32(70_000);
        w.i64(-1);
        w.uuid(&id);
        w.uvarint(300);
        w.string("grp");
        w.nullable_string(None);
        w.bytes(b"xy");
        w.array_len(2);
        w.compact_string("t");
        w.compact_nullable_string(None);
        w.compact_bytes(b"z");
        w.tagged_fields(&[(0, b"ab")]);
        w.no_tagged_fields();
        let buf = w.into_inner();
        let mut r = Reader::new(&buf);
        assert_eq!(r.i8("a").unwrap(), -3);
        assert_eq!(r.i16("a").unwrap(), -2);
        assert_eq!(r.i32("a").unwrap(), 70_000);
        assert_eq!(r.i64("a").unwrap(), -1);
        assert_eq!(r.uuid("a").unwrap(), id);
        assert_eq!(r.uvarint("a").unwrap(), 300);
        assert_eq!(r.string("a").unwrap(), "grp");
        assert_eq!(r.nullable_string("a").unwrap(), None);
        assert_eq!(r.bytes("a").unwrap(), b"xy");
        assert_eq!(r.array_len("a", 0).unwrap(), Some(2));
        assert_eq!(r.compact_string("a").unwrap(), "t");
        assert_eq!(r.compact_nullable_string("a").unwrap(), None);
        assert_eq!(r.compact_bytes("a").unwrap(), Some(&b"z"[..]));
        let mut seen = Vec::new();
        r.tagged_fields(|t, d| {
            seen.push((t, d.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, vec![(0, b"ab".to_vec())]);
        r.skip_tagged_fields().unwrap();
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn lengths_are_bounded_by_the_input() {
        // A compact array claiming 2^32-2 elements in a 5-byte input is refused before any
        // allocation.
        let mut r = Reader::new(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(r.compact_len("n", 1), Err(WireError::Invalid("n")));
        let mut r = Reader::new(&[0x7f, 0xff, 0xff, 0xff]);
        assert_eq!(r.array_len("n", 4), Err(WireError::Invalid("n")));
        let mut r = Reader::new(&[0x00, 0x00, 0x00, 0x02, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(r.array_len("n", 4), Err(WireError::Invalid("n")));
        // 2^31 tagged fields.
        let mut r = Reader::new(&[0x80, 0x80, 0x80, 0x80, 0x08]);
        assert!(r.skip_tagged_fields().is_err());
        // A sixth varint byte.
        let mut r = Reader::new(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
        assert_eq!(r.uvarint("v"), Err(WireError::Invalid("v")));
        let mut r = Reader::new(&[0, 5, b'a']);
        assert_eq!(r.string("s"), Err(WireError::Truncated("s")));
        let mut r = Reader::new(&[0xff, 0xff]);
        assert_eq!(r.string("s"), Err(WireError::Invalid("s")));
    }

    proptest! {
        #[test]
        fn arbitrary_input_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = Reader::new(&buf);
            let _ = r.compact_len("a", 1);
            let _ = r.skip_tagged_fields();
            let _ = r.compact_string("s");
            let _ = r.array_len("n", 4);
            let _ = r.nullable_string("s");
            let _ = r.bytes("b");
        }

        #[test]
        fn uvarint_round_trips(v in any::<u32>()) {
            let mut w = Writer::new();
            w.uvarint(v);
            let buf = w.into_inner();
            let mut r = Reader::new(&buf);
            prop_assert_eq!(r.uvarint("v").unwrap(), v);
            prop_assert_eq!(r.remaining(), 0);
        }
    }
}
