//! What start-up says about the keys of a `server.properties` that gregor does not act on.
//!
//! A Kafka configuration file holds many keys; gregor acts on some (see
//! [`crate::config::acted_on`]) and must say so of every other one, once, grouped by why: a
//! feature gregor does not have yet, a Kafka setting that has no effect in gregor, or a name
//! neither knows (with the closest known name, as a typo usually is).

use std::collections::BTreeMap;

use crate::broker_config_defs::{kafka_broker_config, KAFKA_BROKER_CONFIGS};
use crate::config::{acted_on, TOPIC_CONFIGS};

/// Keys that are honoured at the values gregor accepts them at (any other value stops start-up
/// in [`crate::config::BrokerConfig::from_properties`]).
const HONOURED_AS_IS: &[&str] = &[
    // Names the inter-broker listener when inter.broker.listener.name is not set; checked
    // with gregor's own client settings (config::check_own_clients).
    "security.inter.broker.protocol",
    // The synonym of node.id (Kafka's KafkaConfig.populateSynonyms); checked to agree with it.
    "broker.id",
];

/// Why a key is not acted on: (key prefix or exact name, reason). The first match wins; an
/// entry ending in '.' is a prefix.
const RULES: &[(&str, &str)] = &[
    ("ssl.", "no effect in gregor: TLS is rustls with PEM and PKCS12 stores, which has no counterpart for this key"),
    ("sasl.", "not implemented yet: this SASL mechanism or option (start-up refuses it)"),
    ("transaction.two.phase.commit.enable", "not implemented yet: two-phase commit transactions (KIP-939)"),
    ("errors.deadletterqueue.", "not implemented yet: share groups (KIP-932, KIP-1191)"),
    ("log.remote.", "not implemented yet: tiered storage (KIP-405)"),
    ("follower.fetch.last.tiered.offset.enable", "not implemented yet: tiered storage (KIP-405)"),
    ("telemetry.max.bytes", "not implemented yet: client metrics (KIP-714)"),
    ("cordoned.log.dirs", "not implemented yet: cordoned log dirs (KIP-1066) are recorded, not avoided by placement"),
    ("delete.topic.enable", "not implemented yet: topics can always be deleted"),
    ("log.roll.jitter.hours", "not implemented yet: set log.roll.jitter.ms instead (the hours form is not read)"),
    ("controlled.shutdown.enable", "no effect in gregor: SIGTERM always shuts down in a controlled way (leadership moves first)"),
    ("create.topic.policy.class.name", "no effect in gregor: it loads no Java plug-in classes"),
    ("alter.config.policy.class.name", "no effect in gregor: it loads no Java plug-in classes"),
    ("config.providers", "no effect in gregor: it loads no Java plug-in classes"),
    ("share.", "not implemented yet: share groups (KIP-932)"),
    ("group.share.", "not implemented yet: share groups (KIP-932)"),
    ("group.streams.", "not implemented yet: streams groups (KIP-1071)"),
    ("streams.", "not implemented yet: streams groups (KIP-1071)"),
    ("remote.log.", "not implemented yet: tiered storage (KIP-405)"),
    ("log.local.retention.", "not implemented yet: tiered storage (KIP-405)"),
    ("remote.", "not implemented yet: tiered storage (KIP-405)"),
    ("principal.builder.class", "no effect in gregor: it loads no Java plug-in classes (principals are as Kafka's default builder makes them: User:<SASL name>, or the certificate's DN after ssl.principal.mapping.rules)"),
    ("delegation.token.", "not implemented yet: delegation tokens"),
    ("security.providers", "no effect in gregor: it loads no Java security providers (TLS is rustls)"),
    ("client.quota.callback.class", "no effect in gregor: it loads no Java plug-in classes (Kafka's default quota callback is built in)"),
    ("connection.failed.authentication.delay.ms", "not implemented yet: a failed authentication closes the connection at once, without this delay"),
    ("listener.name.", "not implemented yet: this per-listener setting (gregor reads listener.name.<l>.ssl.*, .sasl.*, the SASL mechanisms' keys and the connection limits)"),
    ("log.flush.offset.checkpoint.interval.ms", "no effect in gregor: recovery-point-offset-checkpoint is written after every flush that moves a recovery point, not on a timer"),
    ("log.flush.start.offset.checkpoint.interval.ms", "no effect in gregor: log-start-offset-checkpoint is written whenever retention or DeleteRecords moves a log start offset, not on a timer"),
    ("metric.reporters", "no effect in gregor: metrics are served in the Prometheus format on admin.listener (/metrics), not through JMX reporters"),
    ("metrics.", "no effect in gregor: metrics are served in the Prometheus format on admin.listener (/metrics), not through JMX reporters"),
    ("kafka.metrics.", "no effect in gregor: metrics are served in the Prometheus format on admin.listener (/metrics), not through JMX reporters"),
    ("auto.include.jmx.reporter", "no effect in gregor: metrics are served in the Prometheus format on admin.listener (/metrics), not through JMX reporters"),
    ("num.network.threads", "no effect in gregor: connections are served by its async runtime, which has one worker thread per core"),
    ("background.threads", "no effect in gregor: background work runs on its async runtime"),
    ("num.replica.alter.log.dirs.threads", "no effect in gregor: it does not move replicas between log dirs (AlterReplicaLogDirs)"),
    ("socket.send.buffer.bytes", "no effect in gregor: sockets keep the kernel's buffer sizes (net.core.*mem / net.ipv4.tcp_*mem)"),
    ("socket.receive.buffer.bytes", "no effect in gregor: sockets keep the kernel's buffer sizes (net.core.*mem / net.ipv4.tcp_*mem)"),
    ("replica.socket.receive.buffer.bytes", "no effect in gregor: sockets keep the kernel's buffer sizes (net.core.*mem / net.ipv4.tcp_*mem)"),
    ("socket.listen.backlog.size", "no effect in gregor: listeners use the runtime's backlog (1024)"),
    ("cluster.id", "no effect in gregor: the cluster id comes from meta.properties (gregor storage format -t)"),
];

