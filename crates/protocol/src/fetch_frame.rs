//! A Fetch response frame whose record sets are placed apart from the encoded fields, so the
//! broker can send each from where it lies (a segment file, with splice) instead of copying
//! it into the frame.
//!
//! [`encode_fetch_response`] writes the same bytes as `kafka-protocol`'s `FetchResponse`
//! encoder (Fetch v4-v18, <https://kafka.apache.org/protocol#The_Messages_Fetch>), except
//! that a partition given an external record set gets that set's length in its `Records`
//! field and a [`FramePart::Records`] where the bytes go. The fields around `Records` are
//! small: a partition's fields before it, its length, then its tagged fields (flexible
//! versions, KIP-482) and the next partition's fields. The tests compare the two encoders
//! byte for byte over every version.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{ApiKey, FetchResponse, ResponseHeader};
use kafka_protocol::protocol::Encodable;

use crate::frame::FrameError;

/// One piece of a frame, in the order the pieces go on the wire.
#[derive(Debug)]
pub enum FramePart<R> {
    /// Encoded bytes (the size prefix, headers and fields).
    Bytes(Bytes),
    /// A partition's record set, of the length already written before it.
    Records(R),
}

/// An encoded Fetch response frame: its pieces and its length on the wire (size prefix
/// included).
#[derive(Debug)]
pub struct FetchFrame<R> {
    /// The pieces in wire order.
    pub parts: Vec<FramePart<R>>,
    /// Bytes of the whole frame, size prefix included.
    pub frame_len: usize,
}

/// Builds the pieces: encoded bytes accumulate in `cur` until an external record set cuts
/// them.
struct Writer<R> {
    parts: Vec<FramePart<R>>,
    cur: BytesMut,
    external_bytes: usize,
}

impl<R> Writer<R> {
    fn external(&mut self, r: R, len: usize) {
        let done = self.cur.split().freeze();
        if !done.is_empty() {
            self.parts.push(FramePart::Bytes(done));
        }
        self.parts.push(FramePart::Records(r));
        self.external_bytes += len;
    }
}

/// What the body encoders return: the reason on failure.
type Enc = Result<(), String>;

/// `kafka-protocol`'s encoders return its own error type; only its message is kept.
fn e<T, E: std::fmt::Display>(r: Result<T, E>) -> Result<T, String> {
    r.map_err(|e| e.to_string())
}

/// Encodes `body`, a Fetch response at `version` answering `correlation_id`, as a frame (the
/// 4-byte size first). `external` gives, per partition in the order of `body.responses` and
/// their `partitions`, either `Some((set, len))`, a record set of `len` bytes placed as
/// [`FramePart::Records`] (the partition's own `records` is then ignored), or `None`: the
/// partition's `records` is encoded in place. Missing entries count as `None`.
///
/// # Errors
/// [`FrameError::Encode`] for what `kafka-protocol`'s encoder refuses too (a version outside
/// 4-18, a field the version lacks, a frame over `i32::MAX` bytes) and for unknown tagged
/// fields, which gregor never sets and this encoder does not write.
pub fn encode_fetch_response<R>(
    version: i16,
    correlation_id: i32,
    body: &FetchResponse,
    external: impl IntoIterator<Item = Option<(R, usize)>>,
) -> Result<FetchFrame<R>, FrameError> {
    let err = |reason: String| FrameError::Encode {
        api_key: ApiKey::Fetch,
        version,
        reason,
    };
    if !(4..=18).contains(&version) {
        return Err(err(
            "specified version not supported by this message type".into()
        ));
    }
    let mut w = Writer {
        parts: Vec::new(),
        cur: BytesMut::with_capacity(256),
        external_bytes: 0,
    };
    w.cur.put_i32(0);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut w.cur, ApiKey::Fetch.response_header_version(version))
        .map_err(|e| err(e.to_string()))?;
    let mut external = external.into_iter();
    encode_body(&mut w, version, body, &mut external).map_err(err)?;
    let last = w.cur.split().freeze();
    if !last.is_empty() {
        w.parts.push(FramePart::Bytes(last));
    }
    let encoded: usize = w
        .parts
        .iter()
        .map(|p| match p {
            FramePart::Bytes(b) => b.len(),
            FramePart::Records(_) => 0,
        })
        .sum();
    let frame_len = encoded + w.external_bytes;
    let size = i32::try_from(frame_len - 4)
        .map_err(|_| err(format!("a frame of {frame_len} bytes is too large")))?;
    // The size prefix is the first four bytes of the first piece.
    if let Some(FramePart::Bytes(first)) = w.parts.first_mut() {
        let mut patched = BytesMut::from(&first[..]);
        patched[0..4].copy_from_slice(&size.to_be_bytes());
        *first = patched.freeze();
    }
    Ok(FetchFrame {
        parts: w.parts,
        frame_len,
    })
}

