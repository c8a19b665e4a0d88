//! Incremental fetch sessions (KIP-227), as Kafka 4.4's `FetchSessionCache` / `FetchManager`.
//!
//! A client that sends a full fetch (`SessionEpoch` 0) may be given a session id: the broker
//! caches the request's partitions with their fetch parameters and the high watermark, last
//! stable offset and log start offset it answered. The client's next fetches are incremental
//! (`SessionEpoch` 1, 2, ...): they list only partitions whose parameters changed (a new fetch
//! offset, say) and `ForgottenTopicsData` for partitions to drop; the broker reads every cached
//! partition and leaves out of the response those with nothing the client would act on (no
//! records, no error, the same high watermark, last stable offset and log start offset, no
//! diverging epoch, no preferred read replica). A partition with records moves to the end of
//! the session, so a size-limited response does not starve the partitions behind it.
//!
//! Session metadata, as Kafka's `FetchMetadata`: epoch 0 (`INITIAL`) asks for a new session
//! (closing the one named by a non-zero id); epoch -1 (`FINAL`) is a sessionless fetch, and with
//! a non-zero id closes that session; any other epoch is incremental and must name a session
//! this broker holds (FETCH_SESSION_ID_NOT_FOUND otherwise) at the epoch it expects
//! (INVALID_FETCH_SESSION_EPOCH otherwise), with topic ids when the session was created with
//! them (Fetch v13+, KIP-516) and names when not (FETCH_SESSION_TOPIC_ID_ERROR otherwise).
//! Fetch v0-v6 have no session fields and are always sessionless.
//!
//! The cache, as Kafka's: 8 shards, each holding `max.incremental.fetch.session.cache.slots / 8`
//! sessions (so fewer than 8 slots hold none); new sessions go to the shards in turn, and
//! session ids are random in the shard's range, never 0. A new session that finds its shard
//! full may evict, in this order: the least recently used session if it has been unused for
//! more than the eviction time (`min.incremental.fetch.session.eviction.ms`, 120000 ms);
//! otherwise the least valuable evictable session, if the new one is worth more. A session is
//! evictable by a follower's (privileged) session unless it is itself privileged and younger
//! than the eviction time, and evictable by anyone once older than the eviction time; worth
//! orders privileged above not, then more partitions above fewer.
//!
//! Bounds (gregor's; Kafka has none beyond the slot count): a session holds at most as many
//! partitions as the cluster's metadata has plus [`PARTITION_SLACK`], and a name-keyed session
//! only names of at most [`MAX_TOPIC_NAME_LEN`] bytes (no topic has a longer name). A full
//! fetch beyond that gets no session (it is answered, sessionless); an incremental fetch that
//! would grow its session beyond it closes the session and is answered
//! FETCH_SESSION_ID_NOT_FOUND, after which clients send full fetches. So the cache holds at
//! most `slots × (partitions + slack)` entries of bounded size, whatever clients send.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use uuid::Uuid;

use crate::error_codes as ec;

/// The session id of "no session" (Kafka's `FetchMetadata.INVALID_SESSION_ID`).
pub const INVALID_SESSION_ID: i32 = 0;
/// The epoch of a full fetch that asks for a new session (`FetchMetadata.INITIAL_EPOCH`).
pub const INITIAL_EPOCH: i32 = 0;
/// The epoch of a sessionless fetch, or of one closing its session (`FetchMetadata.FINAL_EPOCH`).
pub const FINAL_EPOCH: i32 = -1;
/// Shards of the cache (Kafka's `KafkaBroker.NumFetchSessionCacheShards`).
pub const NUM_SHARDS: usize = 8;
/// `max.incremental.fetch.session.cache.slots`' default.
pub const DEFAULT_CACHE_SLOTS: i32 = 1000;
/// `min.incremental.fetch.session.eviction.ms`' default (Kafka's fixed
/// `MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS`), in ms.
pub const DEFAULT_EVICTION_MS: i64 = 120_000;
/// The longest topic name Kafka accepts, in bytes; longer names are never cached.
pub const MAX_TOPIC_NAME_LEN: usize = 249;
/// Partitions a session may hold beyond those in the metadata (topics a client knows before
/// this broker does).
pub const PARTITION_SLACK: usize = 100;

