//! gregor-protocol: what gregor needs to speak Kafka on the wire, beyond the message structs.
//!
//! Owns request/response framing ([`frame`]), the record batch v2 view, validation and builder
//! ([`batch`], [`records`]), the compression codecs ([`compression`]), Kafka's error codes as
//! one typed enum ([`error::ErrorCode`]) and the wire reader/writer of the internal record
//! schemas ([`wire`]), and the KIP-631 metadata records of KRaft's `__cluster_metadata` log
//! in Kafka's binary format ([`metadata_records`]). Message structs and
//! their encoders/decoders come from the `kafka-protocol` crate, re-exported as
//! [`kafka_protocol`]; nothing here re-implements them. This crate knows nothing of files,
//! sockets or the broker's state.
#![deny(missing_docs)]

pub mod batch;
pub mod compression;
pub mod control;
pub mod error;
pub mod fetch_frame;
pub mod frame;
pub mod metadata_records;
pub mod records;
pub mod wire;

pub use kafka_protocol;
