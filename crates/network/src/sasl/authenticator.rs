//! The per-connection SASL state machine, as Kafka's `SaslServerAuthenticator` and the
//! re-authentication parts of `KafkaChannel` (KIP-368).
//!
//! States: waiting for ApiVersions or SaslHandshake; waiting for SaslHandshake (after
//! ApiVersions); exchanging tokens (in SaslAuthenticate requests after SaslHandshake v1+, raw
//! size-prefixed frames after v0); complete. A failure sends its response (if the flow has
//! one) and closes the connection. Once complete, requests go to the handler, except that a
//! connection whose session expired (`connections.max.reauth.ms` or the credential's expiry)
//! is closed at its next request, and a SaslHandshake on a connection with a session
//! expiration starts a re-authentication (at most one per second, as Kafka), which must keep
//! the mechanism and the principal.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use gregor_protocol::error::ErrorCode;
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, RequestHeader, RequestKind, ResponseKind, SaslAuthenticateResponse,
    SaslHandshakeResponse,
};
use gregor_protocol::kafka_protocol::protocol::StrBytes;

use super::{Mechanism, MechanismServer, SaslError, SaslServerConfig, SaslStep};
use crate::context::KafkaPrincipal;
use crate::handler::respond;

/// What the connection does with a request or raw token.
#[derive(Debug)]
pub enum Decision {
    /// Hand the request to the handler.
    Handle,
    /// Send `response` (if any, size-prefixed) and go on reading.
    Respond(Option<Bytes>),
    /// Send `response` (if any) and then close the connection.
    Close {
        /// The last response.
        response: Option<Bytes>,
        /// Why, for the log.
        reason: String,
        /// Whether this is a failed (re-)authentication, logged once with the peer.
        authentication_failed: bool,
    },
}

enum State {
    HandshakeOrVersions,
    Handshake,
    Authenticate {
        mechanism: Mechanism,
        server: Box<MechanismServer>,
        /// SaslHandshake v1+: tokens in SaslAuthenticate requests; v0: raw frames.
        kafka_headers: bool,
    },
    ReauthBadMechanism(String),
    Complete,
    Failed,
}

/// Re-authentication limit: Kafka's `MIN_REAUTH_INTERVAL_ONE_SECOND_NANOS`.
const MIN_REAUTH_INTERVAL: Duration = Duration::from_secs(1);