fn encode_body<R>(
    w: &mut Writer<R>,
    version: i16,
    body: &FetchResponse,
    external: &mut impl Iterator<Item = Option<(R, usize)>>,
) -> Enc {
    let flexible = version >= 12;
    let buf = &mut w.cur;
    buf.put_i32(body.throttle_time_ms);
    if version >= 7 {
        buf.put_i16(body.error_code);
        buf.put_i32(body.session_id);
    } else if body.session_id != 0 {
        return Err("A field is set that is not available on the selected protocol version".into());
    }
    array_len(buf, flexible, Some(body.responses.len()))?;
    for topic in &body.responses {
        encode_topic(w, version, topic, external)?;
    }
    if flexible {
        if !body.unknown_tagged_fields.is_empty() {
            return Err("unknown tagged fields are not encoded".into());
        }
        let buf = &mut w.cur;
        let endpoints = version >= 16 && !body.node_endpoints.is_empty();
        put_varint(buf, u32::from(endpoints));
        if endpoints {
            let mut field = BytesMut::new();
            array_len(&mut field, true, Some(body.node_endpoints.len()))?;
            for n in &body.node_endpoints {
                e(n.encode(&mut field, version))?;
            }
            tagged(buf, 0, &field)?;
        }
    }
    Ok(())
}

fn encode_topic<R>(
    w: &mut Writer<R>,
    version: i16,
    topic: &FetchableTopicResponse,
    external: &mut impl Iterator<Item = Option<(R, usize)>>,
) -> Enc {
    let flexible = version >= 12;
    let buf = &mut w.cur;
    if version <= 12 {
        let name = topic.topic.0.as_str().as_bytes();
        if flexible {
            length(buf, true, Some(name.len()))?;
        } else {
            let n = i16::try_from(name.len())
                .map_err(|_| format!("a topic name of {} bytes is too long", name.len()))?;
            buf.put_i16(n);
        }
        buf.put_slice(name);
    }
    if version >= 13 {
        buf.put_slice(topic.topic_id.as_bytes());
    }
    array_len(buf, flexible, Some(topic.partitions.len()))?;
    for p in &topic.partitions {
        encode_partition(w, version, p, external.next().flatten())?;
    }
    if flexible {
        if !topic.unknown_tagged_fields.is_empty() {
            return Err("unknown tagged fields are not encoded".into());
        }
        put_varint(&mut w.cur, 0);
    }
    Ok(())
}

