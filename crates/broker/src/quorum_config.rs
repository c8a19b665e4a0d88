//! The node's roles and metadata quorum settings, with Kafka's names and defaults
//! (`KRaftConfigs`, `QuorumConfig`): `process.roles`, `node.id`, `controller.quorum.voters`,
//! `controller.listener.names` and the `controller.quorum.*.ms` timeouts.
//!
//! Zero-config node (no `process.roles`): broker and controller, a one-voter quorum of itself
//! whose endpoint is its first listener (no second port: a one-voter quorum sends nothing).

use std::collections::BTreeMap;

use gregor_raft::types::VoterEndpoints;
use gregor_raft::{NodeId, QuorumConfig, VoterSet};

use crate::config_value::{ConfigError, Listener};

/// The keys parsed here (no longer only accepted).
pub const QUORUM_KEYS: &[&str] = &[
    "process.roles",
    "controller.quorum.voters",
    "controller.listener.names",
    "controller.quorum.election.timeout.ms",
    "controller.quorum.fetch.timeout.ms",
    "controller.quorum.election.backoff.max.ms",
    "controller.quorum.request.timeout.ms",
    "controller.quorum.retry.backoff.ms",
    "metadata.log.segment.bytes",
    "internal.metadata.log.segment.bytes",
    "metadata.log.segment.ms",
    "metadata.max.retention.bytes",
    "metadata.max.retention.ms",
    "metadata.log.max.record.bytes.between.snapshots",
    "metadata.log.max.snapshot.interval.ms",
];

/// Smallest `metadata.log.segment.bytes` Kafka accepts (8 MiB, `KafkaRaftClient`'s largest
/// batch; KAFKA-19080). Tests lower it with `internal.metadata.log.segment.bytes`.
pub const MIN_METADATA_LOG_SEGMENT_BYTES: i64 = 8 * 1024 * 1024;

/// Kafka's `Records.LOG_OVERHEAD`: the least a segment size may be.
const LOG_OVERHEAD: i64 = 12;

/// Roles and quorum of this node.
#[derive(Debug, Clone)]
pub struct QuorumSettings {
    /// `process.roles` has `broker` (default: yes).
    pub broker: bool,
    /// `process.roles` has `controller` (default: yes).
    pub controller: bool,
    /// `controller.quorum.voters` (default: this node at its first listener).
    pub voters: VoterSet,
    /// Each voter's controller endpoint.
    pub endpoints: VoterEndpoints,
    /// `controller.listener.names` (empty: none set).
    pub controller_listener_names: Vec<String>,
    /// `controller.quorum.election.timeout.ms` (1000).
    pub election_timeout_ms: u64,
    /// `controller.quorum.fetch.timeout.ms` (2000).
    pub fetch_timeout_ms: u64,
    /// `controller.quorum.election.backoff.max.ms` (1000).
    pub election_backoff_max_ms: u64,
    /// `controller.quorum.request.timeout.ms` (2000).
    pub request_timeout_ms: u64,
    /// `controller.quorum.retry.backoff.ms` (20).
    pub retry_backoff_ms: u64,
    /// The metadata log's segments, snapshots and retention: `metadata.log.segment.bytes`
    /// (1 GiB, at least 8 MiB; `internal.metadata.log.segment.bytes`, for tests, overrides it
    /// with any size from 12 bytes), `metadata.log.segment.ms` (7 days),
    /// `metadata.max.retention.bytes` (100 MiB), `metadata.max.retention.ms` (7 days),
    /// `metadata.log.max.record.bytes.between.snapshots` (20 MiB, at least 1),
    /// `metadata.log.max.snapshot.interval.ms` (1 hour, 0 = no time trigger).
    pub metadata_log: gregor_raft::MetadataLogConfig,
}

impl QuorumSettings {
    /// The core's configuration for `node_id`.
    pub fn quorum_config(&self, node_id: NodeId) -> QuorumConfig {
        let mut q = QuorumConfig::new(node_id, self.voters.clone());
        q.election_timeout_ms = self.election_timeout_ms;
        q.fetch_timeout_ms = self.fetch_timeout_ms;
        q.election_backoff_max_ms = self.election_backoff_max_ms;
        q.request_timeout_ms = self.request_timeout_ms;
        q.retry_backoff_ms = self.retry_backoff_ms;
        q
    }

    /// True when KRaft APIs are advertised on `listener_name`: a listener of
    /// `controller.listener.names` of a controller. A zero-config node names none, so its one
    /// listener advertises what a Kafka broker listener does (it still answers the KRaft APIs).
    pub fn is_controller_listener(&self, listener_name: &str) -> bool {
        self.controller
            && self
                .controller_listener_names
                .iter()
                .any(|n| n.eq_ignore_ascii_case(listener_name))
    }
}

