//! The SASL settings of a broker's listeners, with Kafka's names (`BrokerSecurityConfigs`,
//! `SaslConfigs`): `sasl.enabled.mechanisms` (default `GSSAPI`, which gregor does not
//! implement: a SASL listener must name its mechanisms), its per-listener form
//! `listener.name.<listener>.sasl.enabled.mechanisms`, the JAAS config of each mechanism
//! `listener.name.<listener>.<mechanism>.sasl.jaas.config` (PlainLoginModule's
//! `user_<name>="<password>"` for PLAIN; OAuthBearerLoginModule's `unsecuredValidator*`
//! options for OAUTHBEARER), `connections.max.reauth.ms` (KIP-368) and
//! `sasl.server.max.receive.size`. SCRAM credentials come from the metadata image
//! (UserScramCredentialRecords), not from the config.
//!
//! OAUTHBEARER with signed JWTs (KIP-768): `listener.name.<l>.oauthbearer.sasl.server.callback.handler.class`
//! naming Kafka's `OAuthBearerValidatorCallbackHandler`, or `sasl.oauthbearer.jwks.endpoint.url`
//! set, makes the listener verify tokens against that JWKS ([`OAUTHBEARER_KEYS`], each also
//! under `listener.name.<l>.` and `listener.name.<l>.oauthbearer.`, as Kafka's
//! `ConfigurationUtils` looks them up).
//!
//! Every other `sasl.*` key (Kerberos, other callback handler classes, the client-side
//! OAUTHBEARER keys, ...) still stops start-up (`config::unimplemented_security_keys`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gregor_network::sasl::jaas::{JaasConfig, OAUTHBEARER_LOGIN_MODULE, PLAIN_LOGIN_MODULE};
use gregor_network::sasl::jwks::{
    JwksLocation, JwksRefresh, SignedJwtConfig, SignedJwtValidator, VerificationKeys,
};
use gregor_network::sasl::{
    Mechanism, OAuthBearerConfig, SaslServerConfig, ScramCredential, ScramCredentialStore,
    ScramMechanism,
};
use gregor_network::SecurityProtocol;

use crate::config_value::{ConfigError, Listener};

/// Keys read here (besides the listener-prefixed ones, [`acted_on`]).
const KEYS: &[&str] = &[
    "sasl.enabled.mechanisms",
    // gregor's own clients (crate::listener_security::client_settings).
    "sasl.mechanism.inter.broker.protocol",
    "sasl.mechanism.controller.protocol",
    "sasl.server.max.receive.size",
    "connections.max.reauth.ms",
];

/// The broker keys of Kafka's OAUTHBEARER validator (`SaslConfigs`) that gregor reads.
pub const OAUTHBEARER_KEYS: &[&str] = &[
    "sasl.oauthbearer.jwks.endpoint.url",
    "sasl.oauthbearer.jwks.endpoint.refresh.ms",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms",
    "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms",
    "sasl.oauthbearer.clock.skew.seconds",
    "sasl.oauthbearer.expected.audience",
    "sasl.oauthbearer.expected.issuer",
    "sasl.oauthbearer.sub.claim.name",
    "sasl.oauthbearer.scope.claim.name",
];

/// Kafka's signed-token validator (`sasl.server.callback.handler.class`); the second name is
/// its pre-3.4 package.
pub const OAUTHBEARER_VALIDATOR_CLASSES: &[&str] = &[
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerValidatorCallbackHandler",
];

/// Kafka's default OAUTHBEARER server callback handler (unsecured JWTs).
pub const OAUTHBEARER_UNSECURED_VALIDATOR_CLASS: &str =
    "org.apache.kafka.common.security.oauthbearer.internals.unsecured.OAuthBearerUnsecuredValidatorCallbackHandler";

/// Whether `name` is a SASL key gregor reads: [`KEYS`],
/// `listener.name.<l>.sasl.enabled.mechanisms`, `listener.name.<l>.<mechanism>.sasl.jaas.config`
/// for a mechanism gregor implements, and `listener.name.<l>.connections.max.reauth.ms`.
pub fn acted_on(name: &str) -> bool {
    if KEYS.contains(&name) || OAUTHBEARER_KEYS.contains(&name) {
        return true;
    }
    let Some(rest) = name.strip_prefix("listener.name.") else {
        return false;
    };
    let Some((_, key)) = rest.split_once('.') else {
        return false;
    };
    if key == "sasl.enabled.mechanisms"
        || key == "connections.max.reauth.ms"
        || key == "oauthbearer.sasl.server.callback.handler.class"
        || OAUTHBEARER_KEYS.contains(&key)
        || key
            .strip_prefix("oauthbearer.")
            .is_some_and(|k| OAUTHBEARER_KEYS.contains(&k))
    {
        return true;
    }
    let mechanism = |m: &str| Mechanism::from_name(&m.to_ascii_uppercase()).is_some();
    key.strip_suffix(".sasl.jaas.config").is_some_and(mechanism)
        || key
            .strip_suffix(".connections.max.reauth.ms")
            .is_some_and(mechanism)
}

