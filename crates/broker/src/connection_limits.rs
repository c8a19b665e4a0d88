//! Connection limits changed at run time (KIP-226 dynamic broker configs; Kafka's
//! `SocketServer.reconfigure` and `ListenerConnectionQuota.reconfigure`): `max.connections`,
//! `max.connections.per.ip`, `max.connections.per.ip.overrides`,
//! `max.connection.creation.rate`, and per listener
//! `listener.name.<listener>.max.connections` and
//! `listener.name.<listener>.max.connection.creation.rate`, set with `kafka-configs --alter
//! --entity-type brokers` (for one broker or as the cluster default) over the static config.
//! The per-IP `connection_creation_rate` quotas need no publisher: the acceptor reads them from
//! the metadata image for each new connection.

use std::collections::BTreeMap;
use std::sync::Arc;

use gregor_network::quotas::{ConnectionLimits, ConnectionQuotas, ListenerConnectionQuota};
use tracing::{info, warn};

use crate::config::{BrokerConfig, DynamicBrokerConfigs};

/// The broker-wide keys.
const BROKER_KEYS: &[&str] = &[
    "max.connections",
    "max.connections.per.ip",
    "max.connections.per.ip.overrides",
    "max.connection.creation.rate",
];

/// The per-listener keys, under `listener.name.<listener>.`.
const LISTENER_KEYS: &[&str] = &["max.connections", "max.connection.creation.rate"];

/// Applies dynamic connection limits to socket servers' [`ConnectionQuotas`].
pub struct ConnectionLimitsPublisher {
    node_id: i32,
    raw: BTreeMap<String, String>,
    listeners: Vec<String>,
    quotas: Vec<Arc<ConnectionQuotas>>,
    /// The effective values last applied (static ones at first).
    applied: parking_lot::Mutex<BTreeMap<String, String>>,
}

impl ConnectionLimitsPublisher {
    /// A publisher for `config`'s listeners, reconfiguring `quotas`.
    pub fn new(config: &BrokerConfig, quotas: Vec<Arc<ConnectionQuotas>>) -> Self {
        let mut p = Self {
            node_id: config.node_id,
            raw: config.raw.clone(),
            listeners: config.listeners.iter().map(|l| l.name.clone()).collect(),
            quotas,
            applied: parking_lot::Mutex::new(BTreeMap::new()),
        };
        let initial = p.effective(&DynamicBrokerConfigs::default());
        p.applied = parking_lot::Mutex::new(initial);
        p
    }

    /// Every connection limit key (set anywhere) with its value: the dynamic one for this
    /// broker, else the cluster default, else the static one.
    fn effective(&self, dynamic: &DynamicBrokerConfigs) -> BTreeMap<String, String> {
        let keys =
            BROKER_KEYS
                .iter()
                .map(|k| (*k).to_string())
                .chain(self.listeners.iter().flat_map(|l| {
                    LISTENER_KEYS
                        .iter()
                        .map(move |k| format!("listener.name.{}.{k}", l.to_ascii_lowercase()))
                }));
        keys.filter_map(|k| {
            let v = dynamic
                .get(&k)
                .map(|(v, _)| v.trim().to_string())
                .or_else(|| self.raw.get(&k).map(|v| v.trim().to_string()))?;
            Some((k, v))
        })
        .collect()
    }

    /// The limits of `values` (from [`Self::effective`]). A value that is not a whole number of
    /// at least 0 keeps Kafka's default (AlterConfigs refuses such values of the broker-wide
    /// keys; the per-listener ones are checked at start-up only).
    fn limits(&self, values: &BTreeMap<String, String>) -> ConnectionLimits {
        let int = |k: &str| {
            values
                .get(k)
                .and_then(|v| v.parse::<i32>().ok())
                .filter(|v| *v >= 0)
                .unwrap_or(i32::MAX)
        };
        let overrides = values
            .get("max.connections.per.ip.overrides")
            .map_or_else(
                || Ok(Default::default()),
                |v| crate::config::parse_connection_overrides(v),
            )
            .unwrap_or_else(|e| {
                warn!(error = %e, "max.connections.per.ip.overrides cannot be used; no overrides apply");
                Default::default()
            });
        ConnectionLimits {
            max_connections: int("max.connections"),
            max_connections_per_ip: int("max.connections.per.ip"),
            max_connections_per_ip_overrides: overrides,
            max_connection_creation_rate: int("max.connection.creation.rate"),
            listeners: self
                .listeners
                .iter()
                .map(|l| {
                    let prefix = format!("listener.name.{}.", l.to_ascii_lowercase());
                    (
                        l.clone(),
                        ListenerConnectionQuota {
                            max_connections: int(format!("{prefix}max.connections").as_str()),
                            max_connection_creation_rate: int(format!(
                                "{prefix}max.connection.creation.rate"
                            )
                            .as_str()),
                        },
                    )
                })
                .collect(),
        }
    }
}

impl gregor_metadata::MetadataPublisher for ConnectionLimitsPublisher {
    fn name(&self) -> &str {
        "connection-limits"
    }

    fn on_metadata_update(
        &self,
        _delta: &gregor_metadata::MetadataDelta<'_>,
        image: &Arc<gregor_metadata::MetadataImage>,
    ) -> Result<(), String> {
        let dynamic = DynamicBrokerConfigs::from_image(image, self.node_id);
        let effective = self.effective(&dynamic);
        let mut applied = self.applied.lock();
        if *applied == effective {
            return Ok(());
        }
        let limits = self.limits(&effective);
        info!(?effective, "connection limits changed");
        for q in &self.quotas {
            q.reconfigure(&limits);
        }
        *applied = effective;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_values_over_static_ones() {
        let (config, _) = BrokerConfig::from_properties(
            [
                (
                    "listeners",
                    "PLAINTEXT://127.0.0.1:9092,EXTERNAL://127.0.0.1:9093",
                ),
                (
                    "listener.security.protocol.map",
                    "PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT",
                ),
                ("max.connections", "100"),
                ("listener.name.external.max.connections", "5"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        )
        .expect("config");
        let p = ConnectionLimitsPublisher::new(&config, Vec::new());
        let fixed = p.limits(&p.effective(&DynamicBrokerConfigs::default()));
        assert_eq!(fixed.max_connections, 100);
        assert_eq!(fixed.listeners["EXTERNAL"].max_connections, 5);
        assert_eq!(
            fixed.listeners["PLAINTEXT"],
            ListenerConnectionQuota::default()
        );
        let dynamic = DynamicBrokerConfigs {
            per_broker: BTreeMap::from([(
                "listener.name.external.max.connections".to_string(),
                "2".to_string(),
            )]),
            cluster_default: BTreeMap::from([
                ("max.connections".to_string(), "50".to_string()),
                (
                    "listener.name.external.max.connections".to_string(),
                    "3".to_string(),
                ),
                (
                    "max.connections.per.ip.overrides".to_string(),
                    "127.0.0.1:4".to_string(),
                ),
            ]),
        };
        let changed = p.limits(&p.effective(&dynamic));
        assert_eq!(changed.max_connections, 50);
        assert_eq!(changed.listeners["EXTERNAL"].max_connections, 2);
        assert_eq!(
            changed
                .max_connections_per_ip_overrides
                .get(&"127.0.0.1".parse::<std::net::IpAddr>().expect("ip")),
            Some(&4)
        );
    }
}
