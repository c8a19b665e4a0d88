//! A listener's security settings from the broker config: the `ssl.*` keys of an `SSL`
//! listener, each overridden by `listener.name.<listener>.<key>` (the listener name in lower
//! case, as Kafka's `ListenerName.configPrefix`), turned into the network's
//! [`TlsSettings`]; and the start-up checks that refuse a listener that cannot work (an `SSL`
//! listener without a keystore, a keystore type gregor cannot read) with an error naming the
//! listener and the key. Nothing falls back to plaintext.

use std::collections::BTreeMap;
use std::path::PathBuf;

use gregor_network::client::{ClientMechanism, ClientSasl, ClientSecurity, ClientTlsSettings};
use gregor_network::sasl::jaas::{JaasConfig, PLAIN_LOGIN_MODULE, SCRAM_LOGIN_MODULE};
use gregor_network::tls::{
    parse_protocols, ClientAuth, KeyStore, SslPrincipalMapper, TlsSettings, TrustStore,
};

use std::sync::Arc;
use std::time::Duration;

use gregor_network::tls::{TlsServerState, TlsTransportLayer};
use gregor_network::transport::{PlaintextTransportLayer, TransportLayer};
use gregor_network::{EndPoint, NetworkError, SecurityProtocol};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::config_value::ConfigError;

/// The transport layer of every endpoint: plaintext, or TLS with its keystore and truststore
/// read now; plus the TLS listeners' states with their file check intervals (ms), for
/// [`start_reloads`].
///
/// # Errors
/// [`NetworkError::Tls`] naming the listener and the key (as set) whose file or value cannot
/// work.
#[allow(clippy::type_complexity)]
pub fn transport_layers(
    raw: &BTreeMap<String, String>,
    endpoints: Vec<EndPoint>,
) -> Result<
    (
        Vec<(EndPoint, Arc<dyn TransportLayer>)>,
        Vec<(Arc<TlsServerState>, u64)>,
    ),
    NetworkError,
> {
    let mut layers = Vec::new();
    let mut states = Vec::new();
    for e in endpoints {
        let layer: Arc<dyn TransportLayer> = match e.security_protocol {
            // SASL_PLAINTEXT: plain bytes, authenticated by the SASL authenticator that
            // `gregor_network::bind_with_layers` requires for it.
            SecurityProtocol::Plaintext | SecurityProtocol::SaslPlaintext => {
                Arc::new(PlaintextTransportLayer)
            }
            // SASL_SSL: the TLS transport here, the SASL authenticator on top of it (required
            // by `bind_with_layers`).
            protocol @ (SecurityProtocol::Ssl | SecurityProtocol::SaslSsl) => {
                let cfg = ListenerConfig::new(raw, &e.listener_name);
                let config_error = |c: ConfigError| NetworkError::Tls {
                    listener: e.listener_name.clone(),
                    key: c.name,
                    message: c.reason,
                };
                let settings = cfg.ssl_settings().map_err(config_error)?;
                let interval_ms = cfg.reload_check_interval_ms().map_err(config_error)?;
                let state = TlsServerState::new(&e.listener_name, settings).map_err(|t| {
                    NetworkError::Tls {
                        listener: e.listener_name.clone(),
                        key: cfg.shown(t.key),
                        message: t.message,
                    }
                })?;
                states.push((state.clone(), interval_ms));
                Arc::new(TlsTransportLayer::new(protocol, state))
            }
        };
        layers.push((e, layer));
    }
    Ok((layers, states))
}

/// Which of gregor's own clients connects: it names the SASL mechanism key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientRole {
    /// Replica fetchers, transaction markers and verification, to `inter.broker.listener.name`
    /// with `sasl.mechanism.inter.broker.protocol`.
    InterBroker,
    /// The controller channel and the raft transport, to the first of
    /// `controller.listener.names` with `sasl.mechanism.controller.protocol`.
    Controller,
}

impl ClientRole {
    /// The key of the SASL mechanism (Kafka's default for both: GSSAPI).
    pub fn mechanism_key(self) -> &'static str {
        match self {
            Self::InterBroker => "sasl.mechanism.inter.broker.protocol",
            Self::Controller => "sasl.mechanism.controller.protocol",
        }
    }
}

