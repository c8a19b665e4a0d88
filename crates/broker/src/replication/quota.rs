//! Replication throttles (KIP-73): Kafka's `ReplicationQuotaManager`, one for the leader side
//! and one for the follower side of this broker.
//!
//! - **Rate.** [`ByteRate`] is Kafka's `SimpleRate` over a `WindowedSum`: bytes recorded in
//!   samples of `replication.quota.window.size.seconds` (1 s), `replication.quota.window.num`
//!   (11) of them kept; the rate is their sum over the time since the oldest sample started
//!   (at least one window). The quota is exceeded when that rate is above the bound
//!   (`leader.replication.throttled.rate` / `follower.replication.throttled.rate`, bytes/s,
//!   dynamic per broker or cluster default, Long.MAX_VALUE = unthrottled). Sans-I/O: time is
//!   an argument in ms.
//! - **Throttled partitions** come from the topic configs `leader.replication.throttled.replicas`
//!   / `follower.replication.throttled.replicas` (Kafka's `TopicConfigHandler.parseThrottledPartitions`):
//!   `*` throttles every partition of the topic, a list of `partition:brokerId` throttles the
//!   listed partitions whose broker id is this broker's.
//! - **Who is throttled** (Kafka's `shouldLeaderThrottle` / `shouldFollowerThrottle`): a replica
//!   that is not in sync, of a throttled partition, while the quota is exceeded. Bytes of
//!   throttled partitions are recorded whether or not the replica is in sync, so the total
//!   replication traffic of throttled partitions stays under the bound.

use std::collections::{BTreeSet, HashMap};

use gregor_log::SharedClock;
use parking_lot::{Mutex, RwLock};

use crate::config::{validate_throttled_replicas, DynamicBrokerConfigs};

/// Kafka's `QuotaConfig.QUOTA_BYTES_PER_SECOND_DEFAULT`: no throttle.
pub const UNTHROTTLED: i64 = i64::MAX;

/// `replication.quota.window.num` default (Kafka's `NUM_QUOTA_SAMPLES_DEFAULT`).
pub const DEFAULT_WINDOW_NUM: i32 = 11;

/// `replication.quota.window.size.seconds` default (Kafka's `QUOTA_WINDOW_SIZE_SECONDS_DEFAULT`).
pub const DEFAULT_WINDOW_SIZE_SECONDS: i32 = 1;

#[derive(Debug, Clone, Copy)]
struct Sample {
    start_ms: i64,
    last_event_ms: i64,
    bytes: f64,
}

/// Kafka's `SimpleRate` on a `WindowedSum` (bytes per second), sans-I/O.
#[derive(Debug, Clone)]
pub struct ByteRate {
    /// Samples kept (`replication.quota.window.num`), plus one overlapping the window's
    /// start, as Kafka's `SampledStat`.
    samples: usize,
    /// Length of one sample (ms).
    window_ms: i64,
    ring: Vec<Sample>,
    current: usize,
}

impl ByteRate {
    /// A rate of `samples` samples of `window_ms` each (both at least 1).
    pub fn new(samples: usize, window_ms: i64) -> Self {
        Self {
            samples: samples.max(1),
            window_ms: window_ms.max(1),
            ring: Vec::new(),
            current: 0,
        }
    }

    /// Records `bytes` at `now_ms` (Kafka's `SampledStat.record`: a new sample once the
    /// current one is a window old).
    pub fn record(&mut self, bytes: u64, now_ms: i64) {
        if self.ring.is_empty() {
            self.ring.push(Sample {
                start_ms: now_ms,
                last_event_ms: now_ms,
                bytes: 0.0,
            });
            self.current = 0;
        }
        if now_ms - self.ring[self.current].start_ms >= self.window_ms {
            let max = self.samples + 1;
            self.current = (self.current + 1) % max;
            let fresh = Sample {
                start_ms: now_ms,
                last_event_ms: now_ms,
                bytes: 0.0,
            };
            if self.current >= self.ring.len() {
                self.ring.push(fresh);
            } else {
                self.ring[self.current] = fresh;
            }
        }
        let s = &mut self.ring[self.current];
        s.bytes += bytes as f64;
        s.last_event_ms = now_ms;
    }

