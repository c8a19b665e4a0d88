//! The broker's channel to the active controller (Kafka's `NodeToControllerChannelManager`,
//! KIP-590, KIP-631).
//!
//! [`ControllerChannel`] finds the active controller from this node's quorum member
//! (`RaftManager::leader_and_epoch`) and the voters' controller endpoints
//! (`controller.quorum.voters`), keeps one connection to it over its controller listener, and
//! sends one request at a time on it (Kafka's channel has one request in flight per
//! connection), with its own correlation ids. Two timeouts apply, as in Kafka's
//! `NodeToControllerChannelManager`: one request on the connection waits at most
//! `controller.socket.timeout.ms` (30000) for its answer, after which the connection is closed
//! and the request sent again; and a request is re-sent only until its channel's retry timeout
//! (counted from when it was handed to the channel; the forwarding channel's is a fixed
//! [`FORWARDING_RETRY_TIMEOUT_MS`], 60 s, as Kafka's `BrokerServer` gives it), after which it
//! fails with REQUEST_TIMED_OUT. A request is sent again, within that timeout, to
//! the new controller when the answer is NOT_CONTROLLER (or NOT_LEADER_OR_FOLLOWER for
//! DescribeQuorum), when the connection is lost or its answer is late, or when the quorum's
//! leader changes while it waits. A response frame larger than [`MAX_RESPONSE_BYTES`] closes
//! the connection before anything is allocated.
//!
//! [`ControllerClient`] is what the broker calls: BrokerRegistration (62), BrokerHeartbeat
//! (63), AllocateProducerIds (67), AssignReplicasToDirs (73, KIP-858), CreateTopics (19, the broker's own creations:
//! `__consumer_offsets`, Metadata auto-creation) and Envelope (58, a client's admin request
//! forwarded as Kafka's `ForwardingManager` does). When this node itself is the active
//! controller it calls the local [`ControllerHandle`] directly (no connection to itself; a
//! zero-config node has no controller listener); a NOT_CONTROLLER from it (leadership just
//! moved) falls back to the channel. Calls that change metadata return once this node's
//! loader has applied everything the active controller had committed when it answered (its
//! high watermark, asked with DescribeQuorum), so a Metadata request after a forwarded
//! CreateTopics sees the topic on this node too.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use gregor_metadata::controller::{
    BrokerHeartbeatReply, BrokerHeartbeatRequest, BrokerRegistrationRequest, ControllerError,
    NewTopic, PRODUCER_ID_BLOCK_SIZE,
};
use gregor_metadata::log::RaftMetadataLog;
use gregor_metadata::ControllerHandle;
use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::messages::{
    self as m, ApiKey, BrokerId, RequestHeader, RequestKind, ResponseHeader, ResponseKind,
};
use gregor_protocol::kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use gregor_raft::driver::{LeaderAndEpoch, RaftManager};
use gregor_raft::types::VoterEndpoints;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{watch, Mutex};
use tokio::time::Instant;
use tracing::{debug, info};
use uuid::Uuid;

/// Largest response frame accepted from a controller, in bytes (the controller's
/// `socket.request.max.bytes` default; a forwarded response is at most a client's answer).
pub const MAX_RESPONSE_BYTES: usize = 100 * 1024 * 1024;

/// Pause before re-sending after NOT_CONTROLLER or a lost connection when the quorum names no
/// new leader meanwhile, in ms (Kafka's `retry.backoff.ms` default is 100).
pub const RETRY_BACKOFF_MS: u64 = 100;

pub use crate::config::DEFAULT_CONTROLLER_SOCKET_TIMEOUT_MS;

/// How long the forwarding channel (forwarded client requests, the broker's own CreateTopics,
/// AllocateProducerIds, AlterPartition) keeps re-sending a request before giving up with
/// REQUEST_TIMED_OUT, in ms: Kafka's `BrokerServer` creates its `forwarding` channel manager
/// with a fixed `retryTimeoutMs` of 60000 (no config sets it), and its `ForwardingManager`
/// answers the client with the request's error response for a `TimeoutException`
/// (REQUEST_TIMED_OUT) when it runs out.
pub const FORWARDING_RETRY_TIMEOUT_MS: u64 = 60_000;

/// The timeouts of the broker's channels to the active controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelTimeouts {
    /// `controller.socket.timeout.ms`: one request's wait for its answer on a connection.
    pub socket: Duration,
    /// The forwarding channel's retry timeout ([`FORWARDING_RETRY_TIMEOUT_MS`]).
    pub forwarding_retry: Duration,
}

impl Default for ChannelTimeouts {
    fn default() -> Self {
        Self {
            socket: Duration::from_millis(DEFAULT_CONTROLLER_SOCKET_TIMEOUT_MS),
            forwarding_retry: Duration::from_millis(FORWARDING_RETRY_TIMEOUT_MS),
        }
    }
}

impl ChannelTimeouts {
    /// The timeouts `config` sets (`controller.socket.timeout.ms`).
    pub fn from_config(config: &crate::config::BrokerConfig) -> Self {
        Self {
            socket: Duration::from_millis(config.controller_socket_timeout_ms()),
            ..Self::default()
        }
    }
}

/// Why a request on the channel did not get an answer.
#[derive(Debug, Clone, Error)]
pub enum ChannelError {
    /// No answer within the request's retry timeout (no active controller known, connection
    /// failures, answers later than the socket timeout, or NOT_CONTROLLER until the end):
    /// REQUEST_TIMED_OUT.
    #[error("request {api_key:?} to the active controller timed out after {timeout_ms} ms (last: {last})")]
    Timeout {
        /// API of the request.
        api_key: ApiKey,
        /// The timeout, ms.
        timeout_ms: u64,
        /// The last failure seen.
        last: String,
    },
    /// The request or its response could not be encoded or decoded.
    #[error("{0}")]
    Protocol(String),
}

impl ChannelError {
    /// Kafka's error for this failure.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            Self::Timeout { .. } => ErrorCode::RequestTimedOut,
            Self::Protocol(_) => ErrorCode::UnknownServerError,
        }
    }
}

impl From<ChannelError> for ControllerError {
    fn from(e: ChannelError) -> Self {
        ControllerError::Remote(e.error_code(), e.to_string())
    }
}

/// One attempt's failure, deciding whether to retry.
#[derive(Debug)]
enum Attempt {
    /// Try again (new controller, new connection).
    Retry(String),
    /// Give up.
    Fatal(ChannelError),
}

struct Connection {
    node_id: i32,
    stream: gregor_network::client::ClientStream,
}

/// A channel to the active controller (one connection, one request in flight).
pub struct ControllerChannel {
    leader: watch::Receiver<LeaderAndEpoch>,
    endpoints: VoterEndpoints,
    client_id: String,
    connection: Mutex<Option<Connection>>,
    correlation_id: AtomicI32,
    max_response_bytes: usize,
    socket_timeout: Duration,
    security: gregor_network::client::ClientSecurity,
}

