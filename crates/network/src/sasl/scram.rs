//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) on the server side, as Kafka's
//! `ScramSaslServer`: credentials are stored as salt, stored key, server key and iterations
//! (`UserScramCredentialRecord`, KIP-554), never the password. The client's proof is verified
//! here (`H(ClientProof XOR HMAC(StoredKey, AuthMessage)) == StoredKey`, compared in constant
//! time) before the exchange completes, so a wrong password can never finish it.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::Rng;
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

use super::{SaslError, SaslStep};

/// A SCRAM mechanism, with Kafka's type codes (`ScramMechanism`: 1 and 2; the `Mechanism`
/// field of `UserScramCredentialRecord` and of Alter/DescribeUserScramCredentials).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScramMechanism {
    /// SCRAM-SHA-256, type 1.
    Sha256,
    /// SCRAM-SHA-512, type 2.
    Sha512,
}

impl ScramMechanism {
    /// Kafka's minimum iterations for a new credential and for a login (`ScramMechanism`).
    pub const MIN_ITERATIONS: i32 = 4096;
    /// Kafka's maximum iterations for a new credential.
    pub const MAX_ITERATIONS: i32 = 16384;

    /// Both mechanisms.
    pub const ALL: [Self; 2] = [Self::Sha256, Self::Sha512];

    /// The SASL mechanism name.
    pub fn mechanism_name(self) -> &'static str {
        match self {
            Self::Sha256 => "SCRAM-SHA-256",
            Self::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// Kafka's type code.
    pub fn type_code(self) -> i8 {
        match self {
            Self::Sha256 => 1,
            Self::Sha512 => 2,
        }
    }

    /// The mechanism of a type code (0 and others: unknown).
    pub fn from_type_code(code: i8) -> Option<Self> {
        match code {
            1 => Some(Self::Sha256),
            2 => Some(Self::Sha512),
            _ => None,
        }
    }

    /// The mechanism of a SASL name (exact, as Kafka's `ScramMechanism.forMechanismName`).
    pub fn from_mechanism_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.mechanism_name() == name)
    }

    /// `H(data)`.
    pub fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Self::Sha256 => Sha256::digest(data).to_vec(),
            Self::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// `HMAC(key, data)`.
    pub fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        // HMAC accepts keys of any length: new_from_slice cannot fail.
        match self {
            Self::Sha256 => {
                let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key)
                    .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            Self::Sha512 => {
                let mut m = <Hmac<Sha512> as Mac>::new_from_slice(key)
                    .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
        }
    }

    /// `SaltedPassword := Hi(Normalize(password), salt, i)` (PBKDF2 with this HMAC). Kafka does
    /// not SASLprep the password; neither does gregor.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            Self::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            Self::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }
}

/// A stored SCRAM credential (Kafka's `ScramCredential`).
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    /// The salt.
    pub salt: Vec<u8>,
    /// `H(ClientKey)`.
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: Vec<u8>,
    /// PBKDF2 iterations.
    pub iterations: i32,
}

impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// The credential of `password` with `salt` and `iterations` (RFC 5802 section 3).
    pub fn from_password(
        mechanism: ScramMechanism,
        password: &[u8],
        salt: &[u8],
        iterations: i32,
    ) -> Self {
        let salted = mechanism.salted_password(password, salt, iterations.max(1).unsigned_abs());
        Self::from_salted_password(mechanism, &salted, salt, iterations)
    }

    /// The credential from an already salted password (AlterUserScramCredentials carries it).
    pub fn from_salted_password(
        mechanism: ScramMechanism,
        salted_password: &[u8],
        salt: &[u8],
        iterations: i32,
    ) -> Self {
        let client_key = mechanism.hmac(salted_password, b"Client Key");
        Self {
            salt: salt.to_vec(),
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(salted_password, b"Server Key"),
            iterations,
        }
    }

    /// A random salt as Kafka makes one (`ScramFormatter.secureRandomBytes`: the bytes of a
    /// random base-36 string).
    pub fn random_salt() -> Vec<u8> {
        random_printable(32).into_bytes()
    }
}

