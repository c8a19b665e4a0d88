//! The follower's decisions, without I/O (Kafka's `AbstractFetcherThread.processFetchRequest`,
//! `truncateOnFetchResponse`, `getOffsetTruncationState`, `fetchOffsetAndTruncate` and
//! `ReplicaFetcherThread.processPartitionData`). The replica fetchers
//! ([`crate::replica_fetcher`]) feed it each partition's fetch response and the local log's
//! state, and carry out what it returns on the I/O pool.
//!
//! Truncation follows KIP-101/KIP-279 through the fetch itself (Kafka since IBP 2.7): the
//! follower sends `LastFetchedEpoch`; a leader that does not have that epoch ending at the
//! fetch offset answers `DivergingEpoch {epoch, end offset}` instead of records, and the
//! follower truncates ([`truncation_for_diverging_epoch`]). When the follower does not know the
//! epoch the leader answered, it truncates to the end of its own closest older epoch and the
//! next fetch (with the older `LastFetchedEpoch`) resolves the rest: several rounds converge
//! after rapid leader changes (KIP-279).

use crate::error_codes as ec;

/// A leader epoch and the offset where it ends (Kafka's `OffsetAndEpoch` / `EpochEndOffset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEndOffset {
    /// The leader epoch.
    pub epoch: i32,
    /// The first offset after that epoch (exclusive end).
    pub end_offset: i64,
}

/// What the leader answered for one partition of a follower fetch (Kafka's `PartitionData`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedPartition {
    /// Kafka error code, 0 on success.
    pub error_code: i16,
    /// The leader's high watermark (-1 on error).
    pub high_watermark: i64,
    /// The leader's log start offset (-1 on error).
    pub log_start_offset: i64,
    /// `DivergingEpoch` when set (epoch and end offset both >= 0), KIP-320 Fetch v12+.
    pub diverging_epoch: Option<EpochEndOffset>,
    /// Bytes of records returned (0 when none).
    pub records_bytes: usize,
}

/// Where a partition's fetching stands (Kafka's `ReplicaState` of a `PartitionFetchState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchStatus {
    /// Included in the next fetch.
    Fetching,
    /// Left out of fetches until the given time (ms, `replica.fetch.backoff.ms` after an
    /// error).
    Delayed {
        /// When fetching resumes (ms since the epoch, on the caller's clock).
        until_ms: i64,
    },
    /// Fenced by the leader (FENCED_LEADER_EPOCH for the epoch this follower still has): left
    /// out until newer metadata re-adds the partition (Kafka's `markPartitionFailed`).
    AwaitingMetadata,
}

/// One partition's fetch state (Kafka's `PartitionFetchState`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionFetchState {
    /// The next offset to fetch: the local log end offset.
    pub fetch_offset: i64,
    /// The leader epoch of the metadata this fetcher follows (the fetch's
    /// `CurrentLeaderEpoch`, KIP-320).
    pub current_leader_epoch: i32,
    /// The latest epoch in the local log (the fetch's `LastFetchedEpoch`), None when the log
    /// has no epoch.
    pub last_fetched_epoch: Option<i32>,
    /// Whether the partition is fetched now.
    pub status: FetchStatus,
}

impl PartitionFetchState {
    /// A partition (re)added to a fetcher from its log end offset (Kafka's
    /// `partitionFetchState`; no truncation at becoming follower, divergence is found through
    /// the fetch).
    pub fn new(log_end_offset: i64, current_leader_epoch: i32, latest_epoch: Option<i32>) -> Self {
        Self {
            fetch_offset: log_end_offset,
            current_leader_epoch,
            last_fetched_epoch: latest_epoch,
            status: FetchStatus::Fetching,
        }
    }

    /// Whether the partition belongs in a fetch sent at `now_ms` (a delay that has passed
    /// turns back into [`FetchStatus::Fetching`]).
    pub fn is_ready(&mut self, now_ms: i64) -> bool {
        match self.status {
            FetchStatus::Fetching => true,
            FetchStatus::Delayed { until_ms } if until_ms <= now_ms => {
                self.status = FetchStatus::Fetching;
                true
            }
            _ => false,
        }
    }