/// The epoch after `prev` (Kafka's `FetchMetadata.nextEpoch`): FINAL stays FINAL, the largest
/// epoch wraps to 1.
pub fn next_epoch(prev: i32) -> i32 {
    if prev < 0 {
        FINAL_EPOCH
    } else if prev == i32::MAX {
        1
    } else {
        prev + 1
    }
}

/// How a session names a topic: by id when it was created with topic ids (Fetch v13+), by name
/// otherwise.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TopicKey {
    /// Topic id (KIP-516).
    Id(Uuid),
    /// Topic name.
    Name(Arc<str>),
}

/// A partition of a session.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PartitionKey {
    /// The topic.
    pub topic: TopicKey,
    /// The partition index.
    pub partition: i32,
}

/// What a fetch request says about one partition (Kafka's `FetchRequest.PartitionData`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionParams {
    /// First offset wanted.
    pub fetch_offset: i64,
    /// The follower's log start offset, -1 for consumers.
    pub log_start_offset: i64,
    /// Bytes for this partition (soft for the first batch, KIP-74).
    pub max_bytes: i32,
    /// The client's leader epoch, -1 when not given (KIP-320).
    pub current_leader_epoch: i32,
    /// The epoch of the follower's last fetched batch, -1 when not given.
    pub last_fetched_epoch: i32,
}

/// One partition to read: from the request (sessionless and full fetches) or from the session
/// (incremental fetches).
#[derive(Clone, Debug)]
pub struct SessionPartition {
    /// The key (id or name).
    pub key: PartitionKey,
    /// The topic's name; `None` for a topic id this broker's metadata does not know.
    pub name: Option<Arc<str>>,
    /// The topic's id as the client sent it (nil before Fetch v13).
    pub topic_id: Uuid,
    /// Fetch parameters.
    pub params: PartitionParams,
}

/// What the response says about one partition: all the omission rules look at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionOutcome {
    /// Error code (0 none).
    pub error_code: i16,
    /// High watermark answered.
    pub high_watermark: i64,
    /// Last stable offset answered.
    pub last_stable_offset: i64,
    /// Log start offset answered.
    pub log_start_offset: i64,
    /// Bytes of records answered.
    pub records_bytes: usize,
    /// Whether a diverging epoch is answered (a follower must truncate).
    pub diverging_epoch: bool,
    /// Whether a preferred read replica is answered (KIP-392).
    pub preferred_read_replica: bool,
}

/// What to do with a fetch request (Kafka's `FetchContext` kinds).
#[derive(Debug)]
pub enum FetchContext {
    /// A session error: answer the top-level error, session id 0 and no partitions.
    SessionError(i16),
    /// Read the request's partitions; answer session id 0.
    Sessionless,
    /// Read the request's partitions; then try to create a session with them
    /// ([`FetchSessionCache::create_session`]).
    Full {
        /// A follower's session (privileged for eviction).
        privileged: bool,
        /// Whether the session keys partitions by topic id (Fetch v13+).
        uses_topic_ids: bool,
    },
    /// Read every partition of the session, in this order; then
    /// [`FetchSessionCache::complete_incremental`] says which to answer.
    Incremental {
        /// The session.
        session_id: i32,
        /// The request's epoch.
        request_epoch: i32,
        /// The session's partitions after the request's changes.
        partitions: Vec<SessionPartition>,
    },
}

/// The session fields and partitions of one fetch request.
#[derive(Debug)]
pub struct FetchRequestView<'a> {
    /// The request's version.
    pub version: i16,
    /// `SessionId`.
    pub session_id: i32,
    /// `SessionEpoch`.
    pub epoch: i32,
    /// Whether the request comes from a follower (replica id >= 0).
    pub is_follower: bool,
    /// The request's partitions.
    pub partitions: &'a [SessionPartition],
    /// `ForgottenTopicsData`, flattened.
    pub forgotten: &'a [PartitionKey],
}

struct Cached {
    part: SessionPartition,
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
}

