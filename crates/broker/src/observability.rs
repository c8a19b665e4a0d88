//! Metrics: names, the Prometheus recorder and the hot-path handles the services keep. The
//! admin HTTP listener that serves them is [`crate::admin`]. This module imports no service,
//! so every service can record metrics without an import cycle.
//!
//! Metrics go through the `metrics` facade into `metrics-exporter-prometheus`; process metrics
//! (RSS, CPU, open files) come from `metrics-process`. Units are in the names (`_bytes`,
//! `_seconds`, `_total`). Hot-path handles (per-partition byte and record counters) are created
//! once and kept, so the produce path does no registry lookups.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use gregor_protocol::kafka_protocol::messages::ApiKey;
use metrics::{Counter, Gauge, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use parking_lot::RwLock;
use tracing::warn;

/// Requests received, by API and version.
pub const REQUESTS_TOTAL: &str = "gregor_requests_total";
/// Error codes returned, by API and Kafka error name (per partition where the API is
/// partitioned).
pub const REQUEST_ERRORS_TOTAL: &str = "gregor_request_errors_total";
/// Time from a request's last byte read to its handler starting.
pub const REQUEST_QUEUE_SECONDS: &str = "gregor_request_queue_seconds";
/// Time spent in the handler's immediate part (validation, appends, first read).
pub const REQUEST_PROCESSING_SECONDS: &str = "gregor_request_processing_seconds";
/// Time a deferred request waited (acks=all for replication, fetch long poll).
pub const REQUEST_REMOTE_SECONDS: &str = "gregor_request_remote_seconds";
/// Time to write a response to the socket.
pub const RESPONSE_SEND_SECONDS: &str = "gregor_response_send_seconds";
/// Bytes of record batches appended, by topic.
pub const TOPIC_BYTES_IN_TOTAL: &str = "gregor_topic_bytes_in_total";
/// Records appended, by topic.
pub const TOPIC_RECORDS_IN_TOTAL: &str = "gregor_topic_records_in_total";
/// Bytes of record batches sent to consumers, by topic.
pub const TOPIC_BYTES_OUT_TOTAL: &str = "gregor_topic_bytes_out_total";
/// Records sent to consumers, by topic.
pub const TOPIC_RECORDS_OUT_TOTAL: &str = "gregor_topic_records_out_total";
/// Open client connections.
pub const CONNECTIONS_ACTIVE: &str = gregor_network::server::CONNECTIONS_ACTIVE;
/// Client connections accepted.
pub const CONNECTIONS_OPENED_TOTAL: &str = gregor_network::server::CONNECTIONS_OPENED_TOTAL;
/// Produce requests waiting for the high watermark (acks=all).
pub const DELAYED_PRODUCE_REQUESTS: &str = "gregor_delayed_produce_requests";
/// Fetch requests waiting for data (long poll).
pub const DELAYED_FETCH_REQUESTS: &str = "gregor_delayed_fetch_requests";
/// Partitions hosted by this broker.
pub const PARTITIONS: &str = "gregor_partitions";
/// Partitions this broker leads.
pub const LEADER_PARTITIONS: &str = "gregor_leader_partitions";
/// Led partitions whose ISR is smaller than their replica set.
pub const UNDER_REPLICATED_PARTITIONS: &str = "gregor_under_replicated_partitions";
/// Led partitions whose ISR is smaller than their effective `min.insync.replicas` (Kafka's
/// `UnderMinIsrPartitionCount`): acks=all produces to them fail with NOT_ENOUGH_REPLICAS.
pub const UNDER_MIN_ISR_PARTITIONS: &str = "gregor_under_min_isr_partitions";
/// Size of a partition's log. This family and the four after it, and
/// [`CONSUMER_GROUP_LAG`], are rendered at each scrape from the partitions themselves
/// (`crate::admin`), not kept in the registry; by topic with `admin.metrics.per.partition=false`.
pub const LOG_SIZE_BYTES: &str = "gregor_log_size_bytes";
/// Segments of a partition's log.
pub const LOG_SEGMENTS: &str = "gregor_log_segments";
/// Log end offset of a partition.
pub const LOG_END_OFFSET: &str = "gregor_log_end_offset";
/// Log start offset of a partition.
pub const LOG_START_OFFSET: &str = "gregor_log_start_offset";
/// High watermark of a partition.
pub const HIGH_WATERMARK: &str = "gregor_high_watermark";
/// Partitions of a topic hosted here; only with `admin.metrics.per.partition=false`, where the
/// log families are sums over them.
pub const TOPIC_PARTITIONS: &str = "gregor_topic_partitions";
/// Consumer groups hosted by this broker's coordinator, by state and type.
pub const CONSUMER_GROUPS: &str = "gregor_consumer_groups";
/// Consumer lag in records: the partition's high watermark minus the group's committed
/// offset, by group, topic and partition.
pub const CONSUMER_GROUP_LAG: &str = "gregor_consumer_group_lag";
/// Seconds since the broker started.
pub const UPTIME_SECONDS: &str = "gregor_uptime_seconds";
/// Gauge, label `type` (`leader`/`follower`): the measured byte rate of throttled replication
/// (Kafka's `LeaderReplication` / `FollowerReplication` `byte-rate`, KIP-73).
pub const REPLICATION_THROTTLED_BYTE_RATE: &str = "gregor_replication_throttled_byte_rate";
/// Counter, label `type`: bytes of throttled partitions replicated (KIP-73).
pub const REPLICATION_THROTTLED_BYTES_TOTAL: &str = "gregor_replication_throttled_bytes_total";
/// Counter, label `type`: times a throttled out-of-sync replica was held back because the
/// quota was exceeded (the leader answered it no records / the follower left it out).
pub const REPLICATION_THROTTLED_TOTAL: &str = "gregor_replication_throttled_total";
/// Gauge: directory assignments (KIP-858) queued, waiting or in flight (Kafka's
/// `QueuedReplicaToDirAssignments`; [`crate::assignments::AssignmentsManager`]).
pub const QUEUED_REPLICA_TO_DIR_ASSIGNMENTS: &str = "gregor_queued_replica_to_dir_assignments";
/// Gauge: incremental fetch sessions the broker holds (KIP-227; Kafka's
/// `NumIncrementalFetchSessions`).
pub const FETCH_SESSIONS: &str = "gregor_fetch_sessions";
/// Gauge: partitions cached across all fetch sessions (Kafka's
/// `NumIncrementalFetchPartitionsCached`).
pub const FETCH_SESSION_PARTITIONS: &str = "gregor_fetch_session_partitions";
/// Counter: fetch sessions evicted to make room for new ones (Kafka's
/// `IncrementalFetchSessionEvictionsPerSec`, here a total).
pub const FETCH_SESSION_EVICTIONS_TOTAL: &str = "gregor_fetch_session_evictions_total";
/// Always 1, labelled with the broker's version (`version="0.1.0"`).
pub const BUILD_INFO: &str = "gregor_build_info";
/// 1 when the broker is ready (logs loaded, listeners up).
pub const READY: &str = "gregor_ready";
/// Gauge, one series per log directory (`dir`): 1 while the directory is offline (full since a
/// write failed for lack of space, or failed), else 0. `/ready` says not ready meanwhile.
pub const LOG_DIR_OFFLINE: &str = "gregor_log_dir_offline";
/// Gauge: segment files (`.log`, `.index`, `.timeindex`) open now ([`gregor_log::files`]).
pub const LOG_SEGMENT_FILES_OPEN: &str = "gregor_log_segment_files_open";
/// Gauge: the budget of open segment files (half the open-file limit).
pub const LOG_SEGMENT_FILES_OPEN_MAX: &str = "gregor_log_segment_files_open_max";
/// Counter: segment files closed to stay within the budget (reopened on their next use).
pub const LOG_SEGMENT_FILES_EVICTED_TOTAL: &str = "gregor_log_segment_files_evicted_total";
/// Segment files closed because they were idle (`gregor_log::files::close_idle_files`).
pub const LOG_SEGMENT_FILES_IDLE_CLOSED_TOTAL: &str = "gregor_log_segment_files_idle_closed_total";
/// Gauge: heap bytes of inactive segments' index entries held now
/// ([`gregor_log::index_cache`]).
pub const LOG_INDEX_CACHE_BYTES: &str = "gregor_log_index_cache_bytes";
/// Gauge: their budget (`log.index.cache.bytes`).
pub const LOG_INDEX_CACHE_MAX_BYTES: &str = "gregor_log_index_cache_max_bytes";
/// Counter: inactive segments whose index files were read on use (first use, or again after
/// their entries were dropped).
pub const LOG_INDEX_CACHE_LOADS_TOTAL: &str = "gregor_log_index_cache_loads_total";
/// Counter: inactive segments whose index entries were dropped to stay within the budget.
pub const LOG_INDEX_CACHE_DROPPED_TOTAL: &str = "gregor_log_index_cache_dropped_total";
/// Counter: segments whose `.index` and `.timeindex` were rebuilt from their log while it was
/// served: found not sane when loaded, or an entry misled a read (pointed where no batch holds
/// its offset). Each segment is rebuilt by a read at most once until restart.
pub const LOG_INDEX_REBUILDS_TOTAL: &str = "gregor_log_index_rebuilds_total";

/// Latency buckets in seconds, from 50 µs to 30 s.
const LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The process-wide Prometheus recorder (installed once).
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS_SECONDS)
            .map(|b| b.build_recorder())
            .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            warn!("a metrics recorder was already installed; gregor's metrics will be empty");
        }
        describe();
        metrics_process::Collector::default().describe();
        handle
    })
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(REQUESTS_TOTAL, "Requests received, by API and version.");
    describe_counter!(
        REQUEST_ERRORS_TOTAL,
        "Error codes returned, by API and error."
    );
    describe_histogram!(
        REQUEST_QUEUE_SECONDS,
        Unit::Seconds,
        "Request wait before its handler started."
    );
    describe_histogram!(
        REQUEST_PROCESSING_SECONDS,
        Unit::Seconds,
        "Handler time, immediate part."
    );
    describe_histogram!(
        REQUEST_REMOTE_SECONDS,
        Unit::Seconds,
        "Wait of deferred requests (acks=all, long poll)."
    );
    describe_histogram!(
        RESPONSE_SEND_SECONDS,
        Unit::Seconds,
        "Time to write a response."
    );
    describe_counter!(
        TOPIC_BYTES_IN_TOTAL,
        Unit::Bytes,
        "Record batch bytes appended."
    );
    describe_counter!(TOPIC_RECORDS_IN_TOTAL, "Records appended.");
    describe_counter!(
        TOPIC_BYTES_OUT_TOTAL,
        Unit::Bytes,
        "Record batch bytes fetched by consumers."
    );
    describe_counter!(TOPIC_RECORDS_OUT_TOTAL, "Records fetched by consumers.");
    describe_counter!(
        gregor_network::response::ZERO_COPY_BYTES_TOTAL,
        Unit::Bytes,
        "Response bytes sent from segment files without a copy (zero-copy fetch)."
    );
    describe_gauge!(CONNECTIONS_ACTIVE, "Open client connections.");
    describe_counter!(CONNECTIONS_OPENED_TOTAL, "Client connections accepted.");
    describe_counter!(
        gregor_network::server::CONNECTIONS_CLOSED_BY_BROKER_TOTAL,
        "Connections the broker closed, by reason (max_connections_per_ip, idle, descriptor_reserve)."
    );
    describe_gauge!(
        gregor_network::pool::MEMORY_POOL_AVAILABLE_BYTES,
        Unit::Bytes,
        "Bytes left in the queued.max.request.bytes memory pool."
    );
    describe_gauge!(
        DELAYED_PRODUCE_REQUESTS,
        "Produce requests waiting for the high watermark."
    );
    describe_gauge!(DELAYED_FETCH_REQUESTS, "Fetch requests waiting for data.");
    describe_gauge!(
        crate::replica_manager::purgatory::PURGATORY_SIZE,
        "Watch-list entries in the delayed-operation purgatory, by delayed_operation."
    );
    describe_gauge!(
        crate::replica_manager::purgatory::PURGATORY_DELAYED_OPERATIONS,
        "Operations waiting in the delayed-operation purgatory, by delayed_operation."
    );
    describe_gauge!(PARTITIONS, "Partitions hosted by this broker.");
    describe_gauge!(LEADER_PARTITIONS, "Partitions led by this broker.");
    describe_gauge!(
        UNDER_REPLICATED_PARTITIONS,
        "Led partitions with ISR smaller than replicas."
    );
    describe_gauge!(
        UNDER_MIN_ISR_PARTITIONS,
        "Led partitions with ISR smaller than min.insync.replicas."
    );
    describe_gauge!(UPTIME_SECONDS, Unit::Seconds, "Time since start-up.");
    describe_gauge!(
        REPLICATION_THROTTLED_BYTE_RATE,
        "Byte rate of throttled replication (KIP-73), by side (leader/follower)."
    );
    describe_counter!(
        REPLICATION_THROTTLED_BYTES_TOTAL,
        Unit::Bytes,
        "Bytes of throttled partitions replicated, by side (leader/follower)."
    );
    describe_counter!(
        REPLICATION_THROTTLED_TOTAL,
        "Times a throttled out-of-sync replica was held back by the quota, by side."
    );
    describe_gauge!(CONSUMER_GROUPS, "Consumer groups, by state and type.");
    describe_gauge!(
        READY,
        "1 when the broker is ready to serve: started, and no log directory offline (as /ready)."
    );
    describe_gauge!(FETCH_SESSIONS, "Incremental fetch sessions held (KIP-227).");
    describe_gauge!(
        FETCH_SESSION_PARTITIONS,
        "Partitions cached across all fetch sessions."
    );
    describe_counter!(
        FETCH_SESSION_EVICTIONS_TOTAL,
        "Fetch sessions evicted to make room for new ones."
    );
    describe_gauge!(
        LOG_DIR_OFFLINE,
        "1 while the log directory (dir) is offline: full since a write failed for lack of space (appends resume once space is free) or failed."
    );
    describe_gauge!(
        QUEUED_REPLICA_TO_DIR_ASSIGNMENTS,
        "Replica directory assignments (KIP-858) waiting for or in an AssignReplicasToDirs request to the controller."
    );
    describe_gauge!(
        LOG_SEGMENT_FILES_OPEN,
        "Segment files (.log, .index, .timeindex) open now; idle ones beyond the budget are closed."
    );
    describe_gauge!(
        LOG_SEGMENT_FILES_OPEN_MAX,
        "The budget of open segment files: half the process's open-file limit."
    );
    describe_counter!(
        LOG_SEGMENT_FILES_EVICTED_TOTAL,
        "Segment files closed to stay within the budget; each is reopened on its next use."
    );
    describe_counter!(
        LOG_SEGMENT_FILES_IDLE_CLOSED_TOTAL,
        "Segment files closed because nothing used them for a minute or more; each is reopened on its next use."
    );
    describe_gauge!(
        LOG_INDEX_CACHE_BYTES,
        "Heap bytes of inactive segments' index entries held now (active segments' are not counted)."
    );
    describe_gauge!(
        LOG_INDEX_CACHE_MAX_BYTES,
        "The budget of inactive segments' index entries (log.index.cache.bytes)."
    );
    describe_counter!(
        LOG_INDEX_CACHE_LOADS_TOTAL,
        "Inactive segments whose index files were read on use (first use, or again after a drop)."
    );
    describe_counter!(
        LOG_INDEX_CACHE_DROPPED_TOTAL,
        "Inactive segments whose index entries were dropped to stay within the budget; each is read again on its next use."
    );
    describe_counter!(
        LOG_INDEX_REBUILDS_TOTAL,
        "Segments whose index files were rebuilt from their log while served: not sane when loaded, or an entry misled a read."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label is the broker's version."
    );
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    // Present from the first scrape, not only after the first delayed operation.
    metrics::gauge!(DELAYED_PRODUCE_REQUESTS).set(0.0);
    metrics::gauge!(DELAYED_FETCH_REQUESTS).set(0.0);
    metrics::gauge!(FETCH_SESSIONS).set(0.0);
    metrics::gauge!(FETCH_SESSION_PARTITIONS).set(0.0);
    metrics::counter!(FETCH_SESSION_EVICTIONS_TOTAL).absolute(0);
}