fn encode_partition<R>(
    w: &mut Writer<R>,
    version: i16,
    p: &PartitionData,
    external: Option<(R, usize)>,
) -> Enc {
    let flexible = version >= 12;
    let buf = &mut w.cur;
    buf.put_i32(p.partition_index);
    buf.put_i16(p.error_code);
    buf.put_i64(p.high_watermark);
    buf.put_i64(p.last_stable_offset);
    if version >= 5 {
        buf.put_i64(p.log_start_offset);
    }
    array_len(buf, flexible, p.aborted_transactions.as_ref().map(Vec::len))?;
    for t in p.aborted_transactions.iter().flatten() {
        e(t.encode(buf, version))?;
    }
    if version >= 11 {
        buf.put_i32(p.preferred_read_replica.0);
    } else if p.preferred_read_replica.0 != -1 {
        return Err("A field is set that is not available on the selected protocol version".into());
    }
    match external {
        Some((set, len)) => {
            length(buf, flexible, Some(len))?;
            w.external(set, len);
        }
        None => {
            length(buf, flexible, p.records.as_ref().map(Bytes::len))?;
            if let Some(r) = &p.records {
                buf.put_slice(r);
            }
        }
    }
    if flexible {
        if !p.unknown_tagged_fields.is_empty() {
            return Err("unknown tagged fields are not encoded".into());
        }
        let buf = &mut w.cur;
        let diverging = p.diverging_epoch != Default::default();
        let leader = p.current_leader != Default::default();
        let snapshot = p.snapshot_id != Default::default();
        put_varint(
            buf,
            u32::from(diverging) + u32::from(leader) + u32::from(snapshot),
        );
        let mut field = BytesMut::new();
        if diverging {
            e(p.diverging_epoch.encode(&mut field, version))?;
            tagged(buf, 0, &field.split())?;
        }
        if leader {
            e(p.current_leader.encode(&mut field, version))?;
            tagged(buf, 1, &field.split())?;
        }
        if snapshot {
            e(p.snapshot_id.encode(&mut field, version))?;
            tagged(buf, 2, &field.split())?;
        }
    }
    Ok(())
}

