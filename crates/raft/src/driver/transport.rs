//! The outbound socket transport of the quorum: one connection per peer voter to its
//! controller listener (`controller.quorum.voters`), Kafka's request framing (4-byte size,
//! request header v2 with client id `raft-client-<node id>`), the node's correlation ids on
//! the wire, and responses handed back to the driver as [`Message::Response`].
//! Connections are opened by a [`Connector`]: plain TCP by default, or the broker's, which
//! runs the controller listener's TLS handshake and SASL authentication.
//!
//! - **Versions** are fixed, not negotiated: Vote v2 (KIP-996 `PreVote`), BeginQuorumEpoch v1,
//!   EndQuorumEpoch v1 (Kafka 4.x's highest), Fetch v18 (KIP-1166's `HighWatermark`, which the
//!   core's long-poll rule needs; Kafka 4.4 accepts 4-18 on a controller listener).
//! - **Failures are never fatal.** An unreachable voter is retried with a binary exponential
//!   backoff from `controller.quorum.retry.backoff.ms` up to [`MAX_RECONNECT_BACKOFF_MS`];
//!   requests given to it meanwhile are dropped (the node's request timeout and retry cover
//!   them, as for a lost message). A connection with a request unanswered for
//!   `controller.quorum.request.timeout.ms` is closed and reopened, as Kafka's `NetworkClient`
//!   does.
//! - **Bounds.** A response frame larger than [`MAX_RESPONSE_FRAME_BYTES`] closes the
//!   connection before anything is allocated; at most [`PEER_QUEUE_CAPACITY`] requests wait
//!   per peer (more are dropped).

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{InboundSender, Transport};
use crate::convert;
use crate::message::{Message, Request, Response};
use crate::types::{NodeId, VoterEndpoints};
use gregor_protocol::error::ErrorCode;

/// Largest response frame read (bytes): a Fetch response holds at most
/// `MAX_BATCH_SIZE_BYTES` (8 MiB) of records plus headers.
pub const MAX_RESPONSE_FRAME_BYTES: usize = crate::config::MAX_BATCH_SIZE_BYTES + 1024 * 1024;

/// Requests that may wait for one peer's connection.
pub const PEER_QUEUE_CAPACITY: usize = 64;

/// Cap of the reconnect backoff (ms), as Kafka's `reconnect.backoff.max.ms` default.
pub const MAX_RECONNECT_BACKOFF_MS: u64 = 1000;

/// Vote version sent.
pub const VOTE_VERSION: i16 = 2;
/// BeginQuorumEpoch version sent.
pub const BEGIN_QUORUM_EPOCH_VERSION: i16 = 1;
/// EndQuorumEpoch version sent.
pub const END_QUORUM_EPOCH_VERSION: i16 = 1;
/// Fetch version sent.
pub const FETCH_VERSION: i16 = 18;
/// FetchSnapshot version sent (Kafka 4.x controllers serve 0-1; v1 adds only tagged fields).
pub const FETCH_SNAPSHOT_VERSION: i16 = 1;

/// Settings of the transport (Kafka's names).
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// This node's id (`raft-client-<id>` is the client id).
    pub node_id: NodeId,
    /// Each voter's controller endpoint; the entry of this node is not used.
    pub endpoints: VoterEndpoints,
    /// `controller.quorum.request.timeout.ms` (default 2000).
    pub request_timeout_ms: u64,
    /// `controller.quorum.retry.backoff.ms` (default 20): the first reconnect backoff.
    pub retry_backoff_ms: u64,
}

/// A connected byte stream to a voter: TCP, or TLS over it.
pub trait PeerStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> PeerStream for T {}

/// The future of [`Connector::connect`].
pub type ConnectFuture<'a> =
    Pin<Box<dyn Future<Output = io::Result<Box<dyn PeerStream>>> + Send + 'a>>;

/// Opens the connection to a voter's controller listener: [`TcpConnector`] by default; the
/// broker plugs in one that runs the listener's TLS handshake and SASL authentication, so this
/// crate needs no network or security dependency.
pub trait Connector: Send + Sync + 'static {
    /// Connects to `address` (`host:port`) as `client_id` within `timeout`.
    ///
    /// # Errors
    /// The connect, handshake or authentication error; the transport retries with backoff.
    fn connect<'a>(
        &'a self,
        address: &'a str,
        client_id: &'a str,
        timeout: Duration,
    ) -> ConnectFuture<'a>;
}

