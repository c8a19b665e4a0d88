//! SASL/OAUTHBEARER (RFC 7628, KIP-255) with Kafka's unsecured JWT validator
//! (`OAuthBearerUnsecuredValidatorCallbackHandler`, `OAuthBearerUnsecuredJws`,
//! `OAuthBearerValidationUtils`): the token must be an unsecured JWS (`alg` `none`, no
//! signature) with an `exp` claim in the future (minus the allowable clock skew), an `iat`
//! (if present) not in the future (plus the skew), the principal claim (`sub` by default) and
//! every required scope. The session lifetime follows `exp` (KIP-368).
//!
//! On a bad token the server answers with an error challenge `{"status":"invalid_token"}`
//! (`insufficient_scope` with the scope when a scope is missing); the client answers it with a
//! single `0x01` and the exchange fails with that message (`OAuthBearerSaslServer`).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{Map, Value};

use std::sync::Arc;

use super::jwks::SignedJwtValidator;
use super::{OAuthBearerConfig, SaslError, SaslStep};

/// One OAUTHBEARER exchange on the server side.
pub struct OAuthBearerServer {
    config: OAuthBearerConfig,
    /// Set: tokens must be signed JWTs (KIP-768, [`super::jwks`]); unsecured ones are refused.
    signed: Option<Arc<SignedJwtValidator>>,
    /// The error challenge sent, awaiting the client's `0x01`.
    error_message: Option<String>,
}

/// Why a token was refused: the failure reason (logged) and the scope for
/// `insufficient_scope`.
#[derive(Debug, PartialEq, Eq)]
pub struct TokenError {
    /// What is wrong, as Kafka's `OAuthBearerValidationResult.failureDescription`.
    pub description: String,
    /// The missing scope, for `insufficient_scope`.
    pub failure_scope: Option<String>,
}

fn fail(description: impl Into<String>) -> TokenError {
    TokenError {
        description: description.into(),
        failure_scope: None,
    }
}

/// A validated token.
#[derive(Debug, PartialEq, Eq)]
pub struct ValidToken {
    /// The principal claim's value.
    pub principal_name: String,
    /// `exp` in ms since the epoch.
    pub lifetime_ms: i64,
}

pub(crate) fn decode_part(part: &str) -> Result<Map<String, Value>, TokenError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|_| fail("malformed Base64 URL encoded value"))?;
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(fail("malformed JSON")),
    }
}

fn seconds_claim(claims: &Map<String, Value>, name: &str) -> Result<Option<f64>, TokenError> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_f64()
            .map(Some)
            .ok_or_else(|| fail(format!("The {name} claim had the incorrect type: Number"))),
        Some(_) => Err(fail(format!(
            "The {name} claim had the incorrect type: not a Number"
        ))),
    }
}

/// Validates an unsecured JWT at `now_ms`, as Kafka's unsecured validator.
///
/// # Errors
/// [`TokenError`] with Kafka's failure description.
pub fn validate_unsecured(
    token: &str,
    config: &OAuthBearerConfig,
    now_ms: i64,
) -> Result<ValidToken, TokenError> {
    if token.contains("..") {
        return Err(fail("Malformed compact serialization contains '..'"));
    }
    let splits: Vec<&str> = token.split('.').collect();
    if splits.len() != 3 {
        return Err(fail(format!(
            "Unsecured JWS compact serializations must have 3 dot-separated Base64URL-encoded values, found {}",
            splits.len()
        )));
    }
    let header = decode_part(splits[0])?;
    let claims = decode_part(splits[1])?;
    if header.get("alg").and_then(Value::as_str) != Some("none") {
        return Err(fail("Unsecured JWS must have 'none' for an algorithm"));
    }
    if !splits[2].is_empty() {
        return Err(fail("Unsecured JWS must not contain a digital signature"));
    }
    let scope: Vec<String> = match claims.get(&config.scope_claim_name) {
        None => Vec::new(),
        Some(Value::String(s)) => s
            .split(' ')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        Some(_) => {
            return Err(fail(format!(
                "The {} claim had the incorrect type",
                config.scope_claim_name
            )))
        }
    };
    let Some(exp) = seconds_claim(&claims, "exp")? else {
        return Err(fail("No expiration time in JWT"));
    };
    let principal_name = match claims.get(&config.principal_claim_name) {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        _ => {
            return Err(fail(format!(
                "No principal name in JWT claim: {}",
                config.principal_claim_name
            )))
        }
    };
    let skew = config.allowable_clock_skew_ms;
    let iat = seconds_claim(&claims, "iat")?;
    if let Some(iat) = iat {
        if iat * 1000.0 > (now_ms + skew) as f64 {
            return Err(fail(format!(
                "The Issued At value ({iat:.6} seconds) was after the indicated time ({now_ms} ms) plus allowable clock skew ({skew} ms)"
            )));
        }
    }
    if ((now_ms - skew) as f64) >= exp * 1000.0 {
        return Err(fail(format!(
            "The indicated time ({now_ms} ms) minus allowable clock skew ({skew} ms) was on or after the Expiration Time value ({exp:.6} seconds)"
        )));
    }
    if let Some(iat) = iat {
        if exp <= iat {
            return Err(fail(format!(
                "The Expiration Time time ({exp:.6} seconds) was not after the Issued At time ({iat:.6} seconds)"
            )));
        }
    }
    for required in &config.required_scope {
        if !scope.contains(required) {
            return Err(TokenError {
                description: format!(
                    "The provided scope ({}) was missing a required scope ({required}).  All required scope elements: {}",
                    scope.join(" "),
                    config.required_scope.join(" ")
                ),
                failure_scope: Some(required.clone()),
            });
        }
    }
    Ok(ValidToken {
        principal_name,
        lifetime_ms: (exp * 1000.0) as i64,
    })
}