/// Looks up the SCRAM credential of a user (from the metadata image on a broker).
pub trait ScramCredentialStore: Send + Sync + 'static {
    /// `user`'s credential for `mechanism`, if any.
    fn credential(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential>;
}

fn random_printable(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..n)
        .map(|_| char::from(ALPHABET[rng.gen_range(0..ALPHABET.len())]))
        .collect()
}

enum State {
    ClientFirst,
    ClientFinal {
        client_first_bare: String,
        gs2_header: String,
        server_first: String,
        nonce: String,
        username: String,
        credential: ScramCredential,
    },
    Done,
}

/// One SCRAM exchange on the server side (two client messages).
pub struct ScramServer {
    mechanism: ScramMechanism,
    store: std::sync::Arc<dyn ScramCredentialStore>,
    server_nonce: String,
    state: State,
}

fn invalid(what: &str) -> SaslError {
    SaslError::Credentials(format!("Invalid SCRAM {what} format"))
}

/// `saslname` decoding (RFC 5802: `=2C` is `,`, `=3D` is `=`, any other `=` is invalid).
fn decode_saslname(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        let esc = rest.get(i..i + 3)?;
        match esc {
            "=2C" => out.push(','),
            "=3D" => out.push('='),
            _ => return None,
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

fn printable(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

impl ScramServer {
    /// A server for one exchange, looking credentials up in `store`.
    pub fn new(mechanism: ScramMechanism, store: std::sync::Arc<dyn ScramCredentialStore>) -> Self {
        Self::with_nonce(mechanism, store, random_printable(32))
    }

    /// With a given server nonce (tests against RFC 7677's example).
    pub fn with_nonce(
        mechanism: ScramMechanism,
        store: std::sync::Arc<dyn ScramCredentialStore>,
        server_nonce: String,
    ) -> Self {
        Self {
            mechanism,
            store,
            server_nonce,
            state: State::ClientFirst,
        }
    }

    /// Evaluates one client message.
    ///
    /// # Errors
    /// [`SaslError::Credentials`] for a malformed message, an unknown user or a wrong proof
    /// (Kafka answers all of them with the same generic message);
    /// [`SaslError::Authentication`] for an authorization id other than the user name.
    pub fn evaluate(&mut self, token: &[u8]) -> Result<SaslStep, SaslError> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::ClientFirst => self.client_first(token),
            State::ClientFinal {
                client_first_bare,
                gs2_header,
                server_first,
                nonce,
                username,
                credential,
            } => {
                let msg =
                    std::str::from_utf8(token).map_err(|_| invalid("client final message"))?;
                let (without_proof, proof_b64) = msg
                    .rsplit_once(",p=")
                    .ok_or_else(|| invalid("client final message"))?;
                let mut parts = without_proof.split(',');
                let channel = parts
                    .next()
                    .and_then(|p| p.strip_prefix("c="))
                    .ok_or_else(|| invalid("client final message"))?;
                let client_nonce = parts
                    .next()
                    .and_then(|p| p.strip_prefix("r="))
                    .ok_or_else(|| invalid("client final message"))?;
                if B64.decode(channel).ok().as_deref() != Some(gs2_header.as_bytes()) {
                    return Err(SaslError::Credentials(
                        "Invalid channel binding in the final client message.".into(),
                    ));
                }
                if client_nonce != nonce {
                    return Err(SaslError::Credentials(
                        "Invalid client nonce in the final client message.".into(),
                    ));
                }
                let proof = B64
                    .decode(proof_b64)
                    .map_err(|_| invalid("client final message"))?;
                let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
                let m = self.mechanism;
                let client_signature = m.hmac(&credential.stored_key, auth_message.as_bytes());
                if proof.len() != client_signature.len() {
                    return Err(SaslError::Credentials("Invalid client credentials".into()));
                }
                let client_key: Vec<u8> = proof
                    .iter()
                    .zip(&client_signature)
                    .map(|(a, b)| a ^ b)
                    .collect();
                let computed = m.hash(&client_key);
                if !bool::from(computed.ct_eq(&credential.stored_key)) {
                    return Err(SaslError::Credentials("Invalid client credentials".into()));
                }
                let server_signature = m.hmac(&credential.server_key, auth_message.as_bytes());
                Ok(SaslStep::Complete {
                    response: format!("v={}", B64.encode(server_signature)).into_bytes(),
                    authorization_id: username,
                    credential_expiration_ms: None,
                })
            }
            State::Done => Err(SaslError::IllegalState(
                "Unexpected challenge in Sasl server state COMPLETE".into(),
            )),
        }
    }

    fn client_first(&mut self, token: &[u8]) -> Result<SaslStep, SaslError> {
        let msg = std::str::from_utf8(token).map_err(|_| invalid("client first message"))?;
        // gs2-header: "n," or "y," (no channel binding), optional "a=<authzid>", ",".
        let (cbind, rest) = msg
            .split_once(',')
            .ok_or_else(|| invalid("client first message"))?;
        if cbind != "n" && cbind != "y" {
            return Err(invalid("client first message"));
        }
        let (authzid, bare) = rest
            .split_once(',')
            .ok_or_else(|| invalid("client first message"))?;
        let authzid = match authzid {
            "" => String::new(),
            a => a
                .strip_prefix("a=")
                .and_then(decode_saslname)
                .ok_or_else(|| invalid("client first message"))?,
        };
        let gs2_header = format!("{cbind},{},", &rest[..rest.len() - bare.len() - 1]);
        let mut fields = bare.split(',');
        let username = fields
            .next()
            .and_then(|f| f.strip_prefix("n="))
            .and_then(decode_saslname)
            .filter(|u| !u.is_empty())
            .ok_or_else(|| invalid("client first message"))?;
        let client_nonce = fields
            .next()
            .and_then(|f| f.strip_prefix("r="))
            .filter(|n| printable(n))
            .ok_or_else(|| invalid("client first message"))?;
        // Extensions (Kafka: tokenauth for delegation tokens) are ignored, as Kafka ignores
        // those it does not support; gregor has no delegation tokens.
        let credential = self
            .store
            .credential(&username, self.mechanism)
            .ok_or_else(|| {
                SaslError::Credentials("Authentication failed: Invalid user credentials".into())
            })?;
        if !authzid.is_empty() && authzid != username {
            return Err(SaslError::Authentication(
                "Authentication failed: Client requested an authorization id that is different from username".into(),
            ));
        }
        if credential.iterations < ScramMechanism::MIN_ITERATIONS {
            return Err(SaslError::Credentials(format!(
                "Iterations {} is less than the minimum {} for {}",
                credential.iterations,
                ScramMechanism::MIN_ITERATIONS,
                self.mechanism.mechanism_name()
            )));
        }
        let nonce = format!("{client_nonce}{}", self.server_nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&credential.salt),
            credential.iterations
        );
        self.state = State::ClientFinal {
            client_first_bare: bare.to_string(),
            gs2_header,
            server_first: server_first.clone(),
            nonce,
            username,
            credential,
        };
        Ok(SaslStep::Continue(server_first.into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::*;

    struct Store(HashMap<(String, ScramMechanism), ScramCredential>);

    impl ScramCredentialStore for Store {
        fn credential(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential> {
            self.0.get(&(user.to_string(), mechanism)).cloned()
        }
    }

    fn rfc7677_store() -> Arc<dyn ScramCredentialStore> {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let cred = ScramCredential::from_password(ScramMechanism::Sha256, b"pencil", &salt, 4096);
        Arc::new(Store(HashMap::from([(
            ("user".to_string(), ScramMechanism::Sha256),
            cred,
        )])))
    }

    const RFC7677_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";

    /// RFC 7677 section 3's example exchange, byte for byte.
    #[test]
    fn rfc7677_example() {
        let mut s = ScramServer::with_nonce(
            ScramMechanism::Sha256,
            rfc7677_store(),
            RFC7677_SERVER_NONCE.into(),
        );
        let SaslStep::Continue(first) = s.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").unwrap()
        else {
            panic!("expected a challenge")
        };
        assert_eq!(
            std::str::from_utf8(&first).unwrap(),
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let step = s
            .evaluate(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
            .unwrap();
        let SaslStep::Complete {
            response,
            authorization_id,
            ..
        } = step
        else {
            panic!("expected completion")
        };
        assert_eq!(
            std::str::from_utf8(&response).unwrap(),
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        assert_eq!(authorization_id, "user");
    }

    /// A proof made from another password never completes the exchange.
    #[test]
    fn wrong_proof_fails() {
        let mut s = ScramServer::with_nonce(
            ScramMechanism::Sha256,
            rfc7677_store(),
            RFC7677_SERVER_NONCE.into(),
        );
        s.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").unwrap();
        // The RFC's proof with its last byte changed.
        let e = s
            .evaluate(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVU=")
            .unwrap_err();
        assert!(matches!(e, SaslError::Credentials(_)), "{e:?}");
        // And nothing after a failure completes either.
        assert!(s.evaluate(b"x").is_err());
    }

    #[test]
    fn unknown_user_bad_nonce_and_authzid_fail() {
        let store = rfc7677_store();
        let mut s = ScramServer::new(ScramMechanism::Sha256, store.clone());
        assert!(matches!(
            s.evaluate(b"n,,n=nobody,r=abc"),
            Err(SaslError::Credentials(_))
        ));
        let mut s = ScramServer::new(ScramMechanism::Sha512, store.clone());
        assert!(
            s.evaluate(b"n,,n=user,r=abc").is_err(),
            "no SHA-512 credential"
        );
        let mut s = ScramServer::new(ScramMechanism::Sha256, store.clone());
        assert!(matches!(
            s.evaluate(b"n,a=admin,n=user,r=abc"),
            Err(SaslError::Authentication(_))
        ));
        let mut s = ScramServer::with_nonce(ScramMechanism::Sha256, store, "srv".into());
        s.evaluate(b"n,,n=user,r=abc").unwrap();
        assert!(s.evaluate(b"c=biws,r=abcXXX,p=AAAA").is_err());
        for bad in [
            &b""[..],
            b"p=tls,,n=user,r=a",
            b"n,,n=,r=a",
            b"n,,n=us=er,r=a",
            b"\xff",
        ] {
            let mut s = ScramServer::new(ScramMechanism::Sha256, rfc7677_store());
            assert!(s.evaluate(bad).is_err(), "{bad:?}");
        }
    }

    /// A client computing the exchange from the password (as librdkafka does) logs in with
    /// SHA-512 too; the server's signature is the one the client expects.
    #[test]
    fn sha512_round_trip_with_client_computation() {
        let m = ScramMechanism::Sha512;
        let salt = ScramCredential::random_salt();
        let cred = ScramCredential::from_password(m, b"secret", &salt, 4096);
        let store: Arc<dyn ScramCredentialStore> =
            Arc::new(Store(HashMap::from([(("al,ice".to_string(), m), cred)])));
        let mut s = ScramServer::new(m, store);
        let bare = "n=al=2Cice,r=cnonce";
        let SaslStep::Continue(first) = s.evaluate(format!("n,,{bare}").as_bytes()).unwrap() else {
            panic!()
        };
        let first = String::from_utf8(first).unwrap();
        let nonce = first.split(',').next().unwrap().strip_prefix("r=").unwrap();
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{bare},{first},{without_proof}");
        let salted = m.salted_password(b"secret", &salt, 4096);
        let client_key = m.hmac(&salted, b"Client Key");
        let sig = m.hmac(&m.hash(&client_key), auth.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
        let SaslStep::Complete {
            response,
            authorization_id,
            ..
        } = s
            .evaluate(format!("{without_proof},p={}", B64.encode(proof)).as_bytes())
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(authorization_id, "al,ice");
        let expected = m.hmac(&m.hmac(&salted, b"Server Key"), auth.as_bytes());
        assert_eq!(response, format!("v={}", B64.encode(expected)).into_bytes());
    }
}
