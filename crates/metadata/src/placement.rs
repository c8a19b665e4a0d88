//! Replica placement for new partitions, as Kafka's `StripedReplicaPlacer` (KIP-631, KIP-660):
//! brokers are grouped by rack; each partition's first replica (its leader) is an unfenced
//! broker, taken from the racks in turn, and the other replicas are taken from the following
//! racks, unfenced brokers before fenced ones. Start positions are random, and after every
//! unfenced broker has led once the racks and brokers are shuffled, so leaders and replicas
//! spread evenly over racks and brokers. Brokers in controlled shutdown are not usable.

use std::collections::BTreeMap;

use rand::seq::SliceRandom;
use rand::Rng;

/// A broker replicas may be placed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsableBroker {
    /// Broker id.
    pub id: i32,
    /// `broker.rack`, None if unset.
    pub rack: Option<String>,
    /// Fenced brokers get replicas only when the unfenced ones are not enough, never the
    /// leader.
    pub fenced: bool,
}

/// Why the replicas cannot be placed: Kafka's `InvalidReplicationFactorException` messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// A replication factor of 0 or less.
    #[error("Invalid replication factor {0}: the replication factor must be positive.")]
    NonPositive(i32),
    /// More replicas than registered (usable) brokers.
    #[error("The target replication factor of {replication_factor} cannot be reached because only {brokers} broker(s) are registered.")]
    TooFewBrokers {
        /// Replicas asked for.
        replication_factor: i32,
        /// Usable brokers.
        brokers: usize,
    },
    /// No unfenced broker to lead.
    #[error("All brokers are currently fenced.")]
    AllFenced,
}

#[derive(Default)]
struct BrokerList {
    brokers: Vec<i32>,
    index: usize,
    offset: usize,
    epoch: usize,
}

impl BrokerList {
    fn initialize(&mut self, rng: &mut impl Rng) {
        if !self.brokers.is_empty() {
            self.brokers.sort_unstable();
            self.offset = rng.gen_range(0..self.brokers.len());
        }
    }

    /// The next broker of this list in placement round `epoch`; None once every broker of
    /// the list was taken in this round. A new round starts one further along.
    fn next(&mut self, epoch: usize) -> Option<i32> {
        if self.brokers.is_empty() {
            return None;
        }
        if self.epoch != epoch {
            self.epoch = epoch;
            self.index = 0;
            self.offset = (self.offset + 1) % self.brokers.len();
        }
        if self.index >= self.brokers.len() {
            return None;
        }
        let b = self.brokers[(self.index + self.offset) % self.brokers.len()];
        self.index += 1;
        Some(b)
    }
}

#[derive(Default)]
struct Rack {
    fenced: BrokerList,
    unfenced: BrokerList,
}

impl Rack {
    fn next(&mut self, epoch: usize) -> Option<i32> {
        self.unfenced
            .next(epoch)
            .or_else(|| self.fenced.next(epoch))
    }
}

/// The racks of the usable brokers and where the next placement starts.
struct RackList {
    racks: Vec<Rack>,
    total: usize,
    unfenced: usize,
    epoch: usize,
    offset: usize,
}

impl RackList {
    fn new(brokers: &[UsableBroker], rng: &mut impl Rng) -> Self {
        // Racks in name order, the no-rack group first (Kafka's `OptionalStringComparator`).
        let mut by_rack: BTreeMap<Option<&str>, Rack> = BTreeMap::new();
        let mut unfenced = 0;
        for b in brokers {
            let rack = by_rack.entry(b.rack.as_deref()).or_default();
            if b.fenced {
                rack.fenced.brokers.push(b.id);
            } else {
                unfenced += 1;
                rack.unfenced.brokers.push(b.id);
            }
        }
        let mut racks: Vec<Rack> = by_rack.into_values().collect();
        for r in &mut racks {
            r.fenced.initialize(rng);
            r.unfenced.initialize(rng);
        }
        let offset = if racks.is_empty() {
            0
        } else {
            rng.gen_range(0..racks.len())
        };
        Self {
            racks,
            total: brokers.len(),
            unfenced,
            epoch: 0,
            offset,
        }
    }

    fn shuffle(&mut self, rng: &mut impl Rng) {
        self.racks.shuffle(rng);
        for r in &mut self.racks {
            r.fenced.brokers.shuffle(rng);
            r.unfenced.brokers.shuffle(rng);
        }
    }

