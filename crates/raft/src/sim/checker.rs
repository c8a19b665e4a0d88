//! The safety checker of the simulator, run after every event on every live node.

use std::collections::BTreeMap;

use bytes::Bytes;
use gregor_protocol::batch;
use gregor_protocol::records::decode_records;

use super::Slot;
use crate::log::RaftLog;
use crate::node::Role;
use crate::snapshot::Snapshot;
use crate::types::{NodeId, OffsetAndEpoch};

/// A committed batch: its last offset, leader epoch, CRC, and the epoch in which the checker
/// first saw it committed (an upper bound of the epoch whose leader committed it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Committed {
    last_offset: i64,
    epoch: i32,
    crc: u32,
    committed_in_epoch: i32,
}

/// What the checker knows across nodes.
#[derive(Debug, Default)]
pub(super) struct Checker {
    /// The leader seen for each epoch.
    leaders: BTreeMap<i32, NodeId>,
    /// Committed batches by base offset: one contiguous prefix of the log.
    committed: BTreeMap<i64, Committed>,
    committed_end: i64,
    /// End of the committed prefix as known in each epoch (when first seen committed).
    committed_end_by_epoch: BTreeMap<i32, i64>,
    /// Log truncations seen (diverging epochs, crashes losing data, undone truncations).
    pub(super) truncations: u64,
}

impl Checker {
    /// End of everything committed in epochs before `epoch`: what a leader of `epoch` holds,
    /// and the least high watermark it may publish.
    pub(super) fn required_end(&self, epoch: i32) -> i64 {
        self.committed_end_by_epoch
            .range(..epoch)
            .map(|(_, &end)| end)
            .max()
            .unwrap_or(0)
    }

    /// Number of epochs that had a leader.
    pub(super) fn leaders_elected(&self) -> u64 {
        self.leaders.len() as u64
    }

    pub(super) fn committed_end(&self) -> i64 {
        self.committed_end
    }

    /// True when the batch at `base_offset` is committed with this epoch and content.
    pub(super) fn is_committed(&self, base_offset: i64, epoch: i32, crc: u32) -> bool {
        self.committed
            .get(&base_offset)
            .is_some_and(|c| c.epoch == epoch && c.crc == crc)
    }

    /// A snapshot's content (the simulator's state machine: one record per committed batch,
    /// whose value is the whole batch) must be exactly the committed prefix below its end
    /// offset, its epoch that of the last batch.
    pub(super) fn check_snapshot(
        &self,
        id: OffsetAndEpoch,
        snapshot: &Snapshot,
    ) -> Result<(), String> {
        let values = snapshot_values(snapshot)?;
        let mut next = 0;
        let mut last_epoch = 0;
        for v in &values {
            let h = batch::validate_batch(v)
                .map_err(|e| format!("snapshot {id:?} holds a bad batch: {e}"))?;
            if h.base_offset != next {
                return Err(format!(
                    "snapshot {id:?} holds batch at {} where {next} was expected",
                    h.base_offset
                ));
            }
            match self.committed.get(&h.base_offset) {
                Some(c) if (c.last_offset, c.epoch, c.crc) == (h.last_offset(), h.partition_leader_epoch, h.crc) => {}
                other => {
                    return Err(format!(
                        "snapshot {id:?} holds batch [{}..={}] epoch {} crc {:08x}, committed: {other:?}",
                        h.base_offset,
                        h.last_offset(),
                        h.partition_leader_epoch,
                        h.crc
                    ))
                }
            }
            next = h.last_offset() + 1;
            last_epoch = h.partition_leader_epoch;
        }
        if next != id.offset || (id.offset > 0 && last_epoch != id.epoch) {
            return Err(format!(
                "snapshot {id:?} holds the committed prefix up to {next} (epoch {last_epoch})"
            ));
        }
        Ok(())
    }