impl Cached {
    /// Whether the partition must be in an incremental response; records what was answered
    /// (Kafka's `CachedPartition.maybeUpdateResponseData`, plus the last stable offset: a
    /// read_committed client's lag reads it).
    fn must_respond(&mut self, o: &PartitionOutcome) -> bool {
        let mut must = o.records_bytes > 0 || o.preferred_read_replica || o.diverging_epoch;
        if self.high_watermark != o.high_watermark {
            must = true;
            self.high_watermark = o.high_watermark;
        }
        if self.last_stable_offset != o.last_stable_offset {
            must = true;
            self.last_stable_offset = o.last_stable_offset;
        }
        if self.log_start_offset != o.log_start_offset {
            must = true;
            self.log_start_offset = o.log_start_offset;
        }
        if o.error_code != ec::NONE {
            // Forget the high watermark, so the partition is answered again once the error
            // has gone.
            self.high_watermark = -1;
            must = true;
        }
        must
    }
}

struct Session {
    privileged: bool,
    uses_topic_ids: bool,
    creation_ms: i64,
    last_used_ms: i64,
    /// The epoch the next incremental request must carry.
    epoch: i32,
    /// The size the shard last accounted for; `None` before the first touch.
    cached_size: Option<usize>,
    parts: Vec<Cached>,
    index: HashMap<PartitionKey, usize>,
}

impl Session {
    fn reindex(&mut self) {
        self.index.clear();
        for (i, c) in self.parts.iter().enumerate() {
            self.index.insert(c.part.key.clone(), i);
        }
    }

    /// Applies an incremental request (Kafka's `FetchSession.update`): new partitions are
    /// added at the end, known ones take the request's parameters, forgotten ones go.
    /// Returns the number added.
    fn update(&mut self, data: &[SessionPartition], forgotten: &[PartitionKey]) -> usize {
        let mut added = 0;
        for p in data {
            match self.index.get(&p.key) {
                Some(&i) => self.parts[i].part.params = p.params,
                None => {
                    self.index.insert(p.key.clone(), self.parts.len());
                    self.parts.push(Cached {
                        part: p.clone(),
                        high_watermark: -1,
                        last_stable_offset: -1,
                        log_start_offset: -1,
                    });
                    added += 1;
                }
            }
        }
        if forgotten.iter().any(|k| self.index.contains_key(k)) {
            let gone: std::collections::HashSet<&PartitionKey> = forgotten.iter().collect();
            self.parts.retain(|c| !gone.contains(&c.part.key));
            self.reindex();
        }
        added
    }
}

/// Eviction key: `(privileged, size, id)`, least valuable first (Kafka's `EvictableKey`).
type EvictableKey = (bool, usize, i32);

struct Shard {
    num: usize,
    id_range: i32,
    max_entries: usize,
    eviction_ms: i64,
    sessions: HashMap<i32, Session>,
    last_used: BTreeSet<(i64, i32)>,
    evictable_by_all: BTreeSet<EvictableKey>,
    evictable_by_privileged: BTreeSet<EvictableKey>,
    num_partitions: usize,
    rng: u64,
}

impl Shard {
    /// A random id in this shard's range, unused and not 0.
    fn new_session_id(&mut self) -> i32 {
        let low = i64::from(self.id_range) * self.num as i64;
        let low = low.max(1);
        let high = i64::from(self.id_range) * (self.num as i64 + 1);
        loop {
            // splitmix64
            self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let span = (high - low) as u64;
            let id = (low + (z % span) as i64) as i32;
            if id != INVALID_SESSION_ID && !self.sessions.contains_key(&id) {
                return id;
            }
        }
    }

    fn evictable_key(id: i32, s: &Session) -> Option<EvictableKey> {
        s.cached_size.map(|size| (s.privileged, size, id))
    }

    fn remove(&mut self, id: i32) -> bool {
        let Some(s) = self.sessions.remove(&id) else {
            return false;
        };
        self.last_used.remove(&(s.last_used_ms, id));
        if let Some(k) = Self::evictable_key(id, &s) {
            self.evictable_by_all.remove(&k);
            self.evictable_by_privileged.remove(&k);
        }
        self.num_partitions -= s.cached_size.unwrap_or(0);
        true
    }

    /// Records a use of session `id` at `now` and its current size (Kafka's `touch`).
    fn touch(&mut self, id: i32, now: i64) {
        let eviction_ms = self.eviction_ms;
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        self.last_used.remove(&(s.last_used_ms, id));
        s.last_used_ms = now;
        self.last_used.insert((now, id));
        if let Some(k) = Self::evictable_key(id, s) {
            self.evictable_by_all.remove(&k);
            self.evictable_by_privileged.remove(&k);
            self.num_partitions -= k.1;
        }
        s.cached_size = Some(s.parts.len());
        let key = (s.privileged, s.parts.len(), id);
        let old = now - s.creation_ms > eviction_ms;
        if !s.privileged || old {
            self.evictable_by_privileged.insert(key);
        }
        if old {
            self.evictable_by_all.insert(key);
        }
        self.num_partitions += s.parts.len();
    }