    /// Leaves the partition out of fetches for `backoff_ms` from `now_ms` (Kafka's
    /// `delayPartitions`; an existing delay is kept).
    pub fn delay(&mut self, now_ms: i64, backoff_ms: i64) {
        if !matches!(self.status, FetchStatus::Delayed { .. }) {
            self.status = FetchStatus::Delayed {
                until_ms: now_ms.saturating_add(backoff_ms.max(0)),
            };
        }
    }

    /// After an append or truncation: fetch from the new log end offset with the log's latest
    /// epoch as `LastFetchedEpoch`.
    pub fn advance(&mut self, log_end_offset: i64, latest_epoch: Option<i32>) {
        self.fetch_offset = log_end_offset;
        self.last_fetched_epoch = latest_epoch;
        if self.status == FetchStatus::AwaitingMetadata {
            return;
        }
        self.status = FetchStatus::Fetching;
    }
}

/// What to do with one partition of a fetch response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchDecision {
    /// Append the records (if any) with their own offsets and epochs, then set the follower
    /// high watermark to [`follower_high_watermark`] of `leader_high_watermark` and raise the
    /// log start offset to `leader_log_start_offset` (Kafka's `processPartitionData`).
    Append {
        /// The leader's high watermark.
        leader_high_watermark: i64,
        /// The leader's log start offset.
        leader_log_start_offset: i64,
    },
    /// The leader found the local log diverging: truncate to the offset computed by
    /// [`truncation_for_diverging_epoch`] from this epoch and end offset; the records (none)
    /// and watermarks are ignored until the next fetch.
    Diverged(EpochEndOffset),
    /// OFFSET_OUT_OF_RANGE: ask the leader its log end and log start offsets (ListOffsets
    /// latest/earliest, as Kafka 4.x's `fetchLatestOffset` / `fetchEarliestOffset`), then
    /// apply [`resolve_out_of_range`].
    ResolveOutOfRange,
    /// Fenced: the leader has a newer epoch than the one this follower fetched with. Wait for
    /// newer metadata ([`FetchStatus::AwaitingMetadata`]).
    AwaitMetadata,
    /// Retry after `replica.fetch.backoff.ms` ([`FetchStatus::Delayed`]).
    Backoff,
    /// The response does not match the current state (sent for another fetch offset or
    /// epoch, or the partition is not fetching): ignore it.
    Ignore,
}

/// Decides what to do with `response`, the answer to a fetch sent from `request_fetch_offset`
/// with `request_leader_epoch` as `CurrentLeaderEpoch`, given the partition's `state` now.
///
/// Errors (Kafka's `processFetchRequest`): FENCED_LEADER_EPOCH waits for metadata when the
/// fetch used the epoch the follower still has (newer metadata arrived meanwhile: retry with
/// backoff); UNKNOWN_LEADER_EPOCH (the leader is behind), NOT_LEADER_OR_FOLLOWER,
/// UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID, INCONSISTENT_TOPIC_ID and any other error back
/// off `replica.fetch.backoff.ms`, since the follower learns a new leader only from metadata.
pub fn on_fetch_response(
    state: &PartitionFetchState,
    request_fetch_offset: i64,
    request_leader_epoch: i32,
    response: &FetchedPartition,
) -> FetchDecision {
    // Kafka: the partition was removed and re-added or truncated while the fetch was in flight.
    if request_fetch_offset != state.fetch_offset || state.status != FetchStatus::Fetching {
        return FetchDecision::Ignore;
    }
    match response.error_code {
        ec::NONE => match response.diverging_epoch {
            Some(d) => FetchDecision::Diverged(d),
            None => FetchDecision::Append {
                leader_high_watermark: response.high_watermark,
                leader_log_start_offset: response.log_start_offset,
            },
        },
        ec::OFFSET_OUT_OF_RANGE => FetchDecision::ResolveOutOfRange,
        ec::FENCED_LEADER_EPOCH => {
            if request_leader_epoch == state.current_leader_epoch {
                FetchDecision::AwaitMetadata
            } else {
                FetchDecision::Backoff
            }
        }
        _ => FetchDecision::Backoff,
    }
}