impl ControllerChannel {
    /// A channel named `channel_name` (Kafka's: `heartbeat`, `forwarding`) of broker
    /// `node_id`: client id `gregor-broker-<node_id>-to-controller-<channel_name>`. The
    /// active controller is `leader`'s (the quorum member's `leader_and_epoch`), reached at
    /// its entry of `endpoints` (`controller.quorum.voters`).
    pub fn new(
        leader: watch::Receiver<LeaderAndEpoch>,
        endpoints: VoterEndpoints,
        node_id: i32,
        channel_name: &str,
    ) -> Self {
        Self {
            leader,
            endpoints,
            client_id: format!("gregor-broker-{node_id}-to-controller-{channel_name}"),
            connection: Mutex::new(None),
            correlation_id: AtomicI32::new(0),
            max_response_bytes: MAX_RESPONSE_BYTES,
            socket_timeout: Duration::from_millis(DEFAULT_CONTROLLER_SOCKET_TIMEOUT_MS),
            security: gregor_network::client::ClientSecurity::plaintext(),
        }
    }

    /// Secures the connections as the controller listener asks (TLS, SASL).
    #[must_use]
    pub fn with_security(mut self, security: gregor_network::client::ClientSecurity) -> Self {
        self.security = security;
        self
    }

    /// Sets how long one request waits for its answer on the connection (connecting
    /// included) before the connection is closed and the request re-sent
    /// (`controller.socket.timeout.ms`; default [`DEFAULT_CONTROLLER_SOCKET_TIMEOUT_MS`]).
    #[must_use]
    pub fn with_socket_timeout(mut self, timeout: Duration) -> Self {
        self.socket_timeout = timeout;
        self
    }

    /// The channel's client id.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The active controller's id as this node's quorum member knows it.
    pub fn active_controller(&self) -> Option<i32> {
        self.leader.borrow().leader_id
    }

    /// Sets the largest response frame accepted, in bytes (default [`MAX_RESPONSE_BYTES`]).
    #[must_use]
    pub fn with_max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// Sends `body` (API `api_key` at `version`) to the active controller and returns its
    /// answer, re-sending to the new controller on NOT_CONTROLLER, connection loss, an answer
    /// later than the socket timeout or a leader change, until `timeout` (the retry timeout,
    /// counted from this call: waiting behind another request on the channel counts too).
    ///
    /// # Errors
    /// [`ChannelError::Timeout`] when no usable answer came in time; [`ChannelError::Protocol`]
    /// when the request cannot be encoded or the answer decoded.
    pub async fn send(
        &self,
        api_key: ApiKey,
        version: i16,
        body: &RequestKind,
        timeout: Duration,
    ) -> Result<ResponseKind, ChannelError> {
        let deadline = Instant::now() + timeout;
        let mut leader_rx = self.leader.clone();
        let mut last = String::from("no active controller known");
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(ChannelError::Timeout {
                    api_key,
                    timeout_ms: timeout.as_millis() as u64,
                    last,
                });
            }
            let leader = leader_rx.borrow_and_update().leader_id;
            let Some(leader) = leader else {
                // Wait for an election (or the deadline).
                let _ = tokio::time::timeout_at(deadline, leader_rx.changed()).await;
                continue;
            };
            let attempt = tokio::select! {
                r = tokio::time::timeout_at(deadline, self.attempt(leader, api_key, version, body)) => match r {
                    Ok(r) => r,
                    Err(_) => Err(Attempt::Retry(format!("no answer from controller {leader} before the request's timeout"))),
                },
                // The quorum moved to another leader while this request waited.
                _ = leader_rx.wait_for(|l| l.leader_id.is_some() && l.leader_id != Some(leader)) => {
                    Err(Attempt::Retry(format!("controller {leader} is no longer the leader")))
                }
            };
            match attempt {
                Ok(response) => return Ok(response),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(why)) => {
                    debug!(client_id = %self.client_id, ?api_key, %why, "re-sending to the active controller");
                    last = why;
                    // Back off unless the quorum names another leader first.
                    let backoff =
                        (Instant::now() + Duration::from_millis(RETRY_BACKOFF_MS)).min(deadline);
                    let _ = tokio::time::timeout_at(
                        backoff,
                        leader_rx
                            .wait_for(|l| l.leader_id.is_some() && l.leader_id != Some(leader)),
                    )
                    .await;
                }
            }
        }
    }

    /// One exchange with controller `leader`: waits for the channel's connection (one request
    /// in flight), then connects if needed, sends and reads the answer within the socket
    /// timeout. The connection is taken out while in use and put back only after a usable
    /// answer, so one whose request failed, ran late, was abandoned (the caller's deadline or a
    /// leader change) or was answered NOT_CONTROLLER is closed, never reused.
    async fn attempt(
        &self,
        leader: i32,
        api_key: ApiKey,
        version: i16,
        body: &RequestKind,
    ) -> Result<ResponseKind, Attempt> {
        let mut guard = self.connection.lock().await;
        let conn = guard.take().filter(|c| c.node_id == leader);
        let exchange = self.exchange(conn, leader, api_key, version, body);
        let (conn, response) = tokio::time::timeout(self.socket_timeout, exchange)
            .await
            .map_err(|_| {
                Attempt::Retry(format!(
                    "no answer from controller {leader} within {} ms (controller.socket.timeout.ms)",
                    self.socket_timeout.as_millis()
                ))
            })??;
        if is_not_controller(&response) {
            return Err(Attempt::Retry(format!(
                "controller {leader} answered NOT_CONTROLLER"
            )));
        }
        *guard = Some(conn);
        Ok(response)
    }

    /// Connects to `leader` unless `conn` is a connection to it, sends `body` and reads its
    /// answer; returns the connection with the answer.
    async fn exchange(
        &self,
        conn: Option<Connection>,
        leader: i32,
        api_key: ApiKey,
        version: i16,
        body: &RequestKind,
    ) -> Result<(Connection, ResponseKind), Attempt> {
        let mut conn = match conn {
            Some(c) => c,
            None => {
                let (host, port) = self.endpoints.get(&leader).cloned().ok_or_else(|| {
                    Attempt::Retry(format!("no controller endpoint for node {leader}"))
                })?;
                let address = if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                };
                let stream = self
                    .security
                    .connect(&address, &self.client_id, self.socket_timeout)
                    .await
                    .map_err(|e| {
                        Attempt::Retry(format!(
                            "connecting to controller {leader} at {address}: {e}"
                        ))
                    })?;
                info!(client_id = %self.client_id, controller = leader, "connected to the active controller");
                Connection {
                    node_id: leader,
                    stream,
                }
            }
        };
        let correlation_id = self.correlation_id.fetch_add(1, Ordering::Relaxed);
        let frame = encode_request(api_key, version, correlation_id, &self.client_id, body)
            .map_err(Attempt::Fatal)?;
        let lost = |e: std::io::Error| {
            Attempt::Retry(format!("connection to controller {leader} lost: {e}"))
        };
        conn.stream.write_all(&frame).await.map_err(lost)?;
        conn.stream.flush().await.map_err(lost)?;
        let size = conn.stream.read_i32().await.map_err(lost)?;
        let size = usize::try_from(size)
            .ok()
            .filter(|s| *s >= 4 && *s <= self.max_response_bytes)
            .ok_or_else(|| {
                Attempt::Retry(format!(
                    "response frame of {size} bytes from controller {leader} (at most {})",
                    self.max_response_bytes
                ))
            })?;
        let mut buf = vec![0u8; size];
        conn.stream.read_exact(&mut buf).await.map_err(lost)?;
        let (got, response) = decode_response(api_key, version, Bytes::from(buf))
            .map_err(|e| Attempt::Retry(e.to_string()))?;
        if got != correlation_id {
            return Err(Attempt::Retry(format!(
                "correlation id {got} from controller {leader}, expected {correlation_id}"
            )));
        }
        Ok((conn, response))
    }
}