/// Plain TCP (`PLAINTEXT` controller listeners).
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    fn connect<'a>(
        &'a self,
        address: &'a str,
        _client_id: &'a str,
        timeout: Duration,
    ) -> ConnectFuture<'a> {
        Box::pin(async move {
            let stream = tokio::time::timeout(timeout, TcpStream::connect(address))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
            let _ = stream.set_nodelay(true);
            Ok(Box::new(stream) as Box<dyn PeerStream>)
        })
    }
}

/// [`Transport`] over TCP. Connection tasks run on the tokio runtime current when
/// [`SocketTransport::new`] is called.
pub struct SocketTransport {
    peers: Mutex<BTreeMap<NodeId, mpsc::Sender<Message>>>,
}

impl SocketTransport {
    /// Starts one connection task per peer voter over plain TCP. Must be called inside a
    /// tokio runtime.
    pub fn new(config: TransportConfig, inbound: InboundSender) -> Self {
        Self::with_connector(config, inbound, Arc::new(TcpConnector))
    }

    /// Starts one connection task per peer voter, connecting with `connector`. Must be called
    /// inside a tokio runtime.
    pub fn with_connector(
        config: TransportConfig,
        inbound: InboundSender,
        connector: Arc<dyn Connector>,
    ) -> Self {
        let config = Arc::new(config);
        let mut peers = BTreeMap::new();
        for (&id, (host, port)) in &config.endpoints {
            if id == config.node_id {
                continue;
            }
            let (tx, rx) = mpsc::channel(PEER_QUEUE_CAPACITY);
            peers.insert(id, tx);
            tokio::spawn(peer_task(
                config.clone(),
                connector.clone(),
                id,
                format!("{host}:{port}"),
                rx,
                inbound.clone(),
            ));
        }
        Self {
            peers: Mutex::new(peers),
        }
    }
}

impl Transport for SocketTransport {
    fn send(&self, to: NodeId, message: Message) {
        if let Some(tx) = self.peers.lock().get(&to) {
            if tx.try_send(message).is_err() {
                tracing::debug!(to, "raft request dropped: peer queue full or closed");
            }
        } else {
            tracing::warn!(to, "raft request to a node that is not a voter dropped");
        }
    }

    fn close(&self) {
        // Dropping the senders ends each peer task once it has written what is queued (an
        // EndQuorumEpoch of a resigning leader, for example).
        self.peers.lock().clear();
    }
}

/// Encodes one request frame (size prefix included).
///
/// # Errors
/// The encoder's message when a field does not fit the version (a bug).
pub fn encode_request(
    client_id: &str,
    correlation_id: i32,
    request: &Request,
) -> Result<(ApiKey, i16, Bytes), String> {
    let (api_key, version, body): (ApiKey, i16, RequestKind) = match request {
        Request::Vote(r) => (
            ApiKey::Vote,
            VOTE_VERSION,
            RequestKind::Vote(convert::vote_request_to_kafka(r)),
        ),
        Request::BeginQuorumEpoch(r) => (
            ApiKey::BeginQuorumEpoch,
            BEGIN_QUORUM_EPOCH_VERSION,
            RequestKind::BeginQuorumEpoch(convert::begin_quorum_epoch_request_to_kafka(r)),
        ),
        Request::EndQuorumEpoch(r) => (
            ApiKey::EndQuorumEpoch,
            END_QUORUM_EPOCH_VERSION,
            RequestKind::EndQuorumEpoch(convert::end_quorum_epoch_request_to_kafka(r)),
        ),
        Request::Fetch(r) => (
            ApiKey::Fetch,
            FETCH_VERSION,
            RequestKind::Fetch(convert::fetch_request_to_kafka(r, FETCH_VERSION)),
        ),
        Request::FetchSnapshot(r) => (
            ApiKey::FetchSnapshot,
            FETCH_SNAPSHOT_VERSION,
            RequestKind::FetchSnapshot(convert::fetch_snapshot_request_to_kafka(r)),
        ),
    };
    let header = RequestHeader::default()
        .with_request_api_key(api_key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_string(client_id.to_string())));
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    header
        .encode(&mut buf, api_key.request_header_version(version))
        .map_err(|e| e.to_string())?;
    body.encode(&mut buf, version).map_err(|e| e.to_string())?;
    let size = i32::try_from(buf.len() - 4).map_err(|e| e.to_string())?;
    buf[0..4].copy_from_slice(&size.to_be_bytes());
    Ok((api_key, version, buf.freeze()))
}