/// The report: groups of keys with the reason they share, and unknown names.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ConfigReport {
    /// reason -> keys (sorted), for Kafka settings gregor does not act on.
    pub not_acted_on: BTreeMap<&'static str, Vec<String>>,
    /// Names neither gregor nor Kafka 4.4 knows, each with the closest known name if one is
    /// near (a likely typo).
    pub unknown: Vec<(String, Option<&'static str>)>,
}

impl ConfigReport {
    /// Classifies every key of `props`.
    pub fn of(props: &BTreeMap<String, String>) -> Self {
        let mut report = Self::default();
        for key in props.keys() {
            let k = key.as_str();
            if acted_on(k)
                || HONOURED_AS_IS.contains(&k)
                || is_log_dir_alias(k)
                || crate::listener_security::acted_on(k)
            {
                continue;
            }
            if let Some((_, why)) = RULES.iter().find(|(p, _)| {
                if p.ends_with('.') {
                    k.starts_with(p)
                } else {
                    k == *p
                }
            }) {
                report
                    .not_acted_on
                    .entry(why)
                    .or_default()
                    .push(key.clone());
            } else if kafka_broker_config(k).is_some() {
                report
                    .not_acted_on
                    .entry("no effect in gregor: a Kafka setting gregor has no counterpart for")
                    .or_default()
                    .push(key.clone());
            } else {
                report.unknown.push((key.clone(), closest_known(k)));
            }
        }
        report
    }

    /// Nothing to say.
    pub fn is_empty(&self) -> bool {
        self.not_acted_on.is_empty() && self.unknown.is_empty()
    }

    /// The unknown names alone.
    pub fn unknown_keys(&self) -> Vec<String> {
        self.unknown.iter().map(|(k, _)| k.clone()).collect()
    }

    /// One line per group, for the log: `<reason>: key, key`; then `unknown configuration key
    /// <k> (did you mean <s>?)` per unknown name.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .not_acted_on
            .iter()
            .map(|(why, keys)| format!("{why}; ignoring {}", keys.join(", ")))
            .collect();
        for (k, s) in &self.unknown {
            out.push(match s {
                Some(s) => format!("unknown configuration key {k}: did you mean {s}? (ignored)"),
                None => format!(
                    "unknown configuration key {k}: neither gregor nor Kafka 4.4 has it (ignored)"
                ),
            });
        }
        out
    }
}

/// `log.dir`: Kafka's single-dir form of `log.dirs`, read when `log.dirs` is absent.
fn is_log_dir_alias(k: &str) -> bool {
    k == "log.dir"
}

/// The known config name nearest to `name` by edit distance, if it is near enough to be a
/// typo: at most 2 edits, or 3 for names of 20 characters or more.
fn closest_known(name: &str) -> Option<&'static str> {
    let limit = if name.len() >= 20 { 3 } else { 2 };
    let gregor_only: &[&'static str] = &[
        "admin.listener",
        "admin.metrics.per.partition",
        "fetch.zero.copy.enable",
        "log.dir",
        "log.index.cache.bytes",
    ];
    KAFKA_BROKER_CONFIGS
        .iter()
        .map(|d| d.name)
        .chain(TOPIC_CONFIGS.iter().filter_map(|d| d.broker_synonym))
        .chain(gregor_only.iter().copied())
        .map(|known| (edit_distance(name, known), known))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, known)| known)
}

