//! Listeners, accept loops and connections (Kafka's `SocketServer`, `Acceptor`, `Processor`).
//!
//! Each connection has one reader task and one writer task. The reader reads a frame, decodes
//! it and awaits the handler's immediate part before reading the next, so the side effects of
//! pipelined requests happen in request order (an idempotent producer with five requests in
//! flight relies on it). A handler may return a deferred part (acks=all wait, fetch long poll,
//! rebalance) that runs as its own task; the writer sends responses strictly in request order,
//! at most `queued.max.requests` of them pending per connection.
//!
//! Bounds, each named after Kafka's config:
//! - `socket.request.max.bytes`: a larger (or negative) size prefix closes the connection
//!   before anything is allocated; a frame's buffer then grows only as its bytes arrive, so a
//!   size prefix alone costs nothing.
//! - `queued.max.request.bytes`: the [`MemoryPool`] a reader reserves a frame's size from
//!   before reading its body.
//! - `max.connections`, `listener.name.<l>.max.connections`,
//!   `max.connections.per.ip[.overrides]`, and the creation rates of KIP-612:
//!   [`ConnectionQuotas`].
//! - `connections.max.idle.ms`: a connection with no request in flight on which nothing was
//!   read or written for that long is closed.
//! - The descriptor reserve (gregor's, not Kafka's; [`SocketServerConfig::max_connections_by_descriptors`]):
//!   each connection holds a file descriptor, and a process out of descriptors cannot open the
//!   segment files its appends need. A connection accepted while the connections of every
//!   server of the process already take their share of the open-file limit is closed at once.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use gregor_protocol::frame::{self, DecodedRequest};
use gregor_protocol::kafka_protocol::messages::{ApiKey, RequestKind};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn, Instrument};

use crate::context::{KafkaPrincipal, RequestContext, SecurityProtocol};
use crate::handler::{Handled, RequestHandler};
use crate::log_limit::{
    ACCEPT_FAILURE_WARNINGS, AUTHENTICATION_FAILURES, BAD_CONNECTION_WARNINGS,
    DESCRIPTOR_RESERVE_WARNINGS,
};
use crate::pool::{MemoryPool, Reservation};
use crate::quotas::ConnectionQuotas;
use crate::response::Response;
use crate::sasl::{Decision, SaslAuthenticator, SaslServerConfig};
use crate::send::{ResponseWriter, SendError};
use crate::transport::{PlaintextTransportLayer, Stream, TransportLayer};

/// Open client connections (gauge).
pub const CONNECTIONS_ACTIVE: &str = "gregor_connections_active";
/// Client connections accepted (counter).
pub const CONNECTIONS_OPENED_TOTAL: &str = "gregor_connections_opened_total";
/// Connections closed by a quota or expiry, by `reason` (`max_connections_per_ip`, `idle`,
/// `descriptor_reserve`).
pub const CONNECTIONS_CLOSED_BY_BROKER_TOTAL: &str = "gregor_connections_closed_by_broker_total";

