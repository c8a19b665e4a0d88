//! Replica fetchers (Kafka's `ReplicaFetcherManager` / `ReplicaFetcherThread`): the partitions
//! this broker follows are fetched from their leaders, one fetcher per (source broker,
//! fetcher id = hash(topic, partition) % `num.replica.fetchers`), each a tokio task with one
//! connection to the leader's inter-broker listener.
//!
//! - **Requests.** Fetch v17 requests in a KIP-227 fetch session (`session`, Kafka's
//!   `FetchSessionHandler`: full first, then only changed and forgotten partitions; a
//!   partition the leader leaves out of a response has nothing new): `ReplicaState {this
//!   node, its broker epoch}`, topic ids, `replica.fetch.wait.max.ms`,
//!   `replica.fetch.min.bytes`, `replica.fetch.response.max.bytes`, per partition
//!   `replica.fetch.max.bytes`, `CurrentLeaderEpoch`, `LastFetchedEpoch` from the local epoch
//!   cache, fetch offset = log end offset, the local log start offset. v17 is the highest
//!   every Kafka 4.x broker accepts (v18 adds only the KRaft `HighWatermark`).
//! - **Responses** are decided by the sans-I/O core ([`crate::replication::follower`]) and
//!   carried out (append keeping the leader's offsets and epochs, truncation, watermarks) in one
//!   job per response on the replica manager's I/O pool, never on an async worker. That job
//!   holds the fetcher's partition map lock, so removing a partition
//!   ([`ReplicaFetchers::before_image`], which the replica manager calls before it applies an
//!   image) waits for an append in progress: no follower append lands after the partition
//!   became leader or was deleted.
//! - **Out of range** asks the leader its latest and earliest offsets (ListOffsets v10 with
//!   this broker's id, as Kafka 4.x's `fetchLatestOffset` / `fetchEarliestOffset`).
//! - **Errors** back off `replica.fetch.backoff.ms` per partition; a connection error backs off
//!   every partition of the fetcher and reconnects; a fenced partition waits for metadata.

pub mod connection;
mod fetcher;
mod session;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use gregor_log::{SharedClock, TopicPartition};
use gregor_metadata::MetadataImage;
use parking_lot::Mutex;
use tokio::sync::{watch, Notify};
use uuid::Uuid;

use crate::config::BrokerConfig;
use crate::replica_manager::{IoPool, Partition, ReplicaFetchers, ReplicaManager, Role};
use crate::replication::follower::{fetcher_id, PartitionFetchState};
use crate::replication::quota::ReplicationQuotas;

/// Fetch version sent to leaders.
pub const FETCH_VERSION: i16 = 17;
/// ListOffsets version sent to leaders (out-of-range recovery).
pub const LIST_OFFSETS_VERSION: i16 = 10;

/// The replica fetchers' settings (Kafka's names and defaults).
#[derive(Debug, Clone)]
pub struct FetcherConfig {
    /// This broker's `node.id` (the fetch's `ReplicaId`).
    pub node_id: i32,
    /// `num.replica.fetchers` (1): fetchers per source broker.
    pub num_fetchers: usize,
    /// `replica.fetch.wait.max.ms` (500).
    pub max_wait_ms: i32,
    /// `replica.fetch.min.bytes` (1).
    pub min_bytes: i32,
    /// `replica.fetch.response.max.bytes` (10 MiB).
    pub max_bytes: i32,
    /// `replica.fetch.max.bytes` (1 MiB), per partition.
    pub partition_max_bytes: i32,
    /// `replica.fetch.backoff.ms` (1000).
    pub backoff_ms: i64,
    /// `replica.socket.timeout.ms` (30000): connect and request timeout.
    pub socket_timeout_ms: i64,
    /// Largest response frame read (bytes): `socket.request.max.bytes` or the response limit
    /// plus 1 MiB, whichever is larger (the first batch may exceed the limits, KIP-74, but no
    /// batch exceeds a request the leader accepted).
    pub max_response_bytes: usize,
    /// The listener of the leaders' registrations to connect to (`inter.broker.listener.name`).
    pub listener_name: Option<String>,
    /// How connections to that listener are secured (TLS, SASL); plaintext unless the broker
    /// sets it at start-up.
    pub security: gregor_network::client::ClientSecurity,
}