/// A listener's keystore (`None` when no keystore key is set), truststore, protocols and
/// cipher suites.
type Stores = (
    Option<KeyStore>,
    Option<TrustStore>,
    Vec<&'static rustls::SupportedProtocolVersion>,
    Vec<String>,
);

/// The TLS and SASL settings of gregor's client to `listener` (of `protocol`), from the
/// listener's keys as Kafka's brokers read them: `listener.name.<l>.ssl.*` over `ssl.*`, and
/// the `username`/`password` options of `listener.name.<l>.<mechanism>.sasl.jaas.config`. No
/// file is read.
///
/// # Errors
/// [`ConfigError`] naming the key: no truststore for a TLS listener, a mechanism gregor's
/// client does not speak (Kafka's default GSSAPI included), no JAAS config or no
/// username/password in it.
pub fn client_settings(
    raw: &BTreeMap<String, String>,
    listener: &str,
    protocol: SecurityProtocol,
    role: ClientRole,
) -> Result<(Option<ClientTlsSettings>, Option<ClientSasl>), ConfigError> {
    let tls = if protocol.uses_tls() {
        Some(ListenerConfig::new(raw, listener).client_tls_settings()?)
    } else {
        None
    };
    let sasl = if protocol.uses_sasl() {
        let key = role.mechanism_key();
        let name = raw.get(key).map_or("GSSAPI", |v| v.trim());
        let mechanism = ClientMechanism::from_name(name).ok_or_else(|| {
            ConfigError::new(
                key,
                name,
                format!("gregor's own client connects to the {protocol} listener {listener} with this mechanism, and speaks only PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (Kafka's default is GSSAPI): set it to one of them"),
            )
        })?;
        let jaas_key = format!(
            "listener.name.{}.{}.sasl.jaas.config",
            listener.to_ascii_lowercase(),
            mechanism.name().to_ascii_lowercase()
        );
        let Some(text) = raw.get(&jaas_key) else {
            return Err(ConfigError::new(
                &jaas_key,
                "",
                format!("gregor's own client authenticates to listener {listener} with {} ({key}) and takes its credentials from this JAAS config's username and password options, which is not set", mechanism.name()),
            ));
        };
        let jaas = JaasConfig::parse(text).map_err(|e| {
            ConfigError::new(&jaas_key, "[hidden]", format!("Invalid JAAS config: {e}"))
        })?;
        let module = match mechanism {
            ClientMechanism::Plain => PLAIN_LOGIN_MODULE,
            ClientMechanism::Scram(_) => SCRAM_LOGIN_MODULE,
        };
        if jaas.login_module != module {
            return Err(ConfigError::new(
                &jaas_key,
                "[hidden]",
                format!("expected {module}, found {}", jaas.login_module),
            ));
        }
        let (Some(username), Some(password)) =
            (jaas.options.get("username"), jaas.options.get("password"))
        else {
            return Err(ConfigError::new(
                &jaas_key,
                "[hidden]",
                format!("gregor's own client authenticates to listener {listener} with the username and password options of this JAAS config; set both"),
            ));
        };
        Some(ClientSasl {
            mechanism,
            username: username.clone(),
            password: password.clone(),
        })
    } else {
        None
    };
    Ok((tls, sasl))
}

/// The connector of gregor's client to `listener` ([`client_settings`]), with its truststore
/// and keystore read now.
///
/// # Errors
/// [`NetworkError::Tls`] naming the listener and the key whose settings or files cannot work.
pub fn client_security(
    raw: &BTreeMap<String, String>,
    listener: &str,
    protocol: SecurityProtocol,
    role: ClientRole,
) -> Result<ClientSecurity, NetworkError> {
    let config_error = |c: ConfigError| NetworkError::Tls {
        listener: listener.to_string(),
        key: c.name,
        message: c.reason,
    };
    let (tls, sasl) = client_settings(raw, listener, protocol, role).map_err(config_error)?;
    ClientSecurity::new(protocol, listener, tls.as_ref(), sasl).map_err(|e| match e {
        gregor_network::client::ClientSecurityError::Tls(t) => NetworkError::Tls {
            listener: listener.to_string(),
            key: ListenerConfig::new(raw, listener).shown(t.key),
            message: format!("gregor's own client: {}", t.message),
        },
        other => NetworkError::Tls {
            listener: listener.to_string(),
            key: role.mechanism_key().to_string(),
            message: other.to_string(),
        },
    })
}

