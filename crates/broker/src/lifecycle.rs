//! The broker's side of its registration with the controller (Kafka's
//! `BrokerLifecycleManager`, KIP-631): register with a new incarnation id, the advertised
//! listeners, the supported features, the rack and the log directory ids; heartbeat every
//! `broker.heartbeat.interval.ms` (2000) with the offset of the last metadata record applied
//! here, which unfences the broker once it has caught up with its registration; on shutdown,
//! a controlled shutdown (leadership moved away before the broker stops).
//!
//! A registration refused with DUPLICATE_BROKER_REGISTRATION (the previous incarnation of this
//! node, killed without a controlled shutdown, still has a live session) is retried until that
//! session expires (`broker.session.timeout.ms`), as Kafka's broker does.
//!
//! Every request goes to the active controller through the
//! [`ControllerClient`](crate::controller_channel::ControllerClient): the local controller when
//! this node leads the metadata quorum, the controller channel (BrokerRegistration 62,
//! BrokerHeartbeat 63) otherwise, so every broker of a cluster registers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use gregor_log::LogDirHealth;
use gregor_metadata::controller::{BrokerHeartbeatRequest, BrokerRegistrationRequest};
use gregor_network::SecurityProtocol;
use gregor_protocol::error::ErrorCode;
use gregor_protocol::metadata_records::BrokerEndpoint;
use tokio::sync::watch;
use tracing::{info, warn};
use uuid::Uuid;

use crate::config::BrokerConfig;
use crate::controller_channel::ControllerClient;
use crate::start_error::StartError;

/// `broker.heartbeat.interval.ms`'s default.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 2000;

/// How long a registration is retried, in ms (Kafka's `initial.broker.registration.timeout.ms`
/// default).
pub const REGISTRATION_TIMEOUT_MS: u64 = 60_000;

/// Longest a controlled shutdown waits for the controller's go-ahead before stopping anyway.
pub const CONTROLLED_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause between the heartbeats of a controlled shutdown (the controller's answer changes
/// once other brokers have seen the leadership moves).
const CONTROLLED_SHUTDOWN_RETRY: Duration = Duration::from_millis(100);

/// How often the heartbeat task looks at the log directories' health between heartbeats, so
/// that a directory going offline or coming back is reported at once.
const LOG_DIR_POLL: Duration = Duration::from_millis(250);

/// This broker's registration: its epoch and the heartbeat task.
pub struct BrokerLifecycle {
    client: Arc<ControllerClient>,
    broker_id: i32,
    /// The broker epoch the controller gave this incarnation.
    pub broker_epoch: i64,
    stop_heartbeats: watch::Sender<bool>,
    heartbeats: tokio::task::JoinHandle<()>,
    /// The log directories' health, reported in heartbeats once the logs are loaded.
    log_dirs: Arc<OnceLock<Vec<Arc<LogDirHealth>>>>,
    /// `metadata.log.dir`'s health: while this node cannot append to its metadata log it
    /// falls behind the cluster's metadata, so its heartbeats ask to be fenced.
    metadata_dir: Arc<OnceLock<Arc<LogDirHealth>>>,
    /// Each log directory's id (`directory.id` of its `meta.properties`), as registered.
    log_dir_ids: Vec<(PathBuf, Uuid)>,
}

/// The ids of the offline directories among `health` (by path in `dir_ids`).
fn offline_dir_ids(
    health: &OnceLock<Vec<Arc<LogDirHealth>>>,
    dir_ids: &[(PathBuf, Uuid)],
) -> BTreeSet<Uuid> {
    let Some(health) = health.get() else {
        return BTreeSet::new();
    };
    health
        .iter()
        .filter(|h| h.is_offline())
        .filter_map(|h| {
            dir_ids
                .iter()
                .find(|(p, _)| p == h.dir())
                .map(|(_, id)| *id)
        })
        .collect()
}

fn heartbeat_interval(config: &BrokerConfig) -> Duration {
    let ms = config
        .raw
        .get("broker.heartbeat.interval.ms")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_HEARTBEAT_INTERVAL_MS);
    Duration::from_millis(ms.max(1))
}