/// A request frame with its size prefix and header (client id `client_id`).
///
/// # Errors
/// [`ChannelError::Protocol`] when the body cannot be encoded at `version`.
pub fn encode_request(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    client_id: &str,
    body: &RequestKind,
) -> Result<Bytes, ChannelError> {
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    encode_request_data(api_key, version, correlation_id, client_id, body, &mut buf)?;
    let size = i32::try_from(buf.len() - 4)
        .map_err(|_| ChannelError::Protocol("request larger than 2 GiB".into()))?;
    buf[0..4].copy_from_slice(&size.to_be_bytes());
    Ok(buf.freeze())
}

/// A request's header and body, without a size prefix (an Envelope's `RequestData`).
fn encode_request_data(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    client_id: &str,
    body: &RequestKind,
    buf: &mut BytesMut,
) -> Result<(), ChannelError> {
    let err = |e: anyhow::Error| {
        ChannelError::Protocol(format!("encoding {api_key:?} v{version}: {e:#}"))
    };
    RequestHeader::default()
        .with_request_api_key(api_key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_string(client_id.to_string())))
        .encode(buf, api_key.request_header_version(version))
        .map_err(err)?;
    body.encode(buf, version).map_err(err)
}

/// Decodes a response frame (without its size prefix): its correlation id and body.
///
/// # Errors
/// [`ChannelError::Protocol`] when the frame does not decode as `api_key` at `version`.
pub fn decode_response(
    api_key: ApiKey,
    version: i16,
    mut frame: Bytes,
) -> Result<(i32, ResponseKind), ChannelError> {
    let err = |e: anyhow::Error| {
        ChannelError::Protocol(format!("decoding a {api_key:?} v{version} response: {e:#}"))
    };
    let header = ResponseHeader::decode(&mut frame, api_key.response_header_version(version))
        .map_err(err)?;
    let body = ResponseKind::decode(api_key, &mut frame, version).map_err(err)?;
    Ok((header.correlation_id, body))
}

/// True when `response` says the node it came from is not the active controller:
/// NOT_CONTROLLER anywhere in it (top level, per topic or per resource), or
/// NOT_LEADER_OR_FOLLOWER of DescribeQuorum's partition.
pub fn is_not_controller(response: &ResponseKind) -> bool {
    let nc = ErrorCode::NotController.code();
    match response {
        ResponseKind::BrokerRegistration(r) => r.error_code == nc,
        ResponseKind::BrokerHeartbeat(r) => r.error_code == nc,
        ResponseKind::UnregisterBroker(r) => r.error_code == nc,
        ResponseKind::AllocateProducerIds(r) => r.error_code == nc,
        ResponseKind::Envelope(r) => r.error_code == nc,
        ResponseKind::CreateTopics(r) => r.topics.iter().any(|t| t.error_code == nc),
        ResponseKind::DeleteTopics(r) => r.responses.iter().any(|t| t.error_code == nc),
        ResponseKind::CreatePartitions(r) => r.results.iter().any(|t| t.error_code == nc),
        ResponseKind::AlterConfigs(r) => r.responses.iter().any(|t| t.error_code == nc),
        ResponseKind::IncrementalAlterConfigs(r) => r.responses.iter().any(|t| t.error_code == nc),
        ResponseKind::AlterPartition(r) => r.error_code == nc,
        ResponseKind::AssignReplicasToDirs(r) => r.error_code == nc,
        ResponseKind::ElectLeaders(r) => {
            r.error_code == nc
                || r.replica_election_results
                    .iter()
                    .any(|t| t.partition_result.iter().any(|p| p.error_code == nc))
        }
        ResponseKind::AlterPartitionReassignments(r) => {
            r.error_code == nc
                || r.responses
                    .iter()
                    .any(|t| t.partitions.iter().any(|p| p.error_code == nc))
        }
        ResponseKind::ListPartitionReassignments(r) => r.error_code == nc,
        ResponseKind::UpdateFeatures(r) => r.error_code == nc,
        ResponseKind::DescribeQuorum(r) => {
            r.error_code == nc
                || r.topics.iter().any(|t| {
                    t.partitions
                        .iter()
                        .any(|p| p.error_code == ErrorCode::NotLeaderOrFollower.code())
                })
        }
        _ => false,
    }
}

/// Kafka's `DefaultKafkaPrincipalBuilder.serialize`: `DefaultPrincipalData` (type, name,
/// token-authenticated) prefixed with its version (int16), the Envelope's `RequestPrincipal`.
pub fn serialize_principal(principal: &gregor_network::KafkaPrincipal) -> Bytes {
    let data = m::DefaultPrincipalData::default()
        .with_type(StrBytes::from_string(principal.principal_type.clone()))
        .with_name(StrBytes::from_string(principal.name.clone()))
        .with_token_authenticated(false);
    let mut buf = BytesMut::with_capacity(32);
    buf.put_i16(PRINCIPAL_DATA_VERSION);
    // Encoding two short strings and a bool cannot fail.
    let _ = data.encode(&mut buf, PRINCIPAL_DATA_VERSION);
    buf.freeze()
}

/// The `DefaultPrincipalData` version gregor writes (Kafka 4.4's only one).
pub const PRINCIPAL_DATA_VERSION: i16 = 0;

/// Kafka's `DefaultKafkaPrincipalBuilder.deserialize`.
///
/// # Errors
/// [`ChannelError::Protocol`] for a short buffer, an unknown version or a malformed body.
pub fn deserialize_principal(
    mut bytes: Bytes,
) -> Result<gregor_network::KafkaPrincipal, ChannelError> {
    if bytes.len() < 2 {
        return Err(ChannelError::Protocol("principal data too short".into()));
    }
    let version = bytes.get_i16();
    if version != PRINCIPAL_DATA_VERSION {
        return Err(ChannelError::Protocol(format!(
            "unsupported DefaultPrincipalData version {version}"
        )));
    }
    let data = m::DefaultPrincipalData::decode(&mut bytes, version)
        .map_err(|e| ChannelError::Protocol(format!("principal data: {e:#}")))?;
    Ok(gregor_network::KafkaPrincipal {
        principal_type: data._type.to_string(),
        name: data.name.to_string(),
    })
}