/// Kafka's name of an API (`Produce`, `Fetch`, ...), for labels.
pub fn api_name(api_key: ApiKey) -> &'static str {
    static NAMES: OnceLock<HashMap<i16, &'static str>> = OnceLock::new();
    NAMES
        .get_or_init(|| {
            ApiKey::iter()
                .map(|k| (k as i16, &*Box::leak(format!("{k:?}").into_boxed_str())))
                .collect()
        })
        .get(&(api_key as i16))
        .copied()
        .unwrap_or("Unknown")
}

/// Kafka's name of an error code (`UnknownTopicOrPartition`, ...), for labels.
pub fn error_name(code: i16) -> &'static str {
    static NAMES: OnceLock<RwLock<HashMap<i16, &'static str>>> = OnceLock::new();
    let names = NAMES.get_or_init(|| RwLock::new(HashMap::new()));
    if let Some(n) = names.read().get(&code) {
        return n;
    }
    let name = gregor_protocol::kafka_protocol::error::ResponseError::try_from_code(code)
        .map_or_else(|| "None".to_string(), |e| format!("{e:?}"));
    let leaked: &'static str = Box::leak(name.into_boxed_str());
    names.write().insert(code, leaked);
    leaked
}

/// Counts one error code returned by `api` (no-op for NONE).
pub fn record_error(api_key: ApiKey, code: i16) {
    if code != 0 {
        metrics::counter!(REQUEST_ERRORS_TOTAL, "api" => api_name(api_key), "error" => error_name(code))
            .increment(1);
    }
}

