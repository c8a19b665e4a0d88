//! TLS (`SSL` listeners) on rustls: Kafka's `SslFactory` and `DefaultSslEngineFactory` for a
//! listener, reduced to what rustls can honour.
//!
//! [`TlsSettings`] are a listener's `ssl.*` keys, already resolved by the broker (a
//! `listener.name.<listener>.ssl.*` key overrides the broker-wide one). [`TlsServerState`]
//! builds the `rustls::ServerConfig` from them and rebuilds it when the keystore or truststore
//! files change ([`TlsServerState::reload_if_changed`], polled by the broker) or when new
//! settings arrive ([`TlsServerState::reconfigure`], dynamic broker config): a rebuild that
//! fails keeps the config in use and returns why. New connections take the config current at
//! their accept; established ones keep theirs. [`TlsTransportLayer`] runs the handshake within
//! a deadline and gives the connection its principal: `User:` and the client certificate's
//! subject (RFC 2253, [`dn`]) through `ssl.principal.mapping.rules` ([`principal`]), or
//! `User:ANONYMOUS` without a client certificate.
//!
//! What Kafka supports and this does not: JKS keystores (PEM only; PKCS12 is refused with a
//! message), `ssl.protocol`/`ssl.enabled.protocols` other than TLSv1.2 and TLSv1.3,
//! `ssl.cipher.suites` outside rustls's set, CRLs, `ssl.engine.factory.class`.

pub mod dn;
pub mod principal;

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Mutex, RwLock};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, SupportedProtocolVersion};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpStream;
use tracing::{debug, info};

use crate::context::{KafkaPrincipal, SecurityProtocol};
use crate::log_limit::LogLimiter;
use crate::transport::{Established, Stream, TransportLayer};
pub use principal::SslPrincipalMapper;

/// TLS handshakes that failed (counter): an untrusted or missing client certificate, a
/// client that speaks no TLS, a timeout.
pub const TLS_HANDSHAKE_FAILURES_TOTAL: &str = "gregor_tls_handshake_failures_total";
/// Rebuilds of a listener's TLS config from changed files or settings (counter), by
/// `result` (`ok`, `failed`).
pub const TLS_RELOADS_TOTAL: &str = "gregor_tls_reloads_total";

/// Failed handshakes are logged with their peer, at most 10 lines per 10 s (a client can fail
/// them in a loop).
static HANDSHAKE_FAILURE_LOGS: LogLimiter = LogLimiter::new(10, Duration::from_secs(10));

/// A listener's TLS settings that cannot work, naming the key (its broker-wide name; the
/// broker says which listener).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct TlsError {
    /// The config key at fault (`ssl.keystore.location`, ...).
    pub key: &'static str,
    /// What is wrong and what to do.
    pub message: String,
}

impl TlsError {
    fn new(key: &'static str, message: impl Into<String>) -> Self {
        Self {
            key,
            message: message.into(),
        }
    }
}

/// `ssl.client.auth` (Kafka's `SslClientAuth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientAuth {
    /// `none` (Kafka's default): no client certificate is asked for.
    #[default]
    None,
    /// `requested`: asked for; a client without one connects as `User:ANONYMOUS`, one with an
    /// untrusted one is refused.
    Requested,
    /// `required`: a trusted client certificate or no connection (mTLS).
    Required,
}

impl ClientAuth {
    /// Parses Kafka's names, case-insensitively.
    pub fn from_name(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Some(Self::None),
            "requested" => Some(Self::Requested),
            "required" => Some(Self::Required),
            _ => None,
        }
    }
}

/// Where the listener's certificate chain and private key come from (`ssl.keystore.type` PEM
/// or PKCS12).
#[derive(Clone, PartialEq, Eq)]
pub enum KeyStore {
    /// `ssl.keystore.location`: one PEM file holding the private key and the chain (leaf
    /// first).
    File(PathBuf),
    /// `ssl.keystore.certificate.chain` and `ssl.keystore.key`: PEM text in the config.
    Inline {
        /// The chain, leaf first.
        certificate_chain: String,
        /// The private key (PKCS #8; encrypted with `ssl.key.password` when set).
        key: String,
    },
    /// `ssl.keystore.type=PKCS12`: `ssl.keystore.location` with `ssl.keystore.password`,
    /// holding one private key and its chain.
    Pkcs12 {
        /// `ssl.keystore.location`.
        location: PathBuf,
        /// `ssl.keystore.password` (also the key's password).
        password: String,
    },
}

