//! Log compaction (Kafka's `LogCleaner`, `LogCleanerManager` and `Cleaner`; KIP-58, KIP-354,
//! KIP-534; <https://kafka.apache.org/documentation/#compaction>).
//!
//! For a log whose `cleanup.policy` contains `compact`, the cleaner keeps the latest record of
//! every key among the closed segments below the first uncleanable offset:
//!
//! 1. **Choose.** The dirty section runs from the cleaner checkpoint (first dirty offset) to the
//!    first uncleanable offset: the active segment, the caller's bound (high watermark or last
//!    stable offset) and the first segment younger than `min.compaction.lag.ms`, rounded down to
//!    a segment boundary. The log is cleaned when dirty bytes / (clean + dirty) bytes reaches
//!    `min.cleanable.dirty.ratio`, or when its first dirty segment is older than
//!    `max.compaction.lag.ms` (KIP-354), or when tombstones passed their delete horizon.
//! 2. **Map.** Keys of the dirty section go into an offset map (a 128-bit key hash -> latest
//!    offset) bounded by `log.cleaner.dedupe.buffer.size` / 24 bytes per entry x
//!    `log.cleaner.io.buffer.load.factor`; when it fills, this round ends at the last mapped
//!    offset + 1 and the rest waits for the next round.
//! 3. **Copy.** Segments from the log start up to that end are cleaned in groups that fit one
//!    segment (`segment.bytes`, index size, 32-bit relative offsets) into `<base>.log.cleaned`:
//!    a record is kept when its offset is at least the map's offset for its key (or past the
//!    map), and a tombstone only until its batch's delete horizon (set to now +
//!    `delete.retention.ms` the first time a batch with tombstones is cleaned, KIP-534). Records
//!    without a key are dropped. Offsets are never rewritten: a batch that lost records is
//!    rebuilt with its base offset, last offset delta, producer fields and codec; a batch
//!    that lost all records is kept empty when it holds an active producer's last sequence or
//!    ends the round. Transactions (Kafka's `CleanedTransactionMetadata`): the batches of
//!    aborted transactions are removed, and a marker stays while its transaction still has a
//!    batch in the log (an ABORT marker's `.txnindex` entry moves to the cleaned segment with
//!    it). A marker whose transaction has nothing left is removed in two passes, as a
//!    tombstone: the first sets its batch's delete horizon (now + `delete.retention.ms`), the
//!    first pass after that horizon removes it (kept empty if it is its producer's last
//!    record, for the epoch).
//! 4. **Swap.** [`PartitionLog::replace_segments`] swaps the group in with the `.cleaned` ->
//!    `.swap` -> final rename protocol, recoverable after a crash at any step.
//!
//! I/O is throttled to `log.cleaner.io.max.bytes.per.second` (read plus written bytes), as
//! Kafka's `Throttler`.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gregor_protocol::batch::{BatchHeader, Compression};
use gregor_protocol::records::decode_records;

use crate::error::{LogError, Result};
use crate::log::{PartitionLog, CLEANED_SUFFIX};
use crate::producer_state::LastRecord;
use crate::rebuild::{empty_batch, rebuild_batch};
use crate::segment::{LogSegment, SCAN_CHUNK_BYTES};
use crate::txn_index::AbortedTxn;

/// Bytes one offset-map entry accounts for: a 16-byte key hash and an 8-byte offset (Kafka's
/// `SkimpyOffsetMap` with MD5).
pub const OFFSET_MAP_ENTRY_BYTES: u64 = 24;

/// The cleaner's broker-level settings (Kafka's `CleanerConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct CleanerConfig {
    /// `log.cleaner.dedupe.buffer.size` divided by `log.cleaner.threads`: memory in bytes for
    /// one thread's offset map. Kafka's default 128 MiB for all threads.
    pub dedupe_buffer_bytes: u64,
    /// `log.cleaner.io.buffer.load.factor`: how full the offset map may get. Default 0.9.
    pub io_buffer_load_factor: f64,
    /// `log.cleaner.io.max.bytes.per.second`: read plus write rate limit in bytes per second.
    /// Default `f64::MAX` (no limit).
    pub io_max_bytes_per_second: f64,
}

