//! Signed OAUTHBEARER tokens (KIP-768): Kafka's `OAuthBearerValidatorCallbackHandler` with
//! its `ValidatorAccessTokenValidator`. The token is a JWS in compact serialization whose
//! signature is verified with a public key from a JWKS (RFC 7517): read from a `file:` URL
//! (`JwksFileVerificationKeyResolver`; gregor also re-reads the file when it changes) or
//! fetched from an `http(s)://` URL and refreshed every
//! `sasl.oauthbearer.jwks.endpoint.refresh.ms` (`RefreshingHttpsJwks`). A token whose `kid`
//! is in no key asks for one early refresh (at most once a minute per `kid`, as Kafka) and is
//! refused meanwhile.
//!
//! The claims are checked as jose4j's `JwtConsumer` does for Kafka: `exp` and `iat` required,
//! `exp` and `nbf` with `sasl.oauthbearer.clock.skew.seconds` of leeway,
//! `sasl.oauthbearer.expected.issuer`, `sasl.oauthbearer.expected.audience` (a token with an
//! `aud` claim is refused when no audience is expected, as jose4j's default), then the subject
//! claim (`sasl.oauthbearer.sub.claim.name`, the principal) and the scope claim
//! (`sasl.oauthbearer.scope.claim.name`). Algorithms: RS256/384/512, PS256/384/512,
//! ES256/384 and EdDSA; `none` and the HMAC algorithms are refused (a JWKS publishes public
//! keys).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use parking_lot::{Mutex, RwLock};
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, Notify};

use super::oauthbearer::{decode_part, TokenError, ValidToken};

/// The largest JWKS document read, bytes.
pub const MAX_JWKS_BYTES: usize = 1 << 20;
/// How long one JWKS request may take, ms.
pub const JWKS_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// How often a JWKS file is checked for changes, ms.
pub const JWKS_FILE_CHECK_INTERVAL_MS: u64 = 1_000;
/// Kafka's `RefreshingHttpsJwks.MISSING_KEY_ID_CACHE_IN_FLIGHT_MS`: how long an unknown `kid`
/// waits before it may ask for another early refresh, ms.
pub const MISSING_KEY_ID_CACHE_IN_FLIGHT_MS: i64 = 60_000;
/// Kafka's `MISSING_KEY_ID_CACHE_MAX_ENTRIES`.
const MISSING_KEY_ID_CACHE_MAX_ENTRIES: usize = 16;
/// Kafka's `MISSING_KEY_ID_MAX_KEY_LENGTH`: a longer `kid` never asks for a refresh.
const MISSING_KEY_ID_MAX_KEY_LENGTH: usize = 1000;

/// The claim checks of a listener (Kafka's `sasl.oauthbearer.*` broker keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedJwtConfig {
    /// `sasl.oauthbearer.clock.skew.seconds` (default 30).
    pub clock_skew_seconds: i64,
    /// `sasl.oauthbearer.expected.audience`: comma-separated; empty: a token must have no
    /// `aud` claim.
    pub expected_audience: Vec<String>,
    /// `sasl.oauthbearer.expected.issuer`.
    pub expected_issuer: Option<String>,
    /// `sasl.oauthbearer.scope.claim.name` (default `scope`).
    pub scope_claim_name: String,
    /// `sasl.oauthbearer.sub.claim.name` (default `sub`): the principal.
    pub sub_claim_name: String,
}

impl Default for SignedJwtConfig {
    fn default() -> Self {
        Self {
            clock_skew_seconds: 30,
            expected_audience: Vec::new(),
            expected_issuer: None,
            scope_claim_name: "scope".into(),
            sub_claim_name: "sub".into(),
        }
    }
}

/// Where the JWKS comes from (`sasl.oauthbearer.jwks.endpoint.url`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksLocation {
    /// A `file:` URL: read at start, re-read when its modification time or length changes.
    File(PathBuf),
    /// An `http://` or `https://` URL, fetched with GET.
    Http {
        /// The URL.
        url: String,
        /// For https: the CA certificates (PEM file) to trust, from the JAAS option
        /// `ssl.truststore.location`; none: the system's CA certificates.
        truststore: Option<PathBuf>,
    },
}

/// How an http(s) JWKS is refreshed (Kafka's `sasl.oauthbearer.jwks.endpoint.*` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JwksRefresh {
    /// `sasl.oauthbearer.jwks.endpoint.refresh.ms` (default 3600000).
    pub refresh_ms: u64,
    /// `sasl.oauthbearer.jwks.endpoint.retry.backoff.ms` (default 100): the first wait after a
    /// failed fetch, doubled after each failure.
    pub retry_backoff_ms: u64,
    /// `sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms` (default 10000): the longest wait,
    /// and how long a refresh retries in all.
    pub retry_backoff_max_ms: u64,
}

