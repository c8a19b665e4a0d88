//! SASL authentication on `SASL_PLAINTEXT` (and `SASL_SSL`) listeners: Kafka's
//! `SaslServerAuthenticator` (KIP-43 SaslHandshake, KIP-152 SaslAuthenticate, KIP-368
//! re-authentication) with the mechanisms PLAIN (RFC 4616, users from the listener's JAAS
//! config), SCRAM-SHA-256/512 (RFC 5802/7677, KIP-84, credentials from the metadata image,
//! [`scram`]) and OAUTHBEARER with unsecured JWTs (KIP-255, [`oauthbearer`]) or JWTs signed
//! with a key of a JWKS (KIP-768, [`jwks`]).
//!
//! The authenticator ([`SaslAuthenticator`]) sits in the connection's reader, in front of the
//! handler: until authentication completes only ApiVersions (passed to the handler),
//! SaslHandshake and SaslAuthenticate are served, and anything else closes the connection.
//! The SASL layer does not wrap the byte stream, so it composes with any
//! [`crate::transport::TransportLayer`]: TLS for `SASL_SSL`, plain TCP for `SASL_PLAINTEXT`.

pub mod authenticator;
pub mod jaas;
pub mod jwks;
pub mod oauthbearer;
pub mod plain;
pub mod scram;

use std::collections::BTreeMap;
use std::sync::Arc;

pub use authenticator::{Decision, SaslAuthenticator};
pub use scram::{ScramCredential, ScramCredentialStore, ScramMechanism};

/// A SASL mechanism gregor serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// PLAIN.
    Plain,
    /// SCRAM-SHA-256 or SCRAM-SHA-512.
    Scram(ScramMechanism),
    /// OAUTHBEARER.
    OAuthBearer,
}

impl Mechanism {
    /// Every mechanism gregor implements.
    pub const ALL: [Self; 4] = [
        Self::Plain,
        Self::Scram(ScramMechanism::Sha256),
        Self::Scram(ScramMechanism::Sha512),
        Self::OAuthBearer,
    ];

    /// The SASL name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::Scram(m) => m.mechanism_name(),
            Self::OAuthBearer => "OAUTHBEARER",
        }
    }

    /// The mechanism of a SASL name (exact, as Kafka compares them).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// One step of a SASL exchange on the server side.
#[derive(Debug)]
pub enum SaslStep {
    /// A challenge for the client; the exchange goes on.
    Continue(Vec<u8>),
    /// The exchange succeeded.
    Complete {
        /// The last bytes for the client (may be empty).
        response: Vec<u8>,
        /// The authenticated user: the principal becomes `User:<authorization_id>`.
        authorization_id: String,
        /// When the credential stops being valid (an OAUTHBEARER token's `exp`), ms since
        /// the epoch; bounds the session lifetime (KIP-368).
        credential_expiration_ms: Option<i64>,
    },
}

/// Why an exchange failed. Both close the connection after the response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaslError {
    /// Kafka's `SaslAuthenticationException`: the message is sent to the client.
    Authentication(String),
    /// Kafka's `SaslException`: the detail is only logged; the client gets "Authentication
    /// failed during authentication due to invalid credentials with SASL mechanism <m>".
    Credentials(String),
    /// Kafka's `IllegalSaslStateException`.
    IllegalState(String),
}

impl std::fmt::Display for SaslError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Authentication(m) | Self::Credentials(m) | Self::IllegalState(m) => {
                f.write_str(m)
            }
        }
    }
}

/// The OAUTHBEARER settings of a listener: Kafka's unsecured validator options
/// (`OAuthBearerUnsecuredValidatorCallbackHandler`), from the JAAS config of
/// `listener.name.<l>.oauthbearer.sasl.jaas.config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthBearerConfig {
    /// `unsecuredValidatorPrincipalClaimName` (default `sub`).
    pub principal_claim_name: String,
    /// `unsecuredValidatorScopeClaimName` (default `scope`).
    pub scope_claim_name: String,
    /// `unsecuredValidatorRequiredScope`: space-separated scopes the token must have.
    pub required_scope: Vec<String>,
    /// `unsecuredValidatorAllowableClockSkewMs` (default 0).
    pub allowable_clock_skew_ms: i64,
}

impl Default for OAuthBearerConfig {
    fn default() -> Self {
        Self {
            principal_claim_name: "sub".into(),
            scope_claim_name: "scope".into(),
            required_scope: Vec::new(),
            allowable_clock_skew_ms: 0,
        }
    }
}

