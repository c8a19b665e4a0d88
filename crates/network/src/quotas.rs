//! Connection quotas with Kafka's names and behaviour (`ConnectionQuotas` in Kafka's
//! `SocketServer`):
//! - `max.connections` (broker-wide) and `listener.name.<listener>.max.connections`: when
//!   every slot is taken the listener's acceptor blocks until a connection closes; new
//!   connections wait in the listen backlog. The inter-broker listener, when the server has
//!   more than one listener, is exempt from the broker-wide limit (Kafka's
//!   `protectedListener`), not from its own.
//! - `max.connections.per.ip` and `max.connections.per.ip.overrides`: a connection above its
//!   address's limit is closed at once, as Kafka's `TooManyConnectionsException`.
//!
//! - Connection creation rates (KIP-612): `max.connection.creation.rate` (broker-wide, per
//!   second; the protected inter-broker listener is exempt) and
//!   `listener.name.<listener>.max.connection.creation.rate`: above either the acceptor waits
//!   before serving the next connection, the longer of the two throttles, at most one quota
//!   window; the per-IP `connection_creation_rate` client quota (an `ip` entity of
//!   AlterClientQuotas, looked up through [`IpConnectionRates`]): a connection above it is
//!   held for the throttle time (at most one window) and then closed, as Kafka's
//!   `ConnectionThrottledException` and delayed close. Rates are Kafka's [`Rate`] over
//!   `quota.window.num` samples of `quota.window.size.seconds`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::Notify;

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

/// One listener's own limits (`listener.name.<listener>.max.connections` and
/// `listener.name.<listener>.max.connection.creation.rate`; `i32::MAX`, the default, is no
/// limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerConnectionQuota {
    /// Open connections on the listener.
    pub max_connections: i32,
    /// New connections per second on the listener (KIP-612).
    pub max_connection_creation_rate: i32,
}

impl Default for ListenerConnectionQuota {
    fn default() -> Self {
        Self {
            max_connections: i32::MAX,
            max_connection_creation_rate: i32::MAX,
        }
    }
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

/// Open connections, broker-wide and per listener (Kafka's `totalCount` and
/// `listenerCounts`, guarded together).
#[derive(Debug, Default)]
struct Counts {
    total: usize,
    /// Every listener served, with its open connections.
    listeners: HashMap<String, usize>,
}

/// The limits [`ConnectionQuotas::reconfigure`] changes at run time (Kafka's
/// `SocketServer.reconfigure` and `ListenerConnectionQuota.reconfigure`, KIP-226 dynamic
/// broker configs): values as configured, negative ones treated as 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// `max.connections`.
    pub max_connections: i32,
    /// `max.connections.per.ip`.
    pub max_connections_per_ip: i32,
    /// `max.connections.per.ip.overrides`.
    pub max_connections_per_ip_overrides: HashMap<IpAddr, i32>,
    /// `max.connection.creation.rate`.
    pub max_connection_creation_rate: i32,
    /// Per listener (by name, any case): `listener.name.<listener>.max.connections` and
    /// `listener.name.<listener>.max.connection.creation.rate`.
    pub listeners: HashMap<String, ListenerConnectionQuota>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: i32::MAX,
            max_connections_per_ip: i32::MAX,
            max_connections_per_ip_overrides: HashMap::new(),
            max_connection_creation_rate: i32::MAX,
            listeners: HashMap::new(),
        }
    }
}

/// [`ConnectionLimits`] as the quotas use them.
#[derive(Debug, Default)]
struct Limits {
    broker_max: usize,
    /// Listener names upper case; only limited listeners.
    listener_max: HashMap<String, usize>,
    per_ip: usize,
    per_ip_overrides: HashMap<IpAddr, usize>,
    /// None: no broker-wide creation rate.
    broker_rate: Option<f64>,
    /// Listener names upper case; only limited listeners.
    listener_rates: HashMap<String, f64>,
}