impl std::fmt::Debug for TrustStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => f.debug_tuple("File").field(p).finish(),
            Self::Inline(pem) => f.debug_tuple("Inline").field(pem).finish(),
            Self::Pkcs12 { location, .. } => f
                .debug_struct("Pkcs12")
                .field("location", location)
                .finish_non_exhaustive(),
        }
    }
}

impl std::fmt::Debug for KeyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => f.debug_tuple("File").field(p).finish(),
            Self::Inline {
                certificate_chain, ..
            } => f
                .debug_struct("Inline")
                .field("certificate_chain", certificate_chain)
                .finish_non_exhaustive(),
            Self::Pkcs12 { location, .. } => f
                .debug_struct("Pkcs12")
                .field("location", location)
                .finish_non_exhaustive(),
        }
    }
}

/// Where the CA certificates that client certificates are checked against come from
/// (`ssl.truststore.type` PEM or PKCS12).
#[derive(Clone, PartialEq, Eq)]
pub enum TrustStore {
    /// `ssl.truststore.location`: a PEM file of CA certificates.
    File(PathBuf),
    /// `ssl.truststore.certificates`: PEM text in the config.
    Inline(String),
    /// `ssl.truststore.type=PKCS12`: `ssl.truststore.location` with `ssl.truststore.password`;
    /// its trusted certificate entries (Java's `trustedCertEntry`, as `keytool -importcert`
    /// writes them) are the CA certificates.
    Pkcs12 {
        /// `ssl.truststore.location`.
        location: PathBuf,
        /// `ssl.truststore.password`.
        password: String,
    },
}

/// A listener's TLS settings, with Kafka's names.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// The keystore (required for a listener).
    pub keystore: KeyStore,
    /// `ssl.key.password`: decrypts an `ENCRYPTED PRIVATE KEY` (PKCS #8, PBES2).
    pub key_password: Option<String>,
    /// The truststore, needed for `ssl.client.auth` requested or required.
    pub truststore: Option<TrustStore>,
    /// `ssl.client.auth`.
    pub client_auth: ClientAuth,
    /// `ssl.enabled.protocols` capped by `ssl.protocol`: the TLS versions offered.
    pub protocols: Vec<&'static SupportedProtocolVersion>,
    /// `ssl.cipher.suites`; empty: rustls's defaults.
    pub cipher_suites: Vec<String>,
    /// `ssl.principal.mapping.rules`.
    pub principal_mapper: SslPrincipalMapper,
    /// How long a handshake may take before the connection is closed (ms).
    pub handshake_timeout_ms: u64,
}