/// The offset of the last metadata record this node applied (-1 before any).
fn applied_offset(client: &ControllerClient) -> i64 {
    i64::try_from(client.local().image().offset).unwrap_or(i64::MAX) - 1
}

/// The endpoints a broker registers: its advertised listeners (`listeners` when
/// `advertised.listeners` is not set) without those of `controller.listener.names`, as Kafka's
/// `KafkaConfig.effectiveAdvertisedBrokerListeners` (a combined node's CONTROLLER listener is
/// not a broker endpoint); an advertised port 0 is the port the listener of that name bound
/// (`bound_ports`, by listener name).
fn registration_listeners(
    config: &BrokerConfig,
    bound_ports: &[(String, u16)],
) -> Vec<BrokerEndpoint> {
    config
        .advertised_listeners
        .iter()
        .filter(|l| !config.quorum.controller_listener_names.contains(&l.name))
        .map(|l| BrokerEndpoint {
            name: l.name.clone(),
            host: l.host.clone(),
            port: if l.port == 0 {
                bound_ports
                    .iter()
                    .find(|(name, _)| *name == l.name)
                    .map_or(0, |(_, p)| *p)
            } else {
                l.port
            },
            // `SecurityProtocol.id`: the position in Kafka's order.
            security_protocol: SecurityProtocol::ALL
                .iter()
                .position(|p| *p == l.security_protocol)
                .map_or(0, |i| i as i16),
            ..BrokerEndpoint::default()
        })
        .collect()
}