/// Decodes one response frame (without its size prefix) of a request of `api_key` at
/// `version` into the core's [`Response`], with its correlation id.
///
/// # Errors
/// A message naming what did not decode.
pub fn decode_response(
    api_key: ApiKey,
    version: i16,
    mut frame: Bytes,
) -> Result<(i32, Response), String> {
    let header = ResponseHeader::decode(&mut frame, api_key.response_header_version(version))
        .map_err(|e| format!("{e:#}"))?;
    let body = ResponseKind::decode(api_key, &mut frame, version).map_err(|e| format!("{e:#}"))?;
    let response = match body {
        ResponseKind::Vote(r) => convert::vote_response_from_kafka(&r).map(Response::Vote),
        ResponseKind::BeginQuorumEpoch(r) => {
            convert::begin_quorum_epoch_response_from_kafka(&r).map(Response::BeginQuorumEpoch)
        }
        ResponseKind::EndQuorumEpoch(r) => {
            convert::end_quorum_epoch_response_from_kafka(&r).map(Response::EndQuorumEpoch)
        }
        ResponseKind::Fetch(r) => convert::fetch_response_from_kafka(&r).map(Response::Fetch),
        ResponseKind::FetchSnapshot(r) => {
            convert::fetch_snapshot_response_from_kafka(&r).map(Response::FetchSnapshot)
        }
        _ => return Err(format!("unexpected response to {api_key:?}")),
    }
    .map_err(|e| e.to_string())?;
    Ok((header.correlation_id, response))
}

/// Refusals of this node's raft requests for want of authorisation: at most 10 lines per 10 s.
static REFUSED_LOGS: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);

/// Logs (at most once per 10 s) a peer answering CLUSTER_AUTHORIZATION_FAILED: the principal
/// this node logs in with on the controller listener lacks ClusterAction there, so no quorum
/// forms until it is in the peer's `super.users` (the peer's authorizer has no ACLs before a
/// leader is elected).
fn warn_if_refused(peer: NodeId, address: &str, api: ApiKey, response: &Response) {
    let error = match response {
        Response::Vote(r) => r.error,
        Response::BeginQuorumEpoch(r) => r.error,
        Response::EndQuorumEpoch(r) => r.error,
        Response::Fetch(r) => r.error,
        Response::FetchSnapshot(r) => r.error,
    };
    if error != ErrorCode::ClusterAuthorizationFailed {
        return;
    }
    let now = std::time::Instant::now();
    let mut last = REFUSED_LOGS.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_some_and(|t| now.duration_since(t) < std::time::Duration::from_secs(10)) {
        return;
    }
    *last = Some(now);
    tracing::warn!(
        peer,
        %address,
        request = ?api,
        "voter {peer} refused this node's {api:?} request with CLUSTER_AUTHORIZATION_FAILED: the principal this node logs in with on the controller listener needs ClusterAction on the cluster there; list it in that node's super.users (e.g. User:CN=node1 with mTLS)"
    );
}

