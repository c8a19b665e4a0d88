//! The broker process: start-up (storage, metadata, logs), listeners, connections, shutdown.
//!
//! Each connection has one reader task and one writer task. The reader decodes requests in
//! order and runs each handler's immediate part (appends, first reads) in that order, so the
//! side effects of pipelined requests happen in request order (an idempotent producer with five
//! requests in flight relies on it). A handler may return a deferred part (acks=all wait, fetch
//! long poll) that runs as its own task; the writer sends responses strictly in request order.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use gregor_log::LogManager;
use gregor_metadata::log::FileMetadataLog;
use gregor_metadata::Controller;
use gregor_protocol::frame::{self, DecodedRequest};
use gregor_protocol::kafka_protocol::messages::{ApiKey, RequestHeader, ResponseKind};
use parking_lot::Mutex;
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, warn, Instrument};

use crate::config::BrokerConfig;
use crate::handlers;
use crate::observability::{self, InFlight, RequestMetrics};
use crate::replica_manager::ReplicaManager;

/// Name of the directory, inside the first log dir, that holds the metadata log.
pub const METADATA_DIR: &str = "__gregor_metadata";

/// Start-up failures, each naming what to fix.
#[derive(Debug, Error)]
pub enum StartError {
    /// A log directory could not be prepared.
    #[error("log directory {path}: {reason}")]
    LogDir {
        /// The directory.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The metadata log or controller failed.
    #[error("metadata: {0}")]
    Metadata(String),
    /// Partition logs failed to load.
    #[error("loading partition logs: {0}")]
    Logs(String),
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// host:port.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// Hands out producer ids from blocks the controller allocates durably.
struct ProducerIdBlock {
    next: i64,
    end: i64,
}

/// Shared state of a running broker.
pub struct Broker {
    /// Configuration.
    pub config: BrokerConfig,
    /// `cluster.id` from `meta.properties`.
    pub cluster_id: String,
    /// The metadata controller (one-voter quorum).
    pub controller: Controller,
    /// Hosted partitions.
    pub replica_manager: ReplicaManager,
    /// Consumer groups and committed offsets (`__consumer_offsets`).
    pub group_coordinator: crate::group_coordinator::GroupCoordinator,
    publish_lock: Mutex<()>,
    producer_ids: Mutex<ProducerIdBlock>,
    /// Bound listener addresses (the real ports when a listener asked for port 0).
    pub bound: Vec<SocketAddr>,
    started: Instant,
}

impl Broker {
    /// Applies the controller's latest image to the hosted partitions. Called after every
    /// metadata change (and, with Raft, whenever a committed record arrives).
    ///
    /// # Errors
    /// A log error while creating or deleting partition logs.
    pub fn publish_metadata(&self) -> Result<(), gregor_log::LogError> {
        let _g = self.publish_lock.lock();
        self.replica_manager.apply_image(&self.controller.image())
    }

    /// A fresh producer id (InitProducerId). Ids come from durable blocks of 1000, so they are
    /// never reused across restarts.
    ///
    /// # Errors
    /// The controller's error when a new block cannot be allocated.
    pub fn next_producer_id(&self) -> Result<i64, gregor_metadata::ControllerError> {
        let mut b = self.producer_ids.lock();
        if b.next >= b.end {
            let start = self.controller.allocate_producer_ids(self.config.node_id)?;
            b.next = start;
            b.end = start + gregor_metadata::controller::PRODUCER_ID_BLOCK_SIZE;
        }
        let id = b.next;
        b.next += 1;
        Ok(id)
    }

    /// Seconds since start-up.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
}

/// Reads `meta.properties` of `dir`, or writes a new one (gregor formats storage on first
/// start, as `kafka-storage format` would). Returns the cluster id.
fn ensure_meta_properties(
    dir: &Path,
    node_id: i32,
    cluster_id: Option<&str>,
) -> Result<String, StartError> {
    let err = |reason: String| StartError::LogDir {
        path: dir.to_path_buf(),
        reason,
    };
    std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create: {e}")))?;
    let path = dir.join("meta.properties");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let props: BTreeMap<&str, &str> = text
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.trim(), v.trim()))
                .collect();
            let found_node = props.get("node.id").and_then(|v| v.parse::<i32>().ok());
            if found_node != Some(node_id) {
                return Err(err(format!(
                    "meta.properties has node.id={}, but this broker is node.id={node_id}; point log.dirs at this node's own data",
                    props.get("node.id").unwrap_or(&"<missing>")
                )));
            }
            let id = props
                .get("cluster.id")
                .ok_or_else(|| err("meta.properties has no cluster.id".into()))?
                .to_string();
            if let Some(expected) = cluster_id {
                if expected != id {
                    return Err(err(format!(
                        "meta.properties has cluster.id={id}, but another log dir has {expected}"
                    )));
                }
            }
            Ok(id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = cluster_id.map_or_else(new_cluster_id, str::to_string);
            let directory_id = base64_url(uuid::Uuid::new_v4().as_bytes());
            let text = format!(
                "#\n#Written by gregor\nnode.id={node_id}\ndirectory.id={directory_id}\nversion=1\ncluster.id={id}\n"
            );
            let tmp = dir.join("meta.properties.tmp");
            std::fs::write(&tmp, text)
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(|e| err(format!("cannot write meta.properties: {e}")))?;
            Ok(id)
        }
        Err(e) => Err(err(format!("cannot read meta.properties: {e}"))),
    }
}