impl FetcherConfig {
    /// The settings from the broker configuration.
    pub fn from_broker(config: &BrokerConfig) -> Self {
        let max_bytes = config.replica_fetch_response_max_bytes();
        Self {
            node_id: config.node_id,
            num_fetchers: config.num_replica_fetchers(),
            max_wait_ms: config.replica_fetch_wait_max_ms(),
            min_bytes: config.replica_fetch_min_bytes(),
            max_bytes,
            partition_max_bytes: config.replica_fetch_max_bytes(),
            backoff_ms: config.replica_fetch_backoff_ms(),
            socket_timeout_ms: config.replica_socket_timeout_ms(),
            max_response_bytes: config
                .socket_request_max_bytes
                .max(max_bytes.max(0) as usize + (1 << 20)),
            listener_name: config.inter_broker_listener_name(),
            security: gregor_network::client::ClientSecurity::plaintext(),
        }
    }
}

/// What the fetcher tasks share with the manager.
pub(crate) struct FetcherContext {
    pub(crate) config: FetcherConfig,
    pub(crate) broker_epoch: AtomicI64,
    pub(crate) io: Arc<IoPool>,
    pub(crate) clock: SharedClock,
    /// Set when a follower's log start offset moved (the checkpoint task writes
    /// `log-start-offset-checkpoint`).
    pub(crate) log_start_moved: AtomicBool,
    /// The follower quota (KIP-73): throttled partitions are left out of fetches while it is
    /// exceeded, and their fetched bytes are recorded.
    pub(crate) quotas: Arc<ReplicationQuotas>,
}

/// One followed partition in a fetcher.
pub(crate) struct FollowedPartition {
    pub(crate) partition: Arc<Partition>,
    pub(crate) topic_id: Uuid,
    pub(crate) leader: i32,
    pub(crate) state: PartitionFetchState,
    /// The leader's high watermark minus the next fetch offset after the last fetch that
    /// returned records (Kafka's `PartitionFetchState.lag`), None before the first.
    pub(crate) lag: Option<i64>,
}

impl FollowedPartition {
    /// Kafka's `isReplicaInSync`: the last fetch reached the leader's high watermark.
    pub(crate) fn is_replica_in_sync(&self) -> bool {
        self.lag.is_some_and(|l| l <= 0)
    }
}

/// A fetcher's partitions, guarded by one lock held while a response is applied.
pub(crate) struct FetcherShared {
    pub(crate) partitions: Mutex<BTreeMap<TopicPartition, FollowedPartition>>,
    pub(crate) wake: Notify,
}

struct FetcherHandle {
    shared: Arc<FetcherShared>,
    address: String,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// Key of a fetcher: (source broker, fetcher id).
type FetcherKey = (i32, usize);

/// The replica fetchers of this broker (Kafka's `ReplicaFetcherManager`).
pub struct ReplicaFetcherManager {
    ctx: Arc<FetcherContext>,
    fetchers: Mutex<BTreeMap<FetcherKey, FetcherHandle>>,
    /// Which fetcher each followed partition is in, with the leader epoch it follows.
    assigned: Mutex<HashMap<TopicPartition, (FetcherKey, i32, Uuid)>>,
    runtime: tokio::runtime::Handle,
    stopped: AtomicBool,
}

impl ReplicaFetcherManager {
    /// A manager with no fetcher yet. Fetcher tasks run on the current tokio runtime (must be
    /// called inside one); appends and truncations run on `io`.
    pub fn new(
        config: FetcherConfig,
        broker_epoch: i64,
        io: Arc<IoPool>,
        clock: SharedClock,
        quotas: Arc<ReplicationQuotas>,
    ) -> Self {
        Self {
            ctx: Arc::new(FetcherContext {
                config,
                broker_epoch: AtomicI64::new(broker_epoch),
                io,
                clock,
                log_start_moved: AtomicBool::new(false),
                quotas,
            }),
            fetchers: Mutex::new(BTreeMap::new()),
            assigned: Mutex::new(HashMap::new()),
            runtime: tokio::runtime::Handle::current(),
            stopped: AtomicBool::new(false),
        }
    }