impl Default for CleanerConfig {
    fn default() -> Self {
        Self {
            dedupe_buffer_bytes: 128 * 1024 * 1024,
            io_buffer_load_factor: 0.9,
            io_max_bytes_per_second: f64::MAX,
        }
    }
}

/// What one cleaning round did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CleanStats {
    /// First dirty offset before the round.
    pub first_dirty_offset: i64,
    /// The round's end: the new cleaner checkpoint.
    pub end_offset: i64,
    /// Bytes read from the segments cleaned (offset-map pass excluded).
    pub bytes_read: u64,
    /// Bytes written to cleaned segments.
    pub bytes_written: u64,
    /// Bytes read while building the offset map.
    pub map_bytes_read: u64,
    /// Records read while copying.
    pub records_read: u64,
    /// Records kept.
    pub records_retained: u64,
    /// Segments replaced.
    pub segments_cleaned: usize,
    /// Keys in the offset map.
    pub map_entries: usize,
    /// Wall-clock time of the round.
    pub elapsed: Duration,
    /// Time spent sleeping in the I/O throttle.
    pub throttled: Duration,
    /// Earliest delete horizon (KIP-534, ms) among the batches written, if any holds
    /// tombstones.
    pub min_delete_horizon_ms: Option<i64>,
}

/// Why a log is (or is not) cleanable now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cleanability {
    /// First dirty offset.
    pub first_dirty_offset: i64,
    /// Base offset of the first segment that may not be cleaned yet.
    pub first_uncleanable_offset: i64,
    /// Dirty bytes / total bytes below the first uncleanable offset.
    pub dirty_ratio: f64,
    /// Dirty bytes.
    pub dirty_bytes: u64,
    /// Must be cleaned now whatever the ratio: a dirty segment is older than
    /// `max.compaction.lag.ms` (KIP-354), or tombstones passed their delete horizon (KIP-534).
    pub must_clean: bool,
}

/// Kafka's `Throttler`: sleeps so that the observed rate stays under the limit, checking every
/// 300 ms of I/O.
struct Throttler {
    bytes_per_second: f64,
    period_start: Instant,
    observed_bytes: f64,
    slept: Duration,
}

impl Throttler {
    const CHECK_INTERVAL: Duration = Duration::from_millis(300);

    fn new(bytes_per_second: f64) -> Self {
        Self {
            bytes_per_second,
            period_start: Instant::now(),
            observed_bytes: 0.0,
            slept: Duration::ZERO,
        }
    }

    fn maybe_throttle(&mut self, bytes: u64) {
        if !(self.bytes_per_second.is_finite() && self.bytes_per_second > 0.0)
            || self.bytes_per_second >= f64::MAX / 2.0
        {
            return;
        }
        self.observed_bytes += bytes as f64;
        let elapsed = self.period_start.elapsed();
        if elapsed < Self::CHECK_INTERVAL {
            return;
        }
        let rate = self.observed_bytes / elapsed.as_secs_f64();
        if rate > self.bytes_per_second {
            let wanted = Duration::from_secs_f64(self.observed_bytes / self.bytes_per_second);
            if let Some(sleep) = wanted.checked_sub(elapsed) {
                std::thread::sleep(sleep);
                self.slept += sleep;
            }
        }
        self.period_start = Instant::now();
        self.observed_bytes = 0.0;
    }
}

/// Kafka's `SkimpyOffsetMap`: key hash -> latest offset, with a fixed capacity.
struct OffsetMap {
    map: HashMap<u128, i64>,
    capacity: usize,
    latest_offset: i64,
}

impl OffsetMap {
    fn new(config: &CleanerConfig) -> Self {
        let slots = config.dedupe_buffer_bytes / OFFSET_MAP_ENTRY_BYTES;
        let capacity = ((slots as f64) * config.io_buffer_load_factor.clamp(0.01, 1.0)) as usize;
        Self {
            map: HashMap::new(),
            capacity: capacity.max(1),
            latest_offset: -1,
        }
    }

    fn hash(key: &[u8]) -> u128 {
        let mut lo = std::collections::hash_map::DefaultHasher::new();
        0u8.hash(&mut lo);
        key.hash(&mut lo);
        let mut hi = std::collections::hash_map::DefaultHasher::new();
        1u8.hash(&mut hi);
        key.hash(&mut hi);
        (u128::from(hi.finish()) << 64) | u128::from(lo.finish())
    }

