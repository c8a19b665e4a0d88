//! gregor-protocol: what gregor needs to speak Kafka on the wire, beyond the message structs.
//!
//! Owns request/response framing ([`frame`]), the record batch v2 view, validation and builder
//! ([`batch`], [`records`]), and the compression codecs ([`compression`]). Message structs and
//! their encoders/decoders come from the `kafka-protocol` crate, re-exported as
//! [`kafka_protocol`]; nothing here re-implements them. This crate knows nothing of files,
//! sockets or the broker's state.
#![deny(missing_docs)]

pub mod batch;
pub mod compression;
pub mod frame;
pub mod records;

pub use kafka_protocol;
