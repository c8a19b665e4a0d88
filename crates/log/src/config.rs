//! Per-partition configuration ([`LogConfig`]) and partition naming ([`TopicPartition`]).

use std::fmt;

pub use gregor_protocol::batch::TimestampType;

/// A topic partition. Its log directory is named `<topic>-<partition>`, as in Kafka.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    /// Topic name (Kafka's legal characters: `[a-zA-Z0-9._-]`, so it may contain `-`).
    pub topic: String,
    /// Partition index, `>= 0`.
    pub partition: i32,
}

impl TopicPartition {
    /// A partition of `topic`.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }

    /// The log directory name, `<topic>-<partition>`.
    pub fn dir_name(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }

    /// Parses a log directory name back: the partition is after the *last* `-` (topic names
    /// may contain `-`). Returns `None` for names that are not `<topic>-<non-negative int>`,
    /// including Kafka's `*-delete`, `*-future` and `*-stray` directories.
    pub fn parse_dir_name(name: &str) -> Option<Self> {
        let (topic, partition) = name.rsplit_once('-')?;
        if topic.is_empty()
            || partition.is_empty()
            || !partition.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        if !topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
        {
            return None;
        }
        let partition: i32 = partition.parse().ok()?;
        Some(Self::new(topic, partition))
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Configuration of one partition log. Field names follow Kafka's topic configs (broker-level
/// names in parentheses); [`Default`] gives Kafka 4's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// `segment.bytes` (`log.segment.bytes`): roll the active segment before an append would
    /// make it larger than this many bytes. Default 1 GiB.
    pub segment_bytes: u64,
    /// `segment.ms` (`log.roll.ms`): roll when the newest batch's timestamp is this many ms
    /// after the first batch of the active segment (or after its creation). Default 7 days.
    pub segment_ms: i64,
    /// `segment.index.bytes` (`log.index.size.max.bytes`): size in bytes each `.index` and
    /// `.timeindex` file is preallocated to; the segment rolls when one is full. Default 10 MiB.
    pub segment_index_bytes: u64,
    /// `index.interval.bytes` (`log.index.interval.bytes`): bytes of batches between two
    /// offset-index entries. Default 4096.
    pub index_interval_bytes: u64,
    /// `flush.messages` (`log.flush.interval.messages`): fsync after this many appended
    /// records. Default `i64::MAX` (never; rely on replication and the OS).
    pub flush_interval_messages: u64,
    /// `flush.ms` (`log.flush.interval.ms`): fsync when this many ms passed since the last
    /// flush (checked by [`crate::PartitionLog::flush_if_due`]). Default `i64::MAX`.
    pub flush_interval_ms: i64,
    /// `max.message.bytes` (`message.max.bytes`): largest accepted batch in bytes, header
    /// included. Default 1048588.
    pub max_message_bytes: usize,
    /// `message.timestamp.type` (`log.message.timestamp.type`). Default CreateTime.
    pub message_timestamp_type: TimestampType,
    /// `message.timestamp.before.max.ms`: largest allowed age in ms of a CreateTime timestamp
    /// relative to the broker clock (KIP-937). Default `i64::MAX`.
    pub message_timestamp_before_max_ms: i64,
    /// `message.timestamp.after.max.ms`: how far in ms a CreateTime timestamp may be ahead of
    /// the broker clock (KIP-937; Kafka 4 default one hour, KIP-1030).
    pub message_timestamp_after_max_ms: i64,
    /// `retention.ms` (`log.retention.ms`, `.minutes`, `.hours`): closed segments whose newest
    /// record is older than this many ms are deleted. Negative: no time limit. Default 7 days.
    pub retention_ms: i64,
    /// `retention.bytes` (`log.retention.bytes`): oldest closed segments are deleted while the
    /// log is larger than this many bytes. Negative: no size limit. Default -1.
    pub retention_bytes: i64,
    /// `cleanup.policy` contains `delete` (`log.cleanup.policy`): retention by time and size
    /// applies. Default true.
    pub cleanup_delete: bool,
    /// `cleanup.policy` contains `compact`: the log cleaner keeps the latest record per key.
    /// Default false.
    pub cleanup_compact: bool,
    /// `delete.retention.ms` (`log.cleaner.delete.retention.ms`): how long a tombstone survives
    /// after the cleaner first saw it (KIP-534 delete horizon), ms. Default 1 day.
    pub delete_retention_ms: i64,
    /// `file.delete.delay.ms` (`log.segment.delete.delay.ms`): how long a segment renamed to
    /// `.deleted` stays on disk before it is removed, ms. Default 60000.
    pub file_delete_delay_ms: i64,
    /// `min.cleanable.dirty.ratio` (`log.cleaner.min.cleanable.ratio`): dirty bytes over total
    /// bytes above which the log is compacted. Default 0.5.
    pub min_cleanable_dirty_ratio: f64,
    /// `min.compaction.lag.ms` (`log.cleaner.min.compaction.lag.ms`): records younger than this
    /// many ms are not compacted. Default 0.
    pub min_compaction_lag_ms: i64,
    /// `max.compaction.lag.ms` (`log.cleaner.max.compaction.lag.ms`): a dirty segment older than
    /// this many ms makes the log eligible for compaction whatever its dirty ratio (KIP-354).
    /// Default `i64::MAX`.
    pub max_compaction_lag_ms: i64,
    /// `compression.type`: `None` keeps the producer's codec (`producer`), `Some(codec)`
    /// re-compresses batches in another codec on append.
    pub compression: Option<gregor_protocol::batch::Compression>,
    /// KIP-390 level for `compression` (`compression.gzip.level`, `compression.zstd.level`,
    /// `compression.lz4.level`); `None` for the codec's default.
    pub compression_level: Option<i32>,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 1024 * 1024 * 1024,
            segment_ms: 7 * 24 * 60 * 60 * 1000,
            segment_index_bytes: 10 * 1024 * 1024,
            index_interval_bytes: 4096,
            flush_interval_messages: i64::MAX as u64,
            flush_interval_ms: i64::MAX,
            max_message_bytes: 1_048_588,
            message_timestamp_type: TimestampType::CreateTime,
            message_timestamp_before_max_ms: i64::MAX,
            message_timestamp_after_max_ms: 3_600_000,
            retention_ms: 7 * 24 * 60 * 60 * 1000,
            retention_bytes: -1,
            cleanup_delete: true,
            cleanup_compact: false,
            delete_retention_ms: 24 * 60 * 60 * 1000,
            file_delete_delay_ms: 60_000,
            min_cleanable_dirty_ratio: 0.5,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
            compression: None,
            compression_level: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_names_round_trip() {
        for (topic, p) in [("a", 0), ("my-topic", 12), ("a.b-c_d", 3), ("x-1", 7)] {
            let tp = TopicPartition::new(topic, p);
            assert_eq!(TopicPartition::parse_dir_name(&tp.dir_name()), Some(tp));
        }
    }

    #[test]
    fn non_partition_dirs_are_rejected() {
        for name in [
            "foo",
            "foo-",
            "-3",
            "foo-0.abcdef0123-delete",
            "foo-0.abc-future",
            "foo-0.abc-stray",
            "foo--1x",
            "lost+found",
        ] {
            assert_eq!(TopicPartition::parse_dir_name(name), None, "{name}");
        }
    }
}
