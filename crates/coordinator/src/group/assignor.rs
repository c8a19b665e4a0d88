//! KIP-848 server-side assignors: `uniform` (sticky and balanced, Kafka's `UniformAssignor`)
//! and `range` (Kafka's `RangeAssignor`: per topic, contiguous ranges over the members that
//! subscribe to it, sorted by member id).

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

/// A member's assignment: topic id -> partitions.
pub type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

/// What an assignor sees of a member.
pub struct MemberSpec<'a> {
    /// Member id.
    pub member_id: &'a str,
    /// Subscribed topic ids (resolved from names).
    pub topics: BTreeSet<Uuid>,
    /// The member's current target assignment (for stickiness).
    pub current: Option<&'a Assignment>,
}

/// A server-side assignor (Kafka's `ConsumerGroupPartitionAssignor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignor {
    /// `uniform`.
    Uniform,
    /// `range`.
    Range,
}

impl Assignor {
    /// Kafka's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Uniform => "uniform",
            Self::Range => "range",
        }
    }

    /// Assigns the partitions of `topics` (topic id -> partition count) to `members`.
    pub fn assign(
        self,
        members: &[MemberSpec<'_>],
        topics: &BTreeMap<Uuid, i32>,
    ) -> BTreeMap<String, Assignment> {
        match self {
            Self::Uniform => uniform(members, topics),
            Self::Range => range(members, topics),
        }
    }
}

/// The assignor called `name` (short name or Kafka's class name).
pub fn by_name(name: &str) -> Option<Assignor> {
    match short_name(name) {
        "uniform" => Some(Assignor::Uniform),
        "range" => Some(Assignor::Range),
        _ => None,
    }
}

/// `org.apache.kafka.coordinator.group.assignor.UniformAssignor` -> `uniform`, as Kafka accepts
/// both forms in `group.consumer.assignors`.
pub fn short_name(name: &str) -> &str {
    match name {
        "org.apache.kafka.coordinator.group.assignor.UniformAssignor" => "uniform",
        "org.apache.kafka.coordinator.group.assignor.RangeAssignor" => "range",
        other => other,
    }
}

fn uniform(
    members: &[MemberSpec<'_>],
    topics: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .iter()
        .map(|m| (m.member_id.to_string(), Assignment::new()))
        .collect();
    let mut count: BTreeMap<&str, usize> = members.iter().map(|m| (m.member_id, 0)).collect();
    if members.is_empty() {
        return out;
    }
    // Every partition some member subscribes to.
    let all: Vec<(Uuid, i32)> = topics
        .iter()
        .filter(|(t, _)| members.iter().any(|m| m.topics.contains(t)))
        .flat_map(|(t, n)| (0..*n).map(move |p| (*t, p)))
        .collect();
    let quota_min = all.len() / members.len();
    let mut extra = all.len() % members.len();
    let mut taken: BTreeSet<(Uuid, i32)> = BTreeSet::new();
    // 1. Stickiness: keep current partitions up to the quota (plus one while remainders last).
    for m in members {
        let Some(cur) = m.current else { continue };
        let mut kept = 0usize;
        for (t, ps) in cur {
            if !m.topics.contains(t) {
                continue;
            }
            let Some(n) = topics.get(t) else { continue };
            for p in ps {
                if *p >= *n || taken.contains(&(*t, *p)) {
                    continue;
                }
                let limit = quota_min + usize::from(extra > 0 && kept >= quota_min);
                if kept >= limit {
                    break;
                }
                if kept == quota_min {
                    extra -= 1;
                }
                kept += 1;
                taken.insert((*t, *p));
                out.entry(m.member_id.to_string())
                    .or_default()
                    .entry(*t)
                    .or_default()
                    .insert(*p);
            }
        }
        count.insert(m.member_id, kept);
    }
    // 2. The rest to the least-loaded subscribed member (ties by member id).
    for (t, p) in all {
        if taken.contains(&(t, p)) {
            continue;
        }
        let Some(best) = members
            .iter()
            .filter(|m| m.topics.contains(&t))
            .min_by_key(|m| (count.get(m.member_id).copied().unwrap_or(0), m.member_id))
        else {
            continue;
        };
        *count.entry(best.member_id).or_default() += 1;
        out.entry(best.member_id.to_string())
            .or_default()
            .entry(t)
            .or_default()
            .insert(p);
    }
    out
}

fn range(members: &[MemberSpec<'_>], topics: &BTreeMap<Uuid, i32>) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .iter()
        .map(|m| (m.member_id.to_string(), Assignment::new()))
        .collect();
    for (t, n) in topics {
        let mut subs: Vec<&str> = members
            .iter()
            .filter(|m| m.topics.contains(t))
            .map(|m| m.member_id)
            .collect();
        if subs.is_empty() {
            continue;
        }
        subs.sort_unstable();
        let n = *n as usize;
        let per = n / subs.len();
        let extra = n % subs.len();
        let mut next = 0usize;
        for (i, m) in subs.iter().enumerate() {
            let len = per + usize::from(i < extra);
            if len > 0 {
                let e = out
                    .entry((*m).to_string())
                    .or_default()
                    .entry(*t)
                    .or_default();
                for p in next..next + len {
                    e.insert(p as i32);
                }
            }
            next += len;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec<'a>(id: &'a str, topics: &[Uuid], current: Option<&'a Assignment>) -> MemberSpec<'a> {
        MemberSpec {
            member_id: id,
            topics: topics.iter().copied().collect(),
            current,
        }
    }

    fn sizes(a: &BTreeMap<String, Assignment>) -> Vec<usize> {
        a.values()
            .map(|x| x.values().map(BTreeSet::len).sum())
            .collect()
    }

    #[test]
    fn uniform_is_balanced_and_complete() {
        let t = Uuid::new_v4();
        let topics = BTreeMap::from([(t, 6)]);
        let a = Assignor::Uniform.assign(
            &[
                spec("a", &[t], None),
                spec("b", &[t], None),
                spec("c", &[t], None),
            ],
            &topics,
        );
        assert_eq!(sizes(&a), vec![2, 2, 2]);
        let all: BTreeSet<i32> = a.values().flat_map(|x| x[&t].iter().copied()).collect();
        assert_eq!(all.len(), 6);
    }

    #[test]
    fn uniform_is_sticky_when_a_member_joins() {
        let t = Uuid::new_v4();
        let topics = BTreeMap::from([(t, 6)]);
        let a = Assignor::Uniform.assign(&[spec("a", &[t], None), spec("b", &[t], None)], &topics);
        let b = Assignor::Uniform.assign(
            &[
                spec("a", &[t], Some(&a["a"])),
                spec("b", &[t], Some(&a["b"])),
                spec("c", &[t], None),
            ],
            &topics,
        );
        assert_eq!(sizes(&b), vec![2, 2, 2]);
        assert!(b["a"][&t].is_subset(&a["a"][&t]));
        assert!(b["b"][&t].is_subset(&a["b"][&t]));
    }

    #[test]
    fn range_gives_contiguous_ranges() {
        let t = Uuid::new_v4();
        let topics = BTreeMap::from([(t, 5)]);
        let a = Assignor::Range.assign(&[spec("b", &[t], None), spec("a", &[t], None)], &topics);
        assert_eq!(a["a"][&t], BTreeSet::from([0, 1, 2]));
        assert_eq!(a["b"][&t], BTreeSet::from([3, 4]));
    }
}