    pub(super) fn check_node(
        &mut self,
        slot: &mut Slot,
        anomalies_fail: bool,
    ) -> Result<(), String> {
        let id = slot.id;
        let Some(node) = slot.node.as_mut() else {
            return Ok(());
        };
        if anomalies_fail && node.anomalies() > 0 {
            return Err(format!(
                "node {id} saw a protocol anomaly: {}",
                node.last_anomaly().unwrap_or("?")
            ));
        }
        let epoch = node.epoch();
        if epoch < slot.last_epoch {
            return Err(format!(
                "node {id} went back from epoch {} to {epoch}",
                slot.last_epoch
            ));
        }
        slot.last_epoch = epoch;
        if let Some(persisted) = slot.persisted {
            if epoch < persisted.epoch {
                return Err(format!(
                    "node {id} is in epoch {epoch}, below its persisted epoch {}",
                    persisted.epoch
                ));
            }
        }
        let leo = node.log().log_end_offset();
        // What a leader of this epoch must hold: everything committed in earlier epochs (a
        // stale leader of an older epoch need not hold what newer leaders committed).
        let mut required = 0;
        if node.role() == Role::Leader {
            match self.leaders.get(&epoch) {
                Some(&other) if other != id => {
                    return Err(format!("two leaders in epoch {epoch}: {other} and {id}"));
                }
                Some(_) => {}
                None => {
                    self.leaders.insert(epoch, id);
                }
            }
            // Leader completeness: everything committed in an earlier epoch is in its log.
            required = self.required_end(epoch);
            if leo < required {
                return Err(format!(
                    "leader {id} of epoch {epoch} ends at {leo}, missing committed records up to {required}"
                ));
            }
        }

        // Agreement: below its published high watermark a node holds exactly the committed
        // batches (and extends the committed prefix with them); a leader holds every batch
        // committed in an earlier epoch.
        // Batches a follower appended before they were overwritten elsewhere are allowed until
        // its high watermark reaches them: it truncates them on its next fetch.
        let is_leader = node.role() == Role::Leader;
        let hw = slot.published_hw;
        if let Some(mark) = node.log_mut().take_truncation_mark() {
            self.truncations += 1;
            slot.verified_end = slot.verified_end.min(mark);
        }
        let batches = node.log().batches();
        // Batches below the log start are gone: the snapshot holding them was checked when it
        // was written or installed.
        let mut index = batches.partition_point(|b| b.base_offset < slot.verified_end);
        let mut verified_end = slot.verified_end;
        while index < batches.len() {
            let b = &batches[index];
            if !(b.last_offset < hw || (is_leader && b.base_offset < required)) {
                break;
            }
            if let Some(c) = self.committed.get(&b.base_offset) {
                if (c.last_offset, c.epoch, c.crc) != (b.last_offset, b.epoch, b.crc) {
                    return Err(format!(
                        "node {id} ({:?}, epoch {epoch}, hw {hw}) holds batch [{}..={}] epoch {} crc {:08x} where [{}..={}] epoch {} crc {:08x} was committed",
                        node.role(), b.base_offset, b.last_offset, b.epoch, b.crc,
                        b.base_offset, c.last_offset, c.epoch, c.crc
                    ));
                }
                index += 1;
                verified_end = b.last_offset + 1;
                continue;
            }
            if b.base_offset < self.committed_end {
                return Err(format!(
                    "node {id} ({:?}, epoch {epoch}, hw {hw}) holds batch [{}..={}] epoch {} that splits the committed prefix (ends at {})",
                    node.role(), b.base_offset, b.last_offset, b.epoch, self.committed_end
                ));
            }
            if b.base_offset != self.committed_end {
                return Err(format!(
                    "node {id} commits batch at {} but the committed prefix ends at {}",
                    b.base_offset, self.committed_end
                ));
            }
            self.committed.insert(
                b.base_offset,
                Committed {
                    last_offset: b.last_offset,
                    epoch: b.epoch,
                    crc: b.crc,
                    committed_in_epoch: epoch,
                },
            );
            self.committed_end = b.last_offset + 1;
            let end = self.committed_end_by_epoch.entry(epoch).or_insert(0);
            *end = (*end).max(self.committed_end);
            index += 1;
            verified_end = b.last_offset + 1;
        }
        slot.verified_end = verified_end;
        Ok(())
    }
}

/// The simulator's state machine in a snapshot: the record values, each a committed batch.
pub(super) fn snapshot_values(snapshot: &Snapshot) -> Result<Vec<Bytes>, String> {
    let mut values = Vec::new();
    for b in &snapshot.batches {
        let records = decode_records(b).map_err(|e| format!("snapshot {:?}: {e}", snapshot.id))?;
        for r in records {
            values.push(
                r.value
                    .ok_or_else(|| format!("snapshot {:?} holds a null value", snapshot.id))?,
            );
        }
    }
    Ok(values)
}

#[cfg(test)]
impl Checker {
    fn committed_epochs(&self) -> Vec<i32> {
        self.committed
            .values()
            .map(|c| c.committed_in_epoch)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batches::build_data_batch;
    use crate::config::QuorumConfig;
    use crate::log::MemoryLog;
    use crate::rng::Rng;
    use crate::types::{ElectionState, VoterSet};
    use crate::RaftNode;
    use bytes::Bytes;

    fn slot_with(id: NodeId, log: MemoryLog, hw: i64) -> Slot {
        let voters = VoterSet::new([1, 2, 3]).unwrap();
        let config = QuorumConfig::new(id, voters);
        let election = ElectionState {
            epoch: 5,
            leader_id: Some(3),
            voted_id: None,
        };
        let (node, _) = RaftNode::new(config.clone(), log, Some(election), Rng::new(1), 0);
        Slot {
            id,
            config,
            node: Some(node),
            log_down: None,
            persisted: Some(election),
            clock_offset_ms: 0,
            incarnation: 1,
            group: 0,
            tick_ms: 10,
            published_hw: hw,
            last_epoch: 0,
            verified_end: 0,
        }
    }

    fn log_of(values: &[(&str, i32)]) -> MemoryLog {
        let mut log = MemoryLog::new();
        for (v, epoch) in values {
            let b = build_data_batch(
                log.log_end_offset(),
                *epoch,
                0,
                &[Bytes::from(v.to_string())],
            );
            log.append_as_leader(b, *epoch).unwrap();
        }
        log
    }

    #[test]
    fn detects_a_changed_committed_batch() {
        let mut checker = Checker::default();
        let mut a = slot_with(1, log_of(&[("a", 1), ("b", 1)]), 2);
        checker.check_node(&mut a, true).unwrap();
        assert_eq!(checker.committed_end(), 2);
        assert_eq!(checker.committed_epochs(), vec![5, 5]);
        // Node 2 holds a different record at offset 1, not yet below its high watermark: it
        // will truncate it.
        let mut b = slot_with(2, log_of(&[("a", 1), ("x", 2)]), 1);
        checker.check_node(&mut b, true).unwrap();
        // Below its high watermark it is a violation.
        b.published_hw = 2;
        let err = checker.check_node(&mut b, true).unwrap_err();
        assert!(err.contains("was committed"), "{err}");
    }

    #[test]
    fn accepts_agreeing_logs_and_uncommitted_tails() {
        let mut checker = Checker::default();
        let mut a = slot_with(1, log_of(&[("a", 1), ("b", 1)]), 1);
        checker.check_node(&mut a, true).unwrap();
        let mut b = slot_with(2, log_of(&[("a", 1), ("other", 2)]), 1);
        checker.check_node(&mut b, true).unwrap();
        assert_eq!(checker.committed_end(), 1);
    }
}
