//! The memory budget for the index entries of inactive segments (`log.index.cache.bytes`).
//!
//! Kafka memory-maps every index file lazily ([KIP-263]: `LazyIndex`), so the page cache holds
//! the parts of the indexes that lookups touch. gregor keeps index entries in memory instead
//! (the `index` module); left alone they would grow with the data (about 20 bytes per
//! `index.interval.bytes` of log: 5 GB for 1 TB at the default 4096). So the entries of
//! inactive segments are read from their files on first use and held here, in one
//! process-wide set with a byte budget ([`set_max_bytes`]): when loading a segment's entries
//! takes the total above the budget, the entries of the segments least recently used are
//! dropped (CLOCK "second chance", as [`crate::files`] closes descriptors: a lookup sets a flag
//! without any shared lock; the hand clears flags and drops the first entries whose flag is
//! clear) and read again on their next use. The active segment's entries, which appends
//! write, are never charged here and never dropped.
//!
//! The total never exceeds the larger of the budget and the entries of the one segment just
//! loaded (a segment's own load never drops it, however large): others are dropped before it
//! is charged. Entries being read from their files are outside the total until installed; a
//! drop waits for the lookups reading the entries it drops.
//!
//! [KIP-263]: https://cwiki.apache.org/confluence/display/KAFKA/KIP-263%3A+Allow+broker+to+skip+sanity+check+of+inactive+segments+on+broker+startup

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// The budget when the broker sets none: 256 MiB (see [`set_max_bytes`]).
pub const DEFAULT_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// Something whose loaded entries the cache may drop: one segment's pair of indexes.
pub(crate) trait Evict: Send + Sync {
    /// The cache's bookkeeping for it.
    fn slot(&self) -> &CacheSlot;
    /// Drops the loaded entries (the next use reads them again). Called with the cache's lock
    /// held; must not call back into the cache.
    fn drop_entries(&self);
}

/// Per-owner bookkeeping. `charged` and `evictable` change only under the cache's lock (and
/// in `Drop`, when no one else can reach the slot).
pub(crate) struct CacheSlot {
    /// False while the owner is written to (the active segment, a segment being recovered
    /// or built by the cleaner): its entries are neither charged nor dropped.
    evictable: AtomicBool,
    /// Bytes of the owner's entries counted in the cache's total (0 when not charged).
    charged: AtomicU64,
    /// Set on every use; the CLOCK hand clears it once before dropping the entries.
    referenced: AtomicBool,
    /// Whether the ring holds an entry for this slot.
    in_ring: AtomicBool,
    /// The cache charged: the process's, or a test's own.
    cache: &'static IndexCache,
}

impl CacheSlot {
    /// A slot whose owner is `evictable` from the start (an inactive segment opened without
    /// loading its indexes) or not (a segment being written).
    pub(crate) fn new(evictable: bool) -> Self {
        Self::in_cache(evictable, &CACHE)
    }

    fn in_cache(evictable: bool, cache: &'static IndexCache) -> Self {
        Self {
            cache,
            evictable: AtomicBool::new(evictable),
            charged: AtomicU64::new(0),
            referenced: AtomicBool::new(false),
            in_ring: AtomicBool::new(false),
        }
    }

    /// Records a use of the loaded entries (no lock).
    pub(crate) fn touch(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
    }
}

impl Drop for CacheSlot {
    fn drop(&mut self) {
        let charged = *self.charged.get_mut();
        if charged > 0 {
            self.cache.bytes.fetch_sub(charged, Ordering::AcqRel);
        }
    }
}

struct Ring {
    /// Owners that are (or were, when they were pushed) charged, in the hand's order.
    slots: VecDeque<Weak<dyn Evict>>,
    /// Owners charged now.
    charged_slots: usize,
}

struct IndexCache {
    max_bytes: AtomicU64,
    ring: Mutex<Ring>,
    /// Bytes charged now.
    bytes: AtomicU64,
    /// Segments whose indexes were read from disk on first use (or again after a drop).
    loads_total: AtomicU64,
    /// Segments whose entries were dropped to stay within the budget.
    dropped_total: AtomicU64,
    /// Segments whose index files were rebuilt from their log while the log was served.
    rebuilds_total: AtomicU64,
}

