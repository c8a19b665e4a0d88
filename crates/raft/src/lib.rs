//! gregor-raft: the KRaft metadata quorum (KIP-595 Raft, KIP-996 pre-vote) that replicates
//! `__cluster_metadata-0` among the controllers, with brokers following it as observers.
//!
//! What this crate owns:
//! - [`RaftNode`]: one node as a sans-I/O state machine with the semantics of Kafka's
//!   `KafkaRaftClient`/`QuorumState`. It is driven by [`RaftNode::handle_message`],
//!   [`RaftNode::tick`] and [`RaftNode::propose`] with the time passed in (ms), draws its
//!   randomness from an injected seeded [`Rng`], and returns [`Action`]s: messages to send, the
//!   election state to persist (`quorum-state`), log flushes, high-watermark (commit) moves,
//!   installed snapshots (KIP-630: a follower behind the leader's log start fetches its latest
//!   snapshot with FetchSnapshot and starts its log there).
//! - [`RaftLog`]: the small log interface the core reads and appends through (Kafka's
//!   `ReplicatedLog`), with [`MemoryLog`] for tests and the simulator and
//!   [`KafkaMetadataLog`] ([`metadata_log`]) for `<metadata.log.dir>/__cluster_metadata-0/`
//!   on gregor-log segments in Kafka's layout, with its retention through snapshots.
//! - [`batches`]: the record batches a leader writes (a proposal's data batch, the
//!   `LeaderChange` control batch).
//! - [`snapshot`]: KIP-630 snapshots on disk (`<end offset>-<epoch>.checkpoint`, written as
//!   `.checkpoint.part` and renamed; SnapshotHeader, batches, SnapshotFooter).
//! - [`message`]: the KRaft RPCs (Vote, BeginQuorumEpoch, EndQuorumEpoch, Fetch,
//!   FetchSnapshot) as plain structs with Kafka's field meanings, and [`convert`] to and from
//!   `kafka-protocol`'s message types, so the socket transport is framing only.
//! - [`quorum_state`]: the `quorum-state` file (Kafka's `FileQuorumStateStore`: JSON codec and
//!   the durable temp-file/fsync/rename store), in which a driver persists the
//!   [`ElectionState`].
//! - [`sim`]: a deterministic simulator (one seed drives the network, faults, crashes, clocks
//!   and the client) with safety and liveness checks after every step (`cargo xtask sim`).
//!
//! - [`driver`]: the production driver, [`driver::RaftManager`] (one thread owning the node,
//!   its log and `quorum-state`, executing the actions in order) and the outbound socket
//!   transport ([`driver::transport`]).
//!
//! What it must not know about: metadata record types (it replicates and snapshots opaque
//! record batches; KIP-631 records live in `gregor-protocol` and `gregor-metadata`). Sockets
//! and tokio only in [`driver`]; files only through [`metadata_log`], [`snapshot`] and
//! [`quorum_state`]; the core ([`RaftNode`]) touches neither. Snapshots (KIP-630) are in the core
//! and the logs; see docs/architecture.md.
#![deny(missing_docs)]

pub mod batches;
pub mod config;
pub mod convert;
pub mod driver;
pub mod log;
pub mod message;
pub mod metadata_log;
mod node;
pub mod quorum_state;
pub mod rng;
pub mod sim;
pub mod snapshot;
pub mod types;

pub use config::QuorumConfig;
pub use log::{MemoryLog, RaftLog, RaftLogError};
pub use message::{Message, Request, Response};
pub use metadata_log::{KafkaMetadataLog, MetadataLogConfig, StorageError};
pub use node::{
    Action, ProposeError, Proposed, QuorumDescription, RaftNode, ReplicaDescription, Role,
};
pub use rng::Rng;
pub use types::{ElectionState, NodeId, OffsetAndEpoch, VoterSet};