/// The parts of the client's initial response
/// (`gs2-header kvsep *(kvpair) kvsep`, RFC 7628 section 3.1).
struct InitialResponse {
    authorization_id: String,
    token: String,
}

fn parse_initial_response(bytes: &[u8]) -> Result<InitialResponse, SaslError> {
    let invalid = || SaslError::Credentials("Invalid OAUTHBEARER client first message".into());
    let msg = std::str::from_utf8(bytes).map_err(|_| invalid())?;
    let (gs2, rest) = msg.split_once('\x01').ok_or_else(invalid)?;
    let mut gs2_parts = gs2.splitn(3, ',');
    if gs2_parts.next() != Some("n") {
        return Err(invalid());
    }
    let authorization_id = match gs2_parts.next() {
        Some("") | None => String::new(),
        Some(a) => a.strip_prefix("a=").ok_or_else(invalid)?.to_string(),
    };
    if gs2_parts.next() != Some("") {
        return Err(invalid());
    }
    let body = rest.strip_suffix("\x01\x01").ok_or_else(invalid)?;
    let mut token = None;
    for kv in body.split('\x01') {
        let (k, v) = kv.split_once('=').ok_or_else(invalid)?;
        if k == "auth" {
            let (scheme, value) = v.split_once(' ').ok_or_else(invalid)?;
            let value = value.trim_start_matches(' ');
            let ok_chars = value.bytes().all(|b| {
                b.is_ascii_alphanumeric()
                    || matches!(b, b'-' | b'_' | b'~' | b'+' | b'/' | b'.' | b'=')
            });
            if !scheme.eq_ignore_ascii_case("bearer") || value.is_empty() || !ok_chars {
                return Err(invalid());
            }
            token = Some(value.to_string());
        }
        // Other keys are SASL extensions (KIP-342); Kafka's default validator accepts none and
        // ignores them unless they are validated; gregor ignores them too.
    }
    Ok(InitialResponse {
        authorization_id,
        token: token.ok_or_else(invalid)?,
    })
}

impl OAuthBearerServer {
    /// A server with the listener's validator options.
    pub fn new(config: OAuthBearerConfig) -> Self {
        Self {
            config,
            signed: None,
            error_message: None,
        }
    }

    /// A server that validates signed JWTs with `validator` (Kafka's
    /// `OAuthBearerValidatorCallbackHandler`).
    pub fn signed(validator: Arc<SignedJwtValidator>) -> Self {
        Self {
            config: OAuthBearerConfig::default(),
            signed: Some(validator),
            error_message: None,
        }
    }

