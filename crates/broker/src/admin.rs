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

    /// The log directories that are offline (full or failed), with their state.
    fn offline_dirs(&self) -> Vec<(std::path::PathBuf, gregor_log::DirState)> {
        self.broker
            .get()
            .map(|b| b.replica_manager.logs().offline_dirs())
            .unwrap_or_default()
    }
}

/// Sets the per-partition and broker gauges from the current state. Called at each scrape,
/// so gauges are exact when read and cost nothing in between.
fn update_gauges(broker: &Broker) {
    let partitions = broker.replica_manager.partitions();
    let (mut leaders, mut under_replicated, mut under_min_isr) = (0u64, 0u64, 0u64);
    for p in &partitions {
        if p.is_leader() {
            leaders += 1;
            under_replicated += u64::from(p.is_under_replicated());
            under_min_isr += u64::from(p.is_under_min_isr());
        }
        let labels = [
            ("topic", p.topic.clone()),
            ("partition", p.index.to_string()),
        ];
        metrics::gauge!(LOG_SIZE_BYTES, &labels).set(p.log.size_in_bytes() as f64);
        metrics::gauge!(LOG_SEGMENTS, &labels).set(p.log.num_segments() as f64);
        metrics::gauge!(LOG_END_OFFSET, &labels).set(p.log.log_end_offset() as f64);
        metrics::gauge!(LOG_START_OFFSET, &labels).set(p.log.log_start_offset() as f64);
        metrics::gauge!(HIGH_WATERMARK, &labels).set(p.high_watermark() as f64);
    }
    for h in broker.replica_manager.logs().dir_health() {
        metrics::gauge!(LOG_DIR_OFFLINE, "dir" => h.dir().display().to_string())
            .set(if h.is_offline() { 1.0 } else { 0.0 });
    }
    metrics::gauge!(PARTITIONS).set(partitions.len() as f64);
    metrics::gauge!(LEADER_PARTITIONS).set(leaders as f64);
    metrics::gauge!(UNDER_REPLICATED_PARTITIONS).set(under_replicated as f64);
    metrics::gauge!(UNDER_MIN_ISR_PARTITIONS).set(under_min_isr as f64);
    metrics::gauge!(UPTIME_SECONDS).set(broker.uptime().as_secs_f64());
    let quotas = broker.replica_manager.replication_quotas();
    for (side, q) in [("leader", &quotas.leader), ("follower", &quotas.follower)] {
        let labels = [("type", side)];
        metrics::gauge!(REPLICATION_THROTTLED_BYTE_RATE, &labels).set(q.byte_rate());
        metrics::counter!(REPLICATION_THROTTLED_BYTES_TOTAL, &labels).absolute(q.bytes_recorded());
        metrics::counter!(REPLICATION_THROTTLED_TOTAL, &labels).absolute(q.throttled_total());
    }
    update_group_gauges(broker);
}

/// Group counts by state and type, and lag per committed partition. Groups and partitions
/// that disappeared since the last scrape read 0 (the exporter keeps series it has seen).
fn update_group_gauges(broker: &Broker) {
    static SEEN_STATES: OnceLock<parking_lot::Mutex<std::collections::HashSet<(String, String)>>> =
        OnceLock::new();
    static SEEN_LAGS: OnceLock<
        parking_lot::Mutex<std::collections::HashSet<(String, String, i32)>>,
    > = OnceLock::new();
    let mut counts: HashMap<(String, String), u64> = HashMap::new();
    let mut lags: Vec<((String, String, i32), i64)> = Vec::new();
    {
        let groups = broker.group_coordinator.groups();
        for g in groups.values() {
            *counts
                .entry((g.state_name().to_string(), g.type_name().to_string()))
                .or_default() += 1;
            for ((topic, partition), committed) in &g.offsets {
                let Some(p) = broker.replica_manager.partition(topic, *partition) else {
                    continue;
                };
                let lag = (p.high_watermark() - committed.offset).max(0);
                lags.push(((g.group_id.clone(), topic.clone(), *partition), lag));
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
    let seen_lags = SEEN_LAGS.get_or_init(Default::default);
    let mut seen = seen_lags.lock();
    let current: std::collections::HashSet<(String, String, i32)> =
        lags.iter().map(|(k, _)| k.clone()).collect();
    for k in seen.iter().filter(|k| !current.contains(*k)) {
        metrics::gauge!(CONSUMER_GROUP_LAG, "group" => k.0.clone(), "topic" => k.1.clone(), "partition" => k.2.to_string())
            .set(0.0);
    }
    for (k, lag) in lags {
        metrics::gauge!(CONSUMER_GROUP_LAG, "group" => k.0.clone(), "topic" => k.1.clone(), "partition" => k.2.to_string())
            .set(lag as f64);
        seen.insert(k);
    }
}

/// `/ready`'s answer while log directories are offline: which, why, and what to do.
fn offline_dirs_text(offline: &[(std::path::PathBuf, gregor_log::DirState)]) -> String {
    let mut out = String::from("not ready:");
    for (dir, state) in offline {
        match state {
            gregor_log::DirState::Full { reason } => out.push_str(&format!(
                " log dir {} is full ({reason}): free space (kafka-delete-records, lower \
                 retention.ms or retention.bytes, or remove other files); appends resume on \
                 their own.",
                dir.display()
            )),
            gregor_log::DirState::Failed { reason } => out.push_str(&format!(
                " log dir {} failed ({reason}): repair the disk and restart the broker.",
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

async fn route(
    state: Arc<AdminState>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let plain = "text/plain; charset=utf-8";
    Ok(match (req.method(), req.uri().path()) {
        (&hyper::Method::GET, "/metrics") => {
            if let Some(b) = state.broker.get() {
                update_gauges(b);
            }
            // What `/ready` answers: ready and no log directory offline.
            let ready = state.is_ready() && state.offline_dirs().is_empty();
            metrics::gauge!(READY).set(if ready { 1.0 } else { 0.0 });
            metrics_process::Collector::default().collect();
            text(
                StatusCode::OK,
                handle().render(),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        }
        (&hyper::Method::GET, "/health") => text(StatusCode::OK, "ok\n", plain),
        (&hyper::Method::GET, "/ready") => {
            let offline = state.offline_dirs();
            if !state.is_ready() {
                text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n", plain)
            } else if !offline.is_empty() {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    offline_dirs_text(&offline),
                    plain,
                )
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