    /// The manager's settings.
    pub fn config(&self) -> &FetcherConfig {
        &self.ctx.config
    }

    /// Which (source broker, fetcher id) fetches `tp`, if any.
    pub fn fetcher_of(&self, tp: &TopicPartition) -> Option<(i32, usize)> {
        self.assigned.lock().get(tp).map(|(k, _, _)| *k)
    }

    /// The number of running fetchers.
    pub fn num_fetchers(&self) -> usize {
        self.fetchers.lock().len()
    }

    /// Whether a follower's log start offset moved since the last call (then
    /// `log-start-offset-checkpoint` should be written).
    pub fn take_log_start_moved(&self) -> bool {
        self.ctx.log_start_moved.swap(false, Ordering::AcqRel)
    }

    fn leader_address(&self, image: &MetadataImage, leader: i32) -> Option<String> {
        let reg = image.brokers.get(&leader)?;
        let endpoint = match &self.ctx.config.listener_name {
            Some(name) => reg.endpoints.iter().find(|e| &e.name == name),
            None => reg.endpoints.first(),
        }?;
        Some(format!("{}:{}", endpoint.host, endpoint.port))
    }

    /// Adds partitions to the fetchers of their leaders: (partition, leader, leader epoch,
    /// leader address). A partition already fetched from that leader in that epoch keeps its
    /// state; a fetcher whose leader moved to another address is restarted there with its
    /// partitions.
    fn add_partitions(&self, adds: Vec<(Arc<Partition>, i32, i32, String)>) {
        let n = self.ctx.config.num_fetchers;
        for (p, leader, epoch, address) in adds {
            let tp = p.topic_partition().clone();
            let key = (leader, fetcher_id(&tp.topic, tp.partition, n));
            let previous = self.assigned.lock().get(&tp).copied();
            if let Some((old_key, old_epoch, _)) = previous {
                // A fetcher drops a partition whose log dir went offline on its own
                // (`fetcher::apply_fetch_response`): then it is added again.
                if old_key == key && old_epoch == epoch && self.fetches(key, &tp) {
                    self.ensure_address(key, &address);
                    continue;
                }
                self.remove_partitions(std::slice::from_ref(&tp));
            }
            let shared = self.fetcher(key, &address);
            let state = PartitionFetchState::new(
                p.log.log_end_offset(),
                epoch,
                p.log.latest_leader_epoch(),
            );
            tracing::info!(partition = %tp, leader, leader_epoch = epoch, fetch_offset = state.fetch_offset,
                "following the leader");
            let topic_id = p.topic_id;
            shared.partitions.lock().insert(
                tp.clone(),
                FollowedPartition {
                    topic_id,
                    partition: p,
                    leader,
                    state,
                    lag: None,
                },
            );
            shared.wake.notify_one();
            self.assigned.lock().insert(tp, (key, epoch, topic_id));
        }
    }

    /// Whether the fetcher `key` runs and fetches `tp`.
    fn fetches(&self, key: FetcherKey, tp: &TopicPartition) -> bool {
        let shared = self.fetchers.lock().get(&key).map(|f| f.shared.clone());
        shared.is_some_and(|s| s.partitions.lock().contains_key(tp))
    }

    /// Removes partitions from their fetchers (Kafka's `removeFetcherForPartitions`); blocks
    /// while the fetcher applies a response.
    pub fn remove_partitions(&self, tps: &[TopicPartition]) {
        for tp in tps {
            let Some((key, _, _)) = self.assigned.lock().remove(tp) else {
                continue;
            };
            let shared = self.fetchers.lock().get(&key).map(|f| f.shared.clone());
            if let Some(shared) = shared {
                if shared.partitions.lock().remove(tp).is_some() {
                    tracing::info!(partition = %tp, "stopped following");
                }
            }
        }
    }