impl Default for JwksRefresh {
    fn default() -> Self {
        Self {
            refresh_ms: 3_600_000,
            retry_backoff_ms: 100,
            retry_backoff_max_ms: 10_000,
        }
    }
}

/// Why a JWKS cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    /// The file or URL cannot be read.
    #[error("cannot read the JWKS from {location}: {message}")]
    Read {
        /// The file or URL.
        location: String,
        /// Why.
        message: String,
    },
    /// The document is not a JWKS.
    #[error("the JWKS from {location} is not valid: {message}")]
    Invalid {
        /// The file or URL.
        location: String,
        /// Why.
        message: String,
    },
}

/// The verification keys of a listener, kept current by [`VerificationKeys::run`].
pub struct VerificationKeys {
    location: JwksLocation,
    refresh: JwksRefresh,
    tls: Option<Arc<rustls::ClientConfig>>,
    keys: RwLock<Arc<Vec<Jwk>>>,
    /// The JWKS file's (modification time, length) when last read.
    file_stamp: Mutex<Option<(SystemTime, u64)>>,
    /// `kid`s that asked for an early refresh, with when they may ask again (ms).
    missing_key_ids: Mutex<Vec<(String, i64)>>,
    expedite: Notify,
}

impl std::fmt::Debug for VerificationKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerificationKeys")
            .field("location", &self.location)
            .field("keys", &self.keys.read().len())
            .finish_non_exhaustive()
    }
}

fn parse_jwks(location: &str, bytes: &[u8]) -> Result<Vec<Jwk>, JwksError> {
    let invalid = |message: String| JwksError::Invalid {
        location: location.to_string(),
        message,
    };
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
    let Some(Value::Array(keys)) = doc.get("keys") else {
        return Err(invalid("no \"keys\" array".into()));
    };
    // A key of a type gregor cannot use is skipped, as jose4j's JsonWebKeySet does.
    Ok(keys
        .iter()
        .filter_map(|k| match serde_json::from_value::<Jwk>(k.clone()) {
            Ok(jwk) => Some(jwk),
            Err(e) => {
                tracing::debug!(%location, error = %e, "skipping a JWK gregor cannot use");
                None
            }
        })
        .collect())
}

