//! A history checker for fault tests, in the spirit of Jepsen's Kafka checkers: a test records
//! every operation it invokes (CreateTopics of a unique topic name, or one produced record
//! with a unique value sent to a chosen partition with acks=all), when it was invoked and
//! completed, and how it ended; after the faults it reads back the final state (the topics
//! listed, every partition consumed from its log start) and [`History::check`] reports:
//! - **lost**: acknowledged, but absent from the final state;
//! - **duplicated**: a record value present more than once (anywhere);
//! - **reordered**: within a partition, a record that sits at a lower offset than a record
//!   whose acknowledgement arrived before the first one was even sent (real-time order of a
//!   log: what is acknowledged before a send starts must come before it);
//! - **misplaced**: a record found in another partition than it was sent to, or, when the
//!   acknowledgement carried an offset, at another offset than acknowledged;
//! - **acknowledgement conflicts**: the broker's own answer contradicts the log. Two different
//!   acknowledged records acknowledged at the same (topic, partition, offset), or an
//!   acknowledged offset that holds another acknowledged record in the final log. A broker
//!   assigns each offset once and answers a retried batch with the offsets of the batch it
//!   already holds (Kafka's `ProducerStateEntry.findDuplicateBatch`), so either is a broker bug
//!   (a produce answered with offsets that do not hold its batch) unless the client invented
//!   the offsets; unlike a **misplaced** record, never excused as a client's duplicate;
//! - **unexpected**: present, but never sent (a topic or value no operation named);
//! - **offset gaps**: a partition of a produced-to topic whose offsets, read from the log
//!   start, are not contiguous (no transactions, no compaction: every offset holds a record);
//! - **reads gone** ([`History::check_reads`]): a record that a consumer saw while the faults
//!   ran but that is not at that offset in the final log (a read above the high watermark
//!   that a truncation later removed);
//! - operations whose outcome is unknown (timeouts, connections lost) split into present and
//!   absent; both are allowed. Definitely failed operations found present are counted too
//!   (a client that calls a write failed when it was not is worth knowing about).
//!
//! Times are milliseconds since the history was created, on a monotonic clock. Recording is
//! thread-safe: a [`History`] is shared between client threads behind an `Arc`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Mutex;
use std::time::Instant;

/// How an operation ended, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged; for a produced record, the offset the acknowledgement named, if any.
    Ok {
        /// The offset in the acknowledgement (produce), `None` for topics or when unknown.
        offset: Option<i64>,
    },
    /// Definitely not applied (the error guarantees it), with the error.
    Failed(String),
    /// Maybe applied: a timeout, a lost connection, a retriable error after which the client
    /// gave up. Also the outcome of an operation never completed when the history is checked.
    Unknown(String),
}

/// What an operation does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    /// CreateTopics of one topic with this (unique) name.
    CreateTopic {
        /// Topic name.
        name: String,
    },
    /// One record with a unique `value`, produced to `topic`-`partition`.
    Produce {
        /// Topic name.
        topic: String,
        /// Partition index.
        partition: i32,
        /// The record's value, unique in the history.
        value: String,
    },
}

/// One recorded operation.
#[derive(Debug, Clone)]
pub struct Op {
    /// What it does.
    pub kind: OpKind,
    /// When it was sent, ms since the history began.
    pub invoke_ms: u64,
    /// When its outcome arrived, ms since the history began; `None` while in flight.
    pub complete_ms: Option<u64>,
    /// Its outcome; `None` while in flight (checked as unknown).
    pub outcome: Option<Outcome>,
}

/// The index of an operation in its history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub usize);

/// Per (topic, partition): records as (offset, value), in the order read.
pub type PartitionRecords = BTreeMap<(String, i32), Vec<(i64, String)>>;

/// The state read back after the test: what the checker compares the history with.
#[derive(Debug, Clone, Default)]
pub struct FinalState {
    /// Every topic the cluster lists.
    pub topics: BTreeSet<String>,
    /// Per (topic, partition): the records read from the log start, as (offset, value), in
    /// the order read.
    pub records: PartitionRecords,
}

/// A record found in the final state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Value.
    pub value: String,
}

/// A pair of records out of real-time order within a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reordering {
    /// Topic and partition.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The record acknowledged first...
    pub earlier_value: String,
    /// ...at this offset...
    pub earlier_offset: i64,
    /// ...and the record sent after that acknowledgement...
    pub later_value: String,
    /// ...at this lower offset.
    pub later_offset: i64,
}