    fn is_full(&self) -> bool {
        self.map.len() >= self.capacity
    }

    fn put(&mut self, key: &[u8], offset: i64) {
        self.map.insert(Self::hash(key), offset);
        self.latest_offset = self.latest_offset.max(offset);
    }

    fn get(&self, key: &[u8]) -> Option<i64> {
        self.map.get(&Self::hash(key)).copied()
    }
}

/// The transactions seen while copying one round's segments (Kafka's
/// `CleanedTransactionMetadata`): which batches belong to aborted transactions (removed), which
/// markers still have batches of their transaction before them in this round (kept), and the
/// aborted transactions whose markers are kept (their `.txnindex` entries go to the cleaned
/// segment).
#[derive(Default)]
struct CleanedTransactions {
    /// Producers whose committed (or not yet ended) transaction had a batch in this round.
    ongoing_committed: HashSet<i64>,
    /// Producers inside an aborted transaction: its entry and whether one of its batches was
    /// read in this round.
    ongoing_aborted: HashMap<i64, (AbortedTxn, bool)>,
    /// Aborted transactions not reached yet, by descending first offset (the next at the end).
    pending: Vec<AbortedTxn>,
    /// The entries of the markers kept since the last [`CleanedTransactions::take_index`].
    index: Vec<AbortedTxn>,
}

impl CleanedTransactions {
    /// Adds the aborted transactions overlapping the segment about to be read.
    fn add_aborted(&mut self, txns: Vec<AbortedTxn>) {
        self.pending.extend(txns);
        self.pending
            .sort_by_key(|a| std::cmp::Reverse(a.first_offset));
    }

    fn consume_aborted_up_to(&mut self, offset: i64) {
        while self
            .pending
            .last()
            .is_some_and(|a| a.first_offset <= offset)
        {
            if let Some(a) = self.pending.pop() {
                self.ongoing_aborted
                    .entry(a.producer_id)
                    .or_insert((a, false));
            }
        }
    }

    /// Kafka's `onBatchRead`: whether the data batch `h` belongs to an aborted transaction
    /// (and may be removed).
    fn on_batch(&mut self, h: &BatchHeader) -> bool {
        self.consume_aborted_up_to(h.last_offset());
        if !h.is_transactional() {
            return false;
        }
        if let Some((_, seen)) = self.ongoing_aborted.get_mut(&h.producer_id) {
            *seen = true;
            true
        } else {
            self.ongoing_committed.insert(h.producer_id);
            false
        }
    }

    /// Kafka's `onControlBatchRead`: whether the control batch `h` (bytes `raw`) may be
    /// removed: an empty one (what an earlier round left), or a marker none of whose
    /// transaction's batches was read in this round. An ABORT marker that stays has its
    /// transaction's index entry recorded for the cleaned segment.
    fn on_control_batch(&mut self, h: &BatchHeader, raw: &[u8]) -> bool {
        self.consume_aborted_up_to(h.last_offset());
        if h.records_count == 0 {
            return true;
        }
        match gregor_protocol::control::parse_end_txn_marker(h, raw) {
            Ok(Some(m)) if m.result == gregor_protocol::control::TransactionResult::Abort => {
                match self.ongoing_aborted.remove(&h.producer_id) {
                    Some((a, true)) => {
                        self.index.push(a);
                        false
                    }
                    _ => true,
                }
            }
            Ok(Some(_)) => !self.ongoing_committed.remove(&h.producer_id),
            // Another control type, or one that does not parse: kept.
            _ => false,
        }
    }

    /// The index entries of the markers kept since the last call, in marker order.
    fn take_index(&mut self) -> Vec<AbortedTxn> {
        std::mem::take(&mut self.index)
    }
}

/// One cleaner thread (Kafka's `CleanerThread` + `Cleaner`). Holds no state between rounds
/// beyond its configuration; the offset map is allocated per round.
#[derive(Debug, Clone)]
pub struct LogCleaner {
    config: CleanerConfig,
}

impl LogCleaner {
    /// A cleaner with `config`.
    pub fn new(config: CleanerConfig) -> Self {
        Self { config }
    }

