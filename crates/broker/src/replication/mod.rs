//! Partition replication between brokers (issue 11): the leader side ([`leader`]: ISR, high
//! watermark, AlterPartition proposals, as a sans-I/O state machine) and the follower's
//! decisions ([`follower`]), and the choice of a consumer's read replica (KIP-392,
//! [`replica_selector`]).

pub mod follower;
pub mod leader;
pub mod quota;
pub mod replica_selector;
pub mod sim;