fn new_cluster_id() -> String {
    base64_url(uuid::Uuid::new_v4().as_bytes())
}

/// URL-safe base64 without padding, as Kafka prints UUIDs (`Uuid.toString`).
pub fn base64_url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// A running broker: its shared state and the handle to stop it.
pub struct RunningBroker {
    /// Shared state.
    pub broker: Arc<Broker>,
    /// Address of the admin HTTP listener, if enabled.
    pub admin_addr: Option<SocketAddr>,
    admin: Arc<observability::AdminState>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningBroker {
    /// Stops accepting, lets connections finish their current request, flushes and closes
    /// every log and writes the clean-shutdown marker.
    ///
    /// # Errors
    /// The log manager's error when a log cannot be closed cleanly (the next start recovers it).
    pub async fn shutdown(self) -> Result<(), gregor_log::LogError> {
        self.admin.set_ready(false);
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        let broker = self.broker.clone();
        tokio::task::spawn_blocking(move || broker.replica_manager.logs().shutdown())
            .await
            .unwrap_or_else(|e| {
                Err(gregor_log::LogError::Io {
                    context: format!("shutdown task failed: {e}"),
                    source: std::io::Error::other("join error"),
                })
            })
    }
}

/// Starts a broker: formats or checks storage, loads metadata and logs, binds the listeners.
///
/// # Errors
/// [`StartError`] naming the directory, file or address at fault.
pub async fn start(config: BrokerConfig) -> Result<RunningBroker, StartError> {
    // With the admin listener off nothing could read the metrics, so no recorder is installed
    // and every metric call is a no-op.
    if config.admin_listener.is_some() {
        observability::handle();
    }
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    // The admin listener comes up first, so /health answers and /ready says "not ready" while
    // logs load.
    let admin = Arc::new(observability::AdminState::default());
    admin.set_ready(false);
    let mut admin_addr = None;
    if let Some(addr) = &config.admin_listener {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind {
                addr: format!("{addr} (admin.listener)"),
                source,
            })?;
        admin_addr = listener.local_addr().ok();
        info!(addr = %addr, "admin listener: /metrics, /health, /ready");
        tasks.push(tokio::spawn(observability::serve_admin(
            listener,
            admin.clone(),
            shutdown_rx.clone(),
        )));
    }
    // Test hook: hold start-up here so tests can observe /ready before the logs are loaded.
    if let Some(ms) = std::env::var("GREGOR_TEST_STARTUP_DELAY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let mut cluster_id: Option<String> = None;
    for dir in &config.log_dirs {
        let id = ensure_meta_properties(dir, config.node_id, cluster_id.as_deref())?;
        cluster_id = Some(id);
    }
    let cluster_id = cluster_id.ok_or_else(|| StartError::LogDir {
        path: PathBuf::new(),
        reason: "no log.dirs configured".into(),
    })?;
    let metadata_dir = config.log_dirs[0].join(METADATA_DIR);
    let metadata_log =
        FileMetadataLog::open(&metadata_dir).map_err(|e| StartError::Metadata(e.to_string()))?;
    let controller = Controller::open(Box::new(metadata_log))
        .map_err(|e| StartError::Metadata(e.to_string()))?;

    let mut listeners = Vec::new();
    let mut bound = Vec::new();
    for l in &config.listeners {
        let addr = format!("{}:{}", l.host, l.port);
        let listener = TcpListener::bind(&addr)
            .await
            .map_err(|source| StartError::Bind {
                addr: addr.clone(),
                source,
            })?;
        let local = listener.local_addr().map_err(|source| StartError::Bind {
            addr: addr.clone(),
            source,
        })?;
        bound.push(local);
        listeners.push(listener);
    }
    let advertised = &config.advertised_listeners[0];
    let advertised_port = if advertised.port == 0 {
        bound[0].port()
    } else {
        advertised.port
    };
    controller
        .register_broker(
            config.node_id,
            &advertised.host,
            advertised_port,
            config.rack.clone(),
        )
        .map_err(|e| StartError::Metadata(e.to_string()))?;

    let load_started = Instant::now();
    let log_dirs = config.log_dirs.clone();
    let defaults = crate::config::TopicConfigs::resolve(&config, &BTreeMap::new()).log_config();
    let (logs, loaded) = tokio::task::spawn_blocking(move || LogManager::open(&log_dirs, defaults))
        .await
        .map_err(|e| StartError::Logs(e.to_string()))?
        .map_err(|e| StartError::Logs(e.to_string()))?;
    info!(
        partitions = loaded.len(),
        elapsed_ms = load_started.elapsed().as_millis() as u64,
        "loaded partition logs"
    );
    let broker = Arc::new(Broker {
        replica_manager: ReplicaManager::new(config.node_id, config.clone(), logs),
        group_coordinator: crate::group_coordinator::GroupCoordinator::new(config.groups.clone()),
        config,
        cluster_id,
        controller,
        publish_lock: Mutex::new(()),
        producer_ids: Mutex::new(ProducerIdBlock { next: 0, end: 0 }),
        bound: bound.clone(),
        started: Instant::now(),
    });
    broker
        .publish_metadata()
        .map_err(|e| StartError::Logs(e.to_string()))?;
    // Logs left on disk for partitions the metadata no longer has (a crash between a topic
    // deletion and the removal of its files) are removed now.
    for log in loaded {
        let Some(tp) = log
            .dir()
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(gregor_log::TopicPartition::parse_dir_name)
        else {
            continue;
        };
        if broker
            .replica_manager
            .partition(&tp.topic, tp.partition)
            .is_none()
        {
            warn!(topic = %tp.topic, partition = tp.partition, "deleting log of a partition the metadata does not have");
            if let Err(e) = broker.replica_manager.logs().delete(&tp) {
                warn!(error = %e, "could not delete stray log");
            }
        }
    }

    // Groups and committed offsets are rebuilt before clients can ask for them.
    broker.group_coordinator.load(&broker);
    tasks.push(tokio::spawn(
        crate::group_coordinator::offsets_retention_task(broker.clone(), shutdown_rx.clone()),
    ));
    for (listener, addr) in listeners.into_iter().zip(bound.iter()) {
        info!(%addr, "listening for Kafka clients");
        tasks.push(tokio::spawn(accept_loop(
            broker.clone(),
            listener,
            shutdown_rx.clone(),
        )));
    }
    tasks.push(tokio::spawn(flush_scheduler(
        broker.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(retention_scheduler(
        broker.clone(),
        shutdown_rx.clone(),
    )));
    if broker.config.log_cleaner_enable() {
        let threads = broker
            .config
            .log_cleaner_threads(&broker.replica_manager.dynamic_configs());
        for thread in 0..threads {
            tasks.push(tokio::spawn(log_cleaner_thread(
                broker.clone(),
                thread,
                shutdown_rx.clone(),
            )));
        }
    }
    admin.attach(broker.clone());
    admin.set_ready(true);
    Ok(RunningBroker {
        broker,
        admin_addr,
        admin,
        shutdown: shutdown_tx,
        tasks,
    })
}

async fn flush_scheduler(broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) {
    let period = Duration::from_millis(broker.config.log_flush_scheduler_interval_ms);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        let b = broker.clone();
        let _ = broker
            .replica_manager
            .io_pool()
            .run(move || {
                let rm = &b.replica_manager;
                rm.logs().flush_if_due(rm.now_ms());
            })
            .await;
    }
}

/// Kafka's `kafka-log-retention` task: every `log.retention.check.interval.ms` deletes
/// segments past retention or below the log start offset
/// ([`ReplicaManager::run_retention`]); in between it wakes only when a `.deleted` file's
/// `file.delete.delay.ms` expires, to remove it (Kafka schedules one delete task per segment).
async fn retention_scheduler(broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) {
    let check_ms = broker.config.log_retention_check_interval_ms();
    let mut next_check_ms = broker.replica_manager.now_ms() + check_ms as i64;
    let mut next_delete_ms: Option<i64> = None;
    loop {
        let now = broker.replica_manager.now_ms();
        let wake_ms = next_delete_ms.map_or(next_check_ms, |d| d.min(next_check_ms));
        let sleep = Duration::from_millis(wake_ms.saturating_sub(now).max(0) as u64);
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = shutdown.changed() => return,
        }
        let now = broker.replica_manager.now_ms();
        let run_check = now >= next_check_ms;
        if run_check {
            next_check_ms = now + check_ms as i64;
        }
        let b = broker.clone();
        next_delete_ms = broker
            .replica_manager
            .io_pool()
            .run(move || {
                if run_check {
                    b.replica_manager.run_retention(now);
                }
                b.replica_manager.logs().delete_due_files(now)
            })
            .await
            .unwrap_or(None);
    }
}

/// One of `log.cleaner.threads` cleaner threads (Kafka's `CleanerThread`): cleans the
/// filthiest compacted log (bounded by its high watermark), checkpoints the cleaner offsets,
/// and sleeps `log.cleaner.backoff.ms` when no log needs cleaning. Cleaner settings are read
/// each round, so dynamic broker config changes apply. It runs on a blocking thread of its own,
/// not on the I/O pool: one cleaning pass can take minutes and would hold an I/O thread.
async fn log_cleaner_thread(
    broker: Arc<Broker>,
    thread: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let b = broker.clone();
        let cleaned = tokio::task::spawn_blocking(move || {
            let rm = &b.replica_manager;
            let dynamic = rm.dynamic_configs();
            let cleaner = gregor_log::LogCleaner::new(b.config.cleaner_config(&dynamic));
            let logs: Vec<_> = rm
                .partitions()
                .into_iter()
                .filter(|p| p.log.config().cleanup_compact)
                .map(|p| (p.log.clone(), p.high_watermark()))
                .collect();
            match cleaner.clean_filthiest(&logs, rm.now_ms()) {
                Ok(Some((log, _stats))) => {
                    if let Err(e) = rm.logs().checkpoint_cleaner_offsets() {
                        error!(error = %e, "writing cleaner-offset-checkpoint failed");
                    }
                    debug!(thread, partition = %log.topic_partition(), "cleaned");
                    true
                }
                Ok(None) => false,
                Err(e) => {
                    error!(thread, error = %e, "log cleaning failed; will retry after the backoff");
                    false
                }
            }
        })
        .await
        .unwrap_or(false);
        if cleaned {
            if *shutdown.borrow() {
                return;
            }
            continue;
        }
        let backoff = broker
            .config
            .log_cleaner_backoff_ms(&broker.replica_manager.dynamic_configs());
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(backoff)) => {}
            _ = shutdown.changed() => return,
        }
    }
}