    /// Kafka's `LogCleanerManager.cleanableOffsets` and `dirtyRatio`: the dirty section of
    /// `log` and whether it should be cleaned at `now_ms`. `upper_bound_offset` is the
    /// largest offset the cleaner may reach (the high watermark or last stable offset).
    /// `None` when the log is not compacted or has nothing dirty.
    pub fn cleanability(
        log: &PartitionLog,
        upper_bound_offset: i64,
        now_ms: i64,
    ) -> Option<Cleanability> {
        let config = log.config();
        if !config.cleanup_compact {
            return None;
        }
        let segments = log.published_segments();
        let log_start_offset = log.log_start_offset();
        let log_end_offset = log.log_end_offset();
        let first_dirty = match log.cleaner_checkpoint() {
            Some(o) if o >= log_start_offset && o <= log_end_offset => o,
            _ => log_start_offset,
        };
        let active_base = segments.last()?.base_offset();
        let mut first_uncleanable = active_base.min(upper_bound_offset);
        if config.min_compaction_lag_ms > 0 {
            let cutoff = now_ms.saturating_sub(config.min_compaction_lag_ms);
            if let Some(young) = segments
                .iter()
                .filter(|s| s.base_offset() >= first_dirty || contains(&segments, s, first_dirty))
                .find(|s| match s.largest_timestamp_ms() {
                    Ok(t) => t > cutoff,
                    // Unknown age: not cleanable this round.
                    Err(e) => {
                        tracing::warn!(segment = %s.log_path().display(), error = %e,
                            "cannot read the segment's largest timestamp; not cleaning from it");
                        true
                    }
                })
            {
                first_uncleanable = first_uncleanable.min(young.base_offset());
            }
        }
        // Round down to the base of the segment holding the first uncleanable offset.
        let uncleanable_idx = segments
            .partition_point(|s| s.base_offset() <= first_uncleanable)
            .saturating_sub(1);
        let uncleanable_base = segments[uncleanable_idx]
            .base_offset()
            .min(first_uncleanable);
        let measure = |first_dirty: i64| {
            let mut clean_bytes = 0u64;
            let mut dirty_bytes = 0u64;
            let mut first_dirty_segment = None;
            for (i, s) in segments.iter().enumerate() {
                if s.base_offset() >= uncleanable_base {
                    break;
                }
                let end = segments
                    .get(i + 1)
                    .map_or(log_end_offset, |n| n.base_offset());
                if end <= first_dirty {
                    clean_bytes += s.size();
                } else {
                    dirty_bytes += s.size();
                    first_dirty_segment.get_or_insert(Arc::clone(s));
                }
            }
            (clean_bytes, dirty_bytes, first_dirty_segment)
        };
        let (mut clean_bytes, mut dirty_bytes, mut first_dirty_segment) = measure(first_dirty);
        let mut first_dirty = first_dirty;
        let tombstones_expired = log.min_delete_horizon_ms().is_some_and(|t| t <= now_ms)
            && uncleanable_base > log_start_offset;
        if dirty_bytes == 0 {
            if !tombstones_expired {
                return None;
            }
            // KIP-534: expired tombstones in the clean section; map it all again.
            first_dirty = log_start_offset;
            (clean_bytes, dirty_bytes, first_dirty_segment) = measure(first_dirty);
            if dirty_bytes == 0 {
                return None;
            }
        }
        let must_clean = tombstones_expired
            || first_dirty_segment
                .and_then(|s| s.first_batch_timestamp_ms())
                .is_some_and(|ts| {
                    ts >= 0 && now_ms.saturating_sub(ts) > config.max_compaction_lag_ms
                });
        Some(Cleanability {
            first_dirty_offset: first_dirty,
            first_uncleanable_offset: uncleanable_base,
            dirty_ratio: if dirty_bytes == 0 {
                0.0
            } else {
                dirty_bytes as f64 / (clean_bytes + dirty_bytes) as f64
            },
            dirty_bytes,
            must_clean,
        })
    }

