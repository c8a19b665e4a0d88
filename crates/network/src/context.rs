//! Who sent a request and how: the [`RequestContext`] passed to every handler (Kafka's
//! `RequestContext`, the `AuthorizableRequestContext` of KIP-504), with the connection's
//! [`KafkaPrincipal`], listener, [`SecurityProtocol`] and the client software reported by
//! ApiVersions v3+ (KIP-511).

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use gregor_protocol::kafka_protocol::messages::{ApiKey, RequestHeader};

/// Kafka's `SecurityProtocol`: how a listener's connections are secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SecurityProtocol {
    /// Un-authenticated, non-encrypted channel.
    Plaintext,
    /// TLS.
    Ssl,
    /// SASL authentication over plaintext.
    SaslPlaintext,
    /// SASL authentication over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Every protocol, in Kafka's order.
    pub const ALL: [Self; 4] = [
        Self::Plaintext,
        Self::Ssl,
        Self::SaslPlaintext,
        Self::SaslSsl,
    ];

    /// Kafka's name (`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`, `SASL_SSL`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Plaintext => "PLAINTEXT",
            Self::Ssl => "SSL",
            Self::SaslPlaintext => "SASL_PLAINTEXT",
            Self::SaslSsl => "SASL_SSL",
        }
    }

    /// Parses a name case-insensitively, as Kafka's `SecurityProtocol.forName`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Whether gregor can serve this protocol: all four of Kafka's (SSL and SASL_SSL with
    /// the TLS transport, [`crate::tls`]; SASL_PLAINTEXT and SASL_SSL with a SASL
    /// configuration). Kept so that a protocol added later is refused at start-up rather than
    /// served without the security it names.
    pub fn is_implemented(self) -> bool {
        matches!(
            self,
            Self::Plaintext | Self::Ssl | Self::SaslPlaintext | Self::SaslSsl
        )
    }

    /// Whether connections of this protocol run TLS (`SSL`, `SASL_SSL`).
    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    /// Whether connections of this protocol authenticate with SASL (`SASL_PLAINTEXT`,
    /// `SASL_SSL`).
    pub fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

impl fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Kafka's `KafkaPrincipal`: `<type>:<name>`, e.g. `User:alice`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KafkaPrincipal {
    /// Principal type (`User`).
    pub principal_type: String,
    /// Principal name.
    pub name: String,
}

impl KafkaPrincipal {
    /// `User`, the type of every principal Kafka's built-in principal builder creates.
    pub const USER_TYPE: &'static str = "User";

    /// `User:ANONYMOUS`: the principal of every connection on a PLAINTEXT listener.
    pub fn anonymous() -> Self {
        Self {
            principal_type: Self::USER_TYPE.to_string(),
            name: "ANONYMOUS".to_string(),
        }
    }
}

impl fmt::Display for KafkaPrincipal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.principal_type, self.name)
    }
}

/// Everything a handler may need to know about a request besides its body.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// The request header (api key, version, correlation id, client id).
    pub header: RequestHeader,
    /// API of the request.
    pub api_key: ApiKey,
    /// The authenticated principal (`User:ANONYMOUS` on PLAINTEXT listeners).
    pub principal: KafkaPrincipal,
    /// Name of the listener the connection came in on (`PLAINTEXT`, `CONTROLLER`, ...).
    pub listener_name: String,
    /// Security protocol of that listener.
    pub security_protocol: SecurityProtocol,
    /// The client's address and port.
    pub client_address: SocketAddr,
    /// Client software name from the connection's last ApiVersions v3+ (KIP-511), or
    /// `unknown` as Kafka reports it before one arrives.
    pub client_software_name: String,
    /// Client software version from the connection's last ApiVersions v3+ (KIP-511), or
    /// `unknown`.
    pub client_software_version: String,
    /// When the request's last byte was read.
    pub received_at: Instant,
    /// Whether the connection can send file regions without copying them (a plain TCP
    /// stream, [`crate::transport::Stream::Tcp`]): a handler may then answer with
    /// [`crate::Handled::ReadyResponse`] parts that are file regions sent without a copy.
    /// A region in a response on another connection is read into memory first.
    pub sends_files: bool,
    /// Size of the request as read from the wire, header and body, without the 4-byte
    /// length prefix (Kafka's `RequestChannel.Request.sizeInBytes`), in bytes: what a
    /// `producer_byte_rate` quota records for a Produce request.
    pub size_in_bytes: usize,
    /// The connection's quota throttle (KIP-219): a handler that computed a throttle time
    /// mutes the connection's reads for it; shared by the requests of one connection.
    pub throttle: ConnectionThrottle,
}