/// Per-request metric handles, cached by (api key, version) so the request path does no
/// registry lookups.
pub struct RequestMetrics {
    /// `gregor_requests_total{api,version}`.
    pub requests: Counter,
    /// `gregor_request_queue_seconds{api}`.
    pub queue: Histogram,
    /// `gregor_request_processing_seconds{api}`.
    pub processing: Histogram,
    /// `gregor_request_remote_seconds{api}`.
    pub remote: Histogram,
    /// `gregor_response_send_seconds{api}`.
    pub send: Histogram,
}

/// The cached handles for one API and version.
pub fn request_metrics(api_key: ApiKey, version: i16) -> Arc<RequestMetrics> {
    type Cache = RwLock<HashMap<(i16, i16), Arc<RequestMetrics>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| RwLock::new(HashMap::new()));
    let key = (api_key as i16, version);
    if let Some(m) = cache.read().get(&key) {
        return m.clone();
    }
    let api = api_name(api_key);
    let m = Arc::new(RequestMetrics {
        requests: metrics::counter!(REQUESTS_TOTAL, "api" => api, "version" => version.to_string()),
        queue: metrics::histogram!(REQUEST_QUEUE_SECONDS, "api" => api),
        processing: metrics::histogram!(REQUEST_PROCESSING_SECONDS, "api" => api),
        remote: metrics::histogram!(REQUEST_REMOTE_SECONDS, "api" => api),
        send: metrics::histogram!(RESPONSE_SEND_SECONDS, "api" => api),
    });
    cache.write().insert(key, m.clone());
    m
}