/// One SASL listener's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerSasl {
    /// The enabled mechanisms, in the configured order.
    pub mechanisms: Vec<Mechanism>,
    /// PLAIN's users (name to password).
    pub plain_users: BTreeMap<String, String>,
    /// OAUTHBEARER's unsecured validator options.
    pub oauthbearer: OAuthBearerConfig,
    /// Set: OAUTHBEARER tokens must be JWTs signed with a key of this JWKS (KIP-768).
    pub oauthbearer_jwks: Option<JwksSettings>,
    /// `connections.max.reauth.ms` (or its listener-prefixed form).
    pub connections_max_reauth_ms: i64,
    /// `listener.name.<l>.<mechanism>.connections.max.reauth.ms`, where set.
    pub connections_max_reauth_ms_by_mechanism: Vec<(Mechanism, i64)>,
}

/// A listener's signed-JWT validator settings (KIP-768).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwksSettings {
    /// `sasl.oauthbearer.jwks.endpoint.url`.
    pub location: JwksLocation,
    /// The refresh keys.
    pub refresh: JwksRefresh,
    /// The claim checks.
    pub claims: SignedJwtConfig,
}

/// Why a listener's JWKS could not be read at start-up.
#[derive(Debug, thiserror::Error)]
#[error("listener {listener}: sasl.oauthbearer.jwks.endpoint.url: {source}")]
pub struct JwksStartError {
    /// The listener.
    pub listener: String,
    /// The cause.
    pub source: gregor_network::sasl::jwks::JwksError,
}

/// The SASL settings of every SASL listener.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaslSettings {
    /// By listener name (upper case).
    pub listeners: BTreeMap<String, ListenerSasl>,
    /// `sasl.server.max.receive.size` (default 524288).
    pub max_receive_size: usize,
}

fn get<'a>(props: &'a BTreeMap<String, String>, listener: &str, key: &str) -> Option<&'a str> {
    props
        .get(&format!(
            "listener.name.{}.{key}",
            listener.to_ascii_lowercase()
        ))
        .or_else(|| props.get(key))
        .map(|s| s.trim())
}

