//! The broker process: start-up (storage, metadata, logs, listeners), the background
//! schedulers (flush, retention, cleaner), shutdown. Connections are `gregor-network`'s
//! [`SocketServer`]; requests reach [`crate::handlers::KafkaApis`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gregor_log::LogManager;

use gregor_network::{SocketServer, SocketServerConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::authorizer::AllowEverythingAuthorizer;
use crate::config::BrokerConfig;
use crate::handlers::KafkaApis;
use crate::observability;
use crate::replica_manager::ReplicaManager;
use crate::storage;

use crate::broker::Broker;
pub use crate::start_error::StartError;

/// Name of the directory, inside the first log dir, that held the pre-KRaft metadata log
/// (migrated into `__cluster_metadata-0` at the first start, see
/// [`crate::metadata_publisher::migrate_file_log`]).
pub const METADATA_DIR: &str = "__gregor_metadata";

/// Checks and prepares the node's storage, as a Kafka node does at start-up: the
/// `meta.properties` of every log dir and of `metadata.log.dir` must agree on the cluster id
/// and carry this node's `node.id`; dirs without one (added to `log.dirs` later) get one with
/// the cluster's id and a new directory id. When no dir is formatted yet, gregor formats them
/// itself, as `gregor storage format` would for a one-node static quorum (a new cluster id,
/// `metadata.version` 4.4-IV2 and the bootstrap snapshot): that is what keeps `gregor serve`
/// with no configuration working.
///
/// A log dir whose `meta.properties` cannot be read or written for an I/O error (the dir is
/// a file, read-only, EIO) is left out and returned with the cause, to be started offline as
/// Kafka does (KIP-112), unless it is the metadata log dir or every log dir failed: then the
/// start fails, as Kafka's does. Returns the cluster id and the failed dirs.
fn ensure_storage(
    config: &BrokerConfig,
) -> Result<(String, BTreeMap<PathBuf, String>), StartError> {
    let to_start_error = |e: storage::StorageError| match e {
        storage::StorageError::Io { ref path, .. } => StartError::LogDir {
            path: path.clone(),
            reason: e.to_string(),
        },
        storage::StorageError::Invalid(reason) => StartError::Storage(reason),
    };
    let metadata_log_dir = metadata_log_dir(config);
    let mut dirs: BTreeSet<PathBuf> = config.log_dirs.iter().cloned().collect();
    dirs.insert(metadata_log_dir.clone());
    let (formatted, failed) =
        storage::load_ensemble(&dirs, None, config.node_id).map_err(to_start_error)?;
    let mut failed: BTreeMap<PathBuf, String> = failed
        .into_iter()
        .map(|(d, e)| (d, e.to_string()))
        .collect();
    let check_failed = |failed: &BTreeMap<PathBuf, String>| {
        if let Some(reason) = failed.get(&metadata_log_dir) {
            return Err(StartError::LogDir {
                path: metadata_log_dir.clone(),
                reason: format!(
                    "the metadata log dir failed ({reason}); a broker cannot start without it \
                     (set metadata.log.dir to a healthy dir only with the cluster's metadata \
                     log copied there)"
                ),
            });
        }
        if config.log_dirs.iter().all(|d| failed.contains_key(d)) {
            return Err(StartError::LogDir {
                path: config.log_dirs[0].clone(),
                reason: format!(
                    "every log dir failed: {}",
                    failed.values().cloned().collect::<Vec<_>>().join("; ")
                ),
            });
        }
        Ok(())
    };
    check_failed(&failed)?;
    let Some(existing) = formatted.values().next() else {
        if let Some((dir, reason)) = failed.iter().next() {
            return Err(StartError::LogDir {
                path: dir.clone(),
                reason: reason.clone(),
            });
        }
        let q = &config.quorum;
        // Only a one-node cluster (this node its own quorum's only voter) formats itself on
        // first start. A node of a larger cluster must join that cluster's id: Kafka refuses
        // to start without meta.properties, and so does gregor.
        let voters: Vec<i32> = q.voters.ids().collect();
        // A dynamic quorum (KIP-853: controller.quorum.bootstrap.servers, no voters listed),
        // as in Kafka 4's own server.properties: which controllers start the quorum is the
        // operator's choice at format time (`--standalone` or `--initial-controllers`), and a
        // guess would let each node of a multi-controller quorum found a cluster of its own.
        // Kafka refuses to start unformatted; so does gregor, before writing anything.
        let set = |k: &str| config.raw.get(k).is_some_and(|v| !v.trim().is_empty());
        if set("controller.quorum.bootstrap.servers") && !set("controller.quorum.voters") {
            return Err(StartError::Storage(format!(
                "no meta.properties in {}: this node's quorum is dynamic \
                 (controller.quorum.bootstrap.servers, no controller.quorum.voters), so its \
                 storage must be formatted first, as with Kafka: for a one-node cluster \
                 `gregor storage format -t $(gregor storage random-uuid) -c <config> \
                 --standalone`; for several controllers `--initial-controllers` on each \
                 controller and `--no-initial-controllers` on brokers (README: Formatting \
                 storage). Or list the voters in controller.quorum.voters, and a one-node \
                 cluster formats itself",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if !(q.controller && voters == [config.node_id]) {
            return Err(StartError::Storage(format!(
                "no meta.properties in {}: this node (node.id {}, voters {voters:?}) is part of a \
                 larger cluster, so format its storage with that cluster's id first (`gregor \
                 storage format -t <cluster id> -c <config>` or kafka-storage format); only a \
                 one-node cluster formats itself on first start",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                config.node_id
            )));
        }
        let cluster_id = storage::random_cluster_id();
        let cfg = storage::StorageConfig {
            node_id: config.node_id,
            broker: q.broker,
            controller: q.controller,
            static_voters: q.voters.ids().collect(),
            controller_listener_names: if q.controller_listener_names.is_empty() {
                vec!["CONTROLLER".into()]
            } else {
                q.controller_listener_names.clone()
            },
            controller_endpoints: Vec::new(),
            log_dirs: config.log_dirs.clone(),
            metadata_log_dir,
            unstable_feature_versions: false,
        };
        let opts = storage::FormatOptions {
            cluster_id: cluster_id.clone(),
            ..storage::FormatOptions::default()
        };
        let report = storage::format(&cfg, &opts).map_err(to_start_error)?;
        for line in &report.lines {
            info!("{line}");
        }
        info!(cluster_id = %cluster_id, "formatted new storage (use `gregor storage format` to choose the cluster id and quorum)");
        return Ok((cluster_id, failed));
    };
    let cluster_id = existing.cluster_id.clone();
    let mut taken: BTreeSet<uuid::Uuid> =
        formatted.values().filter_map(|p| p.directory_id).collect();
    let unformatted: Vec<PathBuf> = dirs
        .iter()
        .filter(|d| !formatted.contains_key(*d) && !failed.contains_key(*d))
        .cloned()
        .collect();
    for dir in &unformatted {
        let directory_id = loop {
            let id = storage::random_uuid();
            if taken.insert(id) {
                break id;
            }
        };
        let written = std::fs::create_dir_all(dir)
            .map_err(|source| storage::StorageError::Io {
                context: "creating",
                path: dir.clone(),
                source,
            })
            .and_then(|()| {
                storage::write_meta_properties(
                    dir,
                    &storage::MetaProperties {
                        cluster_id: cluster_id.clone(),
                        node_id: config.node_id,
                        directory_id: Some(directory_id),
                    },
                )
            });
        match written {
            Ok(()) => info!(dir = %dir.display(), "wrote meta.properties in a new log dir"),
            Err(e @ storage::StorageError::Io { .. }) => {
                failed.insert(dir.clone(), e.to_string());
                check_failed(&failed)?;
            }
            Err(e) => return Err(to_start_error(e)),
        }
    }
    Ok((cluster_id, failed))
}

/// `metadata.log.dir`, default the first of `log.dirs` (Kafka's `metadataLogDir`).
pub fn metadata_log_dir(config: &BrokerConfig) -> PathBuf {
    config
        .raw
        .get("metadata.log.dir")
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map_or_else(|| config.log_dirs[0].clone(), PathBuf::from)
}

/// URL-safe base64 without padding, as Kafka prints UUIDs (`Uuid.toString`).
pub fn base64_url(bytes: &[u8]) -> String {
    storage::base64_url(bytes)
}

/// A running broker: its shared state and the handle to stop it.
pub struct RunningBroker {
    /// Shared state.
    pub broker: Arc<Broker>,
    /// Address of the admin HTTP listener, if enabled.
    pub admin_addr: Option<SocketAddr>,
    admin: Arc<crate::admin::AdminState>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// This broker's registration with the active controller; None on a node without the
    /// broker role (`process.roles=controller`), which never registers as a broker.
    lifecycle: Option<crate::lifecycle::BrokerLifecycle>,
    /// The `.lock` of a `metadata.log.dir` outside `log.dirs` (those the log manager locks).
    _metadata_dir_lock: Option<gregor_log::DirLock>,
}

impl RunningBroker {
    /// Resolves when this node's metadata quorum member stopped on a storage error at run
    /// time (writing `quorum-state` or flushing `__cluster_metadata-0` failed: a full or
    /// failing `metadata.log.dir`), with the reason. The node can no longer follow or change
    /// the metadata; Kafka halts the process then, and the caller should exit too (the logs
    /// recover at the next start). Never resolves otherwise.
    pub async fn metadata_quorum_failed(&self) -> String {
        match self.broker.raft.get() {
            Some(raft) => raft.stopped_on_failure().await,
            None => std::future::pending().await,
        }
    }

    /// Stops accepting, lets connections finish their current request, flushes and closes
    /// every log and writes the clean-shutdown marker.
    ///
    /// # Errors
    /// The log manager's error when a log cannot be closed cleanly (the next start recovers it).
    pub async fn shutdown(self) -> Result<(), gregor_log::LogError> {
        self.admin.set_ready(false);
        // Leadership moves away (and this broker is fenced) before anything stops.
        if let Some(lifecycle) = self.lifecycle {
            lifecycle.controlled_shutdown().await;
        }
        // Fetchers stop (closing their connections) before the logs close; the high
        // watermarks are checkpointed after the last follower append.
        if let Some(fetchers) = self.broker.replica_fetchers.get() {
            fetchers.shutdown().await;
        }
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        let broker = self.broker.clone();
        tokio::task::spawn_blocking(move || {
            let rm = &broker.replica_manager;
            let fetchers = broker.replica_fetchers.get().map(Arc::as_ref);
            if let Err(e) = crate::replica_fetcher::checkpoint_high_watermarks(rm, fetchers) {
                warn!(error = %e, "writing replication-offset-checkpoint at shutdown failed");
            }
            rm.logs().shutdown()
        })
        .await
        .unwrap_or_else(|e| {
            Err(gregor_log::LogError::Io {
                context: format!("shutdown task failed: {e}"),
                source: std::io::Error::other("join error"),
            })
        })
    }
}

/// Descriptors the connection limit leaves free beside the segment file budget, for
/// everything that is neither (the metadata log, checkpoint and snapshot files being written,
/// listeners, sockets to other nodes, descriptors of evicted segment files a read still holds):
/// 1/16 of the open-file limit, at least [`MIN_DESCRIPTOR_RESERVE`]. A single node holds about
/// 16 such descriptors when idle.
const DESCRIPTOR_RESERVE_FRACTION: u64 = 16;
/// The smallest descriptor reserve.
const MIN_DESCRIPTOR_RESERVE: u64 = 32;
/// Client connections allowed whatever the open-file limit, so that a broker with a tiny
/// limit still serves some clients (the reserve is then not guaranteed).
const MIN_CONNECTIONS_BY_DESCRIPTORS: u64 = 8;

/// How many connections (across every listener; each holds one descriptor) fit in the
/// open-file limit `soft` beside the segment file budget `budget` (in files) and the reserve
/// ([`DESCRIPTOR_RESERVE_FRACTION`]), at least [`MIN_CONNECTIONS_BY_DESCRIPTORS`]. With 1,024
/// descriptors: 1,024 - 512 - 64 = 448 connections.
fn max_connections_by_descriptors(soft: u64, budget: usize) -> usize {
    let reserve = (soft / DESCRIPTOR_RESERVE_FRACTION).max(MIN_DESCRIPTOR_RESERVE);
    let budget = u64::try_from(budget).unwrap_or(u64::MAX);
    let n = soft
        .saturating_sub(budget)
        .saturating_sub(reserve)
        .max(MIN_CONNECTIONS_BY_DESCRIPTORS);
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Starts a broker: formats or checks storage, loads metadata and logs, binds the listeners.
///
/// # Errors
/// [`StartError`] naming the directory, file or address at fault.
pub async fn start(config: BrokerConfig) -> Result<RunningBroker, StartError> {
    let authorizer: Arc<dyn crate::authorizer::Authorizer> =
        match config.authorizer_class_name.as_deref() {
            // `BrokerConfig::from_properties` lets no other class name through.
            Some(_) => Arc::new(crate::standard_authorizer::StandardAuthorizer::new(
                &config.super_users,
                config.allow_everyone_if_no_acl_found,
            )),
            None => Arc::new(AllowEverythingAuthorizer),
        };
    start_with_authorizer(config, authorizer).await
}

/// [`start`] with an [`Authorizer`](crate::authorizer::Authorizer) other than allow-everything.
///
/// # Errors
/// [`StartError`] naming the directory, file or address at fault.
pub async fn start_with_authorizer(
    config: BrokerConfig,
    authorizer: Arc<dyn crate::authorizer::Authorizer>,
) -> Result<RunningBroker, StartError> {
    // With the admin listener off nothing could read the metrics, so no recorder is installed
    // and every metric call is a no-op.
    if config.admin_listener.is_some() {
        observability::handle();
    }
    let limit = gregor_log::files::size_from_process_limit();
    // Test hook: without the reserve, idle connections can take every descriptor, so that a
    // test can make an append meet EMFILE.
    let connections_by_descriptors = std::env::var_os("GREGOR_TEST_NO_DESCRIPTOR_RESERVE")
        .is_none()
        .then(|| max_connections_by_descriptors(limit.soft, limit.budget));
    if limit.soft < LOW_OPEN_FILE_LIMIT {
        warn!(
            open_file_limit = limit.soft,
            "the open-file limit is low: the metadata log, segment files and connections share \
             it, and below about 64 the broker cannot work (producers time out, the metadata \
             log cannot reopen its segment); raise it (ulimit -n, or LimitNOFILE in the \
             systemd unit, which sets 1048576)"
        );
    }
    info!(
        open_file_limit = limit.soft,
        raised_from = limit.soft_before,
        segment_files_open_max = limit.budget,
        max_client_connections = ?connections_by_descriptors,
        "open-file limit; segment files beyond the budget are closed until used, and client \
         connections beyond their share of the limit are closed at once"
    );
    gregor_log::index_cache::set_max_bytes(config.log_index_cache_bytes);
    // TLS listeners read their keystores and truststores before anything else starts, so a
    // wrong file stops start-up at once, naming the listener and the key.
    let (mut listener_layers, tls_states) =
        crate::listener_security::transport_layers(&config.raw, config.endpoints())?;
    // gregor's own clients read their truststores and keystores now too: the inter-broker
    // listener's (replica fetchers, transaction markers and verification) and the first
    // controller listener's (raft transport, controller channel).
    let (inter_broker_security, controller_security) = own_client_security(&config)?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    // The admin listener comes up first, so /health answers and /ready says "not ready" while
    // logs load.
    let admin = Arc::new(crate::admin::AdminState::default());
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
        tasks.push(tokio::spawn(crate::admin::serve_admin(
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
    if config.log_dirs.is_empty() {
        return Err(StartError::LogDir {
            path: PathBuf::new(),
            reason: "no log.dirs configured".into(),
        });
    }
    let (cluster_id, mut failed_dirs) = ensure_storage(&config)?;
    let legacy_dir = config.log_dirs[0].join(METADATA_DIR);
    // Kafka's KafkaRaftManager locks a metadata.log.dir that is not one of log.dirs (the log
    // manager locks those), before the metadata log is opened.
    let metadata_dir = metadata_log_dir(&config);
    let same = |a: &Path, b: &Path| {
        a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
    };
    let metadata_dir_lock = if config.log_dirs.iter().any(|d| same(d, &metadata_dir)) {
        None
    } else {
        Some(gregor_log::lock_dir(&metadata_dir).map_err(|e| StartError::Logs(e.to_string()))?)
    };
    // Every log dir is locked now, before the metadata log (in one of them, usually) opens: a
    // second process on the same directories stops here, before it can join the quorum as
    // this node. The log manager holds the locks from then on.
    // A dir that cannot be locked for an I/O error (read-only: the lock file cannot be
    // opened for writing) starts offline, as in Kafka's `LogManager.lockLogDirs`; one that
    // another process holds stops the start.
    let mut dir_locks = Vec::with_capacity(config.log_dirs.len());
    for d in &config.log_dirs {
        if let Some(reason) = failed_dirs.get(d) {
            dir_locks.push(Err(reason.clone()));
            continue;
        }
        match gregor_log::lock_dir(d) {
            Ok(lock) => dir_locks.push(Ok(lock)),
            Err(e @ gregor_log::LogError::Io { .. }) if !same(d, &metadata_dir) => {
                failed_dirs.insert(d.clone(), e.to_string());
                dir_locks.push(Err(e.to_string()));
            }
            Err(e) => return Err(StartError::Logs(e.to_string())),
        }
    }
    if config.log_dirs.iter().all(|d| failed_dirs.contains_key(d)) {
        return Err(StartError::Logs(format!(
            "every log dir failed: {}",
            failed_dirs.values().cloned().collect::<Vec<_>>().join("; ")
        )));
    }
    // Signed OAUTHBEARER tokens (KIP-768): each JWKS is read before any listener serves (the
    // controller listeners serve before the metadata is loaded).
    let (jwks_validators, jwks_tasks) = config
        .sasl
        .start_jwks_validators(&shutdown_rx)
        .await
        .map_err(|e| StartError::Sasl(e.to_string()))?;
    tasks.extend(jwks_tasks);
    if let Some(w) = crate::sasl_config::controller_scram_warning(&config) {
        warn!("{w}");
    }
    for w in config.sasl.unsecured_oauthbearer_warnings() {
        warn!("{w}");
    }
    // SCRAM credentials of the listeners: the metadata image's, once it is loaded (a SASL
    // controller listener serves before; its SCRAM logins fail until then).
    let image_for_scram = Arc::new(std::sync::OnceLock::new());
    let scram_store: Arc<dyn gregor_network::sasl::ScramCredentialStore> = Arc::new(
        crate::sasl_config::LoadedImageScramCredentials(image_for_scram.clone()),
    );
    let sasl_configs = config
        .sasl
        .server_configs_with(&scram_store, &jwks_validators);
    let raft = crate::metadata_publisher::start_quorum_with(
        &config,
        &metadata_log_dir(&config),
        &cluster_id,
        controller_security.clone(),
    )?;
    // Controller listeners are served first (Kafka's ControllerServer): the voters must
    // elect a leader before any node can load its metadata.
    let (controller_endpoints, broker_endpoints): (Vec<_>, Vec<_>) =
        std::mem::take(&mut listener_layers)
            .into_iter()
            .partition(|(e, _)| config.quorum.is_controller_listener(&e.listener_name));
    let tls_publisher = (!tls_states.is_empty()).then(|| {
        Arc::new(crate::listener_security::TlsConfigPublisher::new(
            config.node_id,
            config.raw.clone(),
            &tls_states,
        ))
    });
    tasks.extend(crate::listener_security::start_reloads(
        tls_states,
        &shutdown_rx,
    ));
    let controller_apis = Arc::new(
        crate::controller_server::ControllerApis::new(raft.clone(), cluster_id.clone())
            .with_kraft_version(crate::metadata_publisher::kraft_version(&config))
            .with_authorizer(authorizer.clone()),
    );
    let mut controller_connection_quotas = None;
    if !controller_endpoints.is_empty() {
        let listeners =
            match gregor_network::bind_with_layers(controller_endpoints, &sasl_configs).await {
                Ok(l) => l,
                Err(e) => {
                    raft.shutdown().await;
                    return Err(e.into());
                }
            };
        let server = SocketServer::new(config.socket_server_config(), controller_apis.clone());
        controller_connection_quotas = Some(server.connection_quotas().clone());
        tasks.extend(server.start(listeners, &shutdown_rx));
    }
    let (controller, metadata_log, metadata_tasks) = crate::metadata_publisher::start_metadata(
        raft.clone(),
        &legacy_dir,
        &shutdown_rx,
        controller_config(&config),
    )
    .await?;
    tasks.extend(metadata_tasks);
    // The ACL authorizer is ready (Kafka's `completeInitialLoad`) once the metadata has caught
    // up: before this node registers, so that the other nodes' registrations and heartbeats
    // on its controller listener are decided with the committed ACLs.
    if let Some(acls) = authorizer.clone().metadata_publisher() {
        controller
            .loader()
            .install_publisher(acls)
            .await
            .map_err(|e| StartError::Metadata(e.to_string()))?;
    }
    controller_apis.set_controller(controller.clone());
    let _ = image_for_scram.set(controller.clone());
    // BrokerRegistration, heartbeats, forwarded admin requests: to the active controller.
    let controller_client = Arc::new(
        crate::controller_channel::ControllerClient::new(
            config.node_id,
            controller.clone(),
            metadata_log,
            crate::controller_channel::ChannelTimeouts::from_config(&config),
        )
        .with_security(&controller_security),
    );

    // Listeners with a security protocol gregor does not implement are refused here (and
    // already by the config), never served as plaintext.
    let listeners = gregor_network::bind_with_layers(broker_endpoints, &sasl_configs).await?;
    let bound: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr).collect();
    let bound_ports: Vec<(String, u16)> = listeners
        .iter()
        .map(|l| (l.endpoint.listener_name.clone(), l.local_addr.port()))
        .collect();
    // A controller-only node does not register as a broker: it is never listed in Metadata
    // and no partition is placed on it (Kafka's controller-only `ControllerServer`).
    let lifecycle = if config.quorum.broker {
        Some(
            crate::lifecycle::start(
                &config,
                &controller_client,
                &cluster_id,
                &bound_ports,
                &failed_dirs,
            )
            .await?,
        )
    } else {
        info!("process.roles has no broker role: this node does not register as a broker");
        None
    };

    let load_started = Instant::now();
    let log_dirs = config.log_dirs.clone();
    let defaults = crate::config::TopicConfigs::resolve(&config, &BTreeMap::new()).log_config();
    let recovery_threads = config.num_recovery_threads_per_data_dir();
    let (logs, loaded) = tokio::task::spawn_blocking(move || {
        LogManager::open_with_locks(&log_dirs, dir_locks, defaults, recovery_threads)
    })
    .await
    .map_err(|e| StartError::Logs(e.to_string()))?
    .map_err(|e| StartError::Logs(e.to_string()))?;
    if let Some(lifecycle) = &lifecycle {
        // A clean shutdown records it for the next registration's PreviousBrokerEpoch.
        logs.set_broker_epoch(lifecycle.broker_epoch);
        // Offline log dirs go to the controller in heartbeats (KIP-858).
        lifecycle.report_log_dirs(logs.dir_health().to_vec());
        lifecycle.report_metadata_dir(raft.metadata_dir_health().clone());
        logs.set_dir_ids(
            &lifecycle
                .log_dir_ids()
                .iter()
                .map(|(p, id)| (p.clone(), *id.as_bytes()))
                .collect::<Vec<_>>(),
        );
    }
    info!(
        partitions = loaded.len(),
        elapsed_ms = load_started.elapsed().as_millis() as u64,
        "loaded partition logs"
    );
    let replica_manager = ReplicaManager::new(config.node_id, config.clone(), logs);
    let clock = replica_manager.clock().clone();
    let broker = Broker::new(
        config.clone(),
        cluster_id,
        controller,
        replica_manager,
        bound,
        authorizer,
        |weak| {
            (
                crate::group_coordinator::GroupCoordinator::new(
                    config.groups.clone(),
                    crate::coordinator_writer::BrokerPartitionWriter::new(weak.clone()),
                    crate::coordinator_writer::BrokerTopicMetadata::new(weak.clone()),
                    clock.clone(),
                ),
                gregor_coordinator::transaction::TransactionCoordinator::new(
                    config.transactions.clone(),
                    crate::coordinator_writer::BrokerPartitionWriter::new(weak.clone()),
                    crate::coordinator_writer::BrokerTransactionServices::new(weak.clone()),
                    clock.clone(),
                ),
            )
        },
    );
    let _ = broker.raft.set(raft);
    let _ = broker.controller_client.set(controller_client.clone());
    let _ = broker
        .inter_broker_client
        .set(inter_broker_security.clone());
    // Markers written to `__consumer_offsets` complete the group coordinator's pending
    // transactional offsets (issue 12).
    broker.set_txn_offsets_completion(crate::coordinator_writer::GroupTxnOffsetsCompletion::new(
        Arc::downgrade(&broker),
    ));
    // KIP-890: a leader verifies a producer's first transactional write to a partition with
    // the transaction coordinator (AddPartitionsToTxn v5 on the inter-broker listener).
    {
        let controller = broker.controller.clone();
        broker.replica_manager.set_txn_verifier(Arc::new(
            crate::txn_verification::NetworkAddPartitionsToTxnSender::new(
                Arc::new(move || controller.image()),
                config.inter_broker_listener_name(),
                format!("broker-{}-txn-verification", config.node_id),
                config.request_timeout_ms(),
            )
            .with_security(inter_broker_security.clone()),
        ));
    }
    // ISR changes of the partitions led here go to the active controller (AlterPartition),
    // and the ISR-expiration task proposes shrinks (replication, issue 11).
    {
        let weak = Arc::downgrade(&broker);
        let (manager, task) = crate::alter_partition::start(
            config.node_id,
            Arc::new(move || {
                weak.upgrade().map_or(-1, |b| {
                    b.broker_epoch.load(std::sync::atomic::Ordering::Relaxed)
                })
            }),
            Arc::new(crate::alter_partition::ControllerAlterPartition(
                controller_client.clone(),
            )),
            Duration::from_millis(crate::alter_partition::DEFAULT_RETRY_BACKOFF_MS),
            shutdown_rx.clone(),
        );
        broker
            .replica_manager
            .replication()
            .set_alter_partition_sender(manager);
        tasks.push(task);
        let (b, shutdown) = (broker.clone(), shutdown_rx.clone());
        tasks.push(tokio::spawn(async move {
            b.replica_manager.run_isr_expiration(shutdown).await;
        }));
    }
    if let Some(lifecycle) = &lifecycle {
        broker
            .broker_epoch
            .store(lifecycle.broker_epoch, std::sync::atomic::Ordering::Relaxed);
    }
    // A replica assigned to a directory this broker does not have is not created (KIP-858).
    // While a dir failed at start-up its id may be unknown (its meta.properties unreadable):
    // its replicas are then refused as those of a failed dir (`LogManager::get_or_create_in`),
    // not reported as in a missing one.
    let any_dir_failed = broker
        .replica_manager
        .logs()
        .offline_dirs()
        .iter()
        .any(|(_, state)| matches!(state, gregor_log::DirState::Failed { .. }));
    if let Some(lifecycle) = lifecycle.as_ref().filter(|_| !any_dir_failed) {
        broker
            .replica_manager
            .set_log_dir_ids(lifecycle.log_dir_ids().iter().map(|(_, id)| *id).collect());
    }
    // Which log directory holds each replica goes to the active controller
    // (AssignReplicasToDirs, KIP-858), before the publishers apply the first image.
    if let Some(lifecycle) = &lifecycle {
        let manager = Arc::new(crate::assignments::AssignmentsManager::new(
            config.node_id,
            lifecycle.log_dir_ids().to_vec(),
        ));
        let controller = broker.controller.clone();
        tasks.push(crate::assignments::start(
            manager.clone(),
            Arc::new(move || controller.image()),
            Arc::new(crate::assignments::ControllerAssignments(
                controller_client.clone(),
            )),
            crate::assignments::Backoff::default(),
            shutdown_rx.clone(),
        ));
        let _ = broker.assignments.set(manager);
    }
    // Partitions led elsewhere are fetched from their leaders (issue 11); a node without the
    // broker role hosts no partition.
    if let Some(lifecycle) = &lifecycle {
        let rm = &broker.replica_manager;
        let mut fetcher_config = crate::replica_fetcher::FetcherConfig::from_broker(&broker.config);
        fetcher_config.security = inter_broker_security.clone();
        let fetchers = Arc::new(crate::replica_fetcher::ReplicaFetcherManager::new(
            fetcher_config,
            lifecycle.broker_epoch,
            rm.io_pool().clone(),
            rm.clock().clone(),
            rm.replication_quotas().clone(),
        ));
        let _ = broker.replica_fetchers.set(fetchers.clone());
        rm.set_fetchers(fetchers);
    }
    // From here on every committed metadata batch reaches the partitions.
    crate::metadata_publisher::install_publishers(&broker)
        .await
        .map_err(|e| StartError::Logs(e.to_string()))?;
    // Dynamic listener.name.<l>.ssl.* changes (kafka-configs) rebuild the TLS listeners.
    if let Some(p) = tls_publisher {
        let _ = broker.tls_listeners.set(p.clone());
        broker
            .controller
            .loader()
            .install_publisher(p)
            .await
            .map_err(|e| StartError::Logs(e.to_string()))?;
    }
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

    // Groups and committed offsets were rebuilt by the coordinator publisher
    // (`install_publishers`) before clients can ask for them.
    {
        let (b, shutdown) = (broker.clone(), shutdown_rx.clone());
        tasks.push(tokio::spawn(async move {
            b.group_coordinator.run_offsets_retention(shutdown).await;
        }));
        let (b, shutdown) = (broker.clone(), shutdown_rx.clone());
        tasks.push(tokio::spawn(async move {
            b.group_coordinator.run_timers(shutdown).await;
        }));
        // Timed-out transactions and expired transactional ids (issue 12).
        let (c, shutdown) = (broker.transaction_coordinator.clone(), shutdown_rx.clone());
        tasks.push(tokio::spawn(c.run_periodic(shutdown)));
    }
    let socket_server = SocketServer::new(
        SocketServerConfig {
            max_connections_by_descriptors: connections_by_descriptors,
            connection_rates: gregor_network::quotas::ConnectionRateConfig {
                ip_rates: Some(crate::client_quota::ip_connection_rates(Arc::downgrade(
                    &broker,
                ))),
                ..broker.config.socket_server_config().connection_rates
            },
            ..broker.config.socket_server_config()
        },
        Arc::new(KafkaApis::new(broker.clone())),
    );
    tasks.extend(socket_server.start(listeners, &shutdown_rx));
    // Dynamic max.connections, listener.name.<l>.max.connections, ... (kafka-configs).
    broker
        .controller
        .loader()
        .install_publisher(Arc::new(
            crate::connection_limits::ConnectionLimitsPublisher::new(
                &broker.config,
                std::iter::once(socket_server.connection_quotas().clone())
                    .chain(controller_connection_quotas)
                    .collect(),
            ),
        ))
        .await
        .map_err(|e| StartError::Logs(e.to_string()))?;
    tasks.push(tokio::spawn(flush_scheduler(
        broker.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(retention_scheduler(
        broker.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(high_watermark_checkpointer(
        broker.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(log_dir_health_checker(
        broker.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(log_creation_retrier(
        broker.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(idle_file_closer(
        broker.clone(),
        shutdown_rx.clone(),
    )));
    tasks.push(tokio::spawn(producer_expiration_checker(
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
    controller_apis.set_broker(broker.clone());
    admin.attach(broker.clone());
    admin.set_ready(true);
    Ok(RunningBroker {
        broker,
        admin_addr,
        admin,
        shutdown: shutdown_tx,
        tasks,
        lifecycle,
        _metadata_dir_lock: metadata_dir_lock,
    })
}

/// The controller's settings from the broker config: `broker.session.timeout.ms` (Kafka's
/// default 9000), `unclean.leader.election.enable` (false), `auto.leader.rebalance.enable`
/// (true), `leader.imbalance.check.interval.seconds` (300) and
/// `leader.imbalance.per.broker.percentage` (10). An unparsable value keeps the default.
fn controller_config(config: &BrokerConfig) -> gregor_metadata::controller::ControllerConfig {
    let raw = |key: &str| config.raw.get(key).map(|v| v.trim().to_string());
    let flag = |key: &str, default: bool| {
        raw(key).map_or(default, |v| match v.to_ascii_lowercase().as_str() {
            "true" => true,
            "false" => false,
            _ => default,
        })
    };
    let session_timeout_ms = raw("broker.session.timeout.ms")
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .unwrap_or(gregor_metadata::controller::DEFAULT_BROKER_SESSION_TIMEOUT_MS);
    let defaults = gregor_metadata::controller::ControllerConfig::default();
    gregor_metadata::controller::ControllerConfig {
        session_timeout_ms,
        unclean_leader_election_enable: flag("unclean.leader.election.enable", false),
        auto_leader_rebalance_enable: flag("auto.leader.rebalance.enable", true),
        leader_imbalance_check_interval_ms: raw("leader.imbalance.check.interval.seconds")
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|s| *s > 0)
            .map_or(defaults.leader_imbalance_check_interval_ms, |s| {
                s.saturating_mul(1000)
            }),
        leader_imbalance_per_broker_percentage: raw("leader.imbalance.per.broker.percentage")
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(defaults.leader_imbalance_per_broker_percentage),
        node_id: config.node_id,
        colocated_broker: config.quorum.broker,
        kraft_version: crate::metadata_publisher::kraft_version(config),
        min_insync_replicas: raw("min.insync.replicas")
            .and_then(|v| v.parse::<i32>().ok())
            .filter(|n| *n >= 1)
            .unwrap_or(defaults.min_insync_replicas),
        ..defaults
    }
}

/// Below this open-file limit start-up warns (a new-user trial saw a broker at 32 fail to
/// reopen its metadata log segment and time producers out; 64 worked).
const LOW_OPEN_FILE_LIMIT: u64 = 256;

/// Writes `replication-offset-checkpoint` every
/// `replica.high.watermark.checkpoint.interval.ms` (Kafka's `checkpointHighWatermarks`, started
/// by `ReplicaManager.startHighWatermarkCheckPointThread`), on the I/O pool.
async fn high_watermark_checkpointer(broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) {
    let period = Duration::from_millis(
        broker
            .config
            .replica_high_watermark_checkpoint_interval_ms()
            .max(1) as u64,
    );
    // Failed attempts in a row.
    let mut failures: u64 = 0;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        let b = broker.clone();
        let written = broker
            .replica_manager
            .io_pool()
            .run(move || {
                let fetchers = b.replica_fetchers.get().map(Arc::as_ref);
                crate::replica_fetcher::checkpoint_high_watermarks(&b.replica_manager, fetchers)
            })
            .await;
        // A full or failed dir fails every attempt until it heals (`/ready` and the dir's own
        // ERROR line say so): logged at the 1st, 2nd, 4th, 8th ... failure in a row, and once
        // when it works again.
        let error = match written {
            Ok(Ok(())) => {
                if failures > 0 {
                    info!(
                        failures,
                        "replication-offset-checkpoint written again after failed attempts"
                    );
                }
                failures = 0;
                continue;
            }
            Ok(Err(e)) => e.to_string(),
            Err(e) => format!("the checkpoint job failed: {e}"),
        };
        failures += 1;
        if failures.is_power_of_two() {
            warn!(
                error = %error,
                failures,
                "writing replication-offset-checkpoint failed (retried every {} ms; logged again at {} failures in a row)",
                period.as_millis(),
                failures * 2
            );
        }
    }
}

/// How often segment files are swept for idleness: a file no one used for one to two of these
/// periods is closed ([`gregor_log::files::close_idle_files`]).
pub const IDLE_FILE_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Closes segment files nothing used for a while, so that descriptors follow the partitions in
/// use rather than filling the budget (Kafka keeps one per segment for as long as it exists).
async fn idle_file_closer(broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(IDLE_FILE_SWEEP_INTERVAL) => {}
            _ = shutdown.changed() => return,
        }
        let _ = broker
            .replica_manager
            .io_pool()
            .run(gregor_log::files::close_idle_files)
            .await;
    }
}

/// Kafka's `PeriodicProducerExpirationCheck`: every `producer.id.expiration.check.interval.ms`
/// drops the state of producers idle for `producer.id.expiration.ms` (none with an open
/// transaction) and expired KIP-890 verification entries, on every partition.
async fn producer_expiration_checker(broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) {
    let every = Duration::from_millis(broker.config.producer_id_expiration_check_interval_ms());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        let b = broker.clone();
        let _ = broker
            .replica_manager
            .io_pool()
            .run(move || {
                let rm = &b.replica_manager;
                rm.remove_expired_producers(rm.now_ms());
            })
            .await;
    }
}

/// How often a full log directory is checked for room again
/// ([`gregor_log::LogManager::check_dir_health`]; nothing is done while every dir is online).
pub const LOG_DIR_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Brings full log directories (and a full `metadata.log.dir`) back online once they have
/// room again, without a restart.
async fn log_dir_health_checker(broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) {
    let mut last_offline: Vec<std::path::PathBuf> = Vec::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(LOG_DIR_CHECK_INTERVAL) => {}
            _ = shutdown.changed() => return,
        }
        // Before and after the check, so a dir that went offline since the last tick is acted
        // on, and one the check brings back is fetched again at once.
        tell_fetchers_of_dir_changes(&broker, &mut last_offline).await;
        // `metadata.log.dir` as the metadata log's writes found it (full: proposals fail
        // with KAFKA_STORAGE_ERROR until it has room again).
        if let Some(h) = broker
            .raft
            .get()
            .map(|r| r.metadata_dir_health().clone())
            .filter(|h| h.is_offline())
        {
            let _ = broker
                .replica_manager
                .io_pool()
                .run(move || h.check())
                .await;
        }
        if last_offline.is_empty() {
            continue;
        }
        let b = broker.clone();
        let _ = broker
            .replica_manager
            .io_pool()
            .run(move || b.replica_manager.logs().check_dir_health())
            .await;
        tell_fetchers_of_dir_changes(&broker, &mut last_offline).await;
    }
}

/// When the offline log dirs differ from `last_offline`, the replica fetchers stop fetching
/// the partitions of offline dirs and fetch the followers of online ones again
/// ([`ReplicaManager::on_log_dirs_changed`](crate::replica_manager::ReplicaManager)).
async fn tell_fetchers_of_dir_changes(
    broker: &Arc<Broker>,
    last_offline: &mut Vec<std::path::PathBuf>,
) {
    let offline: Vec<std::path::PathBuf> = broker
        .replica_manager
        .logs()
        .offline_dirs()
        .into_iter()
        .map(|(dir, _)| dir)
        .collect();
    if offline == *last_offline {
        return;
    }
    *last_offline = offline;
    let b = broker.clone();
    let image = broker.controller.image();
    if let Err(e) = broker
        .replica_manager
        .io_pool()
        .run(move || b.replica_manager.on_log_dirs_changed(&image))
        .await
    {
        warn!(error = %e, "telling the replica fetchers of a log dir change failed");
    }
}

/// Creates the logs of partitions whose creation failed
/// ([`ReplicaManager::retry_log_creation`]) every
/// [`crate::replica_manager::LOG_CREATION_RETRY_INTERVAL`] while any is pending (nothing is
/// done otherwise), so that a partition appears once its cause is fixed (space freed) without
/// a metadata change.
async fn log_creation_retrier(broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(crate::replica_manager::LOG_CREATION_RETRY_INTERVAL) => {}
            _ = shutdown.changed() => return,
        }
        if !broker.replica_manager.has_log_creation_failures() {
            continue;
        }
        let b = broker.clone();
        match broker
            .replica_manager
            .io_pool()
            .run(move || b.replica_manager.retry_log_creation())
            .await
        {
            // Each partition created is logged by the replica manager; its directory goes to
            // the controller (KIP-858).
            Ok(Ok(created)) => {
                if let Some(a) = broker.assignments.get().filter(|_| created > 0) {
                    a.on_logs_created(&broker.controller.image(), &broker.replica_manager);
                }
            }
            Ok(Err(e)) => debug!(error = %e, "retrying the creation of partition logs failed"),
            Err(e) => warn!(error = %e, "the log creation retry job failed"),
        }
    }
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
                // Kafka's firstUncleanableOffset: nothing at or above the last stable offset
                // (open transactions stay as written).
                .map(|p| (p.log.clone(), p.last_stable_offset()))
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

/// The connectors of this node's own clients: to the inter-broker listener (a node with the
/// broker role) and to the first controller listener, each secured as its listener's security
/// protocol asks ([`crate::listener_security::client_security`]); plaintext otherwise.
///
/// # Errors
/// [`gregor_network::NetworkError::Tls`] naming the listener and key whose settings or files
/// cannot work.
fn own_client_security(
    config: &BrokerConfig,
) -> Result<
    (
        gregor_network::client::ClientSecurity,
        gregor_network::client::ClientSecurity,
    ),
    gregor_network::NetworkError,
> {
    use crate::listener_security::{client_security, ClientRole};
    use gregor_network::client::ClientSecurity;
    let inter_broker = match config
        .inter_broker_listener_name()
        .filter(|_| config.quorum.broker)
        .and_then(|name| config.listeners.iter().find(|l| l.name == name))
    {
        Some(l) => client_security(
            &config.raw,
            &l.name,
            l.security_protocol,
            ClientRole::InterBroker,
        )?,
        None => ClientSecurity::plaintext(),
    };
    let controller = match config
        .quorum
        .controller_listener_names
        .first()
        .and_then(|name| {
            config
                .listener_security_protocol_map
                .get(name)
                .map(|p| (name, *p))
        }) {
        Some((name, protocol)) => {
            client_security(&config.raw, name, protocol, ClientRole::Controller)?
        }
        None => ClientSecurity::plaintext(),
    };
    Ok((inter_broker, controller))
}

#[cfg(test)]
mod descriptor_reserve_tests {
    use super::max_connections_by_descriptors;

    #[test]
    fn connections_get_what_the_budget_and_the_reserve_leave() {
        // 1,024: 512 segment files, a reserve of 64.
        assert_eq!(max_connections_by_descriptors(1024, 512), 448);
        // 128: 64 segment files, the smallest reserve (32).
        assert_eq!(max_connections_by_descriptors(128, 64), 32);
        // 1,048,576: 1/16 reserved.
        assert_eq!(
            max_connections_by_descriptors(1 << 20, 1 << 19),
            (1 << 19) - (1 << 16)
        );
        // A limit too small for the reserve still lets a few clients in.
        assert_eq!(max_connections_by_descriptors(40, 20), 8);
    }
}