/// What the broker calls to reach the active controller: the local [`ControllerHandle`] when
/// this node is the active controller, the channels otherwise (see the module docs).
pub struct ControllerClient {
    node_id: i32,
    local: ControllerHandle,
    metadata_log: Arc<RaftMetadataLog>,
    raft: Arc<RaftManager>,
    /// BrokerRegistration and BrokerHeartbeat (Kafka's lifecycle manager has its own channel,
    /// so a slow forwarded request never delays a heartbeat).
    heartbeat: ControllerChannel,
    /// Everything else: Envelope, CreateTopics, AllocateProducerIds, AlterPartition,
    /// DescribeQuorum.
    forwarding: ControllerChannel,
    /// AssignReplicasToDirs (Kafka's broker has a `directory-assignments` channel of its own,
    /// so a batch of assignments never waits behind a forwarded request or delays one).
    assignments: ControllerChannel,
    timeouts: ChannelTimeouts,
}

/// Versions gregor sends on the channel (Kafka 4.4's highest that the codec writes).
const BROKER_REGISTRATION_VERSION: i16 = 4;
const BROKER_HEARTBEAT_VERSION: i16 = 1;
const ALLOCATE_PRODUCER_IDS_VERSION: i16 = 0;
const CREATE_TOPICS_VERSION: i16 = 7;
const ENVELOPE_VERSION: i16 = 0;
const DESCRIBE_QUORUM_VERSION: i16 = 2;
const ASSIGN_REPLICAS_TO_DIRS_VERSION: i16 = 0;
/// AlterPartition's version gregor sends (v3: KIP-903's `NewIsrWithEpochs`).
pub const ALTER_PARTITION_VERSION: i16 = 3;

impl ControllerClient {
    /// The client of broker `node_id`, with `local` this node's controller over
    /// `metadata_log` (and its quorum member's view of the leader). One request waits at most
    /// `timeouts.socket` for its answer on both channels; the forwarding channel re-sends until
    /// `timeouts.forwarding_retry`, the heartbeat channel (registration, heartbeats) until
    /// `timeouts.socket`.
    pub fn new(
        node_id: i32,
        local: ControllerHandle,
        metadata_log: Arc<RaftMetadataLog>,
        timeouts: ChannelTimeouts,
    ) -> Self {
        let raft = metadata_log.manager().clone();
        Self {
            metadata_log,
            node_id,
            heartbeat: ControllerChannel::new(
                raft.leader_and_epoch(),
                raft.config().voter_endpoints.clone(),
                node_id,
                "heartbeat",
            )
            .with_socket_timeout(timeouts.socket),
            forwarding: ControllerChannel::new(
                raft.leader_and_epoch(),
                raft.config().voter_endpoints.clone(),
                node_id,
                "forwarding",
            )
            .with_socket_timeout(timeouts.socket),
            assignments: ControllerChannel::new(
                raft.leader_and_epoch(),
                raft.config().voter_endpoints.clone(),
                node_id,
                "directory-assignments",
            )
            .with_socket_timeout(timeouts.socket),
            local,
            raft,
            timeouts,
        }
    }

    /// Secures the channels' connections as the controller listener asks (TLS, SASL).
    #[must_use]
    pub fn with_security(mut self, security: &gregor_network::client::ClientSecurity) -> Self {
        for channel in [
            &mut self.heartbeat,
            &mut self.forwarding,
            &mut self.assignments,
        ] {
            channel.security = security.clone();
        }
        self
    }

    /// This node's controller.
    pub fn local(&self) -> &ControllerHandle {
        &self.local
    }

    /// True when this node leads the metadata quorum (its controller is the active one).
    pub fn local_is_active(&self) -> bool {
        self.raft.leader_and_epoch().borrow().leader_id == Some(self.node_id)
    }

    /// The channels' timeouts.
    pub fn timeouts(&self) -> ChannelTimeouts {
        self.timeouts
    }

    /// BrokerRegistration (62, KIP-631): the broker epoch.
    ///
    /// # Errors
    /// The controller's error (DUPLICATE_BROKER_REGISTRATION, ...), or the channel's.
    pub async fn register_broker(
        &self,
        cluster_id: &str,
        request: BrokerRegistrationRequest,
    ) -> Result<i64, ControllerError> {
        if self.local_is_active() {
            match self.local.register_broker(request.clone()).await {
                Err(ControllerError::NotController { .. }) => {}
                other => return other,
            }
        }
        let body = RequestKind::BrokerRegistration(to_registration_request(cluster_id, &request));
        let response = self
            .heartbeat
            .send(
                ApiKey::BrokerRegistration,
                BROKER_REGISTRATION_VERSION,
                &body,
                self.timeouts.socket,
            )
            .await?;
        let ResponseKind::BrokerRegistration(r) = response else {
            return Err(unexpected(ApiKey::BrokerRegistration));
        };
        if r.error_code != 0 {
            return Err(ControllerError::from_code(r.error_code, None));
        }
        Ok(r.broker_epoch)
    }

    /// BrokerHeartbeat (63, KIP-631).
    ///
    /// # Errors
    /// STALE_BROKER_EPOCH, the channel's timeout, ...
    pub async fn broker_heartbeat(
        &self,
        request: BrokerHeartbeatRequest,
    ) -> Result<BrokerHeartbeatReply, ControllerError> {
        if self.local_is_active() {
            match self.local.broker_heartbeat(request.clone()).await {
                Err(ControllerError::NotController { .. }) => {}
                other => return other,
            }
        }
        let body = RequestKind::BrokerHeartbeat(
            m::BrokerHeartbeatRequest::default()
                .with_broker_id(BrokerId(request.broker_id))
                .with_broker_epoch(request.broker_epoch)
                .with_current_metadata_offset(request.current_metadata_offset)
                .with_want_fence(request.want_fence)
                .with_want_shut_down(request.want_shut_down)
                // v1+ (KIP-858): the directories this broker has taken offline.
                .with_offline_log_dirs(request.offline_log_dirs.clone()),
        );
        let response = self
            .heartbeat
            .send(
                ApiKey::BrokerHeartbeat,
                BROKER_HEARTBEAT_VERSION,
                &body,
                self.timeouts.socket,
            )
            .await?;
        let ResponseKind::BrokerHeartbeat(r) = response else {
            return Err(unexpected(ApiKey::BrokerHeartbeat));
        };
        if r.error_code != 0 {
            return Err(ControllerError::from_code(r.error_code, None));
        }
        Ok(BrokerHeartbeatReply {
            is_caught_up: r.is_caught_up,
            is_fenced: r.is_fenced,
            // Not on the wire; the broker does not use it.
            in_controlled_shutdown: request.want_shut_down && !r.should_shut_down,
            should_shut_down: r.should_shut_down,
        })
    }