    /// Samples without an event in the last `samples` windows restart empty at `now_ms`.
    fn purge(&mut self, now_ms: i64) {
        let expire = self.samples as i64 * self.window_ms;
        for s in &mut self.ring {
            if now_ms - s.last_event_ms >= expire {
                *s = Sample {
                    start_ms: now_ms,
                    last_event_ms: now_ms,
                    bytes: 0.0,
                };
            }
        }
    }

    /// The rate at `now_ms` in bytes per second: the kept samples' bytes over the time since
    /// the oldest started, at least one window (Kafka's `SimpleRate.measure`).
    pub fn measure(&mut self, now_ms: i64) -> f64 {
        self.purge(now_ms);
        // A fold from +0.0: an empty f64 `sum` is -0.0, which the gauge printed as `-0`.
        let total = self.ring.iter().fold(0.0, |acc, s| acc + s.bytes);
        let oldest = self.ring.iter().map(|s| s.start_ms).min().unwrap_or(now_ms);
        let elapsed_ms = (now_ms - oldest).max(self.window_ms);
        total * 1000.0 / elapsed_ms as f64
    }
}

/// Which partitions of one topic are throttled on this broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThrottledPartitions {
    /// `*`: every partition.
    All,
    /// The partitions listed with this broker's id.
    Some(BTreeSet<i32>),
}

/// Parses a `*.replication.throttled.replicas` value for broker `broker_id` (Kafka's
/// `parseThrottledPartitions`): the partitions listed with this broker id (possibly none).
/// None when empty or malformed (AlterConfigs refuses those: [`validate_throttled_replicas`]).
pub fn parse_throttled_replicas(value: &str, broker_id: i32) -> Option<ThrottledPartitions> {
    let value = value.trim();
    if value.is_empty() || validate_throttled_replicas(value).is_err() {
        return None;
    }
    if value == "*" {
        return Some(ThrottledPartitions::All);
    }
    let partitions: BTreeSet<i32> = value
        .split(',')
        .filter_map(|e| e.trim().split_once(':'))
        .filter_map(|(p, b)| Some((p.parse::<i32>().ok()?, b.parse::<i32>().ok()?)))
        .filter(|(_, b)| *b == broker_id)
        .map(|(p, _)| p)
        .collect();
    Some(ThrottledPartitions::Some(partitions))
}

/// One side's replication quota (Kafka's `ReplicationQuotaManager`): the bound, the rate of
/// the bytes recorded, and the throttled partitions. Thread-safe; time from the injected clock.
pub struct ReplicationQuotaManager {
    clock: SharedClock,
    bound: RwLock<i64>,
    rate: Mutex<ByteRate>,
    throttled: RwLock<HashMap<String, ThrottledPartitions>>,
    /// Total bytes recorded (for `gregor_replication_*_bytes_total`).
    recorded: std::sync::atomic::AtomicU64,
    /// Times a throttled replica was left out because the quota was exceeded.
    throttled_count: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for ReplicationQuotaManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationQuotaManager")
            .field("bound", &*self.bound.read())
            .field("throttled", &*self.throttled.read())
            .finish_non_exhaustive()
    }
}

