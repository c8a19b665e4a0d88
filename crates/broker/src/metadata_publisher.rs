//! The broker's side of the metadata log: start-up of the metadata log, loader and controller
//! ([`start_metadata`]), and the publishers the loader calls for each committed batch
//! ([`install_publishers`]): ReplicaManager first (Kafka's `BrokerMetadataPublisher` applies
//! the partition changes before the coordinators hear of them), then the coordinators.

use std::path::Path;
use std::sync::{Arc, Weak};

use gregor_metadata::controller::start_controller;
use gregor_metadata::loader::{start_loader, LoaderError};
use gregor_metadata::log::{FileMetadataLog, MetadataLog};
use gregor_metadata::{ControllerHandle, MetadataDelta, MetadataImage, MetadataPublisher};
use tokio::sync::watch;
use tracing::info;

use crate::server::{Broker, StartError};

/// Opens the metadata log in `metadata_dir`, starts the loader and the controller on it, and
/// waits until the loader has applied everything committed before start-up. Returns the
/// controller channel and the two tasks (which end when `shutdown` turns true).
///
/// # Errors
/// [`StartError::Metadata`] when the log cannot be opened or read.
pub async fn start_metadata(
    metadata_dir: &Path,
    shutdown: &watch::Receiver<bool>,
) -> Result<(ControllerHandle, Vec<tokio::task::JoinHandle<()>>), StartError> {
    let err = |e: &dyn std::fmt::Display| StartError::Metadata(e.to_string());
    let log: Arc<dyn MetadataLog> =
        Arc::new(FileMetadataLog::open(metadata_dir).map_err(|e| err(&e))?);
    let high_watermark = log.high_watermark();
    let (loader, loader_task) =
        start_loader(log.subscribe().map_err(|e| err(&e))?, shutdown.clone());
    let (controller, controller_task) =
        start_controller(log, loader.clone(), shutdown.clone()).map_err(|e| err(&e))?;
    loader
        .wait_for_catch_up(high_watermark)
        .await
        .map_err(|e| err(&e))?;
    info!(
        offset = high_watermark,
        "metadata loaded from {}",
        metadata_dir.display()
    );
    Ok((controller, vec![loader_task, controller_task]))
}

/// Installs the broker's publishers on the loader, in the order they must hear of each batch.
/// Each first gets the current image, so when this returns the partitions match it.
///
/// # Errors
/// The publisher's failure on the current image.
pub async fn install_publishers(broker: &Arc<Broker>) -> Result<(), LoaderError> {
    let loader = broker.controller.loader();
    loader
        .install_publisher(Arc::new(ReplicaManagerPublisher {
            broker: Arc::downgrade(broker),
        }))
        .await
}

/// Applies each image to the hosted partitions ([`crate::replica_manager::ReplicaManager::apply_image`]):
/// creates and deletes logs, sets leadership and configs.
struct ReplicaManagerPublisher {
    /// Weak: the loader must not keep a stopped broker alive.
    broker: Weak<Broker>,
}

impl MetadataPublisher for ReplicaManagerPublisher {
    fn name(&self) -> &str {
        "ReplicaManager"
    }

    fn on_metadata_update(
        &self,
        _delta: &MetadataDelta<'_>,
        image: &Arc<MetadataImage>,
    ) -> Result<(), String> {
        let Some(broker) = self.broker.upgrade() else {
            return Ok(());
        };
        broker
            .replica_manager
            .apply_image(image)
            .map_err(|e| format!("applying metadata to partition logs failed: {e}"))
    }
}