/// Network failures at start-up.
#[derive(Debug, Error)]
pub enum NetworkError {
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// host:port.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A TLS listener's keystore, truststore or settings cannot work.
    #[error("listener {listener}: {key}: {message}")]
    Tls {
        /// Listener name.
        listener: String,
        /// The config key at fault, as set (`listener.name.<l>.ssl.keystore.location`, ...).
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A listener uses a security protocol gregor does not implement (it would otherwise be
    /// served as plaintext).
    #[error("listener {listener} uses security protocol {protocol}, which gregor does not implement yet; only PLAINTEXT listeners can be served")]
    UnsupportedSecurityProtocol {
        /// Listener name.
        listener: String,
        /// Its security protocol.
        protocol: SecurityProtocol,
    },
    /// A SASL listener has no SASL settings (no enabled mechanism gregor implements).
    #[error("listener {listener} uses security protocol {protocol} but has no SASL configuration (sasl.enabled.mechanisms with PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER)")]
    MissingSaslConfig {
        /// Listener name.
        listener: String,
        /// Its security protocol.
        protocol: SecurityProtocol,
    },
}

/// The socket server's settings, with Kafka's names.
#[derive(Debug, Clone)]
pub struct SocketServerConfig {
    /// `socket.request.max.bytes` (default 104857600): largest request frame accepted.
    pub socket_request_max_bytes: usize,
    /// `queued.max.requests` (default 500): per connection, requests read ahead of their
    /// responses.
    pub queued_max_requests: usize,
    /// `queued.max.request.bytes` (default -1, unbounded): bytes of requests read but not yet
    /// handled, across all connections.
    pub queued_max_request_bytes: i64,
    /// `max.connections` (default 2147483647): open connections across all listeners.
    pub max_connections: i32,
    /// `max.connections.per.ip` (default 2147483647).
    pub max_connections_per_ip: i32,
    /// `max.connections.per.ip.overrides`: per-address limits.
    pub max_connections_per_ip_overrides: HashMap<IpAddr, i32>,
    /// `connections.max.idle.ms` (default 600000); negative: never.
    pub connections_max_idle_ms: i64,
    /// The most connections, counted across every [`SocketServer`] of the process, that the
    /// open-file limit leaves room for once the segment file budget and a reserve for
    /// everything else are set aside (not a Kafka setting; the broker derives it from
    /// `RLIMIT_NOFILE`). A connection this server accepts while that many are open is closed
    /// at once, so that clients cannot take the descriptors the log needs. `None`: connections
    /// are counted but never closed for it (the controller listeners, and the default).
    pub max_connections_by_descriptors: Option<usize>,
    /// Connection creation rates (KIP-612): `max.connection.creation.rate`, the quota
    /// windows, and the per-IP `connection_creation_rate` quotas.
    pub connection_rates: crate::quotas::ConnectionRateConfig,
    /// Per listener (by name): `listener.name.<listener>.max.connections` and
    /// `listener.name.<listener>.max.connection.creation.rate`, where set.
    pub listener_quotas: HashMap<String, crate::quotas::ListenerConnectionQuota>,
    /// `inter.broker.listener.name`: exempt from `max.connections` and
    /// `max.connection.creation.rate` when this server serves more than one listener (Kafka's
    /// `protectedListener`). None on servers without it.
    pub inter_broker_listener_name: Option<String>,
}

impl Default for SocketServerConfig {
    fn default() -> Self {
        Self {
            socket_request_max_bytes: 104_857_600,
            queued_max_requests: 500,
            queued_max_request_bytes: -1,
            max_connections: i32::MAX,
            max_connections_per_ip: i32::MAX,
            max_connections_per_ip_overrides: HashMap::new(),
            connections_max_idle_ms: 600_000,
            max_connections_by_descriptors: None,
            connection_rates: crate::quotas::ConnectionRateConfig::default(),
            listener_quotas: HashMap::new(),
            inter_broker_listener_name: None,
        }
    }
}

/// A listener to bind: `NAME://host:port` with its security protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndPoint {
    /// Listener name (`PLAINTEXT`, `CONTROLLER`, ...).
    pub listener_name: String,
    /// Its protocol from `listener.security.protocol.map`.
    pub security_protocol: SecurityProtocol,
    /// Host or IP; empty binds every interface (Kafka's convention).
    pub host: String,
    /// TCP port (0: any free port).
    pub port: u16,
}

/// A bound listener, not yet accepting.
pub struct BoundListener {
    /// What was asked for.
    pub endpoint: EndPoint,
    /// The bound address (the real port when the endpoint asked for 0).
    pub local_addr: SocketAddr,
    tcp: TcpListener,
    layer: Arc<dyn TransportLayer>,
    /// The SASL settings of a `SASL_PLAINTEXT`/`SASL_SSL` listener: its connections
    /// authenticate before any other request is served.
    sasl: Option<Arc<SaslServerConfig>>,
}

/// The transport layer for `endpoint`, refusing protocols gregor does not implement.
/// `SASL_PLAINTEXT` is plain TCP under the SASL authenticator (which needs `sasl`); `SASL_SSL`
/// will be the TLS layer under it.
fn transport_layer(
    endpoint: &EndPoint,
    sasl: Option<&Arc<SaslServerConfig>>,
) -> Result<Arc<dyn TransportLayer>, NetworkError> {
    match endpoint.security_protocol {
        SecurityProtocol::Plaintext => Ok(Arc::new(PlaintextTransportLayer)),
        SecurityProtocol::SaslPlaintext if sasl.is_some() => Ok(Arc::new(PlaintextTransportLayer)),
        protocol @ SecurityProtocol::SaslPlaintext => Err(NetworkError::MissingSaslConfig {
            listener: endpoint.listener_name.clone(),
            protocol,
        }),
        protocol => Err(NetworkError::UnsupportedSecurityProtocol {
            listener: endpoint.listener_name.clone(),
            protocol,
        }),
    }
}

/// Binds every endpoint. Nothing is accepted until [`SocketServer::start`].
///
/// # Errors
/// [`NetworkError::UnsupportedSecurityProtocol`] for a listener that is not PLAINTEXT (checked
/// for all of them before binding any), [`NetworkError::Bind`] when an address cannot be bound.
pub async fn bind(endpoints: &[EndPoint]) -> Result<Vec<BoundListener>, NetworkError> {
    bind_with_sasl(endpoints, &HashMap::new()).await
}

/// [`bind`], with the SASL settings of the SASL listeners by listener name.
///
/// # Errors
/// As [`bind`]; [`NetworkError::MissingSaslConfig`] for a SASL listener missing from `sasl`.
pub async fn bind_with_sasl(
    endpoints: &[EndPoint],
    sasl: &HashMap<String, Arc<SaslServerConfig>>,
) -> Result<Vec<BoundListener>, NetworkError> {
    let layers = endpoints
        .iter()
        .map(|e| {
            let sasl = sasl.get(&e.listener_name).filter(|_| {
                matches!(
                    e.security_protocol,
                    SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
                )
            });
            transport_layer(e, sasl).map(|layer| (e.clone(), layer))
        })
        .collect::<Result<Vec<_>, _>>()?;
    bind_with_layers(layers, sasl).await
}

/// Binds every endpoint with the transport layer the caller built for it (TLS listeners:
/// [`crate::tls::TlsTransportLayer`]), and the SASL settings of the SASL listeners by listener
/// name. Nothing is accepted until [`SocketServer::start`].
///
/// # Errors
/// [`NetworkError::MissingSaslConfig`] for a SASL listener missing from `sasl`;
/// [`NetworkError::Bind`] when an address cannot be bound.
pub async fn bind_with_layers(
    endpoints: Vec<(EndPoint, Arc<dyn TransportLayer>)>,
    sasl: &HashMap<String, Arc<SaslServerConfig>>,
) -> Result<Vec<BoundListener>, NetworkError> {
    // A SASL listener is never served without its authenticator (checked before binding any).
    for (endpoint, _) in &endpoints {
        if matches!(
            endpoint.security_protocol,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        ) && !sasl.contains_key(&endpoint.listener_name)
        {
            return Err(NetworkError::MissingSaslConfig {
                listener: endpoint.listener_name.clone(),
                protocol: endpoint.security_protocol,
            });
        }
    }
    let mut out = Vec::new();
    for (endpoint, layer) in endpoints {
        let sasl = sasl
            .get(&endpoint.listener_name)
            .filter(|_| {
                matches!(
                    endpoint.security_protocol,
                    SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
                )
            })
            .cloned();
        let host = if endpoint.host.is_empty() {
            "0.0.0.0"
        } else {
            endpoint.host.as_str()
        };
        let addr = if host.contains(':') {
            format!("[{host}]:{}", endpoint.port)
        } else {
            format!("{host}:{}", endpoint.port)
        };
        let tcp = TcpListener::bind(&addr)
            .await
            .map_err(|source| NetworkError::Bind {
                addr: addr.clone(),
                source,
            })?;
        let local_addr = tcp
            .local_addr()
            .map_err(|source| NetworkError::Bind { addr, source })?;
        out.push(BoundListener {
            endpoint,
            local_addr,
            tcp,
            layer,
            sasl,
        });
    }
    Ok(out)
}

/// Serves bound listeners with a [`RequestHandler`].
pub struct SocketServer<H> {
    config: SocketServerConfig,
    handler: Arc<H>,
    quotas: Arc<ConnectionQuotas>,
    pool: Arc<MemoryPool>,
}

impl<H: RequestHandler> SocketServer<H> {
    /// A server with `config`'s limits, handing requests to `handler`.
    pub fn new(config: SocketServerConfig, handler: Arc<H>) -> Arc<Self> {
        let quotas = ConnectionQuotas::with_listeners(
            config.max_connections,
            config.max_connections_per_ip,
            &config.max_connections_per_ip_overrides,
            config.connection_rates.clone(),
            &config.listener_quotas,
            config.inter_broker_listener_name.as_deref(),
        );
        let pool = MemoryPool::new(config.queued_max_request_bytes);
        Arc::new(Self {
            config,
            handler,
            quotas,
            pool,
        })
    }

    /// The connection quotas, to reconfigure at run time
    /// ([`ConnectionQuotas::reconfigure`]).
    pub fn connection_quotas(&self) -> &Arc<ConnectionQuotas> {
        &self.quotas
    }

    /// The request memory pool (`queued.max.request.bytes`).
    pub fn memory_pool(&self) -> &Arc<MemoryPool> {
        &self.pool
    }

    /// Starts one accept loop per listener; they stop when `shutdown` turns true, and each
    /// connection stops reading then (its pending responses are still written).
    pub fn start(
        self: &Arc<Self>,
        listeners: Vec<BoundListener>,
        shutdown: &watch::Receiver<bool>,
    ) -> Vec<JoinHandle<()>> {
        for l in &listeners {
            self.quotas.add_listener(&l.endpoint.listener_name);
        }
        listeners
            .into_iter()
            .map(|l| {
                info!(listener = %l.endpoint.listener_name, protocol = %l.endpoint.security_protocol, addr = %l.local_addr, "listening for Kafka clients");
                tokio::spawn(self.clone().accept_loop(l, shutdown.clone()))
            })
            .collect()
    }