/// An unsigned varint (Kafka's UNSIGNED_VARINT).
fn put_varint(buf: &mut BytesMut, mut v: u32) {
    while v >= 0x80 {
        buf.put_u8((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// The length of a nullable BYTES, STRING or records field (`None`: null): INT32 (-1 for null)
/// or, when flexible, an unsigned varint of length + 1 (0 for null).
fn length(buf: &mut BytesMut, flexible: bool, len: Option<usize>) -> Enc {
    let too_long = |n: usize| format!("a field of {n} bytes is too long");
    if flexible {
        let v = match len {
            None => 0,
            Some(n) => u32::try_from(n)
                .ok()
                .and_then(|v| v.checked_add(1))
                .ok_or_else(|| too_long(n))?,
        };
        put_varint(buf, v);
    } else {
        let v = match len {
            None => -1,
            Some(n) => i32::try_from(n).map_err(|_| too_long(n))?,
        };
        buf.put_i32(v);
    }
    Ok(())
}

/// An array's element count (`None`: null), as [`length`] writes lengths.
fn array_len(buf: &mut BytesMut, flexible: bool, len: Option<usize>) -> Enc {
    length(buf, flexible, len)
}

/// A tagged field: tag, size, then its encoded value (KIP-482).
fn tagged(buf: &mut BytesMut, tag: u32, value: &[u8]) -> Enc {
    let size = u32::try_from(value.len()).map_err(|_| {
        format!(
            "Tagged field is too large to encode ({} bytes)",
            value.len()
        )
    })?;
    put_varint(buf, tag);
    put_varint(buf, size);
    buf.put_slice(value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::{
        AbortedTransaction, EpochEndOffset, LeaderIdAndEpoch, NodeEndpoint, SnapshotId,
    };
    use kafka_protocol::messages::{BrokerId, ResponseKind, TopicName};
    use kafka_protocol::protocol::StrBytes;

    /// The frame with every external record set written in place.
    fn flatten(frame: FetchFrame<Bytes>) -> Vec<u8> {
        let mut out = Vec::new();
        for p in frame.parts {
            match p {
                FramePart::Bytes(b) | FramePart::Records(b) => out.extend_from_slice(&b),
            }
        }
        assert_eq!(out.len(), frame.frame_len);
        out
    }

    fn partition(i: i32, records: Option<Bytes>, version: i16, rich: bool) -> PartitionData {
        let mut p = PartitionData::default()
            .with_partition_index(i)
            .with_error_code(if i % 3 == 2 { 6 } else { 0 })
            .with_high_watermark(1000 + i64::from(i))
            .with_last_stable_offset(900)
            .with_log_start_offset(if version >= 5 { 7 } else { -1 })
            .with_records(records);
        if version >= 11 {
            p = p.with_preferred_read_replica(BrokerId(if rich { 2 } else { -1 }));
        }
        if rich {
            p = p.with_aborted_transactions(Some(vec![AbortedTransaction::default()
                .with_producer_id(kafka_protocol::messages::ProducerId(55))
                .with_first_offset(12)]));
            if version >= 12 {
                p = p
                    .with_diverging_epoch(
                        EpochEndOffset::default().with_epoch(3).with_end_offset(99),
                    )
                    .with_current_leader(
                        LeaderIdAndEpoch::default()
                            .with_leader_id(BrokerId(1))
                            .with_leader_epoch(4),
                    )
                    .with_snapshot_id(SnapshotId::default().with_end_offset(5).with_epoch(1));
            }
        }
        p
    }

    fn response(version: i16, sets: &[Option<Bytes>], rich: bool) -> FetchResponse {
        let topic = |name: &str, parts: Vec<PartitionData>| {
            let mut t = FetchableTopicResponse::default().with_partitions(parts);
            if version <= 12 {
                t = t.with_topic(TopicName(StrBytes::from_string(name.to_string())));
            } else {
                t = t.with_topic_id(uuid::Uuid::from_u128(0x1234_5678));
            }
            t
        };
        let parts: Vec<PartitionData> = sets
            .iter()
            .enumerate()
            .map(|(i, r)| partition(i as i32, r.clone(), version, rich && i == 1))
            .collect();
        let (a, b) = parts.split_at(parts.len() / 2);
        let mut r = FetchResponse::default()
            .with_throttle_time_ms(if rich { 17 } else { 0 })
            .with_responses(vec![topic("a", a.to_vec()), topic("bb", b.to_vec())]);
        if version >= 7 {
            r = r
                .with_error_code(0)
                .with_session_id(if rich { 77 } else { 0 });
        }
        if rich && version >= 16 {
            r = r.with_node_endpoints(vec![NodeEndpoint::default()
                .with_node_id(BrokerId(2))
                .with_host(StrBytes::from_static_str("127.0.0.2"))
                .with_port(9092)]);
        }
        r
    }

    #[test]
    fn the_same_bytes_as_kafka_protocols_encoder_at_every_version() {
        let sets: Vec<Option<Bytes>> = vec![
            Some(Bytes::from(vec![1u8; 300])),
            Some(Bytes::new()),
            Some(Bytes::from(vec![2u8; 70_000])),
            None,
            Some(Bytes::from_static(b"xyz")),
        ];
        for version in 4..=18 {
            for rich in [false, true] {
                let body = response(version, &sets, rich);
                let expected = crate::frame::encode_response(
                    ApiKey::Fetch,
                    version,
                    42,
                    &ResponseKind::Fetch(body.clone()),
                )
                .expect("kafka-protocol encodes");
                // Everything in place.
                let inline = encode_fetch_response(
                    version,
                    42,
                    &body,
                    sets.iter().map(|_| None::<(Bytes, usize)>),
                )
                .expect("encodes");
                assert_eq!(
                    flatten(inline),
                    &expected[..],
                    "v{version} rich {rich} inline"
                );
                // Every non-null set external (null stays in place: it has no length).
                let external = sets
                    .iter()
                    .map(|s| s.as_ref().map(|b| (b.clone(), b.len())));
                let split = encode_fetch_response(version, 42, &body, external).expect("encodes");
                let records = split
                    .parts
                    .iter()
                    .filter(|p| matches!(p, FramePart::Records(_)))
                    .count();
                assert_eq!(records, 4);
                assert_eq!(
                    flatten(split),
                    &expected[..],
                    "v{version} rich {rich} external"
                );
            }
        }
    }

    #[test]
    fn refuses_what_kafka_protocol_refuses() {
        let body = FetchResponse::default().with_session_id(5);
        assert!(encode_fetch_response::<Bytes>(6, 1, &body, []).is_err());
        assert!(encode_fetch_response::<Bytes>(3, 1, &FetchResponse::default(), []).is_err());
        assert!(encode_fetch_response::<Bytes>(19, 1, &FetchResponse::default(), []).is_err());
    }
}