    /// Makes room for a new session of `size` partitions by evicting one, if the rules allow
    /// (Kafka's `tryEvict`). Returns whether one was evicted.
    fn try_evict(&mut self, privileged: bool, size: usize, now: i64) -> bool {
        let Some(&(last_used, id)) = self.last_used.first() else {
            return false;
        };
        if now - last_used > self.eviction_ms {
            self.remove(id);
            return true;
        }
        let candidates = if privileged {
            &self.evictable_by_privileged
        } else {
            &self.evictable_by_all
        };
        match candidates.first() {
            Some(&first) if (privileged, size, 0) >= first => {
                self.remove(first.2);
                true
            }
            _ => false,
        }
    }
}

/// Counters and gauges of the cache (Kafka's `NumIncrementalFetchSessions`,
/// `NumIncrementalFetchPartitionsCached`, `IncrementalFetchSessionEvictionsPerSec`).
struct Stats {
    sessions: AtomicI64,
    partitions: AtomicI64,
    evictions: AtomicU64,
    sessions_gauge: metrics::Gauge,
    partitions_gauge: metrics::Gauge,
    evictions_counter: metrics::Counter,
}

/// The broker's fetch sessions. Thread-safe: each shard has its own lock, held only while a
/// session is looked up or updated (never across a read of the log).
pub struct FetchSessionCache {
    shards: Vec<Mutex<Shard>>,
    next_shard: AtomicUsize,
    started: Instant,
    stats: Stats,
}

impl FetchSessionCache {
    /// A cache of `slots` sessions (`max.incremental.fetch.session.cache.slots`, at least 0)
    /// in [`NUM_SHARDS`] shards; sessions unused for `eviction_ms` may be evicted.
    pub fn new(slots: i32, eviction_ms: i64) -> Self {
        let per_shard = usize::try_from(slots.max(0)).unwrap_or(0) / NUM_SHARDS;
        let id_range = i32::MAX / NUM_SHARDS as i32;
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let shards = (0..NUM_SHARDS)
            .map(|num| {
                Mutex::new(Shard {
                    num,
                    id_range,
                    max_entries: per_shard,
                    eviction_ms,
                    sessions: HashMap::new(),
                    last_used: BTreeSet::new(),
                    evictable_by_all: BTreeSet::new(),
                    evictable_by_privileged: BTreeSet::new(),
                    num_partitions: 0,
                    rng: seed ^ (num as u64).wrapping_mul(0xA076_1D64_78BD_642F),
                })
            })
            .collect();
        Self {
            shards,
            next_shard: AtomicUsize::new(0),
            started: Instant::now(),
            stats: Stats {
                sessions: AtomicI64::new(0),
                partitions: AtomicI64::new(0),
                evictions: AtomicU64::new(0),
                sessions_gauge: metrics::gauge!(crate::observability::FETCH_SESSIONS),
                partitions_gauge: metrics::gauge!(crate::observability::FETCH_SESSION_PARTITIONS),
                evictions_counter: metrics::counter!(
                    crate::observability::FETCH_SESSION_EVICTIONS_TOTAL
                ),
            },
        }
    }

