//! The `quorum-state` file of Kafka's `FileQuorumStateStore`: one line of JSON holding the
//! [`ElectionState`] (`QuorumStateData` plus `data_version`). gregor writes version 0, the
//! format of a static voter set (`kraft.version` 0; keys come out sorted, which JSON readers,
//! Kafka's included, ignore):
//!
//! ```text
//! {"clusterId":"","leaderId":1,"leaderEpoch":2,"votedId":-1,"appliedOffset":0,"currentVoters":[{"voterId":1},{"voterId":2},{"voterId":3}],"data_version":0}
//! ```
//!
//! and reads versions 0 and 1 (KIP-853's, with `votedDirectoryId` and no voters). The driver
//! writes it to a temporary file, fsyncs and renames it over `quorum-state` to complete an
//! [`crate::Action::PersistElectionState`], as Kafka does.

use serde_json::{json, Value};

use crate::types::{ElectionState, NodeId, VoterSet};

/// Name of the file in the metadata log directory (`FileQuorumStateStore.DEFAULT_FILE_NAME`).
pub const QUORUM_STATE_FILE_NAME: &str = "quorum-state";

/// A `quorum-state` file that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuorumStateError {
    /// Not one JSON object.
    #[error("quorum-state is not a JSON object: {0}")]
    NotJson(String),
    /// A field is missing or has the wrong type.
    #[error("quorum-state field {0} is missing or invalid")]
    BadField(&'static str),
    /// A `data_version` other than 0 or 1.
    #[error("quorum-state data_version {0} is not within 0..=1")]
    UnsupportedVersion(i64),
}

/// Encodes `state` as the version 0 `quorum-state` line (no trailing newline).
pub fn encode(state: &ElectionState, voters: &VoterSet) -> String {
    let voters: Vec<Value> = voters.ids().map(|id| json!({ "voterId": id })).collect();
    json!({
        "clusterId": "",
        "leaderId": state.leader_id.unwrap_or(-1),
        "leaderEpoch": state.epoch,
        "votedId": state.voted_id.unwrap_or(-1),
        "appliedOffset": 0,
        "currentVoters": voters,
        "data_version": 0,
    })
    .to_string()
}

