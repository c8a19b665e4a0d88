//! The client side of gregor's own connections (replica fetchers, transaction markers and
//! verification, the controller channel, the raft transport): one connector,
//! [`ClientSecurity`], that opens a TCP connection to a listener of another node and runs what
//! the listener's security protocol asks for, as Kafka's `ChannelBuilders.clientChannelBuilder`
//! with the listener's config:
//!
//! - **TLS** (`SSL`, `SASL_SSL`): the server certificate is verified against the listener's
//!   truststore, and against the host connected to unless `ssl.endpoint.identification.algorithm`
//!   is empty (Kafka's default `https` checks it); the listener's keystore is offered when the
//!   server asks for a client certificate (mTLS). Both stores are re-read when their files
//!   change, at the next connection.
//! - **SASL** (`SASL_PLAINTEXT`, `SASL_SSL`): Kafka's `SaslClientAuthenticator` without the
//!   ApiVersions probe: SaslHandshake v1 with the mechanism, then SaslAuthenticate v2 tokens.
//!   PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, the server's signature is checked) with
//!   a username and password (the broker takes them from the listener's JAAS config, as
//!   Kafka's brokers do).
//!
//! Everything runs within the caller's timeout; a failure is an `io::Error` (kind
//! `PermissionDenied` for an authentication the server refused, `InvalidData` for a protocol
//! violation) and is logged at most 10 lines per 10 s. Callers retry with their backoff.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse,
    SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme, SupportedProtocolVersion};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use subtle::ConstantTimeEq;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tracing::{info, warn};

use crate::context::SecurityProtocol;
use crate::log_limit::LogLimiter;
use crate::sasl::ScramMechanism;
use crate::tls::{
    crypto_provider, load_keystore, load_truststore, stamp_stores, FileStamp, KeyStore, TlsError,
    TrustStore,
};
use crate::transport::Transport;

/// Client connections whose TLS handshake or SASL authentication failed (counter).
pub const CLIENT_AUTHENTICATION_FAILURES_TOTAL: &str =
    "gregor_client_authentication_failures_total";

static FAILURE_LOGS: LogLimiter = LogLimiter::new(10, Duration::from_secs(10));

/// SaslHandshake version sent (v1: the tokens travel in SaslAuthenticate).
const SASL_HANDSHAKE_VERSION: i16 = 1;
/// SaslAuthenticate version sent.
const SASL_AUTHENTICATE_VERSION: i16 = 2;
/// Largest SASL response frame read (bytes).
const MAX_SASL_RESPONSE_BYTES: usize = 64 * 1024;
/// Kafka's `ScramMechanism.minIterations`.
const MIN_SCRAM_ITERATIONS: u32 = 4096;

/// A connected stream: plain TCP or TLS over it.
pub type ClientStream = Box<dyn Transport>;

/// The client-side TLS settings of a listener (Kafka's names).
#[derive(Debug, Clone)]
pub struct ClientTlsSettings {
    /// The CA certificates the server's certificate must chain to (required: gregor has no
    /// system trust store).
    pub truststore: TrustStore,
    /// The certificate chain and key offered when the server asks for one (mTLS).
    pub keystore: Option<KeyStore>,
    /// `ssl.key.password`.
    pub key_password: Option<String>,
    /// `ssl.enabled.protocols` capped by `ssl.protocol`.
    pub protocols: Vec<&'static SupportedProtocolVersion>,
    /// `ssl.cipher.suites`; empty: rustls's defaults.
    pub cipher_suites: Vec<String>,
    /// `ssl.endpoint.identification.algorithm` is `https` (the default): the server
    /// certificate must name the host connected to. Empty: any trusted certificate is taken.
    pub verify_hostname: bool,
}

/// The SASL mechanism and credentials of gregor's client.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientSasl {
    /// PLAIN or a SCRAM mechanism; OAUTHBEARER and GSSAPI are not offered by gregor's client.
    pub mechanism: ClientMechanism,
    /// The user name.
    pub username: String,
    /// The password.
    pub password: String,
}

impl fmt::Debug for ClientSasl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientSasl")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"[hidden]")
            .finish()
    }
}

