//! gregor-metadata: cluster metadata as an ordered log of records.
//!
//! Owns the metadata records ([`record`]), the log they are appended to ([`log`]), the
//! in-memory [`image::MetadataImage`] built by applying them in order, and the controller
//! ([`controller::Controller`]) that validates requests against the image and turns them into
//! records. As in KRaft (KIP-500, KIP-631), every change to topics, partitions, configs and
//! producer-id blocks is a record; the image is only ever derived from the log.
//!
//! The log is behind the [`log::MetadataLog`] trait: today a local file, later a Raft log
//! (openraft). Request handlers only see the [`controller::Controller`] and images, so swapping
//! the log changes no handler. This crate knows nothing of sockets or partition data files.
#![deny(missing_docs)]

pub mod controller;
pub mod image;
pub mod log;
pub mod record;

pub use controller::{Controller, ControllerError};
pub use image::{MetadataImage, PartitionRegistration, TopicImage};
pub use record::{ConfigResource, MetadataRecord};
