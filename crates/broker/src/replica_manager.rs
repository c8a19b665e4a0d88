//! ReplicaManager: the partitions this broker hosts, their leadership state (leader epoch, ISR,
//! high watermark, log end offset) and the waits that depend on them (delayed produce for
//! acks=all, delayed fetch for long polls).
//!
//! Replication-ready by design (DESIGN.md): the high watermark is the minimum log end offset over
//! the ISR; with one replica the ISR is {self} and the high watermark follows every append, but
//! through the same code that followers will drive. Waiters are woken by notifications, never by
//! polling.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use gregor_log::{AppendInfo, LogError, LogManager, PartitionLog, ReadInfo, TopicPartition};
use gregor_metadata::{MetadataImage, PartitionRegistration};
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::config::{BrokerConfig, DynamicBrokerConfigs, TopicConfigs};
use crate::error_codes as ec;
use crate::observability::TopicMetrics;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Leadership state of a partition, from the latest metadata.
#[derive(Debug, Clone)]
pub struct PartitionState {
    /// Leader broker id.
    pub leader: i32,
    /// Leader epoch.
    pub leader_epoch: i32,
    /// Replica ids.
    pub replicas: Vec<i32>,
    /// In-sync replica ids.
    pub isr: Vec<i32>,
    /// `min.insync.replicas` of the topic.
    pub min_insync_replicas: usize,
}

/// One partition hosted by this broker.
pub struct Partition {
    /// Topic name.
    pub topic: String,
    /// Topic id.
    pub topic_id: Uuid,
    /// Partition index.
    pub index: i32,
    /// The partition's log.
    pub log: Arc<PartitionLog>,
    state: RwLock<PartitionState>,
    high_watermark: AtomicI64,
    /// Log end offsets of followers by broker id (empty with one replica).
    follower_leos: Mutex<HashMap<i32, i64>>,
    /// Fetches and produces waiting for this partition's high watermark to move. Bounded by the
    /// number of in-flight requests (each connection has at most `queued.max.requests`).
    waiters: Mutex<Vec<Arc<Notify>>>,
    local_broker: i32,
    /// Byte and record counters of the topic (Prometheus handles, created once).
    pub metrics: TopicMetrics,
}

impl Partition {
    /// The current leadership state.
    pub fn state(&self) -> PartitionState {
        self.state.read().clone()
    }

    /// The high watermark: the offset below which every record is replicated to the ISR.
    pub fn high_watermark(&self) -> i64 {
        self.high_watermark.load(Ordering::Acquire)
    }

    /// The last stable offset. Without transactions it equals the high watermark.
    pub fn last_stable_offset(&self) -> i64 {
        self.high_watermark()
    }

    /// True when this broker leads the partition.
    pub fn is_leader(&self) -> bool {
        self.state.read().leader == self.local_broker
    }

    /// Checks a request's `current_leader_epoch` (-1 = not given) against ours (KIP-320).
    ///
    /// # Errors
    /// FENCED_LEADER_EPOCH (74) when the client's epoch is older, UNKNOWN_LEADER_EPOCH (76) when
    /// it is newer, NOT_LEADER_OR_FOLLOWER (6) when this broker does not lead.
    pub fn check_leader(&self, current_leader_epoch: i32) -> Result<(), i16> {
        let s = self.state.read();
        if current_leader_epoch >= 0 {
            if current_leader_epoch < s.leader_epoch {
                return Err(ec::FENCED_LEADER_EPOCH);
            }
            if current_leader_epoch > s.leader_epoch {
                return Err(ec::UNKNOWN_LEADER_EPOCH);
            }
        }
        if s.leader != self.local_broker {
            return Err(ec::NOT_LEADER_OR_FOLLOWER);
        }
        Ok(())
    }

    /// Recomputes the high watermark as the minimum log end offset over the ISR and wakes
    /// waiters if it moved. The high watermark never goes backwards.
    fn maybe_increment_high_watermark(&self) {
        let leo = self.log.log_end_offset();
        let new_hw = {
            let s = self.state.read();
            let followers = self.follower_leos.lock();
            s.isr
                .iter()
                .filter(|id| **id != self.local_broker)
                .map(|id| followers.get(id).copied().unwrap_or(0))
                .fold(leo, i64::min)
        };
        let old = self.high_watermark.fetch_max(new_hw, Ordering::AcqRel);
        debug_assert!(self.high_watermark() <= leo, "HW <= LEO");
        if new_hw > old {
            self.wake_waiters();
        }
    }

    fn wake_waiters(&self) {
        for w in self.waiters.lock().drain(..) {
            w.notify_one();
        }
    }

    /// Registers `notify` to be woken at the next high-watermark move (or leadership change).
    pub fn register_waiter(&self, notify: &Arc<Notify>) {
        self.waiters.lock().push(notify.clone());
    }