    /// Evaluates one client message at `now_ms`.
    ///
    /// # Errors
    /// [`SaslError::Authentication`] after a refused token's `0x01`, or for an authorization
    /// id other than the principal; [`SaslError::Credentials`] for a malformed message.
    pub fn evaluate(&mut self, token: &[u8], now_ms: i64) -> Result<SaslStep, SaslError> {
        if token == b"\x01" {
            if let Some(message) = self.error_message.take() {
                return Err(SaslError::Authentication(message));
            }
        }
        self.error_message = None;
        let initial = parse_initial_response(token)?;
        let validated = match &self.signed {
            Some(v) => v.validate(&initial.token, now_ms),
            None => validate_unsecured(&initial.token, &self.config, now_ms),
        };
        match validated {
            Ok(valid) => {
                if !initial.authorization_id.is_empty()
                    && initial.authorization_id != valid.principal_name
                {
                    return Err(SaslError::Authentication(format!(
                        "Authentication failed: Client requested an authorization id ({}) that is different from the token's principal name ({})",
                        initial.authorization_id, valid.principal_name
                    )));
                }
                Ok(SaslStep::Complete {
                    response: Vec::new(),
                    authorization_id: valid.principal_name,
                    credential_expiration_ms: Some(valid.lifetime_ms),
                })
            }
            Err(e) => {
                // Kafka's OAuthBearerValidatorCallbackHandler logs the reason at WARN; the
                // unsecured validator's reasons (expired, no `sub`, ...) are as useful.
                tracing::warn!(
                    reason = %e.description,
                    signed = self.signed.is_some(),
                    "OAUTHBEARER token refused"
                );
                let json = match &e.failure_scope {
                    Some(scope) => {
                        format!("{{\"status\":\"insufficient_scope\", \"scope\":\"{scope}\"}}")
                    }
                    None => "{\"status\":\"invalid_token\"}".to_string(),
                };
                self.error_message = Some(json.clone());
                Ok(SaslStep::Continue(json.into_bytes()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(claims)
        )
    }

    fn initial(token: &str) -> Vec<u8> {
        format!("n,,\x01auth=Bearer {token}\x01\x01").into_bytes()
    }

    const NOW_MS: i64 = 1_700_000_000_000;

    #[test]
    fn valid_token_completes_with_its_expiry() {
        let mut s = OAuthBearerServer::new(OAuthBearerConfig::default());
        let t = jwt(r#"{"sub":"alice","exp":1700000060,"iat":1700000000,"scope":"a b"}"#);
        let step = s.evaluate(&initial(&t), NOW_MS).unwrap();
        let SaslStep::Complete {
            authorization_id,
            credential_expiration_ms,
            ..
        } = step
        else {
            panic!("{step:?}")
        };
        assert_eq!(authorization_id, "alice");
        assert_eq!(credential_expiration_ms, Some(1_700_000_060_000));
    }

    #[test]
    fn expired_token_fails_after_the_error_challenge() {
        let mut s = OAuthBearerServer::new(OAuthBearerConfig::default());
        let t = jwt(r#"{"sub":"alice","exp":1699999999}"#);
        let SaslStep::Continue(challenge) = s.evaluate(&initial(&t), NOW_MS).unwrap() else {
            panic!()
        };
        assert_eq!(challenge, br#"{"status":"invalid_token"}"#);
        assert_eq!(
            s.evaluate(b"\x01", NOW_MS).unwrap_err(),
            SaslError::Authentication(r#"{"status":"invalid_token"}"#.into())
        );
        // With enough clock skew allowed it passes.
        let mut s = OAuthBearerServer::new(OAuthBearerConfig {
            allowable_clock_skew_ms: 5000,
            ..Default::default()
        });
        assert!(matches!(
            s.evaluate(&initial(&t), NOW_MS).unwrap(),
            SaslStep::Complete { .. }
        ));
    }

    #[test]
    fn scope_principal_claim_and_shape_are_checked() {
        let config = OAuthBearerConfig {
            required_scope: vec!["write".into()],
            principal_claim_name: "user".into(),
            ..Default::default()
        };
        let v = |claims: &str| validate_unsecured(&jwt(claims), &config, NOW_MS);
        assert_eq!(
            v(r#"{"user":"bob","exp":1700000060,"scope":["read","write"]}"#)
                .unwrap()
                .principal_name,
            "bob"
        );
        let e = v(r#"{"user":"bob","exp":1700000060,"scope":"read"}"#).unwrap_err();
        assert_eq!(e.failure_scope.as_deref(), Some("write"));
        assert!(v(r#"{"sub":"bob","exp":1700000060,"scope":"write"}"#).is_err());
        assert!(v(r#"{"user":"bob","scope":"write"}"#).is_err(), "no exp");
        assert!(v(r#"{"user":"bob","exp":1700000060,"iat":1700000100,"scope":"write"}"#).is_err());
        let d = OAuthBearerConfig::default();
        let signed = format!("{}sig", jwt(r#"{"sub":"a","exp":1700000060}"#));
        assert!(validate_unsecured(&signed, &d, NOW_MS).is_err());
        let hs = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256"}"#),
            URL_SAFE_NO_PAD.encode(r#"{"sub":"a","exp":1700000060}"#)
        );
        assert!(validate_unsecured(&hs, &d, NOW_MS).is_err());
        for bad in ["", "a.b", "a..b", "!!.!!."] {
            assert!(validate_unsecured(bad, &d, NOW_MS).is_err(), "{bad}");
        }
        let mut s = OAuthBearerServer::new(d);
        assert!(s.evaluate(b"n,,auth=Bearer x", NOW_MS).is_err());
        let t = jwt(r#"{"sub":"a","exp":1700000060}"#);
        let authz = format!("n,a=b,\x01auth=Bearer {t}\x01\x01");
        assert!(matches!(
            s.evaluate(authz.as_bytes(), NOW_MS),
            Err(SaslError::Authentication(_))
        ));
    }
}