    /// Milliseconds on this cache's monotonic clock.
    pub fn now_ms(&self) -> i64 {
        i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Sessions held.
    pub fn len(&self) -> usize {
        usize::try_from(self.stats.sessions.load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Partitions cached across all sessions.
    pub fn total_partitions(&self) -> usize {
        usize::try_from(self.stats.partitions.load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// Sessions evicted since start-up.
    pub fn evictions(&self) -> u64 {
        self.stats.evictions.load(Ordering::Relaxed)
    }

    /// The shard of a session id, `None` for an id no shard hands out.
    fn shard_of(&self, id: i32) -> Option<usize> {
        let range = i32::MAX / NUM_SHARDS as i32;
        usize::try_from(id / range)
            .ok()
            .filter(|s| id > 0 && *s < NUM_SHARDS)
    }

    /// Runs `f` on shard `idx` and accounts the sessions and partitions it added or removed.
    fn with_shard<T>(&self, idx: usize, f: impl FnOnce(&mut Shard) -> T) -> T {
        let mut shard = self.shards[idx].lock();
        let (sessions, partitions) = (shard.sessions.len(), shard.num_partitions);
        let out = f(&mut shard);
        let ds = shard.sessions.len() as i64 - sessions as i64;
        let dp = shard.num_partitions as i64 - partitions as i64;
        drop(shard);
        if ds != 0 {
            self.stats.sessions.fetch_add(ds, Ordering::Relaxed);
            self.stats.sessions_gauge.increment(ds as f64);
        }
        if dp != 0 {
            self.stats.partitions.fetch_add(dp, Ordering::Relaxed);
            self.stats.partitions_gauge.increment(dp as f64);
        }
        out
    }

    fn count_eviction(&self) {
        self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        self.stats.evictions_counter.increment(1);
    }

    /// Decides how to serve a fetch request (Kafka's `FetchManager.newContext`); an
    /// incremental request updates its session and advances its epoch here. `resolve` names a
    /// topic id; `max_partitions` is the most partitions a session may hold (called only when a
    /// session grows).
    pub fn new_context(
        &self,
        req: &FetchRequestView<'_>,
        resolve: &dyn Fn(&Uuid) -> Option<Arc<str>>,
        max_partitions: &dyn Fn() -> usize,
        now: i64,
    ) -> FetchContext {
        if req.version < 7 {
            return FetchContext::Sessionless;
        }
        if req.epoch == INITIAL_EPOCH || req.epoch == FINAL_EPOCH {
            if req.session_id != INVALID_SESSION_ID {
                // A full fetch closes the session it names.
                if let Some(idx) = self.shard_of(req.session_id) {
                    self.with_shard(idx, |s| s.remove(req.session_id));
                }
            }
            return if req.epoch == FINAL_EPOCH {
                FetchContext::Sessionless
            } else {
                FetchContext::Full {
                    privileged: req.is_follower,
                    uses_topic_ids: req.version >= 13,
                }
            };
        }
        let Some(idx) = self.shard_of(req.session_id) else {
            return FetchContext::SessionError(ec::FETCH_SESSION_ID_NOT_FOUND);
        };
        self.with_shard(idx, |shard| {
            let Some(session) = shard.sessions.get_mut(&req.session_id) else {
                return FetchContext::SessionError(ec::FETCH_SESSION_ID_NOT_FOUND);
            };
            if session.epoch != req.epoch {
                return FetchContext::SessionError(ec::INVALID_FETCH_SESSION_EPOCH);
            }
            if session.uses_topic_ids != (req.version >= 13) {
                return FetchContext::SessionError(ec::FETCH_SESSION_TOPIC_ID_ERROR);
            }
            let added = session.update(req.partitions, req.forgotten);
            if added > 0
                && (session.parts.len() > max_partitions()
                    || req.partitions.iter().any(name_too_long))
            {
                shard.remove(req.session_id);
                return FetchContext::SessionError(ec::FETCH_SESSION_ID_NOT_FOUND);
            }
            if session.parts.is_empty() {
                // The last partition was forgotten: the session ends, this fetch is
                // sessionless (and reads nothing).
                shard.remove(req.session_id);
                return FetchContext::Sessionless;
            }
            for c in &mut session.parts {
                if c.part.name.is_none() {
                    if let TopicKey::Id(id) = &c.part.key.topic {
                        c.part.name = resolve(id);
                    }
                }
            }
            session.epoch = next_epoch(session.epoch);
            let partitions = session.parts.iter().map(|c| c.part.clone()).collect();
            shard.touch(req.session_id, now);
            FetchContext::Incremental {
                session_id: req.session_id,
                request_epoch: req.epoch,
                partitions,
            }
        })
    }

    /// After a full fetch was read: tries to create a session of its partitions and what was
    /// answered for them (Kafka's `FullFetchContext.updateAndGenerateResponseData`). Returns
    /// the new session's id, or [`INVALID_SESSION_ID`] when there is no room or the request is
    /// beyond the bounds (see the module doc). A full fetch of no partitions gets an empty
    /// session, as in Kafka.
    pub fn create_session(
        &self,
        privileged: bool,
        uses_topic_ids: bool,
        answered: &[(SessionPartition, PartitionOutcome)],
        max_partitions: &dyn Fn() -> usize,
        now: i64,
    ) -> i32 {
        let idx = self.next_shard.fetch_add(1, Ordering::Relaxed) % NUM_SHARDS;
        if answered.len() > max_partitions() || answered.iter().any(|(p, _)| name_too_long(p)) {
            return INVALID_SESSION_ID;
        }
        let mut parts: Vec<Cached> = Vec::with_capacity(answered.len());
        let mut index = HashMap::with_capacity(answered.len());
        for (p, o) in answered {
            let cached = Cached {
                part: p.clone(),
                high_watermark: o.high_watermark,
                last_stable_offset: o.last_stable_offset,
                log_start_offset: o.log_start_offset,
            };
            match index.get(&p.key) {
                // A partition listed twice: the later entry wins, as in Kafka's map.
                Some(&i) => parts[i] = cached,
                None => {
                    index.insert(p.key.clone(), parts.len());
                    parts.push(cached);
                }
            }
        }
        let mut evicted = false;
        let id = self.with_shard(idx, |shard| {
            if shard.sessions.len() >= shard.max_entries {
                if !shard.try_evict(privileged, parts.len(), now) {
                    return INVALID_SESSION_ID;
                }
                evicted = true;
            }
            let id = shard.new_session_id();
            shard.sessions.insert(
                id,
                Session {
                    privileged,
                    uses_topic_ids,
                    creation_ms: now,
                    last_used_ms: now,
                    epoch: next_epoch(INITIAL_EPOCH),
                    cached_size: None,
                    parts,
                    index,
                },
            );
            shard.last_used.insert((now, id));
            shard.touch(id, now);
            id
        });
        if evicted {
            self.count_eviction();
        }
        id
    }

    /// After an incremental fetch was read: which of the session's partitions (in the order
    /// [`FetchContext::Incremental`] gave them, `outcomes` parallel) the response carries
    /// (Kafka's `IncrementalFetchContext.updateAndGenerateResponseData`); partitions answered
    /// with records move to the end of the session.
    ///
    /// # Errors
    /// INVALID_FETCH_SESSION_EPOCH when another request of the session was handled meanwhile
    /// (a duplicate request).
    pub fn complete_incremental(
        &self,
        session_id: i32,
        request_epoch: i32,
        partitions: &[SessionPartition],
        outcomes: &[PartitionOutcome],
    ) -> Result<Vec<bool>, i16> {
        let Some(idx) = self.shard_of(session_id) else {
            return Ok(vec![true; outcomes.len()]);
        };
        self.with_shard(idx, |shard| {
            let Some(session) = shard.sessions.get_mut(&session_id) else {
                // Evicted or closed while this fetch was read: answer everything; the client
                // learns of it on its next fetch.
                return Ok(vec![true; outcomes.len()]);
            };
            if session.epoch != next_epoch(request_epoch) {
                return Err(ec::INVALID_FETCH_SESSION_EPOCH);
            }
            let mut include = Vec::with_capacity(outcomes.len());
            let mut moved = Vec::new();
            for (p, o) in partitions.iter().zip(outcomes) {
                let Some(&i) = session.index.get(&p.key) else {
                    include.push(true);
                    continue;
                };
                let must = session.parts[i].must_respond(o);
                if must && o.records_bytes > 0 {
                    moved.push(i);
                }
                include.push(must);
            }
            if !moved.is_empty() {
                let mut is_moved = vec![false; session.parts.len()];
                for &i in &moved {
                    is_moved[i] = true;
                }
                let mut taken: Vec<Option<Cached>> = std::mem::take(&mut session.parts)
                    .into_iter()
                    .map(Some)
                    .collect();
                let mut parts = Vec::with_capacity(taken.len());
                for (i, slot) in taken.iter_mut().enumerate() {
                    if !is_moved[i] {
                        parts.extend(slot.take());
                    }
                }
                for &i in &moved {
                    parts.extend(taken[i].take());
                }
                session.parts = parts;
                session.reindex();
            }
            Ok(include)
        })
    }
}

fn name_too_long(p: &SessionPartition) -> bool {
    matches!(&p.key.topic, TopicKey::Name(n) if n.len() > MAX_TOPIC_NAME_LEN)
}

#[cfg(test)]
#[path = "fetch_session_tests.rs"]
mod tests;
