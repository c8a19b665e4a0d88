//! gregor-coordinator: the coordinator runtime and the coordinators built on it.
//!
//! Kafka's coordinators (the group coordinator and the transaction coordinator) keep their
//! state in the partitions of an internal topic (`__consumer_offsets`,
//! `__transaction_state`). The [`runtime::CoordinatorRuntime`] (Kafka's `CoordinatorRuntime`)
//! owns what they share: which partitions this broker coordinates (loaded when it becomes the
//! partition's leader, by replaying the partition's records; unloaded when it resigns), writes
//! that complete only when the high watermark passes them, timers on an injected
//! [`gregor_log::Clock`], and the one place that maps errors to Kafka codes
//! ([`error::CoordinatorError::error_code`]).
//!
//! The group coordinator ([`group`]) is the first coordinator on it: classic groups, KIP-848
//! consumer groups, committed offsets (also transactional ones, KIP-98/KIP-447), server-side
//! assignors and the `__consumer_offsets` record schemas. The transaction coordinator
//! ([`transaction`]) is the second: transactional ids in `__transaction_state`, their state
//! machine, and the transaction markers it has partition leaders write.
//!
//! This crate knows nothing of the broker, its handlers or its network: writes go through the
//! [`runtime::PartitionWriter`] trait and topic metadata comes through
//! [`runtime::TopicMetadata`], both implemented by the broker over its replica manager and
//! metadata image (and by tests in memory). Dependencies point one way:
//! coordinator -> {log, protocol}.
#![deny(missing_docs)]

pub mod error;
pub mod group;
pub mod runtime;
#[cfg(test)]
mod tests;
pub mod transaction;

pub use error::CoordinatorError;
pub use runtime::{CoordinatorRecord, CoordinatorRuntime, PartitionWriter, TopicMetadata};