/// Parses `ssl.enabled.protocols` (a list) capped by `ssl.protocol` (the SSLContext protocol:
/// `TLSv1.2` allows up to TLS 1.2, `TLSv1.3` and `TLS` everything).
///
/// # Errors
/// [`TlsError`] for a protocol rustls does not implement (TLSv1, TLSv1.1, SSLv3) or when none
/// is left.
pub fn parse_protocols(
    enabled: &str,
    ssl_protocol: &str,
) -> Result<Vec<&'static SupportedProtocolVersion>, TlsError> {
    let cap13 = match ssl_protocol.trim() {
        "TLSv1.3" | "TLS" | "" => true,
        "TLSv1.2" => false,
        other => {
            return Err(TlsError::new(
                "ssl.protocol",
                format!("{other} is not supported; use TLSv1.3 or TLSv1.2"),
            ))
        }
    };
    let mut out = Vec::new();
    for p in enabled.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match p {
            "TLSv1.3" if cap13 => out.push(&rustls::version::TLS13),
            "TLSv1.3" => {}
            "TLSv1.2" => out.push(&rustls::version::TLS12),
            other => {
                return Err(TlsError::new(
                    "ssl.enabled.protocols",
                    format!(
                    "{other} is not supported (rustls offers TLSv1.2 and TLSv1.3 only); remove it"
                ),
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(TlsError::new(
            "ssl.enabled.protocols",
            format!("no protocol left to offer (ssl.enabled.protocols={enabled}, ssl.protocol={ssl_protocol})"),
        ));
    }
    Ok(out)
}

/// The crypto provider (ring) with `ssl.cipher.suites` applied: Kafka's IANA names
/// (`TLS_AES_128_GCM_SHA256`, `TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384`).
///
/// # Errors
/// [`TlsError`] naming a suite rustls does not have, with the list of those it has.
pub fn crypto_provider(cipher_suites: &[String]) -> Result<Arc<CryptoProvider>, TlsError> {
    let mut provider = rustls::crypto::ring::default_provider();
    if !cipher_suites.is_empty() {
        let name_of = |s: &rustls::SupportedCipherSuite| {
            s.suite()
                .as_str()
                .map(|n| n.replacen("TLS13_", "TLS_", 1))
                .unwrap_or_default()
        };
        let mut chosen = Vec::new();
        for wanted in cipher_suites {
            let found = provider
                .cipher_suites
                .iter()
                .find(|s| name_of(s) == wanted.trim() || s.suite().as_str() == Some(wanted.trim()));
            match found {
                Some(s) => chosen.push(*s),
                None => {
                    let known: Vec<String> = provider.cipher_suites.iter().map(name_of).collect();
                    return Err(TlsError::new(
                        "ssl.cipher.suites",
                        format!("{wanted} is not supported; supported: {}", known.join(",")),
                    ));
                }
            }
        }
        provider.cipher_suites = chosen;
    }
    Ok(Arc::new(provider))
}

fn read_file(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path)
        .map_err(|e| TlsError::new(key, format!("cannot read {}: {e}", path.display())))
}

/// The private key and chain of a PKCS12 keystore file.
fn pkcs12_keystore(
    path: &Path,
    password: &str,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    const KEY: &str = "ssl.keystore.location";
    let data = read_file(KEY, path)?;
    let store = p12_keystore::KeyStore::from_pkcs12(
        &data,
        password,
        p12_keystore::Pkcs12ImportPolicy::Strict,
    )
    .map_err(|e| {
        TlsError::new(
            KEY,
            format!(
                "cannot read the PKCS12 keystore {} (wrong ssl.keystore.password or not PKCS12): {e}",
                path.display()
            ),
        )
    })?;
    let keys = store
        .entries()
        .filter(|(_, e)| matches!(e, p12_keystore::KeyStoreEntry::PrivateKeyChain(_)))
        .count();
    if keys > 1 {
        return Err(TlsError::new(
            KEY,
            format!(
                "the PKCS12 keystore {} holds {keys} private keys; gregor serves one",
                path.display()
            ),
        ));
    }
    let Some((_, chain)) = store.private_key_chain() else {
        return Err(TlsError::new(
            KEY,
            format!(
                "the PKCS12 keystore {} holds no private key with its certificate",
                path.display()
            ),
        ));
    };
    let certs = chain
        .certs()
        .iter()
        .map(|c| CertificateDer::from(c.as_der().to_vec()))
        .collect::<Vec<_>>();
    if certs.is_empty() {
        return Err(TlsError::new(
            KEY,
            "the PKCS12 private key has no certificate",
        ));
    }
    Ok((
        certs,
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(chain.key().as_der().to_vec())),
    ))
}

/// The trusted certificates of a PKCS12 truststore file.
fn pkcs12_truststore(
    path: &Path,
    password: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    const KEY: &str = "ssl.truststore.location";
    let data = read_file(KEY, path)?;
    let archive = p12_keystore::Pkcs12Archive::from_pkcs12(&data, password).map_err(|e| {
        TlsError::new(
            KEY,
            format!(
                "cannot read the PKCS12 truststore {} (wrong ssl.truststore.password or not PKCS12): {e}",
                path.display()
            ),
        )
    })?;
    let certs: Vec<_> = archive
        .certs
        .iter()
        .filter(|c| c.trusted)
        .map(|c| CertificateDer::from(c.cert.as_der().to_vec()))
        .collect();
    if certs.is_empty() {
        return Err(TlsError::new(
            KEY,
            format!("the PKCS12 truststore {} has no trusted certificate entry (Java reads only those: import CA certificates with keytool -importcert)", path.display()),
        ));
    }
    Ok(certs)
}

/// The certificates of a PEM text (`CERTIFICATE` sections).
fn pem_certificates(
    key: &'static str,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new(key, format!("invalid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::new(key, "no CERTIFICATE found in the PEM text"));
    }
    Ok(certs)
}