fn file_stamp(path: &PathBuf) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl VerificationKeys {
    /// Reads the JWKS once (Kafka's resolver `init()`: a broker whose JWKS cannot be read does
    /// not start).
    ///
    /// # Errors
    /// [`JwksError`] when the file or URL cannot be read or is not a JWKS.
    pub async fn load(
        location: JwksLocation,
        refresh: JwksRefresh,
    ) -> Result<Arc<Self>, JwksError> {
        let tls = match &location {
            JwksLocation::Http { url, truststore } if url.starts_with("https://") => {
                Some(Arc::new(https_client_config(url, truststore.as_ref())?))
            }
            _ => None,
        };
        let this = Arc::new(Self {
            location,
            refresh,
            tls,
            keys: RwLock::new(Arc::new(Vec::new())),
            file_stamp: Mutex::new(None),
            missing_key_ids: Mutex::new(Vec::new()),
            expedite: Notify::new(),
        });
        let keys = this.fetch().await?;
        *this.keys.write() = Arc::new(keys);
        Ok(this)
    }

    /// The file or URL, for messages.
    pub fn location(&self) -> String {
        match &self.location {
            JwksLocation::File(p) => format!("file:{}", p.display()),
            JwksLocation::Http { url, .. } => url.clone(),
        }
    }

    /// The keys now.
    pub fn keys(&self) -> Arc<Vec<Jwk>> {
        self.keys.read().clone()
    }

    async fn fetch(&self) -> Result<Vec<Jwk>, JwksError> {
        let location = self.location();
        let read = |message: String| JwksError::Read {
            location: location.clone(),
            message,
        };
        let bytes = match &self.location {
            JwksLocation::File(path) => {
                let stamp = file_stamp(path);
                let bytes = tokio::fs::read(path)
                    .await
                    .map_err(|e| read(e.to_string()))?;
                if bytes.len() > MAX_JWKS_BYTES {
                    return Err(read(format!("larger than {MAX_JWKS_BYTES} bytes")));
                }
                *self.file_stamp.lock() = stamp;
                bytes
            }
            JwksLocation::Http { url, .. } => tokio::time::timeout(
                Duration::from_millis(JWKS_REQUEST_TIMEOUT_MS),
                http_get(url, self.tls.clone()),
            )
            .await
            .map_err(|_| read(format!("no answer within {JWKS_REQUEST_TIMEOUT_MS} ms")))?
            .map_err(read)?,
        };
        parse_jwks(&location, &bytes)
    }

    /// Asks for an early refresh because no key fits `kid` (Kafka's
    /// `RefreshingHttpsJwks.maybeExpediteRefresh`); false when this `kid` asked less than
    /// [`MISSING_KEY_ID_CACHE_IN_FLIGHT_MS`] ago or is too long to remember.
    pub fn maybe_expedite_refresh(&self, kid: &str, now_ms: i64) -> bool {
        if kid.len() > MISSING_KEY_ID_MAX_KEY_LENGTH {
            return false;
        }
        let mut missing = self.missing_key_ids.lock();
        if let Some(i) = missing.iter().position(|(k, _)| k == kid) {
            if missing[i].1 > now_ms {
                return false;
            }
            missing.remove(i);
        }
        if missing.len() >= MISSING_KEY_ID_CACHE_MAX_ENTRIES {
            missing.remove(0);
        }
        missing.push((kid.to_string(), now_ms + MISSING_KEY_ID_CACHE_IN_FLIGHT_MS));
        drop(missing);
        self.expedite.notify_one();
        true
    }

    /// Keeps the keys current until `shutdown`: an http(s) JWKS every `refresh_ms` (retrying
    /// with backoff; a refresh that fails keeps the old keys), a file whenever it changes; both
    /// at once when [`Self::maybe_expedite_refresh`] asks.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let period_ms = match self.location {
            JwksLocation::File(_) => JWKS_FILE_CHECK_INTERVAL_MS,
            JwksLocation::Http { .. } => self.refresh.refresh_ms.max(1),
        };
        loop {
            let expedited = tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(period_ms)) => false,
                () = self.expedite.notified() => true,
                _ = shutdown.changed() => return,
            };
            if let JwksLocation::File(path) = &self.location {
                if !expedited && file_stamp(path) == *self.file_stamp.lock() {
                    continue;
                }
            }
            let mut wait_ms = self.refresh.retry_backoff_ms.max(1);
            let deadline = tokio::time::Instant::now()
                + Duration::from_millis(self.refresh.retry_backoff_max_ms);
            loop {
                match self.fetch().await {
                    Ok(keys) => {
                        self.missing_key_ids.lock().retain(|(kid, _)| {
                            !keys.iter().any(|k| k.common.key_id.as_deref() == Some(kid))
                        });
                        tracing::info!(location = %self.location(), keys = keys.len(), "JWKS refreshed");
                        *self.keys.write() = Arc::new(keys);
                        break;
                    }
                    Err(e)
                        if tokio::time::Instant::now() + Duration::from_millis(wait_ms)
                            > deadline =>
                    {
                        tracing::warn!(error = %e, "JWKS refresh failed; the listener keeps its current verification keys");
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, wait_ms, "JWKS refresh failed; retrying");
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
                            _ = shutdown.changed() => return,
                        }
                        wait_ms = (wait_ms * 2).min(self.refresh.retry_backoff_max_ms.max(1));
                    }
                }
            }
        }
    }
}

fn https_client_config(
    url: &str,
    truststore: Option<&PathBuf>,
) -> Result<rustls::ClientConfig, JwksError> {
    let read = |message: String| JwksError::Read {
        location: url.to_string(),
        message,
    };
    let roots = match truststore {
        Some(path) => crate::tls::load_truststore(&crate::tls::TrustStore::File(path.clone()))
            .map_err(|e| read(e.to_string()))?,
        None => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = rustls::RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(read(
                    "no CA certificate found on this system; set ssl.truststore.location in the JAAS options".into(),
                ));
            }
            roots
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| read(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// GET `url` (HTTP/1.1), the body of a 2xx answer, at most [`MAX_JWKS_BYTES`].
async fn http_get(url: &str, tls: Option<Arc<rustls::ClientConfig>>) -> Result<Vec<u8>, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("malformed URL: {e}"))?;
    let https = uri.scheme_str() == Some("https");
    let host = uri.host().ok_or("no host in the URL")?.to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let authority = uri
        .authority()
        .map_or_else(|| host.clone(), |a| a.as_str().to_string());
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let host_for_connect = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = tokio::net::TcpStream::connect((host_for_connect, port))
        .await
        .map_err(|e| e.to_string())?;
    match tls {
        Some(config) if https => {
            let name = rustls_pki_types::ServerName::try_from(host_for_connect.to_string())
                .map_err(|e| e.to_string())?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS: {e}"))?;
            send(stream, request).await
        }
        _ if https => Err("https without a TLS configuration".into()),
        _ => send(tcp, request).await,
    }
}

