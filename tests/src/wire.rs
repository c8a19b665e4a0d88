//! A raw Kafka protocol client for tests: frames requests with `kafka-protocol`'s encoders,
//! sends them over one blocking TCP connection and decodes the responses, checking the
//! correlation id. Tests that must control exactly what goes on the wire (retried batches,
//! every version of an API, malformed frames) use it instead of a client library.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context, Result};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

/// Largest response frame a test accepts (a sanity bound, not a protocol limit).
pub const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// A `StrBytes` from a `&str`.
pub fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// Encodes one request frame: the 4-byte size, the request header at the header version the
/// API and version call for, and the body.
///
/// # Errors
/// When the body cannot be encoded at `version`.
pub fn encode_frame<R: Encodable>(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    client_id: &str,
    body: &R,
) -> Result<Vec<u8>> {
    frame_with(key, version, correlation_id, client_id, |buf| {
        body.encode(buf, version)
    })
}

/// Like [`encode_frame`] for a [`RequestKind`].
///
/// # Errors
/// When the body cannot be encoded at `version`.
pub fn encode_kind_frame(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    client_id: &str,
    body: &RequestKind,
) -> Result<Vec<u8>> {
    frame_with(key, version, correlation_id, client_id, |buf| {
        body.encode(buf, version)
    })
}

/// The header, then whatever `body` writes, behind the frame's size.
fn frame_with(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    client_id: &str,
    body: impl FnOnce(&mut BytesMut) -> Result<()>,
) -> Result<Vec<u8>> {
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(sb(client_id)))
        .encode(&mut buf, key.request_header_version(version))
        .with_context(|| format!("encoding the {key:?} v{version} header"))?;
    body(&mut buf).with_context(|| format!("encoding {key:?} v{version}"))?;
    let mut frame = i32::try_from(buf.len())?.to_be_bytes().to_vec();
    frame.extend_from_slice(&buf);
    Ok(frame)
}

/// One blocking connection to a broker.
pub struct KafkaConn {
    stream: TcpStream,
    correlation_id: i32,
    client_id: String,
}

impl KafkaConn {
    /// Connects to `addr` with a 30 s read timeout and `client_id` in every request header.
    ///
    /// # Errors
    /// When the connection cannot be made.
    pub fn connect(addr: impl ToSocketAddrs + std::fmt::Debug, client_id: &str) -> Result<Self> {
        let stream =
            TcpStream::connect(&addr).with_context(|| format!("connecting to {addr:?}"))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            correlation_id: 0,
            client_id: client_id.to_string(),
        })
    }

    /// Connects with `connect_timeout` to one address (for probing a broker that may be down).
    ///
    /// # Errors
    /// When the connection cannot be made in time.
    pub fn connect_timeout(addr: SocketAddr, timeout: Duration, client_id: &str) -> Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Self {
            stream,
            correlation_id: 0,
            client_id: client_id.to_string(),
        })
    }

    /// The underlying stream, for tests that write raw bytes or change timeouts.
    pub fn stream(&mut self) -> &mut TcpStream {
        &mut self.stream
    }

    fn next_correlation_id(&mut self) -> i32 {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        self.correlation_id
    }

    /// Sends a typed request and decodes the typed response.
    ///
    /// # Errors
    /// I/O errors, a closed connection, a wrong correlation id or an undecodable response.
    pub fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &Req,
    ) -> Result<Resp> {
        let correlation_id = self.next_correlation_id();
        let frame = encode_frame(key, version, correlation_id, &self.client_id, req)?;
        self.stream.write_all(&frame)?;
        let mut body = self.expect_response(key, version, correlation_id)?;
        Resp::decode(&mut body, version).with_context(|| format!("decoding {key:?} v{version}"))
    }

    /// Sends a [`RequestKind`] and decodes the [`ResponseKind`], failing on trailing bytes.
    ///
    /// # Errors
    /// As [`KafkaConn::call`].
    pub fn call_kind(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &RequestKind,
    ) -> Result<ResponseKind> {
        let correlation_id = self.next_correlation_id();
        let frame = encode_kind_frame(key, version, correlation_id, &self.client_id, req)?;
        self.stream.write_all(&frame)?;
        let mut body = self.expect_response(key, version, correlation_id)?;
        let resp = ResponseKind::decode(key, &mut body, version)
            .with_context(|| format!("decoding {key:?} v{version}"))?;
        ensure!(body.is_empty(), "{key:?} v{version}: trailing bytes");
        Ok(resp)
    }

    /// Sends a request without waiting for its response (pipelining, acks=0). Returns its
    /// correlation id.
    ///
    /// # Errors
    /// Encoding or I/O errors.
    pub fn send<Req: Encodable>(&mut self, key: ApiKey, version: i16, req: &Req) -> Result<i32> {
        let correlation_id = self.next_correlation_id();
        let frame = encode_frame(key, version, correlation_id, &self.client_id, req)?;
        self.stream.write_all(&frame)?;
        Ok(correlation_id)
    }

    /// Writes `bytes` as they are (malformed frames, partial frames).
    ///
    /// # Errors
    /// I/O errors.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Reads one response frame (without its size prefix); `None` when the broker closed the
    /// connection before a frame started.
    ///
    /// # Errors
    /// I/O errors, a timeout, or a frame larger than [`MAX_RESPONSE_BYTES`].
    pub fn read_frame(&mut self) -> Result<Option<Bytes>> {
        let mut len = [0u8; 4];
        match self.stream.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(None),
            Err(e) => return Err(e).context("reading a response size"),
        }
        let len = usize::try_from(i32::from_be_bytes(len))
            .map_err(|_| anyhow!("negative response size"))?;
        ensure!(len <= MAX_RESPONSE_BYTES, "response of {len} bytes");
        let mut body = vec![0u8; len];
        self.stream
            .read_exact(&mut body)
            .context("reading a response body")?;
        Ok(Some(Bytes::from(body)))
    }

    /// Reads the response to `correlation_id` and returns its body after the response header.
    ///
    /// # Errors
    /// A closed connection, a wrong correlation id, or I/O errors.
    pub fn expect_response(
        &mut self,
        key: ApiKey,
        version: i16,
        correlation_id: i32,
    ) -> Result<Bytes> {
        let Some(mut b) = self
            .read_frame()
            .with_context(|| format!("waiting for the {key:?} v{version} response"))?
        else {
            bail!("connection closed before the {key:?} v{version} response");
        };
        let h = ResponseHeader::decode(&mut b, key.response_header_version(version))?;
        ensure!(
            h.correlation_id == correlation_id,
            "{key:?} v{version}: correlation id {} in the response, {correlation_id} sent",
            h.correlation_id
        );
        Ok(b)
    }

    /// True when the broker has closed the connection (a read sees end of stream or a reset
    /// within the read timeout); false when it answers or stays silent.
    pub fn closed_by_peer(&mut self) -> bool {
        let mut b = [0u8; 1];
        match self.stream.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
            ),
        }
    }
}