    /// The fetcher for `key`, started at `address` if it does not run.
    fn fetcher(&self, key: FetcherKey, address: &str) -> Arc<FetcherShared> {
        self.ensure_address(key, address);
        let mut fetchers = self.fetchers.lock();
        if let Some(f) = fetchers.get(&key) {
            return f.shared.clone();
        }
        let shared = Arc::new(FetcherShared {
            partitions: Mutex::new(BTreeMap::new()),
            wake: Notify::new(),
        });
        let handle = self.spawn(key, address.to_string(), shared.clone());
        fetchers.insert(key, handle);
        shared
    }

    fn spawn(&self, key: FetcherKey, address: String, shared: Arc<FetcherShared>) -> FetcherHandle {
        let (stop, stop_rx) = watch::channel(false);
        tracing::info!(source_broker = key.0, fetcher_id = key.1, %address, "starting replica fetcher");
        let task = self.runtime.spawn(fetcher::run(
            self.ctx.clone(),
            shared.clone(),
            key.0,
            key.1,
            address.clone(),
            stop_rx,
        ));
        FetcherHandle {
            shared,
            address,
            stop,
            task,
        }
    }

    /// Restarts the fetcher `key` at `address` (with its partitions) if it runs elsewhere.
    fn ensure_address(&self, key: FetcherKey, address: &str) {
        let mut fetchers = self.fetchers.lock();
        let Some(f) = fetchers.get(&key) else {
            return;
        };
        if f.address == address {
            return;
        }
        tracing::info!(source_broker = key.0, old = %f.address, new = %address,
            "the source broker moved; restarting its fetcher");
        let old = fetchers.remove(&key);
        if let Some(old) = old {
            let _ = old.stop.send(true);
            let handle = self.spawn(key, address.to_string(), old.shared.clone());
            fetchers.insert(key, handle);
        }
    }

    /// Stops fetchers that have no partition left (Kafka's `shutdownIdleFetcherThreads`).
    pub fn shutdown_idle_fetchers(&self) {
        let mut fetchers = self.fetchers.lock();
        let idle: Vec<FetcherKey> = fetchers
            .iter()
            .filter(|(_, f)| f.shared.partitions.lock().is_empty())
            .map(|(k, _)| *k)
            .collect();
        for key in idle {
            if let Some(f) = fetchers.remove(&key) {
                tracing::info!(
                    source_broker = key.0,
                    fetcher_id = key.1,
                    "stopping idle replica fetcher"
                );
                let _ = f.stop.send(true);
            }
        }
    }

    /// Stops every fetcher (their connections close) and waits for their tasks; no fetcher
    /// starts afterwards.
    pub async fn shutdown(&self) {
        self.stopped.store(true, Ordering::Release);
        let handles: Vec<FetcherHandle> = {
            let mut fetchers = self.fetchers.lock();
            std::mem::take(&mut *fetchers).into_values().collect()
        };
        self.assigned.lock().clear();
        for h in &handles {
            let _ = h.stop.send(true);
        }
        for h in handles {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), h.task).await;
        }
    }
}

impl ReplicaFetchers for ReplicaFetcherManager {
    /// The partitions leave their fetchers ([`ReplicaFetcherManager::remove_partitions`]).
    fn before_image(
        &self,
        image: &MetadataImage,
        local_broker: i32,
        scope: Option<&HashSet<String>>,
    ) {
        let stale: Vec<TopicPartition> = self
            .assigned
            .lock()
            .iter()
            .filter(|(tp, _)| scope.is_none_or(|names| names.contains(&tp.topic)))
            .filter(|(tp, ((leader, _), epoch, topic_id))| {
                let reg = image
                    .topic_by_id(topic_id)
                    .filter(|t| t.name == tp.topic)
                    .and_then(|t| t.partitions.get(&tp.partition));
                !reg.is_some_and(|r| {
                    r.leader == *leader
                        && r.leader != local_broker
                        && r.leader_epoch == *epoch
                        && r.replicas.contains(&local_broker)
                })
            })
            .map(|(tp, _)| tp.clone())
            .collect();
        if !stale.is_empty() {
            self.remove_partitions(&stale);
        }
    }

