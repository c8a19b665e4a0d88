//! The follower side of partition replication: replica fetchers (written by the follower
//! branch).