/// Muting of a connection for quota throttling (KIP-219; Kafka's `ThrottledChannel` and the
/// `MUTED_AND_THROTTLED` channel state): the response goes out at once with its
/// `throttle_time_ms`, and the broker reads no further request of the connection until the
/// throttle time has passed. Kafka does so whatever the request's version (only the client's
/// own back-off depends on the version). Cheap to clone; clones share the state.
#[derive(Debug, Clone, Default)]
pub struct ConnectionThrottle {
    until: Arc<Mutex<Option<Instant>>>,
}

impl ConnectionThrottle {
    /// Mutes the connection's reads for `throttle_time_ms` from now (a longer throttle
    /// already in force is kept). 0 or less does nothing.
    pub fn throttle(&self, throttle_time_ms: i64) {
        let Ok(ms) = u64::try_from(throttle_time_ms) else {
            return;
        };
        if ms == 0 {
            return;
        }
        let end = Instant::now() + Duration::from_millis(ms);
        let mut until = self.until.lock();
        if until.is_none_or(|u| u < end) {
            *until = Some(end);
        }
    }

    /// When the current throttle ends, if one is in force.
    pub fn throttled_until(&self) -> Option<Instant> {
        let until = *self.until.lock();
        until.filter(|u| *u > Instant::now())
    }

    /// Waits until no throttle is in force (returns at once when none is).
    pub async fn wait(&self) {
        while let Some(until) = self.throttled_until() {
            tokio::time::sleep_until(until.into()).await;
        }
    }
}

impl RequestContext {
    /// The context of a request made inside this process (unit tests, in-process callers):
    /// `User:ANONYMOUS` on the PLAINTEXT listener from 127.0.0.1, no client software.
    pub fn local(api_key: ApiKey, version: i16) -> Self {
        Self {
            header: RequestHeader::default()
                .with_request_api_key(api_key as i16)
                .with_request_api_version(version),
            api_key,
            principal: KafkaPrincipal::anonymous(),
            listener_name: "PLAINTEXT".into(),
            security_protocol: SecurityProtocol::Plaintext,
            client_address: SocketAddr::from(([127, 0, 0, 1], 0)),
            client_software_name: "unknown".into(),
            client_software_version: "unknown".into(),
            received_at: Instant::now(),
            sends_files: false,
            size_in_bytes: 0,
            throttle: ConnectionThrottle::default(),
        }
    }

    /// The header's client id, or the empty string.
    pub fn client_id(&self) -> &str {
        self.header.client_id.as_deref().unwrap_or("")
    }

    /// The request's API version.
    pub fn api_version(&self) -> i16 {
        self.header.request_api_version
    }

    /// The client host as Kafka reports it in DescribeGroups and friends: `/<ip>`.
    pub fn client_host(&self) -> String {
        format!("/{}", self.client_address.ip())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_names_round_trip_case_insensitively() {
        for p in SecurityProtocol::ALL {
            assert_eq!(SecurityProtocol::from_name(p.name()), Some(p));
            assert_eq!(
                SecurityProtocol::from_name(&p.name().to_lowercase()),
                Some(p)
            );
        }
        assert_eq!(SecurityProtocol::from_name("TLS"), None);
        assert!(SecurityProtocol::Plaintext.is_implemented());
        assert!(SecurityProtocol::Ssl.is_implemented());
        assert!(SecurityProtocol::SaslSsl.is_implemented());
        assert!(SecurityProtocol::SaslSsl.uses_tls() && SecurityProtocol::SaslSsl.uses_sasl());
        assert!(!SecurityProtocol::SaslPlaintext.uses_tls());
        assert_eq!(KafkaPrincipal::anonymous().to_string(), "User:ANONYMOUS");
    }
}