/// Levenshtein distance (insertions, deletions, substitutions), in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = substitution.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Why gregor does not act on broker config `name`, or `None` when it does. Kafka configs
/// without a rule of their own get the generic "no counterpart" reason.
pub fn not_acted_on_because(name: &str) -> Option<&'static str> {
    if acted_on(name)
        || HONOURED_AS_IS.contains(&name)
        || is_log_dir_alias(name)
        || crate::listener_security::acted_on(name)
    {
        return None;
    }
    Some(
        RULES
            .iter()
            .find(|(p, _)| {
                if p.ends_with('.') {
                    name.starts_with(p)
                } else {
                    name == *p
                }
            })
            .map_or(
                "no effect in gregor: a Kafka setting gregor has no counterpart for",
                |(_, why)| why,
            ),
    )
}

/// `docs/configuration.md`: every broker config gregor or Kafka 4.4 knows (gregor's default,
/// Kafka's default, whether gregor acts on it and if not why), then every topic config. Made
/// from the tables in the code; a test keeps the committed file equal to it.
pub fn reference_markdown() -> String {
    use std::fmt::Write;
    let mut names: std::collections::BTreeSet<&'static str> =
        KAFKA_BROKER_CONFIGS.iter().map(|d| d.name).collect();
    names.extend(crate::config::broker_keys().map(|(n, _, _)| *n));
    names.extend(TOPIC_CONFIGS.iter().filter_map(|d| d.broker_synonym));
    names.extend(crate::quorum_config::QUORUM_KEYS.iter().copied());
    names.extend(crate::config::BROKER_QUOTA_KEYS.iter().copied());
    names.extend(crate::listener_security::SSL_KEYS.iter().map(|(n, _)| *n));
    let cell = |v: Option<&str>| match v {
        None => String::new(),
        Some("") => "(empty)".to_string(),
        Some(v) => format!("`{}`", v.replace('|', "\\|")),
    };
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from gregor's config tables (`crates/broker/src/config.rs`,\n\
         `crates/broker/src/broker_config_defs/table.rs`, `crates/broker/src/config_report.rs`);\n\
         `cargo test -p gregor-broker --lib config_reference` fails when this file and the code\n\
         differ, and `GREGOR_UPDATE_DOCS=1` with that command rewrites it.\n\n\
         ## Broker configs (`server.properties`, `--set`, dynamic with `kafka-configs`)\n\n\
         Every broker config Apache Kafka 4.4 defines, and gregor's own (`admin.listener`,\n\
         `admin.metrics.per.partition`, `fetch.zero.copy.enable`, `log.index.cache.bytes`,\n\
         `ssl.handshake.timeout.ms`, `ssl.reload.check.interval.ms`). The `ssl.*` keys,\n\
         `max.connections` and `max.connection.creation.rate` also apply per listener as\n\
         `listener.name.<listener>.<key>`.\n\
         *gregor's default* is what gregor uses when the key is not set, where it differs from\n\
         Kafka's or Kafka has none. A key gregor does not act on is accepted, reported once at\n\
         start-up with the reason given here, stored when changed at run time, and described by\n\
         DescribeConfigs.\n\n\
         | name | Kafka's default | gregor's default | gregor acts on it |\n|---|---|---|---|\n",
    );
    for name in names {
        let kafka = kafka_broker_config(name).and_then(|d| d.default);
        let gregor = crate::config::broker_keys()
            .find(|(n, _, _)| *n == name)
            .map(|(_, _, d)| *d)
            .or_else(|| {
                TOPIC_CONFIGS
                    .iter()
                    .find(|d| d.broker_synonym == Some(name))
                    .map(|d| d.default)
            })
            .or_else(|| {
                crate::listener_security::SSL_KEYS
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, d)| *d)
            });
        let gregor = match (gregor, kafka) {
            (Some(g), Some(k)) if g == k => None,
            (g, _) => g,
        };
        let acts = not_acted_on_because(name).unwrap_or("yes");
        let _ = writeln!(
            out,
            "| `{name}` | {} | {} | {acts} |",
            cell(kafka),
            cell(gregor)
        );
    }
    out.push_str(
        "\n## Topic configs (`kafka-topics --config`, `kafka-configs --entity-type topics`)\n\n\
         | name | broker default from | Kafka's default | |\n|---|---|---|---|\n",
    );
    for d in TOPIC_CONFIGS {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            d.name,
            d.broker_synonym
                .map_or_else(String::new, |b| format!("`{b}`")),
            cell(Some(d.default)),
            d.doc.replace('|', "\\|")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/configuration.md is [`reference_markdown`]'s output (set GREGOR_UPDATE_DOCS=1 to
    /// rewrite it).
    #[test]
    fn config_reference_is_up_to_date() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
        let expected = reference_markdown();
        if std::env::var_os("GREGOR_UPDATE_DOCS").is_some() {
            std::fs::write(&path, &expected).expect("writing docs/configuration.md");
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == expected,
            "docs/configuration.md differs from the config tables in the code; rewrite it with \
             GREGOR_UPDATE_DOCS=1 cargo test -p gregor-broker --lib config_reference"
        );
    }

    fn props(keys: &[&str]) -> BTreeMap<String, String> {
        keys.iter()
            .map(|k| ((*k).to_string(), "1".to_string()))
            .collect()
    }

    #[test]
    fn kafka_4_server_properties_is_reported_by_reason() {
        // The keys of Kafka 4.x's config/server.properties.
        let report = ConfigReport::of(&props(&[
            "process.roles",
            "node.id",
            "controller.quorum.bootstrap.servers",
            "listeners",
            "advertised.listeners",
            "controller.listener.names",
            "listener.security.protocol.map",
            "num.network.threads",
            "num.io.threads",
            "socket.send.buffer.bytes",
            "socket.receive.buffer.bytes",
            "socket.request.max.bytes",
            "log.dirs",
            "num.partitions",
            "num.recovery.threads.per.data.dir",
            "offsets.topic.replication.factor",
            "share.coordinator.state.topic.replication.factor",
            "share.coordinator.state.topic.min.isr",
            "transaction.state.log.replication.factor",
            "transaction.state.log.min.isr",
            "log.retention.hours",
            "log.segment.bytes",
            "log.retention.check.interval.ms",
        ]));
        assert!(report.unknown.is_empty(), "{report:?}");
        let why = |k: &str| {
            report
                .not_acted_on
                .iter()
                .find(|(_, keys)| keys.iter().any(|x| x == k))
                .map(|(w, _)| *w)
        };
        assert_eq!(why("transaction.state.log.min.isr"), None);
        assert!(why("share.coordinator.state.topic.min.isr")
            .unwrap()
            .contains("share groups"));
        assert!(why("num.network.threads").unwrap().starts_with("no effect"));
        assert!(why("socket.send.buffer.bytes")
            .unwrap()
            .starts_with("no effect"));
        for acted in [
            "num.recovery.threads.per.data.dir",
            "process.roles",
            "listeners",
            "log.retention.hours",
            "num.io.threads",
        ] {
            assert_eq!(why(acted), None, "{acted}");
        }
        // Every key once.
        let n: usize = report.not_acted_on.values().map(Vec::len).sum();
        assert_eq!(n, 5, "{report:?}");
    }

    #[test]
    fn transaction_settings_are_acted_on() {
        let honoured = [
            "transactional.id.expiration.ms",
            "transaction.max.timeout.ms",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms",
            "transaction.remove.expired.transaction.cleanup.interval.ms",
            "transaction.state.log.num.partitions",
            "transaction.state.log.replication.factor",
            "transaction.state.log.min.isr",
            "transaction.state.log.segment.bytes",
            "transaction.partition.verification.enable",
            "producer.id.expiration.ms",
            "producer.id.expiration.check.interval.ms",
            "add.partitions.to.txn.retry.backoff.ms",
            "add.partitions.to.txn.retry.backoff.max.ms",
        ];
        let mut keys = honoured.to_vec();
        keys.push("transaction.two.phase.commit.enable");
        let report = ConfigReport::of(&props(&keys));
        assert!(report.unknown.is_empty(), "{report:?}");
        let reported: Vec<&String> = report.not_acted_on.values().flatten().collect();
        assert_eq!(
            reported,
            ["transaction.two.phase.commit.enable"],
            "{report:?}"
        );
        assert!(report
            .not_acted_on
            .keys()
            .any(|why| why.contains("KIP-939")));
    }

    #[test]
    fn a_typo_gets_the_closest_name() {
        let report = ConfigReport::of(&props(&["log.retention.hour", "zzz.nothing.like.it"]));
        assert_eq!(
            report.unknown,
            vec![
                (
                    "log.retention.hour".to_string(),
                    Some("log.retention.hours")
                ),
                ("zzz.nothing.like.it".to_string(), None),
            ]
        );
        let lines = report.lines();
        assert!(
            lines[0].contains("did you mean log.retention.hours?"),
            "{lines:?}"
        );
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