impl ReplicationQuotaManager {
    /// An unthrottled quota with `window_num` samples of `window_size_seconds` each.
    pub fn new(clock: SharedClock, window_num: i32, window_size_seconds: i32) -> Self {
        Self {
            clock,
            bound: RwLock::new(UNTHROTTLED),
            rate: Mutex::new(ByteRate::new(
                window_num.max(1) as usize,
                i64::from(window_size_seconds.max(1)) * 1000,
            )),
            throttled: RwLock::new(HashMap::new()),
            recorded: std::sync::atomic::AtomicU64::new(0),
            throttled_count: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Sets the bound (bytes/s; negative is treated as 0, Long.MAX_VALUE is no throttle).
    pub fn update_quota(&self, bytes_per_second: i64) {
        *self.bound.write() = bytes_per_second.max(0);
    }

    /// The bound (bytes/s).
    pub fn upper_bound(&self) -> i64 {
        *self.bound.read()
    }

    /// Replaces the throttled partitions of every topic (from the image's topic configs).
    pub fn set_throttled(&self, throttled: HashMap<String, ThrottledPartitions>) {
        *self.throttled.write() = throttled;
    }

    /// Whether partition `partition` of `topic` is throttled here (Kafka's `isThrottled`).
    pub fn is_throttled(&self, topic: &str, partition: i32) -> bool {
        match self.throttled.read().get(topic) {
            Some(ThrottledPartitions::All) => true,
            Some(ThrottledPartitions::Some(set)) => set.contains(&partition),
            None => false,
        }
    }

    /// Whether the recorded rate is above the bound now (Kafka's `isQuotaExceeded`).
    pub fn is_quota_exceeded(&self) -> bool {
        let bound = *self.bound.read();
        if bound == UNTHROTTLED {
            return false;
        }
        self.rate.lock().measure(self.clock.now_ms()) > bound as f64
    }

    /// Records `bytes` of throttled partitions (Kafka's `record`: counted even above the bound).
    pub fn record(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.recorded
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        self.rate.lock().record(bytes, self.clock.now_ms());
    }

    /// Kafka's `shouldLeaderThrottle` / `shouldFollowerThrottle`: a replica not in sync, of a
    /// throttled partition, while the quota is exceeded. Counts the throttled answers.
    pub fn should_throttle(&self, in_sync: bool, topic: &str, partition: i32) -> bool {
        let throttle = !in_sync && self.is_throttled(topic, partition) && self.is_quota_exceeded();
        if throttle {
            self.throttled_count
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        throttle
    }

    /// The measured rate of throttled replication now (bytes/s).
    pub fn byte_rate(&self) -> f64 {
        self.rate.lock().measure(self.clock.now_ms())
    }

    /// Total bytes recorded since start.
    pub fn bytes_recorded(&self) -> u64 {
        self.recorded.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many times a partition was held back by this quota since start.
    pub fn throttled_total(&self) -> u64 {
        self.throttled_count
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// This broker's two replication quotas (Kafka's `QuotaManagers.leader` / `.follower`).
#[derive(Debug)]
pub struct ReplicationQuotas {
    /// Bytes this leader sends to followers of `leader.replication.throttled.replicas`,
    /// bounded by `leader.replication.throttled.rate`.
    pub leader: ReplicationQuotaManager,
    /// Bytes this follower fetches for `follower.replication.throttled.replicas`, bounded by
    /// `follower.replication.throttled.rate`.
    pub follower: ReplicationQuotaManager,
}

impl ReplicationQuotas {
    /// Unthrottled quotas with `replication.quota.window.num` samples of
    /// `replication.quota.window.size.seconds`.
    pub fn new(clock: SharedClock, window_num: i32, window_size_seconds: i32) -> Self {
        Self {
            leader: ReplicationQuotaManager::new(clock.clone(), window_num, window_size_seconds),
            follower: ReplicationQuotaManager::new(clock, window_num, window_size_seconds),
        }
    }

    /// Applies the configs of a metadata image (Kafka's `BrokerConfigHandler` and
    /// `TopicConfigHandler`): the rates from this broker's dynamic configs (per broker id,
    /// else the cluster default, else unthrottled), the throttled partitions of every topic
    /// from its `*.replication.throttled.replicas` for `broker_id`.
    pub fn apply_configs<'a>(
        &self,
        dynamic: &DynamicBrokerConfigs,
        topic_configs: impl Iterator<Item = (&'a str, std::collections::BTreeMap<String, String>)>,
        broker_id: i32,
    ) {
        let rate = |name: &str| {
            dynamic
                .get(name)
                .and_then(|(v, _)| v.trim().parse::<i64>().ok())
                .unwrap_or(UNTHROTTLED)
        };
        self.leader
            .update_quota(rate("leader.replication.throttled.rate"));
        self.follower
            .update_quota(rate("follower.replication.throttled.rate"));
        let mut leader = HashMap::new();
        let mut follower = HashMap::new();
        for (topic, configs) in topic_configs {
            for (name, out) in [
                ("leader.replication.throttled.replicas", &mut leader),
                ("follower.replication.throttled.replicas", &mut follower),
            ] {
                if let Some(t) = configs
                    .get(name)
                    .and_then(|v| parse_throttled_replicas(v, broker_id))
                {
                    out.insert(topic.to_string(), t);
                }
            }
        }
        self.leader.set_throttled(leader);
        self.follower.set_throttled(follower);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gregor_log::ManualClock;

    #[test]
    fn rate_is_bytes_over_elapsed_time_with_one_window_minimum() {
        let mut r = ByteRate::new(11, 1000);
        r.record(500, 0);
        // Less than one window elapsed: divided by one window.
        assert_eq!(r.measure(100), 500.0);
        r.record(500, 1500);
        // 1000 bytes over 2 s since the first sample started.
        assert_eq!(r.measure(2000), 500.0);
        // Samples without events for 11 windows are gone.
        assert_eq!(r.measure(1500 + 11_000), 0.0);
        // +0, not -0 (which a gauge prints as `-0`).
        assert!(r.measure(1500 + 11_000).is_sign_positive());
        assert!(ByteRate::new(11, 1000).measure(0).is_sign_positive());
    }

    #[test]
    fn old_samples_roll_out_of_the_ring() {
        let mut r = ByteRate::new(2, 1000);
        for t in 0..10 {
            r.record(1000, t * 1000);
        }
        // Ring of 3 (2 + the overlapping one): samples at 7, 8, 9 s, and the one at 7 s is
        // two windows without an event, so purged: 2000 bytes over the 1 s since 8 s.
        assert_eq!(r.measure(9000), 2000.0);
        // Half a window later: 2000 bytes over 1.5 s.
        assert!((r.measure(9500) - 2000.0 / 1.5).abs() < 1e-6);
    }

    #[test]
    fn quota_exceeded_only_above_the_bound_and_only_when_throttled() {
        let clock = ManualClock::new(10_000);
        let q = ReplicationQuotaManager::new(clock.clone(), 11, 1);
        q.record(5_000_000);
        // Unthrottled by default.
        assert!(!q.is_quota_exceeded());
        q.update_quota(1000);
        assert!(q.is_quota_exceeded());
        q.set_throttled(HashMap::from([
            (
                "t".to_string(),
                ThrottledPartitions::Some(BTreeSet::from([1])),
            ),
            ("all".to_string(), ThrottledPartitions::All),
        ]));
        assert!(q.should_throttle(false, "t", 1));
        assert!(
            !q.should_throttle(true, "t", 1),
            "in-sync replicas are never throttled"
        );
        assert!(!q.should_throttle(false, "t", 0));
        assert!(q.should_throttle(false, "all", 7));
        assert!(!q.should_throttle(false, "other", 1));
        assert_eq!(q.throttled_total(), 2);
        // 5 MB over 11 windows: still above 1000 B/s until the samples expire.
        clock.advance_ms(10_999);
        assert!(q.is_quota_exceeded());
        clock.advance_ms(1);
        assert!(!q.is_quota_exceeded());
    }

    #[test]
    fn quota_lets_through_about_the_bound_over_time() {
        // A follower that fetches 100 KB whenever the quota allows, every 10 ms, for 20 s
        // under a 200 KB/s bound moves about 4 MB (plus at most one fetch).
        let clock = ManualClock::new(0);
        let q = ReplicationQuotaManager::new(clock.clone(), 11, 1);
        q.update_quota(200_000);
        q.set_throttled(HashMap::from([("t".to_string(), ThrottledPartitions::All)]));
        let mut moved = 0u64;
        for _ in 0..2000 {
            if !q.should_throttle(false, "t", 0) {
                q.record(100_000);
                moved += 100_000;
            }
            clock.advance_ms(10);
        }
        assert!(
            (3_800_000..=4_300_000).contains(&moved),
            "moved {moved} bytes in 20 s at 200 KB/s"
        );
    }

    #[test]
    fn throttled_replicas_parse_and_validate_as_kafka() {
        assert_eq!(
            parse_throttled_replicas("0:1,1:2, 2:1", 1),
            Some(ThrottledPartitions::Some(BTreeSet::from([0, 2])))
        );
        assert_eq!(
            parse_throttled_replicas(" * ", 3),
            Some(ThrottledPartitions::All)
        );
        assert_eq!(parse_throttled_replicas("", 3), None);
        for ok in ["", "*", "0:1", "0:1,1:2", " 0:1 , 1:2 ", "0:1,,1:2", "0:1,"] {
            assert!(validate_throttled_replicas(ok).is_ok(), "{ok:?}");
        }
        for bad in ["a", "0", "0:", ":1", "0:1,*", "-1:1", "0:1:2", "0 :1"] {
            assert!(validate_throttled_replicas(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn throttle_configs_validate_as_kafka() {
        use crate::config::{
            is_dynamic_broker_config, validate_broker_config, validate_topic_config,
        };
        // --verify deletes all three rates.
        for name in [
            "leader.replication.throttled.rate",
            "follower.replication.throttled.rate",
            "replica.alter.log.dirs.io.max.bytes.per.second",
        ] {
            assert!(validate_broker_config(name, None).is_ok(), "{name}");
            assert!(validate_broker_config(name, Some("1000")).is_ok(), "{name}");
            assert!(validate_broker_config(name, Some("-1")).is_err(), "{name}");
            assert!(
                validate_broker_config(name, Some("fast")).is_err(),
                "{name}"
            );
            assert!(is_dynamic_broker_config(name), "{name}");
        }
        // The replica lists are topic configs only (no broker synonym in Kafka); as a broker
        // config the name is one Kafka does not know, which Kafka's broker stores as a custom
        // config (it accepts any name it does not know).
        assert!(validate_broker_config("leader.replication.throttled.replicas", Some("*")).is_ok());
        assert!(validate_topic_config("leader.replication.throttled.replicas", "0:1,1:2").is_ok());
        assert!(validate_topic_config("follower.replication.throttled.replicas", "*").is_ok());
        let e = validate_topic_config("follower.replication.throttled.replicas", "0-1")
            .expect_err("not partition:broker");
        assert!(e.to_string().contains("must be the literal '*'"), "{e}");
    }

    #[test]
    fn quotas_follow_the_configs() {
        let q = ReplicationQuotas::new(ManualClock::new(0), 11, 1);
        let mut dynamic = crate::config::DynamicBrokerConfigs::default();
        dynamic
            .cluster_default
            .insert("leader.replication.throttled.rate".into(), "500".into());
        dynamic
            .per_broker
            .insert("leader.replication.throttled.rate".into(), "700".into());
        dynamic
            .cluster_default
            .insert("follower.replication.throttled.rate".into(), "900".into());
        let topics = [
            (
                "a",
                std::collections::BTreeMap::from([(
                    "leader.replication.throttled.replicas".to_string(),
                    "0:1,1:2,3:1".to_string(),
                )]),
            ),
            (
                "b",
                std::collections::BTreeMap::from([(
                    "follower.replication.throttled.replicas".to_string(),
                    "*".to_string(),
                )]),
            ),
        ];
        q.apply_configs(&dynamic, topics.iter().map(|(t, c)| (*t, c.clone())), 1);
        assert_eq!(q.leader.upper_bound(), 700, "per broker over the default");
        assert_eq!(q.follower.upper_bound(), 900);
        assert!(q.leader.is_throttled("a", 0) && q.leader.is_throttled("a", 3));
        assert!(!q.leader.is_throttled("a", 1) && !q.leader.is_throttled("b", 0));
        assert!(q.follower.is_throttled("b", 42) && !q.follower.is_throttled("a", 0));
        // Configs removed (--verify): unthrottled, nothing throttled.
        q.apply_configs(&Default::default(), std::iter::empty(), 1);
        assert_eq!(q.leader.upper_bound(), UNTHROTTLED);
        assert!(!q.leader.is_throttled("a", 0) && !q.follower.is_throttled("b", 0));
    }
}
