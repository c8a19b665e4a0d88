//! Partition replication (issue 11): the leader side ([`leader`]: ISR, high watermark,
//! AlterPartition proposals as a sans-I/O state machine) and the follower side ([`follower`]:
//! replica fetchers).

pub mod follower;
pub mod leader;
pub mod sim;