    /// Each followed partition joins the fetcher of its leader, from its log end offset when
    /// new or when its leader epoch changed (no truncation here: divergence is found through
    /// the fetch). A leader whose registration has no `listener` endpoint is logged and
    /// retried with the next image. Idle fetchers stop.
    fn after_image(&self, image: &MetadataImage, partitions: &[Arc<Partition>]) {
        if self.stopped.load(Ordering::Acquire) {
            return;
        }
        let mut adds = Vec::new();
        let mut offline = 0usize;
        for p in partitions {
            let s = p.state();
            if s.role != Role::Follower {
                continue;
            }
            // Kafka's makeFollowers/applyDelta skip a replica whose log is offline: a failed
            // or full dir cannot take the follower's appends, and a replica that fetched
            // anyway would be proposed for the ISR the controller refuses it
            // (INELIGIBLE_REPLICA) again and again.
            if log_dir_offline(p) {
                offline += 1;
                continue;
            }
            let Some(address) = self.leader_address(image, s.leader) else {
                tracing::warn!(partition = %p.topic_partition(), leader = s.leader,
                    listener = ?self.ctx.config.listener_name,
                    "the leader's registration has no inter-broker endpoint; not fetching");
                continue;
            };
            adds.push((p.clone(), s.leader, s.leader_epoch, address));
        }
        if offline > 0 {
            tracing::debug!(
                partitions = offline,
                "not following partitions whose log dir is offline"
            );
        }
        self.add_partitions(adds);
        self.shutdown_idle_fetchers();
    }

    /// Partitions in a dir that went offline stop being fetched at once (Kafka's
    /// `handleLogDirFailure` removes their fetchers); followers in a dir back online (a full
    /// dir with room again) are fetched again.
    fn on_log_dirs_changed(&self, image: &MetadataImage, partitions: &[Arc<Partition>]) {
        let offline: Vec<TopicPartition> = {
            let assigned = self.assigned.lock();
            partitions
                .iter()
                .filter(|p| log_dir_offline(p) && assigned.contains_key(p.topic_partition()))
                .map(|p| p.topic_partition().clone())
                .collect()
        };
        if !offline.is_empty() {
            tracing::warn!(
                partitions = offline.len(),
                "stopped following partitions whose log dir is offline; they are fetched \
                 again once the dir is back online"
            );
            self.remove_partitions(&offline);
        }
        self.after_image(image, partitions);
    }
}

/// Whether `p`'s log dir is offline (failed, or full until it has room again).
pub(crate) fn log_dir_offline(p: &Partition) -> bool {
    p.log.dir_health().is_some_and(|h| h.is_offline())
}

/// Writes `replication-offset-checkpoint` in every log dir with each hosted partition's high
/// watermark, and `log-start-offset-checkpoint` when a follower's log start offset moved
/// (`fetchers`: this broker's replica fetchers, None where none run).
/// Blocking: run it on the I/O pool or a blocking thread.
///
/// # Errors
/// The log manager's I/O errors.
pub fn checkpoint_high_watermarks(
    rm: &ReplicaManager,
    fetchers: Option<&ReplicaFetcherManager>,
) -> Result<(), gregor_log::LogError> {
    let hws: HashMap<TopicPartition, i64> = rm
        .partitions()
        .iter()
        .map(|p| (p.topic_partition().clone(), p.high_watermark()))
        .collect();
    rm.logs()
        .checkpoint_high_watermarks(|tp| hws.get(tp).copied())?;
    if fetchers.is_some_and(ReplicaFetcherManager::take_log_start_moved) {
        rm.logs().checkpoint_log_start_offsets()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
