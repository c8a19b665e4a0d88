//! The admin HTTP listener (`admin.listener`, default `127.0.0.1:9644`): `/metrics` in the
//! Prometheus text format (the recorder of [`crate::observability`]), `/health` (the process is
//! up) and `/ready` (logs loaded, listeners accepting, metadata replayed). Gauges that describe
//! the broker's state are computed from the [`Broker`] at each scrape.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::broker::Broker;
use crate::observability::*;

/// State the admin listener reports on.
#[derive(Default)]
pub struct AdminState {
    ready: AtomicBool,
    broker: OnceLock<Arc<Broker>>,
}

impl AdminState {
    /// Marks the broker ready (or not) for `/ready`.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
        metrics::gauge!(READY).set(if ready { 1.0 } else { 0.0 });
    }

    /// Attaches the running broker, whose partitions are reported at each scrape.
    pub fn attach(&self, broker: Arc<Broker>) {
        let _ = self.broker.set(broker);
    }

    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// [`ReplicaManager::missing_dirs`](crate::replica_manager::ReplicaManager::missing_dirs).
    fn missing_dirs(&self) -> std::collections::BTreeMap<uuid::Uuid, usize> {
        self.broker
            .get()
            .map(|b| b.replica_manager.missing_dirs())
            .unwrap_or_default()
    }

    /// The log directories that are offline (full or failed), with their state, then
    /// `metadata.log.dir` when the metadata log's writes found it offline: `(what, dir,
    /// state)`, `what` being "log dir" or "metadata log dir".
    fn offline_dirs(&self) -> Vec<(&'static str, std::path::PathBuf, gregor_log::DirState)> {
        let Some(b) = self.broker.get() else {
            return Vec::new();
        };
        let mut out: Vec<_> = b
            .replica_manager
            .logs()
            .offline_dirs()
            .into_iter()
            .map(|(dir, state)| ("log dir", dir, state))
            .collect();
        if let Some(raft) = b.raft.get() {
            let h = raft.metadata_dir_health();
            if h.is_offline() {
                out.push(("metadata log dir", h.dir().to_path_buf(), h.state()));
            }
        }
        out
    }
}