/// The private key of a PEM text: a plain key (PKCS #8, or PKCS #1/SEC1, which Kafka does not
/// read but rustls does), or with `password` an `ENCRYPTED PRIVATE KEY`.
fn pem_private_key(
    key: &'static str,
    pem: &[u8],
    password: Option<&str>,
) -> Result<PrivateKeyDer<'static>, TlsError> {
    const BEGIN: &str = "-----BEGIN ENCRYPTED PRIVATE KEY-----";
    const END: &str = "-----END ENCRYPTED PRIVATE KEY-----";
    let text = String::from_utf8_lossy(pem);
    if let Some(start) = text.find(BEGIN) {
        let Some(password) = password else {
            return Err(TlsError::new(
                "ssl.key.password",
                format!("the private key in {key} is encrypted; set ssl.key.password"),
            ));
        };
        let end = text[start..]
            .find(END)
            .map(|e| start + e + END.len())
            .ok_or_else(|| TlsError::new(key, "unterminated ENCRYPTED PRIVATE KEY"))?;
        let (_, der) = pkcs8::der::pem::decode_vec(text[start..end].as_bytes())
            .map_err(|e| TlsError::new(key, format!("invalid ENCRYPTED PRIVATE KEY: {e}")))?;
        let info = pkcs8::EncryptedPrivateKeyInfo::try_from(der.as_slice())
            .map_err(|e| TlsError::new(key, format!("invalid ENCRYPTED PRIVATE KEY: {e}")))?;
        let plain = info.decrypt(password).map_err(|e| {
            TlsError::new(
                "ssl.key.password",
                format!("cannot decrypt the private key in {key} (wrong password or unsupported cipher): {e}"),
            )
        })?;
        return Ok(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            plain.as_bytes().to_vec(),
        )));
    }
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            TlsError::new(key, "no PRIVATE KEY found in the PEM text")
        }
        e => TlsError::new(key, format!("invalid PEM private key: {e}")),
    })
}

/// The chain and key of `keystore`.
///
/// # Errors
/// [`TlsError`] naming the key whose file or text cannot be read or parsed.
pub fn load_keystore(
    keystore: &KeyStore,
    key_password: Option<&str>,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    match keystore {
        KeyStore::File(path) => {
            const KEY: &str = "ssl.keystore.location";
            let pem = read_file(KEY, path)?;
            Ok((
                pem_certificates(KEY, &pem)?,
                pem_private_key(KEY, &pem, key_password)?,
            ))
        }
        KeyStore::Inline {
            certificate_chain,
            key,
        } => Ok((
            pem_certificates(
                "ssl.keystore.certificate.chain",
                certificate_chain.as_bytes(),
            )?,
            pem_private_key("ssl.keystore.key", key.as_bytes(), key_password)?,
        )),
        KeyStore::Pkcs12 { location, password } => {
            if key_password.is_some_and(|k| k != password) {
                return Err(TlsError::new(
                    "ssl.key.password",
                    "gregor reads PKCS12 keystores whose private key is protected by the store password; ssl.key.password must be unset or equal to ssl.keystore.password",
                ));
            }
            pkcs12_keystore(location, password)
        }
    }
}