/// What [`History::check`] found. The history is valid when [`Report::is_valid`].
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Topic creations acknowledged.
    pub topics_acknowledged: usize,
    /// Acknowledged topics absent from the final state.
    pub topics_lost: Vec<String>,
    /// Unknown-outcome topic creations: present, absent.
    pub topics_unknown_present: usize,
    /// Unknown-outcome topic creations absent.
    pub topics_unknown_absent: usize,
    /// Definitely failed topic creations that are present anyway.
    pub topics_failed_present: Vec<String>,
    /// Records acknowledged.
    pub records_acknowledged: usize,
    /// Acknowledged records absent from their partition (and everywhere else).
    pub records_lost: Vec<(String, i32, String)>,
    /// Values present more than once, with every place they were found.
    pub records_duplicated: Vec<(String, Vec<Found>)>,
    /// Records out of real-time order within a partition.
    pub records_reordered: Vec<Reordering>,
    /// Records found in another partition, or at another offset than acknowledged.
    pub records_misplaced: Vec<(Found, String)>,
    /// Acknowledged records whose acknowledged offset does not hold them in the final log
    /// (whether or not a copy of them is elsewhere): the [`Found`] names the record and its
    /// acknowledged offset, the text what the log holds there. Each also makes its copies
    /// misplaced; a duplicate's copies are misplaced while the acknowledged offset holds one of
    /// them, which this does not count.
    pub acked_elsewhere: Vec<(Found, String)>,
    /// Acknowledgement conflicts, with what conflicts: two acknowledged records with the
    /// same acknowledged (topic, partition, offset), or an acknowledged record whose
    /// acknowledged offset holds another acknowledged record in the final log. The [`Found`]
    /// is the record whose acknowledgement is contradicted, at its acknowledged offset.
    pub ack_conflicts: Vec<(Found, String)>,
    /// Unknown-outcome records present.
    pub records_unknown_present: usize,
    /// Unknown-outcome records absent.
    pub records_unknown_absent: usize,
    /// Definitely failed records present anyway.
    pub records_failed_present: Vec<String>,
    /// Records present that no operation sent (in the topics the history produced to).
    pub records_unexpected: Vec<Found>,
    /// Non-contiguous offsets in a partition: (topic, partition, expected offset, found).
    pub offset_gaps: Vec<(String, i32, i64, i64)>,
    /// Records a consumer saw during the run that the final log does not hold at that offset
    /// (filled by [`History::check_reads`]), with what the final log holds there.
    pub reads_gone: Vec<(Found, String)>,
}

impl Report {
    /// True when nothing acknowledged was lost and no record is duplicated, reordered,
    /// misplaced or unexpected, and nothing that definitely failed is present.
    pub fn is_valid(&self) -> bool {
        self.topics_lost.is_empty()
            && self.topics_failed_present.is_empty()
            && self.records_lost.is_empty()
            && self.records_duplicated.is_empty()
            && self.records_reordered.is_empty()
            && self.records_misplaced.is_empty()
            && self.ack_conflicts.is_empty()
            && self.records_failed_present.is_empty()
            && self.records_unexpected.is_empty()
            && self.offset_gaps.is_empty()
            && self.reads_gone.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "topics: {} acknowledged, {} lost, unknown {} present / {} absent, {} failed but present",
            self.topics_acknowledged,
            self.topics_lost.len(),
            self.topics_unknown_present,
            self.topics_unknown_absent,
            self.topics_failed_present.len()
        )?;
        write!(
            f,
            "records: {} acknowledged, {} lost, {} duplicated, {} reordered, {} misplaced, \
             {} acknowledged elsewhere, {} acknowledgement conflicts, {} unexpected, unknown {} present / {} absent, {} failed but present, {} offset \
             gaps, {} reads gone",
            self.records_acknowledged,
            self.records_lost.len(),
            self.records_duplicated.len(),
            self.records_reordered.len(),
            self.records_misplaced.len(),
            self.acked_elsewhere.len(),
            self.ack_conflicts.len(),
            self.records_unexpected.len(),
            self.records_unknown_present,
            self.records_unknown_absent,
            self.records_failed_present.len(),
            self.offset_gaps.len(),
            self.reads_gone.len()
        )?;
        // The first few of each problem, enough to start debugging.
        for t in self.topics_lost.iter().take(5) {
            write!(f, "\n  lost topic {t}")?;
        }
        for (t, p, v) in self.records_lost.iter().take(5) {
            write!(f, "\n  lost record {v} of {t}-{p}")?;
        }
        for (v, places) in self.records_duplicated.iter().take(5) {
            write!(f, "\n  duplicated {v}: {places:?}")?;
        }
        for r in self.records_reordered.iter().take(5) {
            write!(
                f,
                "\n  reordered in {}-{}: {} acknowledged at offset {} before {} was sent, \
                 which is at offset {}",
                r.topic,
                r.partition,
                r.earlier_value,
                r.earlier_offset,
                r.later_value,
                r.later_offset
            )?;
        }
        for (found, why) in self.records_misplaced.iter().take(5) {
            write!(f, "\n  misplaced {found:?}: {why}")?;
        }
        for (found, why) in self.acked_elsewhere.iter().take(5) {
            write!(f, "\n  acknowledged elsewhere {found:?}: {why}")?;
        }
        for (found, why) in self.ack_conflicts.iter().take(5) {
            write!(f, "\n  acknowledgement conflict {found:?}: {why}")?;
        }
        for found in self.records_unexpected.iter().take(5) {
            write!(f, "\n  unexpected {found:?}")?;
        }
        for (t, p, want, got) in self.offset_gaps.iter().take(5) {
            write!(f, "\n  offset gap in {t}-{p}: expected {want}, found {got}")?;
        }
        for (found, why) in self.reads_gone.iter().take(5) {
            write!(f, "\n  read gone {found:?}: {why}")?;
        }
        Ok(())
    }
}