    /// Kafka's `grabFilthiestCompactedLog` + `clean`: among `logs` (each with its upper bound
    /// offset) cleans the one with the highest dirty ratio at or above its
    /// `min.cleanable.dirty.ratio` (or that must be cleaned), skipping logs another thread is
    /// cleaning. `None` when no log needed cleaning.
    ///
    /// # Errors
    /// The error of the log that failed; it is left as it was (a failed round changes nothing
    /// visible, and leftover `.cleaned` files are removed).
    pub fn clean_filthiest(
        &self,
        logs: &[(Arc<PartitionLog>, i64)],
        now_ms: i64,
    ) -> Result<Option<(Arc<PartitionLog>, CleanStats)>> {
        let mut best: Option<(&Arc<PartitionLog>, i64, f64)> = None;
        for (log, upper) in logs {
            let Some(c) = Self::cleanability(log, *upper, now_ms) else {
                continue;
            };
            let ratio = if c.must_clean {
                f64::INFINITY
            } else {
                c.dirty_ratio
            };
            if (c.must_clean || c.dirty_ratio >= log.config().min_cleanable_dirty_ratio)
                && best.is_none_or(|(_, _, r)| ratio > r)
            {
                best = Some((log, *upper, ratio));
            }
        }
        let Some((log, upper, _)) = best else {
            return Ok(None);
        };
        if !log.try_begin_cleaning() {
            return Ok(None);
        }
        let result = self.clean(log, upper, now_ms);
        log.end_cleaning();
        Ok(result?.map(|s| (Arc::clone(log), s)))
    }