async fn send<S>(stream: S, request: hyper::Request<Empty<Bytes>>) -> Result<Vec<u8>, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("HTTP status {}", response.status()));
        }
        Limited::new(response.into_body(), MAX_JWKS_BYTES)
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .map_err(|e| e.to_string())
    }
    .await;
    conn.abort();
    result
}

/// A listener's signed-token validator: the claim checks and the keys.
#[derive(Debug)]
pub struct SignedJwtValidator {
    /// The claim checks.
    pub config: SignedJwtConfig,
    /// The verification keys.
    pub keys: Arc<VerificationKeys>,
}

fn fail(description: impl Into<String>) -> TokenError {
    TokenError {
        description: description.into(),
        failure_scope: None,
    }
}

/// Whether `jwk` can verify `alg` (key type, curve, `use` and `alg` members). Never hand a
/// key of another family to jsonwebtoken: it panics on some mismatches.
fn key_fits(jwk: &Jwk, alg: Algorithm) -> bool {
    let family = match (&jwk.algorithm, alg) {
        (
            AlgorithmParameters::RSA(_),
            Algorithm::RS256
            | Algorithm::RS384
            | Algorithm::RS512
            | Algorithm::PS256
            | Algorithm::PS384
            | Algorithm::PS512,
        ) => true,
        (AlgorithmParameters::EllipticCurve(p), Algorithm::ES256) => p.curve == EllipticCurve::P256,
        (AlgorithmParameters::EllipticCurve(p), Algorithm::ES384) => p.curve == EllipticCurve::P384,
        (AlgorithmParameters::OctetKeyPair(p), Algorithm::EdDSA) => {
            p.curve == EllipticCurve::Ed25519
        }
        _ => false,
    };
    family
        && matches!(
            jwk.common.public_key_use,
            None | Some(PublicKeyUse::Signature)
        )
        && jwk
            .common
            .key_algorithm
            .is_none_or(|a| a.to_string() == format!("{alg:?}"))
}

fn numeric_date(
    claims: &Map<String, Value>,
    name: &str,
    what: &str,
) -> Result<Option<i64>, TokenError> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)) {
            Some(v) => Ok(Some(v)),
            None => Err(fail(format!(
                "The value of the '{name}' claim is not the expected type ({what} NumericDate)"
            ))),
        },
        Some(v) => Err(fail(format!(
            "The value of the '{name}' claim is not the expected type ({v} - {what})"
        ))),
    }
}

impl SignedJwtValidator {
    /// Validates `token` at `now_ms`.
    ///
    /// # Errors
    /// [`TokenError`] with the reason, worded as Kafka's `ValidateException` ("Could not
    /// validate the access token: ...").
    pub fn validate(&self, token: &str, now_ms: i64) -> Result<ValidToken, TokenError> {
        self.validate_inner(token, now_ms).map_err(|e| TokenError {
            description: format!("Could not validate the access token: {}", e.description),
            failure_scope: None,
        })
    }

    fn validate_inner(&self, token: &str, now_ms: i64) -> Result<ValidToken, TokenError> {
        let parts: Vec<&str> = token.split('.').collect();
        if parts.len() != 3 {
            return Err(fail(format!(
                "Invalid JWS Compact Serialization: expected 3 parts, found {}",
                parts.len()
            )));
        }
        let header_json = decode_part(parts[0])?;
        let header = jsonwebtoken::decode_header(token).map_err(|e| {
            if header_json.get("alg").and_then(Value::as_str) == Some("none") {
                fail("'none' is a disallowed JWS algorithm")
            } else {
                fail(format!("Unable to process JOSE header: {e}"))
            }
        })?;
        if matches!(
            header.alg,
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512
        ) {
            return Err(fail(format!(
                "{:?} is a symmetric algorithm; a JWKS verifies public-key signatures only",
                header.alg
            )));
        }
        let claims = decode_part(parts[1])?;
        let keys = self.keys.keys();
        let candidates: Vec<&Jwk> = keys
            .iter()
            .filter(|k| match (&header.kid, &k.common.key_id) {
                (Some(kid), Some(key_id)) => kid == key_id,
                _ => true,
            })
            .filter(|k| key_fits(k, header.alg))
            .collect();
        let header_text = serde_json::to_string(&header_json).unwrap_or_default();
        if candidates.is_empty() {
            if let Some(kid) = &header.kid {
                if self.keys.maybe_expedite_refresh(kid, now_ms) {
                    tracing::debug!(location = %self.keys.location(), %kid, "refreshing the JWKS: no key for this kid");
                }
            }
            return Err(fail(format!(
                "Unable to find a suitable verification key for JWS w/ header {header_text} from JWKs obtained from {}",
                self.keys.location()
            )));
        }
        let message = format!("{}.{}", parts[0], parts[1]);
        let verified = candidates.iter().any(|jwk| {
            DecodingKey::from_jwk(jwk).is_ok_and(|key| {
                jsonwebtoken::crypto::verify(parts[2], message.as_bytes(), &key, header.alg)
                    .unwrap_or(false)
            })
        });
        if !verified {
            return Err(fail(format!(
                "JWS signature is invalid: JsonWebSignature{{header={header_text}}}"
            )));
        }
        self.check_claims(&claims, now_ms)
    }

