//! Connection quotas with Kafka's names and behaviour (`ConnectionQuotas` in Kafka's
//! `SocketServer`):
//! - `max.connections` (broker-wide): when every slot is taken the acceptor blocks until a
//!   connection closes; new connections wait in the listen backlog.
//! - `max.connections.per.ip` and `max.connections.per.ip.overrides`: a connection above its
//!   address's limit is closed at once, as Kafka's `TooManyConnectionsException`.
//!
//! - Connection creation rates (KIP-612): `max.connection.creation.rate` (broker-wide, per
//!   second): above it the acceptor waits before serving the next connection, at most one
//!   quota window; the per-IP `connection_creation_rate` client quota (an `ip` entity of
//!   AlterClientQuotas, looked up through [`IpConnectionRates`]): a connection above it is
//!   held for the throttle time (at most one window) and then closed, as Kafka's
//!   `ConnectionThrottledException` and delayed close. Rates are Kafka's [`Rate`] over
//!   `quota.window.num` samples of `quota.window.size.seconds`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The per-IP `connection_creation_rate` quotas (KIP-612), looked up per new connection: the
/// quota of the address (connections per second), or None. The broker answers from its
/// metadata image (`ip=<address>`, else `ip=<default>`).
#[derive(Clone)]
pub struct IpConnectionRates(pub Arc<dyn Fn(IpAddr) -> Option<f64> + Send + Sync>);

impl std::fmt::Debug for IpConnectionRates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IpConnectionRates")
    }
}

/// Connection creation rate settings (KIP-612).
#[derive(Debug, Clone)]
pub struct ConnectionRateConfig {
    /// `max.connection.creation.rate` (connections per second; `i32::MAX`, the default, is no
    /// limit).
    pub max_connection_creation_rate: i32,
    /// `quota.window.num`.
    pub quota_window_num: i32,
    /// `quota.window.size.seconds`.
    pub quota_window_size_seconds: i32,
    /// The per-IP quotas, if any may exist.
    pub ip_rates: Option<IpConnectionRates>,
}

