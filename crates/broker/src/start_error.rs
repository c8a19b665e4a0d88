//! Why the broker could not start ([`StartError`]), shared by the start-up steps in
//! [`crate::server`] and [`crate::metadata_publisher`].

use std::path::PathBuf;

use gregor_network::NetworkError;
use thiserror::Error;

/// Start-up failures, each naming what to fix.
#[derive(Debug, Error)]
pub enum StartError {
    /// A log directory could not be prepared.
    #[error("log directory {path}: {reason}")]
    LogDir {
        /// The directory.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The log dirs' `meta.properties` disagree with each other or with the configuration
    /// (another cluster id, another node id).
    #[error("storage: {0}")]
    Storage(String),
    /// The metadata log or controller failed.
    #[error("metadata: {0}")]
    Metadata(String),
    /// Partition logs failed to load.
    #[error("loading partition logs: {0}")]
    Logs(String),
    /// A Kafka listener could not be served (bind failure, unimplemented security protocol).
    #[error(transparent)]
    Network(#[from] NetworkError),
    /// A SASL listener's credentials source could not be read (an OAUTHBEARER JWKS).
    #[error("SASL: {0}")]
    Sasl(String),
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// host:port.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
}
