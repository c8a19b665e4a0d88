//! The seam between the network and the broker: [`RequestHandler`], implemented by the broker,
//! and [`Handled`], what a handler returns for one request.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use gregor_protocol::frame;
use gregor_protocol::kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseKind};
use tracing::error;

use crate::context::RequestContext;
use crate::response::Response;

/// A response in the making: ready now, or computed by a deferred task.
pub enum Handled {
    /// The encoded response (with its size prefix), or None when the request gets no response
    /// (acks=0).
    Ready(Option<Bytes>),
    /// A response that waits for something (high watermark, new data, a rebalance). The
    /// connection runs it as its own task; responses are still written in request order.
    Deferred(Pin<Box<dyn Future<Output = Option<Bytes>> + Send>>),
    /// A response in parts, some of them file regions sent without copying (a Fetch
    /// response's record sets, [`Response`]).
    ReadyResponse(Response),
    /// [`Handled::Deferred`] for a response in parts.
    DeferredResponse(Pin<Box<dyn Future<Output = Option<Response>> + Send>>),
    /// No response, and the connection is closed after the responses before it are sent. Kafka
    /// does this for an acks=0 produce that failed, so the producer notices and refreshes its
    /// metadata.
    CloseConnection,
}

/// Encodes a response body for the request's API, version and correlation id. An encoding
/// failure is a gregor bug; it is logged and the connection will see no response.
pub fn respond(header: &RequestHeader, api_key: ApiKey, body: ResponseKind) -> Option<Bytes> {
    match frame::encode_response(
        api_key,
        header.request_api_version,
        header.correlation_id,
        &body,
    ) {
        Ok(b) => Some(b),
        Err(e) => {
            error!(error = %e, "response encoding failed");
            None
        }
    }
}

/// What the broker plugs into the network: the versions it accepts and a handler per request.
///
/// The network calls [`RequestHandler::handle`] for the requests of one connection one after
/// another, in request order, awaiting each immediate part before decoding the next request
/// (so pipelined appends of an idempotent producer happen in order); deferred parts run
/// concurrently and their responses are still written in request order.
pub trait RequestHandler: Send + Sync + 'static {
    /// The version range accepted for `api_key`, or None when the API is not implemented.
    /// Requests outside it close the connection, except ApiVersions (KIP-511).
    fn supported_versions(&self, api_key: ApiKey) -> Option<(i16, i16)>;

    /// Runs the immediate part of one request.
    fn handle<'a>(
        &'a self,
        ctx: &'a RequestContext,
        body: RequestKind,
    ) -> impl Future<Output = Handled> + Send + 'a;

    /// The response to an ApiVersions request at a version newer than supported: an
    /// ApiVersions v0 response with UNSUPPORTED_VERSION (KIP-511).
    fn unsupported_api_versions(&self, correlation_id: i32) -> Option<Bytes>;

    /// Called after the response to `ctx`'s request was written, with the time the write took
    /// (for metrics). The default does nothing.
    fn response_sent(&self, ctx: &RequestContext, send_time: Duration) {
        let _ = (ctx, send_time);
    }

    /// Runs `job` off the async workers: the writer's transfers from files to sockets
    /// (`splice`, or reading a file region on the copying path), which may wait for the
    /// disk. The default uses tokio's blocking pool; the broker runs them on its I/O pool
    /// (`num.io.threads`), as its log reads. A job that is dropped unrun closes its connection.
    fn run_blocking(&self, job: Box<dyn FnOnce() + Send + 'static>) {
        drop(tokio::task::spawn_blocking(job));
    }

    /// Whether a job of [`RequestHandler::run_blocking`] that sends a response may keep its
    /// thread a little longer, waiting for the client to drain the socket, rather than hand
    /// the rest back to the async writer (two thread wake-ups). Asked from that job, before
    /// each wait. The default (tokio's blocking pool, which grows) always allows it; the
    /// broker allows it while its I/O pool has an idle thread, so no queued work waits.
    fn transfer_may_wait(&self) -> bool {
        true
    }
}