/// Where to truncate after a `DivergingEpoch` (Kafka's `getOffsetTruncationState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncation {
    /// Truncate the local log to this offset (never above the log end offset).
    pub offset: i64,
    /// False when the follower did not know the leader's epoch and truncated to the end of its
    /// own closest older epoch: the next fetch (with that epoch as `LastFetchedEpoch`) may
    /// find more divergence (KIP-279).
    pub complete: bool,
}

/// The truncation offset for the leader's `diverging` epoch and end offset, given the local
/// `log_end_offset` and `local_end_offset_for_epoch` (the local log's
/// [`end_offset_for_leader_epoch`](gregor_log::PartitionLog::end_offset_for_leader_epoch):
/// the largest local epoch `<=` the one asked and where it ends, None when unknown).
///
/// - the leader's end offset undefined (-1): no truncation point is known; truncate to
///   nothing (the log end offset, complete);
/// - the follower has the same epoch: `min(leader end, local end of that epoch, LEO)`;
/// - the follower's closest epoch is older: truncate to `min(its end, LEO)`, incomplete;
/// - the follower tracks no epoch at or below it: `min(leader end, LEO)`.
pub fn truncation_for_diverging_epoch(
    diverging: EpochEndOffset,
    log_end_offset: i64,
    local_end_offset_for_epoch: impl Fn(i32) -> Option<EpochEndOffset>,
) -> Truncation {
    if diverging.end_offset < 0 {
        return Truncation {
            offset: log_end_offset,
            complete: true,
        };
    }
    if diverging.epoch < 0 {
        return Truncation {
            offset: diverging.end_offset.min(log_end_offset),
            complete: true,
        };
    }
    match local_end_offset_for_epoch(diverging.epoch) {
        Some(local) if local.epoch != diverging.epoch => Truncation {
            offset: local.end_offset.min(log_end_offset),
            complete: false,
        },
        Some(local) => Truncation {
            offset: local
                .end_offset
                .min(diverging.end_offset)
                .min(log_end_offset),
            complete: true,
        },
        None => Truncation {
            offset: diverging.end_offset.min(log_end_offset),
            complete: true,
        },
    }
}

/// How to recover from OFFSET_OUT_OF_RANGE (Kafka's `fetchOffsetAndTruncate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfRange {
    /// The leader's log ends below ours (an unclean election): truncate to its log end offset
    /// and fetch from there.
    TruncateTo(i64),
    /// Our log ends below the leader's log start offset (we were away while the leader
    /// deleted old segments): drop the whole log and start it at the leader's log start
    /// offset ([`gregor_log::PartitionLog::truncate_fully_and_start_at`]).
    TruncateFullyAndStartAt(i64),
    /// Neither: keep the log and fetch again from its end (the leader's log grew meanwhile).
    FetchFrom(i64),
}

/// The out-of-range recovery from the leader's log end offset and log start offset (learnt
/// with ListOffsets latest and earliest) and the local log end offset.
pub fn resolve_out_of_range(
    leader_log_end_offset: i64,
    leader_log_start_offset: i64,
    log_end_offset: i64,
) -> OutOfRange {
    if leader_log_end_offset < log_end_offset {
        OutOfRange::TruncateTo(leader_log_end_offset.max(0))
    } else if leader_log_start_offset > log_end_offset {
        OutOfRange::TruncateFullyAndStartAt(leader_log_start_offset)
    } else {
        OutOfRange::FetchFrom(log_end_offset)
    }
}

/// The follower's high watermark after a fetch (Kafka's `UnifiedLog.updateHighWatermark` via
/// `maybeUpdateHighWatermark`): the leader's, clipped to `[log start offset, log end offset]`.
/// It may go down (the leader's is authoritative).
pub fn follower_high_watermark(
    leader_high_watermark: i64,
    log_start_offset: i64,
    log_end_offset: i64,
) -> i64 {
    if leader_high_watermark < log_start_offset {
        log_start_offset
    } else if leader_high_watermark >= log_end_offset {
        log_end_offset
    } else {
        leader_high_watermark
    }
}