/// A SASL mechanism gregor's client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientMechanism {
    /// PLAIN.
    Plain,
    /// SCRAM-SHA-256 or SCRAM-SHA-512.
    Scram(ScramMechanism),
}

impl ClientMechanism {
    /// The mechanism of a SASL name, if gregor's client speaks it.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "PLAIN" => Some(Self::Plain),
            n => ScramMechanism::from_mechanism_name(n).map(Self::Scram),
        }
    }

    /// The SASL name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::Scram(m) => m.mechanism_name(),
        }
    }
}

/// How gregor's client connects to one listener of other nodes; cheap to clone.
#[derive(Clone)]
pub struct ClientSecurity {
    protocol: SecurityProtocol,
    listener_name: String,
    tls: Option<Arc<ClientTls>>,
    sasl: Option<Arc<ClientSasl>>,
}

/// The client TLS config of a listener, rebuilt when its keystore or truststore file changes
/// (as the listener's server side, [`crate::tls::TlsServerState::reload_if_changed`]): a
/// certificate rotated in place on disk reaches the certificate gregor's client presents for
/// mTLS and the CAs it trusts with the next connection, without a restart. Files that do not
/// make a config are logged and the previous config stays until they change again.
struct ClientTls {
    settings: ClientTlsSettings,
    current: parking_lot::Mutex<(FileStamp, Arc<ClientConfig>)>,
}

impl ClientTls {
    fn new(settings: &ClientTlsSettings) -> Result<Self, TlsError> {
        let files = stamp_stores(settings.keystore.as_ref(), Some(&settings.truststore));
        let config = Arc::new(build_client_config(settings)?);
        Ok(Self {
            settings: settings.clone(),
            current: parking_lot::Mutex::new((files, config)),
        })
    }

    /// The config for a new connection, rebuilt first if a file changed since it was read.
    fn config(&self, listener_name: &str) -> Arc<ClientConfig> {
        let now = stamp_stores(
            self.settings.keystore.as_ref(),
            Some(&self.settings.truststore),
        );
        let mut current = self.current.lock();
        if current.0 != now {
            current.0 = now;
            match build_client_config(&self.settings) {
                Ok(config) => {
                    current.1 = Arc::new(config);
                    metrics::counter!(crate::tls::TLS_RELOADS_TOTAL, "result" => "ok").increment(1);
                    info!(listener = %listener_name, "gregor's own client reloaded its TLS keystore and truststore; new connections use them");
                }
                Err(e) => {
                    metrics::counter!(crate::tls::TLS_RELOADS_TOTAL, "result" => "failed")
                        .increment(1);
                    warn!(listener = %listener_name, key = e.key, error = %e.message, "gregor's own client cannot use the changed TLS files; it keeps the previous ones until they change again");
                }
            }
        }
        current.1.clone()
    }
}

impl Default for ClientSecurity {
    fn default() -> Self {
        Self::plaintext()
    }
}

impl fmt::Debug for ClientSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientSecurity")
            .field("protocol", &self.protocol)
            .field("listener_name", &self.listener_name)
            .field("tls", &self.tls.is_some())
            .field("sasl", &self.sasl)
            .finish()
    }
}

/// Why a listener's client settings cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientSecurityError {
    /// A TLS setting (the key named) cannot work.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The protocol needs settings that were not given.
    #[error("{0}")]
    Missing(String),
}

impl ClientSecurity {
    /// Plain TCP, no authentication (`PLAINTEXT`).
    pub fn plaintext() -> Self {
        Self {
            protocol: SecurityProtocol::Plaintext,
            listener_name: "PLAINTEXT".into(),
            tls: None,
            sasl: None,
        }
    }

