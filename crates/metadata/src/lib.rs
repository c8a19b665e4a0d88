//! gregor-metadata: cluster metadata as an ordered log of records.
//!
//! Owns the metadata records ([`record`]: Kafka's own KIP-631 records, with their bytes in
//! [`codec`]), the log they are committed to ([`log`]), the
//! in-memory [`image::MetadataImage`] built by applying them in order, the controller
//! ([`controller`]) that validates requests against the image and turns them into records, and
//! the loader ([`loader`]) that applies every committed batch on this node and publishes it to
//! ReplicaManager and the coordinators ([`publisher`]). As in KRaft (KIP-500, KIP-631), every
//! change to topics, partitions, configs and producer-id blocks is a record; the image is only
//! ever derived from the committed log.
//!
//! The log is behind the [`log::MetadataLog`] trait, shaped as a Raft log (propose, then a
//! stream of committed batches): today a one-voter local file, next KRaft (KIP-595). Request
//! handlers only see the [`controller::ControllerHandle`] and images, so swapping the log
//! changes no handler. This crate knows nothing of sockets or partition data files.
#![deny(missing_docs)]

pub mod acl;
pub mod broker_sessions;
pub mod client_quota_control;
pub mod cluster_control;
pub mod codec;
pub mod controller;
pub mod dir_assignment;
pub mod features;
pub mod image;
pub mod loader;
pub mod log;
pub mod placement;
pub mod publisher;
pub mod record;
pub mod replication_control;
pub mod scram_control;
pub mod snapshot;
pub mod txn_replay;

pub use controller::{Controller, ControllerError, ControllerHandle};
pub use image::{BrokerRegistration, MetadataImage, PartitionRegistration, TopicImage};
pub use loader::{LoaderHandle, MetadataDelta, MetadataPublisher};
pub use record::{ConfigResource, LegacyMetadataRecord, MetadataRecord};
