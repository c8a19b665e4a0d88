//! A follower's changes to its partition (Kafka's `Partition.appendRecordsToFollowerOrFutureReplica`,
//! `truncateTo`, `truncateFullyAndStartAt` and `UnifiedLog.maybeUpdateHighWatermark`), called by
//! the replica fetchers on an I/O thread. The leader-side code never calls these; the fetcher
//! checks the partition is still a follower of the epoch it fetched for
//! ([`Partition::is_follower_of`]) before each call.

use std::sync::atomic::Ordering;

use gregor_log::{AppendInfo, LogError};

use super::{Partition, Role};
use crate::replication::follower::follower_high_watermark;

/// The base and last offset of the first batch in `records`, if its header is there.
fn first_batch_offsets(records: &[u8]) -> Option<(i64, i64)> {
    let header = records.get(..gregor_protocol::batch::BATCH_HEADER_LEN)?;
    let h = gregor_protocol::batch::BatchHeader::parse(header).ok()?;
    Some((
        h.base_offset,
        h.base_offset + i64::from(h.last_offset_delta),
    ))
}

impl Partition {
    /// True when this broker follows `leader` in `leader_epoch` (the state a fetch was built
    /// for is still current).
    pub fn is_follower_of(&self, leader: i32, leader_epoch: i32) -> bool {
        let s = self.state.read();
        s.role == Role::Follower && s.leader == leader && s.leader_epoch == leader_epoch
    }

    /// Appends the leader's batches with their own offsets and partition leader epochs
    /// ([`gregor_log::PartitionLog::append_as_follower`]; the epoch cache follows the batches).
    /// Blocking: runs on an I/O thread.
    ///
    /// An empty log (log end offset = log start offset, e.g. just restarted at the leader's log
    /// start offset) whose first fetched batch starts below its end and ends at or after it is
    /// restarted at that batch's base offset first: the leader's log start offset fell inside
    /// the batch (DeleteRecords), and the leader returns whole batches (Kafka's
    /// `Partition.doAppendRecordsToFollowerOrFutureReplica` on `UnexpectedAppendOffsetException`).
    /// The log start offset then rises back to the leader's with
    /// [`Partition::update_follower_offsets`].
    ///
    /// # Errors
    /// The log's: a malformed batch or one not starting at the log end offset, I/O errors.
    pub fn append_records_as_follower(&self, records: &[u8]) -> Result<AppendInfo, LogError> {
        let leo = self.log.log_end_offset();
        if leo == self.log.log_start_offset() {
            if let Some((first, last)) = first_batch_offsets(records) {
                if first < leo && last >= leo {
                    tracing::info!(partition = %self.topic_partition, first_offset = first,
                        log_start_offset = leo,
                        "the first fetched batch starts below the log start offset; starting the log at its base offset");
                    self.log
                        .truncate_fully_and_start_at(first, self.clock.now_ms())?;
                }
            }
        }
        self.log.append_as_follower(records, self.clock.now_ms())
    }

    /// Kafka's `processPartitionData` after the append: the high watermark becomes the
    /// leader's clipped to this log ([`follower_high_watermark`]), and the log start offset
    /// rises to the leader's (never above the new high watermark). Delayed operations on the
    /// partition are re-checked when the high watermark moved. Returns whether the log start
    /// offset moved (the caller checkpoints it).
    pub fn update_follower_offsets(
        &self,
        leader_high_watermark: i64,
        leader_log_start: i64,
    ) -> bool {
        let leo = self.log.log_end_offset();
        let hw = follower_high_watermark(leader_high_watermark, self.log.log_start_offset(), leo);
        let before_start = self.log.log_start_offset();
        if leader_log_start > before_start {
            if let Err(e) = self
                .log
                .maybe_increment_log_start_offset(leader_log_start.min(hw))
            {
                tracing::warn!(partition = %self.topic_partition, error = %e,
                    "could not move the follower's log start offset to the leader's");
            }
        }
        let hw = hw.max(self.log.log_start_offset());
        self.set_high_watermark(hw);
        self.log.log_start_offset() != before_start
    }

    /// Truncates the log to `offset` after a divergence (Kafka's `Partition.truncateTo`); the
    /// high watermark drops to the new log end offset if above it. Returns the new log end
    /// offset. Blocking.
    ///
    /// # Errors
    /// The log's ([`gregor_log::PartitionLog::truncate_to`]).
    pub fn truncate_as_follower(&self, offset: i64) -> Result<i64, LogError> {
        let leo = self.log.truncate_to(offset)?;
        if self.high_watermark() > leo {
            self.set_high_watermark(leo);
        }
        Ok(leo)
    }

    /// Drops the whole log and starts it at `offset` (the leader's log start offset, above
    /// this log's end); the high watermark becomes `offset`. Blocking.
    ///
    /// # Errors
    /// The log's ([`gregor_log::PartitionLog::truncate_fully_and_start_at`]).
    pub fn truncate_fully_as_follower(&self, offset: i64) -> Result<(), LogError> {
        self.log
            .truncate_fully_and_start_at(offset, self.clock.now_ms())?;
        self.set_high_watermark(offset);
        Ok(())
    }

    /// Sets the high watermark from `replication-offset-checkpoint` when the partition is
    /// created at start-up, clipped to `[log start offset, log end offset]` as Kafka's
    /// `UnifiedLog` does with the checkpointed value.
    pub fn init_high_watermark(&self, checkpointed: i64) {
        let hw = follower_high_watermark(
            checkpointed,
            self.log.log_start_offset(),
            self.log.log_end_offset(),
        );
        self.high_watermark.store(hw, Ordering::Release);
        self.log.on_high_watermark_updated(hw);
    }

    /// Stores a follower's high watermark (it may go down: the leader's is authoritative) and
    /// completes what the move unblocks.
    fn set_high_watermark(&self, hw: i64) {
        let old = self.high_watermark.swap(hw, Ordering::AcqRel);
        self.log.on_high_watermark_updated(hw);
        if old != hw {
            self.delayed.check_and_complete_all(&self.topic_partition);
        }
    }
}