/// Byte and record counters of one topic, kept by each partition.
#[derive(Clone)]
pub struct TopicMetrics {
    /// `gregor_topic_bytes_in_total{topic}`.
    pub bytes_in: Counter,
    /// `gregor_topic_records_in_total{topic}`.
    pub records_in: Counter,
    /// `gregor_topic_bytes_out_total{topic}`.
    pub bytes_out: Counter,
    /// `gregor_topic_records_out_total{topic}`.
    pub records_out: Counter,
}

impl TopicMetrics {
    /// Handles for `topic`.
    pub fn new(topic: &str) -> Self {
        let t = topic.to_string();
        Self {
            bytes_in: metrics::counter!(TOPIC_BYTES_IN_TOTAL, "topic" => t.clone()),
            records_in: metrics::counter!(TOPIC_RECORDS_IN_TOTAL, "topic" => t.clone()),
            bytes_out: metrics::counter!(TOPIC_BYTES_OUT_TOTAL, "topic" => t.clone()),
            records_out: metrics::counter!(TOPIC_RECORDS_OUT_TOTAL, "topic" => t),
        }
    }
}

/// A gauge that is incremented now and decremented when dropped (in-flight counts).
pub struct InFlight(Gauge);

impl InFlight {
    /// Increments `name`.
    pub fn new(name: &'static str) -> Self {
        let g = metrics::gauge!(name);
        g.increment(1.0);
        Self(g)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