/// Checks each TLS listener's keystore and truststore files every interval and rebuilds its
/// config when they changed; a rebuild that fails keeps the old certificates and logs why.
pub fn start_reloads(
    states: Vec<(Arc<TlsServerState>, u64)>,
    shutdown: &watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    states
        .into_iter()
        .filter(|(_, interval_ms)| *interval_ms > 0)
        .map(|(state, interval_ms)| {
            let mut shutdown = shutdown.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(interval_ms));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = shutdown.changed() => return,
                    }
                    // Reading and parsing PEM files is blocking file I/O.
                    let s = state.clone();
                    match tokio::task::spawn_blocking(move || s.reload_if_changed()).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => {
                            let settings = state.settings();
                            warn!(listener = %state.listener_name(), keystore = ?settings.keystore, truststore = ?settings.truststore, error = %e, "the TLS keystore or truststore files changed but cannot be used; the listener keeps its current certificates");
                        }
                        Err(e) => warn!(error = %e, "TLS reload task failed"),
                    }
                }
            })
        })
        .collect()
}

/// The `ssl.*` keys gregor reads for a listener, with Kafka's defaults (`ssl.keystore.type`
/// and `ssl.truststore.type` default to JKS, which gregor cannot read: PEM or PKCS12 must be
/// set).
pub const SSL_KEYS: &[(&str, &str)] = &[
    ("ssl.keystore.type", "JKS"),
    ("ssl.keystore.location", ""),
    ("ssl.keystore.password", ""),
    ("ssl.keystore.certificate.chain", ""),
    ("ssl.keystore.key", ""),
    ("ssl.key.password", ""),
    ("ssl.truststore.type", "JKS"),
    ("ssl.truststore.location", ""),
    ("ssl.truststore.password", ""),
    ("ssl.truststore.certificates", ""),
    ("ssl.client.auth", "none"),
    ("ssl.enabled.protocols", "TLSv1.2,TLSv1.3"),
    ("ssl.protocol", "TLSv1.3"),
    ("ssl.cipher.suites", ""),
    ("ssl.principal.mapping.rules", "DEFAULT"),
    // gregor's own client (inter-broker, controller): `https` checks that the server
    // certificate names the host connected to; empty turns the check off.
    ("ssl.endpoint.identification.algorithm", "https"),
    // gregor's own: how long a TLS handshake may take (ms).
    ("ssl.handshake.timeout.ms", "10000"),
    // gregor's own: how often the keystore and truststore files are checked for changes (ms).
    ("ssl.reload.check.interval.ms", "30000"),
    // Kafka's BrokerSecurityConfigs: whether a dynamic keystore change may change the
    // certificate's subject / drop subject alternative names.
    ("ssl.allow.dn.changes", "false"),
    ("ssl.allow.san.changes", "false"),
];

/// Whether gregor reads `name` (an `ssl.*` key of [`SSL_KEYS`], alone or under
/// `listener.name.<listener>.`).
pub fn acted_on(name: &str) -> bool {
    let key = name
        .strip_prefix("listener.name.")
        .and_then(|rest| rest.split_once('.'))
        .map_or(name, |(_, k)| k);
    SSL_KEYS.iter().any(|(k, _)| *k == key)
}

/// A listener's view of the config: `listener.name.<listener>.<key>` before `<key>`.
pub struct ListenerConfig<'a> {
    raw: &'a BTreeMap<String, String>,
    listener: String,
}

impl<'a> ListenerConfig<'a> {
    /// The view of `listener` (any case) over the raw broker config.
    pub fn new(raw: &'a BTreeMap<String, String>, listener: &str) -> Self {
        Self {
            raw,
            listener: listener.to_ascii_lowercase(),
        }
    }

