//! SASL/PLAIN (RFC 4616) on the server side, as Kafka's `PlainSaslServer` with the
//! `PlainServerCallbackHandler`: users and passwords from the listener's JAAS config
//! (`user_<name>="<password>"`), the password compared in constant time.

use std::collections::BTreeMap;
use std::sync::Arc;

use subtle::ConstantTimeEq;

use super::{SaslError, SaslStep};

/// One PLAIN exchange (a single client message).
pub struct PlainServer {
    users: Arc<BTreeMap<String, String>>,
}

impl PlainServer {
    /// A server checking against `users` (name to password).
    pub fn new(users: Arc<BTreeMap<String, String>>) -> Self {
        Self { users }
    }

    /// Evaluates `[authzid] NUL authcid NUL passwd`.
    ///
    /// # Errors
    /// [`SaslError::Authentication`] with Kafka's messages.
    pub fn evaluate(&mut self, token: &[u8]) -> Result<SaslStep, SaslError> {
        let text = String::from_utf8_lossy(token);
        let tokens: Vec<&str> = text.splitn(4, '\0').collect();
        if tokens.len() != 3 {
            return Err(SaslError::Authentication(format!(
                "Invalid SASL/PLAIN response: expected 3 tokens, got {}",
                tokens.len()
            )));
        }
        let (authzid, username, password) = (tokens[0], tokens[1], tokens[2]);
        if username.is_empty() {
            return Err(SaslError::Authentication(
                "Authentication failed: username not specified".into(),
            ));
        }
        if password.is_empty() {
            return Err(SaslError::Authentication(
                "Authentication failed: password not specified".into(),
            ));
        }
        // Compare against a dummy for unknown users too, so the time does not tell them apart.
        let expected = self.users.get(username);
        let ok = match expected {
            Some(e) => bool::from(e.as_bytes().ct_eq(password.as_bytes())),
            None => {
                let _ = b"\0".ct_eq(password.as_bytes());
                false
            }
        };
        if !ok {
            return Err(SaslError::Authentication(
                "Authentication failed: Invalid username or password".into(),
            ));
        }
        if !authzid.is_empty() && authzid != username {
            return Err(SaslError::Authentication(
                "Authentication failed: Client requested an authorization id that is different from username".into(),
            ));
        }
        Ok(SaslStep::Complete {
            response: Vec::new(),
            authorization_id: username.to_string(),
            credential_expiration_ms: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> PlainServer {
        PlainServer::new(Arc::new(BTreeMap::from([(
            "alice".to_string(),
            "alice-secret".to_string(),
        )])))
    }

    #[test]
    fn plain_checks_password_and_authzid() {
        let ok = server().evaluate(b"\0alice\0alice-secret").unwrap();
        assert!(
            matches!(ok, SaslStep::Complete { ref authorization_id, .. } if authorization_id == "alice")
        );
        assert!(server().evaluate(b"alice\0alice\0alice-secret").is_ok());
        let msg = |t: &[u8]| match server().evaluate(t) {
            Err(SaslError::Authentication(m)) => m,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            msg(b"\0alice\0wrong"),
            "Authentication failed: Invalid username or password"
        );
        assert_eq!(
            msg(b"\0bob\0alice-secret"),
            "Authentication failed: Invalid username or password"
        );
        assert_eq!(
            msg(b"\0alice\0alice-secre"),
            "Authentication failed: Invalid username or password"
        );
        assert_eq!(
            msg(b"\0\0x"),
            "Authentication failed: username not specified"
        );
        assert_eq!(
            msg(b"\0alice\0"),
            "Authentication failed: password not specified"
        );
        assert_eq!(
            msg(b"alice"),
            "Invalid SASL/PLAIN response: expected 3 tokens, got 1"
        );
        assert_eq!(
            msg(b"a\0b\0c\0d"),
            "Invalid SASL/PLAIN response: expected 3 tokens, got 4"
        );
        assert_eq!(
            msg(b"bob\0alice\0alice-secret"),
            "Authentication failed: Client requested an authorization id that is different from username"
        );
    }
}