/// The CA certificates of `truststore`.
///
/// # Errors
/// [`TlsError`] naming the key whose file or text cannot be read or parsed.
pub fn load_truststore(truststore: &TrustStore) -> Result<RootCertStore, TlsError> {
    let (key, certs) = match truststore {
        TrustStore::File(path) => {
            const KEY: &str = "ssl.truststore.location";
            (KEY, pem_certificates(KEY, &read_file(KEY, path)?)?)
        }
        TrustStore::Inline(pem) => {
            const KEY: &str = "ssl.truststore.certificates";
            (KEY, pem_certificates(KEY, pem.as_bytes())?)
        }
        TrustStore::Pkcs12 { location, password } => (
            "ssl.truststore.location",
            pkcs12_truststore(location, password)?,
        ),
    };
    let mut roots = RootCertStore::empty();
    for c in certs {
        roots
            .add(c)
            .map_err(|e| TlsError::new(key, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// The rustls server config of `settings`.
///
/// # Errors
/// [`TlsError`] naming the key that cannot work.
pub fn build_server_config(settings: &TlsSettings) -> Result<ServerConfig, TlsError> {
    let provider = crypto_provider(&settings.cipher_suites)?;
    let (chain, key) = load_keystore(&settings.keystore, settings.key_password.as_deref())?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&settings.protocols)
        .map_err(|e| {
            TlsError::new(
                "ssl.cipher.suites",
                format!(
                    "no cipher suite of {:?} fits the enabled protocols: {e}",
                    settings.cipher_suites
                ),
            )
        })?;
    let builder = match settings.client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        auth => {
            let Some(truststore) = &settings.truststore else {
                return Err(TlsError::new(
                    "ssl.truststore.location",
                    "ssl.client.auth is requested or required, which needs the CA certificates to check clients against: set ssl.truststore.type=PEM and ssl.truststore.location or ssl.truststore.certificates",
                ));
            };
            let roots = Arc::new(load_truststore(truststore)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
            let verifier = if auth == ClientAuth::Requested {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .map_err(|e| TlsError::new("ssl.truststore.location", e.to_string()))?,
            )
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        TlsError::new(
            match settings.keystore {
                KeyStore::File(_) | KeyStore::Pkcs12 { .. } => "ssl.keystore.location",
                KeyStore::Inline { .. } => "ssl.keystore.key",
            },
            format!("the private key does not fit the certificate chain or is unsupported: {e}"),
        )
    })?;
    // Kafka speaks no ALPN; a client offering some still gets a connection.
    config.alpn_protocols.clear();
    Ok(config)
}

/// What a keystore or truststore file looked like when last read: (path, modified, length).
pub(crate) type FileStamp = Vec<(PathBuf, Option<SystemTime>, Option<u64>)>;

fn stamp(settings: &TlsSettings) -> FileStamp {
    stamp_stores(Some(&settings.keystore), settings.truststore.as_ref())
}

/// The modification time and length of the keystore's and truststore's files (none for inline
/// stores): what [`TlsServerState::reload_if_changed`] and gregor's own client compare.
pub(crate) fn stamp_stores(
    keystore: Option<&KeyStore>,
    truststore: Option<&TrustStore>,
) -> FileStamp {
    let mut paths = Vec::new();
    if let Some(KeyStore::File(p) | KeyStore::Pkcs12 { location: p, .. }) = keystore {
        paths.push(p.clone());
    }
    if let Some(TrustStore::File(p) | TrustStore::Pkcs12 { location: p, .. }) = truststore {
        paths.push(p.clone());
    }
    paths
        .into_iter()
        .map(|p| {
            let meta = std::fs::metadata(&p).ok();
            let modified = meta.as_ref().and_then(|m| m.modified().ok());
            let len = meta.map(|m| m.len());
            (p, modified, len)
        })
        .collect()
}

/// A listener's TLS config, rebuilt when its files or settings change.
pub struct TlsServerState {
    listener_name: String,
    inner: RwLock<(TlsSettings, Arc<ServerConfig>)>,
    files: Mutex<FileStamp>,
}

impl TlsServerState {
    /// Builds the listener's config from `settings`.
    ///
    /// # Errors
    /// [`TlsError`] naming the key that cannot work.
    pub fn new(listener_name: &str, settings: TlsSettings) -> Result<Arc<Self>, TlsError> {
        let files = stamp(&settings);
        let config = Arc::new(build_server_config(&settings)?);
        Ok(Arc::new(Self {
            listener_name: listener_name.to_string(),
            inner: RwLock::new((settings, config)),
            files: Mutex::new(files),
        }))
    }

    /// The listener's name.
    pub fn listener_name(&self) -> &str {
        &self.listener_name
    }

    /// The config new connections get.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.inner.read().1.clone()
    }

    /// The settings in use.
    pub fn settings(&self) -> TlsSettings {
        self.inner.read().0.clone()
    }

    /// Rebuilds the config when a keystore or truststore file's modification time or length
    /// changed since it was last read (Kafka's `SslFactory` compares modification times).
    /// Returns whether a new config is in use.
    ///
    /// # Errors
    /// [`TlsError`] when the changed files do not make a config: the old one stays, and the
    /// same files are not retried until they change again.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let settings = self.settings();
        let now = stamp(&settings);
        {
            let mut files = self.files.lock();
            if *files == now {
                return Ok(false);
            }
            *files = now;
        }
        self.install(settings).map(|()| true)
    }

    /// Checks a dynamic change to `new` before it is stored (Kafka's
    /// `SslFactory.validateReconfiguration`): the new settings must make a config, and when the
    /// keystore changes, its certificate must have the current subject (unless
    /// `allow_dn_changes`, `ssl.allow.dn.changes`) and at least the current subject
    /// alternative names (unless `allow_san_changes`, `ssl.allow.san.changes`).
    ///
    /// # Errors
    /// Kafka's message ("Validation of dynamic config update of SSLFactory failed: ...").
    pub fn validate_change(
        &self,
        new: &TlsSettings,
        allow_dn_changes: bool,
        allow_san_changes: bool,
    ) -> Result<(), String> {
        let failed =
            |m: String| format!("Validation of dynamic config update of SSLFactory failed: {m}");
        build_server_config(new).map_err(|e| failed(e.to_string()))?;
        let current = self.settings();
        if current.keystore == new.keystore && current.key_password == new.key_password {
            return Ok(());
        }
        let leaf = |s: &TlsSettings| -> Result<CertificateIdentity, String> {
            let (chain, _) =
                load_keystore(&s.keystore, s.key_password.as_deref()).map_err(|e| e.to_string())?;
            let first = chain.first().ok_or("no certificate")?;
            CertificateIdentity::of(first.as_ref())
        };
        let old = leaf(&current).map_err(failed)?;
        let next = leaf(new).map_err(failed)?;
        if !allow_dn_changes && !old.subject.eq_ignore_ascii_case(&next.subject) {
            return Err(failed(format!(
                "org.apache.kafka.common.config.ConfigException: Keystore DistinguishedName does not match:  existing={{DN={}}}, new={{DN={}}}",
                old.subject, next.subject
            )));
        }
        if !allow_san_changes
            && !old
                .subject_alt_names
                .iter()
                .all(|n| next.subject_alt_names.contains(n))
        {
            return Err(failed(format!(
                "org.apache.kafka.common.config.ConfigException: Keystore SubjectAltNames do not match:  existing={{SAN={}}}, new={{SAN={}}}",
                CertificateIdentity::render_sans(&old.subject_alt_names),
                CertificateIdentity::render_sans(&next.subject_alt_names)
            )));
        }
        Ok(())
    }

    /// Replaces the settings (dynamic broker config) and rebuilds the config.
    ///
    /// # Errors
    /// [`TlsError`] when they do not make a config: the old settings and config stay.
    pub fn reconfigure(&self, settings: TlsSettings) -> Result<(), TlsError> {
        *self.files.lock() = stamp(&settings);
        self.install(settings)
    }

    fn install(&self, settings: TlsSettings) -> Result<(), TlsError> {
        match build_server_config(&settings) {
            Ok(config) => {
                *self.inner.write() = (settings, Arc::new(config));
                metrics::counter!(TLS_RELOADS_TOTAL, "result" => "ok").increment(1);
                info!(listener = %self.listener_name, "TLS certificates reloaded; new connections use them");
                Ok(())
            }
            Err(e) => {
                metrics::counter!(TLS_RELOADS_TOTAL, "result" => "failed").increment(1);
                Err(e)
            }
        }
    }
}

/// What Kafka's `SslFactory.CertificateEntries` compares of a keystore's certificate.
#[derive(Debug, PartialEq, Eq)]
struct CertificateIdentity {
    /// The subject, RFC 2253.
    subject: String,
    /// (GeneralName tag as Java numbers them, value): 1 email, 2 DNS, 6 URI, 7 IP.
    subject_alt_names: Vec<(u8, String)>,
}

impl CertificateIdentity {
    fn of(der: &[u8]) -> Result<Self, String> {
        use x509_parser::extensions::GeneralName;
        let subject = dn::subject_rfc2253(der)?;
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| format!("invalid certificate: {e}"))?;
        let mut subject_alt_names = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for n in &san.value.general_names {
                subject_alt_names.push(match n {
                    GeneralName::RFC822Name(v) => (1, (*v).to_string()),
                    GeneralName::DNSName(v) => (2, (*v).to_string()),
                    GeneralName::URI(v) => (6, (*v).to_string()),
                    GeneralName::IPAddress(b) => (
                        7,
                        match b.len() {
                            4 => std::net::Ipv4Addr::from(
                                <[u8; 4]>::try_from(*b).unwrap_or_default(),
                            )
                            .to_string(),
                            16 => std::net::Ipv6Addr::from(
                                <[u8; 16]>::try_from(*b).unwrap_or_default(),
                            )
                            .to_string(),
                            _ => format!("{b:02x?}"),
                        },
                    ),
                    other => (0, format!("{other:?}")),
                });
            }
        }
        Ok(Self {
            subject,
            subject_alt_names,
        })
    }

    /// As Java prints `getSubjectAlternativeNames()`: `[[2, localhost], [7, 127.0.0.1]]`.
    fn render_sans(sans: &[(u8, String)]) -> String {
        let items: Vec<String> = sans.iter().map(|(t, v)| format!("[{t}, {v}]")).collect();
        format!("[{}]", items.join(", "))
    }
}