    /// The key a value was read from and the value (trimmed), if set and not empty.
    pub fn get(&self, key: &str) -> Option<(String, String)> {
        let prefixed = format!("listener.name.{}.{key}", self.listener);
        [prefixed, key.to_string()].into_iter().find_map(|k| {
            self.raw
                .get(&k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .map(|v| (k, v))
        })
    }

    fn value_or_default(&self, key: &str) -> String {
        self.get(key).map_or_else(
            || {
                SSL_KEYS
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, d)| (*d).to_string())
                    .unwrap_or_default()
            },
            |(_, v)| v,
        )
    }

    /// The name to show for `key`: the prefixed name if that is what is set, else the
    /// broker-wide name.
    pub fn shown(&self, key: &str) -> String {
        self.get(key).map_or_else(|| key.to_string(), |(k, _)| k)
    }

    fn error(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        let value = if key.contains("password") || key.ends_with(".key") {
            "[hidden]".to_string()
        } else {
            self.get(key).map(|(_, v)| v).unwrap_or_default()
        };
        ConfigError::new(
            &self.shown(key),
            &value,
            format!(
                "listener {}: {}",
                self.listener.to_ascii_uppercase(),
                reason.into()
            ),
        )
    }

    /// The listener's TLS settings (Kafka's `DefaultSslEngineFactory` inputs).
    ///
    /// # Errors
    /// [`ConfigError`] naming the listener and the key: no keystore, a store type other than
    /// PEM or PKCS12 (JKS cannot be read), a PKCS12 store without its password, both a
    /// location and inline PEM,
    /// a bad `ssl.client.auth`, protocol, cipher suite or mapping rule. The files themselves
    /// are read when the listener starts ([`gregor_network::tls::TlsServerState::new`]).
    pub fn ssl_settings(&self) -> Result<TlsSettings, ConfigError> {
        let (keystore, truststore, protocols, cipher_suites) = self.stores_and_protocols()?;
        let Some(keystore) = keystore else {
            return Err(self.error(
                "ssl.keystore.location",
                "an SSL listener needs a certificate and its private key: set ssl.keystore.type=PEM and ssl.keystore.location (a PEM file with the key and the chain), or ssl.keystore.certificate.chain and ssl.keystore.key",
            ));
        };
        let client_auth_value = self.value_or_default("ssl.client.auth");
        let client_auth = ClientAuth::from_name(&client_auth_value).ok_or_else(|| {
            self.error(
                "ssl.client.auth",
                "String must be one of: required, requested, none",
            )
        })?;
        if client_auth != ClientAuth::None && truststore.is_none() {
            return Err(self.error(
                "ssl.truststore.location",
                format!("ssl.client.auth={client_auth_value} needs the CA certificates to check client certificates against: set ssl.truststore.type=PEM and ssl.truststore.location or ssl.truststore.certificates"),
            ));
        }
        let principal_mapper =
            SslPrincipalMapper::from_rules(&self.value_or_default("ssl.principal.mapping.rules"))
                .map_err(|e| self.error("ssl.principal.mapping.rules", e.0))?;
        let handshake_timeout_ms = self.positive_ms("ssl.handshake.timeout.ms")?;
        Ok(TlsSettings {
            keystore,
            key_password: self.get("ssl.key.password").map(|(_, v)| v),
            truststore,
            client_auth,
            protocols,
            cipher_suites,
            principal_mapper,
            handshake_timeout_ms,
        })
    }

    /// The client side of the listener's TLS (gregor's connections to it on other nodes): the
    /// truststore the server certificate is checked against (required), the keystore offered
    /// for mTLS (optional), `ssl.endpoint.identification.algorithm`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the listener and the key.
    pub fn client_tls_settings(&self) -> Result<ClientTlsSettings, ConfigError> {
        let (keystore, truststore, protocols, cipher_suites) = self.stores_and_protocols()?;
        let Some(truststore) = truststore else {
            return Err(self.error(
                "ssl.truststore.location",
                "gregor's own connections to this listener (inter-broker or controller) verify the server certificate against CA certificates, and gregor has no system trust store: set ssl.truststore.type=PEM and ssl.truststore.location or ssl.truststore.certificates",
            ));
        };
        let verify_hostname = match self
            .value_or_default("ssl.endpoint.identification.algorithm")
            .to_ascii_lowercase()
            .as_str()
        {
            "https" => true,
            "" => false,
            _ => {
                return Err(self.error(
                    "ssl.endpoint.identification.algorithm",
                    "gregor knows https (check the host name, the default) and the empty value (no check)",
                ))
            }
        };
        Ok(ClientTlsSettings {
            truststore,
            keystore,
            key_password: self.get("ssl.key.password").map(|(_, v)| v),
            protocols,
            cipher_suites,
            verify_hostname,
        })
    }

    /// The keystore (`None` when no keystore key is set), truststore, protocols and cipher
    /// suites.
    fn stores_and_protocols(&self) -> Result<Stores, ConfigError> {
        let keystore_type = self.value_or_default("ssl.keystore.type");
        let location = self.get("ssl.keystore.location");
        let chain = self.get("ssl.keystore.certificate.chain");
        let key = self.get("ssl.keystore.key");
        let any_set = location.is_some() || chain.is_some() || key.is_some();
        if any_set {
            check_store_type(self, "ssl.keystore.type", &keystore_type)?;
        }
        if keystore_type.eq_ignore_ascii_case("PKCS12") && any_set {
            return self.pkcs12_settings(location, chain.or(key));
        }
        self.pem_settings(location, chain, key)
    }

    /// [`Self::ssl_settings`] for `ssl.keystore.type=PKCS12`: a file and its password
    /// (Kafka's `DefaultSslEngineFactory`: "SSL key store is specified, but key store password
    /// is not specified").
    fn pkcs12_settings(
        &self,
        location: Option<(String, String)>,
        inline: Option<(String, String)>,
    ) -> Result<Stores, ConfigError> {
        if let Some((k, _)) = inline {
            return Err(self.error(
                &k,
                "a PKCS12 keystore is a file: set ssl.keystore.location, not inline PEM",
            ));
        }
        let Some((_, path)) = location else {
            return Err(self.error(
                "ssl.keystore.location",
                "PKCS12 needs ssl.keystore.location",
            ));
        };
        let Some((_, password)) = self.get("ssl.keystore.password") else {
            return Err(self.error(
                "ssl.keystore.password",
                "SSL key store is specified, but key store password is not specified.",
            ));
        };
        self.finish_settings(Some(KeyStore::Pkcs12 {
            location: PathBuf::from(path),
            password,
        }))
    }

    fn pem_settings(
        &self,
        location: Option<(String, String)>,
        chain: Option<(String, String)>,
        key: Option<(String, String)>,
    ) -> Result<Stores, ConfigError> {
        if self.get("ssl.keystore.password").is_some() {
            // Kafka: "SSL key store password cannot be specified with PEM format, only key
            // password may be specified".
            return Err(self.error(
                "ssl.keystore.password",
                "a PEM keystore has no store password; an encrypted private key takes ssl.key.password",
            ));
        }
        let keystore = match (location, chain, key) {
            (None, None, None) => None,
            (Some((_, path)), None, None) => Some(KeyStore::File(PathBuf::from(path))),
            (None, Some((_, chain)), Some((_, key))) => Some(KeyStore::Inline {
                certificate_chain: chain,
                key,
            }),
            (Some(_), _, _) => {
                return Err(self.error(
                    "ssl.keystore.location",
                    "set either ssl.keystore.location or ssl.keystore.certificate.chain with ssl.keystore.key, not both",
                ))
            }
            (None, None, Some(_)) => {
                return Err(self.error(
                    "ssl.keystore.certificate.chain",
                    "ssl.keystore.key is set without ssl.keystore.certificate.chain",
                ))
            }
            (None, Some(_), None) => {
                return Err(self.error(
                    "ssl.keystore.key",
                    "ssl.keystore.certificate.chain is set without ssl.keystore.key",
                ))
            }
        };
        self.finish_settings(keystore)
    }

    /// The settings besides the keystore.
    fn finish_settings(&self, keystore: Option<KeyStore>) -> Result<Stores, ConfigError> {
        let truststore = match (
            self.get("ssl.truststore.location"),
            self.get("ssl.truststore.certificates"),
        ) {
            (None, None) => None,
            (location, inline) => {
                let truststore_type = self.value_or_default("ssl.truststore.type");
                check_store_type(self, "ssl.truststore.type", &truststore_type)?;
                if truststore_type.eq_ignore_ascii_case("PKCS12") {
                    let Some((_, path)) = location else {
                        return Err(self.error(
                            "ssl.truststore.certificates",
                            "a PKCS12 truststore is a file: set ssl.truststore.location",
                        ));
                    };
                    if inline.is_some() {
                        return Err(self.error(
                            "ssl.truststore.certificates",
                            "set either ssl.truststore.location or ssl.truststore.certificates, not both",
                        ));
                    }
                    Some(TrustStore::Pkcs12 {
                        location: PathBuf::from(path),
                        password: self
                            .get("ssl.truststore.password")
                            .map(|(_, p)| p)
                            .unwrap_or_default(),
                    })
                } else {
                    if self.get("ssl.truststore.password").is_some() {
                        return Err(self.error(
                            "ssl.truststore.password",
                            "a PEM truststore has no password; remove it",
                        ));
                    }
                    match (location, inline) {
                    (Some((_, p)), None) => Some(TrustStore::File(PathBuf::from(p))),
                    (None, Some((_, pem))) => Some(TrustStore::Inline(pem)),
                    _ => {
                        return Err(self.error(
                            "ssl.truststore.location",
                            "set either ssl.truststore.location or ssl.truststore.certificates, not both",
                        ))
                    }
                }
                }
            }
        };
        let protocols = parse_protocols(
            &self.value_or_default("ssl.enabled.protocols"),
            &self.value_or_default("ssl.protocol"),
        )
        .map_err(|e| self.error(e.key, e.message))?;
        let cipher_suites: Vec<String> = self
            .value_or_default("ssl.cipher.suites")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        gregor_network::tls::crypto_provider(&cipher_suites)
            .map_err(|e| self.error(e.key, e.message))?;
        Ok((keystore, truststore, protocols, cipher_suites))
    }

    /// `ssl.reload.check.interval.ms` (gregor's own, default 30000): how often the listener's
    /// keystore and truststore files are checked for changes; 0 turns the check off.
    ///
    /// # Errors
    /// [`ConfigError`] for a value that is not a non-negative number.
    pub fn reload_check_interval_ms(&self) -> Result<u64, ConfigError> {
        let v = self.value_or_default("ssl.reload.check.interval.ms");
        v.parse::<u64>().map_err(|_| {
            self.error(
                "ssl.reload.check.interval.ms",
                "Not a number of type LONG (>= 0)",
            )
        })
    }

    fn positive_ms(&self, key: &str) -> Result<u64, ConfigError> {
        let v = self.value_or_default(key);
        match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(self.error(key, "Not a number of type LONG (> 0)")),
        }
    }
}