/// Parses and validates the quorum keys of `props`.
///
/// # Errors
/// [`ConfigError`] naming the key: an unknown role, a malformed voter entry, a controller not
/// among the voters, a controller listener not in `listeners`, a timeout that is not a
/// non-negative integer.
pub fn parse(
    props: &BTreeMap<String, String>,
    node_id: NodeId,
    listeners: &[Listener],
) -> Result<QuorumSettings, ConfigError> {
    let get = |k: &str| props.get(k).map(|s| s.trim().to_string());
    let (broker, controller) = match get("process.roles") {
        None => (true, true),
        Some(v) => {
            let mut b = false;
            let mut c = false;
            for r in v.split(',').map(str::trim).filter(|r| !r.is_empty()) {
                match r {
                    "broker" => b = true,
                    "controller" => c = true,
                    other => {
                        return Err(ConfigError::new(
                            "process.roles",
                            &v,
                            format!("Unknown process role '{other}' (must be one of 'broker' or 'controller')"),
                        ))
                    }
                }
            }
            if !b && !c {
                return Err(ConfigError::new(
                    "process.roles",
                    &v,
                    "process.roles must name broker, controller or both",
                ));
            }
            (b, c)
        }
    };
    let controller_listener_names: Vec<String> = get("controller.listener.names")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_ascii_uppercase)
        .collect();
    // Kafka's `KafkaConfig` rules, for a node whose process.roles says it (a zero-config node,
    // without process.roles, is gregor's one-voter convenience and is not held to them).
    let explicit_roles = props.contains_key("process.roles");
    let names_joined = controller_listener_names.join(",");
    let in_listeners = |n: &String| listeners.iter().any(|l| l.name.eq_ignore_ascii_case(n));
    if explicit_roles && controller {
        if !controller_listener_names.iter().any(in_listeners) {
            return Err(ConfigError::new(
                "controller.listener.names",
                &names_joined,
                "controller.listener.names must contain at least one value appearing in the 'listeners' configuration when running the KRaft controller role",
            ));
        }
        if !controller_listener_names.iter().all(in_listeners) {
            return Err(ConfigError::new(
                "controller.listener.names",
                &names_joined,
                "controller.listener.names must only contain values appearing in the 'listeners' configuration when running the KRaft controller role",
            ));
        }
    }
    if explicit_roles && !controller {
        if controller_listener_names.is_empty() {
            return Err(ConfigError::new(
                "controller.listener.names",
                "",
                "controller.listener.names must contain at least one value when running KRaft with just the broker role",
            ));
        }
        if controller_listener_names.iter().any(in_listeners) {
            return Err(ConfigError::new(
                "controller.listener.names",
                &names_joined,
                "controller.listener.names must not contain a value appearing in the 'listeners' configuration when running KRaft with just the broker role",
            ));
        }
    }
    let (voters, endpoints) = match get("controller.quorum.voters").filter(|v| !v.is_empty()) {
        Some(v) => VoterSet::parse_quorum_voters(&v).map_err(|e| {
            ConfigError::new(
                "controller.quorum.voters",
                &v,
                format!("{e} (expected a comma-separated list of id@host:port)"),
            )
        })?,
        None => {
            let l = controller_listener_names
                .first()
                .and_then(|n| listeners.iter().find(|l| l.name.eq_ignore_ascii_case(n)))
                .or(listeners.first());
            let (host, port) = l.map_or(("127.0.0.1".to_string(), 9093), |l| {
                let host = if l.host.is_empty() {
                    "127.0.0.1".to_string()
                } else {
                    l.host.clone()
                };
                (host, l.port)
            });
            let voters = VoterSet::new([node_id])
                .map_err(|e| ConfigError::new("node.id", &node_id.to_string(), e.to_string()))?;
            (voters, [(node_id, (host, port))].into_iter().collect())
        }
    };
    let voter_ids = || {
        let ids: Vec<String> = voters.ids().map(|i| i.to_string()).collect();
        format!("Set({})", ids.join(", "))
    };
    if controller && !voters.contains(node_id) {
        return Err(ConfigError::new(
            "controller.quorum.voters",
            &get("controller.quorum.voters").unwrap_or_default(),
            format!("If process.roles contains the 'controller' role, the node id {node_id} must be included in the set of voters controller.quorum.voters={}", voter_ids()),
        ));
    }
    if !controller && voters.contains(node_id) {
        return Err(ConfigError::new(
            "controller.quorum.voters",
            &get("controller.quorum.voters").unwrap_or_default(),
            format!("If process.roles contains just the 'broker' role, the node id {node_id} must not be included in the set of voters controller.quorum.voters={}", voter_ids()),
        ));
    }
    let ms = |k: &str, default: u64| -> Result<u64, ConfigError> {
        match get(k) {
            None => Ok(default),
            Some(v) => v
                .parse::<u64>()
                .map_err(|_| ConfigError::new(k, &v, "Value must be a non-negative integer (ms)")),
        }
    };
    let long = |k: &str, default: i64, min: Option<i64>| -> Result<i64, ConfigError> {
        let Some(v) = get(k) else {
            return Ok(default);
        };
        let n = v
            .parse::<i64>()
            .map_err(|_| ConfigError::new(k, &v, "Value must be an integer"))?;
        match min {
            Some(m) if n < m => Err(ConfigError::new(
                k,
                &v,
                format!("Value must be at least {m}"),
            )),
            _ => Ok(n),
        }
    };
    let defaults = gregor_raft::MetadataLogConfig::default();
    let int_max = i64::from(i32::MAX);
    let mut segment_bytes = long(
        "metadata.log.segment.bytes",
        defaults.segment_bytes as i64,
        Some(MIN_METADATA_LOG_SEGMENT_BYTES),
    )?;
    if segment_bytes > int_max {
        return Err(ConfigError::new(
            "metadata.log.segment.bytes",
            &segment_bytes.to_string(),
            "Value must be at most 2147483647",
        ));
    }
    if let Some(v) = get("internal.metadata.log.segment.bytes") {
        let n = long("internal.metadata.log.segment.bytes", 0, Some(LOG_OVERHEAD))?;
        if n > int_max {
            return Err(ConfigError::new(
                "internal.metadata.log.segment.bytes",
                &v,
                "Value must be at most 2147483647",
            ));
        }
        tracing::error!(
            "Overriding internal.metadata.log.segment.bytes is only supported for testing. \
             Setting this value too low may lead to an inability to write batches of metadata records."
        );
        segment_bytes = n;
    }
    let metadata_log = gregor_raft::MetadataLogConfig {
        segment_bytes: segment_bytes as u64,
        segment_ms: long("metadata.log.segment.ms", defaults.segment_ms, Some(1))?,
        retention_max_bytes: long(
            "metadata.max.retention.bytes",
            defaults.retention_max_bytes,
            None,
        )?,
        retention_ms: long("metadata.max.retention.ms", defaults.retention_ms, None)?,
        max_record_bytes_between_snapshots: long(
            "metadata.log.max.record.bytes.between.snapshots",
            defaults.max_record_bytes_between_snapshots as i64,
            Some(1),
        )? as u64,
        max_snapshot_interval_ms: long(
            "metadata.log.max.snapshot.interval.ms",
            defaults.max_snapshot_interval_ms,
            Some(0),
        )?,
        ..defaults
    };
    Ok(QuorumSettings {
        metadata_log,
        broker,
        controller,
        voters,
        endpoints,
        controller_listener_names,
        election_timeout_ms: ms("controller.quorum.election.timeout.ms", 1000)?,
        fetch_timeout_ms: ms("controller.quorum.fetch.timeout.ms", 2000)?,
        election_backoff_max_ms: ms("controller.quorum.election.backoff.max.ms", 1000)?,
        request_timeout_ms: ms("controller.quorum.request.timeout.ms", 2000)?,
        retry_backoff_ms: ms("controller.quorum.retry.backoff.ms", 20)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn listeners() -> Vec<Listener> {
        vec![
            Listener::parse("listeners", "PLAINTEXT://127.0.0.1:9092").unwrap(),
            Listener::parse("listeners", "CONTROLLER://127.0.0.1:9093").unwrap(),
        ]
    }

    #[test]
    fn metadata_log_settings_have_kafkas_names_defaults_and_bounds() {
        let q = parse(&props(&[]), 1, &listeners()).unwrap();
        assert_eq!(q.metadata_log, gregor_raft::MetadataLogConfig::default());
        assert_eq!(
            (
                q.metadata_log.segment_bytes,
                q.metadata_log.max_record_bytes_between_snapshots,
                q.metadata_log.max_snapshot_interval_ms,
                q.metadata_log.retention_max_bytes,
                q.metadata_log.retention_ms
            ),
            (1 << 30, 20 << 20, 3_600_000, 100 << 20, 604_800_000)
        );
        let q = parse(
            &props(&[
                ("metadata.log.segment.bytes", "8388608"),
                ("metadata.log.segment.ms", "60000"),
                ("metadata.max.retention.bytes", "-1"),
                ("metadata.max.retention.ms", "1000"),
                ("metadata.log.max.record.bytes.between.snapshots", "4096"),
                ("metadata.log.max.snapshot.interval.ms", "0"),
            ]),
            1,
            &listeners(),
        )
        .unwrap();
        let m = &q.metadata_log;
        assert_eq!(
            (
                m.segment_bytes,
                m.segment_ms,
                m.retention_max_bytes,
                m.retention_ms,
                m.max_record_bytes_between_snapshots,
                m.max_snapshot_interval_ms
            ),
            (8 << 20, 60_000, -1, 1000, 4096, 0)
        );
        for (k, v) in [
            ("metadata.log.segment.bytes", "1048576"),
            ("metadata.log.segment.bytes", "4294967296"),
            ("internal.metadata.log.segment.bytes", "11"),
            ("metadata.log.max.record.bytes.between.snapshots", "0"),
            ("metadata.log.max.snapshot.interval.ms", "-1"),
            ("metadata.max.retention.ms", "soon"),
        ] {
            let e = parse(&props(&[(k, v)]), 1, &listeners()).unwrap_err();
            assert_eq!(e.name, k, "{k}={v}");
        }
        let q = parse(
            &props(&[("internal.metadata.log.segment.bytes", "4096")]),
            1,
            &listeners(),
        )
        .unwrap();
        assert_eq!(q.metadata_log.segment_bytes, 4096, "the testing override");
    }

    #[test]
    fn zero_config_is_a_combined_one_voter_quorum_at_the_first_listener() {
        let q = parse(&props(&[]), 1, &listeners()).unwrap();
        assert!(q.broker && q.controller);
        assert_eq!(q.voters.ids().collect::<Vec<_>>(), vec![1]);
        assert_eq!(q.endpoints[&1], ("127.0.0.1".to_string(), 9092));
        assert!(!q.is_controller_listener("PLAINTEXT"));
        assert_eq!(
            (
                q.election_timeout_ms,
                q.fetch_timeout_ms,
                q.request_timeout_ms,
                q.retry_backoff_ms
            ),
            (1000, 2000, 2000, 20)
        );
    }

    #[test]
    fn voters_roles_and_listeners_are_validated_naming_the_key() {
        let ok = parse(
            &props(&[
                ("process.roles", "broker,controller"),
                (
                    "controller.quorum.voters",
                    "1@127.0.0.1:9093,2@127.0.0.1:9095",
                ),
                ("controller.listener.names", "CONTROLLER"),
                ("controller.quorum.election.timeout.ms", "300"),
            ]),
            2,
            &listeners(),
        )
        .unwrap();
        assert_eq!(ok.voters.len(), 2);
        assert_eq!(ok.election_timeout_ms, 300);
        assert!(ok.is_controller_listener("CONTROLLER"));
        assert!(!ok.is_controller_listener("PLAINTEXT"));
        let err = |kv: &[(&str, &str)], id| parse(&props(kv), id, &listeners()).unwrap_err();
        assert_eq!(
            err(&[("process.roles", "broker,cook")], 1).name,
            "process.roles"
        );
        assert_eq!(
            err(&[("controller.quorum.voters", "1@nohostport")], 1).name,
            "controller.quorum.voters"
        );
        assert_eq!(
            err(&[("controller.quorum.voters", "2@127.0.0.1:9093")], 1).name,
            "controller.quorum.voters"
        );
        let roles = ("process.roles", "broker,controller");
        assert_eq!(
            err(&[roles, ("controller.listener.names", "NOPE")], 1).name,
            "controller.listener.names"
        );
        assert!(err(
            &[roles, ("controller.listener.names", "CONTROLLER,NOPE")],
            1
        )
        .reason
        .contains("must only contain values"));
        // Without process.roles (gregor's zero-config node) a name without a listener is
        // tolerated: no listener is a controller listener then.
        let lenient = parse(
            &props(&[("controller.listener.names", "NOPE")]),
            1,
            &listeners(),
        );
        assert!(!lenient.unwrap().is_controller_listener("PLAINTEXT"));
        assert_eq!(
            err(&[("controller.quorum.fetch.timeout.ms", "soon")], 1).name,
            "controller.quorum.fetch.timeout.ms"
        );
        // A broker-only node is not a voter (it follows as an observer) and has no controller
        // listener of its own.
        let broker_only = [
            ("process.roles", "broker"),
            ("controller.quorum.voters", "1@127.0.0.1:9093"),
            ("controller.listener.names", "CTL"),
        ];
        let observer = parse(&props(&broker_only), 5, &listeners()).unwrap();
        assert!(!observer.controller && !observer.voters.contains(5));
        assert!(err(&broker_only, 1).reason.contains("must not be included"));
        assert!(err(&broker_only[..2], 5)
            .reason
            .contains("at least one value"));
    }
}