/// Sets the broker gauges of the registry from the current state and renders the
/// per-partition families ([`partition_families`]); called at each scrape, so the figures
/// are exact when read and cost nothing in between. Blocking (it walks every partition): run
/// it off the async runtime.
fn update_gauges(broker: &Broker) -> String {
    let partitions = broker.replica_manager.partitions();
    let (mut leaders, mut under_replicated, mut under_min_isr) = (0u64, 0u64, 0u64);
    let mut rows = Vec::with_capacity(partitions.len());
    for p in &partitions {
        if p.is_leader() {
            leaders += 1;
            under_replicated += u64::from(p.is_under_replicated());
            under_min_isr += u64::from(p.is_under_min_isr());
        }
        rows.push(PartitionRow {
            topic: &p.topic,
            partition: p.index,
            size_bytes: p.log.size_in_bytes(),
            segments: p.log.num_segments() as u64,
            log_end_offset: p.log.log_end_offset(),
            log_start_offset: p.log.log_start_offset(),
            high_watermark: p.high_watermark(),
        });
    }
    // Each log dir, and `metadata.log.dir` as the metadata log's writes find it (one series
    // per path: 1 when either is offline).
    let mut offline_by_dir: std::collections::BTreeMap<String, bool> = Default::default();
    let metadata_dir = broker.raft.get().map(|r| r.metadata_dir_health().clone());
    for h in broker
        .replica_manager
        .logs()
        .dir_health()
        .iter()
        .chain(metadata_dir.as_ref())
    {
        *offline_by_dir
            .entry(h.dir().display().to_string())
            .or_default() |= h.is_offline();
    }
    for (dir, offline) in offline_by_dir {
        metrics::gauge!(LOG_DIR_OFFLINE, "dir" => dir).set(if offline { 1.0 } else { 0.0 });
    }
    metrics::gauge!(PARTITIONS).set(partitions.len() as f64);
    metrics::gauge!(LEADER_PARTITIONS).set(leaders as f64);
    metrics::gauge!(UNDER_REPLICATED_PARTITIONS).set(under_replicated as f64);
    metrics::gauge!(UNDER_MIN_ISR_PARTITIONS).set(under_min_isr as f64);
    metrics::gauge!(UPTIME_SECONDS).set(broker.uptime().as_secs_f64());
    let files = gregor_log::files::open_file_stats();
    metrics::gauge!(LOG_SEGMENT_FILES_OPEN).set(files.open as f64);
    metrics::gauge!(LOG_SEGMENT_FILES_OPEN_MAX).set(files.max as f64);
    metrics::counter!(LOG_SEGMENT_FILES_EVICTED_TOTAL).absolute(files.evicted_total);
    metrics::counter!(LOG_SEGMENT_FILES_IDLE_CLOSED_TOTAL).absolute(files.idle_closed_total);
    let index_cache = gregor_log::index_cache::stats();
    metrics::gauge!(LOG_INDEX_CACHE_BYTES).set(index_cache.bytes as f64);
    metrics::gauge!(LOG_INDEX_CACHE_MAX_BYTES).set(index_cache.max_bytes as f64);
    metrics::counter!(LOG_INDEX_CACHE_LOADS_TOTAL).absolute(index_cache.loads_total);
    metrics::counter!(LOG_INDEX_CACHE_DROPPED_TOTAL).absolute(index_cache.dropped_total);
    metrics::counter!(LOG_INDEX_REBUILDS_TOTAL).absolute(index_cache.rebuilds_total);
    let quotas = broker.replica_manager.replication_quotas();
    for (side, q) in [("leader", &quotas.leader), ("follower", &quotas.follower)] {
        let labels = [("type", side)];
        metrics::gauge!(REPLICATION_THROTTLED_BYTE_RATE, &labels).set(q.byte_rate());
        metrics::counter!(REPLICATION_THROTTLED_BYTES_TOTAL, &labels).absolute(q.bytes_recorded());
        metrics::counter!(REPLICATION_THROTTLED_TOTAL, &labels).absolute(q.throttled_total());
    }
    let lags = update_group_gauges(broker);
    let lag_rows: Vec<LagRow<'_>> = lags
        .iter()
        .map(|(group, topic, partition, lag)| LagRow {
            group,
            topic,
            partition: *partition,
            lag: *lag,
        })
        .collect();
    let mut out = String::new();
    partition_families(
        &mut rows,
        lag_rows,
        broker.config.admin_metrics_per_partition,
        &mut out,
    );
    out
}

/// Group counts by state and type (states that emptied since the last scrape read 0: the
/// exporter keeps series it has seen), and the lag of every committed offset: (group, topic,
/// partition, high watermark minus committed offset). Offsets of partitions not hosted here
/// are left out.
fn update_group_gauges(broker: &Broker) -> Vec<(String, String, i32, i64)> {
    static SEEN_STATES: OnceLock<parking_lot::Mutex<std::collections::HashSet<(String, String)>>> =
        OnceLock::new();
    let mut counts: HashMap<(String, String), u64> = HashMap::new();
    let mut committed: Vec<(String, String, i32, i64)> = Vec::new();
    {
        // Copied out so that the coordinator's lock is not held over the partition lookups.
        let groups = broker.group_coordinator.groups();
        for g in groups.values() {
            *counts
                .entry((g.state_name().to_string(), g.type_name().to_string()))
                .or_default() += 1;
            for ((topic, partition), c) in &g.offsets {
                committed.push((g.group_id.clone(), topic.clone(), *partition, c.offset));
            }
        }
    }
    let seen_states = SEEN_STATES.get_or_init(Default::default);
    let mut seen = seen_states.lock();
    for k in seen.iter() {
        if !counts.contains_key(k) {
            metrics::gauge!(CONSUMER_GROUPS, "state" => k.0.clone(), "type" => k.1.clone())
                .set(0.0);
        }
    }
    for (k, n) in counts {
        metrics::gauge!(CONSUMER_GROUPS, "state" => k.0.clone(), "type" => k.1.clone())
            .set(n as f64);
        seen.insert(k);
    }
    drop(seen);
    committed
        .into_iter()
        .filter_map(|(group, topic, partition, offset)| {
            let p = broker.replica_manager.partition(&topic, partition)?;
            let lag = (p.high_watermark() - offset).max(0);
            Some((group, topic, partition, lag))
        })
        .collect()
}

