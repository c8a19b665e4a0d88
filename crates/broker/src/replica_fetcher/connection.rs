//! One connection from a replica fetcher to its source broker (Kafka's `BrokerBlockingSender`),
//! secured as the inter-broker listener asks ([`ClientSecurity`]: TLS, SASL): Kafka's framing (4-byte size, request header with client id
//! `broker-<id>-fetcher-<fetcher id>`), one request in flight, responses bounded before they
//! are allocated.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use gregor_network::client::{ClientSecurity, ClientStream};
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind,
};
use gregor_protocol::kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Why a request to the source broker gave no response. Any of them closes the connection.
#[derive(Debug, Error)]
pub enum ConnectionError {
    /// Connecting, writing or reading failed.
    #[error("{context} {address}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The source broker's address.
        address: String,
        /// The cause.
        source: std::io::Error,
    },
    /// No connection or response within `replica.socket.timeout.ms`.
    #[error("no answer from {0} in time")]
    Timeout(String),
    /// The response frame announced more than the bound (bytes).
    #[error("response of {size} bytes from {address} exceeds the {max} byte bound")]
    TooLarge {
        /// The source broker's address.
        address: String,
        /// Announced size in bytes.
        size: i64,
        /// The bound in bytes.
        max: usize,
    },
    /// Encoding the request or decoding the response failed, or the correlation id did not
    /// match.
    #[error("protocol error with {address}: {reason}")]
    Protocol {
        /// The source broker's address.
        address: String,
        /// What went wrong.
        reason: String,
    },
}

/// A connection to a source broker's inter-broker listener.
pub struct BrokerConnection {
    stream: ClientStream,
    address: String,
    client_id: String,
    next_correlation_id: i32,
    timeout: Duration,
    max_response_bytes: usize,
}

impl BrokerConnection {
    /// Connects to `address` within `timeout`, with the TLS handshake and SASL
    /// authentication `security` asks for.
    ///
    /// # Errors
    /// [`ConnectionError::Io`] (a failed handshake or authentication too) or
    /// [`ConnectionError::Timeout`].
    pub async fn connect(
        security: &ClientSecurity,
        address: &str,
        client_id: String,
        timeout: Duration,
        max_response_bytes: usize,
    ) -> Result<Self, ConnectionError> {
        let stream = match security.connect(address, &client_id, timeout).await {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                return Err(ConnectionError::Timeout(address.to_string()))
            }
            Err(source) => {
                return Err(ConnectionError::Io {
                    context: "connecting to",
                    address: address.to_string(),
                    source,
                })
            }
        };
        Ok(Self {
            stream,
            address: address.to_string(),
            client_id,
            next_correlation_id: 0,
            timeout,
            max_response_bytes,
        })
    }

    /// The source broker's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Sends `body` as `api_key` at `version` and waits for its response, all within the
    /// connection's timeout (`replica.socket.timeout.ms`, which must exceed the fetch's
    /// `max_wait_ms`).
    ///
    /// # Errors
    /// Every [`ConnectionError`]; the connection must then be dropped.
    pub async fn request(
        &mut self,
        api_key: ApiKey,
        version: i16,
        body: RequestKind,
    ) -> Result<ResponseKind, ConnectionError> {
        let timeout = self.timeout;
        match tokio::time::timeout(timeout, self.round_trip(api_key, version, body)).await {
            Ok(r) => r,
            Err(_) => Err(ConnectionError::Timeout(self.address.clone())),
        }
    }

    fn protocol(&self, reason: impl std::fmt::Display) -> ConnectionError {
        ConnectionError::Protocol {
            address: self.address.clone(),
            reason: reason.to_string(),
        }
    }

    fn io(&self, context: &'static str, source: std::io::Error) -> ConnectionError {
        ConnectionError::Io {
            context,
            address: self.address.clone(),
            source,
        }
    }

    async fn round_trip(
        &mut self,
        api_key: ApiKey,
        version: i16,
        body: RequestKind,
    ) -> Result<ResponseKind, ConnectionError> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(api_key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_string(self.client_id.clone())));
        let mut buf = BytesMut::with_capacity(512);
        buf.put_i32(0);
        header
            .encode(&mut buf, api_key.request_header_version(version))
            .map_err(|e| self.protocol(e))?;
        body.encode(&mut buf, version)
            .map_err(|e| self.protocol(e))?;
        let size = i32::try_from(buf.len() - 4).map_err(|e| self.protocol(e))?;
        buf[0..4].copy_from_slice(&size.to_be_bytes());
        self.stream
            .write_all(&buf)
            .await
            .map_err(|e| self.io("writing to", e))?;
        // TLS buffers what is written until flushed.
        self.stream
            .flush()
            .await
            .map_err(|e| self.io("writing to", e))?;
        let mut frame = self.read_frame().await?;
        let header = ResponseHeader::decode(&mut frame, api_key.response_header_version(version))
            .map_err(|e| self.protocol(format!("{e:#}")))?;
        if header.correlation_id != correlation_id {
            return Err(self.protocol(format!(
                "correlation id {} answers {correlation_id}",
                header.correlation_id
            )));
        }
        ResponseKind::decode(api_key, &mut frame, version)
            .map_err(|e| self.protocol(format!("{e:#}")))
    }

    /// Reads one frame, refusing a size above the bound before allocating and growing the
    /// buffer as bytes arrive.
    async fn read_frame(&mut self) -> Result<Bytes, ConnectionError> {
        let mut size = [0u8; 4];
        self.stream
            .read_exact(&mut size)
            .await
            .map_err(|e| self.io("reading from", e))?;
        let size = i32::from_be_bytes(size);
        let size = match usize::try_from(size) {
            Ok(s) if s <= self.max_response_bytes => s,
            _ => {
                return Err(ConnectionError::TooLarge {
                    address: self.address.clone(),
                    size: i64::from(size),
                    max: self.max_response_bytes,
                })
            }
        };
        const CHUNK: usize = 64 * 1024;
        let mut buf = BytesMut::with_capacity(size.min(CHUNK));
        while buf.len() < size {
            let want = (size - buf.len()).min(CHUNK);
            buf.reserve(want);
            let before = buf.len();
            let n = (&mut self.stream)
                .take(want as u64)
                .read_buf(&mut buf)
                .await
                .map_err(|e| self.io("reading from", e))?;
            if n == 0 || buf.len() == before {
                return Err(self.io(
                    "reading from",
                    std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
                ));
            }
        }
        Ok(buf.freeze())
    }
}
