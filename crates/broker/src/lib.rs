//! gregor-broker: the broker. Owns start-up and shutdown ([`server`]), the shared state
//! ([`broker::Broker`]), one handler module per Kafka API family ([`handlers`], plugged into
//! `gregor-network` as its request handler), authorization ([`authorizer`]), the hosted
//! partitions with their leadership state, high watermark and delayed operations
//! ([`replica_manager`]), and the broker and topic configuration with Kafka's names and
//! defaults ([`config`]). Connections, listeners and the request context are
//! `gregor-network`'s.
//!
//! It builds on `gregor-log` (partition data on disk) and `gregor-metadata` (cluster metadata
//! and the controller); it never parses record batches beyond their headers on the produce path.
#![deny(missing_docs)]

pub mod admin;
pub mod alter_partition;
pub mod assignments;
pub mod authorizer;
pub mod broker;
pub mod broker_config_defs;
pub mod client_quota;
pub mod config;
pub mod config_report;
pub mod config_value;
pub mod connection_limits;
pub mod controller_channel;
pub mod controller_server;
pub mod coordinator_writer;
pub mod error_codes;
pub mod fetch_session;
/// The group coordinator, which lives in `gregor-coordinator`.
pub use gregor_coordinator::group as group_coordinator;
pub mod handlers;
pub mod lifecycle;
pub mod listener_security;
pub mod metadata_publisher;
pub mod observability;
pub mod quorum_config;
pub mod replica_fetcher;
pub mod replica_manager;
pub mod replication;
pub mod sasl_config;
pub mod server;
pub mod standard_authorizer;
pub mod start_error;
pub mod storage;
pub mod txn_markers;
pub mod txn_verification;

#[cfg(test)]
mod coordinator_tests;
#[cfg(test)]
mod txn_markers_tests;

pub use broker::Broker;
pub use config::BrokerConfig;
pub use server::{start, RunningBroker, StartError};