/// `SSL` (and the TLS half of `SASL_SSL`): a TLS handshake on every accepted connection.
pub struct TlsTransportLayer {
    protocol: SecurityProtocol,
    state: Arc<TlsServerState>,
}

impl TlsTransportLayer {
    /// A layer for a listener of `protocol` (`SSL` or `SASL_SSL`) serving `state`'s config.
    pub fn new(protocol: SecurityProtocol, state: Arc<TlsServerState>) -> Self {
        Self { protocol, state }
    }

    /// The listener's TLS state (for reloads).
    pub fn state(&self) -> &Arc<TlsServerState> {
        &self.state
    }
}

/// Handshakes the TLS server side of `stream` with `config` within `timeout`, and gives the
/// principal of the client certificate (see the module doc).
///
/// # Errors
/// The handshake's error, a timeout, or a certificate no mapping rule applies to.
pub async fn accept(
    stream: TcpStream,
    config: Arc<ServerConfig>,
    mapper: &SslPrincipalMapper,
    timeout: Duration,
) -> io::Result<(tokio_rustls::server::TlsStream<TcpStream>, KafkaPrincipal)> {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let tls = tokio::time::timeout(timeout, acceptor.accept(stream))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "TLS handshake not finished within {} ms",
                    timeout.as_millis()
                ),
            )
        })??;
    let principal = match tls.get_ref().1.peer_certificates().and_then(<[_]>::first) {
        None => KafkaPrincipal::anonymous(),
        Some(cert) => {
            let dn = dn::subject_rfc2253(cert).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("client certificate: {e}"),
                )
            })?;
            let name = mapper.name(&dn).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("no ssl.principal.mapping.rules apply to {dn}, rules {mapper}"),
                )
            })?;
            KafkaPrincipal {
                principal_type: KafkaPrincipal::USER_TYPE.to_string(),
                name,
            }
        }
    };
    Ok((tls, principal))
}