/// One hosted partition's figures for `/metrics`.
struct PartitionRow<'a> {
    topic: &'a str,
    partition: i32,
    size_bytes: u64,
    segments: u64,
    log_end_offset: i64,
    log_start_offset: i64,
    high_watermark: i64,
}

/// One committed offset's lag for `/metrics`.
struct LagRow<'a> {
    group: &'a str,
    topic: &'a str,
    partition: i32,
    lag: i64,
}

/// The per-partition families of `/metrics` (log size, segments, log start and end offsets,
/// high watermark, consumer lag), written straight into `out` in the Prometheus text format
/// rather than kept in the metrics registry: at 100,000 partitions the registry took about
/// 2 s per scrape (its label lookups and rendering), this takes a tenth of that, and series of
/// deleted partitions and groups vanish instead of lingering.
///
/// With `per_partition` false (`admin.metrics.per.partition=false`) each family has one series
/// per topic (per group and topic for the lag), summed over the topic's partitions hosted
/// here, and `gregor_topic_partitions` says how many that is: a scrape of a broker with very
/// many partitions stays small.
fn partition_families(
    rows: &mut [PartitionRow<'_>],
    mut lags: Vec<LagRow<'_>>,
    per_partition: bool,
    out: &mut String,
) {
    use std::fmt::Write as _;
    rows.sort_unstable_by(|a, b| (a.topic, a.partition).cmp(&(b.topic, b.partition)));
    lags.sort_unstable_by(|a, b| {
        (a.group, a.topic, a.partition).cmp(&(b.group, b.topic, b.partition))
    });
    type Field = fn(&PartitionRow<'_>) -> i128;
    let families: [(&str, &str, Field); 5] = [
        (
            LOG_SIZE_BYTES,
            "Size of the partition's log in bytes.",
            |r| i128::from(r.size_bytes),
        ),
        (LOG_SEGMENTS, "Segments in the partition's log.", |r| {
            i128::from(r.segments)
        }),
        (LOG_END_OFFSET, "Log end offset.", |r| {
            i128::from(r.log_end_offset)
        }),
        (LOG_START_OFFSET, "Log start offset.", |r| {
            i128::from(r.log_start_offset)
        }),
        (HIGH_WATERMARK, "High watermark.", |r| {
            i128::from(r.high_watermark)
        }),
    ];
    let scope = if per_partition {
        ""
    } else {
        " Summed over the topic's partitions hosted here."
    };
    let header = |out: &mut String, name: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}{scope}");
        let _ = writeln!(out, "# TYPE {name} gauge");
    };
    if per_partition {
        for (name, help, field) in families {
            header(out, name, help);
            for r in rows.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{topic=\"{}\",partition=\"{}\"}} {}",
                    Escaped(r.topic),
                    r.partition,
                    field(r)
                );
            }
        }
        header(
            out,
            CONSUMER_GROUP_LAG,
            "High watermark minus the group's committed offset, in records.",
        );
        for l in &lags {
            let _ = writeln!(
                out,
                "{CONSUMER_GROUP_LAG}{{group=\"{}\",topic=\"{}\",partition=\"{}\"}} {}",
                Escaped(l.group),
                Escaped(l.topic),
                l.partition,
                l.lag
            );
        }
        return;
    }
    // Rows are sorted by topic: each topic's partitions are one run.
    let topics: Vec<&[PartitionRow<'_>]> = rows.chunk_by(|a, b| a.topic == b.topic).collect();
    header(
        out,
        TOPIC_PARTITIONS,
        "Partitions of the topic hosted here.",
    );
    for t in &topics {
        let _ = writeln!(
            out,
            "{TOPIC_PARTITIONS}{{topic=\"{}\"}} {}",
            Escaped(t[0].topic),
            t.len()
        );
    }
    for (name, help, field) in families {
        header(out, name, help);
        for t in &topics {
            let sum: i128 = t.iter().map(field).sum();
            let _ = writeln!(out, "{name}{{topic=\"{}\"}} {sum}", Escaped(t[0].topic));
        }
    }
    header(
        out,
        CONSUMER_GROUP_LAG,
        "High watermark minus the group's committed offset, in records.",
    );
    for g in lags.chunk_by(|a, b| (a.group, a.topic) == (b.group, b.topic)) {
        let sum: i64 = g.iter().map(|l| l.lag).sum();
        let _ = writeln!(
            out,
            "{CONSUMER_GROUP_LAG}{{group=\"{}\",topic=\"{}\"}} {sum}",
            Escaped(g[0].group),
            Escaped(g[0].topic)
        );
    }
}