    /// The connector of a listener of `protocol`, reading the truststore and keystore now.
    ///
    /// # Errors
    /// [`ClientSecurityError::Missing`] when `protocol` uses TLS without `tls` or SASL without
    /// `sasl`; [`ClientSecurityError::Tls`] naming the key whose file or value cannot work.
    pub fn new(
        protocol: SecurityProtocol,
        listener_name: &str,
        tls: Option<&ClientTlsSettings>,
        sasl: Option<ClientSasl>,
    ) -> Result<Self, ClientSecurityError> {
        let tls = match (protocol.uses_tls(), tls) {
            (true, Some(t)) => Some(Arc::new(ClientTls::new(t)?)),
            (true, None) => {
                return Err(ClientSecurityError::Missing(format!(
                    "listener {listener_name} ({protocol}) needs client TLS settings"
                )))
            }
            (false, _) => None,
        };
        let sasl = match (protocol.uses_sasl(), sasl) {
            (true, Some(s)) => Some(Arc::new(s)),
            (true, None) => {
                return Err(ClientSecurityError::Missing(format!(
                    "listener {listener_name} ({protocol}) needs a SASL mechanism and credentials"
                )))
            }
            (false, _) => None,
        };
        Ok(Self {
            protocol,
            listener_name: listener_name.to_string(),
            tls,
            sasl,
        })
    }

    /// The listener's security protocol.
    pub fn protocol(&self) -> SecurityProtocol {
        self.protocol
    }

    /// The listener's name.
    pub fn listener_name(&self) -> &str {
        &self.listener_name
    }

    /// Connects to `address` (`host:port`, `[v6]:port`) and runs the listener's TLS handshake
    /// and SASL authentication, all within `timeout`. `client_id` goes in the SASL requests'
    /// headers.
    ///
    /// # Errors
    /// The connect, handshake or authentication error (see the module doc), or `TimedOut`.
    pub async fn connect(
        &self,
        address: &str,
        client_id: &str,
        timeout: Duration,
    ) -> io::Result<ClientStream> {
        match tokio::time::timeout(timeout, self.connect_inner(address, client_id)).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "connecting to {address} ({}) not finished within {} ms",
                    self.protocol,
                    timeout.as_millis()
                ),
            )),
        }
    }

    async fn connect_inner(&self, address: &str, client_id: &str) -> io::Result<ClientStream> {
        let tcp = TcpStream::connect(address).await?;
        let _ = tcp.set_nodelay(true);
        let secured = async {
            let mut stream: ClientStream = match &self.tls {
                None => Box::new(tcp),
                Some(tls) => {
                    let config = tls.config(&self.listener_name);
                    let host = host_of(address);
                    let name = ServerName::try_from(host.to_string()).map_err(|e| {
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!("{host} is not a TLS server name: {e}"),
                        )
                    })?;
                    let tls = tokio_rustls::TlsConnector::from(config)
                        .connect(name, tcp)
                        .await
                        .map_err(|e| {
                            io::Error::new(e.kind(), format!("TLS handshake failed: {e}"))
                        })?;
                    Box::new(tls)
                }
            };
            if let Some(sasl) = &self.sasl {
                authenticate(&mut stream, sasl, client_id).await?;
            }
            Ok::<_, io::Error>(stream)
        };
        match secured.await {
            Ok(s) => Ok(s),
            Err(e) => {
                metrics::counter!(CLIENT_AUTHENTICATION_FAILURES_TOTAL).increment(1);
                if let Some(suppressed) = FAILURE_LOGS.check(Instant::now()) {
                    warn!(%address, listener = %self.listener_name, protocol = %self.protocol, error = %e, suppressed, "gregor's client could not secure a connection; it retries with backoff");
                }
                Err(e)
            }
        }
    }
}

/// The host part of `host:port` or `[v6]:port`.
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Verifies the chain but not the name (`ssl.endpoint.identification.algorithm=`).
#[derive(Debug)]
struct NoHostnameVerification(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for NoHostnameVerification {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::CertificateError as C;
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                C::NotValidForName | C::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The rustls client config of `settings`.
///
/// # Errors
/// [`TlsError`] naming the key that cannot work.
pub fn build_client_config(settings: &ClientTlsSettings) -> Result<ClientConfig, TlsError> {
    let provider = crypto_provider(&settings.cipher_suites)?;
    let roots = Arc::new(load_truststore(&settings.truststore)?);
    let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| TlsError {
            key: "ssl.truststore.location",
            message: e.to_string(),
        })?;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&settings.protocols)
        .map_err(|e| TlsError {
            key: "ssl.cipher.suites",
            message: format!("no cipher suite fits the enabled protocols: {e}"),
        })?;
    let builder = if settings.verify_hostname {
        builder.with_webpki_verifier(verifier)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoHostnameVerification(verifier)))
    };
    let config = match &settings.keystore {
        None => builder.with_no_client_auth(),
        Some(keystore) => {
            let (chain, key) = load_keystore(keystore, settings.key_password.as_deref())?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| TlsError {
                    key: match keystore {
                        KeyStore::File(_) | KeyStore::Pkcs12 { .. } => "ssl.keystore.location",
                        KeyStore::Inline { .. } => "ssl.keystore.key",
                    },
                    message: format!(
                        "the private key does not fit the certificate chain or is unsupported: {e}"
                    ),
                })?
        }
    };
    Ok(config)
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

