//! Request and response framing, per the Kafka protocol guide ("Common Request and Response
//! Structure"): every message is a 4-byte big-endian size followed by that many bytes; a request
//! starts with a header whose version depends on the API key and version (flexible versions use
//! header v2 with tagged fields, KIP-482).
//!
//! The caller reads the 4-byte size, checks it against `socket.request.max.bytes` before
//! allocating, reads the frame, and hands it to [`decode_request`].

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};
use thiserror::Error;

/// Why a frame could not be turned into a request. Apache Kafka closes the connection in each
/// of these cases; the broker logs the error and does the same.
#[derive(Debug, Error)]
pub enum FrameError {
    /// The frame is shorter than the fixed part of a request header (8 bytes).
    #[error("request frame of {0} bytes is shorter than a request header")]
    TooShort(usize),
    /// The API key is not one Kafka defines.
    #[error("unknown api key {0}")]
    UnknownApiKey(i16),
    /// The header or body did not decode at the version the header announced.
    #[error(
        "malformed {api_key:?} v{version} request (correlation id {correlation_id}): {reason}"
    )]
    Malformed {
        /// API of the request.
        api_key: ApiKey,
        /// Version from the header.
        version: i16,
        /// Correlation id from the header.
        correlation_id: i32,
        /// What the decoder said.
        reason: String,
    },
    /// A response failed to encode (a bug: a field does not fit the negotiated version).
    #[error("cannot encode {api_key:?} v{version} response: {reason}")]
    Encode {
        /// API of the response.
        api_key: ApiKey,
        /// Version being encoded.
        version: i16,
        /// What the encoder said.
        reason: String,
    },
}

/// A decoded request frame.
#[derive(Debug)]
pub enum DecodedRequest {
    /// A request at a version that gregor supports.
    Request {
        /// The request header (api key, version, correlation id, client id).
        header: RequestHeader,
        /// API of the request.
        api_key: ApiKey,
        /// The decoded body (boxed: request bodies vary widely in size).
        body: Box<RequestKind>,
    },
    /// An ApiVersions request at a version newer than gregor knows. Per KIP-511 the broker
    /// answers with an ApiVersions v0 response carrying UNSUPPORTED_VERSION and its ranges, and
    /// keeps the connection.
    UnsupportedApiVersions {
        /// Correlation id to answer with.
        correlation_id: i32,
        /// Version the client asked for.
        version: i16,
    },
    /// Any other API at a version outside the range gregor supports. Kafka closes the connection.
    UnsupportedVersion {
        /// API of the request.
        api_key: ApiKey,
        /// Version the client asked for.
        version: i16,
        /// Correlation id of the request.
        correlation_id: i32,
    },
}

/// The version range gregor accepts for `api_key`, or `None` if the API is not implemented.
/// Supplied by the broker (which knows what it implements).
pub type SupportedVersions = dyn Fn(ApiKey) -> Option<(i16, i16)> + Send + Sync;

