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