/// One connection's authenticator.
pub struct SaslAuthenticator {
    config: Arc<SaslServerConfig>,
    state: State,
    /// The principal and mechanism of the completed authentication.
    authenticated: Option<(KafkaPrincipal, Mechanism)>,
    session_expiration: Option<Instant>,
    last_reauth_start: Option<Instant>,
    reauthenticating: bool,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A raw SASL token frame: the size prefix and the token (SaslHandshake v0).
fn raw_frame(token: &[u8]) -> Option<Bytes> {
    let len = u32::try_from(token.len()).ok()?;
    let mut out = Vec::with_capacity(4 + token.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(token);
    Some(out.into())
}

impl SaslAuthenticator {
    /// A new connection's authenticator.
    pub fn new(config: Arc<SaslServerConfig>) -> Self {
        Self {
            config,
            state: State::HandshakeOrVersions,
            authenticated: None,
            session_expiration: None,
            last_reauth_start: None,
            reauthenticating: false,
        }
    }

    /// The authenticated principal, once authentication completed.
    pub fn principal(&self) -> Option<&KafkaPrincipal> {
        match self.state {
            State::Complete => self.authenticated.as_ref().map(|(p, _)| p),
            _ if self.reauthenticating => self.authenticated.as_ref().map(|(p, _)| p),
            _ => None,
        }
    }

    /// Whether the next frame is a raw SASL token (after SaslHandshake v0), not a request.
    pub fn expects_raw_token(&self) -> bool {
        matches!(
            self.state,
            State::Authenticate {
                kafka_headers: false,
                ..
            }
        )
    }

    /// `sasl.server.max.receive.size`: the largest frame before authentication completes.
    pub fn max_receive_size(&self) -> usize {
        self.config.max_receive_size
    }

    /// When the session expires (KIP-368), if it does.
    pub fn session_expiration(&self) -> Option<Instant> {
        self.session_expiration
    }

    fn text(&self) -> &'static str {
        if self.reauthenticating {
            "re-authentication"
        } else {
            "authentication"
        }
    }

    fn close(&mut self, response: Option<Bytes>, reason: String, failed: bool) -> Decision {
        self.state = State::Failed;
        Decision::Close {
            response,
            reason,
            authentication_failed: failed,
        }
    }

    /// Decides what to do with a decoded request.
    pub fn on_request(
        &mut self,
        header: &RequestHeader,
        api_key: ApiKey,
        body: &RequestKind,
        now: Instant,
    ) -> Decision {
        match (&self.state, body) {
            (State::Complete, RequestKind::SaslHandshake(_))
                if self.session_expiration.is_some()
                    && self
                        .last_reauth_start
                        .is_none_or(|t| now.duration_since(t) >= MIN_REAUTH_INTERVAL) =>
            {
                self.last_reauth_start = Some(now);
                self.reauthenticating = true;
                self.handshake(header, api_key, body)
            }
            (State::Complete, _) => {
                if self.session_expiration.is_some_and(|t| now >= t) {
                    return self.close(
                        None,
                        "closing connection: its SASL session expired (connections.max.reauth.ms or the credential's lifetime) and it did not re-authenticate".into(),
                        false,
                    );
                }
                Decision::Handle
            }
            (State::HandshakeOrVersions, RequestKind::ApiVersions(_)) => {
                self.state = State::Handshake;
                Decision::Handle
            }
            (State::HandshakeOrVersions | State::Handshake, RequestKind::SaslHandshake(_)) => {
                self.handshake(header, api_key, body)
            }
            (State::HandshakeOrVersions | State::Handshake, _) => self.close(
                None,
                format!("Unexpected Kafka request of type {api_key:?} during SASL handshake."),
                true,
            ),
            (State::ReauthBadMechanism(m), _) => {
                let m = m.clone();
                self.close(None, m, true)
            }
            (
                State::Authenticate {
                    kafka_headers: true,
                    ..
                },
                RequestKind::SaslAuthenticate(r),
            ) => {
                let token = r.auth_bytes.clone();
                self.authenticate_token(&token, Some(header))
            }
            (State::Authenticate { .. }, _) => self.close(
                None,
                format!("Unexpected Kafka request of type {api_key:?} during SASL authentication."),
                true,
            ),
            (State::Failed, _) => self.close(None, "SASL authentication failed".into(), true),
        }
    }

    /// Evaluates a raw token (after SaslHandshake v0).
    pub fn on_raw_token(&mut self, token: &[u8]) -> Decision {
        self.authenticate_token(token, None)
    }

    fn handshake(
        &mut self,
        header: &RequestHeader,
        api_key: ApiKey,
        body: &RequestKind,
    ) -> Decision {
        let RequestKind::SaslHandshake(r) = body else {
            return self.close(None, "expected SaslHandshake".into(), true);
        };
        let enabled: Vec<StrBytes> = self
            .config
            .enabled_mechanisms
            .iter()
            .map(|m| StrBytes::from_static_str(m.name()))
            .collect();
        let requested = r.mechanism.as_str();
        let mechanism =
            Mechanism::from_name(requested).filter(|m| self.config.enabled_mechanisms.contains(m));
        let Some(mechanism) = mechanism else {
            let response = respond(
                header,
                api_key,
                ResponseKind::SaslHandshake(
                    SaslHandshakeResponse::default()
                        .with_error_code(ErrorCode::UnsupportedSaslMechanism.code())
                        .with_mechanisms(enabled),
                ),
            );
            return self.close(
                response,
                format!("Unsupported SASL mechanism {requested}"),
                true,
            );
        };
        let response = respond(
            header,
            api_key,
            ResponseKind::SaslHandshake(SaslHandshakeResponse::default().with_mechanisms(enabled)),
        );
        let kafka_headers = header.request_api_version >= 1;
        match &self.authenticated {
            Some((_, previous)) if self.reauthenticating && *previous != mechanism => {
                self.state = State::ReauthBadMechanism(format!(
                    "SASL mechanism '{}' requested by client is not supported for re-authentication of mechanism '{}'",
                    mechanism.name(),
                    previous.name()
                ));
            }
            _ => {
                self.state = State::Authenticate {
                    mechanism,
                    server: Box::new(self.config.server(mechanism)),
                    kafka_headers,
                };
            }
        }
        Decision::Respond(response)
    }

    /// The session lifetime to send, and the expiration it sets (Kafka's
    /// `calcCompletionTimesAndReturnSessionLifetimeMs`).
    fn complete_session(
        &mut self,
        mechanism: Mechanism,
        credential_expiration_ms: Option<i64>,
    ) -> i64 {
        let max_reauth = Some(self.config.connections_max_reauth_ms(mechanism)).filter(|m| *m > 0);
        let lifetime_ms = match (credential_expiration_ms, max_reauth) {
            (None, None) => {
                self.session_expiration = None;
                return 0;
            }
            (None, Some(max)) => max,
            (Some(exp), None) => (exp - now_ms()).max(0),
            (Some(exp), Some(max)) => (exp - now_ms()).min(max).max(0),
        };
        self.session_expiration =
            Some(Instant::now() + Duration::from_millis(lifetime_ms.unsigned_abs()));
        lifetime_ms
    }

    fn authenticate_token(&mut self, token: &[u8], header: Option<&RequestHeader>) -> Decision {
        let State::Authenticate {
            mechanism, server, ..
        } = &mut self.state
        else {
            return self.close(None, "unexpected SASL token".into(), true);
        };
        let mechanism = *mechanism;
        let step = server.evaluate(token, now_ms());
        let failure_response = |h: Option<&RequestHeader>, message: &str| {
            h.and_then(|h| {
                respond(
                    h,
                    ApiKey::SaslAuthenticate,
                    ResponseKind::SaslAuthenticate(
                        SaslAuthenticateResponse::default()
                            .with_error_code(ErrorCode::SaslAuthenticationFailed.code())
                            .with_error_message(Some(StrBytes::from_string(message.to_string()))),
                    ),
                )
            })
        };
        let (response_token, lifetime_ms) = match step {
            Ok(SaslStep::Continue(challenge)) => (challenge, 0),
            Ok(SaslStep::Complete {
                response,
                authorization_id,
                credential_expiration_ms,
            }) => {
                let principal = KafkaPrincipal {
                    principal_type: KafkaPrincipal::USER_TYPE.to_string(),
                    name: authorization_id,
                };
                if self.reauthenticating {
                    if let Some((previous, _)) = &self.authenticated {
                        if *previous != principal {
                            let message = format!(
                                "Cannot change principals during re-authentication from {}.{}: {}.{}",
                                previous.principal_type,
                                previous.name,
                                principal.principal_type,
                                principal.name
                            );
                            let r = failure_response(header, &message);
                            return self.close(r, message, true);
                        }
                    }
                }
                let lifetime_ms = self.complete_session(mechanism, credential_expiration_ms);
                self.authenticated = Some((principal, mechanism));
                self.state = State::Complete;
                self.reauthenticating = false;
                (response, lifetime_ms)
            }
            Err(SaslError::Authentication(message)) => {
                let r = failure_response(header, &message);
                return self.close(r, message, true);
            }
            Err(SaslError::Credentials(detail)) => {
                let message = format!(
                    "Authentication failed during {} due to invalid credentials with SASL mechanism {}",
                    self.text(),
                    mechanism.name()
                );
                let r = failure_response(header, &message);
                return self.close(r, format!("{message} ({detail})"), true);
            }
            Err(SaslError::IllegalState(message)) => return self.close(None, message, true),
        };
        let response = match header {
            Some(h) => respond(
                h,
                ApiKey::SaslAuthenticate,
                ResponseKind::SaslAuthenticate(
                    SaslAuthenticateResponse::default()
                        .with_auth_bytes(Bytes::from(response_token))
                        .with_session_lifetime_ms(lifetime_ms),
                ),
            ),
            None => raw_frame(&response_token),
        };
        Decision::Respond(response)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bytes::Buf;
    use gregor_protocol::kafka_protocol::messages::{
        ApiVersionsRequest, MetadataRequest, SaslAuthenticateRequest, SaslHandshakeRequest,
    };
    use gregor_protocol::kafka_protocol::protocol::Decodable;

    use super::*;

    fn config(reauth_ms: i64) -> Arc<SaslServerConfig> {
        let mut c = SaslServerConfig::new(vec![
            Mechanism::Plain,
            Mechanism::Scram(super::super::ScramMechanism::Sha256),
        ]);
        c.plain_users = BTreeMap::from([
            ("alice".to_string(), "a".to_string()),
            ("bob".to_string(), "b".to_string()),
        ]);
        c.connections_max_reauth_ms = reauth_ms;
        Arc::new(c)
    }

    fn header(api_key: ApiKey, version: i16) -> RequestHeader {
        RequestHeader::default()
            .with_request_api_key(api_key as i16)
            .with_request_api_version(version)
            .with_correlation_id(7)
    }

    fn handshake(a: &mut SaslAuthenticator, mechanism: &str, now: Instant) -> Decision {
        a.on_request(
            &header(ApiKey::SaslHandshake, 1),
            ApiKey::SaslHandshake,
            &RequestKind::SaslHandshake(
                SaslHandshakeRequest::default()
                    .with_mechanism(StrBytes::from_string(mechanism.into())),
            ),
            now,
        )
    }

    fn authenticate(a: &mut SaslAuthenticator, token: &[u8], now: Instant) -> Decision {
        a.on_request(
            &header(ApiKey::SaslAuthenticate, 2),
            ApiKey::SaslAuthenticate,
            &RequestKind::SaslAuthenticate(
                SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(token)),
            ),
            now,
        )
    }

    /// The SaslAuthenticate response in a decision (size prefix and header skipped).
    fn auth_response(d: &Decision) -> SaslAuthenticateResponse {
        let bytes = match d {
            Decision::Respond(Some(b)) => b.clone(),
            Decision::Close {
                response: Some(b), ..
            } => b.clone(),
            other => panic!("no response: {other:?}"),
        };
        // size, correlation id, the flexible header's empty tagged fields (v2)
        let mut b = bytes.slice(9..);
        let r = SaslAuthenticateResponse::decode(&mut b, 2).unwrap();
        assert_eq!(b.remaining(), 0);
        r
    }

    #[test]
    fn only_handshake_requests_before_authentication() {
        let now = Instant::now();
        let mut a = SaslAuthenticator::new(config(0));
        let d = a.on_request(
            &header(ApiKey::ApiVersions, 3),
            ApiKey::ApiVersions,
            &RequestKind::ApiVersions(ApiVersionsRequest::default()),
            now,
        );
        assert!(matches!(d, Decision::Handle));
        // A second ApiVersions is out of place, as any other request.
        let d = a.on_request(
            &header(ApiKey::Metadata, 12),
            ApiKey::Metadata,
            &RequestKind::Metadata(MetadataRequest::default()),
            now,
        );
        assert!(matches!(
            d,
            Decision::Close {
                response: None,
                authentication_failed: true,
                ..
            }
        ));
        assert!(a.principal().is_none());

        // After the handshake only SaslAuthenticate.
        let mut a = SaslAuthenticator::new(config(0));
        assert!(matches!(
            handshake(&mut a, "PLAIN", now),
            Decision::Respond(Some(_))
        ));
        let d = handshake(&mut a, "PLAIN", now);
        assert!(matches!(d, Decision::Close { .. }), "{d:?}");
        assert!(a.principal().is_none());
    }

    #[test]
    fn success_sets_the_principal_and_the_session_lifetime() {
        let now = Instant::now();
        let mut a = SaslAuthenticator::new(config(60_000));
        handshake(&mut a, "PLAIN", now);
        let d = authenticate(&mut a, b"\0alice\0a", now);
        let r = auth_response(&d);
        assert_eq!((r.error_code, r.session_lifetime_ms), (0, 60_000));
        assert_eq!(
            a.principal().map(ToString::to_string).as_deref(),
            Some("User:alice")
        );
        assert!(a.session_expiration().is_some());
        // Requests are handed on until the session expires.
        let meta = |a: &mut SaslAuthenticator, at: Instant| {
            a.on_request(
                &header(ApiKey::Metadata, 12),
                ApiKey::Metadata,
                &RequestKind::Metadata(MetadataRequest::default()),
                at,
            )
        };
        assert!(matches!(meta(&mut a, now), Decision::Handle));
        let later = a.session_expiration().unwrap() + Duration::from_millis(1);
        assert!(matches!(
            meta(&mut a, later),
            Decision::Close {
                authentication_failed: false,
                ..
            }
        ));
    }

    #[test]
    fn no_reauth_config_means_no_expiry_and_no_reauthentication() {
        let now = Instant::now();
        let mut a = SaslAuthenticator::new(config(0));
        handshake(&mut a, "PLAIN", now);
        let r = auth_response(&authenticate(&mut a, b"\0alice\0a", now));
        assert_eq!((r.error_code, r.session_lifetime_ms), (0, 0));
        // A handshake on an authenticated connection goes to the API layer
        // (ILLEGAL_SASL_STATE there), as Kafka's `maybeBeginServerReauthentication` false.
        assert!(matches!(handshake(&mut a, "PLAIN", now), Decision::Handle));
    }

    #[test]
    fn reauthentication_keeps_mechanism_and_principal() {
        let now = Instant::now();
        let later = now + Duration::from_secs(2);
        // Another principal: refused with Kafka's message, connection closed.
        let mut a = SaslAuthenticator::new(config(60_000));
        handshake(&mut a, "PLAIN", now);
        authenticate(&mut a, b"\0alice\0a", now);
        assert!(matches!(
            handshake(&mut a, "PLAIN", later),
            Decision::Respond(Some(_))
        ));
        let d = authenticate(&mut a, b"\0bob\0b", later);
        let r = auth_response(&d);
        assert_eq!(r.error_code, ErrorCode::SaslAuthenticationFailed.code());
        assert_eq!(
            r.error_message.as_deref(),
            Some("Cannot change principals during re-authentication from User.alice: User.bob")
        );
        assert!(matches!(d, Decision::Close { .. }));

        // Another mechanism: the handshake is answered, the next token fails.
        let mut a = SaslAuthenticator::new(config(60_000));
        handshake(&mut a, "PLAIN", now);
        authenticate(&mut a, b"\0alice\0a", now);
        assert!(matches!(
            handshake(&mut a, "SCRAM-SHA-256", later),
            Decision::Respond(Some(_))
        ));
        assert!(matches!(
            authenticate(&mut a, b"n,,n=alice,r=x", later),
            Decision::Close { response: None, .. }
        ));

        // The same principal: a new session; at most one re-authentication a second.
        let mut a = SaslAuthenticator::new(config(60_000));
        handshake(&mut a, "PLAIN", now);
        authenticate(&mut a, b"\0alice\0a", now);
        handshake(&mut a, "PLAIN", later);
        let r = auth_response(&authenticate(&mut a, b"\0alice\0a", later));
        assert_eq!(r.error_code, 0);
        assert_eq!(
            a.principal().map(ToString::to_string).as_deref(),
            Some("User:alice")
        );
        assert!(matches!(
            handshake(&mut a, "PLAIN", later + Duration::from_millis(500)),
            Decision::Handle
        ));
    }

    #[test]
    fn handshake_v0_exchanges_raw_tokens() {
        let now = Instant::now();
        let mut a = SaslAuthenticator::new(config(0));
        let d = a.on_request(
            &header(ApiKey::SaslHandshake, 0),
            ApiKey::SaslHandshake,
            &RequestKind::SaslHandshake(
                SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
            ),
            now,
        );
        assert!(matches!(d, Decision::Respond(Some(_))));
        assert!(a.expects_raw_token());
        let d = a.on_raw_token(b"\0alice\0a");
        assert!(
            matches!(&d, Decision::Respond(Some(b)) if b.as_ref() == [0, 0, 0, 0]),
            "{d:?}"
        );
        assert!(!a.expects_raw_token());
        assert!(a.principal().is_some());
        // A wrong raw token: no response, closed.
        let mut a = SaslAuthenticator::new(config(0));
        a.on_request(
            &header(ApiKey::SaslHandshake, 0),
            ApiKey::SaslHandshake,
            &RequestKind::SaslHandshake(
                SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
            ),
            now,
        );
        assert!(matches!(
            a.on_raw_token(b"\0alice\0wrong"),
            Decision::Close {
                response: None,
                authentication_failed: true,
                ..
            }
        ));
        assert!(a.principal().is_none());
    }
}