/// Decodes one request frame (without the 4-byte size prefix).
///
/// # Errors
/// [`FrameError`] when the header is short, the API key is unknown or the body is malformed.
pub fn decode_request(
    mut frame: Bytes,
    supported: &SupportedVersions,
) -> Result<DecodedRequest, FrameError> {
    if frame.len() < 8 {
        return Err(FrameError::TooShort(frame.len()));
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let api_key = ApiKey::try_from(raw_key).map_err(|()| FrameError::UnknownApiKey(raw_key))?;
    let in_range = supported(api_key).is_some_and(|(min, max)| version >= min && version <= max);
    if !in_range {
        if api_key == ApiKey::ApiVersions {
            return Ok(DecodedRequest::UnsupportedApiVersions {
                correlation_id,
                version,
            });
        }
        return Ok(DecodedRequest::UnsupportedVersion {
            api_key,
            version,
            correlation_id,
        });
    }
    let malformed = |reason: String| FrameError::Malformed {
        api_key,
        version,
        correlation_id,
        reason,
    };
    let header_version = api_key.request_header_version(version);
    // `{:#}` keeps the decoder's cause ("Tried to allocate a collection of size ...") in the
    // message the broker logs when it closes the connection.
    let header = RequestHeader::decode(&mut frame, header_version)
        .map_err(|e| malformed(format!("{e:#}")))?;
    let body = RequestKind::decode(api_key, &mut frame, version)
        .map_err(|e| malformed(format!("{e:#}")))?;
    Ok(DecodedRequest::Request {
        header,
        api_key,
        body: Box::new(body),
    })
}

/// Encodes a response with its size prefix and header (header v0 or v1 as the API and version
/// require; ApiVersions always uses v0).
///
/// # Errors
/// [`FrameError::Encode`] when the body cannot be encoded at `version`.
pub fn encode_response(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &ResponseKind,
) -> Result<Bytes, FrameError> {
    let err = |reason: String| FrameError::Encode {
        api_key,
        version,
        reason,
    };
    let mut buf = BytesMut::with_capacity(128);
    buf.put_i32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    header
        .encode(&mut buf, api_key.response_header_version(version))
        .map_err(|e| err(e.to_string()))?;
    body.encode(&mut buf, version)
        .map_err(|e| err(e.to_string()))?;
    let size = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&size.to_be_bytes());
    Ok(buf.freeze())
}

/// Reads the 4-byte size prefix of a frame. A negative size is returned as is; the caller
/// rejects it together with sizes above `socket.request.max.bytes`.
pub fn frame_size(prefix: [u8; 4]) -> i32 {
    let mut b = &prefix[..];
    b.get_i32()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{ApiVersionsRequest, MetadataRequest, RequestKind};
    use kafka_protocol::protocol::StrBytes;

    fn all(_k: ApiKey) -> Option<(i16, i16)> {
        Some((0, 4))
    }

    fn frame_of(api_key: ApiKey, version: i16, body: &RequestKind) -> Bytes {
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(api_key as i16)
            .with_request_api_version(version)
            .with_correlation_id(7)
            .with_client_id(Some(StrBytes::from_static_str("t")))
            .encode(&mut buf, api_key.request_header_version(version))
            .unwrap();
        body.encode(&mut buf, version).unwrap();
        buf.freeze()
    }

    #[test]
    fn decodes_a_flexible_request() {
        let f = frame_of(
            ApiKey::ApiVersions,
            3,
            &RequestKind::ApiVersions(ApiVersionsRequest::default()),
        );
        match decode_request(f, &all).unwrap() {
            DecodedRequest::Request { header, .. } => {
                assert_eq!(header.correlation_id, 7);
                assert_eq!(header.client_id.as_deref(), Some("t"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn newer_api_versions_is_answered_not_dropped() {
        let mut f = BytesMut::new();
        f.put_i16(ApiKey::ApiVersions as i16);
        f.put_i16(99);
        f.put_i32(5);
        f.put_slice(&[0, 0, 0]);
        match decode_request(f.freeze(), &all).unwrap() {
            DecodedRequest::UnsupportedApiVersions {
                correlation_id,
                version,
            } => assert_eq!((correlation_id, version), (5, 99)),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn truncated_body_is_malformed_not_a_panic() {
        let f = frame_of(
            ApiKey::Metadata,
            4,
            &RequestKind::Metadata(MetadataRequest::default().with_topics(None)),
        );
        for cut in 0..f.len() {
            let _ = decode_request(f.slice(..cut), &all);
        }
        assert!(matches!(
            decode_request(Bytes::from_static(&[0, 99, 0, 0, 0, 0, 0, 1]), &all),
            Err(FrameError::UnknownApiKey(99))
        ));
    }

    #[test]
    fn response_has_size_prefix() {
        let body = ResponseKind::ApiVersions(Default::default());
        let b = encode_response(ApiKey::ApiVersions, 3, 9, &body).unwrap();
        assert_eq!(frame_size([b[0], b[1], b[2], b[3]]) as usize, b.len() - 4);
        assert_eq!(&b[4..8], &9i32.to_be_bytes());
    }
}