impl Default for ConnectionRateConfig {
    fn default() -> Self {
        Self {
            max_connection_creation_rate: i32::MAX,
            quota_window_num: 11,
            quota_window_size_seconds: 1,
            ip_rates: None,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    start_ms: i64,
    last_event_ms: i64,
    value: f64,
}

impl Sample {
    fn new(now_ms: i64) -> Self {
        Self {
            start_ms: now_ms,
            last_event_ms: now_ms,
            value: 0.0,
        }
    }
}

/// Kafka's `Rate` on a `WindowedSum` (`SampledStat`), per second, sans-I/O: time is an
/// argument in ms.
#[derive(Debug, Clone)]
pub struct Rate {
    /// `quota.window.num`.
    samples: usize,
    /// `quota.window.size.seconds` in ms.
    window_ms: i64,
    ring: Vec<Sample>,
    current: usize,
}

impl Rate {
    /// A rate of `samples` samples (at least 1) of `window_ms` each (at least 1).
    pub fn new(samples: usize, window_ms: i64) -> Self {
        Self {
            samples: samples.max(1),
            window_ms: window_ms.max(1),
            ring: Vec::new(),
            current: 0,
        }
    }

    /// Records `value` at `now_ms` (Kafka's `SampledStat.record`): a new sample starts once
    /// the current one is a window old; `samples + 1` are kept, the extra one overlapping the
    /// start of the window.
    pub fn record(&mut self, value: f64, now_ms: i64) {
        if self.ring.is_empty() {
            self.ring.push(Sample::new(now_ms));
            self.current = 0;
        }
        if now_ms - self.ring[self.current].start_ms >= self.window_ms {
            self.current = (self.current + 1) % (self.samples + 1);
            if self.current >= self.ring.len() {
                self.ring.push(Sample::new(now_ms));
            } else {
                self.ring[self.current] = Sample::new(now_ms);
            }
        }
        let s = &mut self.ring[self.current];
        s.value += value;
        s.last_event_ms = now_ms;
    }

    /// Samples without an event in the last `samples` windows restart empty at `now_ms`.
    fn purge(&mut self, now_ms: i64) {
        let expire = self.samples as i64 * self.window_ms;
        for s in &mut self.ring {
            if now_ms - s.last_event_ms >= expire {
                *s = Sample::new(now_ms);
            }
        }
    }

    /// The window the rate is measured over at `now_ms`, in ms (Kafka's `Rate.windowSize`):
    /// the time since the oldest sample started, at least `samples - 1` whole windows, at
    /// least 1 ms.
    pub fn window_size_ms(&mut self, now_ms: i64) -> i64 {
        self.purge(now_ms);
        let oldest = self.ring.iter().map(|s| s.start_ms).min().unwrap_or(now_ms);
        let mut elapsed = now_ms - oldest;
        let full_windows = elapsed / self.window_ms;
        let min_full_windows = self.samples as i64 - 1;
        if full_windows < min_full_windows {
            elapsed += (min_full_windows - full_windows) * self.window_ms;
        }
        elapsed.max(1)
    }

    /// When the last value was recorded (ms), None before any.
    pub fn last_event_ms(&self) -> Option<i64> {
        self.ring.iter().map(|s| s.last_event_ms).max()
    }

    /// The rate at `now_ms`, per second (Kafka's `Rate.measure`).
    pub fn measure(&mut self, now_ms: i64) -> f64 {
        let window = self.window_size_ms(now_ms);
        let total = self.ring.iter().fold(0.0, |acc, s| acc + s.value);
        total * 1000.0 / window as f64
    }

    /// Kafka's `QuotaUtils.throttleTime`: ms until the rate is back at `bound` if nothing more
    /// is recorded, 0 when it is not above it.
    pub fn throttle_time_ms(&mut self, bound: f64, now_ms: i64) -> i64 {
        let observed = self.measure(now_ms);
        if observed <= bound {
            return 0;
        }
        if bound <= 0.0 {
            // A quota of 0 refuses everything: the caller bounds the throttle.
            return i64::MAX;
        }
        let window = self.window_size_ms(now_ms) as f64;
        ((observed - bound) / bound * window).round() as i64
    }
}

/// Limits on open connections.
#[derive(Debug)]
pub struct ConnectionQuotas {
    broker_slots: Arc<Semaphore>,
    max_connections_per_ip: usize,
    max_connections_per_ip_overrides: HashMap<IpAddr, usize>,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    rates: ConnectionRateConfig,
    /// The broker-wide creation rate, when `max.connection.creation.rate` is set.
    broker_rate: Option<Mutex<Rate>>,
    ip_rates: Mutex<HashMap<IpAddr, Rate>>,
    epoch: Instant,
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
            rates: ConnectionRateConfig::default(),
            broker_rate: None,
            ip_rates: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
        })
    }

    /// [`ConnectionQuotas::new`] with connection creation rates (KIP-612).
    pub fn with_rates(
        max_connections: i32,
        max_connections_per_ip: i32,
        max_connections_per_ip_overrides: &HashMap<IpAddr, i32>,
        rates: ConnectionRateConfig,
    ) -> Arc<Self> {
        let base = Self::new(
            max_connections,
            max_connections_per_ip,
            max_connections_per_ip_overrides,
        );
        let Ok(mut q) = Arc::try_unwrap(base) else {
            unreachable!("a fresh Arc has one owner")
        };
        q.broker_rate = (rates.max_connection_creation_rate < i32::MAX).then(|| {
            Mutex::new(Rate::new(
                usize::try_from(rates.quota_window_num.max(1)).unwrap_or(1),
                i64::from(rates.quota_window_size_seconds.max(1)) * 1000,
            ))
        });
        q.rates = rates;
        Arc::new(q)
    }

    fn now_ms(&self) -> i64 {
        i64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    fn max_throttle_ms(&self) -> i64 {
        i64::from(self.rates.quota_window_size_seconds.max(1)) * 1000
    }

    fn new_rate(&self) -> Rate {
        Rate::new(
            usize::try_from(self.rates.quota_window_num.max(1)).unwrap_or(1),
            self.max_throttle_ms(),
        )
    }

    /// Records a new connection against `max.connection.creation.rate` and returns how long
    /// the acceptor waits before serving it (ms, at most one quota window; Kafka's
    /// `recordConnectionAndGetThrottleTimeMs`). 0 when no rate is set.
    pub fn record_connection_and_get_throttle_ms(&self) -> i64 {
        let Some(rate) = &self.broker_rate else {
            return 0;
        };
        let now = self.now_ms();
        let mut rate = rate.lock();
        rate.record(1.0, now);
        rate.throttle_time_ms(f64::from(self.rates.max_connection_creation_rate), now)
            .min(self.max_throttle_ms())
    }

    /// Records a new connection from `ip` against its `connection_creation_rate` quota; the
    /// throttle time (ms, at most one window) when it is above it — then the connection is
    /// not counted (here nor in the broker-wide rate) and is to be closed after that time
    /// (Kafka's `recordIpConnectionMaybeThrottle`). None when within the quota or none.
    pub fn record_ip_connection(&self, ip: IpAddr) -> Option<i64> {
        let quota = self.rates.ip_rates.as_ref().and_then(|l| (l.0)(ip))?;
        let now = self.now_ms();
        let throttle = {
            let mut rates = self.ip_rates.lock();
            if rates.len() > 100_000 {
                // Bounded: addresses idle for a whole window are forgotten first.
                let expire = self.max_throttle_ms() * i64::from(self.rates.quota_window_num.max(1));
                rates.retain(|_, r| r.last_event_ms().is_some_and(|t| now - t < expire));
            }
            let rate = rates.entry(ip).or_insert_with(|| self.new_rate());
            rate.record(1.0, now);
            let t = rate
                .throttle_time_ms(quota, now)
                .min(self.max_throttle_ms());
            if t > 0 {
                rate.record(-1.0, now);
            }
            t
        };
        if throttle <= 0 {
            return None;
        }
        if let Some(rate) = &self.broker_rate {
            rate.lock().record(-1.0, now);
        }
        Some(throttle)
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