static CACHE: IndexCache = IndexCache::new(DEFAULT_MAX_BYTES);

/// Sets the budget (`log.index.cache.bytes`, gregor's own setting): heap bytes of index
/// entries of inactive segments held at once, across every log of the process. Entries above
/// a lowered budget are dropped now.
///
/// The default, [`DEFAULT_MAX_BYTES`] (256 MiB), holds the indexes of about 50 GB of log at
/// the default `index.interval.bytes` (20 bytes of entries per 4 KiB): the segments that
/// consumers and replicas read behind the active one, on a broker of any size. A fixed
/// amount rather than a fraction of RAM, because a container's memory limit is not what
/// `/proc/meminfo` reports, and because the page cache (which serves the data those entries
/// point at) needs the rest. 0 keeps no inactive segment's entries beyond the lookup that
/// loaded them.
pub fn set_max_bytes(max_bytes: u64) {
    CACHE.set_max_bytes(max_bytes);
}

/// The budget [`set_max_bytes`] set.
pub fn max_bytes() -> u64 {
    CACHE.max_bytes.load(Ordering::Relaxed)
}

/// Figures of the index cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexCacheStats {
    /// Heap bytes of inactive segments' index entries held now.
    pub bytes: u64,
    /// The budget ([`max_bytes`]).
    pub max_bytes: u64,
    /// Segments whose index files were read on first use since the process started (a
    /// segment dropped and used again counts again).
    pub loads_total: u64,
    /// Segments whose entries were dropped to stay within the budget since the process
    /// started.
    pub dropped_total: u64,
    /// Segments whose index files were rebuilt from their log while it was served, since the
    /// process started: found not sane when loaded, or misleading a read (an entry pointing
    /// where no batch holds its offset; also while a log opens, replaying its producer state).
    /// The rebuild of a segment that recovery scans anyway is not counted.
    pub rebuilds_total: u64,
}

/// The cache's current figures.
pub fn stats() -> IndexCacheStats {
    CACHE.stats()
}

/// Counts a load of the index files of `slot`'s owner.
pub(crate) fn record_load(slot: &CacheSlot) {
    slot.cache.loads_total.fetch_add(1, Ordering::Relaxed);
}

/// Counts a rebuild of the index files of `slot`'s owner from its log.
pub(crate) fn record_rebuild(slot: &CacheSlot) {
    slot.cache.rebuilds_total.fetch_add(1, Ordering::Relaxed);
}

impl IndexCache {
    const fn new(max_bytes: u64) -> Self {
        Self {
            max_bytes: AtomicU64::new(max_bytes),
            ring: Mutex::new(Ring {
                slots: VecDeque::new(),
                charged_slots: 0,
            }),
            bytes: AtomicU64::new(0),
            loads_total: AtomicU64::new(0),
            dropped_total: AtomicU64::new(0),
            rebuilds_total: AtomicU64::new(0),
        }
    }

    fn set_max_bytes(&self, max_bytes: u64) {
        self.max_bytes.store(max_bytes, Ordering::Relaxed);
        let mut dropped = Vec::new();
        {
            let mut ring = self.ring.lock();
            self.evict(&mut ring, None, 0, &mut dropped);
        }
        drop(dropped);
    }

    fn stats(&self) -> IndexCacheStats {
        IndexCacheStats {
            bytes: self.bytes.load(Ordering::Acquire),
            max_bytes: self.max_bytes.load(Ordering::Relaxed),
            loads_total: self.loads_total.load(Ordering::Relaxed),
            dropped_total: self.dropped_total.load(Ordering::Relaxed),
            rebuilds_total: self.rebuilds_total.load(Ordering::Relaxed),
        }
    }
}

/// Runs `install`, which stores `owner`'s freshly loaded entries and returns their heap bytes,
/// under the cache's lock (so the hand never finds entries that are not charged yet), charges
/// them if `owner` is evictable, and drops other owners' entries while over the budget.
pub(crate) fn install<T: Evict + 'static>(owner: &Arc<T>, install: impl FnOnce() -> u64) {
    let cache = owner.slot().cache;
    let mut dropped = Vec::new();
    {
        let mut ring = cache.ring.lock();
        let bytes = install();
        if owner.slot().evictable.load(Ordering::Acquire) {
            cache.admit(&mut ring, owner, bytes, &mut dropped);
        }
    }
    drop(dropped);
}

