//! The values every parser of the broker's configuration shares: the error naming a bad
//! value ([`ConfigError`], Kafka's `ConfigException`) and a listener (`NAME://host:port`,
//! [`Listener`]). The broker and topic configs (`config`, which re-exports both) and the roles
//! and quorum settings (`quorum_config`) are parsed with them.

use gregor_network::SecurityProtocol;
use thiserror::Error;

/// A bad config value, naming the key and what is wrong (Kafka's `ConfigException`).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("Invalid value {value} for configuration {name}: {reason}")]
pub struct ConfigError {
    /// Config name.
    pub name: String,
    /// Offending value.
    pub value: String,
    /// Why it is invalid.
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(name: &str, value: &str, reason: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

/// A listener: `NAME://host:port`, with the security protocol `listener.security.protocol.map`
/// gives its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// Listener name, upper-cased as Kafka's `ListenerName.normalised` (PLAINTEXT).
    pub name: String,
    /// Host or IP to bind or advertise; empty binds every interface.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The listener's security protocol.
    pub security_protocol: SecurityProtocol,
}

impl Listener {
    /// Parses `NAME://host:port` (IPv6 hosts in brackets), with the security protocol of
    /// Kafka's default `listener.security.protocol.map` (a protocol name maps to itself;
    /// other names are PLAINTEXT until the broker config applies the map).
    ///
    /// # Errors
    /// [`ConfigError`] naming `config_name`.
    pub fn parse(config_name: &str, s: &str) -> Result<Self, ConfigError> {
        let bad = |why: &str| ConfigError::new(config_name, s, why);
        let (name, rest) = s
            .split_once("://")
            .ok_or_else(|| bad("expected NAME://host:port"))?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| bad("expected NAME://host:port"))?;
        let port: u16 = port.parse().map_err(|_| bad("port is not a number"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        if name.is_empty() {
            return Err(bad("listener name is empty"));
        }
        let name = name.to_ascii_uppercase();
        Ok(Self {
            security_protocol: SecurityProtocol::from_name(&name)
                .unwrap_or(SecurityProtocol::Plaintext),
            name,
            host,
            port,
        })
    }
}
