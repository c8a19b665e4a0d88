//! The brokers' heartbeat sessions on the active controller (Kafka's `BrokerHeartbeatManager`:
//! a `BrokerHeartbeatState` per broker and the `registerBrokerRecordOffsets`) and the clock they
//! are measured on ([`ControllerClock`], injected so tests move time by hand). The controller
//! ([`crate::controller::Controller`]) holds them; registration, heartbeats and fencing
//! (`cluster_control`) read and update them. In memory only, as in Kafka.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::record::MetadataRecord;

/// `broker.session.timeout.ms`'s default (Kafka's `KRaftConfigs`).
pub const DEFAULT_BROKER_SESSION_TIMEOUT_MS: u64 = 9000;

/// A monotonic clock in milliseconds, injected so tests move time by hand.
pub trait ControllerClock: Send + Sync {
    /// Milliseconds since an arbitrary start; never goes back.
    fn now_ms(&self) -> u64;
}

/// The process's monotonic clock.
pub struct SystemClock {
    start: Instant,
}

impl SystemClock {
    /// A clock starting at 0 now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ControllerClock for SystemClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A clock tests advance.
#[derive(Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// Moves time forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl ControllerClock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// One broker's session on the active controller (`BrokerHeartbeatState`).
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// Clock time of its last heartbeat (or registration), ms.
    pub(crate) last_contact_ms: u64,
    /// The metadata offset its last heartbeat reported.
    pub(crate) metadata_offset: i64,
    /// The offset at which its controlled shutdown records end, once it started one.
    pub(crate) controlled_shutdown_offset: Option<i64>,
    /// The log directories its last handled heartbeat reported offline (KIP-858): its
    /// replicas in them may not lead or join an ISR until a heartbeat leaves them out.
    pub(crate) offline_dirs: std::collections::BTreeSet<uuid::Uuid>,
}

/// The sessions of the registered brokers, and the offset of each broker's latest
/// `RegisterBrokerRecord` (Kafka's `registerBrokerRecordOffsets`: a broker is caught up once
/// its metadata reached it).
#[derive(Debug, Default)]
pub(crate) struct BrokerSessions {
    pub(crate) sessions: BTreeMap<i32, Session>,
    pub(crate) register_offsets: BTreeMap<i32, i64>,
}

impl BrokerSessions {
    /// Forgets every registration offset (a snapshot replaces the image).
    pub(crate) fn register_offsets_clear(&mut self) {
        self.register_offsets.clear();
    }

    /// Notes the offset of a committed `RegisterBrokerRecord` (or forgets it on
    /// `UnregisterBrokerRecord`).
    pub(crate) fn replayed(&mut self, offset: u64, record: &MetadataRecord) {
        match record {
            MetadataRecord::RegisterBroker(r) => {
                self.register_offsets
                    .insert(r.broker_id, i64::try_from(offset).unwrap_or(i64::MAX));
            }
            MetadataRecord::UnregisterBroker(r) => {
                self.register_offsets.remove(&r.broker_id);
            }
            _ => {}
        }
    }
}