/// A thread-safe record of operations.
#[derive(Debug)]
pub struct History {
    start: Instant,
    ops: Mutex<Vec<Op>>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            ops: Mutex::new(Vec::new()),
        }
    }

    /// Milliseconds since the history began.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The history's clock at `at` (0 before the history began).
    pub fn ms_at(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_millis()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Op>> {
        // A panicking recorder leaves the vector consistent (every change is one push or one
        // field write), so a poisoned lock is still usable.
        self.ops
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that `kind` is being sent now.
    pub fn invoke(&self, kind: OpKind) -> OpId {
        let invoke_ms = self.now_ms();
        let mut ops = self.lock();
        ops.push(Op {
            kind,
            invoke_ms,
            complete_ms: None,
            outcome: None,
        });
        OpId(ops.len() - 1)
    }

    /// Records how `id` ended, now. A second completion of the same operation is ignored
    /// (the first outcome the client reported stands).
    pub fn complete(&self, id: OpId, outcome: Outcome) {
        let now = self.now_ms();
        self.complete_at(id, now, outcome);
    }

    /// Records how `id` ended, at `complete_ms` on the history's clock.
    pub fn complete_at(&self, id: OpId, complete_ms: u64, outcome: Outcome) {
        let mut ops = self.lock();
        if let Some(op) = ops.get_mut(id.0) {
            if op.outcome.is_none() {
                op.complete_ms = Some(complete_ms.max(op.invoke_ms));
                op.outcome = Some(outcome);
            }
        }
    }

    /// Records a whole operation at once (for synthetic histories).
    pub fn record(&self, kind: OpKind, invoke_ms: u64, complete_ms: u64, outcome: Outcome) -> OpId {
        let mut ops = self.lock();
        ops.push(Op {
            kind,
            invoke_ms,
            complete_ms: Some(complete_ms.max(invoke_ms)),
            outcome: Some(outcome),
        });
        OpId(ops.len() - 1)
    }

    /// A copy of every operation recorded so far.
    pub fn ops(&self) -> Vec<Op> {
        self.lock().clone()
    }

    /// The completion time of the first acknowledged operation invoked at or after `from_ms`
    /// that `filter` accepts, ms on the history's clock.
    pub fn first_ack_invoked_after(
        &self,
        from_ms: u64,
        filter: impl Fn(&OpKind) -> bool,
    ) -> Option<u64> {
        self.lock()
            .iter()
            .filter(|op| op.invoke_ms >= from_ms && filter(&op.kind))
            .filter(|op| matches!(op.outcome, Some(Outcome::Ok { .. })))
            .filter_map(|op| op.complete_ms)
            .min()
    }

    /// Acknowledged operations that `filter` accepts.
    pub fn acknowledged(&self, filter: impl Fn(&OpKind) -> bool) -> usize {
        self.lock()
            .iter()
            .filter(|op| filter(&op.kind) && matches!(op.outcome, Some(Outcome::Ok { .. })))
            .count()
    }

    /// Compares the history with the final state.
    pub fn check(&self, state: &FinalState) -> Report {
        let ops = self.ops();
        let mut report = Report::default();
        check_topics(&ops, state, &mut report);
        check_records(&ops, state, &mut report);
        report
    }

    /// [`History::check`], plus every record in `observed` (what consumers read while the
    /// faults ran, any number of times) must be at its offset in the final state: Kafka
    /// hands consumers only records below the high watermark, which no later leader may
    /// truncate. Records of topics the final state does not hold are not checked.
    pub fn check_reads(&self, state: &FinalState, observed: &[Found]) -> Report {
        let mut report = self.check(state);
        let mut at: HashMap<(&str, i32, i64), &str> = HashMap::new();
        for ((topic, partition), records) in &state.records {
            for (offset, value) in records {
                at.insert((topic.as_str(), *partition, *offset), value.as_str());
            }
        }
        let mut seen = BTreeSet::new();
        for o in observed {
            if !state.records.contains_key(&(o.topic.clone(), o.partition))
                || !seen.insert((&o.topic, o.partition, o.offset, &o.value))
            {
                continue;
            }
            match at.get(&(o.topic.as_str(), o.partition, o.offset)) {
                Some(v) if *v == o.value => {}
                Some(v) => report
                    .reads_gone
                    .push((o.clone(), format!("the final log holds {v} there"))),
                None => report
                    .reads_gone
                    .push((o.clone(), "the final log has no record there".to_string())),
            }
        }
        report
    }

    /// Seconds, in whole one-second windows from the first produce invoked to `until_ms`, in
    /// which no produce was acknowledged although producers were sending: the time the
    /// cluster was unavailable for writes.
    pub fn unavailable_seconds(&self, until_ms: u64) -> u64 {
        let ops = self.ops();
        let produces = || {
            ops.iter()
                .filter(|op| matches!(op.kind, OpKind::Produce { .. }))
        };
        let Some(start) = produces().map(|op| op.invoke_ms).min() else {
            return 0;
        };
        let windows = usize::try_from(until_ms.saturating_sub(start) / 1000).unwrap_or(0);
        let mut acked = vec![false; windows];
        let mut sending = vec![false; windows];
        let index = |ms: u64| usize::try_from(ms.saturating_sub(start) / 1000).ok();
        for op in produces() {
            let end = op.complete_ms.unwrap_or(until_ms);
            if let (Some(a), Some(b)) = (index(op.invoke_ms), index(end)) {
                for w in sending
                    .iter_mut()
                    .take(b.min(windows.saturating_sub(1)) + 1)
                    .skip(a)
                {
                    *w = true;
                }
            }
            if let (Some(Outcome::Ok { .. }), Some(c)) = (&op.outcome, op.complete_ms) {
                if let Some(w) = index(c).and_then(|i| acked.get_mut(i)) {
                    *w = true;
                }
            }
        }
        let down = sending
            .iter()
            .zip(&acked)
            .filter(|(s, a)| **s && !**a)
            .count();
        u64::try_from(down).unwrap_or(u64::MAX)
    }
}

fn check_topics(ops: &[Op], state: &FinalState, report: &mut Report) {
    for op in ops {
        let OpKind::CreateTopic { name } = &op.kind else {
            continue;
        };
        let present = state.topics.contains(name);
        match &op.outcome {
            Some(Outcome::Ok { .. }) => {
                report.topics_acknowledged += 1;
                if !present {
                    report.topics_lost.push(name.clone());
                }
            }
            Some(Outcome::Failed(_)) => {
                if present {
                    report.topics_failed_present.push(name.clone());
                }
            }
            Some(Outcome::Unknown(_)) | None => {
                if present {
                    report.topics_unknown_present += 1;
                } else {
                    report.topics_unknown_absent += 1;
                }
            }
        }
    }
}

/// Acknowledgement conflicts (see [`Report::ack_conflicts`]): `values` sorted, `at` the final
/// log by (topic, partition, offset).
fn check_ack_conflicts(
    values: &[&&str],
    sent: &HashMap<&str, Sent<'_>>,
    at: &HashMap<(&str, i32, i64), &str>,
    report: &mut Report,
) {
    let acked_offset = |s: &Sent<'_>| match s.outcome {
        Some(Outcome::Ok { offset: Some(o) }) => Some(*o),
        _ => None,
    };
    let mut by_offset: BTreeMap<(&str, i32, i64), Vec<&str>> = BTreeMap::new();
    for value in values {
        let s = &sent[**value];
        if let Some(o) = acked_offset(s) {
            by_offset
                .entry((s.topic, s.partition, o))
                .or_default()
                .push(**value);
        }
    }
    for ((topic, partition, offset), claimants) in &by_offset {
        let found = |value: &str| Found {
            topic: (*topic).to_string(),
            partition: *partition,
            offset: *offset,
            value: value.to_string(),
        };
        if claimants.len() > 1 {
            for v in claimants {
                report.ack_conflicts.push((
                    found(v),
                    format!("acknowledged at the same offset as {claimants:?}"),
                ));
            }
        }
        // The offset holds an acknowledged record other than the ones acknowledged there.
        let Some(holder) = at.get(&(*topic, *partition, *offset)) else {
            continue;
        };
        if claimants.contains(holder) {
            continue;
        }
        let holder_acked = sent
            .get(holder)
            .is_some_and(|s| matches!(s.outcome, Some(Outcome::Ok { .. })));
        if holder_acked {
            for v in claimants {
                report.ack_conflicts.push((
                    found(v),
                    format!("the final log holds {holder} there, which was acknowledged too"),
                ));
            }
        }
    }
}

