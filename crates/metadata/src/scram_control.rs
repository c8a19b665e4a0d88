//! AlterUserScramCredentials on the controller (API 51, KIP-554), as Kafka's
//! `ScramControlManager.alterCredentials`: per user, a deletion of a credential that does not
//! exist is RESOURCE_NOT_FOUND, a user named twice in one request DUPLICATE_RESOURCE, an empty
//! name or iterations outside 4096..=16384 UNACCEPTABLE_CREDENTIAL, a mechanism other than
//! SCRAM-SHA-256 (1) / SCRAM-SHA-512 (2) UNSUPPORTED_SASL_MECHANISM, and a `metadata.version`
//! below 3.5-IV2 UNSUPPORTED_VERSION. The accepted ones become
//! UserScramCredentialRecord / RemoveUserScramCredentialRecord in one batch.
//!
//! The stored and server keys are derived from the salted password by the caller (the broker
//! handler, `gregor_network::sasl::scram`), since this crate knows no SCRAM hashing.

use std::collections::BTreeMap;

use gregor_protocol::error::ErrorCode;
use gregor_protocol::metadata_records::{
    RemoveUserScramCredentialRecord, UserScramCredentialRecord,
};

use crate::controller::{Controller, ControllerResult};
use crate::record::MetadataRecord;

/// Kafka's minimum and maximum iterations of a new credential (`ScramMechanism`).
const MIN_ITERATIONS: i32 = 4096;
const MAX_ITERATIONS: i32 = 16384;
/// `metadata.version` 3.5-IV2: the first with SCRAM records.
const MV_3_5_IV2: i16 = 11;

/// A credential to delete.
#[derive(Debug, Clone)]
pub struct ScramDeletion {
    /// User name.
    pub name: String,
    /// Mechanism type (1 SCRAM-SHA-256, 2 SCRAM-SHA-512).
    pub mechanism: i8,
}

/// A credential to add or replace, with its keys already derived from the salted password.
#[derive(Debug, Clone)]
pub struct ScramUpsertion {
    /// User name.
    pub name: String,
    /// Mechanism type.
    pub mechanism: i8,
    /// Iterations.
    pub iterations: i32,
    /// Salt.
    pub salt: Vec<u8>,
    /// `H(HMAC(SaltedPassword, "Client Key"))`.
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: Vec<u8>,
}

/// One user's result: (user, error code, message).
pub type ScramAlterResult = (String, ErrorCode, Option<String>);

fn check_name_and_mechanism(name: &str, mechanism: i8) -> Result<(), (ErrorCode, String)> {
    if name.is_empty() {
        return Err((
            ErrorCode::UnacceptableCredential,
            "Username must not be empty".into(),
        ));
    }
    if !matches!(mechanism, 1 | 2) {
        return Err((
            ErrorCode::UnsupportedSaslMechanism,
            "Unknown SCRAM mechanism".into(),
        ));
    }
    Ok(())
}