    /// Cleans `log` once, whatever its dirty ratio (tests and benchmarks call this directly).
    /// `None` when there is nothing dirty.
    ///
    /// # Errors
    /// [`LogError::Io`], [`LogError::CorruptFile`] for an unreadable segment.
    pub fn clean(
        &self,
        log: &PartitionLog,
        upper_bound_offset: i64,
        now_ms: i64,
    ) -> Result<Option<CleanStats>> {
        let started = Instant::now();
        let Some(c) = Self::cleanability(log, upper_bound_offset, now_ms) else {
            return Ok(None);
        };
        let config = log.config();
        let mut throttler = Throttler::new(self.config.io_max_bytes_per_second);
        let mut stats = CleanStats {
            first_dirty_offset: c.first_dirty_offset,
            ..CleanStats::default()
        };
        let segments = log.published_segments();

        // 2. Offset map over the dirty section. Records of aborted transactions do not enter
        // it (Kafka's `buildOffsetMap` with its `CleanedTransactionMetadata`): an aborted
        // value must not make the cleaner drop the committed value of its key. The aborted
        // transactions of the range are followed as a read_committed consumer does: from its
        // first offset a producer's transactional batches are aborted until its ABORT marker.
        let mut map = OffsetMap::new(&self.config);
        let mut end = c.first_uncleanable_offset;
        let mut aborted =
            log.collect_aborted_transactions(c.first_dirty_offset, c.first_uncleanable_offset)?;
        aborted.sort_by_key(|a| a.first_offset);
        let mut next_aborted = 0;
        let mut aborting: std::collections::HashSet<i64> = std::collections::HashSet::new();
        'segments: for s in segments
            .iter()
            .filter(|s| s.base_offset() < c.first_uncleanable_offset)
        {
            if !contains(&segments, s, c.first_dirty_offset)
                && s.base_offset() < c.first_dirty_offset
            {
                continue;
            }
            let mut full_at = None;
            s.for_each_batch(0, s.size(), SCAN_CHUNK_BYTES, |_, h, raw| {
                throttler.maybe_throttle(raw.len() as u64);
                stats.map_bytes_read += raw.len() as u64;
                while next_aborted < aborted.len()
                    && aborted[next_aborted].first_offset <= h.last_offset()
                {
                    aborting.insert(aborted[next_aborted].producer_id);
                    next_aborted += 1;
                }
                if h.is_control() {
                    if h.has_producer_id()
                        && matches!(
                            gregor_protocol::control::parse_end_txn_marker(h, raw),
                            Ok(Some(m)) if m.result == gregor_protocol::control::TransactionResult::Abort
                        )
                    {
                        aborting.remove(&h.producer_id);
                    }
                    return Ok(true);
                }
                if h.is_transactional() && aborting.contains(&h.producer_id) {
                    return Ok(true);
                }
                if h.last_offset() < c.first_dirty_offset {
                    return Ok(true);
                }
                for r in decode_records(raw).map_err(|e| corrupt(s, &e.to_string()))? {
                    let offset = h.base_offset + i64::from(r.offset_delta);
                    if offset < c.first_dirty_offset {
                        continue;
                    }
                    let Some(key) = r.key.as_deref() else {
                        continue;
                    };
                    if map.is_full() && map.get(key).is_none() {
                        full_at = Some(offset);
                        return Ok(false);
                    }
                    map.put(key, offset);
                }
                Ok(true)
            })?;
            if let Some(at) = full_at {
                end = at;
                break 'segments;
            }
        }
        if end <= c.first_dirty_offset {
            tracing::warn!(partition = %log.topic_partition(),
                "log.cleaner.dedupe.buffer.size is too small to hold the keys of one batch; not cleaning");
            return Ok(None);
        }
        stats.map_entries = map.map.len();
        stats.end_offset = end;

        // 3 + 4. Clean groups of segments below `end` and swap them in.
        let producers = log.last_records_of_producers();
        let mut txns = CleanedTransactions::default();
        let candidates: Vec<Arc<LogSegment>> = segments[..segments.len().saturating_sub(1)]
            .iter()
            .filter(|s| s.base_offset() < end)
            .cloned()
            .collect();
        let next_bases: Vec<i64> = segments.iter().skip(1).map(|s| s.base_offset()).collect();
        for group in group_segments(&candidates, &next_bases, &config)? {
            let base = group[0].base_offset();
            let cleaned = LogSegment::create_with_suffix(
                log.dir(),
                base,
                config.segment_index_bytes,
                config.index_interval_bytes,
                now_ms,
                CLEANED_SUFFIX,
            )?;
            let written = (|| -> Result<()> {
                for s in &group {
                    // The aborted transactions overlapping the whole segment (from every
                    // later segment's index too), as the cleaned segment's index is rebuilt.
                    let upper = segments
                        .iter()
                        .find(|n| n.base_offset() > s.base_offset())
                        .map_or_else(|| log.log_end_offset(), |n| n.base_offset());
                    txns.add_aborted(log.collect_aborted_transactions(s.base_offset(), upper)?);
                    self.clean_segment(
                        s,
                        &cleaned,
                        &map,
                        &producers,
                        &mut txns,
                        end,
                        now_ms,
                        config.delete_retention_ms,
                        config.index_interval_bytes,
                        &mut throttler,
                        &mut stats,
                    )?;
                }
                // The kept ABORT markers' entries: read_committed fetches keep skipping the
                // aborted batches still in the log (kept empty, or in a later round).
                for a in txns.take_index() {
                    cleaned.append_aborted_txn(&a)?;
                }
                cleaned.on_become_inactive()?;
                cleaned.flush()
            })();
            if let Err(e) = written {
                drop(cleaned);
                let _ = crate::log::delete_files_with_suffix(log.dir(), base, CLEANED_SUFFIX);
                return Err(e);
            }
            if !log.replace_segments(&group, cleaned, log.now_ms())? {
                tracing::info!(partition = %log.topic_partition(),
                    "segments changed while cleaning (retention); the round stops here");
                stats.elapsed = started.elapsed();
                return Ok(Some(stats));
            }
            stats.segments_cleaned += group.len();
        }
        log.set_cleaner_checkpoint(end);
        log.set_min_delete_horizon_ms(stats.min_delete_horizon_ms);
        stats.elapsed = started.elapsed();
        stats.throttled = throttler.slept;
        tracing::info!(
            partition = %log.topic_partition(),
            segments = stats.segments_cleaned,
            read_bytes = stats.bytes_read,
            written_bytes = stats.bytes_written,
            records_read = stats.records_read,
            records_retained = stats.records_retained,
            elapsed_ms = stats.elapsed.as_millis() as u64,
            "cleaned log"
        );
        Ok(Some(stats))
    }