    async fn accept_loop(
        self: Arc<Self>,
        listener: BoundListener,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let listener_name: Arc<str> = listener.endpoint.listener_name.as_str().into();
        loop {
            // max.connections and the listener's: wait until a slot is free before accepting,
            // as Kafka's acceptor blocks. Nothing is taken while this acceptor waits in
            // accept(), so an idle listener holds no slot another listener needs.
            tokio::select! {
                () = self.quotas.wait_for_free_slot(&listener_name) => {}
                _ = shutdown.changed() => return,
            }
            let accepted = tokio::select! {
                a = listener.tcp.accept() => a,
                _ = shutdown.changed() => return,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    if let Some(suppressed) = ACCEPT_FAILURE_WARNINGS.check(Instant::now()) {
                        warn!(error = %e, suppressed, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // Counted now (Kafka's `inc` after accept); waits again only if another listener
            // took the free slot in between.
            let broker_slot = tokio::select! {
                s = self.quotas.wait_for_connection_slot(&listener_name) => s,
                _ = shutdown.changed() => return,
            };
            // Counted from here (before the task starts), so that two listeners' accept loops
            // cannot both take the last connection the descriptor reserve allows.
            let Some(active) = ActiveConnection::within(self.config.max_connections_by_descriptors)
            else {
                let max = self.config.max_connections_by_descriptors.unwrap_or(0);
                if let Some(suppressed) = DESCRIPTOR_RESERVE_WARNINGS.check(Instant::now()) {
                    warn!(%peer, max, suppressed, "closed a new connection at once: {max} connections are open, as many as the open-file limit leaves room for beside the segment files and a reserve (raise the open-file limit, ulimit -n, or close idle clients)");
                }
                metrics::counter!(CONNECTIONS_CLOSED_BY_BROKER_TOTAL, "reason" => "descriptor_reserve").increment(1);
                drop(stream);
                continue;
            };
            // KIP-612: the broker-wide creation rate holds the acceptor back; a connection
            // above its address's rate is held for the throttle time, then closed.
            let wait = self
                .quotas
                .record_connection_and_get_throttle_ms(&listener_name);
            if wait > 0 {
                let wait = Duration::from_millis(u64::try_from(wait).unwrap_or(0));
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    _ = shutdown.changed() => return,
                }
            }
            if let Some(throttle) = self.quotas.record_ip_connection(peer.ip(), &listener_name) {
                debug!(ip = %peer.ip(), throttle, "delaying the close of a connection above its address's connection_creation_rate");
                metrics::counter!(CONNECTIONS_CLOSED_BY_BROKER_TOTAL, "reason" => "connection_creation_rate").increment(1);
                drop(broker_slot);
                let mut rx = shutdown.clone();
                tokio::spawn(async move {
                    let _active = active;
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(u64::try_from(throttle).unwrap_or(0))) => {}
                        _ = rx.changed() => {}
                    }
                    drop(stream);
                });
                continue;
            }
            let slot = match self.quotas.register(peer.ip(), broker_slot) {
                Ok(slot) => slot,
                Err(e) => {
                    info!(ip = %e.ip, max = e.max, "rejected connection from {}: the address already has the configured maximum of {} connections (max.connections.per.ip)", e.ip, e.max);
                    metrics::counter!(CONNECTIONS_CLOSED_BY_BROKER_TOTAL, "reason" => "max_connections_per_ip").increment(1);
                    drop(stream);
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let server = self.clone();
            let layer = listener.layer.clone();
            let sasl = listener.sasl.clone();
            let listener_name = listener_name.clone();
            let rx = shutdown.clone();
            tokio::spawn(async move {
                // Counted as active until after its quota slot is released.
                let _active = active;
                let _slot = slot;
                match layer.establish(stream).await {
                    Ok(established) => {
                        let conn = Connection {
                            listener_name,
                            security_protocol: layer.security_protocol(),
                            principal: established.principal,
                            peer,
                            sends_files: established.stream.sends_files(),
                            sasl: sasl.map(SaslAuthenticator::new),
                        };
                        server.serve_connection(conn, established.stream, rx).await;
                    }
                    Err(e) => debug!(%peer, error = %e, "transport handshake failed"),
                }
            });
        }
    }

    async fn serve_connection(
        self: Arc<Self>,
        mut conn: Connection,
        stream: Stream,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let peer = conn.peer;
        debug!(%peer, listener = %conn.listener_name, "connection opened");
        metrics::counter!(CONNECTIONS_OPENED_TOTAL).increment(1);
        let activity = Arc::new(Activity::new());
        let (mut rd, mut wr): (Box<dyn AsyncRead + Send + Unpin>, ResponseWriter) = match stream {
            Stream::Tcp(tcp) => {
                let (r, w) = tcp.into_split();
                (Box::new(r), ResponseWriter::Tcp(Arc::new(w)))
            }
            Stream::Other(t) => {
                let (r, w) = tokio::io::split(t);
                (Box::new(r), ResponseWriter::Stream(w))
            }
        };
        let (tx, mut rx) = mpsc::channel::<Slot>(self.config.queued_max_requests.max(1));
        let handler = self.handler.clone();
        let writer_activity = activity.clone();
        let writer = tokio::spawn(async move {
            let _stopped = WriterStopped(writer_activity.clone());
            while let Some(slot) = rx.recv().await {
                let (out, ctx) = match slot {
                    Slot::Ready(b, ctx) => (b, ctx),
                    Slot::Pending(mut h, ctx) => match (&mut h.0).await {
                        Ok(b) => (b, ctx),
                        Err(e) => {
                            error!(error = %e, "request task failed; closing connection");
                            return;
                        }
                    },
                };
                if let Some(response) = out {
                    let started = Instant::now();
                    let len = response.len();
                    match wr.send(response, &handler).await {
                        Ok(()) => {}
                        Err(SendError::Io(e)) => {
                            debug!(%peer, error = %e, "writing a response failed; closing connection");
                            return;
                        }
                        Err(SendError::Truncated) => {
                            if let Some(suppressed) = BAD_CONNECTION_WARNINGS.check(Instant::now())
                            {
                                warn!(%peer, suppressed, "a segment was truncated (a follower's truncation) while a fetch response sent from it was being written: closing the connection, the client fetches again");
                            }
                            return;
                        }
                        Err(SendError::Offload) => {
                            debug!(%peer, "the I/O pool dropped a response transfer (shutting down); closing connection");
                            return;
                        }
                    }
                    let _ = writer_activity.unsent_response_bytes.fetch_update(
                        Ordering::AcqRel,
                        Ordering::Acquire,
                        |n| Some(n.saturating_sub(len)),
                    );
                    writer_activity.response_written.notify_waiters();
                    writer_activity.touch();
                    if let Some(ctx) = ctx {
                        handler.response_sent(&ctx, started.elapsed());
                    }
                }
                writer_activity.in_flight.fetch_sub(1, Ordering::AcqRel);
            }
        });
        let idle = u64::try_from(self.config.connections_max_idle_ms)
            .ok()
            .map(Duration::from_millis);
        let versions_handler = self.handler.clone();
        let sasl_listener = conn.sasl.is_some();
        // A SASL listener serves SaslHandshake and SaslAuthenticate itself (Kafka 4's ranges),
        // whatever the handler says.
        let supported = move |k| match k {
            ApiKey::SaslHandshake if sasl_listener => Some((0, 1)),
            ApiKey::SaslAuthenticate if sasl_listener => Some((0, 2)),
            k => versions_handler.supported_versions(k),
        };
        let mut software = (String::from("unknown"), String::from("unknown"));
        // Set when the client went away: its pending responses can no longer be delivered.
        let mut peer_closed = false;
        let throttle = crate::context::ConnectionThrottle::default();
        loop {
            // Like Kafka muting a connection while its response is outstanding: no further
            // request is read while more than MAX_UNSENT_RESPONSE_BYTES of responses wait for
            // a client that does not read them, so pipelined large fetches cannot pile up
            // responses in memory.
            if !wait_for_unsent_responses(&activity, &mut shutdown).await {
                break;
            }
            // A quota throttle (KIP-219) mutes the connection's reads until it ends.
            if throttle.throttled_until().is_some() {
                tokio::select! {
                    () = throttle.wait() => {}
                    () = writer_stopped(&activity) => break,
                    _ = shutdown.changed() => break,
                }
            }
            // Before authentication, frames are bounded by sasl.server.max.receive.size.
            let max_frame_bytes = match &conn.sasl {
                Some(a) if a.principal().is_none() => self
                    .config
                    .socket_request_max_bytes
                    .min(a.max_receive_size()),
                _ => self.config.socket_request_max_bytes,
            };
            let read = tokio::select! {
                r = read_frame(&mut rd, max_frame_bytes, &self.pool, &activity) => r,
                () = writer_stopped(&activity) => break,
                () = idle_expired(&activity, idle) => {
                    debug!(%peer, "closing connection idle for connections.max.idle.ms");
                    metrics::counter!(CONNECTIONS_CLOSED_BY_BROKER_TOTAL, "reason" => "idle").increment(1);
                    break;
                }
                _ = shutdown.changed() => break,
            };
            let (buf, reservation) = match read {
                Ok(Some(frame)) => frame,
                Ok(None) => {
                    peer_closed = true;
                    break;
                }
                Err(FrameReadError::Size(size)) => {
                    let max = max_frame_bytes;
                    if let Some(suppressed) = BAD_CONNECTION_WARNINGS.check(Instant::now()) {
                        warn!(%peer, size, suppressed, "request size {size} is outside 0..=socket.request.max.bytes ({max}, sasl.server.max.receive.size before SASL authentication); closing connection");
                    }
                    break;
                }
            };
            let received_at = Instant::now();
            if let Some(auth) = conn.sasl.as_mut().filter(|a| a.expects_raw_token()) {
                // After SaslHandshake v0: a raw SASL token, no Kafka header.
                let decision = auth.on_raw_token(&buf);
                drop(reservation);
                match sasl_decision(&mut conn, decision) {
                    Some(slot) => {
                        activity.in_flight.fetch_add(1, Ordering::AcqRel);
                        count_ready(&activity, &slot);
                        let close = matches!(slot, SaslSlot::Close(_));
                        if tx.send(slot.into_slot()).await.is_err() || close {
                            break;
                        }
                        continue;
                    }
                    None => continue,
                }
            }
            let size_in_bytes = buf.len();
            let decoded = frame::decode_request(buf, &supported);
            let slot = match decoded {
                Ok(DecodedRequest::Request {
                    header,
                    api_key,
                    body,
                }) => {
                    if let Some(auth) = conn.sasl.as_mut() {
                        let decision = auth.on_request(&header, api_key, &body, received_at);
                        if !matches!(decision, Decision::Handle) {
                            drop(reservation);
                            if let Some(slot) = sasl_decision(&mut conn, decision) {
                                activity.in_flight.fetch_add(1, Ordering::AcqRel);
                                count_ready(&activity, &slot);
                                let close = matches!(slot, SaslSlot::Close(_));
                                if tx.send(slot.into_slot()).await.is_err() || close {
                                    break;
                                }
                            }
                            continue;
                        }
                        if let Some(p) = auth.principal() {
                            if *p != conn.principal {
                                conn.principal = p.clone();
                            }
                        }
                    }
                    if let RequestKind::ApiVersions(r) = body.as_ref() {
                        // KIP-511: remembered for the connection's later requests.
                        if header.request_api_version >= 3 {
                            software = (
                                r.client_software_name.to_string(),
                                r.client_software_version.to_string(),
                            );
                        }
                    }
                    let (client_software_name, client_software_version) = software.clone();
                    let ctx = Arc::new(RequestContext {
                        header,
                        api_key,
                        principal: conn.principal.clone(),
                        listener_name: conn.listener_name.to_string(),
                        security_protocol: conn.security_protocol,
                        client_address: peer,
                        client_software_name,
                        client_software_version,
                        received_at,
                        sends_files: conn.sends_files,
                        size_in_bytes,
                        throttle: throttle.clone(),
                    });
                    let span = tracing::debug_span!(
                        "request",
                        api_key = ?api_key,
                        api_version = ctx.header.request_api_version,
                        correlation_id = ctx.header.correlation_id,
                        client_id = ctx.client_id(),
                    );
                    let started = Instant::now();
                    let handled = self
                        .handler
                        .handle(&ctx, *body)
                        .instrument(span.clone())
                        .await;
                    // The immediate part is done with the request's bytes.
                    drop(reservation);
                    match handled {
                        Handled::CloseConnection => {
                            debug!(%peer, "closing connection as the handler asked");
                            break;
                        }
                        Handled::Ready(_) | Handled::ReadyResponse(_) => {
                            span.in_scope(|| {
                                debug!(
                                    duration_us = started.elapsed().as_micros() as u64,
                                    "handled"
                                );
                            });
                            let response = match handled {
                                Handled::ReadyResponse(r) => Some(r),
                                Handled::Ready(b) => b.map(Response::from),
                                _ => None,
                            };
                            Slot::Ready(response, Some(ctx))
                        }
                        Handled::Deferred(_) | Handled::DeferredResponse(_) => {
                            let fut: std::pin::Pin<
                                Box<dyn std::future::Future<Output = Option<Response>> + Send>,
                            > = match handled {
                                Handled::Deferred(f) => {
                                    Box::pin(async move { f.await.map(Response::from) })
                                }
                                Handled::DeferredResponse(f) => f,
                                _ => Box::pin(async { None }),
                            };
                            let deferred_activity = activity.clone();
                            Slot::Pending(
                                AbortOnDrop(tokio::spawn(
                                    async move {
                                        let out = fut.await;
                                        if let Some(response) = &out {
                                            deferred_activity
                                                .unsent_response_bytes
                                                .fetch_add(response.len(), Ordering::AcqRel);
                                        }
                                        debug!(
                                            duration_us = started.elapsed().as_micros() as u64,
                                            "handled"
                                        );
                                        out
                                    }
                                    .instrument(span),
                                )),
                                Some(ctx),
                            )
                        }
                    }
                }
                Ok(DecodedRequest::UnsupportedApiVersions {
                    correlation_id,
                    version,
                }) => {
                    debug!(%peer, version, "ApiVersions at an unsupported version; answering with v0");
                    Slot::Ready(
                        self.handler
                            .unsupported_api_versions(correlation_id)
                            .map(Response::from),
                        None,
                    )
                }
                Ok(DecodedRequest::UnsupportedVersion {
                    api_key,
                    version,
                    correlation_id,
                }) => {
                    if let Some(suppressed) = BAD_CONNECTION_WARNINGS.check(Instant::now()) {
                        warn!(%peer, ?api_key, version, correlation_id, suppressed, "unsupported request version; closing connection (as Kafka does)");
                    }
                    break;
                }
                Err(e) => {
                    if let Some(suppressed) = BAD_CONNECTION_WARNINGS.check(Instant::now()) {
                        warn!(%peer, error = %e, suppressed, "malformed request; closing connection");
                    }
                    break;
                }
            };
            activity.in_flight.fetch_add(1, Ordering::AcqRel);
            // Every ready response is counted here, whichever path made it (deferred ones when
            // they complete), so the writer's subtraction always has its addition.
            if let Slot::Ready(Some(response), _) = &slot {
                activity
                    .unsent_response_bytes
                    .fetch_add(response.len(), Ordering::AcqRel);
            }
            if tx.send(slot).await.is_err() {
                break;
            }
        }
        drop(tx);
        if peer_closed {
            // As Kafka's selector on a disconnect: the connection's queued responses are
            // dropped, and their deferred parts (long polls, acks=all waits) aborted.
            writer.abort();
        }
        let _ = writer.await;
        debug!(%peer, "connection closed");
    }
}

/// Responses a connection may have built and not yet sent before the broker stops reading its
/// requests (bytes). Kafka handles one request per connection at a time; gregor pipelines
/// small responses (an idempotent producer's five in-flight requests) but holds further reads
/// while a client leaves large ones unread. A response's file regions count too: they are not
/// in memory, but each holds a segment file open (pinned) until it is sent.
pub const MAX_UNSENT_RESPONSE_BYTES: usize = 1 << 20;

/// Waits until the connection's unsent responses are at most [`MAX_UNSENT_RESPONSE_BYTES`].
/// False when the broker shuts down or the connection's writer stopped meanwhile.
async fn wait_for_unsent_responses(
    activity: &Activity,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    loop {
        let written = activity.response_written.notified();
        tokio::pin!(written);
        written.as_mut().enable();
        if activity.writer_stopped.load(Ordering::Acquire) {
            return false;
        }
        if activity.unsent_response_bytes.load(Ordering::Acquire) <= MAX_UNSENT_RESPONSE_BYTES {
            return true;
        }
        tokio::select! {
            () = &mut written => {}
            _ = shutdown.changed() => return false,
        }
    }
}

/// What the network knows about a connection once it is established.
struct Connection {
    listener_name: Arc<str>,
    security_protocol: SecurityProtocol,
    principal: KafkaPrincipal,
    peer: SocketAddr,
    /// A plain TCP stream: responses may send file regions without a copy.
    sends_files: bool,
    /// The SASL authenticator of a SASL listener's connection.
    sasl: Option<SaslAuthenticator>,
}

/// A response the SASL authenticator made: written like any other, then (`Close`) the
/// connection closes.
enum SaslSlot {
    Respond(Option<Response>),
    Close(Option<Response>),
}

impl SaslSlot {
    fn into_slot(self) -> Slot {
        match self {
            Self::Respond(r) | Self::Close(r) => Slot::Ready(r, None),
        }
    }
}

/// Applies the authenticator's decision: the principal once authenticated, the log line of a
/// failed authentication (once, with the peer, as Kafka's `Selector` logs it at INFO).
/// None when nothing is to be sent.
fn sasl_decision(conn: &mut Connection, decision: Decision) -> Option<SaslSlot> {
    match decision {
        Decision::Handle => None,
        Decision::Respond(r) => {
            if let Some(p) = conn.sasl.as_ref().and_then(|a| a.principal()) {
                if *p != conn.principal {
                    debug!(peer = %conn.peer, principal = %p, "SASL authentication complete");
                    conn.principal = p.clone();
                }
            }
            Some(SaslSlot::Respond(r.map(Response::from)))
        }
        Decision::Close {
            response,
            reason,
            authentication_failed,
        } => {
            if authentication_failed {
                if let Some(suppressed) = AUTHENTICATION_FAILURES.check(Instant::now()) {
                    info!(peer = %conn.peer, listener = %conn.listener_name, suppressed, "Failed authentication with {} ({reason})", conn.peer.ip());
                }
            } else {
                debug!(peer = %conn.peer, "{reason}");
            }
            Some(SaslSlot::Close(response.map(Response::from)))
        }
    }
}

/// Counts a SASL response in the connection's unsent bytes, as every ready response is.
fn count_ready(activity: &Activity, slot: &SaslSlot) {
    if let SaslSlot::Respond(Some(r)) | SaslSlot::Close(Some(r)) = slot {
        activity
            .unsent_response_bytes
            .fetch_add(r.len(), Ordering::AcqRel);
    }
}

enum Slot {
    Ready(Option<Response>, Option<Arc<RequestContext>>),
    Pending(AbortOnDrop, Option<Arc<RequestContext>>),
}

/// A request's deferred part. Dropped unfinished (its connection closed), it is aborted, so a
/// long poll or an acks=all wait of a closed connection leaves the purgatory at once instead
/// of at its timeout.
struct AbortOnDrop(JoinHandle<Option<Response>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Open connections across every [`SocketServer`] of the process (each holds a descriptor).
static OPEN_CONNECTIONS: AtomicUsize = AtomicUsize::new(0);

/// One open connection in [`OPEN_CONNECTIONS`] and the `gregor_connections_active` gauge.
struct ActiveConnection;

impl ActiveConnection {
    /// Counts a new connection unless `max` are open already (`None`: no maximum).
    fn within(max: Option<usize>) -> Option<Self> {
        OPEN_CONNECTIONS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                max.is_none_or(|m| n < m).then_some(n + 1)
            })
            .ok()?;
        metrics::gauge!(CONNECTIONS_ACTIVE).increment(1.0);
        Some(Self)
    }
}

impl Drop for ActiveConnection {
    fn drop(&mut self) {
        OPEN_CONNECTIONS.fetch_sub(1, Ordering::AcqRel);
        metrics::gauge!(CONNECTIONS_ACTIVE).decrement(1.0);
    }
}

/// A connection's last I/O and its requests whose responses are not written yet.
struct Activity {
    opened: Instant,
    last_activity_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// Bytes of responses built and not yet written to the socket.
    unsent_response_bytes: AtomicUsize,
    /// Woken whenever the writer has written a response, and when it stops.
    response_written: tokio::sync::Notify,
    /// Set when the writer stopped (the socket failed or the connection is closing).
    writer_stopped: AtomicBool,
}

/// Marks the writer stopped when its task ends, however it ends, and wakes a reader waiting
/// for responses to drain.
struct WriterStopped(Arc<Activity>);

impl Drop for WriterStopped {
    fn drop(&mut self) {
        self.0.writer_stopped.store(true, Ordering::Release);
        self.0.response_written.notify_waiters();
    }
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            last_activity_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            unsent_response_bytes: AtomicUsize::new(0),
            response_written: tokio::sync::Notify::new(),
            writer_stopped: AtomicBool::new(false),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        self.last_activity_ms
            .store(self.now_ms(), Ordering::Release);
    }
}

/// Resolves once the connection's writer stopped (a response could not be written: the socket
/// failed, or a file region could not be completed), so the reader stops too and the
/// connection closes instead of waiting for requests whose responses cannot be sent.
async fn writer_stopped(activity: &Activity) {
    loop {
        let written = activity.response_written.notified();
        tokio::pin!(written);
        written.as_mut().enable();
        if activity.writer_stopped.load(Ordering::Acquire) {
            return;
        }
        written.await;
    }
}

/// Resolves once the connection has been idle for `idle` (nothing in flight, no I/O); never
/// when `idle` is None (`connections.max.idle.ms` < 0).
async fn idle_expired(activity: &Activity, idle: Option<Duration>) {
    let Some(idle) = idle else {
        return std::future::pending().await;
    };
    let idle_ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
    loop {
        let last = activity.last_activity_ms.load(Ordering::Acquire);
        let now = activity.now_ms();
        let idle_for = now.saturating_sub(last);
        if activity.in_flight.load(Ordering::Acquire) > 0 {
            // A request in flight (a long poll, a rebalance) is activity.
            activity.touch();
            tokio::time::sleep(idle).await;
        } else if idle_for >= idle_ms {
            return;
        } else {
            tokio::time::sleep(Duration::from_millis(idle_ms - idle_for)).await;
        }
    }
}

enum FrameReadError {
    /// A size prefix outside `0..=socket.request.max.bytes`.
    Size(i32),
}

/// First buffer of a frame's body; it then grows [`FRAME_BUFFER_GROWTH`]-fold each time the
/// bytes that arrived fill it, up to the declared size.
const INITIAL_FRAME_BUFFER_BYTES: usize = 8 * 1024;

/// How much a frame buffer grows when full. Each growth copies what arrived so far, so the
/// copies add up to about 1/(growth - 1) of the frame: doubling copied a whole produce request
/// once more (2.3% of the broker's CPU producing 1 KiB records, in `realloc`), eightfold
/// copies a seventh of it. A client that declares a large frame and sends `n` bytes of it
/// makes the broker hold at most `8 n` (plus the first buffer); Kafka allocates the whole
/// declared size (up to `socket.request.max.bytes`) at once.
const FRAME_BUFFER_GROWTH: usize = 8;

/// Reads one frame: the 4-byte size, a reservation of that size from the memory pool, then
/// the body, growing the buffer only as its bytes arrive. `Ok(None)` when the connection
/// closed (or failed) before a whole frame arrived.
async fn read_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    max_bytes: usize,
    pool: &Arc<MemoryPool>,
    activity: &Activity,
) -> Result<Option<(Bytes, Reservation)>, FrameReadError> {
    let mut prefix = [0u8; 4];
    if rd.read_exact(&mut prefix).await.is_err() {
        return Ok(None);
    }
    activity.touch();
    let size = frame::frame_size(prefix);
    let Ok(size_bytes) = usize::try_from(size) else {
        return Err(FrameReadError::Size(size));
    };
    if size_bytes > max_bytes {
        return Err(FrameReadError::Size(size));
    }
    let reservation = pool.reserve(size_bytes).await;
    let mut buf = BytesMut::with_capacity(size_bytes.min(INITIAL_FRAME_BUFFER_BYTES));
    while buf.len() < size_bytes {
        let remaining = size_bytes - buf.len();
        if buf.capacity() == buf.len() {
            let more = buf
                .len()
                .saturating_mul(FRAME_BUFFER_GROWTH - 1)
                .max(INITIAL_FRAME_BUFFER_BYTES);
            buf.reserve(remaining.min(more));
        }
        let want = remaining.min(buf.capacity() - buf.len());
        let mut limited = (&mut *rd).take(want as u64);
        match limited.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return Ok(None),
            Ok(_) => activity.touch(),
        }
    }
    Ok(Some((buf.freeze(), reservation)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn frame_buffer_grows_with_the_bytes_not_the_declared_size() {
        let pool = MemoryPool::new(-1);
        let activity = Activity::new();
        // A 100 MB prefix followed by 10 bytes and EOF: nothing near 100 MB is reserved.
        let mut input = Vec::new();
        input.extend_from_slice(&100_000_000i32.to_be_bytes());
        input.extend_from_slice(&[7u8; 10]);
        let (mut client, mut server) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            client.write_all(&input).await.expect("write");
            // Keep the stream open a moment, then close.
            drop(client);
        });
        let r = read_frame(&mut server, 104_857_600, &pool, &activity).await;
        writer.await.expect("writer");
        assert!(matches!(r, Ok(None)), "a truncated frame is not a frame");

        // A whole frame of 20000 bytes arrives intact.
        let body: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        let mut input = (body.len() as i32).to_be_bytes().to_vec();
        input.extend_from_slice(&body);
        let (mut client, mut server) = tokio::io::duplex(1000);
        tokio::spawn(async move { client.write_all(&input).await });
        let Ok(Some((frame, _r))) = read_frame(&mut server, 1 << 20, &pool, &activity).await else {
            panic!("frame expected");
        };
        assert_eq!(&frame[..], &body[..]);
    }

    #[tokio::test]
    async fn sizes_outside_the_limit_are_refused() {
        let pool = MemoryPool::new(-1);
        let activity = Activity::new();
        for size in [-1i32, 1001] {
            let mut input: &[u8] = &size.to_be_bytes();
            let r = read_frame(&mut input, 1000, &pool, &activity).await;
            assert!(matches!(r, Err(FrameReadError::Size(s)) if s == size));
        }
    }

    #[tokio::test]
    async fn non_plaintext_endpoints_are_refused_before_binding() {
        let e = |name: &str, p| EndPoint {
            listener_name: name.into(),
            security_protocol: p,
            host: "127.0.0.1".into(),
            port: 0,
        };
        let r = bind(&[
            e("PLAINTEXT", SecurityProtocol::Plaintext),
            e("EXTERNAL", SecurityProtocol::SaslSsl),
        ])
        .await;
        match r {
            Err(NetworkError::UnsupportedSecurityProtocol { listener, protocol }) => {
                assert_eq!(listener, "EXTERNAL");
                assert_eq!(protocol, SecurityProtocol::SaslSsl);
            }
            other => panic!("expected a refusal, got {:?}", other.map(|v| v.len())),
        }
        assert_eq!(
            bind(&[e("PLAINTEXT", SecurityProtocol::Plaintext)])
                .await
                .map(|v| v.len())
                .ok(),
            Some(1)
        );
    }

    /// A handler that answers ApiVersions at once and Metadata after a delay, and records
    /// each request's context.
    struct Recording {
        seen: parking_lot::Mutex<Vec<(i32, String, String, String)>>,
    }

    impl RequestHandler for Recording {
        fn supported_versions(
            &self,
            api_key: gregor_protocol::kafka_protocol::messages::ApiKey,
        ) -> Option<(i16, i16)> {
            use gregor_protocol::kafka_protocol::messages::ApiKey;
            matches!(api_key, ApiKey::ApiVersions | ApiKey::Metadata).then_some((0, 12))
        }

        async fn handle(&self, ctx: &RequestContext, _body: RequestKind) -> Handled {
            use gregor_protocol::kafka_protocol::messages::{
                ApiKey, ApiVersionsResponse, MetadataResponse,
            };
            self.seen.lock().push((
                ctx.header.correlation_id,
                ctx.client_software_name.clone(),
                ctx.principal.to_string(),
                ctx.listener_name.clone(),
            ));
            let header = ctx.header.clone();
            if ctx.api_key == ApiKey::Metadata {
                Handled::Deferred(Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    crate::respond(
                        &header,
                        ApiKey::Metadata,
                        MetadataResponse::default().into(),
                    )
                }))
            } else {
                Handled::Ready(crate::respond(
                    &header,
                    ApiKey::ApiVersions,
                    ApiVersionsResponse::default().into(),
                ))
            }
        }

        fn unsupported_api_versions(&self, _correlation_id: i32) -> Option<Bytes> {
            None
        }
    }

    fn request_frame(
        api_key: gregor_protocol::kafka_protocol::messages::ApiKey,
        version: i16,
        correlation_id: i32,
        body: &impl gregor_protocol::kafka_protocol::protocol::Encodable,
    ) -> Vec<u8> {
        use gregor_protocol::kafka_protocol::messages::RequestHeader;
        use gregor_protocol::kafka_protocol::protocol::Encodable;
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(api_key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .encode(&mut buf, api_key.request_header_version(version))
            .expect("header");
        body.encode(&mut buf, version).expect("body");
        let mut out = (buf.len() as i32).to_be_bytes().to_vec();
        out.extend_from_slice(&buf);
        out
    }

    #[tokio::test]
    async fn responses_in_request_order_with_the_connections_context() {
        use gregor_protocol::kafka_protocol::messages::{
            ApiKey, ApiVersionsRequest, MetadataRequest,
        };
        use gregor_protocol::kafka_protocol::protocol::StrBytes;
        let listeners = bind(&[EndPoint {
            listener_name: "INTERNAL".into(),
            security_protocol: SecurityProtocol::Plaintext,
            host: "127.0.0.1".into(),
            port: 0,
        }])
        .await
        .expect("bind");
        let addr = listeners[0].local_addr;
        let handler = Arc::new(Recording {
            seen: parking_lot::Mutex::new(Vec::new()),
        });
        let server = SocketServer::new(SocketServerConfig::default(), handler.clone());
        let (stop, stop_rx) = watch::channel(false);
        let tasks = server.start(listeners, &stop_rx);

        let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut out = request_frame(ApiKey::Metadata, 12, 1, &MetadataRequest::default());
        out.extend(request_frame(
            ApiKey::ApiVersions,
            3,
            2,
            &ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("test-client"))
                .with_client_software_version(StrBytes::from_static_str("1.0")),
        ));
        out.extend(request_frame(
            ApiKey::Metadata,
            12,
            3,
            &MetadataRequest::default(),
        ));
        client.write_all(&out).await.expect("write");
        for expected in 1..=3 {
            let mut len = [0u8; 4];
            client.read_exact(&mut len).await.expect("size");
            let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
            client.read_exact(&mut body).await.expect("body");
            let correlation_id = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
            assert_eq!(correlation_id, expected, "responses out of order");
        }
        let seen = handler.seen.lock().clone();
        let software: Vec<(i32, &str)> = seen.iter().map(|s| (s.0, s.1.as_str())).collect();
        // KIP-511: known from the ApiVersions v3 request on.
        assert_eq!(
            software,
            vec![(1, "unknown"), (2, "test-client"), (3, "test-client")]
        );
        assert!(seen
            .iter()
            .all(|s| s.2 == "User:ANONYMOUS" && s.3 == "INTERNAL"));
        let _ = stop.send(true);
        for t in tasks {
            t.await.expect("accept loop");
        }
    }

    /// A file for [`FileRegion`]s whose truncation the test decides.
    struct TestFile {
        file: std::fs::File,
        intact: bool,
    }

    impl crate::response::RegionFile for TestFile {
        fn file(&self) -> &std::fs::File {
            &self.file
        }

        fn is_intact(&self) -> bool {
            self.intact
        }
    }

    /// Answers every Metadata request with one frame of `parts`: bytes, a region of the file,
    /// bytes, a region, bytes (what a Fetch response with two record sets looks like).
    struct Regions {
        path: std::path::PathBuf,
        /// (position, length) of the two regions.
        regions: [(u64, usize); 2],
        intact: bool,
        /// What [`RequestHandler::transfer_may_wait`] answers.
        may_wait: bool,
    }

    impl Regions {
        /// The frame's bytes as they must arrive, from the file's current content.
        fn expected(&self) -> Vec<u8> {
            use std::os::unix::fs::FileExt;
            let file = std::fs::File::open(&self.path).expect("open");
            let mut region_bytes = Vec::new();
            for (pos, len) in self.regions {
                let mut b = vec![0u8; len];
                file.read_exact_at(&mut b, pos).expect("read");
                region_bytes.push(b);
            }
            let (head, middle, tail) = self.memory_parts();
            let mut out = head;
            out.extend(&region_bytes[0]);
            out.extend(middle);
            out.extend(&region_bytes[1]);
            out.extend(tail);
            out
        }

        /// The frame's memory parts: the size prefix and a correlation id, then two more.
        fn memory_parts(&self) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
            let middle = b"between the regions".to_vec();
            let tail = b"after them".to_vec();
            let total = 4 + self.regions[0].1 + middle.len() + self.regions[1].1 + tail.len();
            let mut head = ((total) as i32).to_be_bytes().to_vec();
            head.extend(1i32.to_be_bytes());
            (head, middle, tail)
        }

        fn response(&self) -> crate::response::Response {
            use crate::response::{FileRegion, ResponsePart};
            let region = |(pos, len): (u64, usize)| {
                ResponsePart::File(FileRegion::new(
                    Box::new(TestFile {
                        file: std::fs::File::open(&self.path).expect("open"),
                        intact: self.intact,
                    }),
                    pos,
                    len,
                ))
            };
            let (head, middle, tail) = self.memory_parts();
            crate::response::Response::new(vec![
                ResponsePart::Bytes(Bytes::from(head)),
                region(self.regions[0]),
                ResponsePart::Bytes(Bytes::from(middle)),
                region(self.regions[1]),
                ResponsePart::Bytes(Bytes::from(tail)),
            ])
        }
    }

    impl RequestHandler for Regions {
        fn supported_versions(
            &self,
            api_key: gregor_protocol::kafka_protocol::messages::ApiKey,
        ) -> Option<(i16, i16)> {
            use gregor_protocol::kafka_protocol::messages::ApiKey;
            matches!(api_key, ApiKey::Metadata).then_some((0, 12))
        }

        async fn handle(&self, _ctx: &RequestContext, _body: RequestKind) -> Handled {
            Handled::ReadyResponse(self.response())
        }

        fn unsupported_api_versions(&self, _correlation_id: i32) -> Option<Bytes> {
            None
        }

        fn transfer_may_wait(&self) -> bool {
            self.may_wait
        }
    }

    /// A file of `len` bytes of a pattern that shows misplaced bytes.
    fn patterned_file(len: usize) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        let bytes: Vec<u8> = (0..len)
            .map(|i| (i % 251) as u8 ^ (i >> 12) as u8)
            .collect();
        std::io::Write::write_all(&mut f, &bytes).expect("write");
        f
    }

    /// A layer that hands the TCP stream over as a transport that is not plain TCP, so
    /// responses take the copying path; like TLS it may keep written bytes until a flush (a
    /// 16 KiB write buffer here; rustls keeps records the socket did not take).
    struct WrappedLayer;

    impl TransportLayer for WrappedLayer {
        fn security_protocol(&self) -> SecurityProtocol {
            SecurityProtocol::Plaintext
        }

        fn establish(
            &self,
            stream: tokio::net::TcpStream,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<Output = std::io::Result<crate::transport::Established>>
                    + Send
                    + '_,
            >,
        > {
            Box::pin(async move {
                Ok(crate::transport::Established {
                    stream: Stream::Other(Box::new(tokio::io::BufWriter::with_capacity(
                        16 * 1024,
                        stream,
                    ))),
                    principal: KafkaPrincipal::anonymous(),
                })
            })
        }
    }

    /// Serves `handler` on 127.0.0.1 (with `layer`, or plaintext); returns the address, the
    /// stop switch and the accept loops.
    async fn serve<H: RequestHandler>(
        handler: Arc<H>,
        layer: Option<Arc<dyn TransportLayer>>,
    ) -> (SocketAddr, watch::Sender<bool>, Vec<JoinHandle<()>>) {
        let mut listeners = bind(&[EndPoint {
            listener_name: "PLAINTEXT".into(),
            security_protocol: SecurityProtocol::Plaintext,
            host: "127.0.0.1".into(),
            port: 0,
        }])
        .await
        .expect("bind");
        if let Some(layer) = layer {
            listeners[0].layer = layer;
        }
        let addr = listeners[0].local_addr;
        let server = SocketServer::new(SocketServerConfig::default(), handler);
        let (stop, stop_rx) = watch::channel(false);
        let tasks = server.start(listeners, &stop_rx);
        (addr, stop, tasks)
    }

    /// A client whose receive buffer is 4 KiB, so the broker's send buffer fills at once and
    /// every `splice` and `send` is partial or meets EAGAIN.
    async fn small_window_client(addr: SocketAddr) -> tokio::net::TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        socket.connect(addr).await.expect("connect")
    }

    fn metadata_request(correlation_id: i32) -> Vec<u8> {
        use gregor_protocol::kafka_protocol::messages::{ApiKey, MetadataRequest};
        request_frame(
            ApiKey::Metadata,
            12,
            correlation_id,
            &MetadataRequest::default(),
        )
    }

    /// Reads whatever arrives until the connection ends.
    async fn read_to_end(client: &mut tokio::net::TcpStream) -> Vec<u8> {
        let mut got = Vec::new();
        let _ = client.read_to_end(&mut got).await;
        got
    }

    #[tokio::test]
    async fn file_regions_go_out_in_order_through_partial_writes() {
        let file = patterned_file(9 << 20);
        let handler = Arc::new(Regions {
            path: file.path().to_path_buf(),
            regions: [(12_345, 4 << 20), (5 << 20, (3 << 20) + 17)],
            intact: true,
            may_wait: true,
        });
        let expected = handler.expected();
        for layer in [
            None,
            Some(Arc::new(WrappedLayer) as Arc<dyn TransportLayer>),
        ] {
            let copying = layer.is_some();
            let (addr, stop, tasks) = serve(handler.clone(), layer).await;
            let mut client = small_window_client(addr).await;
            // Two requests: the second response starts right after the first, in frame.
            let mut out = metadata_request(1);
            out.extend(metadata_request(2));
            client.write_all(&out).await.expect("write");
            for _ in 0..2 {
                let mut got = vec![0u8; expected.len()];
                // Read in small steps, as a slow client does.
                let mut at = 0;
                while at < got.len() {
                    let end = (at + 1000).min(got.len());
                    // A response left partly unsent (unflushed) would wait forever.
                    let n = tokio::time::timeout(
                        std::time::Duration::from_secs(30),
                        client.read(&mut got[at..end]),
                    )
                    .await
                    .unwrap_or_else(|_| panic!("no bytes for 30 s after {at} (copying: {copying})"))
                    .expect("read");
                    assert!(
                        n > 0,
                        "connection closed after {at} bytes (copying: {copying})"
                    );
                    at += n;
                }
                assert!(
                    got == expected,
                    "the frame's bytes differ (copying: {copying})"
                );
            }
            let _ = stop.send(true);
            drop(client);
            for t in tasks {
                t.await.expect("accept loop");
            }
        }
    }

    /// A client that stops reading for longer than a transfer job may wait for it
    /// (`DRAIN_WAIT`), again and again: the job hands the rest back to the async writer,
    /// which must pick it up where the job stopped once the client reads again, every byte in
    /// place. With and without waiting in the job.
    #[tokio::test]
    async fn a_client_that_pauses_gets_the_whole_response() {
        let file = patterned_file(6 << 20);
        for may_wait in [true, false] {
            let handler = Arc::new(Regions {
                path: file.path().to_path_buf(),
                regions: [(7, 3 << 20), (3 << 20, (2 << 20) + 5)],
                intact: true,
                may_wait,
            });
            let expected = handler.expected();
            let (addr, stop, tasks) = serve(handler.clone(), None).await;
            let mut client = small_window_client(addr).await;
            client.write_all(&metadata_request(1)).await.expect("write");
            let mut got = vec![0u8; expected.len()];
            let mut at = 0;
            let mut reads = 0u32;
            while at < got.len() {
                if reads.is_multiple_of(64) {
                    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
                }
                reads += 1;
                let end = (at + 64 * 1024).min(got.len());
                let n = tokio::time::timeout(
                    std::time::Duration::from_secs(30),
                    client.read(&mut got[at..end]),
                )
                .await
                .unwrap_or_else(|_| panic!("no bytes for 30 s after {at} (may_wait: {may_wait})"))
                .expect("read");
                assert!(n > 0, "connection closed after {at} bytes");
                at += n;
            }
            assert!(
                got == expected,
                "the frame's bytes differ (may_wait: {may_wait})"
            );
            let _ = stop.send(true);
            drop(client);
            for t in tasks {
                t.await.expect("accept loop");
            }
        }
    }

    #[tokio::test]
    async fn a_region_past_the_end_of_its_file_closes_the_connection() {
        // The file was cut after the response was built: the splice reaches its end with bytes
        // of the frame still owed.
        let file = patterned_file(1 << 20);
        let handler = Arc::new(Regions {
            path: file.path().to_path_buf(),
            regions: [(0, 100_000), (900_000, 400_000)],
            intact: true,
            may_wait: true,
        });
        let (head, middle, tail) = handler.memory_parts();
        let whole = head.len() + 100_000 + middle.len() + 400_000 + tail.len();
        let (addr, stop, tasks) = serve(handler.clone(), None).await;
        let mut client = small_window_client(addr).await;
        client.write_all(&metadata_request(1)).await.expect("write");
        let got = read_to_end(&mut client).await;
        // Everything up to the file's end arrived, in order, and then the connection ended.
        let expected_prefix_len = head.len() + 100_000 + middle.len() + (1_048_576 - 900_000);
        assert_eq!(got.len(), expected_prefix_len, "frame of {whole} bytes");
        let _ = stop.send(true);
        for t in tasks {
            t.await.expect("accept loop");
        }
    }

    #[tokio::test]
    async fn a_truncated_file_closes_the_connection_without_sending_its_region() {
        let file = patterned_file(1 << 20);
        for layer in [
            None,
            Some(Arc::new(WrappedLayer) as Arc<dyn TransportLayer>),
        ] {
            let handler = Arc::new(Regions {
                path: file.path().to_path_buf(),
                regions: [(0, 100_000), (200_000, 100_000)],
                intact: false,
                may_wait: true,
            });
            let buffering = layer.is_some();
            let (head, _, _) = handler.memory_parts();
            let (addr, stop, tasks) = serve(handler, layer).await;
            let mut client = small_window_client(addr).await;
            client.write_all(&metadata_request(1)).await.expect("write");
            let got = read_to_end(&mut client).await;
            if buffering {
                // A buffering transport (as TLS) may not have sent the head before the
                // connection closed; nothing past it ever goes out.
                assert!(head.starts_with(&got), "only bytes of the head, {got:?}");
            } else {
                assert_eq!(got, head, "only the bytes before the first region");
            }
            let _ = stop.send(true);
            for t in tasks {
                t.await.expect("accept loop");
            }
        }
    }
}