fn check_store_type(
    cfg: &ListenerConfig<'_>,
    key: &str,
    store_type: &str,
) -> Result<(), ConfigError> {
    match store_type.to_ascii_uppercase().as_str() {
        "PEM" => Ok(()),
        "PKCS12" => Ok(()),
        other => Err(cfg.error(
            key,
            format!("{other} stores cannot be read by gregor; use PKCS12 (keytool -importkeystore -deststoretype PKCS12 converts a JKS store) or PEM (Kafka's default type JKS must be changed explicitly)"),
        )),
    }
}

/// Applies dynamic broker configs (`kafka-configs --alter --entity-type brokers --entity-name
/// <id> --add-config listener.name.<l>.ssl.keystore.location=...`, KIP-226) to the TLS
/// listeners: each image's `listener.name.<l>.ssl.*` keys of this broker (then the cluster
/// default) over the static config; when a listener's resulting keys changed, its TLS config
/// is rebuilt. New connections get the new certificates. AlterConfigs checks a change first
/// ([`TlsConfigPublisher::validate_change`]); one that still does not make a config here is
/// logged and the old certificates stay.
pub struct TlsConfigPublisher {
    node_id: i32,
    raw: BTreeMap<String, String>,
    listeners: Vec<(String, Arc<TlsServerState>)>,
    applied: parking_lot::Mutex<BTreeMap<String, BTreeMap<String, String>>>,
}