fn refused(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, message.into())
}

/// One request and its response on `stream` (framing as Kafka's, the frame bounded).
async fn round_trip<Req: Encodable, Resp: Decodable>(
    stream: &mut ClientStream,
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    client_id: &str,
    body: &Req,
) -> io::Result<Resp> {
    let header = RequestHeader::default()
        .with_request_api_key(api_key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_string(client_id.to_string())));
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    header
        .encode(&mut buf, api_key.request_header_version(version))
        .map_err(|e| invalid(e.to_string()))?;
    body.encode(&mut buf, version)
        .map_err(|e| invalid(e.to_string()))?;
    let size = i32::try_from(buf.len() - 4).map_err(|e| invalid(e.to_string()))?;
    buf[0..4].copy_from_slice(&size.to_be_bytes());
    stream.write_all(&buf).await?;
    stream.flush().await?;
    let size = stream.read_i32().await?;
    let size = usize::try_from(size)
        .ok()
        .filter(|s| *s <= MAX_SASL_RESPONSE_BYTES)
        .ok_or_else(|| {
            invalid(format!(
                "{api_key:?} response of {size} bytes (at most {MAX_SASL_RESPONSE_BYTES})"
            ))
        })?;
    let mut frame = vec![0u8; size];
    stream.read_exact(&mut frame).await?;
    let mut frame = Bytes::from(frame);
    let header = ResponseHeader::decode(&mut frame, api_key.response_header_version(version))
        .map_err(|e| invalid(format!("{api_key:?} response header: {e:#}")))?;
    if header.correlation_id != correlation_id {
        return Err(invalid(format!(
            "{api_key:?} response has correlation id {}, expected {correlation_id}",
            header.correlation_id
        )));
    }
    Resp::decode(&mut frame, version).map_err(|e| invalid(format!("{api_key:?} response: {e:#}")))
}

async fn sasl_token(
    stream: &mut ClientStream,
    correlation_id: i32,
    client_id: &str,
    token: Vec<u8>,
) -> io::Result<Vec<u8>> {
    let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token));
    let response: SaslAuthenticateResponse = round_trip(
        stream,
        ApiKey::SaslAuthenticate,
        SASL_AUTHENTICATE_VERSION,
        correlation_id,
        client_id,
        &request,
    )
    .await?;
    if response.error_code != 0 {
        return Err(refused(format!(
            "SASL authentication failed (error code {}): {}",
            response.error_code,
            response.error_message.as_ref().map_or("", |m| m.as_str())
        )));
    }
    Ok(response.auth_bytes.to_vec())
}