    /// Copies the batches of `source` to `dest`, dropping superseded records and expired
    /// tombstones (Kafka's `Cleaner.cleanInto`).
    #[allow(clippy::too_many_arguments)]
    fn clean_segment(
        &self,
        source: &LogSegment,
        dest: &LogSegment,
        map: &OffsetMap,
        producers: &HashMap<i64, LastRecord>,
        txns: &mut CleanedTransactions,
        round_end: i64,
        now_ms: i64,
        delete_retention_ms: i64,
        index_interval_bytes: u64,
        throttler: &mut Throttler,
        stats: &mut CleanStats,
    ) -> Result<()> {
        source.for_each_batch(0, source.size(), SCAN_CHUNK_BYTES, |_, h, raw| {
            throttler.maybe_throttle(raw.len() as u64);
            stats.bytes_read += raw.len() as u64;
            let out = filter_batch(
                h,
                raw,
                map,
                producers,
                txns,
                round_end,
                now_ms,
                delete_retention_ms,
            )
            .map_err(|e| corrupt(source, &e))?;
            stats.records_read += u64::try_from(h.records_count).unwrap_or(0);
            let Some((bytes, retained, removable)) = out else {
                return Ok(true);
            };
            stats.records_retained += retained;
            let written: &[u8] = match &bytes {
                Some(b) => b,
                None => raw,
            };
            let out_header = crate::segment::validate_stored_batch(written)
                .map_err(|e| corrupt(source, &e.to_string()))?;
            dest.append(written, &[out_header], index_interval_bytes)
                .map_err(|e| e.error)?;
            if out_header.has_delete_horizon() && removable {
                let t = out_header.base_timestamp;
                stats.min_delete_horizon_ms =
                    Some(stats.min_delete_horizon_ms.map_or(t, |m| m.min(t)));
            }
            throttler.maybe_throttle(written.len() as u64);
            stats.bytes_written += written.len() as u64;
            Ok(true)
        })
    }
}

/// A batch kept by [`filter_batch`]: rebuilt bytes (`None`: copy the original), records kept,
/// whether it holds what a delete horizon removes (tombstones, or a marker whose transaction
/// has nothing left).
type Retained = (Option<Vec<u8>>, u64, bool);

/// What to write for one batch (Kafka's `cleanInto` filter): `None` to drop it;
/// `Some((None, n, r))` to copy it unchanged (`n` records, `r`: removable at its delete
/// horizon); `Some((Some(bytes), n, r))` to write a rebuilt batch. `txns` follows the round's
/// transactions: a batch of an aborted transaction is removed, a marker whose transaction has
/// no batch left is removed once past its delete horizon (which the first such pass sets). A
/// batch holding a producer's last record, or ending the round, is kept empty rather than
/// removed.
#[allow(clippy::too_many_arguments)]
fn filter_batch(
    h: &BatchHeader,
    raw: &[u8],
    map: &OffsetMap,
    producers: &HashMap<i64, LastRecord>,
    txns: &mut CleanedTransactions,
    round_end: i64,
    now_ms: i64,
    delete_retention_ms: i64,
) -> std::result::Result<Option<Retained>, String> {
    let can_discard = if h.is_control() {
        txns.on_control_batch(h, raw)
    } else {
        txns.on_batch(h)
    };
    let horizon = h.has_delete_horizon().then_some(h.base_timestamp);
    let discard_records = if h.is_control() {
        can_discard && horizon.is_some_and(|t| t <= now_ms)
    } else {
        can_discard
    };
    // Kafka's isBatchLastRecordOfProducer: the batch with an active producer's last data
    // offset (its last sequence), or the marker of its epoch when it has no data batch.
    let last_of_producer = h.has_producer_id()
        && producers
            .get(&h.producer_id)
            .is_some_and(|last| match last.last_data_offset {
                Some(o) => h.last_offset() == o,
                None => h.is_control() && h.producer_epoch == last.producer_epoch,
            });
    let retain_empty = last_of_producer || h.next_offset() == round_end;
    if discard_records || (h.is_control() && h.records_count == 0) {
        return Ok(retain_empty.then(|| (Some(empty_batch(h)), 0, false)));
    }
    if h.is_control() {
        let count = u64::try_from(h.records_count).unwrap_or(0);
        if can_discard && horizon.is_none() {
            // First pass over a marker whose transaction has nothing left: it stays until
            // the delete horizon, as a tombstone would (KIP-534).
            let records = decode_records(raw).map_err(|e| e.to_string())?;
            let codec = h.compression().unwrap_or(Compression::None);
            let rebuilt = rebuild_batch(
                h,
                &records,
                codec,
                None,
                Some(now_ms.saturating_add(delete_retention_ms)),
            )
            .map_err(|e| e.to_string())?;
            return Ok(Some((Some(rebuilt), count, true)));
        }
        return Ok(Some((None, count, can_discard)));
    }
    let records = decode_records(raw).map_err(|e| e.to_string())?;
    let horizon = h.has_delete_horizon().then_some(h.base_timestamp);
    let retain_deletes = horizon.is_none_or(|t| now_ms < t);
    let total = records.len();
    let mut kept = Vec::with_capacity(total);
    let mut tombstones = false;
    for r in records {
        let offset = h.base_offset + i64::from(r.offset_delta);
        let retain = if offset > map.latest_offset {
            true
        } else if let Some(key) = r.key.as_deref() {
            let latest = map.get(key).is_none_or(|found| offset >= found);
            latest && (r.value.is_some() || retain_deletes)
        } else {
            false
        };
        if retain {
            tombstones |= r.value.is_none();
            kept.push(r);
        }
    }
    if kept.is_empty() {
        return Ok(retain_empty.then(|| (Some(empty_batch(h)), 0, false)));
    }
    let set_horizon = tombstones && horizon.is_none();
    if kept.len() == total && !set_horizon {
        return Ok(Some((None, kept.len() as u64, tombstones)));
    }
    let delete_horizon = if set_horizon {
        Some(now_ms.saturating_add(delete_retention_ms))
    } else {
        horizon
    };
    let codec = h.compression().unwrap_or(Compression::None);
    let rebuilt =
        rebuild_batch(h, &kept, codec, None, delete_horizon).map_err(|e| e.to_string())?;
    Ok(Some((Some(rebuilt), kept.len() as u64, tombstones)))
}