async fn accept_loop(
    broker: Arc<Broker>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                let b = broker.clone();
                let rx = shutdown.clone();
                tokio::spawn(async move {
                    serve_connection(b, stream, peer, rx).await;
                });
            }
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

tokio::task_local! {
    /// The peer address of the connection whose request is being handled (the "client host"
    /// that DescribeGroups reports). Set only around a handler's immediate part.
    pub static CLIENT_HOST: std::net::IpAddr;
}

/// A response in the making: ready now, or computed by a deferred task.
pub enum Handled {
    /// The encoded response, or None when the request gets no response (acks=0).
    Ready(Option<Bytes>),
    /// A response that waits for something (high watermark, new data).
    Deferred(Pin<Box<dyn Future<Output = Option<Bytes>> + Send>>),
    /// No response, and the connection is closed after the responses before it are sent. Kafka
    /// does this for an acks=0 produce that failed, so the producer notices and refreshes its
    /// metadata.
    CloseConnection,
}

enum Slot {
    Ready(Option<Bytes>, Option<Arc<RequestMetrics>>),
    Pending(
        tokio::task::JoinHandle<Option<Bytes>>,
        Option<Arc<RequestMetrics>>,
    ),
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

async fn serve_connection(
    broker: Arc<Broker>,
    stream: TcpStream,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) {
    debug!(%peer, "connection opened");
    metrics::counter!(observability::CONNECTIONS_OPENED_TOTAL).increment(1);
    let _active = InFlight::new(observability::CONNECTIONS_ACTIVE);
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Slot>(broker.config.queued_max_requests);
    let writer = tokio::spawn(async move {
        while let Some(slot) = rx.recv().await {
            let (out, m) = match slot {
                Slot::Ready(b, m) => (b, m),
                Slot::Pending(h, m) => match h.await {
                    Ok(b) => (b, m),
                    Err(e) => {
                        error!(error = %e, "request task failed; closing connection");
                        return;
                    }
                },
            };
            if let Some(bytes) = out {
                let started = Instant::now();
                if wr.write_all(&bytes).await.is_err() {
                    return;
                }
                if let Some(m) = m {
                    m.send.record(started.elapsed().as_secs_f64());
                }
            }
        }
    });
    let max = broker.config.socket_request_max_bytes;
    loop {
        let mut prefix = [0u8; 4];
        let read = tokio::select! {
            r = rd.read_exact(&mut prefix) => r,
            _ = shutdown.changed() => break,
        };
        if read.is_err() {
            break;
        }
        let size = frame::frame_size(prefix);
        if size < 0 || size as usize > max {
            warn!(%peer, size, "request size {size} is outside 0..=socket.request.max.bytes ({max}); closing connection");
            break;
        }
        let mut buf = BytesMut::zeroed(size as usize);
        if rd.read_exact(&mut buf).await.is_err() {
            break;
        }
        let received = Instant::now();
        let slot = match frame::decode_request(buf.freeze(), &handlers::supported_versions) {
            Ok(DecodedRequest::Request {
                header,
                api_key,
                body,
            }) => {
                let span = tracing::debug_span!(
                    "request",
                    api_key = ?api_key,
                    api_version = header.request_api_version,
                    correlation_id = header.correlation_id,
                    client_id = header.client_id.as_deref().unwrap_or(""),
                );
                let m = observability::request_metrics(api_key, header.request_api_version);
                m.requests.increment(1);
                let started = Instant::now();
                m.queue
                    .record(started.duration_since(received).as_secs_f64());
                let handled = CLIENT_HOST
                    .scope(
                        peer.ip(),
                        handlers::handle(&broker, &header, api_key, *body),
                    )
                    .instrument(span.clone())
                    .await;
                m.processing.record(started.elapsed().as_secs_f64());
                match handled {
                    Handled::CloseConnection => {
                        debug!(%peer, "closing connection after a failed acks=0 produce");
                        break;
                    }
                    Handled::Ready(b) => {
                        span.in_scope(|| {
                            debug!(
                                duration_us = started.elapsed().as_micros() as u64,
                                "handled"
                            )
                        });
                        Slot::Ready(b, Some(m))
                    }
                    Handled::Deferred(fut) => {
                        let m2 = m.clone();
                        Slot::Pending(
                            tokio::spawn(
                                async move {
                                    let waited = Instant::now();
                                    let out = fut.await;
                                    m2.remote.record(waited.elapsed().as_secs_f64());
                                    debug!(
                                        duration_us = started.elapsed().as_micros() as u64,
                                        "handled"
                                    );
                                    out
                                }
                                .instrument(span),
                            ),
                            Some(m),
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
                    handlers::api_versions::unsupported_version_response(correlation_id),
                    None,
                )
            }
            Ok(DecodedRequest::UnsupportedVersion {
                api_key,
                version,
                correlation_id,
            }) => {
                warn!(%peer, ?api_key, version, correlation_id, "unsupported request version; closing connection (as Kafka does)");
                break;
            }
            Err(e) => {
                warn!(%peer, error = %e, "malformed request; closing connection");
                break;
            }
        };
        if tx.send(slot).await.is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
    debug!(%peer, "connection closed");
}
