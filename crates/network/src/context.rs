//! Who sent a request and how: the [`RequestContext`] passed to every handler (Kafka's
//! `RequestContext`, the `AuthorizableRequestContext` of KIP-504), with the connection's
//! [`KafkaPrincipal`], listener, [`SecurityProtocol`] and the client software reported by
//! ApiVersions v3+ (KIP-511).

use std::fmt;
use std::net::SocketAddr;
use std::time::Instant;

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

    /// Whether gregor can serve this protocol: PLAINTEXT and SSL (the TLS transport,
    /// [`crate::tls`]). Until SASL lands a SASL listener is refused at start-up rather than
    /// served without authentication.
    pub fn is_implemented(self) -> bool {
        matches!(self, Self::Plaintext | Self::Ssl)
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
        assert!(!SecurityProtocol::SaslSsl.is_implemented());
        assert_eq!(KafkaPrincipal::anonymous().to_string(), "User:ANONYMOUS");
    }
}