    fn place(&mut self, replication_factor: usize, rng: &mut impl Rng) -> Vec<i32> {
        if self.epoch == self.unfenced && self.unfenced > 1 {
            self.shuffle(rng);
            self.epoch = 0;
        }
        if self.offset == self.racks.len() {
            self.offset = 0;
        }
        let n = self.racks.len();
        let mut out = Vec::with_capacity(replication_factor);
        // The leader: the first unfenced broker from the racks, starting at `offset`.
        let mut first_rack = self.offset;
        loop {
            if let Some(b) = self.racks[first_rack].unfenced.next(self.epoch) {
                out.push(b);
                break;
            }
            first_rack = (first_rack + 1) % n;
        }
        // The others: one from each following rack in turn, skipping the leader's rack once.
        let mut skip = Some(first_rack);
        let mut rack = self.offset;
        while out.len() < replication_factor {
            let picked = if skip == Some(rack) {
                skip = None;
                None
            } else {
                self.racks[rack].next(self.epoch)
            };
            rack = (rack + 1) % n;
            if let Some(b) = picked {
                out.push(b);
            }
        }
        self.epoch += 1;
        self.offset += 1;
        out
    }
}

/// Places `num_partitions` partitions of `replication_factor` replicas on `brokers`; the first
/// replica of each is its leader.
///
/// # Errors
/// [`PlacementError`] with Kafka's message (the controller prefixes it with "Unable to
/// replicate the partition N time(s): ").
pub fn place(
    brokers: &[UsableBroker],
    num_partitions: usize,
    replication_factor: i32,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<i32>>, PlacementError> {
    let mut racks = RackList::new(brokers, rng);
    if replication_factor <= 0 {
        return Err(PlacementError::NonPositive(replication_factor));
    }
    if racks.unfenced == 0 {
        return Err(PlacementError::AllFenced);
    }
    let rf = replication_factor as usize;
    if rf > racks.total {
        return Err(PlacementError::TooFewBrokers {
            replication_factor,
            brokers: racks.total,
        });
    }
    Ok((0..num_partitions).map(|_| racks.place(rf, rng)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use std::collections::{BTreeSet, HashMap};

    fn broker(id: i32, rack: Option<&str>, fenced: bool) -> UsableBroker {
        UsableBroker {
            id,
            rack: rack.map(str::to_string),
            fenced,
        }
    }

    #[test]
    fn errors_are_kafkas() {
        let mut rng = StdRng::seed_from_u64(1);
        let two = [broker(1, None, false), broker(2, None, false)];
        assert_eq!(
            place(&two, 1, 3, &mut rng).unwrap_err().to_string(),
            "The target replication factor of 3 cannot be reached because only 2 broker(s) are registered."
        );
        assert_eq!(
            place(&two, 1, 0, &mut rng).unwrap_err(),
            PlacementError::NonPositive(0)
        );
        let fenced = [broker(1, None, true)];
        assert_eq!(
            place(&fenced, 1, 1, &mut rng).unwrap_err().to_string(),
            "All brokers are currently fenced."
        );
    }

    #[test]
    fn replicas_are_distinct_leaders_unfenced_and_spread_over_racks() {
        for seed in 0..50 {
            let mut rng = StdRng::seed_from_u64(seed);
            let brokers = [
                broker(1, Some("a"), false),
                broker(2, Some("a"), false),
                broker(3, Some("b"), false),
                broker(4, Some("b"), true),
                broker(5, Some("c"), false),
                broker(6, Some("c"), false),
            ];
            let rack: HashMap<i32, &str> = brokers
                .iter()
                .map(|b| (b.id, b.rack.as_deref().unwrap_or("")))
                .collect();
            let placed = place(&brokers, 50, 3, &mut rng).unwrap();
            let mut leaders = HashMap::new();
            for replicas in &placed {
                assert_eq!(replicas.len(), 3);
                assert_eq!(
                    replicas.iter().collect::<BTreeSet<_>>().len(),
                    3,
                    "{replicas:?}"
                );
                assert_ne!(replicas[0], 4, "a fenced broker never leads");
                let racks: BTreeSet<&str> = replicas.iter().map(|r| rack[r]).collect();
                assert_eq!(racks.len(), 3, "one replica per rack: {replicas:?}");
                *leaders.entry(replicas[0]).or_insert(0) += 1;
            }
            // 50 leaderships over 5 unfenced brokers: every one leads, none more than 3x its
            // share.
            assert_eq!(leaders.len(), 5, "{leaders:?}");
            assert!(
                leaders.values().all(|n| (3..=30).contains(n)),
                "{leaders:?}"
            );
        }
    }

    #[test]
    fn the_start_is_random() {
        let brokers: Vec<UsableBroker> = (1..=4).map(|i| broker(i, None, false)).collect();
        let leaders: BTreeSet<i32> = (0..40)
            .map(|seed| place(&brokers, 1, 1, &mut StdRng::seed_from_u64(seed)).unwrap()[0][0])
            .collect();
        assert_eq!(leaders.len(), 4);
    }
}