    /// Appends a produce request's records as leader.
    ///
    /// # Errors
    /// Kafka error codes: NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS (19) for acks=all with
    /// fewer in-sync replicas than `min.insync.replicas`, and the log's errors
    /// ([`LogError::kafka_error_code`]) with a message.
    pub fn append_records_as_leader(
        &self,
        records: &mut [u8],
        required_acks: i16,
    ) -> Result<AppendInfo, (i16, String)> {
        let leader_epoch = {
            let s = self.state.read();
            if s.leader != self.local_broker {
                return Err((ec::NOT_LEADER_OR_FOLLOWER, String::new()));
            }
            if required_acks == -1 && s.isr.len() < s.min_insync_replicas {
                return Err((
                    ec::NOT_ENOUGH_REPLICAS,
                    format!(
                        "The size of the current ISR {} is insufficient to satisfy the min.isr requirement of {}",
                        s.isr.len(),
                        s.min_insync_replicas
                    ),
                ));
            }
            s.leader_epoch
        };
        let info = self
            .log
            .append_as_leader(records, leader_epoch, now_ms())
            .map_err(|e| (e.kafka_error_code(), e.to_string()))?;
        if !info.duplicate {
            self.metrics.bytes_in.increment(info.bytes);
            self.metrics.records_in.increment(info.records);
        }
        self.maybe_increment_high_watermark();
        Ok(info)
    }

    /// Reads for a consumer: up to `max_bytes` from `fetch_offset`, bounded by the high
    /// watermark (isolation 0) or last stable offset (isolation 1).
    ///
    /// # Errors
    /// The log's errors, e.g. OFFSET_OUT_OF_RANGE.
    pub fn read(
        &self,
        fetch_offset: i64,
        max_bytes: usize,
        isolation_level: i8,
        min_one_batch: bool,
    ) -> Result<ReadInfo, LogError> {
        let max_offset = if isolation_level == 1 {
            self.last_stable_offset()
        } else {
            self.high_watermark()
        };
        self.log
            .read(fetch_offset, max_bytes, max_offset, min_one_batch)
    }
}

/// The partitions hosted here, keyed by topic name and index.
pub struct ReplicaManager {
    local_broker: i32,
    config: BrokerConfig,
    logs: LogManager,
    partitions: RwLock<BTreeMap<(String, i32), Arc<Partition>>>,
    /// Dynamic broker configs of the latest image applied (KIP-226).
    dynamic_configs: RwLock<DynamicBrokerConfigs>,
}

impl ReplicaManager {
    /// Wraps the opened logs. Partitions are attached by [`ReplicaManager::apply_image`].
    pub fn new(local_broker: i32, config: BrokerConfig, logs: LogManager) -> Self {
        Self {
            local_broker,
            config,
            logs,
            partitions: RwLock::new(BTreeMap::new()),
            dynamic_configs: RwLock::new(DynamicBrokerConfigs::default()),
        }
    }

    /// The partition `topic`-`index`, if hosted here.
    pub fn partition(&self, topic: &str, index: i32) -> Option<Arc<Partition>> {
        self.partitions
            .read()
            .get(&(topic.to_string(), index))
            .cloned()
    }

    /// All hosted partitions.
    pub fn partitions(&self) -> Vec<Arc<Partition>> {
        self.partitions.read().values().cloned().collect()
    }

    /// This broker's dynamic configs as of the latest metadata image.
    pub fn dynamic_configs(&self) -> DynamicBrokerConfigs {
        self.dynamic_configs.read().clone()
    }

    /// The broker configuration.
    pub fn broker_config(&self) -> &BrokerConfig {
        &self.config
    }

    /// Runs retention on every hosted partition (Kafka's `LogManager.cleanupLogs`, every
    /// `log.retention.check.interval.ms`): deletes segments past `retention.ms`,
    /// `retention.bytes` or below the log start offset, bounded by each partition's high
    /// watermark, expires idle producers (`producer.id.expiration.ms`), and checkpoints the
    /// log start offsets when they moved. Errors are logged per partition.
    pub fn run_retention(&self, now_ms: i64) {
        let mut moved = false;
        for p in self.partitions() {
            match p.log.delete_old_segments(now_ms, p.high_watermark()) {
                Ok(r) => moved |= r.deleted_segments > 0,
                Err(e) => {
                    tracing::error!(topic = %p.topic, partition = p.index, error = %e, "retention failed");
                }
            }
            p.log
                .remove_expired_producers(now_ms, self.config.producer_id_expiration_ms());
        }
        if moved {
            if let Err(e) = self.logs.checkpoint_log_start_offsets() {
                tracing::error!(error = %e, "writing log-start-offset-checkpoint failed");
            }
        }
    }