/// A label value escaped as the Prometheus text format wants (backslash, double quote and
/// line feed).
struct Escaped<'a>(&'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        if !self.0.contains(['\\', '"', '\n']) {
            return f.write_str(self.0);
        }
        for c in self.0.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '"' => f.write_str("\\\"")?,
                '\n' => f.write_str("\\n")?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// `/ready`'s answer while log directories are offline: which, why, and what to do.
fn offline_dirs_text(
    offline: &[(&'static str, std::path::PathBuf, gregor_log::DirState)],
) -> String {
    let mut out = String::from("not ready:");
    for (what, dir, state) in offline {
        match state {
            gregor_log::DirState::Full { reason } if *what == "log dir" => out.push_str(&format!(
                " log dir {} is full ({reason}): free space (kafka-delete-records, lower \
                 retention.ms or retention.bytes, or remove other files); appends resume on \
                 their own.",
                dir.display()
            )),
            gregor_log::DirState::Full { reason } => out.push_str(&format!(
                " {what} {} is full ({reason}): metadata changes (creating topics, leader \
                 and ISR changes, configs) fail with KAFKA_STORAGE_ERROR until space is freed \
                 on its file system; they resume on their own.",
                dir.display()
            )),
            gregor_log::DirState::Failed { reason } => out.push_str(&format!(
                " {what} {} failed ({reason}): repair the disk and restart the broker.",
                dir.display()
            )),
            gregor_log::DirState::Online => {}
        }
    }
    out.push('\n');
    out
}

fn text(status: StatusCode, body: impl Into<Bytes>, content_type: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

/// The body of `/metrics`: the registry's families, then the per-partition ones.
fn metrics_body(state: &AdminState) -> String {
    let partition_text = state.broker.get().map(|b| update_gauges(b));
    // What `/ready` answers: ready and no log directory offline.
    let ready =
        state.is_ready() && state.offline_dirs().is_empty() && state.missing_dirs().is_empty();
    metrics::gauge!(READY).set(if ready { 1.0 } else { 0.0 });
    metrics_process::Collector::default().collect();
    let mut body = handle().render();
    if let Some(t) = partition_text {
        body.push_str(&t);
    }
    body
}

async fn route(
    state: Arc<AdminState>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let plain = "text/plain; charset=utf-8";
    Ok(match (req.method(), req.uri().path()) {
        (&hyper::Method::GET, "/metrics") => {
            // Off the async runtime: with many partitions a scrape takes a while.
            let body = tokio::task::spawn_blocking(move || metrics_body(&state)).await;
            match body {
                Ok(body) => text(
                    StatusCode::OK,
                    body,
                    "text/plain; version=0.0.4; charset=utf-8",
                ),
                Err(e) => {
                    warn!(error = %e, "rendering /metrics failed");
                    text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "rendering the metrics failed\n",
                        plain,
                    )
                }
            }
        }
        (&hyper::Method::GET, "/health") => text(StatusCode::OK, "ok\n", plain),
        (&hyper::Method::GET, "/ready") => {
            let offline = state.offline_dirs();
            if !state.is_ready() {
                text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n", plain)
            } else if !offline.is_empty() || !state.missing_dirs().is_empty() {
                let mut body = offline_dirs_text(&offline);
                for (id, replicas) in state.missing_dirs() {
                    let id = crate::storage::kafka_uuid_string(id);
                    body.push_str(&format!(
                        " {replicas} replicas are assigned to the log dir with directory.id \
                         {id}, which none of log.dirs is (a disk not mounted, a dir moved \
                         away?): they are offline until it is back; put it back and restart \
                         the broker."
                    ));
                }
                text(StatusCode::SERVICE_UNAVAILABLE, body, plain)
            } else {
                text(StatusCode::OK, "ready\n", plain)
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /health or /ready\n",
            plain,
        ),
    })
}

/// Serves the admin endpoints on `listener` until `shutdown` changes.
pub async fn serve_admin(
    listener: TcpListener,
    state: Arc<AdminState>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (stream, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            a = listener.accept() => match a {
                Ok(x) => x,
                Err(e) => {
                    warn!(error = %e, "admin listener accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let state = state.clone();
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let svc = hyper::service::service_fn(move |req| route(state.clone(), req));
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .await
            {
                debug!(%peer, error = %e, "admin connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(topic: &str, partition: i32, size_bytes: u64, log_end_offset: i64) -> PartitionRow<'_> {
        PartitionRow {
            topic,
            partition,
            size_bytes,
            segments: 1,
            log_end_offset,
            log_start_offset: 0,
            high_watermark: log_end_offset,
        }
    }

    fn lags() -> Vec<LagRow<'static>> {
        vec![
            LagRow {
                group: "g \"1\"",
                topic: "b",
                partition: 1,
                lag: 3,
            },
            LagRow {
                group: "g \"1\"",
                topic: "b",
                partition: 0,
                lag: 4,
            },
        ]
    }

    /// `name{labels}` -> value, checking that every family's samples follow its own `# TYPE`
    /// line (one block per family, as the text format requires).
    fn samples(text: &str) -> Vec<(String, String)> {
        let mut family = String::new();
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap_or_default().to_string();
                assert!(seen.insert(family.clone()), "{family} twice:\n{text}");
            } else if !line.starts_with('#') {
                let (k, v) = line.rsplit_once(' ').expect("a sample line");
                assert!(
                    k.starts_with(&format!("{family}{{")),
                    "{k} outside its family"
                );
                out.push((k.to_string(), v.to_string()));
            }
        }
        out
    }

    #[test]
    fn per_partition_series_are_sorted_and_escaped() {
        let mut rows = vec![row("b", 1, 20, 2), row("a", 0, 10, 1), row("b", 0, 30, 3)];
        let mut out = String::new();
        partition_families(&mut rows, lags(), true, &mut out);
        let s = samples(&out);
        assert_eq!(s.len(), 5 * 3 + 2, "{out}");
        assert_eq!(
            &s[..3],
            [
                (
                    "gregor_log_size_bytes{topic=\"a\",partition=\"0\"}".into(),
                    "10".into()
                ),
                (
                    "gregor_log_size_bytes{topic=\"b\",partition=\"0\"}".into(),
                    "30".into()
                ),
                (
                    "gregor_log_size_bytes{topic=\"b\",partition=\"1\"}".into(),
                    "20".into()
                ),
            ]
        );
        assert!(s.contains(&(
            "gregor_high_watermark{topic=\"b\",partition=\"1\"}".into(),
            "2".into()
        )));
        assert_eq!(
            s[s.len() - 2],
            (
                "gregor_consumer_group_lag{group=\"g \\\"1\\\"\",topic=\"b\",partition=\"0\"}"
                    .into(),
                "4".into()
            )
        );
        assert!(!out.contains(TOPIC_PARTITIONS));
    }

    #[test]
    fn by_topic_the_series_are_sums_with_the_partition_count() {
        let mut rows = vec![row("b", 1, 20, 2), row("a", 0, 10, 1), row("b", 0, 30, 3)];
        let mut out = String::new();
        partition_families(&mut rows, lags(), false, &mut out);
        let s = samples(&out);
        let get = |k: &str| {
            s.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("{k} missing:\n{out}"))
        };
        assert_eq!(get("gregor_topic_partitions{topic=\"b\"}"), "2");
        assert_eq!(get("gregor_topic_partitions{topic=\"a\"}"), "1");
        assert_eq!(get("gregor_log_size_bytes{topic=\"b\"}"), "50");
        assert_eq!(get("gregor_log_segments{topic=\"b\"}"), "2");
        assert_eq!(get("gregor_log_end_offset{topic=\"b\"}"), "5");
        assert_eq!(
            get("gregor_consumer_group_lag{group=\"g \\\"1\\\"\",topic=\"b\"}"),
            "7"
        );
        assert!(!out.contains("partition=\""), "{out}");
        // Two topics: one series each in the six topic families, one group-topic lag.
        assert_eq!(s.len(), 6 * 2 + 1, "{out}");
        assert!(out.contains("Summed over the topic's partitions hosted here."));
    }

    #[test]
    fn label_values_escape_backslash_quote_and_newline() {
        assert_eq!(Escaped("plain.topic-1_x").to_string(), "plain.topic-1_x");
        assert_eq!(Escaped("a\\b\"c\nd").to_string(), "a\\\\b\\\"c\\nd");
    }
}