/// The fetcher a partition belongs to among `num_fetchers` per source broker (Kafka's
/// `AbstractFetcherManager.getFetcherId`: `Utils.abs(31 * topic.hashCode + partition) %
/// numFetchers`, with Java's `String.hashCode`).
pub fn fetcher_id(topic: &str, partition: i32, num_fetchers: usize) -> usize {
    let n = num_fetchers.max(1) as i64;
    let h = java_string_hash(topic)
        .wrapping_mul(31)
        .wrapping_add(partition);
    // Kafka's Utils.abs: `i & 0x7fffffff`.
    i64::from(h & 0x7fff_ffff).rem_euclid(n) as usize
}

/// Java's `String.hashCode` over UTF-16 code units.
fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(hw: i64, lso: i64) -> FetchedPartition {
        FetchedPartition {
            error_code: ec::NONE,
            high_watermark: hw,
            log_start_offset: lso,
            diverging_epoch: None,
            records_bytes: 10,
        }
    }

    fn err(code: i16) -> FetchedPartition {
        FetchedPartition {
            error_code: code,
            high_watermark: -1,
            log_start_offset: -1,
            diverging_epoch: None,
            records_bytes: 0,
        }
    }

    fn state() -> PartitionFetchState {
        PartitionFetchState::new(10, 5, Some(4))
    }

    /// A local epoch cache as `(epoch, start offset)` entries with a log end offset, answering
    /// as Kafka's `LeaderEpochFileCache.endOffsetFor` / `UnifiedLog.endOffsetForEpoch`.
    fn cache(entries: &[(i32, i64)], leo: i64) -> impl Fn(i32) -> Option<EpochEndOffset> + '_ {
        move |requested| {
            let latest = entries.last().map(|e| e.0);
            if latest == Some(requested) {
                return Some(EpochEndOffset {
                    epoch: requested,
                    end_offset: leo,
                });
            }
            let higher = entries.iter().find(|e| e.0 > requested)?;
            let floor = entries.iter().rev().find(|e| e.0 <= requested);
            Some(EpochEndOffset {
                epoch: floor.map_or(requested, |f| f.0),
                end_offset: higher.1,
            })
        }
    }

    #[test]
    fn data_is_appended_with_the_leaders_watermarks() {
        assert_eq!(
            on_fetch_response(&state(), 10, 5, &ok(8, 2)),
            FetchDecision::Append {
                leader_high_watermark: 8,
                leader_log_start_offset: 2
            }
        );
    }

    #[test]
    fn stale_responses_are_ignored() {
        // Fetched from another offset (truncated or re-added meanwhile).
        assert_eq!(
            on_fetch_response(&state(), 9, 5, &ok(8, 2)),
            FetchDecision::Ignore
        );
        let mut s = state();
        s.delay(0, 100);
        assert_eq!(
            on_fetch_response(&s, 10, 5, &ok(8, 2)),
            FetchDecision::Ignore
        );
        s.status = FetchStatus::AwaitingMetadata;
        assert_eq!(
            on_fetch_response(&s, 10, 5, &err(ec::OFFSET_OUT_OF_RANGE)),
            FetchDecision::Ignore
        );
    }

    #[test]
    fn a_diverging_epoch_wins_over_records() {
        let mut r = ok(8, 0);
        r.diverging_epoch = Some(EpochEndOffset {
            epoch: 3,
            end_offset: 7,
        });
        assert_eq!(
            on_fetch_response(&state(), 10, 5, &r),
            FetchDecision::Diverged(EpochEndOffset {
                epoch: 3,
                end_offset: 7
            })
        );
    }

    #[test]
    fn errors() {
        let s = state();
        assert_eq!(
            on_fetch_response(&s, 10, 5, &err(ec::OFFSET_OUT_OF_RANGE)),
            FetchDecision::ResolveOutOfRange
        );
        // Fenced with the epoch this follower still has: wait for newer metadata.
        assert_eq!(
            on_fetch_response(&s, 10, 5, &err(ec::FENCED_LEADER_EPOCH)),
            FetchDecision::AwaitMetadata
        );
        // Fenced for an older epoch than the follower has now: retry later.
        assert_eq!(
            on_fetch_response(&s, 10, 4, &err(ec::FENCED_LEADER_EPOCH)),
            FetchDecision::Backoff
        );
        for code in [
            ec::UNKNOWN_LEADER_EPOCH,
            ec::NOT_LEADER_OR_FOLLOWER,
            ec::UNKNOWN_TOPIC_OR_PARTITION,
            ec::UNKNOWN_TOPIC_ID,
            ec::INCONSISTENT_TOPIC_ID,
            ec::KAFKA_STORAGE_ERROR,
            ec::UNKNOWN_SERVER_ERROR,
        ] {
            assert_eq!(
                on_fetch_response(&s, 10, 5, &err(code)),
                FetchDecision::Backoff,
                "code {code}"
            );
        }
    }

    #[test]
    fn backoff_and_metadata_waits() {
        let mut s = state();
        assert!(s.is_ready(0));
        s.delay(1_000, 1_000);
        assert!(!s.is_ready(1_999));
        // A second error during the delay does not extend it.
        s.delay(1_500, 1_000);
        assert!(s.is_ready(2_000));
        assert_eq!(s.status, FetchStatus::Fetching);
        s.status = FetchStatus::AwaitingMetadata;
        assert!(!s.is_ready(i64::MAX));
        // Progress does not unfence; only new metadata (a new state) does.
        s.advance(12, Some(5));
        assert_eq!(s.status, FetchStatus::AwaitingMetadata);
        assert_eq!((s.fetch_offset, s.last_fetched_epoch), (12, Some(5)));
    }

    /// The follower has the leader's epoch: truncate to the smaller of the two ends.
    #[test]
    fn diverging_epoch_known_locally() {
        // Local: epoch 1 at 0, epoch 2 at 5, epoch 4 at 8, LEO 12. Leader: epoch 2 ends at 6.
        let entries = [(1, 0), (2, 5), (4, 8)];
        let d = EpochEndOffset {
            epoch: 2,
            end_offset: 6,
        };
        assert_eq!(
            truncation_for_diverging_epoch(d, 12, cache(&entries, 12)),
            Truncation {
                offset: 6,
                complete: true
            }
        );
        // Leader's epoch 2 ends after ours (8): ours is the bound.
        let d = EpochEndOffset {
            epoch: 2,
            end_offset: 9,
        };
        assert_eq!(
            truncation_for_diverging_epoch(d, 12, cache(&entries, 12)),
            Truncation {
                offset: 8,
                complete: true
            }
        );
        // The latest local epoch ends at the LEO.
        let d = EpochEndOffset {
            epoch: 4,
            end_offset: 20,
        };
        assert_eq!(
            truncation_for_diverging_epoch(d, 12, cache(&entries, 12)),
            Truncation {
                offset: 12,
                complete: true
            }
        );
    }

    /// KIP-279: the leader's epoch is unknown here; truncate to the end of our closest older
    /// epoch and let the next fetch continue the search.
    #[test]
    fn diverging_epoch_unknown_locally_truncates_in_rounds() {
        // Local epochs 1@0, 3@5, 5@9, LEO 14; the leader had epochs 1, 2, 4.
        let entries = [(1, 0), (3, 5), (5, 9)];
        let d = EpochEndOffset {
            epoch: 4,
            end_offset: 11,
        };
        let t = truncation_for_diverging_epoch(d, 14, cache(&entries, 14));
        assert_eq!(
            t,
            Truncation {
                offset: 9,
                complete: false
            }
        );
        // Next round: LastFetchedEpoch 3 at LEO 9; the leader answers epoch 2 ending at 7.
        let entries = [(1, 0), (3, 5)];
        let d = EpochEndOffset {
            epoch: 2,
            end_offset: 7,
        };
        let t = truncation_for_diverging_epoch(d, 9, cache(&entries, 9));
        assert_eq!(
            t,
            Truncation {
                offset: 5,
                complete: false
            }
        );
        // Then LastFetchedEpoch 1 at 5: the leader has epoch 1 ending at 6 -> no more
        // divergence in practice; if it says epoch 1 ends at 4, truncate to 4.
        let entries = [(1, 0)];
        let d = EpochEndOffset {
            epoch: 1,
            end_offset: 4,
        };
        assert_eq!(
            truncation_for_diverging_epoch(d, 5, cache(&entries, 5)),
            Truncation {
                offset: 4,
                complete: true
            }
        );
    }

    /// The leader's epoch is older than every local one: Kafka's epoch cache answers with
    /// the requested epoch and our first epoch's start, and the follower truncates there or
    /// to the leader's end, whichever is smaller.
    #[test]
    fn diverging_epoch_older_than_every_local_epoch() {
        let entries = [(3, 10), (4, 15)];
        let d = EpochEndOffset {
            epoch: 1,
            end_offset: 12,
        };
        assert_eq!(
            truncation_for_diverging_epoch(d, 20, cache(&entries, 20)),
            Truncation {
                offset: 10,
                complete: true
            }
        );
    }

    /// No local epoch at all (None from the lookup): the leader's end offset, capped at LEO.
    #[test]
    fn diverging_epoch_without_local_epochs() {
        let d = EpochEndOffset {
            epoch: 2,
            end_offset: 7,
        };
        assert_eq!(
            truncation_for_diverging_epoch(d, 12, |_| None),
            Truncation {
                offset: 7,
                complete: true
            }
        );
        assert_eq!(
            truncation_for_diverging_epoch(d, 5, |_| None),
            Truncation {
                offset: 5,
                complete: true
            }
        );
        // Undefined end offset: nothing to truncate; undefined epoch: the leader's offset.
        let undefined = EpochEndOffset {
            epoch: 2,
            end_offset: -1,
        };
        assert_eq!(
            truncation_for_diverging_epoch(undefined, 12, |_| None).offset,
            12
        );
        let no_epoch = EpochEndOffset {
            epoch: -1,
            end_offset: 3,
        };
        assert_eq!(
            truncation_for_diverging_epoch(no_epoch, 12, |_| unreachable_lookup()).offset,
            3
        );
    }

    fn unreachable_lookup() -> Option<EpochEndOffset> {
        Some(EpochEndOffset {
            epoch: 99,
            end_offset: 0,
        })
    }

    #[test]
    fn out_of_range_recovery() {
        // The leader's log ends below ours (unclean election): truncate to its end.
        assert_eq!(resolve_out_of_range(5, 0, 10), OutOfRange::TruncateTo(5));
        // Ours ends below the leader's start: start over at its start.
        assert_eq!(
            resolve_out_of_range(100, 50, 10),
            OutOfRange::TruncateFullyAndStartAt(50)
        );
        // Neither (the leader grew meanwhile): fetch again from our end.
        assert_eq!(resolve_out_of_range(100, 5, 10), OutOfRange::FetchFrom(10));
        assert_eq!(resolve_out_of_range(10, 10, 10), OutOfRange::FetchFrom(10));
    }

    #[test]
    fn high_watermark_is_the_leaders_clipped_to_the_local_log() {
        assert_eq!(follower_high_watermark(8, 0, 10), 8);
        assert_eq!(follower_high_watermark(15, 0, 10), 10);
        assert_eq!(follower_high_watermark(2, 5, 10), 5);
        assert_eq!(follower_high_watermark(-1, 0, 10), 0);
    }

    #[test]
    fn fetcher_ids_match_kafkas_hash() {
        // Java: "topic".hashCode() == 110546223; 31 * that + 0 wraps to -868034383.
        assert_eq!(java_string_hash("topic"), 110_546_223);
        let h = 110_546_223i32.wrapping_mul(31);
        assert_eq!(fetcher_id("topic", 0, 3), ((h & 0x7fff_ffff) % 3) as usize);
        assert_eq!(fetcher_id("topic", 7, 1), 0);
        assert_eq!(fetcher_id("t", 1, 0), 0);
        let spread: std::collections::BTreeSet<_> =
            (0..30).map(|p| fetcher_id("orders", p, 4)).collect();
        assert_eq!(spread.len(), 4);
    }
}