/// Reads frames from `reader` into `tx` until the connection fails or a frame is too large.
async fn read_frames(mut reader: ReadHalf<Box<dyn PeerStream>>, tx: mpsc::Sender<Bytes>) {
    loop {
        let mut size = [0u8; 4];
        if reader.read_exact(&mut size).await.is_err() {
            return;
        }
        let size = i32::from_be_bytes(size);
        let Ok(size) = usize::try_from(size) else {
            return;
        };
        if size > MAX_RESPONSE_FRAME_BYTES {
            tracing::warn!(
                size,
                "raft response frame too large; closing the connection"
            );
            return;
        }
        // The buffer grows as bytes arrive rather than trusting the size up front.
        let mut buf = BytesMut::with_capacity(size.min(64 * 1024));
        while buf.len() < size {
            let want = (size - buf.len()).min(64 * 1024);
            let mut chunk = vec![0u8; want];
            match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        if tx.send(buf.freeze()).await.is_err() {
            return;
        }
    }
}

async fn peer_task(
    config: Arc<TransportConfig>,
    connector: Arc<dyn Connector>,
    peer: NodeId,
    address: String,
    mut requests: mpsc::Receiver<Message>,
    inbound: InboundSender,
) {
    let client_id = format!("raft-client-{}", config.node_id);
    let request_timeout = Duration::from_millis(config.request_timeout_ms.max(1));
    let mut backoff_ms = config.retry_backoff_ms.max(1);
    loop {
        let stream = match connector
            .connect(&address, &client_id, request_timeout)
            .await
        {
            Ok(s) => s,
            Err(failed) => {
                tracing::debug!(peer, %address, error = %failed, "raft connection failed; retrying after {backoff_ms} ms");
                let until = Instant::now() + Duration::from_millis(backoff_ms);
                backoff_ms = (backoff_ms * 2).min(MAX_RECONNECT_BACKOFF_MS);
                // Requests for an unreachable peer are dropped, not queued behind the backoff.
                loop {
                    tokio::select! {
                        m = requests.recv() => if m.is_none() { return },
                        _ = tokio::time::sleep_until(until) => break,
                    }
                }
                continue;
            }
        };
        tracing::debug!(peer, %address, "raft connection open");
        backoff_ms = config.retry_backoff_ms.max(1);
        let (reader, mut writer) = tokio::io::split(stream);
        let (frames_tx, mut frames) = mpsc::channel(16);
        let reader_task = tokio::spawn(read_frames(reader, frames_tx));
        // Requests in flight on this connection: correlation id -> (api, version, sent at).
        let mut inflight: BTreeMap<i32, (ApiKey, i16, Instant)> = BTreeMap::new();
        let mut closed = false;
        loop {
            let oldest = inflight.values().map(|&(_, _, at)| at).min();
            let timeout_at = oldest.map_or_else(
                || Instant::now() + Duration::from_secs(3600),
                |at| at + request_timeout,
            );
            tokio::select! {
                m = requests.recv(), if !closed => {
                    let Some(Message::Request { correlation_id, request }) = m else {
                        if m.is_none() {
                            closed = true;
                            if inflight.is_empty() { break; }
                        }
                        continue;
                    };
                    match encode_request(&client_id, correlation_id, &request) {
                        Ok((api, version, frame)) => {
                            // TLS buffers what is written until flushed.
                            if writer.write_all(&frame).await.is_err()
                                || writer.flush().await.is_err()
                            {
                                break;
                            }
                            inflight.insert(correlation_id, (api, version, Instant::now()));
                        }
                        Err(e) => tracing::error!(peer, error = %e, "cannot encode raft request"),
                    }
                }
                frame = frames.recv() => {
                    let Some(frame) = frame else { break };
                    if frame.len() < 4 {
                        break;
                    }
                    let correlation_id = (&frame[..4]).get_i32();
                    let Some((api, version, _)) = inflight.remove(&correlation_id) else {
                        tracing::warn!(peer, correlation_id, "raft response to no request; closing");
                        break;
                    };
                    match decode_response(api, version, frame) {
                        Ok((cid, response)) => {
                            warn_if_refused(peer, &address, api, &response);
                            inbound.deliver(peer, Message::Response { correlation_id: cid, response })
                        }
                        Err(e) => {
                            tracing::warn!(peer, error = %e, "undecodable raft response; closing");
                            break;
                        }
                    }
                    if closed && inflight.is_empty() {
                        break;
                    }
                }
                _ = tokio::time::sleep_until(timeout_at) => {
                    tracing::debug!(peer, "raft request timed out; reconnecting");
                    break;
                }
            }
        }
        reader_task.abort();
        if closed {
            return;
        }
    }
}