/// How one SASL listener authenticates.
#[derive(Clone)]
pub struct SaslServerConfig {
    /// `sasl.enabled.mechanisms` (or its `listener.name.<l>.` form), in the configured order:
    /// the list SaslHandshake answers with.
    pub enabled_mechanisms: Vec<Mechanism>,
    /// PLAIN users and passwords (`user_<name>="<password>"` of PlainLoginModule).
    pub plain_users: BTreeMap<String, String>,
    /// Where SCRAM credentials come from (the metadata image on a broker).
    pub scram_credentials: Option<Arc<dyn ScramCredentialStore>>,
    /// OAUTHBEARER's unsecured validator options.
    pub oauthbearer: OAuthBearerConfig,
    /// Set: OAUTHBEARER tokens must be JWTs signed with a key of this validator's JWKS
    /// (KIP-768); the unsecured options above are then unused.
    pub oauthbearer_signed: Option<Arc<jwks::SignedJwtValidator>>,
    /// `connections.max.reauth.ms` (default 0: sessions do not expire, KIP-368).
    pub connections_max_reauth_ms: i64,
    /// Per mechanism, `listener.name.<l>.<mechanism>.connections.max.reauth.ms` (Kafka's
    /// `SaslChannelBuilder.createConnectionsMaxReauthMsMap`), over the value above.
    pub connections_max_reauth_ms_by_mechanism: Vec<(Mechanism, i64)>,
    /// `sasl.server.max.receive.size` (default 524288): the largest frame read before
    /// authentication completes, bytes.
    pub max_receive_size: usize,
}

impl std::fmt::Debug for SaslServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslServerConfig")
            .field("enabled_mechanisms", &self.enabled_mechanisms)
            .field("plain_users", &self.plain_users.keys().collect::<Vec<_>>())
            .field("scram_credentials", &self.scram_credentials.is_some())
            .field("oauthbearer", &self.oauthbearer)
            .field("oauthbearer_signed", &self.oauthbearer_signed)
            .field("connections_max_reauth_ms", &self.connections_max_reauth_ms)
            .field("max_receive_size", &self.max_receive_size)
            .finish()
    }
}

impl SaslServerConfig {
    /// Kafka's default `sasl.server.max.receive.size`.
    pub const DEFAULT_MAX_RECEIVE_SIZE: usize = 524_288;

    /// A config with `mechanisms` enabled and nothing else.
    pub fn new(enabled_mechanisms: Vec<Mechanism>) -> Self {
        Self {
            enabled_mechanisms,
            plain_users: BTreeMap::new(),
            scram_credentials: None,
            oauthbearer: OAuthBearerConfig::default(),
            oauthbearer_signed: None,
            connections_max_reauth_ms: 0,
            connections_max_reauth_ms_by_mechanism: Vec::new(),
            max_receive_size: Self::DEFAULT_MAX_RECEIVE_SIZE,
        }
    }

    /// `connections.max.reauth.ms` for `mechanism`.
    pub fn connections_max_reauth_ms(&self, mechanism: Mechanism) -> i64 {
        self.connections_max_reauth_ms_by_mechanism
            .iter()
            .find(|(m, _)| *m == mechanism)
            .map_or(self.connections_max_reauth_ms, |(_, ms)| *ms)
    }

    /// The server side of one exchange for `mechanism`.
    fn server(&self, mechanism: Mechanism) -> MechanismServer {
        match mechanism {
            Mechanism::Plain => {
                MechanismServer::Plain(plain::PlainServer::new(Arc::new(self.plain_users.clone())))
            }
            Mechanism::Scram(m) => match &self.scram_credentials {
                Some(store) => MechanismServer::Scram(scram::ScramServer::new(m, store.clone())),
                None => MechanismServer::Scram(scram::ScramServer::new(m, Arc::new(NoCredentials))),
            },
            Mechanism::OAuthBearer => {
                MechanismServer::OAuthBearer(match &self.oauthbearer_signed {
                    Some(v) => oauthbearer::OAuthBearerServer::signed(v.clone()),
                    None => oauthbearer::OAuthBearerServer::new(self.oauthbearer.clone()),
                })
            }
        }
    }
}

struct NoCredentials;

impl ScramCredentialStore for NoCredentials {
    fn credential(&self, _: &str, _: ScramMechanism) -> Option<ScramCredential> {
        None
    }
}

enum MechanismServer {
    Plain(plain::PlainServer),
    Scram(scram::ScramServer),
    OAuthBearer(oauthbearer::OAuthBearerServer),
}

impl MechanismServer {
    fn evaluate(&mut self, token: &[u8], now_ms: i64) -> Result<SaslStep, SaslError> {
        match self {
            Self::Plain(s) => s.evaluate(token),
            Self::Scram(s) => s.evaluate(token),
            Self::OAuthBearer(s) => s.evaluate(token, now_ms),
        }
    }
}