    fn check_claims(
        &self,
        claims: &Map<String, Value>,
        now_ms: i64,
    ) -> Result<ValidToken, TokenError> {
        let c = &self.config;
        let skew = c.clock_skew_seconds;
        let now = now_ms.div_euclid(1000);
        let exp = numeric_date(claims, "exp", "exp")?
            .ok_or_else(|| fail("No Expiration Time (exp) claim present."))?;
        let iat = numeric_date(claims, "iat", "iat")?;
        if iat.is_none() {
            return Err(fail("No Issued At (iat) claim present."));
        }
        if now - skew >= exp {
            return Err(fail(format!(
                "The JWT is no longer valid - the evaluation time NumericDate{{{now}}} is on or after the Expiration Time (exp=NumericDate{{{exp}}}) claim value (even when providing {skew} seconds of leeway to account for clock skew)."
            )));
        }
        if let Some(nbf) = numeric_date(claims, "nbf", "nbf")? {
            if now + skew < nbf {
                return Err(fail(format!(
                    "The JWT is not yet valid as the evaluation time NumericDate{{{now}}} is before the Not Before (nbf=NumericDate{{{nbf}}}) claim time (even when providing {skew} seconds of leeway to account for clock skew)."
                )));
            }
        }
        if let Some(expected) = &c.expected_issuer {
            match claims.get("iss") {
                None => {
                    return Err(fail(format!(
                        "No Issuer (iss) claim present but was expecting {expected}"
                    )))
                }
                Some(Value::String(iss)) if iss == expected => {}
                Some(iss) => {
                    return Err(fail(format!(
                    "Issuer (iss) claim value ({iss}) doesn't match expected value of {expected}"
                )))
                }
            }
        }
        let audience: Option<Vec<&str>> = match claims.get("aud") {
            None => None,
            Some(Value::String(a)) => Some(vec![a.as_str()]),
            Some(Value::Array(a)) => Some(a.iter().filter_map(Value::as_str).collect()),
            Some(v) => {
                return Err(fail(format!(
                    "The value of the 'aud' claim is not the expected type ({v})"
                )))
            }
        };
        match (&audience, c.expected_audience.is_empty()) {
            (None, false) => return Err(fail("No Audience (aud) claim present.")),
            (Some(aud), true) => {
                return Err(fail(format!(
                    "Audience (aud) claim {aud:?} present in the JWT but no expected audience value(s) were provided to the JWT Consumer. Expected one of [] as an aud value."
                )))
            }
            (Some(aud), false) => {
                if !aud.iter().any(|a| c.expected_audience.iter().any(|e| e == a)) {
                    return Err(fail(format!(
                        "Audience (aud) claim {aud:?} doesn't contain an acceptable identifier. Expected one of {:?} as an aud value.",
                        c.expected_audience
                    )));
                }
            }
            (None, true) => {}
        }
        // Kafka's ClaimValidationUtils: scope elements and the subject must not be blank.
        let scope_name = &c.scope_claim_name;
        let scopes: Vec<&Value> = match claims.get(scope_name) {
            Some(Value::String(_)) => claims.get(scope_name).into_iter().collect(),
            Some(Value::Array(a)) => a.iter().collect(),
            _ => Vec::new(),
        };
        for s in scopes {
            match s.as_str() {
                Some(s) if !s.trim().is_empty() => {}
                _ => {
                    return Err(fail(format!(
                        "{scope_name} value must not contain only whitespace"
                    )))
                }
            }
        }
        let sub_name = &c.sub_claim_name;
        let sub = match claims.get(sub_name) {
            None => return Err(fail(format!("{sub_name} value must be non-null"))),
            Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
            Some(Value::String(_)) => {
                return Err(fail(format!(
                    "{sub_name} value must not contain only whitespace"
                )))
            }
            Some(v) => {
                return Err(fail(format!(
                    "The value of the '{sub_name}' claim is not the expected type ({v} - String)"
                )))
            }
        };
        Ok(ValidToken {
            principal_name: sub,
            lifetime_ms: exp.saturating_mul(1000),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use jsonwebtoken::{EncodingKey, Header};

    /// An ES256 key made now: its signing key and its JWK.
    fn es256_key(kid: &str) -> (EncodingKey, Value) {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let point = kp.public_key_raw();
        let jwk = serde_json::json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "kid": kid,
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        });
        (EncodingKey::from_ec_der(&kp.serialize_der()), jwk)
    }

    fn token(key: &EncodingKey, alg: Algorithm, kid: Option<&str>, claims: &Value) -> String {
        let mut h = Header::new(alg);
        h.kid = kid.map(String::from);
        jsonwebtoken::encode(&h, claims, key).unwrap()
    }

    const NOW_MS: i64 = 1_700_000_000_000;

    fn claims(extra: &Value) -> Value {
        let mut c = serde_json::json!({"sub": "alice", "iat": 1_700_000_000, "exp": 1_700_000_600});
        if let (Value::Object(c), Value::Object(e)) = (&mut c, extra) {
            for (k, v) in e {
                c.insert(k.clone(), v.clone());
            }
        }
        c
    }

    async fn validator_from_file(
        jwks: &Value,
        config: SignedJwtConfig,
    ) -> (tempfile::TempDir, SignedJwtValidator) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, jwks.to_string()).unwrap();
        let keys = VerificationKeys::load(JwksLocation::File(path), JwksRefresh::default())
            .await
            .unwrap();
        (dir, SignedJwtValidator { config, keys })
    }

    #[tokio::test]
    async fn es256_token_from_a_file_jwks_and_the_claim_checks() {
        let (key, jwk) = es256_key("k1");
        let (other_key, _) = es256_key("k1");
        let config = SignedJwtConfig {
            expected_audience: vec!["kafka".into()],
            expected_issuer: Some("https://idp.test".into()),
            ..Default::default()
        };
        let (_dir, v) = validator_from_file(&serde_json::json!({"keys": [jwk]}), config).await;
        let good = serde_json::json!({"aud": ["x", "kafka"], "iss": "https://idp.test"});
        let t = token(&key, Algorithm::ES256, Some("k1"), &claims(&good));
        let ok = v.validate(&t, NOW_MS).unwrap();
        assert_eq!(ok.principal_name, "alice");
        assert_eq!(ok.lifetime_ms, 1_700_000_600_000);
        // Without a kid the key is found by type.
        let t = token(&key, Algorithm::ES256, None, &claims(&good));
        assert!(v.validate(&t, NOW_MS).is_ok());

        let refused = |t: String, why: &str| {
            let e = v.validate(&t, NOW_MS).unwrap_err();
            assert!(
                e.description
                    .starts_with("Could not validate the access token: ")
                    && e.description.contains(why),
                "{why}: {}",
                e.description
            );
        };
        // Signed by another key under the same kid.
        refused(
            token(&other_key, Algorithm::ES256, Some("k1"), &claims(&good)),
            "signature is invalid",
        );
        // A tampered payload.
        let t = token(&key, Algorithm::ES256, Some("k1"), &claims(&good));
        let parts: Vec<&str> = t.split('.').collect();
        let forged = URL_SAFE_NO_PAD.encode(
            claims(&serde_json::json!({"sub": "admin", "aud": "kafka", "iss": "https://idp.test"}))
                .to_string(),
        );
        refused(
            format!("{}.{forged}.{}", parts[0], parts[2]),
            "signature is invalid",
        );
        refused(
            token(
                &key,
                Algorithm::ES256,
                Some("k1"),
                &claims(&serde_json::json!({"aud": "other", "iss": "https://idp.test"})),
            ),
            "Audience",
        );
        refused(
            token(
                &key,
                Algorithm::ES256,
                Some("k1"),
                &claims(&serde_json::json!({"iss": "https://idp.test"})),
            ),
            "No Audience",
        );
        refused(
            token(
                &key,
                Algorithm::ES256,
                Some("k1"),
                &claims(&serde_json::json!({"aud": "kafka", "iss": "https://evil.test"})),
            ),
            "Issuer",
        );
        // Expired beyond the 30 s of skew; within it passes.
        let expired =
            serde_json::json!({"aud": "kafka", "iss": "https://idp.test", "exp": 1_699_999_960});
        refused(
            token(&key, Algorithm::ES256, Some("k1"), &claims(&expired)),
            "no longer valid",
        );
        let skewed =
            serde_json::json!({"aud": "kafka", "iss": "https://idp.test", "exp": 1_699_999_990});
        assert!(v
            .validate(
                &token(&key, Algorithm::ES256, Some("k1"), &claims(&skewed)),
                NOW_MS
            )
            .is_ok());
        let early =
            serde_json::json!({"aud": "kafka", "iss": "https://idp.test", "nbf": 1_700_000_100});
        refused(
            token(&key, Algorithm::ES256, Some("k1"), &claims(&early)),
            "not yet valid",
        );
        let mut no_iat = claims(&good);
        no_iat.as_object_mut().unwrap().remove("iat");
        refused(
            token(&key, Algorithm::ES256, Some("k1"), &no_iat),
            "Issued At",
        );
        let mut no_sub = claims(&good);
        no_sub.as_object_mut().unwrap().remove("sub");
        refused(
            token(&key, Algorithm::ES256, Some("k1"), &no_sub),
            "sub value must be non-null",
        );
        // alg none, HMAC (with the JWK's coordinates as the secret), junk.
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(claims(&good).to_string())
        );
        refused(none, "none");
        let hs = token(
            &EncodingKey::from_secret(b"k"),
            Algorithm::HS256,
            Some("k1"),
            &claims(&good),
        );
        refused(hs, "symmetric");
        for junk in ["", "a.b", "!!.!!.!!", "e30.e30.AA"] {
            assert!(v.validate(junk, NOW_MS).is_err(), "{junk}");
        }
    }

    #[tokio::test]
    async fn a_token_without_aud_is_required_when_no_audience_is_expected() {
        let (key, jwk) = es256_key("k1");
        let (_dir, v) = validator_from_file(
            &serde_json::json!({"keys": [jwk]}),
            SignedJwtConfig::default(),
        )
        .await;
        let t = token(
            &key,
            Algorithm::ES256,
            Some("k1"),
            &claims(&serde_json::json!({"aud": "kafka"})),
        );
        assert!(v
            .validate(&t, NOW_MS)
            .unwrap_err()
            .description
            .contains("no expected audience"));
        let t = token(
            &key,
            Algorithm::ES256,
            Some("k1"),
            &claims(&serde_json::json!({"user": "bob"})),
        );
        assert_eq!(v.validate(&t, NOW_MS).unwrap().principal_name, "alice");
        let (_dir, v) = validator_from_file(
            &serde_json::json!({"keys": [es256_key("k1").1]}),
            SignedJwtConfig {
                sub_claim_name: "user".into(),
                ..Default::default()
            },
        )
        .await;
        // Another key now: a bad signature, whatever the claims.
        assert!(v.validate(&t, NOW_MS).is_err());
    }

    #[tokio::test]
    async fn rs256_token_with_a_key_made_by_openssl() {
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join("rsa.pem");
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            out.stdout
        };
        let pem_s = pem.to_str().unwrap();
        run(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            pem_s,
        ]);
        let der = run(&["rsa", "-in", pem_s, "-outform", "DER", "-traditional"]);
        let modulus = String::from_utf8(run(&["rsa", "-in", pem_s, "-noout", "-modulus"])).unwrap();
        let n: Vec<u8> = (0..modulus.trim().len() - "Modulus=".len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&modulus.trim()["Modulus=".len() + i..][..2], 16).unwrap())
            .collect();
        let jwk = serde_json::json!({"kty": "RSA", "kid": "r1", "alg": "RS256", "n": URL_SAFE_NO_PAD.encode(&n), "e": "AQAB"});
        let (_d, v) = validator_from_file(
            &serde_json::json!({"keys": [jwk]}),
            SignedJwtConfig::default(),
        )
        .await;
        let key = EncodingKey::from_rsa_der(&der);
        let t = token(&key, Algorithm::RS256, Some("r1"), &claims(&Value::Null));
        assert_eq!(v.validate(&t, NOW_MS).unwrap().principal_name, "alice");
        // The JWK says RS256: another algorithm with the same key is refused.
        let t = token(&key, Algorithm::RS512, Some("r1"), &claims(&Value::Null));
        assert!(v
            .validate(&t, NOW_MS)
            .unwrap_err()
            .description
            .contains("suitable verification key"));
        // An EC token under the RSA key's kid finds no key of its type.
        let (ec, _) = es256_key("r1");
        assert!(v
            .validate(
                &token(&ec, Algorithm::ES256, Some("r1"), &claims(&Value::Null)),
                NOW_MS
            )
            .is_err());
    }

    /// Waits until `f` holds (at most 20 s).
    async fn eventually(mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "condition not met in time"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_changed_jwks_file_is_read_again() {
        let (k1, j1) = es256_key("k1");
        let (k2, j2) = es256_key("k2");
        let (dir, v) = validator_from_file(
            &serde_json::json!({"keys": [j1]}),
            SignedJwtConfig::default(),
        )
        .await;
        let (_tx, rx) = watch::channel(false);
        let task = tokio::spawn(v.keys.clone().run(rx));
        let now = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64
        };
        let c = serde_json::json!({"sub": "alice", "iat": now() / 1000, "exp": now() / 1000 + 600});
        let t1 = token(&k1, Algorithm::ES256, Some("k1"), &c);
        let t2 = token(&k2, Algorithm::ES256, Some("k2"), &c);
        assert!(v.validate(&t1, now()).is_ok());
        assert!(v.validate(&t2, now()).is_err());
        // A rotation: k2 replaces k1 (the length changes with the kid too).
        std::fs::write(
            dir.path().join("jwks.json"),
            serde_json::json!({"keys": [j2, {"kty": "unknown"}]}).to_string(),
        )
        .unwrap();
        eventually(|| v.validate(&t2, now()).is_ok()).await;
        assert!(v.validate(&t1, now()).is_err());
        // A file that is no JWKS any more keeps the keys.
        std::fs::write(dir.path().join("jwks.json"), "{not json").unwrap();
        tokio::time::sleep(Duration::from_millis(2 * JWKS_FILE_CHECK_INTERVAL_MS)).await;
        assert!(v.validate(&t2, now()).is_ok());
        task.abort();
    }

    /// A JWKS endpoint on 127.0.0.1 that answers every GET with the current document and
    /// counts the requests.
    async fn jwks_server(
        doc: Arc<Mutex<String>>,
        hits: Arc<std::sync::atomic::AtomicUsize>,
    ) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let doc = doc.clone();
                let hits = hits.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let body = doc.lock().clone();
                    let resp = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                    let _ = s.write_all(resp.as_bytes()).await;
                });
            }
        });
        format!("http://{addr}/.well-known/jwks.json")
    }

    #[tokio::test]
    async fn an_unknown_kid_refreshes_an_http_jwks_once() {
        let (k1, j1) = es256_key("k1");
        let (k2, j2) = es256_key("k2");
        let doc = Arc::new(Mutex::new(serde_json::json!({"keys": [j1]}).to_string()));
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let url = jwks_server(doc.clone(), hits.clone()).await;
        let keys = VerificationKeys::load(
            JwksLocation::Http {
                url,
                truststore: None,
            },
            JwksRefresh {
                refresh_ms: 3_600_000,
                retry_backoff_ms: 10,
                retry_backoff_max_ms: 1000,
            },
        )
        .await
        .unwrap();
        let v = SignedJwtValidator {
            config: SignedJwtConfig::default(),
            keys,
        };
        let (_tx, rx) = watch::channel(false);
        let task = tokio::spawn(v.keys.clone().run(rx));
        let c = claims(&Value::Null);
        assert!(v
            .validate(&token(&k1, Algorithm::ES256, Some("k1"), &c), NOW_MS)
            .is_ok());
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The provider rotates to k2: the first k2 token is refused and asks for a refresh.
        *doc.lock() = serde_json::json!({"keys": [j2]}).to_string();
        let t2 = token(&k2, Algorithm::ES256, Some("k2"), &c);
        assert!(v.validate(&t2, NOW_MS).is_err());
        eventually(|| v.validate(&t2, NOW_MS).is_ok()).await;
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 2);
        // An unknown kid asks once a minute at most.
        let (k3, _) = es256_key("k3");
        let t3 = token(&k3, Algorithm::ES256, Some("k3"), &c);
        assert!(v.validate(&t3, NOW_MS).is_err());
        eventually(|| hits.load(std::sync::atomic::Ordering::SeqCst) == 3).await;
        assert!(v.validate(&t3, NOW_MS + 1000).is_err());
        assert!(!v.keys.maybe_expedite_refresh("k3", NOW_MS + 1000));
        assert!(v
            .keys
            .maybe_expedite_refresh("k3", NOW_MS + MISSING_KEY_ID_CACHE_IN_FLIGHT_MS));
        assert!(!v.keys.maybe_expedite_refresh(&"x".repeat(1001), NOW_MS));
        task.abort();
        // A JWKS that cannot be fetched stops the start.
        let err = VerificationKeys::load(
            JwksLocation::Http {
                url: "http://127.0.0.1:1/jwks".into(),
                truststore: None,
            },
            JwksRefresh::default(),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("cannot read the JWKS"), "{err}");
    }
}