impl TlsConfigPublisher {
    /// A publisher for the TLS listeners `states` of broker `node_id` with static config `raw`.
    pub fn new(
        node_id: i32,
        raw: BTreeMap<String, String>,
        states: &[(Arc<TlsServerState>, u64)],
    ) -> Self {
        Self {
            node_id,
            raw,
            listeners: states
                .iter()
                .map(|(s, _)| (s.listener_name().to_string(), s.clone()))
                .collect(),
            applied: parking_lot::Mutex::new(BTreeMap::new()),
        }
    }

    /// The `ssl.*` keys of `listener` after the dynamic configs `dynamic`, as the listener sees
    /// them (static config with dynamic prefixed keys over it).
    fn effective(
        &self,
        listener: &str,
        dynamic: &crate::config::DynamicBrokerConfigs,
    ) -> BTreeMap<String, String> {
        let prefix = format!("listener.name.{}.", listener.to_ascii_lowercase());
        let mut merged = self.raw.clone();
        for source in [&dynamic.cluster_default, &dynamic.per_broker] {
            for (k, v) in source {
                if k.strip_prefix(&prefix).is_some_and(acted_on) {
                    merged.insert(k.clone(), v.clone());
                }
            }
        }
        merged.into_iter().filter(|(k, _)| acted_on(k)).collect()
    }
}