impl Controller {
    /// Validates a request's deletions and upsertions against the committed credentials;
    /// returns one result per user named and the records of the accepted changes.
    pub fn alter_user_scram_credentials(
        &self,
        deletions: Vec<ScramDeletion>,
        upsertions: Vec<ScramUpsertion>,
    ) -> ControllerResult<Vec<ScramAlterResult>> {
        let supported = self
            .image
            .metadata_version()
            .is_none_or(|mv| mv >= MV_3_5_IV2);
        let duplicate = || {
            (
                ErrorCode::DuplicateResource,
                "A user credential cannot be altered twice in the same request".to_string(),
            )
        };
        let unsupported = || {
            (
                ErrorCode::UnsupportedVersion,
                "The current metadata.version does not support SCRAM".to_string(),
            )
        };
        let mut errors: BTreeMap<String, (ErrorCode, String)> = BTreeMap::new();
        let mut to_delete: BTreeMap<String, ScramDeletion> = BTreeMap::new();
        let mut to_upsert: BTreeMap<String, ScramUpsertion> = BTreeMap::new();
        for d in deletions {
            if errors.contains_key(&d.name) {
                continue;
            }
            if to_delete.remove(&d.name).is_some() {
                errors.insert(d.name, duplicate());
            } else if !supported {
                errors.insert(d.name, unsupported());
            } else if let Err(e) = check_name_and_mechanism(&d.name, d.mechanism) {
                errors.insert(d.name, e);
            } else if !self
                .image
                .scram
                .contains_key(&(d.name.clone(), d.mechanism))
            {
                errors.insert(
                    d.name,
                    (
                        ErrorCode::ResourceNotFound,
                        "Attempt to delete a user credential that does not exist".into(),
                    ),
                );
            } else {
                to_delete.insert(d.name.clone(), d);
            }
        }
        for u in upsertions {
            if errors.contains_key(&u.name) {
                continue;
            }
            if to_delete.remove(&u.name).is_some() || to_upsert.remove(&u.name).is_some() {
                errors.insert(u.name, duplicate());
            } else if !supported {
                errors.insert(u.name, unsupported());
            } else if let Err(e) = check_name_and_mechanism(&u.name, u.mechanism) {
                errors.insert(u.name, e);
            } else if u.iterations < MIN_ITERATIONS {
                errors.insert(
                    u.name,
                    (
                        ErrorCode::UnacceptableCredential,
                        "Too few iterations".into(),
                    ),
                );
            } else if u.iterations > MAX_ITERATIONS {
                errors.insert(
                    u.name,
                    (
                        ErrorCode::UnacceptableCredential,
                        "Too many iterations".into(),
                    ),
                );
            } else {
                to_upsert.insert(u.name.clone(), u);
            }
        }
        let mut records = Vec::new();
        let mut results = Vec::new();
        for (name, d) in to_delete {
            records.push(MetadataRecord::RemoveUserScramCredential(
                RemoveUserScramCredentialRecord {
                    name: d.name,
                    mechanism: d.mechanism,
                    ..Default::default()
                },
            ));
            results.push((name, ErrorCode::None, None));
        }
        for (name, u) in to_upsert {
            records.push(MetadataRecord::UserScramCredential(
                UserScramCredentialRecord {
                    name: u.name,
                    mechanism: u.mechanism,
                    salt: u.salt,
                    stored_key: u.stored_key,
                    server_key: u.server_key,
                    iterations: u.iterations,
                    ..Default::default()
                },
            ));
            results.push((name, ErrorCode::None, None));
        }
        results.extend(
            errors
                .into_iter()
                .map(|(name, (code, message))| (name, code, Some(message))),
        );
        ControllerResult {
            records,
            response: results,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::MetadataImage;

    fn upsert(name: &str, mechanism: i8, iterations: i32) -> ScramUpsertion {
        ScramUpsertion {
            name: name.into(),
            mechanism,
            iterations,
            salt: vec![1],
            stored_key: vec![2],
            server_key: vec![3],
        }
    }

    fn del(name: &str, mechanism: i8) -> ScramDeletion {
        ScramDeletion {
            name: name.into(),
            mechanism,
        }
    }

    fn code_of(results: &[ScramAlterResult], user: &str) -> ErrorCode {
        results
            .iter()
            .find(|(u, _, _)| u == user)
            .map(|(_, c, _)| *c)
            .unwrap_or_else(|| panic!("no result for {user}"))
    }

    #[test]
    fn kafka_rules_for_each_user() {
        let mut image = MetadataImage::default();
        image.scram.insert(
            ("old".into(), 1),
            UserScramCredentialRecord {
                name: "old".into(),
                mechanism: 1,
                iterations: 4096,
                ..Default::default()
            },
        );
        let c = Controller::new(image);
        let r = c.alter_user_scram_credentials(
            vec![del("old", 1), del("ghost", 1), del("bad", 3)],
            vec![
                upsert("alice", 2, 8192),
                upsert("twice", 1, 4096),
                upsert("twice", 2, 4096),
                upsert("few", 1, 4095),
                upsert("many", 1, 16385),
                upsert("", 1, 4096),
                upsert("mech", 0, 4096),
            ],
        );
        let results = &r.response;
        assert_eq!(code_of(results, "old"), ErrorCode::None);
        assert_eq!(code_of(results, "alice"), ErrorCode::None);
        assert_eq!(code_of(results, "ghost"), ErrorCode::ResourceNotFound);
        assert_eq!(code_of(results, "twice"), ErrorCode::DuplicateResource);
        assert_eq!(code_of(results, "bad"), ErrorCode::UnsupportedSaslMechanism);
        assert_eq!(
            code_of(results, "mech"),
            ErrorCode::UnsupportedSaslMechanism
        );
        assert_eq!(code_of(results, "few"), ErrorCode::UnacceptableCredential);
        assert_eq!(code_of(results, "many"), ErrorCode::UnacceptableCredential);
        assert_eq!(code_of(results, ""), ErrorCode::UnacceptableCredential);
        assert_eq!(r.records.len(), 2, "one removal, one upsertion");
        assert!(r.records.iter().any(
            |rec| matches!(rec, MetadataRecord::RemoveUserScramCredential(x) if x.name == "old")
        ));
        assert!(r.records.iter().any(|rec| matches!(rec, MetadataRecord::UserScramCredential(x) if x.name == "alice" && x.iterations == 8192)));
    }
}