/// Kafka's `SaslClientAuthenticator`: SaslHandshake v1, then the mechanism's tokens.
async fn authenticate(
    stream: &mut ClientStream,
    sasl: &ClientSasl,
    client_id: &str,
) -> io::Result<()> {
    let request = SaslHandshakeRequest::default()
        .with_mechanism(StrBytes::from_static_str(sasl.mechanism.name()));
    let response: SaslHandshakeResponse = round_trip(
        stream,
        ApiKey::SaslHandshake,
        SASL_HANDSHAKE_VERSION,
        0,
        client_id,
        &request,
    )
    .await?;
    if response.error_code != 0 {
        let enabled: Vec<&str> = response.mechanisms.iter().map(|m| m.as_str()).collect();
        return Err(refused(format!(
            "the server does not enable SASL mechanism {} (error code {}; enabled: {})",
            sasl.mechanism.name(),
            response.error_code,
            enabled.join(",")
        )));
    }
    match sasl.mechanism {
        ClientMechanism::Plain => {
            // RFC 4616: authzid NUL authcid NUL passwd.
            let mut token = Vec::with_capacity(sasl.username.len() + sasl.password.len() + 2);
            token.push(0);
            token.extend_from_slice(sasl.username.as_bytes());
            token.push(0);
            token.extend_from_slice(sasl.password.as_bytes());
            sasl_token(stream, 1, client_id, token).await?;
            Ok(())
        }
        ClientMechanism::Scram(m) => {
            let mut client = ScramClient::new(m, &sasl.username, &sasl.password);
            let first = client.first_message();
            let server_first = sasl_token(stream, 1, client_id, first).await?;
            let last = client.final_message(&server_first)?;
            let server_final = sasl_token(stream, 2, client_id, last).await?;
            client.verify_server_final(&server_final)
        }
    }
}

/// The client side of one SCRAM exchange (RFC 5802, as Kafka's `ScramSaslClient`).
pub struct ScramClient {
    mechanism: ScramMechanism,
    username: String,
    password: String,
    nonce: String,
    client_first_bare: String,
    expected_server_signature: Vec<u8>,
}

impl ScramClient {
    /// A client for `username` with a random nonce.
    pub fn new(mechanism: ScramMechanism, username: &str, password: &str) -> Self {
        use rand::Rng;
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let mut rng = rand::thread_rng();
        let nonce = (0..24)
            .map(|_| char::from(ALPHABET[rng.gen_range(0..ALPHABET.len())]))
            .collect();
        Self::with_nonce(mechanism, username, password, nonce)
    }

    /// A client with a given nonce (tests).
    pub fn with_nonce(
        mechanism: ScramMechanism,
        username: &str,
        password: &str,
        nonce: String,
    ) -> Self {
        let saslname = username.replace('=', "=3D").replace(',', "=2C");
        Self {
            mechanism,
            username: username.to_string(),
            password: password.to_string(),
            client_first_bare: format!("n={saslname},r={nonce}"),
            nonce,
            expected_server_signature: Vec::new(),
        }
    }