impl Limits {
    fn of(l: &ConnectionLimits) -> Self {
        let clamp = |v: i32| usize::try_from(v).unwrap_or(0);
        let rate = |v: i32| (v < i32::MAX).then(|| f64::from(v.max(0)));
        let upper = |n: &String| n.to_ascii_uppercase();
        Self {
            broker_max: clamp(l.max_connections),
            listener_max: l
                .listeners
                .iter()
                .filter(|(_, q)| q.max_connections < i32::MAX)
                .map(|(n, q)| (upper(n), clamp(q.max_connections)))
                .collect(),
            per_ip: clamp(l.max_connections_per_ip),
            per_ip_overrides: l
                .max_connections_per_ip_overrides
                .iter()
                .map(|(ip, n)| (*ip, clamp(*n)))
                .collect(),
            broker_rate: rate(l.max_connection_creation_rate),
            listener_rates: l
                .listeners
                .iter()
                .filter_map(|(n, q)| Some((upper(n), rate(q.max_connection_creation_rate)?)))
                .collect(),
        }
    }
}

/// Limits on open connections.
#[derive(Debug)]
pub struct ConnectionQuotas {
    limits: Mutex<Limits>,
    /// `inter.broker.listener.name` (upper case), if this server serves it.
    inter_broker_listener: Option<String>,
    counts: Mutex<Counts>,
    /// Woken when a connection closes or the limits change (a slot may be free).
    slot_freed: Notify,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    rates: ConnectionRateConfig,
    /// The broker-wide creation rate (recorded while `max.connection.creation.rate` is set).
    broker_rate: Mutex<Rate>,
    /// Per listener (upper case), recorded while its creation rate is set.
    listener_rates: Mutex<HashMap<String, Rate>>,
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
        Self::with_rates(
            max_connections,
            max_connections_per_ip,
            max_connections_per_ip_overrides,
            ConnectionRateConfig::default(),
        )
    }

    /// [`ConnectionQuotas::new`] with connection creation rates (KIP-612).
    pub fn with_rates(
        max_connections: i32,
        max_connections_per_ip: i32,
        max_connections_per_ip_overrides: &HashMap<IpAddr, i32>,
        rates: ConnectionRateConfig,
    ) -> Arc<Self> {
        Self::with_listeners(
            max_connections,
            max_connections_per_ip,
            max_connections_per_ip_overrides,
            rates,
            &HashMap::new(),
            None,
        )
    }

    /// [`ConnectionQuotas::with_rates`] with each listener's own limits (by listener name, any
    /// case) and the inter-broker listener's name, which is exempt from the broker-wide limits
    /// when the server has more than one listener (Kafka's `protectedListener`).
    pub fn with_listeners(
        max_connections: i32,
        max_connections_per_ip: i32,
        max_connections_per_ip_overrides: &HashMap<IpAddr, i32>,
        rates: ConnectionRateConfig,
        listeners: &HashMap<String, ListenerConnectionQuota>,
        inter_broker_listener: Option<&str>,
    ) -> Arc<Self> {
        let limits = ConnectionLimits {
            max_connections,
            max_connections_per_ip,
            max_connections_per_ip_overrides: max_connections_per_ip_overrides.clone(),
            max_connection_creation_rate: rates.max_connection_creation_rate,
            listeners: listeners.clone(),
        };
        let rate = Rate::new(
            usize::try_from(rates.quota_window_num.max(1)).unwrap_or(1),
            i64::from(rates.quota_window_size_seconds.max(1)) * 1000,
        );
        Arc::new(Self {
            limits: Mutex::new(Limits::of(&limits)),
            inter_broker_listener: inter_broker_listener.map(str::to_ascii_uppercase),
            counts: Mutex::new(Counts::default()),
            slot_freed: Notify::new(),
            per_ip: Mutex::new(HashMap::new()),
            rates,
            broker_rate: Mutex::new(rate),
            listener_rates: Mutex::new(HashMap::new()),
            ip_rates: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
        })
    }

    /// Applies new limits (dynamic broker configs). A higher `max.connections` lets waiting
    /// acceptors go on at once; a lower one closes no open connection, it only stops new ones
    /// until enough have closed (Kafka does the same). A rate throttle already being waited
    /// out is not shortened.
    pub fn reconfigure(&self, limits: &ConnectionLimits) {
        *self.limits.lock() = Limits::of(limits);
        self.slot_freed.notify_waiters();
    }

    /// Counts `listener` as served by this server (Kafka's `addListener`): the inter-broker
    /// listener is protected once more than one listener is.
    pub fn add_listener(&self, listener: &str) {
        self.counts
            .lock()
            .listeners
            .entry(listener.to_ascii_uppercase())
            .or_insert(0);
        self.slot_freed.notify_waiters();
    }

    /// Kafka's `protectedListener`: the inter-broker listener of a server with more than one.
    fn protected(&self, counts: &Counts, listener: &str) -> bool {
        self.inter_broker_listener
            .as_deref()
            .is_some_and(|l| l.eq_ignore_ascii_case(listener))
            && counts.listeners.len() > 1
    }

    /// Kafka's `connectionSlotAvailable`.
    fn slot_available(&self, counts: &Counts, listener: &str) -> bool {
        let limits = self.limits.lock();
        let open = counts.listeners.get(listener).copied().unwrap_or(0);
        if open
            >= limits
                .listener_max
                .get(listener)
                .copied()
                .unwrap_or(usize::MAX)
        {
            false
        } else if self.protected(counts, listener) {
            true
        } else {
            counts.total < limits.broker_max
        }
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

    /// Records a new connection on `listener` against `max.connection.creation.rate` (unless
    /// the listener is protected) and the listener's own
    /// `listener.name.<listener>.max.connection.creation.rate`, and returns how long the
    /// acceptor waits before serving it: the longer throttle, in ms, at most one quota window
    /// (Kafka's `recordConnectionAndGetThrottleTimeMs`). 0 when no rate is set.
    pub fn record_connection_and_get_throttle_ms(&self, listener: &str) -> i64 {
        let listener = listener.to_ascii_uppercase();
        let (broker_bound, listener_bound) = {
            let limits = self.limits.lock();
            (
                limits.broker_rate,
                limits.listener_rates.get(&listener).copied(),
            )
        };
        if broker_bound.is_none() && listener_bound.is_none() {
            return 0;
        }
        let now = self.now_ms();
        let protected = self.protected(&self.counts.lock(), &listener);
        let broker = match broker_bound {
            Some(bound) if !protected => {
                let mut rate = self.broker_rate.lock();
                rate.record(1.0, now);
                rate.throttle_time_ms(bound, now)
            }
            _ => 0,
        };
        let own = match listener_bound {
            Some(bound) => {
                let mut rates = self.listener_rates.lock();
                let rate = rates.entry(listener).or_insert_with(|| self.new_rate());
                rate.record(1.0, now);
                rate.throttle_time_ms(bound, now)
            }
            None => 0,
        };
        broker.max(own).min(self.max_throttle_ms())
    }

    /// Records a new connection from `ip` against its `connection_creation_rate` quota; the
    /// throttle time (ms, at most one window) when it is above it — then the connection is
    /// not counted (here nor in the broker-wide rate) and is to be closed after that time
    /// (Kafka's `recordIpConnectionMaybeThrottle`). None when within the quota or none.
    pub fn record_ip_connection(&self, ip: IpAddr, listener: &str) -> Option<i64> {
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
        let listener = listener.to_ascii_uppercase();
        let (broker_bound, listener_bound) = {
            let limits = self.limits.lock();
            (
                limits.broker_rate,
                limits.listener_rates.get(&listener).copied(),
            )
        };
        if broker_bound.is_some() && !self.protected(&self.counts.lock(), &listener) {
            self.broker_rate.lock().record(-1.0, now);
        }
        if listener_bound.is_some() {
            if let Some(rate) = self.listener_rates.lock().get_mut(&listener) {
                rate.record(-1.0, now);
            }
        }
        Some(throttle)
    }

    /// Waits until `listener` may take another connection (`max.connections` unless the
    /// listener is protected, and `listener.name.<listener>.max.connections`) and counts it.
    /// The acceptor calls this before accepting, so it blocks as Kafka's
    /// `waitForConnectionSlot` does; the slot is given back when the returned value drops.
    pub async fn wait_for_connection_slot(self: &Arc<Self>, listener: &str) -> BrokerSlot {
        let listener = listener.to_ascii_uppercase();
        loop {
            let freed = self.slot_freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so that a slot freed in between wakes it.
            freed.as_mut().enable();
            {
                let mut counts = self.counts.lock();
                if self.slot_available(&counts, &listener) {
                    counts.total += 1;
                    *counts.listeners.entry(listener.clone()).or_insert(0) += 1;
                    return BrokerSlot {
                        quotas: self.clone(),
                        listener,
                    };
                }
            }
            freed.await;
        }
    }

    /// Waits until `listener` may take another connection, without taking it: the acceptor
    /// waits here before `accept()`, so that a listener waiting for its next connection holds
    /// no slot, and takes the slot with [`Self::wait_for_connection_slot`] once it has one.
    pub async fn wait_for_free_slot(&self, listener: &str) {
        let listener = listener.to_ascii_uppercase();
        loop {
            let freed = self.slot_freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so that a slot freed in between wakes it.
            freed.as_mut().enable();
            if self.slot_available(&self.counts.lock(), &listener) {
                return;
            }
            freed.await;
        }
    }

    /// Open connections on `listener` (any case).
    pub fn connections_on(&self, listener: &str) -> usize {
        self.counts
            .lock()
            .listeners
            .get(&listener.to_ascii_uppercase())
            .copied()
            .unwrap_or(0)
    }

    /// Counts a new connection from `ip` against `max.connections.per.ip`.
    ///
    /// # Errors
    /// [`TooManyConnections`] when `ip` already has its maximum; the caller closes the
    /// connection.
    pub fn register(
        self: &Arc<Self>,
        ip: IpAddr,
        broker_slot: BrokerSlot,
    ) -> Result<ConnectionSlot, TooManyConnections> {
        let max = {
            let limits = self.limits.lock();
            limits
                .per_ip_overrides
                .get(&ip)
                .copied()
                .unwrap_or(limits.per_ip)
        };
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

/// A connection's place in `max.connections` and its listener's `max.connections`, given
/// back on drop (Kafka's `dec`), waking acceptors that wait for one.
#[derive(Debug)]
pub struct BrokerSlot {
    quotas: Arc<ConnectionQuotas>,
    listener: String,
}

impl Drop for BrokerSlot {
    fn drop(&mut self) {
        {
            let mut counts = self.quotas.counts.lock();
            counts.total = counts.total.saturating_sub(1);
            if let Some(n) = counts.listeners.get_mut(&self.listener) {
                *n = n.saturating_sub(1);
            }
        }
        self.quotas.slot_freed.notify_waiters();
    }
}

/// One open connection's share of the quotas, released on drop.
#[derive(Debug)]
pub struct ConnectionSlot {
    quotas: Arc<ConnectionQuotas>,
    ip: IpAddr,
    _broker_slot: BrokerSlot,
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

    /// A slot on listener `l`, which must be free at once.
    async fn slot_now(q: &Arc<ConnectionQuotas>, l: &str) -> BrokerSlot {
        tokio::time::timeout(Duration::from_secs(5), q.wait_for_connection_slot(l))
            .await
            .expect("a free slot")
    }

    /// Whether `listener` has no free slot: the wait is still pending after the other tasks
    /// ran (no timer involved; a paused clock).
    async fn blocked(q: &Arc<ConnectionQuotas>, listener: &str) -> bool {
        let q = q.clone();
        let l = listener.to_string();
        let waiting = tokio::spawn(async move { q.wait_for_connection_slot(&l).await });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let pending = !waiting.is_finished();
        waiting.abort();
        let _ = waiting.await;
        pending
    }

    #[tokio::test]
    async fn per_ip_limit_and_override() {
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let q = ConnectionQuotas::new(100, 1, &HashMap::from([(b, 2)]));
        let a1 = q
            .register(a, slot_now(&q, "L").await)
            .expect("first from a");
        assert_eq!(
            q.register(a, slot_now(&q, "L").await).err(),
            Some(TooManyConnections { ip: a, max: 1 })
        );
        let _b1 = q.register(b, slot_now(&q, "L").await).expect("b1");
        let _b2 = q.register(b, slot_now(&q, "L").await).expect("b2");
        assert!(q.register(b, slot_now(&q, "L").await).is_err());
        drop(a1);
        assert_eq!(q.connections_from(a), 0);
        let _a2 = q
            .register(a, slot_now(&q, "L").await)
            .expect("a again after close");
        // Refused connections gave their broker slots back.
        assert_eq!(q.connections_on("L"), 3);
    }

    #[tokio::test]
    async fn broker_limit_blocks_until_a_connection_closes() {
        let q = ConnectionQuotas::new(1, 10, &HashMap::new());
        let ip: IpAddr = "127.0.0.1".parse().expect("ip");
        let first = q
            .register(ip, slot_now(&q, "PLAINTEXT").await)
            .expect("first");
        let q2 = q.clone();
        let waiting = tokio::spawn(async move { q2.wait_for_connection_slot("PLAINTEXT").await });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished());
        drop(first);
        let slot = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("slot freed")
            .expect("task");
        assert_eq!(q.connections_on("plaintext"), 1);
        drop(slot);
        assert_eq!(q.connections_on("PLAINTEXT"), 0);
    }

    /// `listener.name.<l>.max.connections`: the listener's (n+1)th waits while another
    /// listener still accepts; a close on the listener frees it.
    #[tokio::test]
    async fn listener_limit_blocks_only_its_listener() {
        let q = ConnectionQuotas::with_listeners(
            i32::MAX,
            i32::MAX,
            &HashMap::new(),
            ConnectionRateConfig::default(),
            &HashMap::from([(
                "external".to_string(),
                ListenerConnectionQuota {
                    max_connections: 2,
                    ..Default::default()
                },
            )]),
            None,
        );
        q.add_listener("EXTERNAL");
        q.add_listener("INTERNAL");
        let e1 = slot_now(&q, "EXTERNAL").await;
        let _e2 = slot_now(&q, "EXTERNAL").await;
        assert!(blocked(&q, "EXTERNAL").await);
        let _i: Vec<_> = futures_slots(&q, "INTERNAL", 5).await;
        drop(e1);
        assert!(!blocked(&q, "EXTERNAL").await);
    }

    async fn futures_slots(q: &Arc<ConnectionQuotas>, l: &str, n: usize) -> Vec<BrokerSlot> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(slot_now(q, l).await);
        }
        out
    }

    /// Defect: each listener's acceptor took a slot before `accept()` and held it while idle,
    /// so with `max.connections` 2 and two listeners only one client connection was served.
    #[tokio::test]
    async fn an_idle_acceptor_holds_no_slot() {
        let q = ConnectionQuotas::new(2, i32::MAX, &HashMap::new());
        q.add_listener("A");
        q.add_listener("B");
        tokio::time::timeout(Duration::from_secs(5), q.wait_for_free_slot("A"))
            .await
            .expect("a free slot on A");
        assert_eq!(q.connections_on("A"), 0);
        let _b = futures_slots(&q, "B", 2).await;
        assert!(blocked(&q, "B").await);
        let q2 = q.clone();
        let waiting = tokio::spawn(async move { q2.wait_for_free_slot("A").await });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "A waits while the broker is full");
        waiting.abort();
    }

    /// Kafka's `protectedListener`: the inter-broker listener goes past `max.connections`
    /// (while the server has another listener), the others wait; its own limit still holds.
    #[tokio::test]
    async fn inter_broker_listener_is_exempt_from_the_broker_limit() {
        let q = ConnectionQuotas::with_listeners(
            2,
            i32::MAX,
            &HashMap::new(),
            ConnectionRateConfig::default(),
            &HashMap::from([(
                "REPLICATION".to_string(),
                ListenerConnectionQuota {
                    max_connections: 4,
                    ..Default::default()
                },
            )]),
            Some("replication"),
        );
        q.add_listener("CLIENTS");
        q.add_listener("REPLICATION");
        let _c = futures_slots(&q, "CLIENTS", 2).await;
        assert!(blocked(&q, "CLIENTS").await);
        let r = futures_slots(&q, "REPLICATION", 4).await;
        assert!(blocked(&q, "REPLICATION").await, "its own limit holds");
        drop(r);
        assert!(blocked(&q, "CLIENTS").await, "still 2 client connections");

        // A single listener is not protected.
        let q = ConnectionQuotas::with_listeners(
            1,
            i32::MAX,
            &HashMap::new(),
            ConnectionRateConfig::default(),
            &HashMap::new(),
            Some("REPLICATION"),
        );
        q.add_listener("REPLICATION");
        let _r = slot_now(&q, "REPLICATION").await;
        assert!(blocked(&q, "REPLICATION").await);
    }

    /// KIP-612 per listener: `listener.name.<l>.max.connection.creation.rate` throttles only
    /// its listener; the protected listener is exempt from the broker-wide rate.
    #[test]
    fn listener_creation_rates() {
        let rates = ConnectionRateConfig {
            max_connection_creation_rate: 5,
            ..Default::default()
        };
        let q = ConnectionQuotas::with_listeners(
            i32::MAX,
            i32::MAX,
            &HashMap::new(),
            rates,
            &HashMap::from([(
                "EXTERNAL".to_string(),
                ListenerConnectionQuota {
                    max_connection_creation_rate: 2,
                    ..Default::default()
                },
            )]),
            Some("INTERNAL"),
        );
        q.add_listener("EXTERNAL");
        q.add_listener("INTERNAL");
        q.add_listener("OTHER");
        // 11 windows of 1 s, measured over at least 10 s: 20 connections are within 2/s.
        let external: Vec<i64> = (0..21)
            .map(|_| q.record_connection_and_get_throttle_ms("external"))
            .collect();
        assert!(external[..20].iter().all(|t| *t == 0), "{external:?}");
        assert!(external[20] > 0, "the 21st is above 2/s: {external:?}");
        // The broker-wide rate (5/s) counted those 21: 29 more reach 50.
        let other: Vec<i64> = (0..30)
            .map(|_| q.record_connection_and_get_throttle_ms("OTHER"))
            .collect();
        assert!(other[..29].iter().all(|t| *t == 0), "{other:?}");
        assert!(other[29] > 0, "{other:?}");
        // The inter-broker listener is not held by the broker-wide rate.
        assert!((0..100).all(|_| q.record_connection_and_get_throttle_ms("INTERNAL") == 0));
    }

    /// Dynamic limits: a waiting acceptor goes on once `max.connections` is raised; a
    /// listener limit and the per-IP limit set later hold for new connections.
    #[tokio::test]
    async fn reconfigure_applies_new_limits() {
        let q = ConnectionQuotas::new(1, i32::MAX, &HashMap::new());
        q.add_listener("A");
        let first = slot_now(&q, "A").await;
        let q2 = q.clone();
        let waiting = tokio::spawn(async move { q2.wait_for_connection_slot("A").await });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished());
        q.reconfigure(&ConnectionLimits {
            max_connections: 3,
            ..Default::default()
        });
        let second = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken by the new limit")
            .expect("task");
        assert!(!blocked(&q, "A").await);
        q.reconfigure(&ConnectionLimits {
            max_connections: 3,
            listeners: HashMap::from([(
                "a".to_string(),
                ListenerConnectionQuota {
                    max_connections: 2,
                    ..Default::default()
                },
            )]),
            ..Default::default()
        });
        assert!(blocked(&q, "A").await);
        drop(second);
        let ip: IpAddr = "10.0.0.9".parse().expect("ip");
        q.reconfigure(&ConnectionLimits {
            max_connections_per_ip: 0,
            max_connections_per_ip_overrides: HashMap::from([(ip, 1)]),
            ..Default::default()
        });
        drop(first);
        let other: IpAddr = "10.0.0.8".parse().expect("ip");
        assert!(q.register(other, slot_now(&q, "A").await).is_err());
        let _kept = q.register(ip, slot_now(&q, "A").await).expect("override 1");
        assert!(q.register(ip, slot_now(&q, "A").await).is_err());
    }
}
