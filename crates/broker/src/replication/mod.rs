//! Partition replication between brokers (issue 11): the follower's decisions ([`follower`]).

pub mod follower;