    /// `n,,n=<user>,r=<nonce>`.
    pub fn first_message(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// The client-final message answering `server_first`.
    ///
    /// # Errors
    /// `InvalidData` for a malformed server-first message, a nonce that does not extend
    /// ours, or fewer iterations than Kafka's minimum (4096).
    pub fn final_message(&mut self, server_first: &[u8]) -> io::Result<Vec<u8>> {
        let text = std::str::from_utf8(server_first)
            .map_err(|_| invalid("SCRAM server-first message is not UTF-8"))?;
        let (mut nonce, mut salt, mut iterations) = (None, None, None);
        for part in text.split(',') {
            if let Some(v) = part.strip_prefix("r=") {
                nonce = Some(v);
            } else if let Some(v) = part.strip_prefix("s=") {
                salt = B64.decode(v).ok();
            } else if let Some(v) = part.strip_prefix("i=") {
                iterations = v.parse::<u32>().ok();
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err(invalid(format!(
                "invalid SCRAM server-first message for {}",
                self.username
            )));
        };
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(invalid(
                "SCRAM server nonce does not extend the client nonce",
            ));
        }
        if iterations < MIN_SCRAM_ITERATIONS {
            return Err(invalid(format!(
                "SCRAM iterations {iterations} are less than the minimum {MIN_SCRAM_ITERATIONS}"
            )));
        }
        let m = self.mechanism;
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{text},{without_proof}", self.client_first_bare);
        let salted = m.salted_password(self.password.as_bytes(), &salt, iterations);
        let client_key = m.hmac(&salted, b"Client Key");
        let signature = m.hmac(&m.hash(&client_key), auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        self.expected_server_signature =
            m.hmac(&m.hmac(&salted, b"Server Key"), auth_message.as_bytes());
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Checks the server-final message `v=<signature>` (the server knows the credential).
    ///
    /// # Errors
    /// `PermissionDenied` for `e=<error>` or a wrong signature.
    pub fn verify_server_final(&self, server_final: &[u8]) -> io::Result<()> {
        let text = std::str::from_utf8(server_final)
            .map_err(|_| invalid("SCRAM server-final message is not UTF-8"))?;
        if let Some(e) = text.strip_prefix("e=") {
            return Err(refused(format!("SCRAM authentication failed: {e}")));
        }
        let signature = text
            .strip_prefix("v=")
            .and_then(|v| B64.decode(v).ok())
            .ok_or_else(|| invalid("invalid SCRAM server-final message"))?;
        if self.expected_server_signature.is_empty()
            || !bool::from(signature.ct_eq(&self.expected_server_signature))
        {
            return Err(refused(
                "SCRAM server signature does not match: the server does not know the credential",
            ));
        }
        Ok(())
    }
}

/// A boxed future of a connection (for traits that connect, such as the raft transport's).
pub type ConnectFuture<'a> = Pin<Box<dyn Future<Output = io::Result<ClientStream>> + Send + 'a>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sasl::scram::ScramServer;
    use crate::sasl::{SaslStep, ScramCredential, ScramCredentialStore};

    struct Store(ScramCredential);

    impl ScramCredentialStore for Store {
        fn credential(&self, user: &str, _: ScramMechanism) -> Option<ScramCredential> {
            (user == "alice").then(|| self.0.clone())
        }
    }

    fn exchange(password: &str, m: ScramMechanism) -> Result<(), String> {
        let credential = ScramCredential::from_password(m, b"alice-secret", b"salt", 4096);
        let mut server = ScramServer::new(m, Arc::new(Store(credential)));
        let mut client = ScramClient::new(m, "alice", password);
        let SaslStep::Continue(server_first) = server
            .evaluate(&client.first_message())
            .map_err(|e| format!("{e:?}"))?
        else {
            return Err("no server-first".into());
        };
        let last = client
            .final_message(&server_first)
            .map_err(|e| e.to_string())?;
        match server.evaluate(&last).map_err(|e| format!("{e:?}"))? {
            SaslStep::Complete {
                response,
                authorization_id,
                ..
            } => {
                assert_eq!(authorization_id, "alice");
                client
                    .verify_server_final(&response)
                    .map_err(|e| e.to_string())
            }
            SaslStep::Continue(_) => Err("not complete".into()),
        }
    }

    #[test]
    fn scram_client_logs_in_to_gregors_server_and_wrong_passwords_fail() {
        for m in [ScramMechanism::Sha256, ScramMechanism::Sha512] {
            exchange("alice-secret", m).unwrap();
            assert!(exchange("wrong", m).is_err());
        }
    }

    #[test]
    fn scram_client_refuses_a_forged_server_signature_and_few_iterations() {
        let m = ScramMechanism::Sha256;
        let mut client = ScramClient::with_nonce(m, "a,b=c", "pw", "abc".into());
        assert_eq!(client.first_message(), b"n,,n=a=2Cb=3Dc,r=abc".to_vec());
        let salt = B64.encode(b"salt");
        assert!(client
            .final_message(format!("r=abc,s={salt},i=4096").as_bytes())
            .is_err());
        assert!(client
            .final_message(format!("r=abcX,s={salt},i=100").as_bytes())
            .is_err());
        client
            .final_message(format!("r=abcX,s={salt},i=4096").as_bytes())
            .unwrap();
        let e = client
            .verify_server_final(format!("v={}", B64.encode([0u8; 32])).as_bytes())
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(client.verify_server_final(b"e=invalid-proof").is_err());
    }

    /// A CA and certificates signed by it (rcgen), PEM.
    struct Ca {
        pem: String,
        issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    }

    impl Ca {
        fn new() -> Self {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "test-ca");
            let pem = params.self_signed(&key).unwrap().pem();
            Self {
                pem,
                issuer: rcgen::Issuer::new(params, key),
            }
        }

        /// Key and certificate, PEM, for `cn` (and 127.0.0.1).
        fn issue(&self, cn: &str) -> String {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
            params.distinguished_name = rcgen::DistinguishedName::new();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
            let cert = params.signed_by(&key, &self.issuer).unwrap();
            format!("{}{}", key.serialize_pem(), cert.pem())
        }
    }

    /// Writes `pem` to `path` and moves its modification time `secs` ahead, so a rewrite within
    /// one tick of the file system clock is still seen as a change.
    fn write_keystore(path: &std::path::Path, pem: &str, secs: u64) {
        std::fs::write(path, pem).unwrap();
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(std::time::SystemTime::now() + Duration::from_secs(secs))
            .unwrap();
    }

    #[tokio::test]
    async fn a_keystore_rotated_on_disk_reaches_the_client_certificate_without_a_restart() {
        use crate::tls::{build_server_config, parse_protocols, ClientAuth, TlsSettings};
        let ca = Ca::new();
        let dir = tempfile::tempdir().unwrap();
        // A server that requires a client certificate from the CA and reports its subject.
        let server_keystore = dir.path().join("server.pem");
        std::fs::write(&server_keystore, ca.issue("server")).unwrap();
        let server = build_server_config(&TlsSettings {
            keystore: KeyStore::File(server_keystore),
            key_password: None,
            truststore: Some(TrustStore::Inline(ca.pem.clone())),
            client_auth: ClientAuth::Required,
            protocols: parse_protocols("TLSv1.2,TLSv1.3", "TLSv1.3").unwrap(),
            cipher_suites: Vec::new(),
            principal_mapper: crate::tls::principal::SslPrincipalMapper::default(),
            handshake_timeout_ms: 5_000,
        })
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (subjects, mut seen) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    continue;
                };
                let subject = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| crate::tls::dn::subject_rfc2253(c.as_ref()).unwrap());
                let _ = subjects.send(subject);
            }
        });

        let keystore = dir.path().join("client.pem");
        write_keystore(&keystore, &ca.issue("client-a"), 0);
        let client = ClientSecurity::new(
            SecurityProtocol::Ssl,
            "INTERNAL",
            Some(&ClientTlsSettings {
                truststore: TrustStore::Inline(ca.pem.clone()),
                keystore: Some(KeyStore::File(keystore.clone())),
                key_password: None,
                protocols: parse_protocols("TLSv1.2,TLSv1.3", "TLSv1.3").unwrap(),
                cipher_suites: Vec::new(),
                verify_hostname: true,
            }),
            None,
        )
        .unwrap();
        let mut expect = Vec::new();
        for (cn, pem) in [
            ("CN=client-a", ca.issue("client-a")),
            // Rotated in place: the next connection presents the new certificate.
            ("CN=client-b", ca.issue("client-b")),
            // A broken file is not taken: the last good certificate stays.
            ("CN=client-b", "not a keystore".to_string()),
        ] {
            expect.push(cn);
            write_keystore(&keystore, &pem, 10 * expect.len() as u64);
            let mut s = client
                .connect(&address, "test", Duration::from_secs(10))
                .await
                .unwrap();
            // TLS 1.3: the server checks the certificate after the client's handshake ends.
            s.write_all(b"x").await.unwrap();
            s.flush().await.unwrap();
            assert_eq!(seen.recv().await.unwrap().as_deref(), Some(cn));
        }
    }

    #[test]
    fn host_of_handles_v6_and_names() {
        assert_eq!(host_of("127.0.0.1:9092"), "127.0.0.1");
        assert_eq!(host_of("[::1]:9092"), "::1");
        assert_eq!(host_of("broker-1.example:9093"), "broker-1.example");
    }

    #[test]
    fn protocols_need_their_settings() {
        let e = ClientSecurity::new(SecurityProtocol::SaslSsl, "INTERNAL", None, None).unwrap_err();
        assert!(e.to_string().contains("INTERNAL"), "{e}");
        let e = ClientSecurity::new(SecurityProtocol::SaslPlaintext, "INTERNAL", None, None)
            .unwrap_err();
        assert!(e.to_string().contains("SASL"), "{e}");
        assert!(ClientSecurity::new(SecurityProtocol::Plaintext, "P", None, None).is_ok());
    }
}