/// Registers this broker (advertised listeners with the port each bound, `bound_ports` by
/// listener name), heartbeats until it is unfenced, and starts the periodic heartbeats.
///
/// # Errors
/// [`StartError::Metadata`] when the active controller refuses the registration (other than
/// a live previous incarnation, or no controller reachable, which are retried up to
/// [`REGISTRATION_TIMEOUT_MS`]).
pub async fn start(
    config: &BrokerConfig,
    client: &Arc<ControllerClient>,
    cluster_id: &str,
    bound_ports: &[(String, u16)],
    failed_dirs: &BTreeMap<PathBuf, String>,
) -> Result<BrokerLifecycle, StartError> {
    let interval = heartbeat_interval(config);
    let listeners = registration_listeners(config, bound_ports);
    // Failed dirs are not registered (Kafka registers `LogManager.directoryIdsSet`, the
    // online dirs): the controller then takes their replicas for offline.
    let dirs: BTreeSet<_> = config
        .log_dirs
        .iter()
        .filter(|d| !failed_dirs.contains_key(*d))
        .cloned()
        .collect();
    let dir_ids: Vec<(PathBuf, Uuid)> =
        crate::storage::verify_ensemble(&dirs, None, config.node_id)
            .map_err(|e| StartError::Storage(e.to_string()))?
            .into_iter()
            .filter_map(|(path, m)| m.directory_id.map(|id| (path, id)))
            .collect();
    let log_dirs: Vec<Uuid> = dir_ids.iter().map(|(_, id)| *id).collect();
    let request = BrokerRegistrationRequest {
        broker_id: config.node_id,
        incarnation_id: Uuid::new_v4(),
        listeners,
        features: BrokerRegistrationRequest::supported_features(),
        rack: config.rack.clone(),
        log_dirs,
        // KIP-966: the epoch a clean shutdown recorded; -1 after a crash, so the controller
        // takes this broker out of every ISR and ELR until it has caught up again.
        previous_broker_epoch: gregor_log::read_clean_shutdown_broker_epoch(
            &dirs.iter().cloned().collect::<Vec<_>>(),
        ),
    };
    // A Kafka controller refuses a registration whose feature ranges miss a finalized level
    // with a bare UNSUPPORTED_VERSION (BrokerRegistration has no error message); the image
    // replayed from its log says which, so say it first (Kafka's broker checks the same).
    let unsupported = gregor_metadata::cluster_control::unsupported_finalized_features(
        &client.local().image().features,
    );
    if !unsupported.is_empty() {
        return Err(StartError::Metadata(format!(
            "this broker cannot join cluster {cluster_id}: {}",
            unsupported.join("; ")
        )));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_millis(REGISTRATION_TIMEOUT_MS);
    let broker_epoch = loop {
        match client.register_broker(cluster_id, request.clone()).await {
            Ok(epoch) => break epoch,
            Err(e)
                if matches!(
                    e.error_code(),
                    ErrorCode::DuplicateBrokerRegistration
                        | ErrorCode::RequestTimedOut
                        | ErrorCode::NotController
                ) && tokio::time::Instant::now() < deadline =>
            {
                info!(error = %e, "broker registration not accepted yet; retrying");
                tokio::time::sleep(interval.min(Duration::from_millis(500))).await;
            }
            Err(e) if e.error_code() == ErrorCode::UnsupportedVersion => {
                // Registered before the controller's first records reached this node (a quorum
                // that has just elected its leader): name the feature once they have.
                let unsupported = tokio::time::timeout(Duration::from_secs(5), async {
                    loop {
                        let image = client.local().image();
                        if image.metadata_version().is_some() {
                            break image;
                        }
                        if client
                            .local()
                            .loader()
                            .wait_for_offset(image.offset)
                            .await
                            .is_err()
                        {
                            break image;
                        }
                    }
                })
                .await
                .map(|image| {
                    gregor_metadata::cluster_control::unsupported_finalized_features(
                        &image.features,
                    )
                })
                .unwrap_or_default();
                if !unsupported.is_empty() {
                    return Err(StartError::Metadata(format!(
                        "this broker cannot join cluster {cluster_id}: {}",
                        unsupported.join("; ")
                    )));
                }
                return Err(StartError::Metadata(format!(
                    "the active controller refused this broker's registration with \
                     UNSUPPORTED_VERSION ({e}): the cluster finalized a feature level outside \
                     the ranges this gregor broker registers ({})",
                    gregor_metadata::cluster_control::SUPPORTED_FEATURES
                        .iter()
                        .map(|(n, min, max)| format!("{n} {min}-{max}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            // Kafka's BrokerLifecycleManager retries a refused registration whatever the
            // error, until `initial.broker.registration.timeout.ms`; so does this broker.
            Err(e) if tokio::time::Instant::now() < deadline => {
                info!(error = %e, "broker registration refused; retrying");
                tokio::time::sleep(interval.min(Duration::from_millis(500))).await;
            }
            Err(e) => {
                return Err(StartError::Metadata(format!(
                    "broker registration not accepted within {REGISTRATION_TIMEOUT_MS} ms: {e}"
                )))
            }
        }
    };
    let broker_id = config.node_id;
    // Unfenced once caught up with the registration record. A heartbeat that fails (a Kafka
    // controller may answer REQUEST_TIMED_OUT while busy, or leadership moves) is sent again
    // after a backoff, as Kafka's BrokerLifecycleManager does, within the same bound as the
    // registration.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(REGISTRATION_TIMEOUT_MS);
    loop {
        let reply = match client
            .broker_heartbeat(BrokerHeartbeatRequest {
                broker_id,
                broker_epoch,
                current_metadata_offset: applied_offset(client),
                want_fence: false,
                want_shut_down: false,
                cordoned_log_dirs: None,
                offline_log_dirs: Vec::new(),
            })
            .await
        {
            Ok(reply) => reply,
            Err(e) if tokio::time::Instant::now() < deadline => {
                info!(error = %e, "first heartbeat not accepted yet; retrying");
                tokio::time::sleep(interval.min(Duration::from_millis(500))).await;
                continue;
            }
            Err(e) => {
                return Err(StartError::Metadata(format!(
                    "no heartbeat of broker {broker_id} (epoch {broker_epoch}) accepted within \
                     {REGISTRATION_TIMEOUT_MS} ms of its registration: {e}"
                )))
            }
        };
        if !reply.is_fenced {
            break;
        }
        if reply.is_caught_up {
            // Caught up and still fenced: the controller will not unfence this incarnation.
            return Err(StartError::Metadata(format!(
                "broker {broker_id} (epoch {broker_epoch}) caught up with its registration but the controller keeps it fenced"
            ))
            );
        }
        // The loader applies the registration record shortly; wait for it, not for time.
        client
            .local()
            .loader()
            .wait_for_offset(u64::try_from(broker_epoch).unwrap_or(0))
            .await
            .map_err(|e| StartError::Metadata(e.to_string()))?;
    }
    info!(broker_id, broker_epoch, "registered and unfenced");
    let (stop_heartbeats, mut stop) = watch::channel(false);
    let c = client.clone();
    let log_dir_health: Arc<OnceLock<Vec<Arc<LogDirHealth>>>> = Arc::default();
    let health = log_dir_health.clone();
    let metadata_dir_health: Arc<OnceLock<Arc<LogDirHealth>>> = Arc::default();
    let metadata_dir = metadata_dir_health.clone();
    let cluster_id = cluster_id.to_string();
    let log_dir_ids = dir_ids.clone();
    let heartbeats = tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut poll = tokio::time::interval(LOG_DIR_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The offline directories the controller last accepted a heartbeat with.
        let mut reported: BTreeSet<Uuid> = BTreeSet::new();
        // A directory came back and the amended registration is not accepted yet (retried at
        // each heartbeat; the heartbeats go on meanwhile).
        let mut amend_pending = false;
        // Whether the last accepted heartbeat asked to be fenced.
        let mut fence_reported = false;
        let metadata_failed = || metadata_dir.get().is_some_and(|h| h.is_offline());
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tick.tick() => {}
                _ = poll.tick() => {
                    if offline_dir_ids(&health, &dir_ids) == reported
                        && metadata_failed() == fence_reported
                    {
                        continue;
                    }
                }
            }
            let offline = offline_dir_ids(&health, &dir_ids);
            // A node that cannot write its metadata log stops following the cluster's
            // metadata (Kafka's broker halts on a failed metadata log dir): it asks to be
            // fenced, so its partitions' leadership moves to replicas that follow, and asks
            // to be unfenced once the dir has room again and the log appends again.
            let want_fence = metadata_failed();
            if want_fence != fence_reported {
                if want_fence {
                    warn!(
                        broker_id,
                        broker_epoch,
                        "the metadata log dir cannot be written: asking the controller to fence this broker until it can"
                    );
                } else {
                    info!(
                        broker_id,
                        broker_epoch,
                        "the metadata log dir can be written again: asking the controller to unfence this broker"
                    );
                }
            }
            // A directory the controller took offline is back: amend the registration (same
            // incarnation, every directory online; the epoch stays), as Kafka's broker
            // re-sends its registration, so its replicas may lead and rejoin ISRs again.
            amend_pending |= reported.iter().any(|d| !offline.contains(d));
            if amend_pending {
                match c.register_broker(&cluster_id, request.clone()).await {
                    Ok(epoch) if epoch == broker_epoch => {
                        amend_pending = false;
                        info!(
                            broker_id,
                            broker_epoch, "log directories back online; registration amended"
                        );
                    }
                    Ok(epoch) => {
                        amend_pending = false;
                        warn!(
                            broker_id,
                            broker_epoch,
                            epoch,
                            "the amended registration got another broker epoch"
                        );
                    }
                    Err(e) => {
                        warn!(error = %e, "amending the registration for log directories back online failed; retrying at the next heartbeat");
                    }
                }
            }
            // Every directory offline: Kafka's broker halts; a gregor broker stays up, its
            // replicas leave leadership and ISRs where another replica can take over (the
            // controller's side), and it keeps serving reads until a directory has room again.
            let r = c
                .broker_heartbeat(BrokerHeartbeatRequest {
                    broker_id,
                    broker_epoch,
                    current_metadata_offset: applied_offset(&c),
                    want_fence,
                    want_shut_down: false,
                    cordoned_log_dirs: None,
                    offline_log_dirs: offline.iter().copied().collect(),
                })
                .await;
            match r {
                Ok(reply) => {
                    fence_reported = want_fence;
                    if reply.is_fenced && !want_fence {
                        warn!(
                            broker_id,
                            broker_epoch, "the active controller has fenced this broker"
                        );
                    }
                    reported = offline;
                }
                Err(e) => warn!(error = %e, "broker heartbeat failed"),
            }
        }
    });
    Ok(BrokerLifecycle {
        client: client.clone(),
        broker_id,
        broker_epoch,
        stop_heartbeats,
        heartbeats,
        log_dirs: log_dir_health,
        metadata_dir: metadata_dir_health,
        log_dir_ids,
    })
}

impl BrokerLifecycle {
    /// Reports the health of these log directories (the log manager's, once the logs are
    /// loaded) in every heartbeat from now on: an offline directory's id goes in
    /// `OfflineLogDirs` (KIP-858). A second call is ignored.
    pub fn report_log_dirs(&self, health: Vec<Arc<LogDirHealth>>) {
        let _ = self.log_dirs.set(health);
    }

    /// Reports the health of `metadata.log.dir` (the metadata log's): while it is offline the
    /// heartbeats ask the controller to fence this broker (`WantFence`). A second call is
    /// ignored.
    pub fn report_metadata_dir(&self, health: Arc<LogDirHealth>) {
        let _ = self.metadata_dir.set(health);
    }

    /// Each log directory's id (`directory.id`), by configured path, as this broker
    /// registered them.
    pub fn log_dir_ids(&self) -> &[(PathBuf, Uuid)] {
        &self.log_dir_ids
    }

    /// Controlled shutdown: heartbeats asking to shut down until the controller answers that
    /// this broker may (it leads nothing and is fenced), at most
    /// [`CONTROLLED_SHUTDOWN_TIMEOUT`].
    pub async fn controlled_shutdown(self) {
        let _ = self.stop_heartbeats.send(true);
        let _ = self.heartbeats.await;
        let c = self.client.clone();
        let attempt = async {
            loop {
                let r = c
                    .broker_heartbeat(BrokerHeartbeatRequest {
                        broker_id: self.broker_id,
                        broker_epoch: self.broker_epoch,
                        current_metadata_offset: applied_offset(&c),
                        want_fence: false,
                        want_shut_down: true,
                        cordoned_log_dirs: None,
                        offline_log_dirs: Vec::new(),
                    })
                    .await;
                match r {
                    Ok(reply) if reply.should_shut_down => return,
                    Ok(_) => {
                        // The controller moved leadership away; the next answer follows once
                        // this node has applied that.
                        tokio::time::sleep(CONTROLLED_SHUTDOWN_RETRY).await;
                    }
                    Err(e) => {
                        warn!(error = %e, "controlled shutdown: heartbeat failed");
                        return;
                    }
                }
            }
        };
        if tokio::time::timeout(CONTROLLED_SHUTDOWN_TIMEOUT, attempt)
            .await
            .is_err()
        {
            warn!("controlled shutdown did not complete in time; stopping anyway");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> BrokerConfig {
        BrokerConfig::from_properties(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        )
        .expect("a valid config")
        .0
    }

    fn names(endpoints: &[BrokerEndpoint]) -> Vec<(&str, u16)> {
        endpoints
            .iter()
            .map(|e| (e.name.as_str(), e.port))
            .collect()
    }

    #[test]
    fn a_combined_node_registers_its_broker_listeners_only() {
        // Kafka 4's stock server.properties advertises the CONTROLLER listener too; the
        // registration (KafkaConfig.effectiveAdvertisedBrokerListeners) leaves it out.
        let combined = [
            ("process.roles", "broker,controller"),
            ("node.id", "1"),
            ("controller.quorum.voters", "1@127.0.0.1:9093"),
            (
                "listeners",
                "PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:9093",
            ),
            ("controller.listener.names", "CONTROLLER"),
        ];
        let bound = [("PLAINTEXT".to_string(), 19092)];
        let c = config(&combined);
        assert_eq!(
            names(&registration_listeners(&c, &bound)),
            [("PLAINTEXT", 19092)]
        );
        let mut advertised = combined.to_vec();
        advertised.push((
            "advertised.listeners",
            "PLAINTEXT://localhost:9092,CONTROLLER://localhost:9093",
        ));
        let c = config(&advertised);
        assert_eq!(
            names(&registration_listeners(&c, &bound)),
            [("PLAINTEXT", 9092)]
        );
        // A node without controller listeners registers every listener.
        let c = config(&[("listeners", "PLAINTEXT://127.0.0.1:9092")]);
        assert_eq!(
            names(&registration_listeners(&c, &bound)),
            [("PLAINTEXT", 9092)]
        );
    }
}
