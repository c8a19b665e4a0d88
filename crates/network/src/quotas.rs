//! Connection quotas with Kafka's names and behaviour (`ConnectionQuotas` in Kafka's
//! `SocketServer`):
//! - `max.connections` (broker-wide): when every slot is taken the acceptor blocks until a
//!   connection closes; new connections wait in the listen backlog.
//! - `max.connections.per.ip` and `max.connections.per.ip.overrides`: a connection above its
//!   address's limit is closed at once, as Kafka's `TooManyConnectionsException`.
//!
//! (Connection creation-rate quotas, KIP-612, come with the quota work.)

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Limits on open connections.
#[derive(Debug)]
pub struct ConnectionQuotas {
    broker_slots: Arc<Semaphore>,
    max_connections_per_ip: usize,
    max_connections_per_ip_overrides: HashMap<IpAddr, usize>,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyConnections {
    /// The client's address.
    pub ip: IpAddr,
    /// Its limit.
    pub max: usize,
}

impl ConnectionQuotas {
    /// Quotas for `max.connections`, `max.connections.per.ip` and its overrides (negative
    /// values are treated as 0).
    pub fn new(
        max_connections: i32,
        max_connections_per_ip: i32,
        max_connections_per_ip_overrides: &HashMap<IpAddr, i32>,
    ) -> Arc<Self> {
        let clamp = |v: i32| usize::try_from(v).unwrap_or(0);
        Arc::new(Self {
            broker_slots: Arc::new(Semaphore::new(
                clamp(max_connections).min(Semaphore::MAX_PERMITS),
            )),
            max_connections_per_ip: clamp(max_connections_per_ip),
            max_connections_per_ip_overrides: max_connections_per_ip_overrides
                .iter()
                .map(|(ip, n)| (*ip, clamp(*n)))
                .collect(),
            per_ip: Mutex::new(HashMap::new()),
        })
    }

    /// Waits until a broker-wide connection slot is free (`max.connections`). The acceptor
    /// calls this before accepting, so it blocks as Kafka's `waitForConnectionSlot` does.
    pub async fn wait_for_connection_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.broker_slots.clone().acquire_owned().await.ok()
    }

    /// Counts a new connection from `ip` against `max.connections.per.ip`.
    ///
    /// # Errors
    /// [`TooManyConnections`] when `ip` already has its maximum; the caller closes the
    /// connection.
    pub fn register(
        self: &Arc<Self>,
        ip: IpAddr,
        broker_slot: OwnedSemaphorePermit,
    ) -> Result<ConnectionSlot, TooManyConnections> {
        let max = self
            .max_connections_per_ip_overrides
            .get(&ip)
            .copied()
            .unwrap_or(self.max_connections_per_ip);
        let mut per_ip = self.per_ip.lock();
        let count = per_ip.entry(ip).or_insert(0);
        if *count >= max {
            if *count == 0 {
                per_ip.remove(&ip);
            }
            return Err(TooManyConnections { ip, max });
        }
        *count += 1;
        Ok(ConnectionSlot {
            quotas: self.clone(),
            ip,
            _broker_slot: broker_slot,
        })
    }

    /// Open connections from `ip`.
    pub fn connections_from(&self, ip: IpAddr) -> usize {
        self.per_ip.lock().get(&ip).copied().unwrap_or(0)
    }
}

/// One open connection's share of the quotas, released on drop.
#[derive(Debug)]
pub struct ConnectionSlot {
    quotas: Arc<ConnectionQuotas>,
    ip: IpAddr,
    _broker_slot: OwnedSemaphorePermit,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut per_ip = self.quotas.per_ip.lock();
        if let Some(n) = per_ip.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per_ip.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn per_ip_limit_and_override() {
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let q = ConnectionQuotas::new(100, 1, &HashMap::from([(b, 2)]));
        let slot = |q: &Arc<ConnectionQuotas>| {
            q.broker_slots
                .clone()
                .try_acquire_owned()
                .expect("broker slot")
        };
        let a1 = q.register(a, slot(&q)).expect("first from a");
        assert_eq!(
            q.register(a, slot(&q)).err(),
            Some(TooManyConnections { ip: a, max: 1 })
        );
        let _b1 = q.register(b, slot(&q)).expect("b1");
        let _b2 = q.register(b, slot(&q)).expect("b2");
        assert!(q.register(b, slot(&q)).is_err());
        drop(a1);
        assert_eq!(q.connections_from(a), 0);
        let _a2 = q.register(a, slot(&q)).expect("a again after close");
        // Refused connections gave their broker slots back.
        assert_eq!(q.broker_slots.available_permits(), 97);
    }

    #[tokio::test]
    async fn broker_limit_blocks_until_a_connection_closes() {
        let q = ConnectionQuotas::new(1, 10, &HashMap::new());
        let ip: IpAddr = "127.0.0.1".parse().expect("ip");
        let first = q
            .register(ip, q.wait_for_connection_slot().await.expect("slot"))
            .expect("first");
        let q2 = q.clone();
        let waiting = tokio::spawn(async move { q2.wait_for_connection_slot().await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        drop(first);
        let permit = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("slot freed")
            .expect("task");
        assert!(permit.is_some());
    }
}