    /// AlterPartition (56, KIP-497) v3 to the active controller: the local controller when it
    /// is the active one, else over the forwarding channel (the partition leader's ISR changes,
    /// sent by [`crate::alter_partition`]). Partition errors are in the response; a top-level
    /// error code is too.
    ///
    /// # Errors
    /// The controller's (STALE_BROKER_EPOCH, ...) or the channel's (no controller known,
    /// timeout); the caller retries them.
    pub async fn alter_partition(
        &self,
        request: m::AlterPartitionRequest,
    ) -> Result<m::AlterPartitionResponse, ControllerError> {
        if self.local_is_active() {
            match self.local.alter_partition(request.clone()).await {
                Err(ControllerError::NotController { .. }) => {}
                other => return other,
            }
        }
        let body = RequestKind::AlterPartition(request);
        let response = self
            .forwarding
            .send(
                ApiKey::AlterPartition,
                ALTER_PARTITION_VERSION,
                &body,
                self.timeouts.forwarding_retry,
            )
            .await?;
        let ResponseKind::AlterPartition(r) = response else {
            return Err(unexpected(ApiKey::AlterPartition));
        };
        Ok(r)
    }

    /// AssignReplicasToDirs (73, KIP-858) to the active controller: the local controller when
    /// it is the active one, else the `directory-assignments` channel, re-sent until the
    /// forwarding retry timeout (Kafka's channel for it has the same fixed 60 s). Partition
    /// errors and a top-level error code are in the response.
    ///
    /// # Errors
    /// The local controller's (STALE_BROKER_EPOCH, UNSUPPORTED_VERSION, ...) or the
    /// channel's (no controller known, timeout); [`crate::assignments`] retries them.
    pub async fn assign_replicas_to_dirs(
        &self,
        request: m::AssignReplicasToDirsRequest,
    ) -> Result<m::AssignReplicasToDirsResponse, ControllerError> {
        if self.local_is_active() {
            match self.local.assign_replicas_to_dirs(request.clone()).await {
                Err(ControllerError::NotController { .. }) => {}
                other => return other,
            }
        }
        let body = RequestKind::AssignReplicasToDirs(request);
        let response = self
            .assignments
            .send(
                ApiKey::AssignReplicasToDirs,
                ASSIGN_REPLICAS_TO_DIRS_VERSION,
                &body,
                self.timeouts.forwarding_retry,
            )
            .await?;
        let ResponseKind::AssignReplicasToDirs(r) = response else {
            return Err(unexpected(ApiKey::AssignReplicasToDirs));
        };
        Ok(r)
    }

    /// AllocateProducerIds (67, KIP-730): the first id of a block of
    /// [`PRODUCER_ID_BLOCK_SIZE`].
    ///
    /// # Errors
    /// The controller's or the channel's.
    pub async fn allocate_producer_ids(
        &self,
        broker_id: i32,
        broker_epoch: i64,
    ) -> Result<i64, ControllerError> {
        if self.local_is_active() {
            match self.local.allocate_producer_ids(broker_id).await {
                Err(ControllerError::NotController { .. }) => {}
                other => return other,
            }
        }
        let body = RequestKind::AllocateProducerIds(
            m::AllocateProducerIdsRequest::default()
                .with_broker_id(BrokerId(broker_id))
                .with_broker_epoch(broker_epoch),
        );
        let response = self
            .forwarding
            .send(
                ApiKey::AllocateProducerIds,
                ALLOCATE_PRODUCER_IDS_VERSION,
                &body,
                self.timeouts.forwarding_retry,
            )
            .await?;
        let ResponseKind::AllocateProducerIds(r) = response else {
            return Err(unexpected(ApiKey::AllocateProducerIds));
        };
        if r.error_code != 0 {
            return Err(ControllerError::from_code(r.error_code, None));
        }
        if i64::from(r.producer_id_len) != PRODUCER_ID_BLOCK_SIZE {
            debug!(len = r.producer_id_len, "producer id block of another size");
        }
        Ok(r.producer_id_start.0)
    }