impl TransportLayer for TlsTransportLayer {
    fn security_protocol(&self) -> SecurityProtocol {
        self.protocol
    }

    fn establish(
        &self,
        stream: TcpStream,
    ) -> Pin<Box<dyn Future<Output = io::Result<Established>> + Send + '_>> {
        Box::pin(async move {
            let peer = stream.peer_addr().ok();
            let (settings, config) = {
                let inner = self.state.inner.read();
                (inner.0.clone(), inner.1.clone())
            };
            let timeout = Duration::from_millis(settings.handshake_timeout_ms);
            match accept(stream, config, &settings.principal_mapper, timeout).await {
                Ok((tls, principal)) => {
                    debug!(peer = ?peer, listener = %self.state.listener_name, %principal, "TLS connection established");
                    Ok(Established {
                        stream: Stream::Other(Box::new(tls)),
                        principal,
                    })
                }
                Err(e) => {
                    metrics::counter!(TLS_HANDSHAKE_FAILURES_TOTAL).increment(1);
                    if let Some(suppressed) = HANDSHAKE_FAILURE_LOGS.check(Instant::now()) {
                        info!(peer = ?peer, listener = %self.state.listener_name, error = %e, suppressed, "failed authentication (TLS handshake failed); connection closed");
                    }
                    Err(e)
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    fn self_signed() -> (String, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key)
    }

    fn encrypted_pem(key: &KeyPair, password: &str) -> String {
        let der = key.serialize_der();
        let info = pkcs8::PrivateKeyInfo::try_from(der.as_slice()).unwrap();
        let params =
            pkcs8::pkcs5::pbes2::Parameters::pbkdf2_sha256_aes256cbc(2048, b"saltsalt", &[7; 16])
                .unwrap();
        info.encrypt_with_params(params, password)
            .unwrap()
            .to_pem("ENCRYPTED PRIVATE KEY", pkcs8::LineEnding::LF)
            .unwrap()
            .to_string()
    }

    /// A PEM keystore file for a certificate with `cn` and `sans`.
    fn keystore_file(dir: &Path, name: &str, cn: &str, sans: &[&str]) -> KeyStore {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(sans.iter().map(|s| (*s).to_string()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.self_signed(&key).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, format!("{}{}", key.serialize_pem(), cert.pem())).unwrap();
        KeyStore::File(path)
    }

    #[test]
    fn a_dynamic_keystore_change_keeps_the_dn_and_sans_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let current = keystore_file(d, "a.pem", "broker1", &["127.0.0.1", "b1.example"]);
        let state = TlsServerState::new("SSL", settings(current, None)).unwrap();
        // Same DN, more SANs: fine.
        let same = keystore_file(
            d,
            "b.pem",
            "broker1",
            &["127.0.0.1", "b1.example", "x.example"],
        );
        state
            .validate_change(&settings(same, None), false, false)
            .unwrap();
        let other_dn = keystore_file(d, "c.pem", "broker2", &["127.0.0.1", "b1.example"]);
        let e = state
            .validate_change(&settings(other_dn.clone(), None), false, false)
            .unwrap_err();
        assert!(
            e.starts_with("Validation of dynamic config update of SSLFactory failed: ")
                && e.contains("Keystore DistinguishedName does not match")
                && e.contains("CN=broker1")
                && e.contains("CN=broker2"),
            "{e}"
        );
        state
            .validate_change(&settings(other_dn, None), true, false)
            .unwrap();
        let fewer_sans = keystore_file(d, "e.pem", "broker1", &["127.0.0.1"]);
        let e = state
            .validate_change(&settings(fewer_sans.clone(), None), false, false)
            .unwrap_err();
        assert!(
            e.contains("Keystore SubjectAltNames do not match") && e.contains("[2, b1.example]"),
            "{e}"
        );
        state
            .validate_change(&settings(fewer_sans, None), false, true)
            .unwrap();
        // A file that cannot be read is refused whatever is allowed.
        let e = state
            .validate_change(
                &settings(KeyStore::File(d.join("nope.pem")), None),
                true,
                true,
            )
            .unwrap_err();
        assert!(e.contains("nope.pem"), "{e}");
    }

    fn settings(keystore: KeyStore, key_password: Option<&str>) -> TlsSettings {
        TlsSettings {
            keystore,
            key_password: key_password.map(str::to_string),
            truststore: None,
            client_auth: ClientAuth::None,
            protocols: parse_protocols("TLSv1.2,TLSv1.3", "TLSv1.3").unwrap(),
            cipher_suites: Vec::new(),
            principal_mapper: SslPrincipalMapper::default(),
            handshake_timeout_ms: 1_000,
        }
    }

    #[test]
    fn encrypted_pkcs8_keys_need_the_right_password() {
        let (cert, key) = self_signed();
        let inline = |password: Option<&str>| {
            build_server_config(&settings(
                KeyStore::Inline {
                    certificate_chain: cert.clone(),
                    key: encrypted_pem(&key, "s3cret"),
                },
                password,
            ))
        };
        assert!(inline(Some("s3cret")).is_ok());
        let e = inline(Some("wrong")).unwrap_err();
        assert_eq!(e.key, "ssl.key.password");
        let e = inline(None).unwrap_err();
        assert_eq!(e.key, "ssl.key.password");
        assert!(e.message.contains("encrypted"), "{e}");
    }

    #[test]
    fn cipher_suites_use_kafka_names_and_unknown_ones_are_refused() {
        let p = crypto_provider(&["TLS_AES_256_GCM_SHA384".to_string()]).unwrap();
        assert_eq!(p.cipher_suites.len(), 1);
        let p = crypto_provider(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".to_string()]).unwrap();
        assert_eq!(p.cipher_suites.len(), 1);
        let e = crypto_provider(&["TLS_RSA_WITH_AES_128_CBC_SHA".to_string()]).unwrap_err();
        assert_eq!(e.key, "ssl.cipher.suites");
        assert!(e.message.contains("TLS_AES_128_GCM_SHA256"), "{e}");
    }

    #[tokio::test]
    async fn a_silent_client_times_out_the_handshake() {
        let (cert, key) = self_signed();
        let state = TlsServerState::new(
            "SSL",
            settings(
                KeyStore::Inline {
                    certificate_chain: cert,
                    key: key.serialize_pem(),
                },
                None,
            ),
        )
        .unwrap();
        let layer = TlsTransportLayer::new(SecurityProtocol::Ssl, state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let started = Instant::now();
        let err = match layer.establish(server).await {
            Ok(_) => panic!("a handshake without a client hello succeeded"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