/// Decodes the first line of a `quorum-state` file (version 0 or 1). Returns the election
/// state and, for version 0, the voters it names.
///
/// # Errors
/// [`QuorumStateError`] for anything but a well-formed version 0 or 1 object.
pub fn decode(contents: &str) -> Result<(ElectionState, Vec<NodeId>), QuorumStateError> {
    let line = contents.lines().next().unwrap_or("");
    let value: Value =
        serde_json::from_str(line).map_err(|e| QuorumStateError::NotJson(e.to_string()))?;
    let object = value
        .as_object()
        .ok_or_else(|| QuorumStateError::NotJson("not an object".into()))?;
    let version = object
        .get("data_version")
        .and_then(Value::as_i64)
        .ok_or(QuorumStateError::BadField("data_version"))?;
    if !(0..=1).contains(&version) {
        return Err(QuorumStateError::UnsupportedVersion(version));
    }
    let int = |name: &'static str| -> Result<i32, QuorumStateError> {
        object
            .get(name)
            .and_then(Value::as_i64)
            .and_then(|v| i32::try_from(v).ok())
            .ok_or(QuorumStateError::BadField(name))
    };
    let epoch = int("leaderEpoch")?;
    let leader_id = int("leaderId")?;
    let voted_id = int("votedId")?;
    let voters = match object.get("currentVoters") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.get("voterId")
                    .and_then(Value::as_i64)
                    .and_then(|id| i32::try_from(id).ok())
                    .ok_or(QuorumStateError::BadField("currentVoters"))
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(Value::Null) | None => Vec::new(),
        Some(_) => return Err(QuorumStateError::BadField("currentVoters")),
    };
    Ok((
        ElectionState {
            epoch,
            leader_id: (leader_id >= 0).then_some(leader_id),
            voted_id: (voted_id >= 0).then_some(voted_id),
        },
        voters,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_version_0() {
        let voters = VoterSet::new([1, 2, 3]).unwrap();
        let state = ElectionState {
            epoch: 7,
            leader_id: Some(2),
            voted_id: None,
        };
        let line = encode(&state, &voters);
        assert!(line.contains("\"leaderEpoch\":7"), "{line}");
        assert!(line.contains("\"votedId\":-1"), "{line}");
        assert!(line.contains("\"data_version\":0"), "{line}");
        assert!(!line.contains('\n'));
        assert_eq!(decode(&line).unwrap(), (state, vec![1, 2, 3]));
    }

    #[test]
    fn reads_kafkas_own_examples() {
        // The two examples of FileQuorumStateStore's documentation.
        let v0 = r#"{"clusterId":"","leaderId":1,"leaderEpoch":2,"votedId":-1,"appliedOffset":0,"currentVoters":[],"data_version":0}"#;
        assert_eq!(
            decode(v0).unwrap(),
            (
                ElectionState {
                    epoch: 2,
                    leader_id: Some(1),
                    voted_id: None
                },
                vec![]
            )
        );
        let v1 = "{\"leaderId\":-1,\"leaderEpoch\":2,\"votedId\":1,\"votedDirectoryId\":\"J8aAPcfLQt2bqs1JT_rMgQ\",\"data_version\":1}\n";
        assert_eq!(
            decode(v1).unwrap().0,
            ElectionState {
                epoch: 2,
                leader_id: None,
                voted_id: Some(1)
            }
        );
    }

    #[test]
    fn rejects_bad_files() {
        assert!(matches!(decode(""), Err(QuorumStateError::NotJson(_))));
        assert!(matches!(decode("[1]"), Err(QuorumStateError::NotJson(_))));
        assert_eq!(
            decode(r#"{"leaderId":1,"leaderEpoch":2,"votedId":-1}"#),
            Err(QuorumStateError::BadField("data_version"))
        );
        assert_eq!(
            decode(r#"{"leaderId":1,"leaderEpoch":2,"votedId":-1,"data_version":2}"#),
            Err(QuorumStateError::UnsupportedVersion(2))
        );
        assert_eq!(
            decode(r#"{"leaderId":1,"leaderEpoch":"x","votedId":-1,"data_version":0}"#),
            Err(QuorumStateError::BadField("leaderEpoch"))
        );
    }
}

/// Errors of the `quorum-state` file.
#[derive(Debug, thiserror::Error)]
pub enum QuorumStateStoreError {
    /// Reading or writing failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file exists but cannot be decoded: the operator must look at it (gregor does not
    /// guess an election state, which could make it vote twice in an epoch).
    #[error("{path} is corrupt: {source}")]
    Corrupt {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: QuorumStateError,
    },
}

/// Largest `quorum-state` file read (a bound on a length read off disk; the file is one line
/// of JSON naming at most a few voters).
pub const MAX_QUORUM_STATE_BYTES: u64 = 1024 * 1024;

/// Kafka's `FileQuorumStateStore`: the `quorum-state` file in the metadata log directory
/// (`__cluster_metadata-0/`).
#[derive(Debug, Clone)]
pub struct FileQuorumStateStore {
    path: std::path::PathBuf,
}

impl FileQuorumStateStore {
    /// The store of `dir/quorum-state`.
    pub fn new(dir: &std::path::Path) -> Self {
        Self {
            path: dir.join(QUORUM_STATE_FILE_NAME),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Reads the stored election state and voters; `None` when there is no file (a fresh
    /// node).
    ///
    /// # Errors
    /// [`QuorumStateStoreError::Corrupt`] naming the file, or [`QuorumStateStoreError::Io`].
    pub fn read(&self) -> Result<Option<(ElectionState, Vec<NodeId>)>, QuorumStateStoreError> {
        let io = |op| {
            let path = self.path.clone();
            move |source| QuorumStateStoreError::Io { op, path, source }
        };
        let len = match std::fs::metadata(&self.path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("reading metadata of")(e)),
        };
        if len > MAX_QUORUM_STATE_BYTES {
            return Err(QuorumStateStoreError::Corrupt {
                path: self.path.clone(),
                source: QuorumStateError::NotJson(format!("{len} bytes is too large")),
            });
        }
        let bytes = std::fs::read(&self.path).map_err(io("reading"))?;
        let text = String::from_utf8_lossy(&bytes);
        decode(&text)
            .map(Some)
            .map_err(|source| QuorumStateStoreError::Corrupt {
                path: self.path.clone(),
                source,
            })
    }

    /// Completes a [`crate::Action::PersistElectionState`]: writes `quorum-state.tmp`, fsyncs
    /// it, renames it over `quorum-state` and fsyncs the directory, so a crash leaves the old
    /// or the new state, never a torn one.
    ///
    /// # Errors
    /// [`QuorumStateStoreError::Io`]; the state must then be treated as not written.
    pub fn write(
        &self,
        state: &ElectionState,
        voters: &VoterSet,
    ) -> Result<(), QuorumStateStoreError> {
        let mut line = encode(state, voters);
        line.push('\n');
        crate::metadata_log::write_durably(&self.path, line.as_bytes()).map_err(|e| match e {
            crate::metadata_log::StorageError::Io { op, path, source } => {
                QuorumStateStoreError::Io { op, path, source }
            }
            crate::metadata_log::StorageError::Snapshot(crate::snapshot::SnapshotError::Io {
                op,
                path,
                source,
            }) => QuorumStateStoreError::Io { op, path, source },
            other => QuorumStateStoreError::Io {
                op: "writing",
                path: self.path.clone(),
                source: std::io::Error::other(other.to_string()),
            },
        })
    }
}

#[cfg(test)]
mod store_tests {
    use super::*;

    #[test]
    fn missing_is_fresh_written_reads_back_corrupt_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileQuorumStateStore::new(dir.path());
        assert!(store.read().unwrap().is_none());
        let voters = VoterSet::new([1, 2, 3]).unwrap();
        let state = ElectionState {
            epoch: 4,
            leader_id: None,
            voted_id: Some(2),
        };
        store.write(&state, &voters).unwrap();
        assert_eq!(store.read().unwrap(), Some((state, vec![1, 2, 3])));
        assert!(!dir.path().join("quorum-state.tmp").exists());
        std::fs::write(store.path(), "{\"leaderEpoch\":").unwrap();
        let err = store.read().unwrap_err().to_string();
        assert!(err.contains("quorum-state"), "{err}");
        assert!(err.contains("corrupt"), "{err}");
    }
}