impl TlsConfigPublisher {
    /// Checks a dynamic config change before it is stored (Kafka's
    /// `DynamicBrokerConfig.validate` through `SslFactory.validateReconfiguration`): for each TLS
    /// listener whose `ssl.*` keys would change under `next`, the new keys must make a TLS
    /// config, and a new keystore must keep the certificate's subject and subject alternative
    /// names unless `ssl.allow.dn.changes` / `ssl.allow.san.changes` (in the new keys) allow it.
    ///
    /// # Errors
    /// Kafka's message, for INVALID_REQUEST.
    pub fn validate_change(
        &self,
        current: &crate::config::DynamicBrokerConfigs,
        next: &crate::config::DynamicBrokerConfigs,
    ) -> Result<(), String> {
        for (listener, state) in &self.listeners {
            let before = self.effective(listener, current);
            let after = self.effective(listener, next);
            if before == after {
                continue;
            }
            let cfg = ListenerConfig::new(&after, listener);
            let settings = cfg.ssl_settings().map_err(|e| {
                format!("Validation of dynamic config update of SSLFactory failed: {e}")
            })?;
            let allowed = |k: &str| {
                cfg.get(k)
                    .is_some_and(|(_, v)| v.eq_ignore_ascii_case("true"))
            };
            state.validate_change(
                &settings,
                allowed("ssl.allow.dn.changes"),
                allowed("ssl.allow.san.changes"),
            )?;
        }
        Ok(())
    }
}

impl gregor_metadata::MetadataPublisher for TlsConfigPublisher {
    fn name(&self) -> &str {
        "tls-listeners"
    }