    /// DeleteRecords for one partition (Kafka's `Partition.deleteRecordsOnLeader`): moves the
    /// log start offset to `offset` (-1: the high watermark) and persists it. Returns the new
    /// low watermark (log start offset).
    ///
    /// # Errors
    /// Kafka error codes: NOT_LEADER_OR_FOLLOWER, POLICY_VIOLATION (44) when `cleanup.policy`
    /// does not contain `delete`, OFFSET_OUT_OF_RANGE for an offset beyond the high watermark
    /// or negative, KAFKA_STORAGE_ERROR.
    pub fn delete_records(&self, p: &Partition, offset: i64) -> Result<i64, (i16, String)> {
        if !p.is_leader() {
            return Err((ec::NOT_LEADER_OR_FOLLOWER, String::new()));
        }
        let tp = format!("{}-{}", p.topic, p.index);
        if !p.log.config().cleanup_delete {
            return Err((
                ec::POLICY_VIOLATION,
                format!(
                    "Records of partition {tp} can not be deleted due to the configured policy"
                ),
            ));
        }
        let hw = p.high_watermark();
        let offset = if offset == -1 { hw } else { offset };
        if offset < 0 || offset > hw {
            return Err((
                ec::OFFSET_OUT_OF_RANGE,
                format!(
                    "Cannot increment the log start offset to {offset} of partition {tp} since it is larger than the high watermark {hw}"
                ),
            ));
        }
        let low = p
            .log
            .maybe_increment_log_start_offset(offset)
            .map_err(|e| (e.kafka_error_code(), e.to_string()))?;
        self.logs
            .checkpoint_log_start_offsets()
            .map_err(|e| (e.kafka_error_code(), e.to_string()))?;
        Ok(low)
    }

    /// The log manager.
    pub fn logs(&self) -> &LogManager {
        &self.logs
    }

    /// Brings hosted partitions in line with a metadata image: creates logs for new
    /// partitions this broker replicates, updates leadership state, and deletes the logs of
    /// partitions whose topic is gone (KIP-516: matched by topic id, so a re-created topic of
    /// the same name gets fresh logs).
    ///
    /// # Errors
    /// The first log error; partitions handled before it stay applied.
    pub fn apply_image(&self, image: &MetadataImage) -> Result<(), LogError> {
        let mut wanted: BTreeMap<(String, i32), (Uuid, PartitionRegistration, TopicConfigs)> =
            BTreeMap::new();
        let dynamic = DynamicBrokerConfigs::from_image(image, self.local_broker);
        *self.dynamic_configs.write() = dynamic.clone();
        for t in image.topics.values() {
            let overrides = image.configs_of(gregor_metadata::ConfigResource::Topic, &t.name);
            let configs = TopicConfigs::resolve_dynamic(&self.config, &dynamic, &overrides);
            for (idx, p) in &t.partitions {
                if p.replicas.contains(&self.local_broker) {
                    wanted.insert(
                        (t.name.clone(), *idx),
                        (t.topic_id, p.clone(), configs.clone()),
                    );
                }
            }
        }
        let current: Vec<((String, i32), Arc<Partition>)> = self
            .partitions
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (key, p) in current {
            let keep = wanted.get(&key).is_some_and(|(id, _, _)| *id == p.topic_id);
            if !keep {
                self.partitions.write().remove(&key);
                p.wake_waiters();
                self.logs
                    .delete(&TopicPartition::new(key.0.clone(), key.1))?;
            }
        }
        for ((topic, index), (topic_id, reg, configs)) in wanted {
            let min_isr = configs
                .get("min.insync.replicas")
                .parse::<usize>()
                .unwrap_or(1);
            let state = PartitionState {
                leader: reg.leader,
                leader_epoch: reg.leader_epoch,
                replicas: reg.replicas.clone(),
                isr: reg.isr.clone(),
                min_insync_replicas: min_isr,
            };
            if let Some(p) = self.partition(&topic, index) {
                // Topic and dynamic broker config changes (AlterConfigs) reach the log here.
                let log_config = configs.log_config();
                if p.log.config() != log_config {
                    p.log.update_config(log_config);
                }
                *p.state.write() = state;
                p.maybe_increment_high_watermark();
                p.wake_waiters();
                continue;
            }
            let tp = TopicPartition::new(topic.clone(), index);
            let log_config = configs.log_config();
            let log = self
                .logs
                .get_or_create(&tp, *topic_id.as_bytes(), log_config.clone())?;
            // Logs loaded at start-up were opened with the broker defaults.
            log.update_config(log_config);
            let p = Arc::new(Partition {
                topic: topic.clone(),
                topic_id,
                index,
                log,
                state: RwLock::new(state),
                high_watermark: AtomicI64::new(0),
                follower_leos: Mutex::new(HashMap::new()),
                waiters: Mutex::new(Vec::new()),
                local_broker: self.local_broker,
                metrics: TopicMetrics::new(&topic),
            });
            p.maybe_increment_high_watermark();
            self.partitions.write().insert((topic, index), p);
        }
        Ok(())
    }
}
