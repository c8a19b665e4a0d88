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
//! Every other `sasl.*` key (Kerberos, the OAUTHBEARER JWKS validator, callback handler
//! classes, ...) still stops start-up (`config::unimplemented_security_keys`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gregor_network::sasl::jaas::{JaasConfig, OAUTHBEARER_LOGIN_MODULE, PLAIN_LOGIN_MODULE};
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

/// Whether `name` is a SASL key gregor reads: [`KEYS`],
/// `listener.name.<l>.sasl.enabled.mechanisms`, `listener.name.<l>.<mechanism>.sasl.jaas.config`
/// for a mechanism gregor implements, and `listener.name.<l>.connections.max.reauth.ms`.
pub fn acted_on(name: &str) -> bool {
    if KEYS.contains(&name) {
        return true;
    }
    let Some(rest) = name.strip_prefix("listener.name.") else {
        return false;
    };
    let Some((_, key)) = rest.split_once('.') else {
        return false;
    };
    if key == "sasl.enabled.mechanisms" || key == "connections.max.reauth.ms" {
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
    /// `connections.max.reauth.ms` (or its listener-prefixed form).
    pub connections_max_reauth_ms: i64,
    /// `listener.name.<l>.<mechanism>.connections.max.reauth.ms`, where set.
    pub connections_max_reauth_ms_by_mechanism: Vec<(Mechanism, i64)>,
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
            if let Some(c) = jaas(Mechanism::OAuthBearer)? {
                let key = format!("listener.name.{lower}.oauthbearer.sasl.jaas.config");
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
            connections_max_reauth_ms,
        })
    }

    /// Checks the SASL listeners gregor's own clients use: the inter-broker listener must
    /// enable `sasl.mechanism.inter.broker.protocol` (Kafka: "must be included in
    /// sasl.enabled.mechanisms when SASL is used for inter-broker communication"); a
    /// controller listener cannot use SASL yet (controller listeners are bound without an
    /// authenticator; SSL with mTLS secures them).
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
        for l in &config.quorum.controller_listener_names {
            let sasl = self.listeners.contains_key(l)
                || config
                    .listener_security_protocol_map
                    .get(l)
                    .is_some_and(|p| p.uses_sasl());
            if sasl {
                return Err(ConfigError::new(
                    "controller.listener.names",
                    l,
                    format!("controller listener {l} uses SASL, which gregor's controller listeners do not serve yet; use SSL (with ssl.client.auth=required for mTLS) or PLAINTEXT"),
                ));
            }
        }
        Ok(())
    }

    /// The network's SASL configs by listener, with SCRAM credentials from `store`.
    pub fn server_configs(
        &self,
        store: &Arc<dyn ScramCredentialStore>,
    ) -> HashMap<String, Arc<SaslServerConfig>> {
        self.listeners
            .iter()
            .map(|(name, l)| {
                let mut c = SaslServerConfig::new(l.mechanisms.clone());
                c.plain_users = l.plain_users.clone();
                c.scram_credentials = Some(store.clone());
                c.oauthbearer = l.oauthbearer.clone();
                c.connections_max_reauth_ms = l.connections_max_reauth_ms;
                c.connections_max_reauth_ms_by_mechanism =
                    l.connections_max_reauth_ms_by_mechanism.clone();
                c.max_receive_size = self.max_receive_size;
                (name.clone(), Arc::new(c))
            })
            .collect()
    }
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
        assert!(!acted_on("sasl.oauthbearer.jwks.endpoint.url"));
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
    }
}