    fn on_metadata_update(
        &self,
        _delta: &gregor_metadata::MetadataDelta<'_>,
        image: &Arc<gregor_metadata::MetadataImage>,
    ) -> Result<(), String> {
        let dynamic = crate::config::DynamicBrokerConfigs::from_image(image, self.node_id);
        let mut applied = self.applied.lock();
        for (listener, state) in &self.listeners {
            let effective = self.effective(listener, &dynamic);
            let before = applied
                .entry(listener.clone())
                .or_insert_with(|| self.effective(listener, &Default::default()));
            if *before == effective {
                continue;
            }
            *before = effective.clone();
            let result = ListenerConfig::new(&effective, listener)
                .ssl_settings()
                .map_err(|e| e.to_string())
                .and_then(|s| state.reconfigure(s).map_err(|e| e.to_string()));
            if let Err(e) = result {
                warn!(listener = %listener, error = %e, "a dynamic TLS config change cannot be used; the listener keeps its current certificates");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn listener_prefix_overrides_the_broker_wide_key() {
        let r = raw(&[
            ("ssl.keystore.type", "PEM"),
            ("ssl.keystore.location", "/broker-wide.pem"),
            (
                "listener.name.external.ssl.keystore.location",
                "/external.pem",
            ),
        ]);
        let s = ListenerConfig::new(&r, "EXTERNAL").ssl_settings().unwrap();
        assert_eq!(s.keystore, KeyStore::File("/external.pem".into()));
        let s = ListenerConfig::new(&r, "INTERNAL").ssl_settings().unwrap();
        assert_eq!(s.keystore, KeyStore::File("/broker-wide.pem".into()));
        assert_eq!(s.client_auth, ClientAuth::None);
        assert_eq!(s.protocols.len(), 2);
    }

    #[test]
    fn refusals_name_the_listener_and_the_key() {
        let e = ListenerConfig::new(&raw(&[]), "SSL")
            .ssl_settings()
            .unwrap_err();
        assert_eq!(e.name, "ssl.keystore.location");
        assert!(e.reason.starts_with("listener SSL:"), "{e}");
        let e = ListenerConfig::new(
            &raw(&[("listener.name.ext.ssl.keystore.location", "/k.pem")]),
            "EXT",
        )
        .ssl_settings()
        .unwrap_err();
        assert_eq!(e.name, "ssl.keystore.type");
        assert!(e.reason.contains("JKS"), "{e}");
        let e = ListenerConfig::new(
            &raw(&[
                ("ssl.keystore.type", "PEM"),
                ("ssl.keystore.location", "/k.pem"),
                ("listener.name.ext.ssl.client.auth", "required"),
            ]),
            "EXT",
        )
        .ssl_settings()
        .unwrap_err();
        assert_eq!(e.name, "ssl.truststore.location");
        let e = ListenerConfig::new(
            &raw(&[
                ("ssl.keystore.type", "PEM"),
                ("ssl.keystore.location", "/k.pem"),
                ("ssl.cipher.suites", "TLS_RSA_WITH_NULL_SHA"),
            ]),
            "SSL",
        )
        .ssl_settings()
        .unwrap_err();
        assert_eq!(e.name, "ssl.cipher.suites");
        let e = ListenerConfig::new(
            &raw(&[
                ("ssl.keystore.type", "PEM"),
                ("ssl.keystore.location", "/k.pem"),
                ("ssl.enabled.protocols", "TLSv1.1"),
            ]),
            "SSL",
        )
        .ssl_settings()
        .unwrap_err();
        assert_eq!(e.name, "ssl.enabled.protocols");
        let e = ListenerConfig::new(
            &raw(&[
                ("ssl.keystore.type", "PKCS12"),
                ("ssl.keystore.location", "/k.p12"),
            ]),
            "SSL",
        )
        .ssl_settings()
        .unwrap_err();
        assert_eq!(e.name, "ssl.keystore.password");
        let s = ListenerConfig::new(
            &raw(&[
                ("ssl.keystore.type", "PKCS12"),
                ("ssl.keystore.location", "/k.p12"),
                ("ssl.keystore.password", "pw"),
                ("ssl.truststore.type", "PKCS12"),
                ("ssl.truststore.location", "/t.p12"),
            ]),
            "SSL",
        )
        .ssl_settings()
        .unwrap();
        assert!(matches!(s.keystore, KeyStore::Pkcs12 { ref password, .. } if password == "pw"));
        assert!(matches!(s.truststore, Some(TrustStore::Pkcs12 { .. })));
        // JKS (Kafka's default type) is refused naming the key.
        let e = ListenerConfig::new(
            &raw(&[
                ("ssl.keystore.location", "/k.jks"),
                ("ssl.keystore.password", "pw"),
            ]),
            "SSL",
        )
        .ssl_settings()
        .unwrap_err();
        assert_eq!(e.name, "ssl.keystore.type");
        assert!(e.reason.contains("JKS stores cannot be read"), "{e}");
    }

    #[test]
    fn ssl_protocol_caps_the_enabled_protocols() {
        let s = ListenerConfig::new(
            &raw(&[
                ("ssl.keystore.type", "PEM"),
                ("ssl.keystore.location", "/k.pem"),
                ("ssl.protocol", "TLSv1.2"),
            ]),
            "SSL",
        )
        .ssl_settings()
        .unwrap();
        assert_eq!(s.protocols.len(), 1);
        assert_eq!(s.protocols[0].version, rustls::ProtocolVersion::TLSv1_2);
    }

    #[test]
    fn prefixed_keys_are_acted_on() {
        assert!(acted_on("ssl.keystore.location"));
        assert!(acted_on("listener.name.external.ssl.client.auth"));
        assert!(!acted_on("ssl.keymanager.algorithm"));
        assert!(!acted_on("listener.name.x.sasl.enabled.mechanisms"));
    }
}
