//! gregor-network: everything between a TCP socket and a decoded request. It owns the
//! listeners and their accept loops, the per-connection reader and writer (requests decoded
//! and their immediate parts run in order, responses written in request order), the transport
//! behind a trait ([`transport::TransportLayer`], plaintext TCP today; TLS and SASL wrap it
//! later), connection quotas (`max.connections`, `max.connections.per.ip`), the request memory
//! pool (`queued.max.request.bytes`), idle connection expiry (`connections.max.idle.ms`) and
//! the [`RequestContext`] handed to every handler, and the writing of responses in parts
//! ([`Response`]: a Fetch response's record sets go from the segment files to the socket
//! without a copy on plain TCP, [`response`]).
//!
//! It knows no handler and no partition: the broker plugs in through [`RequestHandler`].
#![deny(missing_docs)]

pub mod client;
pub mod context;
pub mod handler;
pub mod log_limit;
pub mod pool;
pub mod quotas;
pub mod response;
pub mod sasl;
mod send;
pub mod server;
pub mod tls;
pub mod transport;

pub use context::{ConnectionThrottle, KafkaPrincipal, RequestContext, SecurityProtocol};
pub use handler::{respond, Handled, RequestHandler};
pub use response::{FileRegion, RegionFile, Response, ResponsePart};
pub use server::{
    bind, bind_with_layers, bind_with_sasl, BoundListener, EndPoint, NetworkError, SocketServer,
    SocketServerConfig,
};