impl SaslSettings {
    /// Reads the settings of the SASL listeners among `listeners`.
    ///
    /// # Errors
    /// A SASL listener without a mechanism gregor implements (Kafka's default is GSSAPI), an
    /// unknown mechanism, PLAIN without a PlainLoginModule JAAS config, a malformed JAAS config
    /// or number.
    pub fn from_properties(
        props: &BTreeMap<String, String>,
        listeners: &[Listener],
    ) -> Result<Self, ConfigError> {
        let max_receive_size = match props.get("sasl.server.max.receive.size") {
            Some(v) => v
                .trim()
                .parse::<i32>()
                .ok()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    ConfigError::new(
                        "sasl.server.max.receive.size",
                        v,
                        "Not a positive number of type INT",
                    )
                })?,
            None => SaslServerConfig::DEFAULT_MAX_RECEIVE_SIZE,
        };
        let mut out = BTreeMap::new();
        for l in listeners {
            if !matches!(
                l.security_protocol,
                SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
            ) || out.contains_key(&l.name)
            {
                continue;
            }
            out.insert(l.name.clone(), Self::listener(props, &l.name)?);
        }
        Ok(Self {
            listeners: out,
            max_receive_size,
        })
    }

    fn listener(props: &BTreeMap<String, String>, name: &str) -> Result<ListenerSasl, ConfigError> {
        let lower = name.to_ascii_lowercase();
        let mech_key = format!("listener.name.{lower}.sasl.enabled.mechanisms");
        let shown_key = if props.contains_key(&mech_key) {
            mech_key
        } else {
            "sasl.enabled.mechanisms".to_string()
        };
        let list = get(props, name, "sasl.enabled.mechanisms").unwrap_or("GSSAPI");
        let mut mechanisms = Vec::new();
        for m in list.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            let mechanism = Mechanism::from_name(m).ok_or_else(|| {
                ConfigError::new(
                    &shown_key,
                    list,
                    format!("listener {name}: SASL mechanism {m} is not implemented by gregor (it implements PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER); the listener would not authenticate"),
                )
            })?;
            if !mechanisms.contains(&mechanism) {
                mechanisms.push(mechanism);
            }
        }
        if mechanisms.is_empty() {
            return Err(ConfigError::new(
                &shown_key,
                list,
                format!("listener {name} uses SASL but enables no SASL mechanism"),
            ));
        }
        let jaas = |m: Mechanism| -> Result<Option<JaasConfig>, ConfigError> {
            let key = format!(
                "listener.name.{lower}.{}.sasl.jaas.config",
                m.name().to_ascii_lowercase()
            );
            props
                .get(&key)
                .map(|v| {
                    JaasConfig::parse(v).map_err(|e| {
                        ConfigError::new(&key, "[hidden]", format!("Invalid JAAS config: {e}"))
                    })
                })
                .transpose()
        };
        let mut plain_users = BTreeMap::new();
        if mechanisms.contains(&Mechanism::Plain) {
            let key = format!("listener.name.{lower}.plain.sasl.jaas.config");
            let Some(c) = jaas(Mechanism::Plain)? else {
                return Err(ConfigError::new(
                    &key,
                    "",
                    format!("listener {name} enables PLAIN but has no JAAS config with its users ({PLAIN_LOGIN_MODULE} required user_<name>=\"<password>\";)"),
                ));
            };
            if c.login_module != PLAIN_LOGIN_MODULE {
                return Err(ConfigError::new(
                    &key,
                    "[hidden]",
                    format!("expected {PLAIN_LOGIN_MODULE}, found {}", c.login_module),
                ));
            }
            plain_users = c.plain_users();
        }
        let mut oauthbearer = OAuthBearerConfig::default();
        if mechanisms.contains(&Mechanism::OAuthBearer) {
            let key = format!("listener.name.{lower}.oauthbearer.sasl.jaas.config");
            // Kafka's `JaasContext.loadServerContext` refuses a mechanism without a JAAS entry;
            // without one here OAUTHBEARER would fall to the unsecured validator by accident,
            // letting any client name itself any principal.
            let Some(c) = jaas(Mechanism::OAuthBearer)? else {
                return Err(ConfigError::new(
                    &key,
                    "",
                    format!("listener {name} enables OAUTHBEARER but has no JAAS config for it (Kafka: Could not find a 'KafkaServer' or '{lower}.KafkaServer' entry in the JAAS configuration); set it to {OAUTHBEARER_LOGIN_MODULE} required; and set sasl.oauthbearer.jwks.endpoint.url to verify signed tokens: without it the listener accepts unsecured tokens, in which a client names its own principal"),
                ));
            };
            {
                if c.login_module != OAUTHBEARER_LOGIN_MODULE {
                    return Err(ConfigError::new(
                        &key,
                        "[hidden]",
                        format!(
                            "expected {OAUTHBEARER_LOGIN_MODULE}, found {}",
                            c.login_module
                        ),
                    ));
                }
                let o = &c.options;
                if let Some(v) = o.get("unsecuredValidatorPrincipalClaimName") {
                    oauthbearer.principal_claim_name = v.trim().to_string();
                }
                if let Some(v) = o.get("unsecuredValidatorScopeClaimName") {
                    oauthbearer.scope_claim_name = v.trim().to_string();
                }
                if let Some(v) = o.get("unsecuredValidatorRequiredScope") {
                    oauthbearer.required_scope = v
                        .split([' ', ','])
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect();
                }
                if let Some(v) = o.get("unsecuredValidatorAllowableClockSkewMs") {
                    oauthbearer.allowable_clock_skew_ms = v
                        .trim()
                        .parse::<i64>()
                        .ok()
                        .filter(|n| *n >= 0)
                        .ok_or_else(|| {
                            ConfigError::new(
                                &key,
                                "[hidden]",
                                format!("Allowable clock skew must not be negative: {v}"),
                            )
                        })?;
                }
                if oauthbearer.principal_claim_name.is_empty()
                    || oauthbearer.scope_claim_name.is_empty()
                {
                    return Err(ConfigError::new(
                        &key,
                        "[hidden]",
                        "Must specify a non-blank principal and scope claim name",
                    ));
                }
            }
        }
        let oauthbearer_jwks = if mechanisms.contains(&Mechanism::OAuthBearer) {
            let options = jaas(Mechanism::OAuthBearer)?.map(|c| c.options);
            jwks_settings(props, name, options.as_ref())?
        } else {
            None
        };
        let reauth = get(props, name, "connections.max.reauth.ms").unwrap_or("0");
        let connections_max_reauth_ms = reauth.parse::<i64>().map_err(|_| {
            ConfigError::new(
                "connections.max.reauth.ms",
                reauth,
                "Not a number of type LONG",
            )
        })?;
        let mut connections_max_reauth_ms_by_mechanism = Vec::new();
        for m in &mechanisms {
            let key = format!(
                "listener.name.{lower}.{}.connections.max.reauth.ms",
                m.name().to_ascii_lowercase()
            );
            if let Some(v) = props.get(&key) {
                let ms = v
                    .trim()
                    .parse::<i64>()
                    .map_err(|_| ConfigError::new(&key, v, "Not a number of type LONG"))?;
                connections_max_reauth_ms_by_mechanism.push((*m, ms));
            }
        }
        Ok(ListenerSasl {
            connections_max_reauth_ms_by_mechanism,
            mechanisms,
            plain_users,
            oauthbearer,
            oauthbearer_jwks,
            connections_max_reauth_ms,
        })
    }

    /// Checks the SASL listeners gregor's own clients use: the inter-broker listener must
    /// enable `sasl.mechanism.inter.broker.protocol` (Kafka: "must be included in
    /// sasl.enabled.mechanisms when SASL is used for inter-broker communication"). A SASL
    /// controller listener is served like any other (its SCRAM credentials from the metadata
    /// image once this node has loaded it, as Kafka's `ControllerServer` with its
    /// `ScramPublisher`); Kafka checks nothing more about it, and neither does this.
    ///
    /// # Errors
    /// The key at fault.
    pub fn check_roles(&self, config: &crate::config::BrokerConfig) -> Result<(), ConfigError> {
        if let Some(l) = config.inter_broker_listener_name() {
            if let Some(listener) = self.listeners.get(&l) {
                let key = "sasl.mechanism.inter.broker.protocol";
                let name = config.raw.get(key).map_or("GSSAPI", |v| v.trim());
                if !listener.mechanisms.iter().any(|m| m.name() == name) {
                    return Err(ConfigError::new(
                        key,
                        name,
                        format!("sasl.mechanism.inter.broker.protocol must be included in sasl.enabled.mechanisms of the inter-broker listener {l} when SASL is used for inter-broker communication"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Reads the JWKS of every listener with signed OAUTHBEARER tokens and starts the tasks
    /// that keep them current until `shutdown`.
    ///
    /// # Errors
    /// A JWKS that cannot be read (Kafka's broker does not start either).
    pub async fn start_jwks_validators(
        &self,
        shutdown: &tokio::sync::watch::Receiver<bool>,
    ) -> Result<
        (
            HashMap<String, Arc<SignedJwtValidator>>,
            Vec<tokio::task::JoinHandle<()>>,
        ),
        JwksStartError,
    > {
        let mut validators = HashMap::new();
        let mut tasks = Vec::new();
        for (name, l) in &self.listeners {
            let Some(j) = &l.oauthbearer_jwks else {
                continue;
            };
            let keys = VerificationKeys::load(j.location.clone(), j.refresh)
                .await
                .map_err(|source| JwksStartError {
                    listener: name.clone(),
                    source,
                })?;
            tracing::info!(listener = %name, location = %keys.location(), keys = keys.keys().len(), "OAUTHBEARER tokens are verified with this JWKS");
            tasks.push(tokio::spawn(keys.clone().run(shutdown.clone())));
            validators.insert(
                name.clone(),
                Arc::new(SignedJwtValidator {
                    config: j.claims.clone(),
                    keys,
                }),
            );
        }
        Ok((validators, tasks))
    }

    /// The network's SASL configs by listener, with SCRAM credentials from `store`.
    pub fn server_configs(
        &self,
        store: &Arc<dyn ScramCredentialStore>,
    ) -> HashMap<String, Arc<SaslServerConfig>> {
        self.server_configs_with(store, &HashMap::new())
    }

    /// [`Self::server_configs`] with the signed-JWT validators of
    /// [`Self::start_jwks_validators`].
    pub fn server_configs_with(
        &self,
        store: &Arc<dyn ScramCredentialStore>,
        validators: &HashMap<String, Arc<SignedJwtValidator>>,
    ) -> HashMap<String, Arc<SaslServerConfig>> {
        self.listeners
            .iter()
            .map(|(name, l)| {
                let mut c = SaslServerConfig::new(l.mechanisms.clone());
                c.plain_users = l.plain_users.clone();
                c.scram_credentials = Some(store.clone());
                c.oauthbearer = l.oauthbearer.clone();
                c.oauthbearer_signed = validators.get(name).cloned();
                c.connections_max_reauth_ms = l.connections_max_reauth_ms;
                c.connections_max_reauth_ms_by_mechanism =
                    l.connections_max_reauth_ms_by_mechanism.clone();
                c.max_receive_size = self.max_receive_size;
                (name.clone(), Arc::new(c))
            })
            .collect()
    }
}

/// A listener's OAUTHBEARER key: `listener.name.<l>.oauthbearer.<key>`, then
/// `listener.name.<l>.<key>`, then `<key>`; the key found and its trimmed value.
fn oauthbearer_get(
    props: &BTreeMap<String, String>,
    listener: &str,
    key: &str,
) -> Option<(String, String)> {
    let lower = listener.to_ascii_lowercase();
    [
        format!("listener.name.{lower}.oauthbearer.{key}"),
        format!("listener.name.{lower}.{key}"),
        key.to_string(),
    ]
    .into_iter()
    .find_map(|k| props.get(&k).map(|v| (k, v.trim().to_string())))
}

/// The signed-JWT settings of `listener`, if its OAUTHBEARER validator is Kafka's
/// `OAuthBearerValidatorCallbackHandler` or a JWKS URL is set.
fn jwks_settings(
    props: &BTreeMap<String, String>,
    listener: &str,
    jaas_options: Option<&BTreeMap<String, String>>,
) -> Result<Option<JwksSettings>, ConfigError> {
    let lower = listener.to_ascii_lowercase();
    let class_key = format!("listener.name.{lower}.oauthbearer.sasl.server.callback.handler.class");
    let class = props.get(&class_key).map(|v| v.trim());
    let url = oauthbearer_get(props, listener, "sasl.oauthbearer.jwks.endpoint.url")
        .filter(|(_, v)| !v.is_empty());
    match (class, &url) {
        (None | Some(""), None) => return Ok(None),
        (Some(c), None) if c == OAUTHBEARER_UNSECURED_VALIDATOR_CLASS => return Ok(None),
        (Some(c), Some((k, _))) if c == OAUTHBEARER_UNSECURED_VALIDATOR_CLASS => {
            return Err(ConfigError::new(
                k,
                "",
                format!("listener {listener}: a JWKS is set but {class_key} names the unsecured validator, which would ignore it"),
            ))
        }
        (Some(c), _) if !c.is_empty() && !OAUTHBEARER_VALIDATOR_CLASSES.contains(&c) => {
            return Err(ConfigError::new(
                &class_key,
                c,
                format!("gregor loads no Java classes; it implements {} and {OAUTHBEARER_UNSECURED_VALIDATOR_CLASS}", OAUTHBEARER_VALIDATOR_CLASSES[0]),
            ))
        }
        (_, None) => {
            return Err(ConfigError::new(
                "sasl.oauthbearer.jwks.endpoint.url",
                "",
                "The OAuth configuration option sasl.oauthbearer.jwks.endpoint.url is required",
            ))
        }
        _ => {}
    }
    let Some((url_key, url)) = url else {
        return Ok(None);
    };
    let lower_url = url.to_ascii_lowercase();
    let location = if lower_url.starts_with("file:") {
        // file:///path, file:/path (java.net.URL forms); no host part.
        let rest = &url["file:".len()..];
        let path = rest.strip_prefix("//").unwrap_or(rest);
        if !path.starts_with('/') {
            return Err(ConfigError::new(
                &url_key,
                &url,
                format!("The OAuth configuration option {url_key} contains a URL ({url}) that is malformed: a file URL needs an absolute path"),
            ));
        }
        let path = std::path::PathBuf::from(path);
        if !path.exists() {
            return Err(ConfigError::new(
                &url_key,
                &url,
                format!("The OAuth configuration option {url_key} contains a file ({}) that doesn't exist", path.display()),
            ));
        }
        if path.is_dir() {
            return Err(ConfigError::new(
                &url_key,
                &url,
                format!("The OAuth configuration option {url_key} references a directory ({}), not a file", path.display()),
            ));
        }
        JwksLocation::File(path)
    } else if lower_url.starts_with("http://") || lower_url.starts_with("https://") {
        JwksLocation::Http {
            url: url.clone(),
            truststore: jaas_options
                .and_then(|o| o.get("ssl.truststore.location"))
                .map(|p| std::path::PathBuf::from(p.trim())),
        }
    } else {
        return Err(ConfigError::new(
            &url_key,
            &url,
            format!("The OAuth configuration option {url_key} contains a URL ({url}) that is malformed: only file:, http: and https: URLs are read"),
        ));
    };
    let long = |key: &str, default: u64| -> Result<u64, ConfigError> {
        match oauthbearer_get(props, listener, key) {
            None => Ok(default),
            Some((k, v)) => v.parse::<u64>().map_err(|_| {
                ConfigError::new(&k, &v, format!("The OAuth configuration option {k} must be a non-negative number of type LONG"))
            }),
        }
    };
    let defaults = JwksRefresh::default();
    let refresh = JwksRefresh {
        refresh_ms: long(
            "sasl.oauthbearer.jwks.endpoint.refresh.ms",
            defaults.refresh_ms,
        )?,
        retry_backoff_ms: long(
            "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms",
            defaults.retry_backoff_ms,
        )?,
        retry_backoff_max_ms: long(
            "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms",
            defaults.retry_backoff_max_ms,
        )?,
    };
    let mut claims = SignedJwtConfig::default();
    if let Some((k, v)) = oauthbearer_get(props, listener, "sasl.oauthbearer.clock.skew.seconds") {
        claims.clock_skew_seconds = v
            .parse::<i32>()
            .ok()
            .filter(|n| *n >= 0)
            .map(i64::from)
            .ok_or_else(|| ConfigError::new(&k, &v, "Not a non-negative number of type INT"))?;
    }
    if let Some((_, v)) = oauthbearer_get(props, listener, "sasl.oauthbearer.expected.audience") {
        claims.expected_audience = v
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
    }
    if let Some((_, v)) = oauthbearer_get(props, listener, "sasl.oauthbearer.expected.issuer") {
        claims.expected_issuer = Some(v).filter(|v| !v.is_empty());
    }
    for (key, field) in [
        (
            "sasl.oauthbearer.sub.claim.name",
            &mut claims.sub_claim_name,
        ),
        (
            "sasl.oauthbearer.scope.claim.name",
            &mut claims.scope_claim_name,
        ),
    ] {
        if let Some((k, v)) = oauthbearer_get(props, listener, key) {
            if v.is_empty() {
                return Err(ConfigError::new(
                    &k,
                    &v,
                    format!("The OAuth configuration option {k} value must be non-empty"),
                ));
            }
            *field = v;
        }
    }
    Ok(Some(JwksSettings {
        location,
        refresh,
        claims,
    }))
}

/// SCRAM credentials from the node's metadata image (UserScramCredentialRecords).
pub struct ImageScramCredentials(pub gregor_metadata::controller::ControllerHandle);

impl ScramCredentialStore for ImageScramCredentials {
    fn credential(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential> {
        let image = self.0.image();
        let r = image
            .scram
            .get(&(user.to_string(), mechanism.type_code()))?;
        Some(ScramCredential {
            salt: r.salt.clone(),
            stored_key: r.stored_key.clone(),
            server_key: r.server_key.clone(),
            iterations: r.iterations,
        })
    }
}

/// SCRAM credentials from the metadata image of a controller that is not loaded yet: the
/// controller listeners serve before this node's metadata is loaded (the voters must elect a
/// leader first), and until the handle is set every SCRAM login fails for an unknown user, as
/// Kafka's controller answers before its `ScramPublisher` has filled its credential cache.
#[derive(Default)]
pub struct LoadedImageScramCredentials(
    pub Arc<std::sync::OnceLock<gregor_metadata::controller::ControllerHandle>>,
);

impl ScramCredentialStore for LoadedImageScramCredentials {
    fn credential(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential> {
        let controller = self.0.get()?;
        ImageScramCredentials(controller.clone()).credential(user, mechanism)
    }
}

impl SaslSettings {
    /// One start-up warning per listener that accepts unsecured OAUTHBEARER tokens (Kafka's
    /// `OAuthBearerUnsecuredValidatorCallbackHandler`, its default when no JWKS is set): a
    /// client signs nothing and names its own principal, super users included. Kafka serves
    /// it silently; it is meant for development only.
    pub fn unsecured_oauthbearer_warnings(&self) -> Vec<String> {
        self.listeners
            .iter()
            .filter(|(_, l)| {
                l.mechanisms.contains(&Mechanism::OAuthBearer) && l.oauthbearer_jwks.is_none()
            })
            .map(|(name, _)| format!("listener {name} accepts unsecured OAUTHBEARER tokens (no sasl.oauthbearer.jwks.endpoint.url): any client can log in as any principal it names; use it for development only"))
            .collect()
    }
}

/// Why this node's controller listener cannot carry its voters' own traffic, if it cannot:
/// `sasl.mechanism.controller.protocol` is a SCRAM mechanism and the quorum has other voters.
/// SCRAM credentials live in the metadata log, which a voter loads only after a leader is
/// elected, so voters that must log in with SCRAM to vote never elect one on a new cluster
/// (KAFKA-15513; KIP-900 bootstraps the credentials for brokers). Kafka starts anyway; gregor
/// too, with this warning.
pub fn controller_scram_warning(config: &crate::config::BrokerConfig) -> Option<String> {
    let name = config.quorum.controller_listener_names.first()?;
    let protocol = config.listener_security_protocol_map.get(name)?;
    let mechanism = config
        .raw
        .get("sasl.mechanism.controller.protocol")
        .map(|m| m.trim())?;
    let others = config.quorum.voters.ids().any(|v| v != config.node_id);
    (protocol.uses_sasl() && mechanism.starts_with("SCRAM-") && config.quorum.controller && others)
        .then(|| format!("the controller listener {name} authenticates the voters to each other with {mechanism} (sasl.mechanism.controller.protocol), whose credentials are in the metadata log that a voter loads only after a leader is elected: a new quorum cannot elect one; use PLAIN (or SSL with mTLS) for the controller listener"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(name: &str, p: SecurityProtocol) -> Listener {
        Listener {
            name: name.into(),
            host: "127.0.0.1".into(),
            port: 9092,
            security_protocol: p,
        }
    }

    fn props(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn reads_mechanisms_jaas_and_reauth_per_listener() {
        let p = props(&[
            ("sasl.enabled.mechanisms", "SCRAM-SHA-256"),
            (
                "listener.name.sasl_plaintext.sasl.enabled.mechanisms",
                "PLAIN,SCRAM-SHA-512,OAUTHBEARER",
            ),
            (
                "listener.name.sasl_plaintext.plain.sasl.jaas.config",
                r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="a" password="b" user_alice="alice-secret";"#,
            ),
            (
                "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config",
                r#"org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredValidatorRequiredScope="w r" unsecuredValidatorAllowableClockSkewMs="1000";"#,
            ),
            ("connections.max.reauth.ms", "5000"),
            (
                "listener.name.sasl_plaintext.oauthbearer.connections.max.reauth.ms",
                "700",
            ),
        ]);
        let s = SaslSettings::from_properties(
            &p,
            &[
                listener("SASL_PLAINTEXT", SecurityProtocol::SaslPlaintext),
                listener("OTHER", SecurityProtocol::SaslPlaintext),
                listener("PLAINTEXT", SecurityProtocol::Plaintext),
            ],
        )
        .unwrap();
        let l = &s.listeners["SASL_PLAINTEXT"];
        assert_eq!(
            l.mechanisms,
            [
                Mechanism::Plain,
                Mechanism::Scram(ScramMechanism::Sha512),
                Mechanism::OAuthBearer
            ]
        );
        assert_eq!(l.plain_users["alice"], "alice-secret");
        assert_eq!(l.oauthbearer.required_scope, ["w", "r"]);
        assert_eq!(l.oauthbearer.allowable_clock_skew_ms, 1000);
        assert_eq!(l.connections_max_reauth_ms, 5000);
        assert_eq!(
            l.connections_max_reauth_ms_by_mechanism,
            [(Mechanism::OAuthBearer, 700)]
        );
        assert!(acted_on(
            "listener.name.sasl_plaintext.oauthbearer.connections.max.reauth.ms"
        ));
        assert_eq!(
            s.listeners["OTHER"].mechanisms,
            [Mechanism::Scram(ScramMechanism::Sha256)]
        );
        assert!(!s.listeners.contains_key("PLAINTEXT"));
        assert!(acted_on(
            "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config"
        ));
        assert!(!acted_on(
            "listener.name.sasl_plaintext.gssapi.sasl.jaas.config"
        ));
        assert!(acted_on("sasl.oauthbearer.jwks.endpoint.url"));
        assert!(!acted_on("sasl.oauthbearer.token.endpoint.url"));
    }

    #[test]
    fn reads_the_signed_jwt_validator_keys() {
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("jwks.json");
        std::fs::write(&jwks, r#"{"keys":[]}"#).unwrap();
        let l = [listener("SASL_PLAINTEXT", SecurityProtocol::SaslPlaintext)];
        let base = [
            ("sasl.enabled.mechanisms", "OAUTHBEARER"),
            (
                "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config",
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
            ),
        ];
        let with = |kv: &[(&str, &str)]| {
            let mut p = props(&base);
            p.extend(props(kv));
            SaslSettings::from_properties(&p, &l)
        };
        // Unsecured unless a validator or a JWKS is named.
        let s = with(&[]).unwrap();
        assert!(s.listeners["SASL_PLAINTEXT"].oauthbearer_jwks.is_none());
        let file_url = format!("file://{}", jwks.display());
        let s = with(&[
            ("sasl.oauthbearer.jwks.endpoint.url", "http://127.0.0.1:1/x"),
            (
                "listener.name.sasl_plaintext.oauthbearer.sasl.oauthbearer.jwks.endpoint.url",
                &file_url,
            ),
            (
                "listener.name.sasl_plaintext.sasl.oauthbearer.expected.audience",
                "a, b",
            ),
            ("sasl.oauthbearer.expected.issuer", "iss"),
            ("sasl.oauthbearer.clock.skew.seconds", "5"),
            ("sasl.oauthbearer.sub.claim.name", "user"),
        ])
        .unwrap();
        let j = s.listeners["SASL_PLAINTEXT"]
            .oauthbearer_jwks
            .clone()
            .unwrap();
        assert_eq!(j.location, JwksLocation::File(jwks.clone()));
        assert_eq!(j.claims.expected_audience, ["a", "b"]);
        assert_eq!(j.claims.expected_issuer.as_deref(), Some("iss"));
        assert_eq!(j.claims.clock_skew_seconds, 5);
        assert_eq!(j.claims.sub_claim_name, "user");
        assert_eq!(j.refresh, JwksRefresh::default());
        for k in [
            "listener.name.sasl_plaintext.oauthbearer.sasl.oauthbearer.jwks.endpoint.url",
            "listener.name.x.sasl.oauthbearer.expected.audience",
            "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms",
            "listener.name.x.oauthbearer.sasl.server.callback.handler.class",
        ] {
            assert!(acted_on(k), "{k}");
        }
        assert!(!acted_on("sasl.oauthbearer.token.endpoint.url"));
        // The validator class without a JWKS, a missing file, another scheme, another class.
        let class = (
            "listener.name.sasl_plaintext.oauthbearer.sasl.server.callback.handler.class",
            OAUTHBEARER_VALIDATOR_CLASSES[0],
        );
        assert_eq!(
            with(&[class]).unwrap_err().name,
            "sasl.oauthbearer.jwks.endpoint.url"
        );
        let e = with(&[(
            "sasl.oauthbearer.jwks.endpoint.url",
            "file:///nope/jwks.json",
        )])
        .unwrap_err();
        assert!(e.reason.contains("doesn't exist"), "{e}");
        assert!(with(&[("sasl.oauthbearer.jwks.endpoint.url", "ftp://x/y")]).is_err());
        assert!(with(&[(class.0, "com.example.MyHandler")]).is_err());
        assert!(with(&[
            (class.0, OAUTHBEARER_UNSECURED_VALIDATOR_CLASS),
            ("sasl.oauthbearer.jwks.endpoint.url", &file_url)
        ])
        .is_err());
        assert!(with(&[
            ("sasl.oauthbearer.jwks.endpoint.url", &file_url),
            ("sasl.oauthbearer.jwks.endpoint.refresh.ms", "-1")
        ])
        .is_err());
    }

    #[test]
    fn sasl_controller_listeners_are_served_with_the_controller_mechanism() {
        use crate::config::BrokerConfig;
        let base = [
            (
                "listeners",
                "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093",
            ),
            ("controller.listener.names", "CONTROLLER"),
            (
                "listener.security.protocol.map",
                "PLAINTEXT:PLAINTEXT,CONTROLLER:SASL_PLAINTEXT",
            ),
            ("listener.name.controller.sasl.enabled.mechanisms", "PLAIN"),
            (
                "listener.name.controller.plain.sasl.jaas.config",
                r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="ctrl" password="s" user_ctrl="s";"#,
            ),
        ];
        let with = |kv: &[(&str, &str)]| {
            let mut p = props(&base);
            p.extend(props(kv));
            BrokerConfig::from_properties(p)
        };
        // gregor's own client needs a mechanism it speaks (Kafka's default is GSSAPI).
        let e = with(&[]).unwrap_err();
        assert_eq!(e.name, "sasl.mechanism.controller.protocol");
        let (c, _) = with(&[("sasl.mechanism.controller.protocol", "PLAIN")]).unwrap();
        assert_eq!(
            c.sasl.listeners["CONTROLLER"].mechanisms,
            [Mechanism::Plain]
        );
        assert_eq!(c.sasl.listeners["CONTROLLER"].plain_users["ctrl"], "s");
        assert!(controller_scram_warning(&c).is_none());
        // SCRAM between voters is accepted (as by Kafka) with a warning; alone, without one.
        let scram = [
            ("sasl.mechanism.controller.protocol", "SCRAM-SHA-512"),
            (
                "listener.name.controller.sasl.enabled.mechanisms",
                "SCRAM-SHA-512",
            ),
            (
                "listener.name.controller.scram-sha-512.sasl.jaas.config",
                r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="ctrl" password="s";"#,
            ),
        ];
        let (c, _) = with(&scram).unwrap();
        assert!(controller_scram_warning(&c).is_none());
        let mut voters = scram.to_vec();
        voters.push((
            "controller.quorum.voters",
            "1@127.0.0.1:9093,2@127.0.0.1:9095,3@127.0.0.1:9097",
        ));
        let (c, _) = with(&voters).unwrap();
        let w = controller_scram_warning(&c).unwrap();
        assert!(w.contains("SCRAM-SHA-512"), "{w}");
    }

    #[test]
    fn refuses_listeners_that_would_not_authenticate() {
        let l = [listener("SASL_PLAINTEXT", SecurityProtocol::SaslPlaintext)];
        // Kafka's default mechanism, GSSAPI, is not implemented.
        assert!(SaslSettings::from_properties(&props(&[]), &l).is_err());
        assert!(
            SaslSettings::from_properties(&props(&[("sasl.enabled.mechanisms", "")]), &l).is_err()
        );
        assert!(
            SaslSettings::from_properties(&props(&[("sasl.enabled.mechanisms", "plain")]), &l)
                .is_err()
        );
        // PLAIN without users.
        let e = SaslSettings::from_properties(&props(&[("sasl.enabled.mechanisms", "PLAIN")]), &l)
            .unwrap_err();
        assert_eq!(
            e.name,
            "listener.name.sasl_plaintext.plain.sasl.jaas.config"
        );
        let bad_jaas = props(&[
            ("sasl.enabled.mechanisms", "PLAIN"),
            (
                "listener.name.sasl_plaintext.plain.sasl.jaas.config",
                "PlainLoginModule required user_a=\"x\"",
            ),
        ]);
        assert!(SaslSettings::from_properties(&bad_jaas, &l).is_err());
        // OAUTHBEARER without a JAAS config: refused (it would accept unsecured tokens).
        let e = SaslSettings::from_properties(
            &props(&[("sasl.enabled.mechanisms", "OAUTHBEARER")]),
            &l,
        )
        .unwrap_err();
        assert_eq!(
            e.name,
            "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config"
        );
        assert!(e.reason.contains("KafkaServer"), "{e}");
        // With it, unsecured tokens are served with a warning; with a JWKS, none.
        let jaas = (
            "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config",
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
        );
        let unsecured = SaslSettings::from_properties(
            &props(&[("sasl.enabled.mechanisms", "OAUTHBEARER"), jaas]),
            &l,
        )
        .unwrap();
        let w = unsecured.unsecured_oauthbearer_warnings();
        assert!(w.len() == 1 && w[0].contains("SASL_PLAINTEXT"), "{w:?}");
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("jwks.json");
        std::fs::write(&jwks, r#"{"keys":[]}"#).unwrap();
        let url = format!("file://{}", jwks.display());
        let signed = SaslSettings::from_properties(
            &props(&[
                ("sasl.enabled.mechanisms", "OAUTHBEARER"),
                jaas,
                ("sasl.oauthbearer.jwks.endpoint.url", url.as_str()),
            ]),
            &l,
        )
        .unwrap();
        assert!(signed.unsecured_oauthbearer_warnings().is_empty());
    }
}