/// Makes `owner`'s entries evictable (its segment stopped being written): `bytes` runs under
/// the cache's lock and returns the heap bytes of what is loaded now, which are charged.
pub(crate) fn make_evictable<T: Evict + 'static>(owner: &Arc<T>, bytes: impl FnOnce() -> u64) {
    let cache = owner.slot().cache;
    let mut dropped = Vec::new();
    {
        let mut ring = cache.ring.lock();
        owner.slot().evictable.store(true, Ordering::Release);
        let bytes = bytes();
        cache.admit(&mut ring, owner, bytes, &mut dropped);
    }
    drop(dropped);
}

/// Makes `slot`'s owner not evictable (it is about to be written): its entries stay loaded and
/// stop being charged. Once this returns, the hand never drops them.
pub(crate) fn pin(slot: &CacheSlot) {
    let mut ring = slot.cache.ring.lock();
    slot.evictable.store(false, Ordering::Release);
    let was = slot.charged.swap(0, Ordering::AcqRel);
    if was > 0 {
        slot.cache.bytes.fetch_sub(was, Ordering::AcqRel);
        ring.charged_slots = ring.charged_slots.saturating_sub(1);
    }
}

impl IndexCache {
    /// Charges `owner` `bytes`, first dropping other owners' entries until they fit within
    /// the budget (so the total never exceeds the larger of the budget and `bytes`, even for
    /// a moment).
    fn admit<T: Evict + 'static>(
        &self,
        ring: &mut Ring,
        owner: &Arc<T>,
        bytes: u64,
        hold: &mut Vec<Arc<dyn Evict>>,
    ) {
        let was = owner.slot().charged.load(Ordering::Acquire);
        let keep = Arc::as_ptr(owner).cast::<()>();
        self.evict(ring, Some(keep), bytes.saturating_sub(was), hold);
        self.charge(ring, owner, bytes);
    }

    /// Sets `owner`'s charge to `bytes` (under the lock), adding it to the ring if needed.
    fn charge<T: Evict + 'static>(&self, ring: &mut Ring, owner: &Arc<T>, bytes: u64) {
        let slot = owner.slot();
        let was = slot.charged.swap(bytes, Ordering::AcqRel);
        if bytes >= was {
            self.bytes.fetch_add(bytes - was, Ordering::AcqRel);
        } else {
            self.bytes.fetch_sub(was - bytes, Ordering::AcqRel);
        }
        match (was > 0, bytes > 0) {
            (false, true) => ring.charged_slots += 1,
            (true, false) => ring.charged_slots = ring.charged_slots.saturating_sub(1),
            _ => {}
        }
        if bytes > 0 && !slot.in_ring.swap(true, Ordering::AcqRel) {
            let weak: Weak<T> = Arc::downgrade(owner);
            let weak: Weak<dyn Evict> = weak;
            ring.slots.push_back(weak);
        }
        // Entries of dropped owners are skipped by the hand; keep the ring from growing with them
        // when nothing is evicted for a long time.
        // (Owners dropped while charged are not subtracted from `charged_slots` until then.)
        if ring.slots.len() > 2 * ring.charged_slots + 64 {
            ring.slots.retain(|w| match w.upgrade() {
                Some(o) if o.slot().charged.load(Ordering::Acquire) > 0 => true,
                Some(o) => {
                    o.slot().in_ring.store(false, Ordering::Release);
                    false
                }
                None => false,
            });
            ring.charged_slots = ring.slots.len();
        }
    }

    /// Moves the CLOCK hand until the total plus `reserve` is within the budget, never dropping
    /// the entries of `keep`. For two turns of the ring a used entry gets its second chance;
    /// entries that lookups in other threads keep using meanwhile go on a third turn anyway,
    /// so that only `keep` can remain above the budget. Owners upgraded on the way go to
    /// `hold`, to be released after the lock (the last reference to a segment may be one of
    /// them).
    fn evict(
        &self,
        ring: &mut Ring,
        keep: Option<*const ()>,
        reserve: u64,
        hold: &mut Vec<Arc<dyn Evict>>,
    ) {
        let max = self.max_bytes.load(Ordering::Relaxed);
        let turn = ring.slots.len();
        let mut visits = 3 * turn;
        while self.bytes.load(Ordering::Acquire).saturating_add(reserve) > max && visits > 0 {
            visits -= 1;
            let second_chance = visits >= turn;
            let Some(weak) = ring.slots.pop_front() else {
                return;
            };
            let Some(owner) = weak.upgrade() else {
                continue;
            };
            let slot = owner.slot();
            let charged = slot.charged.load(Ordering::Acquire);
            if charged == 0 || !slot.evictable.load(Ordering::Acquire) {
                slot.in_ring.store(false, Ordering::Release);
                hold.push(owner);
                continue;
            }
            let is_keep = keep.is_some_and(|k| std::ptr::eq(Arc::as_ptr(&owner).cast::<()>(), k));
            if is_keep || (slot.referenced.swap(false, Ordering::Relaxed) && second_chance) {
                ring.slots.push_back(weak);
                hold.push(owner);
                continue;
            }
            owner.drop_entries();
            slot.charged.store(0, Ordering::Release);
            slot.in_ring.store(false, Ordering::Release);
            self.bytes.fetch_sub(charged, Ordering::AcqRel);
            ring.charged_slots = ring.charged_slots.saturating_sub(1);
            self.dropped_total.fetch_add(1, Ordering::Relaxed);
            hold.push(owner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    struct Owner {
        slot: CacheSlot,
        loaded: Mutex<Option<Vec<u8>>>,
    }

    impl Evict for Owner {
        fn slot(&self) -> &CacheSlot {
            &self.slot
        }
        fn drop_entries(&self) {
            *self.loaded.lock() = None;
        }
    }

    fn owner(cache: &'static IndexCache, evictable: bool) -> Arc<Owner> {
        Arc::new(Owner {
            slot: CacheSlot::in_cache(evictable, cache),
            loaded: Mutex::new(None),
        })
    }

    fn load(o: &Arc<Owner>, bytes: usize) {
        install(o, || {
            *o.loaded.lock() = Some(vec![0; bytes]);
            bytes as u64
        });
    }

    #[test]
    fn over_the_budget_the_least_recently_used_go_and_pinned_ones_stay() {
        // A cache of its own: the process's is shared with the other tests.
        let cache: &'static IndexCache = Box::leak(Box::new(IndexCache::new(1000)));
        let pinned = owner(cache, false);
        load(&pinned, 5000);
        // Not charged: the active segment's entries are outside the budget.
        assert_eq!(cache.stats().bytes, 0);
        let owners: Vec<_> = (0..10).map(|_| owner(cache, true)).collect();
        let hot = &owners[0];
        for o in &owners {
            load(o, 300);
            // Used between every load: the second chance keeps it.
            hot.slot.touch();
            assert!(cache.stats().bytes <= 1000, "{:?}", cache.stats());
        }
        assert!(hot.loaded.lock().is_some());
        assert!(pinned.loaded.lock().is_some());
        let loaded = owners.iter().filter(|o| o.loaded.lock().is_some()).count();
        assert_eq!(loaded, 3);
        assert_eq!(cache.stats().dropped_total, 7);
        // An owner larger than the budget stays loaded: it is the one being used.
        let big = owner(cache, true);
        load(&big, 5000);
        assert!(big.loaded.lock().is_some());
        assert_eq!(cache.stats().bytes, 5000);
        // Pinned, it stops being charged; evictable again, it is charged again.
        pin(&big.slot);
        assert_eq!(cache.stats().bytes, 0);
        make_evictable(&big, || 5000);
        assert_eq!(cache.stats().bytes, 5000);
        // A lowered budget drops it; dropping an owner gives its bytes back.
        load(&owners[1], 300);
        cache.set_max_bytes(0);
        assert!(big.loaded.lock().is_none());
        assert_eq!(cache.stats().bytes, 0);
        cache.set_max_bytes(1000);
        load(&owners[2], 300);
        assert_eq!(cache.stats().bytes, 300);
        drop(owners);
        assert_eq!(cache.stats().bytes, 0);
    }
}