/// Whether segment `s` (one of `segments`) holds `offset`: its base is at or below it and the
/// next segment's base above it.
fn contains(segments: &[Arc<LogSegment>], s: &LogSegment, offset: i64) -> bool {
    let idx = segments.partition_point(|x| x.base_offset() <= offset);
    idx > 0 && std::ptr::eq(&*segments[idx - 1], s)
}

/// Kafka's `Cleaner.groupSegmentsBySize`: consecutive segments whose total size fits
/// `segment.bytes`, whose index entries fit `segment.index.bytes` and whose offsets fit the
/// 32-bit relative offsets of one segment. `next_bases[i]` is the base offset of the segment
/// after `segments[i]`. Counting index entries loads the segments' indexes.
///
/// # Errors
/// [`LogError::Io`] when an index cannot be loaded.
fn group_segments(
    segments: &[Arc<LogSegment>],
    next_bases: &[i64],
    config: &crate::config::LogConfig,
) -> Result<Vec<Vec<Arc<LogSegment>>>> {
    let max_bytes = config.segment_bytes.min(i32::MAX as u64);
    let max_index_bytes = config.segment_index_bytes;
    let mut groups = Vec::new();
    let mut i = 0;
    while i < segments.len() {
        let first = &segments[i];
        let mut group = vec![Arc::clone(first)];
        let mut bytes = first.size();
        let (o, t) = first.index_entry_counts()?;
        let (mut offset_entries, mut time_entries) = (o as u64, t as u64);
        i += 1;
        while i < segments.len() {
            let s = &segments[i];
            let last_offset = next_bases.get(i).copied().unwrap_or(i64::MAX) - 1;
            let (o, t) = s.index_entry_counts()?;
            let (o, t) = (o as u64, t as u64);
            let fits = bytes + s.size() <= max_bytes
                && (offset_entries + o) * 8 <= max_index_bytes
                && (time_entries + t + 1) * 12 <= max_index_bytes
                && last_offset - first.base_offset() <= i64::from(i32::MAX);
            if !fits {
                break;
            }
            bytes += s.size();
            offset_entries += o;
            time_entries += t;
            group.push(Arc::clone(s));
            i += 1;
        }
        groups.push(group);
    }
    Ok(groups)
}

fn corrupt(s: &LogSegment, reason: &str) -> LogError {
    LogError::CorruptFile {
        path: s.log_path().display().to_string(),
        reason: reason.to_string(),
    }
}
