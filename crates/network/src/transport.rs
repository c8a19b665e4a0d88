//! The byte stream under a connection, behind a trait so TLS (`SSL`) and SASL can wrap it.
//!
//! A [`TransportLayer`] belongs to a listener: it turns an accepted TCP connection into a
//! [`Transport`] (a TLS layer would run its handshake here) and says which principal the
//! connection starts with. SASL authenticates with Kafka requests (SaslHandshake,
//! SaslAuthenticate) on the framed stream, so a SASL layer will also supply the principal
//! once authentication completes. Only [`PlaintextTransportLayer`] exists today.
//!
//! A layer hands the connection over as a [`Stream`]: [`Stream::Tcp`] when the bytes written
//! reach the peer as they are (plaintext), so responses may send file regions with
//! `splice` (zero-copy fetch); [`Stream::Other`] for a transport that transforms them (TLS),
//! whose responses read file regions into memory first.

use std::future::Future;
use std::io;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::context::{KafkaPrincipal, SecurityProtocol};

/// A connected, bidirectional byte stream.
pub trait Transport: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Transport for T {}

/// The byte stream of an established connection.
pub enum Stream {
    /// The TCP stream itself: file regions of responses are sent without a copy.
    Tcp(TcpStream),
    /// A transport over it (TLS): file regions are read into memory and written.
    Other(Box<dyn Transport>),
}

impl Stream {
    /// Whether responses on this stream can send file regions without copying them.
    pub fn sends_files(&self) -> bool {
        matches!(self, Self::Tcp(_))
    }
}

/// An accepted connection after its transport handshake.
pub struct Established {
    /// The stream requests are read from and responses written to.
    pub stream: Stream,
    /// Who is at the other end (`User:ANONYMOUS` for plaintext).
    pub principal: KafkaPrincipal,
}

/// How a listener secures its connections.
pub trait TransportLayer: Send + Sync + 'static {
    /// The listener's security protocol.
    fn security_protocol(&self) -> SecurityProtocol;

    /// Runs the transport handshake on an accepted TCP connection.
    ///
    /// # Errors
    /// The I/O or handshake error; the connection is closed with a log line.
    fn establish(
        &self,
        stream: TcpStream,
    ) -> Pin<Box<dyn Future<Output = io::Result<Established>> + Send + '_>>;
}

/// PLAINTEXT: the TCP stream as is, principal `User:ANONYMOUS`.
#[derive(Debug, Default, Clone, Copy)]
pub struct PlaintextTransportLayer;

impl TransportLayer for PlaintextTransportLayer {
    fn security_protocol(&self) -> SecurityProtocol {
        SecurityProtocol::Plaintext
    }

    fn establish(
        &self,
        stream: TcpStream,
    ) -> Pin<Box<dyn Future<Output = io::Result<Established>> + Send + '_>> {
        Box::pin(async move {
            Ok(Established {
                stream: Stream::Tcp(stream),
                principal: KafkaPrincipal::anonymous(),
            })
        })
    }
}