    /// Creates topics the broker itself needs (`__consumer_offsets`, Metadata auto-creation)
    /// with a CreateTopics (19) to the active controller (Kafka's `AutoTopicCreationManager`);
    /// returns once this node has applied the result. One answer per topic, in order.
    ///
    /// # Errors
    /// NOT_CONTROLLER from the local controller that stopped, the channel's timeout.
    pub async fn create_topics(
        &self,
        topics: Vec<NewTopic>,
    ) -> Result<Vec<Result<Uuid, ControllerError>>, ControllerError> {
        if self.local_is_active() {
            match self.local.create_topics(topics.clone(), false).await {
                Ok(r)
                    if !r
                        .iter()
                        .any(|t| matches!(t, Err(ControllerError::NotController { .. }))) =>
                {
                    return Ok(r)
                }
                Ok(_) | Err(ControllerError::NotController { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let request = m::CreateTopicsRequest::default()
            .with_timeout_ms(self.timeouts.socket.as_millis().min(i32::MAX as u128) as i32)
            .with_topics(
                topics
                    .iter()
                    .map(|t| {
                        m::create_topics_request::CreatableTopic::default()
                            .with_name(m::TopicName(StrBytes::from_string(t.name.clone())))
                            .with_num_partitions(t.num_partitions)
                            .with_replication_factor(t.replication_factor)
                            .with_assignments(
                                t.assignments
                                    .iter()
                                    .enumerate()
                                    .map(|(i, a)| {
                                        m::create_topics_request::CreatableReplicaAssignment::default()
                                            .with_partition_index(i as i32)
                                            .with_broker_ids(a.iter().map(|b| BrokerId(*b)).collect())
                                    })
                                    .collect(),
                            )
                            .with_configs(
                                t.configs
                                    .iter()
                                    .map(|(k, v)| {
                                        m::create_topics_request::CreatableTopicConfig::default()
                                            .with_name(StrBytes::from_string(k.clone()))
                                            .with_value(Some(StrBytes::from_string(v.clone())))
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            );
        let response = self
            .forwarding
            .send(
                ApiKey::CreateTopics,
                CREATE_TOPICS_VERSION,
                &RequestKind::CreateTopics(request),
                self.timeouts.forwarding_retry,
            )
            .await?;
        let ResponseKind::CreateTopics(r) = response else {
            return Err(unexpected(ApiKey::CreateTopics));
        };
        self.wait_for_controller_commits().await?;
        Ok(topics
            .iter()
            .map(|t| {
                let Some(got) = r.topics.iter().find(|x| x.name.0.as_str() == t.name) else {
                    return Err(ControllerError::from_code(
                        ErrorCode::UnknownServerError.code(),
                        Some("the controller did not answer for this topic".into()),
                    ));
                };
                if got.error_code == ErrorCode::TopicAlreadyExists.code() {
                    return Err(ControllerError::TopicAlreadyExists(t.name.clone()));
                }
                if got.error_code != 0 {
                    return Err(ControllerError::from_code(
                        got.error_code,
                        got.error_message.as_ref().map(|s| s.to_string()),
                    ));
                }
                Ok(got.topic_id)
            })
            .collect())
    }

    /// Forwards a client's request in an Envelope (58, KIP-590) to the active controller, with
    /// the client's principal and address; returns the controller's answer to it (the body,
    /// already decoded), once this node has applied what the controller had committed (not
    /// for DescribeQuorum, which changes nothing).
    ///
    /// # Errors
    /// The Envelope's error code (other than NOT_CONTROLLER, which is retried), the
    /// channel's timeout (REQUEST_TIMED_OUT after [`FORWARDING_RETRY_TIMEOUT_MS`]), or a
    /// malformed answer.
    pub async fn forward(
        &self,
        ctx: &gregor_network::RequestContext,
        body: &RequestKind,
    ) -> Result<ResponseKind, ControllerError> {
        let api_key = ctx.api_key;
        let version = ctx.api_version();
        let mut data = BytesMut::with_capacity(256);
        encode_request_data(
            api_key,
            version,
            ctx.header.correlation_id,
            ctx.client_id(),
            body,
            &mut data,
        )?;
        let client_host_address = match ctx.client_address.ip() {
            std::net::IpAddr::V4(a) => Bytes::copy_from_slice(&a.octets()),
            std::net::IpAddr::V6(a) => Bytes::copy_from_slice(&a.octets()),
        };
        let envelope = RequestKind::Envelope(
            m::EnvelopeRequest::default()
                .with_request_data(data.freeze())
                .with_request_principal(Some(serialize_principal(&ctx.principal)))
                .with_client_host_address(client_host_address),
        );
        let response = self
            .forwarding
            .send(
                ApiKey::Envelope,
                ENVELOPE_VERSION,
                &envelope,
                self.timeouts.forwarding_retry,
            )
            .await?;
        let ResponseKind::Envelope(r) = response else {
            return Err(unexpected(ApiKey::Envelope));
        };
        if r.error_code != 0 {
            return Err(ControllerError::from_code(r.error_code, None));
        }
        let Some(data) = r.response_data else {
            return Err(ControllerError::from_code(
                ErrorCode::UnknownServerError.code(),
                Some("an Envelope response without ResponseData".into()),
            ));
        };
        let (_, inner) = decode_response(api_key, version, data)?;
        // DescribeQuorum changes nothing this node would need to apply first.
        if api_key != ApiKey::DescribeQuorum {
            self.wait_for_controller_commits().await?;
        }
        Ok(inner)
    }

    /// Waits until this node's loader has applied every record the active controller had
    /// committed (its high watermark, a Raft offset, from DescribeQuorum; converted to a
    /// metadata offset once this node has committed that far), at most
    /// `controller.socket.timeout.ms` for each of the two.
    ///
    /// # Errors
    /// The channel's timeout, or the loader's failure.
    pub async fn wait_for_controller_commits(&self) -> Result<(), ControllerError> {
        let request = m::DescribeQuorumRequest::default().with_topics(vec![
            m::describe_quorum_request::TopicData::default()
                .with_topic_name(m::TopicName(StrBytes::from_static_str(
                    gregor_raft::convert::METADATA_TOPIC_NAME,
                )))
                .with_partitions(vec![
                    m::describe_quorum_request::PartitionData::default().with_partition_index(0)
                ]),
        ]);
        let response = self
            .forwarding
            .send(
                ApiKey::DescribeQuorum,
                DESCRIBE_QUORUM_VERSION,
                &RequestKind::DescribeQuorum(request),
                self.timeouts.socket,
            )
            .await?;
        let ResponseKind::DescribeQuorum(r) = response else {
            return Err(unexpected(ApiKey::DescribeQuorum));
        };
        let high_watermark = r
            .topics
            .first()
            .and_then(|t| t.partitions.first())
            .map_or(0, |p| p.high_watermark);
        let wait = async {
            let metadata_offset = self
                .metadata_log
                .wait_for_raft_offset(high_watermark)
                .await?;
            self.local
                .loader()
                .wait_for_catch_up(metadata_offset)
                .await
                .map_err(ControllerError::from)
        };
        tokio::time::timeout(self.timeouts.socket, wait)
            .await
            .unwrap_or_else(|_| {
                Err(ControllerError::Remote(
                    ErrorCode::RequestTimedOut,
                    format!(
                        "this node did not apply the controller's high watermark {high_watermark} within {} ms",
                        self.timeouts.socket.as_millis()
                    ),
                ))
            })
    }
}

fn unexpected(api_key: ApiKey) -> ControllerError {
    ControllerError::from_code(
        ErrorCode::UnknownServerError.code(),
        Some(format!(
            "the controller answered {api_key:?} with another API"
        )),
    )
}

/// The wire BrokerRegistration of `r` (Kafka's `BrokerLifecycleManager.sendBrokerRegistration`).
pub fn to_registration_request(
    cluster_id: &str,
    r: &BrokerRegistrationRequest,
) -> m::BrokerRegistrationRequest {
    m::BrokerRegistrationRequest::default()
        .with_broker_id(BrokerId(r.broker_id))
        .with_cluster_id(StrBytes::from_string(cluster_id.to_string()))
        .with_incarnation_id(r.incarnation_id)
        .with_listeners(
            r.listeners
                .iter()
                .map(|l| {
                    m::broker_registration_request::Listener::default()
                        .with_name(StrBytes::from_string(l.name.clone()))
                        .with_host(StrBytes::from_string(l.host.clone()))
                        .with_port(l.port)
                        .with_security_protocol(l.security_protocol)
                })
                .collect(),
        )
        .with_features(
            r.features
                .iter()
                .map(|f| {
                    m::broker_registration_request::Feature::default()
                        .with_name(StrBytes::from_string(f.name.clone()))
                        .with_min_supported_version(f.min_supported_version)
                        .with_max_supported_version(f.max_supported_version)
                })
                .collect(),
        )
        .with_rack(r.rack.clone().map(StrBytes::from_string))
        .with_log_dirs(r.log_dirs.clone())
        .with_previous_broker_epoch(r.previous_broker_epoch)
}

/// The controller's view of a wire BrokerRegistration.
pub fn from_registration_request(r: &m::BrokerRegistrationRequest) -> BrokerRegistrationRequest {
    use gregor_protocol::metadata_records::{BrokerEndpoint, BrokerFeature};
    BrokerRegistrationRequest {
        broker_id: r.broker_id.0,
        incarnation_id: r.incarnation_id,
        listeners: r
            .listeners
            .iter()
            .map(|l| BrokerEndpoint {
                name: l.name.to_string(),
                host: l.host.to_string(),
                port: l.port,
                security_protocol: l.security_protocol,
                ..BrokerEndpoint::default()
            })
            .collect(),
        features: r
            .features
            .iter()
            .map(|f| BrokerFeature {
                name: f.name.to_string(),
                min_supported_version: f.min_supported_version,
                max_supported_version: f.max_supported_version,
                ..BrokerFeature::default()
            })
            .collect(),
        rack: r.rack.as_ref().map(|s| s.to_string()),
        log_dirs: r.log_dirs.clone(),
        previous_broker_epoch: r.previous_broker_epoch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_protocol::frame::{decode_request, encode_response, DecodedRequest};
    use std::sync::atomic::AtomicUsize;
    use tokio::net::TcpListener;

    type Answer = Arc<dyn Fn(&RequestHeader, &RequestKind) -> Option<ResponseKind> + Send + Sync>;

    /// A fake controller on a free port: answers each request with `answer` (None: never
    /// answers), counts requests, and records the client ids it saw.
    struct FakeController {
        port: u16,
        requests: Arc<AtomicUsize>,
        client_ids: Arc<parking_lot::Mutex<Vec<String>>>,
    }

    async fn fake_controller(answer: Answer) -> FakeController {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let client_ids = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (r, ids) = (requests.clone(), client_ids.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let (answer, r, ids) = (answer.clone(), r.clone(), ids.clone());
                tokio::spawn(async move {
                    loop {
                        let Ok(size) = s.read_i32().await else { return };
                        let mut buf = vec![0u8; size as usize];
                        if s.read_exact(&mut buf).await.is_err() {
                            return;
                        }
                        let Ok(DecodedRequest::Request {
                            header,
                            api_key,
                            body,
                        }) = decode_request(Bytes::from(buf), &|k| {
                            Some((k.valid_versions().min, k.valid_versions().max))
                        })
                        else {
                            return;
                        };
                        r.fetch_add(1, Ordering::SeqCst);
                        ids.lock()
                            .push(header.client_id.as_deref().unwrap_or("").to_string());
                        let Some(response) = answer(&header, &body) else {
                            // Hold the connection without answering.
                            std::future::pending::<()>().await;
                            return;
                        };
                        let frame = encode_response(
                            api_key,
                            header.request_api_version,
                            header.correlation_id,
                            &response,
                        )
                        .unwrap();
                        if s.write_all(&frame).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        FakeController {
            port,
            requests,
            client_ids,
        }
    }

    fn heartbeat_answer(error: ErrorCode) -> Answer {
        Arc::new(move |_, _| {
            Some(
                m::BrokerHeartbeatResponse::default()
                    .with_error_code(error.code())
                    .with_is_caught_up(true)
                    .into(),
            )
        })
    }

    fn heartbeat() -> RequestKind {
        m::BrokerHeartbeatRequest::default()
            .with_broker_id(BrokerId(3))
            .with_broker_epoch(7)
            .into()
    }

    fn endpoints(ports: &[(i32, u16)]) -> VoterEndpoints {
        ports
            .iter()
            .map(|(id, p)| (*id, ("127.0.0.1".to_string(), *p)))
            .collect()
    }

    fn leader(id: Option<i32>, epoch: i32) -> LeaderAndEpoch {
        LeaderAndEpoch {
            epoch,
            leader_id: id,
        }
    }

    #[tokio::test]
    async fn resends_to_the_new_controller_after_not_controller() {
        let old = fake_controller(heartbeat_answer(ErrorCode::NotController)).await;
        let new = fake_controller(heartbeat_answer(ErrorCode::None)).await;
        let (tx, rx) = watch::channel(leader(Some(1), 1));
        let channel = ControllerChannel::new(
            rx,
            endpoints(&[(1, old.port), (2, new.port)]),
            3,
            "heartbeat",
        );
        // The quorum moves to node 2 once node 1 has refused.
        let requests = old.requests.clone();
        tokio::spawn(async move {
            while requests.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tx.send(leader(Some(2), 2)).unwrap();
            // Kept open until the test ends.
            std::future::pending::<()>().await;
        });
        let r = channel
            .send(
                ApiKey::BrokerHeartbeat,
                1,
                &heartbeat(),
                Duration::from_secs(10),
            )
            .await
            .expect("answered by the new controller");
        let ResponseKind::BrokerHeartbeat(r) = r else {
            panic!("a heartbeat response")
        };
        assert_eq!(r.error_code, 0);
        assert!(r.is_caught_up);
        assert!(old.requests.load(Ordering::SeqCst) >= 1);
        assert_eq!(new.requests.load(Ordering::SeqCst), 1);
        assert_eq!(
            new.client_ids.lock().as_slice(),
            ["gregor-broker-3-to-controller-heartbeat"]
        );
    }

    #[tokio::test]
    async fn a_leader_change_while_waiting_resends_to_the_new_leader() {
        let silent = fake_controller(Arc::new(|_, _| None)).await;
        let new = fake_controller(heartbeat_answer(ErrorCode::None)).await;
        let (tx, rx) = watch::channel(leader(Some(1), 1));
        let channel = ControllerChannel::new(
            rx,
            endpoints(&[(1, silent.port), (2, new.port)]),
            3,
            "heartbeat",
        );
        let requests = silent.requests.clone();
        let mover = tokio::spawn(async move {
            while requests.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tx.send(leader(Some(2), 2)).unwrap();
            tx
        });
        let started = Instant::now();
        let r = channel
            .send(
                ApiKey::BrokerHeartbeat,
                1,
                &heartbeat(),
                Duration::from_secs(10),
            )
            .await
            .expect("answered by the new leader");
        assert!(matches!(r, ResponseKind::BrokerHeartbeat(ref h) if h.error_code == 0));
        // Not by waiting out the timeout.
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(new.requests.load(Ordering::SeqCst), 1);
        drop(mover.await);
    }

    #[tokio::test]
    async fn times_out_without_a_controller_or_with_one_that_keeps_refusing() {
        let (_tx, rx) = watch::channel(leader(None, 0));
        let channel = ControllerChannel::new(rx, endpoints(&[]), 3, "heartbeat");
        let started = Instant::now();
        let e = channel
            .send(
                ApiKey::BrokerHeartbeat,
                1,
                &heartbeat(),
                Duration::from_millis(300),
            )
            .await
            .expect_err("no controller");
        assert!(matches!(e, ChannelError::Timeout { .. }), "{e}");
        assert_eq!(e.error_code(), ErrorCode::RequestTimedOut);
        assert!(started.elapsed() >= Duration::from_millis(300));

        let refusing = fake_controller(heartbeat_answer(ErrorCode::NotController)).await;
        let (_tx, rx) = watch::channel(leader(Some(1), 1));
        let channel = ControllerChannel::new(rx, endpoints(&[(1, refusing.port)]), 3, "heartbeat");
        let e = channel
            .send(
                ApiKey::BrokerHeartbeat,
                1,
                &heartbeat(),
                Duration::from_millis(500),
            )
            .await
            .expect_err("NOT_CONTROLLER until the end");
        assert!(e.to_string().contains("NOT_CONTROLLER"), "{e}");
        // Re-sent with a backoff, not in a busy loop.
        let n = refusing.requests.load(Ordering::SeqCst);
        assert!((2..=10).contains(&n), "{n} requests in 500 ms");
    }

    /// A fake controller that leaves the first `silent` requests unanswered (holding their
    /// connections open) and answers the later ones with a heartbeat response.
    async fn silent_for_the_first(silent: usize) -> FakeController {
        let seen = Arc::new(AtomicUsize::new(0));
        fake_controller(Arc::new(move |_, _| {
            if seen.fetch_add(1, Ordering::SeqCst) < silent {
                None
            } else {
                Some(m::BrokerHeartbeatResponse::default().into())
            }
        }))
        .await
    }

    #[tokio::test]
    async fn a_late_answer_closes_the_connection_and_the_request_is_sent_again() {
        let fake = silent_for_the_first(1).await;
        let (_tx, rx) = watch::channel(leader(Some(1), 1));
        let channel = ControllerChannel::new(rx, endpoints(&[(1, fake.port)]), 3, "forwarding")
            .with_socket_timeout(Duration::from_millis(200));
        let started = Instant::now();
        let r = channel
            .send(
                ApiKey::BrokerHeartbeat,
                1,
                &heartbeat(),
                Duration::from_secs(10),
            )
            .await
            .expect("answered once re-sent");
        assert!(matches!(r, ResponseKind::BrokerHeartbeat(ref h) if h.error_code == 0));
        // Re-sent after the socket timeout, not after the retry timeout.
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(200) && elapsed < Duration::from_secs(5),
            "{elapsed:?}"
        );
        assert_eq!(fake.requests.load(Ordering::SeqCst), 2);
        // The connection of the late answer was closed: the second request came on a new one
        // (the fake holds the first one open, so only a new connection could be answered).
        let again = channel
            .send(
                ApiKey::BrokerHeartbeat,
                1,
                &heartbeat(),
                Duration::from_secs(10),
            )
            .await;
        assert!(again.is_ok(), "{again:?}");
        assert_eq!(fake.requests.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_controller_that_never_answers_is_request_timed_out_after_the_retry_timeout() {
        let fake = silent_for_the_first(usize::MAX).await;
        let (_tx, rx) = watch::channel(leader(Some(1), 1));
        let channel = ControllerChannel::new(rx, endpoints(&[(1, fake.port)]), 3, "forwarding")
            .with_socket_timeout(Duration::from_millis(100));
        let started = Instant::now();
        let e = channel
            .send(
                ApiKey::BrokerHeartbeat,
                1,
                &heartbeat(),
                Duration::from_millis(700),
            )
            .await
            .expect_err("never answered");
        let elapsed = started.elapsed();
        assert!(
            matches!(
                e,
                ChannelError::Timeout {
                    timeout_ms: 700,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(e.error_code(), ErrorCode::RequestTimedOut);
        assert_eq!(
            ControllerError::from(e.clone()).kafka_error_code(),
            ErrorCode::RequestTimedOut.code()
        );
        assert!(
            elapsed >= Duration::from_millis(700) && elapsed < Duration::from_secs(3),
            "{elapsed:?}"
        );
        // Each attempt waited the socket timeout (plus the retry backoff) on a new connection.
        let n = fake.requests.load(Ordering::SeqCst);
        assert!((3..=7).contains(&n), "{n} attempts in 700 ms");
    }

    #[test]
    fn the_channel_timeouts_come_from_controller_socket_timeout_ms() {
        let config = |extra: &[(&str, &str)]| {
            let props = extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            crate::config::BrokerConfig::from_properties(props).map(|(c, _)| c)
        };
        let default = ChannelTimeouts::from_config(&config(&[]).unwrap());
        assert_eq!(default, ChannelTimeouts::default());
        assert_eq!(default.socket, Duration::from_secs(30));
        assert_eq!(default.forwarding_retry, Duration::from_secs(60));
        let set = ChannelTimeouts::from_config(
            &config(&[("controller.socket.timeout.ms", "1500")]).unwrap(),
        );
        assert_eq!(set.socket, Duration::from_millis(1500));
        assert_eq!(set.forwarding_retry, Duration::from_secs(60));
        assert!(config(&[("controller.socket.timeout.ms", "soon")]).is_err());
    }

    #[tokio::test]
    async fn an_oversized_response_frame_is_refused_before_allocating() {
        let fake = fake_controller(Arc::new(|_, _| {
            Some(m::BrokerHeartbeatResponse::default().into())
        }))
        .await;
        let (_tx, rx) = watch::channel(leader(Some(1), 1));
        let channel = ControllerChannel::new(rx, endpoints(&[(1, fake.port)]), 3, "heartbeat")
            .with_max_response_bytes(4);
        let e = channel
            .send(
                ApiKey::BrokerHeartbeat,
                1,
                &heartbeat(),
                Duration::from_millis(300),
            )
            .await
            .expect_err("frame too large");
        assert!(e.to_string().contains("at most 4"), "{e}");
    }

    #[test]
    fn principal_serde_is_kafkas_version_prefixed_default_principal_data() {
        let p = gregor_network::KafkaPrincipal {
            principal_type: "User".into(),
            name: "alice".into(),
        };
        let bytes = serialize_principal(&p);
        // int16 version 0, then the flexible message: compact strings (length + 1), a boolean,
        // no tagged fields.
        assert_eq!(
            bytes.as_ref(),
            [&[0u8, 0, 5][..], b"User", &[6], b"alice", &[0, 0]].concat()
        );
        assert_eq!(deserialize_principal(bytes).unwrap(), p);
        assert!(deserialize_principal(Bytes::from_static(&[0, 1, 5])).is_err());
        assert!(deserialize_principal(Bytes::from_static(&[0])).is_err());
        assert!(deserialize_principal(Bytes::from_static(&[0, 0, 200])).is_err());
    }

    #[test]
    fn not_controller_is_found_wherever_the_response_carries_it() {
        let nc = ErrorCode::NotController.code();
        let topic =
            |code| m::create_topics_response::CreatableTopicResult::default().with_error_code(code);
        assert!(is_not_controller(
            &m::CreateTopicsResponse::default()
                .with_topics(vec![topic(0), topic(nc)])
                .into()
        ));
        assert!(!is_not_controller(
            &m::CreateTopicsResponse::default()
                .with_topics(vec![topic(0)])
                .into()
        ));
        assert!(is_not_controller(
            &m::EnvelopeResponse::default().with_error_code(nc).into()
        ));
        assert!(!is_not_controller(
            &m::BrokerRegistrationResponse::default()
                .with_error_code(ErrorCode::DuplicateBrokerRegistration.code())
                .into()
        ));
    }

    #[test]
    fn registration_requests_round_trip_through_the_wire_form() {
        let r = BrokerRegistrationRequest {
            broker_id: 2,
            incarnation_id: Uuid::new_v4(),
            listeners: vec![gregor_protocol::metadata_records::BrokerEndpoint {
                name: "PLAINTEXT".into(),
                host: "h".into(),
                port: 9092,
                security_protocol: 0,
                ..Default::default()
            }],
            features: BrokerRegistrationRequest::supported_features(),
            rack: Some("r1".into()),
            log_dirs: vec![Uuid::new_v4()],
            previous_broker_epoch: -1,
        };
        let wire = to_registration_request("c1", &r);
        assert_eq!(wire.cluster_id.as_str(), "c1");
        let back = from_registration_request(&wire);
        assert_eq!(format!("{back:?}"), format!("{r:?}"));
    }
}