/// A produce operation as the record checks see it.
struct Sent<'a> {
    topic: &'a str,
    partition: i32,
    invoke_ms: u64,
    /// `u64::MAX` when not acknowledged: such a record constrains nothing sent after it.
    ack_ms: u64,
    outcome: Option<&'a Outcome>,
}

fn check_records(ops: &[Op], state: &FinalState, report: &mut Report) {
    let mut sent: HashMap<&str, Sent<'_>> = HashMap::new();
    let mut topics: BTreeSet<&str> = BTreeSet::new();
    for op in ops {
        if let OpKind::Produce {
            topic,
            partition,
            value,
        } = &op.kind
        {
            topics.insert(topic);
            let ack_ms = match (&op.outcome, op.complete_ms) {
                (Some(Outcome::Ok { .. }), Some(c)) => c,
                _ => u64::MAX,
            };
            sent.insert(
                value,
                Sent {
                    topic,
                    partition: *partition,
                    invoke_ms: op.invoke_ms,
                    ack_ms,
                    outcome: op.outcome.as_ref(),
                },
            );
        }
    }

    // Where every value of the produced-to topics was found.
    let mut places: HashMap<&str, Vec<Found>> = HashMap::new();
    for ((topic, partition), records) in &state.records {
        if !topics.contains(topic.as_str()) {
            continue;
        }
        for (offset, value) in records {
            let found = Found {
                topic: topic.clone(),
                partition: *partition,
                offset: *offset,
                value: value.clone(),
            };
            if !sent.contains_key(value.as_str()) {
                report.records_unexpected.push(found);
                continue;
            }
            places.entry(value.as_str()).or_default().push(found);
        }
    }

    // What the final log holds at each offset of the produced-to topics.
    let mut at: HashMap<(&str, i32, i64), &str> = HashMap::new();
    for ((topic, partition), records) in &state.records {
        if topics.contains(topic.as_str()) {
            for (offset, value) in records {
                at.insert((topic.as_str(), *partition, *offset), value.as_str());
            }
        }
    }

    let mut values: Vec<&&str> = sent.keys().collect();
    values.sort();
    check_ack_conflicts(&values, &sent, &at, report);
    for value in values {
        let s = &sent[*value];
        let found = places.get(*value).map_or(&[][..], Vec::as_slice);
        let home: Vec<&Found> = found
            .iter()
            .filter(|f| f.topic == s.topic && f.partition == s.partition)
            .collect();
        if found.len() > 1 {
            report
                .records_duplicated
                .push(((*value).to_string(), found.to_vec()));
        }
        for f in found
            .iter()
            .filter(|f| f.topic != s.topic || f.partition != s.partition)
        {
            report
                .records_misplaced
                .push((f.clone(), format!("sent to {}-{}", s.topic, s.partition)));
        }
        match s.outcome {
            Some(Outcome::Ok { offset }) => {
                report.records_acknowledged += 1;
                if home.is_empty() {
                    report.records_lost.push((
                        s.topic.to_string(),
                        s.partition,
                        (*value).to_string(),
                    ));
                }
                if let Some(acked) = offset {
                    let there = at
                        .get(&(s.topic, s.partition, *acked))
                        .map_or_else(|| "no record".to_string(), |v| (*v).to_string());
                    if !home.is_empty() && there != **value {
                        report.acked_elsewhere.push((
                            Found {
                                topic: s.topic.to_string(),
                                partition: s.partition,
                                offset: *acked,
                                value: (*value).to_string(),
                            },
                            format!("the final log holds {there} there"),
                        ));
                    }
                    for f in home.iter().filter(|f| f.offset != *acked) {
                        report.records_misplaced.push((
                            (*f).clone(),
                            format!("acknowledged at offset {acked}, which holds {there}"),
                        ));
                    }
                }
            }
            Some(Outcome::Failed(_)) => {
                if !found.is_empty() {
                    report.records_failed_present.push((*value).to_string());
                }
            }
            Some(Outcome::Unknown(_)) | None => {
                if found.is_empty() {
                    report.records_unknown_absent += 1;
                } else {
                    report.records_unknown_present += 1;
                }
            }
        }
    }

    // Contiguous offsets from the first record read, in every produced-to partition.
    for ((topic, partition), records) in &state.records {
        if !topics.contains(topic.as_str()) {
            continue;
        }
        if let Some(first) = records.first() {
            let mut want = first.0;
            for (offset, _) in records {
                if *offset != want {
                    report
                        .offset_gaps
                        .push((topic.clone(), *partition, want, *offset));
                }
                want = offset + 1;
            }
        }
    }

    // Real-time order per partition: for each record B found at its home, no record A found
    // at a higher offset may have been acknowledged before B was sent. Sweep B in invoke
    // order while adding the As in acknowledgement order, keeping the highest offset.
    for ((topic, partition), records) in &state.records {
        let mut entries: Vec<(&Sent<'_>, i64, &str)> = records
            .iter()
            .filter_map(|(offset, value)| {
                let s = sent.get(value.as_str())?;
                (s.topic == topic && s.partition == *partition).then_some((
                    s,
                    *offset,
                    value.as_str(),
                ))
            })
            .collect();
        if entries.is_empty() {
            continue;
        }
        entries.sort_by_key(|e| (e.0.invoke_ms, e.1));
        let mut acked: Vec<(u64, i64, &str)> = entries
            .iter()
            .filter(|e| e.0.ack_ms != u64::MAX)
            .map(|e| (e.0.ack_ms, e.1, e.2))
            .collect();
        acked.sort_by_key(|a| a.0);
        let mut next = 0;
        let mut highest: Option<(i64, &str)> = None;
        for (s, offset, value) in &entries {
            while next < acked.len() && acked[next].0 < s.invoke_ms {
                if highest.is_none_or(|(o, _)| acked[next].1 > o) {
                    highest = Some((acked[next].1, acked[next].2));
                }
                next += 1;
            }
            if let Some((high, high_value)) = highest {
                if high > *offset {
                    report.records_reordered.push(Reordering {
                        topic: topic.clone(),
                        partition: *partition,
                        earlier_value: high_value.to_string(),
                        earlier_offset: high,
                        later_value: (*value).to_string(),
                        later_offset: *offset,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn produce(value: &str, partition: i32) -> OpKind {
        OpKind::Produce {
            topic: "t".into(),
            partition,
            value: value.into(),
        }
    }

    fn ok(offset: i64) -> Outcome {
        Outcome::Ok {
            offset: Some(offset),
        }
    }

    fn topic(name: &str) -> OpKind {
        OpKind::CreateTopic { name: name.into() }
    }

    fn state(records: &[(i32, &[(i64, &str)])]) -> FinalState {
        let mut s = FinalState::default();
        for (p, rs) in records {
            s.records.insert(
                ("t".into(), *p),
                rs.iter().map(|(o, v)| (*o, (*v).to_string())).collect(),
            );
        }
        s
    }

    #[test]
    fn a_clean_history_is_valid() {
        let h = History::new();
        h.record(produce("a", 0), 0, 5, ok(0));
        h.record(produce("b", 0), 6, 9, ok(1));
        // Concurrent sends may land in either order.
        h.record(produce("c", 0), 10, 20, ok(3));
        h.record(produce("d", 0), 11, 19, ok(2));
        h.record(
            produce("e", 1),
            0,
            100,
            Outcome::Unknown("timed out".into()),
        );
        h.record(
            produce("f", 1),
            0,
            100,
            Outcome::Unknown("timed out".into()),
        );
        h.record(
            produce("g", 1),
            0,
            1,
            Outcome::Failed("INVALID_RECORD".into()),
        );
        let r = h.check(&state(&[
            (0, &[(0, "a"), (1, "b"), (2, "d"), (3, "c")]),
            (1, &[(0, "e")]),
        ]));
        assert!(r.is_valid(), "{r}");
        assert_eq!(r.records_acknowledged, 4);
        assert_eq!(
            (r.records_unknown_present, r.records_unknown_absent),
            (1, 1)
        );
    }

    #[test]
    fn a_lost_acknowledged_record_is_reported() {
        let h = History::new();
        h.record(produce("a", 0), 0, 5, ok(0));
        h.record(produce("b", 0), 6, 9, ok(1));
        let r = h.check(&state(&[(0, &[(0, "a")])]));
        assert!(!r.is_valid());
        assert_eq!(r.records_lost, [("t".to_string(), 0, "b".to_string())]);
    }

    #[test]
    fn a_duplicate_is_reported() {
        let h = History::new();
        h.record(produce("a", 0), 0, 5, ok(0));
        h.record(produce("b", 0), 6, 9, ok(1));
        let r = h.check(&state(&[(0, &[(0, "a"), (1, "b"), (2, "a")])]));
        assert!(!r.is_valid());
        assert_eq!(r.records_duplicated.len(), 1);
        assert_eq!(r.records_duplicated[0].0, "a");
        assert_eq!(r.records_duplicated[0].1.len(), 2);
        assert!(r.records_lost.is_empty());
        // The copy at offset 2 is not where "a" was acknowledged.
        assert_eq!(r.records_misplaced.len(), 1);
    }

    #[test]
    fn a_duplicate_of_an_unknown_outcome_is_reported() {
        let h = History::new();
        h.record(produce("a", 0), 0, 5, Outcome::Unknown("timed out".into()));
        let r = h.check(&state(&[(0, &[(0, "a"), (1, "a")])]));
        assert!(!r.is_valid());
        assert_eq!(r.records_duplicated.len(), 1);
    }

    #[test]
    fn reordering_against_real_time_is_reported() {
        let h = History::new();
        // "a" is acknowledged at 5, "b" is sent at 6, yet "b" sits before "a".
        h.record(produce("a", 0), 0, 5, Outcome::Ok { offset: None });
        h.record(produce("b", 0), 6, 9, Outcome::Ok { offset: None });
        let r = h.check(&state(&[(0, &[(0, "b"), (1, "a")])]));
        assert!(!r.is_valid());
        assert_eq!(
            r.records_reordered,
            [Reordering {
                topic: "t".into(),
                partition: 0,
                earlier_value: "a".into(),
                earlier_offset: 1,
                later_value: "b".into(),
                later_offset: 0,
            }]
        );
        // An unknown-outcome record sent after an acknowledgement is bound by it too.
        let h = History::new();
        h.record(produce("a", 0), 0, 5, Outcome::Ok { offset: None });
        h.record(produce("b", 0), 6, 9, Outcome::Unknown("timed out".into()));
        let r = h.check(&state(&[(0, &[(0, "b"), (1, "a")])]));
        assert_eq!(r.records_reordered.len(), 1);
        // Other partitions do not constrain each other.
        let h = History::new();
        h.record(produce("a", 0), 0, 5, ok(7));
        h.record(produce("b", 1), 6, 9, ok(0));
        let r = h.check(&state(&[(0, &[(7, "a")]), (1, &[(0, "b")])]));
        assert!(r.is_valid(), "{r}");
    }

    #[test]
    fn misplaced_and_unexpected_records_are_reported() {
        let h = History::new();
        h.record(produce("a", 0), 0, 5, ok(0));
        h.record(produce("b", 0), 6, 9, ok(1));
        let r = h.check(&state(&[(0, &[(0, "a"), (1, "zzz")]), (1, &[(0, "b")])]));
        assert!(!r.is_valid());
        assert_eq!(r.records_lost.len(), 1, "b is not in its partition");
        assert_eq!(r.records_misplaced.len(), 1);
        assert_eq!(r.records_unexpected.len(), 1);
        assert_eq!(r.records_unexpected[0].value, "zzz");
        // Found at another offset than acknowledged.
        let h = History::new();
        h.record(produce("a", 0), 0, 5, ok(3));
        let r = h.check(&state(&[(0, &[(0, "a")])]));
        assert_eq!(r.records_misplaced.len(), 1);
    }

    #[test]
    fn acknowledgement_conflicts_are_reported() {
        // Two records acknowledged at the same offset: a broker answer no log can match.
        let h = History::new();
        h.record(produce("a", 0), 0, 5, ok(0));
        h.record(produce("b", 0), 0, 6, ok(0));
        let r = h.check(&state(&[(0, &[(0, "a"), (1, "b")])]));
        assert!(!r.is_valid());
        assert_eq!(r.ack_conflicts.len(), 2, "{r}");
        assert!(r.ack_conflicts.iter().all(|(f, _)| f.offset == 0));
        // An acknowledged offset that holds another acknowledged record.
        let h = History::new();
        h.record(produce("a", 0), 0, 5, ok(0));
        h.record(produce("b", 0), 0, 6, ok(1));
        h.record(produce("c", 0), 0, 7, ok(1));
        let r = h.check(&state(&[(0, &[(0, "a"), (1, "b"), (2, "c")])]));
        let conflicted: Vec<&str> = r
            .ack_conflicts
            .iter()
            .map(|(f, _)| f.value.as_str())
            .collect();
        // b and c share offset 1 (two entries); c's offset holds b, acknowledged (no extra
        // entry: b is one of the records acknowledged there).
        assert_eq!(conflicted, ["b", "c"], "{r}");
        let h = History::new();
        h.record(produce("a", 0), 0, 5, ok(0));
        h.record(produce("b", 0), 0, 6, ok(0));
        h.record(produce("c", 0), 0, 7, ok(2));
        let r = h.check(&state(&[(0, &[(0, "c"), (1, "a"), (2, "b")])]));
        // a and b share offset 0 (two entries), which holds c, acknowledged (two more);
        // offset 2 holds b, acknowledged too (one more, for c).
        assert_eq!(r.ack_conflicts.len(), 5, "{r}");
        assert!(r
            .ack_conflicts
            .iter()
            .any(|(f, why)| f.value == "c" && f.offset == 2 && why.contains("holds b")));
        // Misplaced but not conflicting: the acknowledged offset holds a record of unknown
        // outcome, or nothing, or the record itself (a client's duplicate of it elsewhere).
        let h = History::new();
        h.record(produce("a", 0), 0, 5, ok(1));
        h.record(produce("u", 0), 0, 6, Outcome::Unknown("timed out".into()));
        h.record(produce("b", 0), 0, 7, ok(9));
        h.record(produce("c", 0), 0, 8, ok(3));
        let r = h.check(&state(&[(
            0,
            &[(0, "a"), (1, "u"), (2, "b"), (3, "c"), (4, "c")],
        )]));
        assert!(r.ack_conflicts.is_empty(), "{r}");
        assert_eq!(r.records_misplaced.len(), 3, "{r}");
        // a's offset holds u; b's nothing; c's holds c (a copy of c is elsewhere).
        let elsewhere: Vec<(&str, i64)> = r
            .acked_elsewhere
            .iter()
            .map(|(f, _)| (f.value.as_str(), f.offset))
            .collect();
        assert_eq!(elsewhere, [("a", 1), ("b", 9)], "{r}");
        assert!(r.records_misplaced[0].1.contains("which holds u"), "{r}");
    }

    #[test]
    fn offset_gaps_and_reads_gone_are_reported() {
        let h = History::new();
        h.record(produce("a", 0), 0, 5, ok(0));
        h.record(produce("b", 0), 6, 9, ok(2));
        let r = h.check(&state(&[(0, &[(0, "a"), (2, "b")])]));
        assert_eq!(r.offset_gaps, [("t".to_string(), 0, 1, 2)]);
        assert!(!r.is_valid());

        let h = History::new();
        h.record(produce("a", 0), 0, 5, ok(0));
        h.record(produce("b", 0), 6, 9, Outcome::Unknown("timed out".into()));
        h.record(produce("c", 0), 6, 9, ok(1));
        let final_state = state(&[(0, &[(0, "a"), (1, "c")])]);
        let seen = |offset: i64, value: &str| Found {
            topic: "t".into(),
            partition: 0,
            offset,
            value: value.into(),
        };
        // Seen twice at the right place: fine.
        let r = h.check_reads(&final_state, &[seen(0, "a"), seen(0, "a"), seen(1, "c")]);
        assert!(r.is_valid(), "{r}");
        // "b" was read at offset 1, then truncated away and replaced by "c"; and a read at
        // offset 2, beyond the final log.
        let r = h.check_reads(&final_state, &[seen(1, "b"), seen(2, "c")]);
        assert_eq!(r.reads_gone.len(), 2, "{r}");
        assert!(!r.is_valid());
    }

    #[test]
    fn unavailable_seconds_count_windows_without_acknowledgements() {
        let h = History::new();
        // Acknowledged in seconds 0, 1 and 4; sending throughout; seconds 2 and 3 without.
        h.record(produce("a", 0), 0, 100, ok(0));
        h.record(produce("b", 0), 1000, 1100, ok(1));
        h.record(produce("c", 0), 1900, 4200, ok(2));
        h.record(
            produce("d", 0),
            2500,
            4900,
            Outcome::Unknown("timed out".into()),
        );
        assert_eq!(h.unavailable_seconds(5000), 2);
        // Nothing sent: nothing unavailable.
        assert_eq!(History::new().unavailable_seconds(5000), 0);
    }

    #[test]
    fn failed_but_present_is_reported() {
        let h = History::new();
        h.record(
            produce("a", 0),
            0,
            5,
            Outcome::Failed("NOT_ENOUGH_REPLICAS".into()),
        );
        h.record(
            topic("x"),
            0,
            5,
            Outcome::Failed("INVALID_REPLICATION_FACTOR".into()),
        );
        let mut s = state(&[(0, &[(0, "a")])]);
        s.topics.insert("x".into());
        let r = h.check(&s);
        assert!(!r.is_valid());
        assert_eq!(r.records_failed_present, ["a"]);
        assert_eq!(r.topics_failed_present, ["x"]);
    }

    #[test]
    fn topics_lost_and_unknown_are_counted() {
        let h = History::new();
        h.record(topic("a"), 0, 5, Outcome::Ok { offset: None });
        h.record(topic("b"), 6, 9, Outcome::Ok { offset: None });
        h.record(topic("c"), 10, 30, Outcome::Unknown("timed out".into()));
        h.record(topic("d"), 10, 30, Outcome::Unknown("timed out".into()));
        // Still in flight when checked: unknown.
        h.invoke(topic("e"));
        let s = FinalState {
            topics: ["a", "c", "e"].iter().map(|s| (*s).to_string()).collect(),
            records: BTreeMap::new(),
        };
        let r = h.check(&s);
        assert!(!r.is_valid());
        assert_eq!(r.topics_acknowledged, 2);
        assert_eq!(r.topics_lost, ["b"]);
        assert_eq!((r.topics_unknown_present, r.topics_unknown_absent), (2, 1));
        let s = FinalState {
            topics: ["a", "b"].iter().map(|s| (*s).to_string()).collect(),
            records: BTreeMap::new(),
        };
        assert!(h.check(&s).is_valid());
    }

    #[test]
    fn completion_is_recorded_once_and_first_ack_is_found() {
        let h = History::new();
        let a = h.invoke(topic("a"));
        h.complete_at(a, 50, Outcome::Ok { offset: None });
        h.complete_at(a, 60, Outcome::Failed("late".into()));
        assert_eq!(h.ops()[0].outcome, Some(Outcome::Ok { offset: None }));
        h.record(topic("b"), 100, 180, Outcome::Unknown("timed out".into()));
        h.record(topic("c"), 120, 150, Outcome::Ok { offset: None });
        h.record(topic("d"), 130, 140, Outcome::Ok { offset: None });
        assert_eq!(h.first_ack_invoked_after(100, |_| true), Some(140));
        assert_eq!(h.first_ack_invoked_after(200, |_| true), None);
        assert_eq!(
            h.acknowledged(|k| matches!(k, OpKind::CreateTopic { .. })),
            3
        );
    }
}
