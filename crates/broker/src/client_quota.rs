//! Client quotas (KIP-13, KIP-55, KIP-124, KIP-219, KIP-546, KIP-599): Kafka's
//! `ClientQuotaManager` and its default quota callback, one manager per quota type.
//!
//! - **Quotas** come from the metadata image's `ClientQuotaRecord`s
//!   ([`gregor_metadata::image::MetadataImage::client_quotas`]), re-read whenever the image
//!   changes. For a request of principal `User:<u>` and client id `<c>`, the quota of a type is
//!   that of the first of these entities that has one (KIP-55): `user=u,client-id=c`,
//!   `user=u,client-id=<default>`, `user=u`, `user=<default>,client-id=c`,
//!   `user=<default>,client-id=<default>`, `user=<default>`, `client-id=c`,
//!   `client-id=<default>`. All requests that match the same entity share one rate, with
//!   Kafka's metric tags (`DefaultQuotaCallback.quotaMetricTags`): a `user=u` quota is shared by
//!   all of u's client ids, a default quota is per user or per client id.
//! - **Rate** ([`Rate`]): Kafka's `Rate` over a `WindowedSum`, `quota.window.num` samples (11)
//!   of `quota.window.size.seconds` (1 s); the rate divides the samples' sum by the time since
//!   the oldest sample started, but by at least `quota.window.num - 1` windows.
//! - **Throttle time** (Kafka's `QuotaUtils.throttleTime`): after recording, a rate `O` above
//!   the bound `T` throttles for `(O - T) / T * W` ms, `W` the rate's window at that time;
//!   that is the time after which the rate is back at the bound if nothing more is recorded.
//!   The response carries it in `throttle_time_ms` and the connection's reads are muted for it
//!   ([`gregor_network::ConnectionThrottle`], KIP-219).
//! - Nothing is recorded while no quota of the type exists (Kafka's `quotasEnabled`), so
//!   quotas cost nothing until one is set.
//!
//! Units: byte rates in bytes/s; `request_percentage` in percent of one request thread's time
//! (see [`ClientQuotaManagers::request`]); `controller_mutation_rate` in partitions per second.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use gregor_metadata::client_quota_control::{
    CLIENT_ID, CONSUMER_BYTE_RATE, CONTROLLER_MUTATION_RATE, PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE, USER,
};
use gregor_metadata::image::MetadataImage;
use gregor_network::RequestContext;
use parking_lot::{Mutex, RwLock};

/// `quota.window.num` default (Kafka's `QuotaConfig.NUM_QUOTA_SAMPLES_DEFAULT`).
pub const DEFAULT_QUOTA_WINDOW_NUM: i32 = 11;
/// `quota.window.size.seconds` default (Kafka's `QUOTA_WINDOW_SIZE_SECONDS_DEFAULT`).
pub const DEFAULT_QUOTA_WINDOW_SIZE_SECONDS: i32 = 1;

/// Quota sensors unused for this long are dropped (Kafka's
/// `ClientQuotaManager.InactiveSensorExpirationTimeSeconds`, 1 hour), in ms.
pub const INACTIVE_SENSOR_EXPIRATION_MS: i64 = 3_600_000;

/// The measured rate of a quota entity (gauge; labels `quota_type` — Kafka's metric group
/// `Produce`, `Fetch`, `Request`, `ControllerMutation` —, `user`, `client_id`): Kafka's
/// `byte-rate` (Produce, Fetch), `request-time` (Request), `mutation-rate`
/// (ControllerMutation).
pub const QUOTA_RATE: &str = "gregor_quota_rate";
/// Throttle times given to clients, in ms (histogram; same labels): Kafka's `throttle-time`.
pub const QUOTA_THROTTLE_TIME_MS: &str = "gregor_quota_throttle_time_ms";

pub use gregor_network::quotas::Rate;

/// A quota type (Kafka's `QuotaType`), its key and its metric group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaType {
    /// `producer_byte_rate`, recorded per Produce request (its size).
    Produce,
    /// `consumer_byte_rate`, recorded per consumer Fetch response (its size).
    Fetch,
    /// `request_percentage`.
    Request,
    /// `controller_mutation_rate`.
    ControllerMutation,
}

impl QuotaType {
    /// The quota key of the type.
    pub fn key(self) -> &'static str {
        match self {
            Self::Produce => PRODUCER_BYTE_RATE,
            Self::Fetch => CONSUMER_BYTE_RATE,
            Self::Request => REQUEST_PERCENTAGE,
            Self::ControllerMutation => CONTROLLER_MUTATION_RATE,
        }
    }

    /// Kafka's metric group name.
    pub fn metric_group(self) -> &'static str {
        match self {
            Self::Produce => "Produce",
            Self::Fetch => "Fetch",
            Self::Request => "Request",
            Self::ControllerMutation => "ControllerMutation",
        }
    }
}

/// One (user, client-id) quota entity component: absent, the default, or a name.
type Component = Option<Option<String>>;

/// The quotas of one type, by (user, client-id) entity.
#[derive(Debug, Default)]
struct QuotaTable {
    quotas: HashMap<(Component, Component), f64>,
}

impl QuotaTable {
    fn from_image(image: &MetadataImage, key: &str) -> Self {
        let mut quotas = HashMap::new();
        for (entity, values) in &image.client_quotas {
            let Some(v) = values.get(key) else { continue };
            let mut user: Component = None;
            let mut client: Component = None;
            let mut other = false;
            for (t, n) in entity {
                match t.as_str() {
                    USER => user = Some(n.clone()),
                    CLIENT_ID => client = Some(n.clone()),
                    _ => other = true,
                }
            }
            if !other && (user.is_some() || client.is_some()) {
                quotas.insert((user, client), *v);
            }
        }
        Self { quotas }
    }

    fn has(&self, user: Component, client: Component) -> bool {
        self.quotas.contains_key(&(user, client))
    }

    fn get(&self, user: Component, client: Component) -> Option<f64> {
        self.quotas.get(&(user, client)).copied()
    }

    /// Kafka's `DefaultQuotaCallback.quotaMetricTags`: the (user, client-id) tags of the rate
    /// a request of `user` and `client_id` counts against.
    fn metric_tags(&self, user: &str, client_id: &str) -> (String, String) {
        let u = || Some(Some(user.to_string()));
        let c = || Some(Some(client_id.to_string()));
        let both = (user.to_string(), client_id.to_string());
        if self.has(u(), c())
            || self.has(u(), Some(None))
            || (!self.has(u(), None)
                && (self.has(Some(None), c()) || self.has(Some(None), Some(None))))
        {
            return both;
        }
        if self.has(u(), None) || self.has(Some(None), None) {
            return (user.to_string(), String::new());
        }
        (String::new(), client_id.to_string())
    }

    /// Kafka's `DefaultQuotaCallback.quotaLimit` for metric tags.
    fn limit(&self, user: &str, client_id: &str) -> Option<f64> {
        let u = || Some(Some(user.to_string()));
        let c = || Some(Some(client_id.to_string()));
        if !user.is_empty() && !client_id.is_empty() {
            self.get(u(), c())
                .or_else(|| self.get(u(), Some(None)))
                .or_else(|| self.get(Some(None), c()))
                .or_else(|| self.get(Some(None), Some(None)))
        } else if !user.is_empty() {
            self.get(u(), None).or_else(|| self.get(Some(None), None))
        } else if !client_id.is_empty() {
            self.get(None, c()).or_else(|| self.get(None, Some(None)))
        } else {
            None
        }
    }
}

struct Sensor {
    rate: Rate,
    last_record_ms: i64,
}

/// Kafka's `ClientQuotaManager` for one quota type. Thread-safe.
pub struct ClientQuotaManager {
    quota_type: QuotaType,
    samples: usize,
    window_ms: i64,
    /// The image the table was built from (held so that a pointer comparison is sound).
    table: RwLock<(Option<Arc<MetadataImage>>, Arc<QuotaTable>)>,
    sensors: Mutex<HashMap<(String, String), Sensor>>,
    last_expiry_ms: Mutex<i64>,
    epoch: Instant,
}

impl std::fmt::Debug for ClientQuotaManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientQuotaManager")
            .field("quota_type", &self.quota_type)
            .finish_non_exhaustive()
    }
}

impl ClientQuotaManager {
    /// A manager of `quota_type` with `window_num` samples of `window_size_seconds`.
    pub fn new(quota_type: QuotaType, window_num: i32, window_size_seconds: i32) -> Self {
        Self {
            quota_type,
            samples: usize::try_from(window_num.max(1)).unwrap_or(1),
            window_ms: i64::from(window_size_seconds.max(1)) * 1000,
            table: RwLock::new((None, Arc::new(QuotaTable::default()))),
            sensors: Mutex::new(HashMap::new()),
            last_expiry_ms: Mutex::new(0),
            epoch: Instant::now(),
        }
    }

    /// Milliseconds on this manager's monotonic clock.
    pub fn now_ms(&self) -> i64 {
        i64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    fn table(&self, image: &Arc<MetadataImage>) -> Arc<QuotaTable> {
        {
            let t = self.table.read();
            if t.0.as_ref().is_some_and(|i| Arc::ptr_eq(i, image)) {
                return t.1.clone();
            }
        }
        let table = Arc::new(QuotaTable::from_image(image, self.quota_type.key()));
        *self.table.write() = (Some(image.clone()), table.clone());
        table
    }

    /// The quota (per second) that applies to `user` and `client_id`, None when none does.
    pub fn quota(&self, image: &Arc<MetadataImage>, user: &str, client_id: &str) -> Option<f64> {
        let table = self.table(image);
        let (u, c) = table.metric_tags(user, client_id);
        table.limit(&u, &c)
    }

    /// The metric tags (the entity whose rate is shared) and the quota for `user` /
    /// `client_id`; None when no quota of this type exists at all (nothing is recorded then).
    pub fn tags_and_quota(
        &self,
        image: &Arc<MetadataImage>,
        user: &str,
        client_id: &str,
    ) -> Option<((String, String), Option<f64>)> {
        let table = self.table(image);
        if table.quotas.is_empty() {
            return None;
        }
        let (u, c) = table.metric_tags(user, client_id);
        let limit = table.limit(&u, &c);
        Some(((u, c), limit))
    }

    /// Records `value` for `user` / `client_id` at `now_ms` and returns the throttle time in ms
    /// (0 when within the quota). Kafka's `maybeRecordAndGetThrottleTimeMs`: nothing is
    /// recorded while no quota of this type exists.
    pub fn record_and_get_throttle_time_ms(
        &self,
        image: &Arc<MetadataImage>,
        user: &str,
        client_id: &str,
        value: f64,
        now_ms: i64,
    ) -> i64 {
        let table = self.table(image);
        if table.quotas.is_empty() {
            return 0;
        }
        let (u, c) = table.metric_tags(user, client_id);
        let bound = table.limit(&u, &c);
        let mut sensors = self.sensors.lock();
        self.expire_sensors(&mut sensors, now_ms);
        let sensor = sensors
            .entry((u.clone(), c.clone()))
            .or_insert_with(|| Sensor {
                rate: Rate::new(self.samples, self.window_ms),
                last_record_ms: now_ms,
            });
        sensor.rate.record(value, now_ms);
        sensor.last_record_ms = now_ms;
        let throttle = bound.map_or(0, |b| sensor.rate.throttle_time_ms(b, now_ms));
        let measured = sensor.rate.measure(now_ms);
        drop(sensors);
        metrics::gauge!(QUOTA_RATE, "quota_type" => self.quota_type.metric_group(), "user" => u, "client_id" => c)
            .set(measured);
        throttle
    }

    /// Takes back `value` recorded at `now_ms` (Kafka's `unrecordQuotaSensor`: a throttled
    /// fetch returns no data, so its bytes do not count).
    pub fn unrecord(
        &self,
        image: &Arc<MetadataImage>,
        user: &str,
        client_id: &str,
        value: f64,
        now_ms: i64,
    ) {
        let table = self.table(image);
        if table.quotas.is_empty() {
            return;
        }
        let key = table.metric_tags(user, client_id);
        if let Some(sensor) = self.sensors.lock().get_mut(&key) {
            sensor.rate.record(-value, now_ms);
        }
    }

    /// Kafka's `getMaxValueInQuotaWindow`: the most that can be recorded at once without a
    /// certain throttle, `quota * (window_num - 1) * window_size_seconds`; unbounded
    /// (`f64::MAX`) without a quota. A consumer's fetch asks for no more bytes than this.
    pub fn max_value_in_quota_window(
        &self,
        image: &Arc<MetadataImage>,
        user: &str,
        client_id: &str,
    ) -> f64 {
        match self.quota(image, user, client_id) {
            Some(q) => q * (self.samples as f64 - 1.0) * (self.window_ms / 1000) as f64,
            None => f64::MAX,
        }
    }

    /// Records a throttle time given to `user` / `client_id` (Kafka's `throttle-time`).
    pub fn record_throttle_time(
        &self,
        image: &Arc<MetadataImage>,
        user: &str,
        client_id: &str,
        throttle_time_ms: i64,
    ) {
        if throttle_time_ms <= 0 {
            return;
        }
        let (u, c) = self.table(image).metric_tags(user, client_id);
        metrics::histogram!(QUOTA_THROTTLE_TIME_MS, "quota_type" => self.quota_type.metric_group(), "user" => u, "client_id" => c)
            .record(throttle_time_ms as f64);
    }

    /// Drops sensors not recorded for [`INACTIVE_SENSOR_EXPIRATION_MS`] (checked once a
    /// minute).
    fn expire_sensors(&self, sensors: &mut HashMap<(String, String), Sensor>, now_ms: i64) {
        let mut last = self.last_expiry_ms.lock();
        if now_ms - *last < 60_000 {
            return;
        }
        *last = now_ms;
        sensors.retain(|_, s| now_ms - s.last_record_ms < INACTIVE_SENSOR_EXPIRATION_MS);
    }

    /// Number of live sensors (tests, metrics).
    pub fn sensor_count(&self) -> usize {
        self.sensors.lock().len()
    }
}

/// Kafka's `TokenBucket` (KIP-599): `tokens` refill at the quota per second up to a burst
/// of `window_num * window_size_seconds * quota`; a mutation takes as many tokens as
/// partitions. Starts full.
#[derive(Debug, Clone)]
struct TokenBucket {
    tokens: f64,
    last_update_ms: i64,
}

impl TokenBucket {
    fn refill(&mut self, quota: f64, burst: f64, now_ms: i64) {
        let elapsed_s = (now_ms - self.last_update_ms).max(0) as f64 / 1000.0;
        self.tokens = burst.min(self.tokens + quota * elapsed_s);
        self.last_update_ms = now_ms;
    }
}

/// The controller mutation quota of one request (Kafka's `StrictControllerMutationQuota` and
/// `PermissiveControllerMutationQuota`): strict from CreateTopics v6, DeleteTopics v5 and
/// CreatePartitions v3 (KIP-599) — a mutation while the bucket is below zero is refused with
/// THROTTLING_QUOTA_EXCEEDED, one that finds it at or above zero is taken whole, even into
/// debt —, permissive before them (always taken, the debt throttles).
pub struct ControllerMutationQuota {
    manager: Arc<ControllerMutationQuotaManager>,
    key: (String, String),
    quota: f64,
    strict: bool,
    /// (throttle time in ms, when it was computed on the manager's clock).
    last_throttle: Mutex<(i64, i64)>,
}

impl ControllerMutationQuota {
    /// Takes `partitions` tokens (see the type).
    ///
    /// # Errors
    /// THROTTLING_QUOTA_EXCEEDED (strict only) when the bucket is below zero.
    pub fn record(
        &self,
        partitions: u32,
    ) -> Result<(), gregor_metadata::controller::ControllerError> {
        let now = self.manager.now_ms();
        let burst = self.manager.samples as f64 * self.manager.window_s * self.quota;
        let mut buckets = self.manager.buckets.lock();
        let bucket = buckets.entry(self.key.clone()).or_insert(TokenBucket {
            tokens: burst,
            last_update_ms: now,
        });
        bucket.refill(self.quota, burst, now);
        let throttle_of = |tokens: f64| (-tokens / self.quota * 1000.0).round() as i64;
        if self.strict {
            if bucket.tokens < 0.0 {
                let t = throttle_of(bucket.tokens);
                *self.last_throttle.lock() = (t, now);
                return Err(gregor_metadata::controller::ControllerError::Remote(
                    gregor_protocol::error::ErrorCode::ThrottlingQuotaExceeded,
                    "The throttling quota has been exceeded.".into(),
                ));
            }
            bucket.tokens = burst.min(bucket.tokens - f64::from(partitions));
        } else {
            bucket.tokens = burst.min(bucket.tokens - f64::from(partitions));
            if bucket.tokens < 0.0 {
                *self.last_throttle.lock() = (throttle_of(bucket.tokens), now);
            }
        }
        Ok(())
    }

    /// The throttle time to answer with (ms): the last one computed, less the time since
    /// (Kafka's `AbstractControllerMutationQuota.throttleTime`).
    pub fn throttle_time_ms(&self) -> i64 {
        let (t, at) = *self.last_throttle.lock();
        (t - (self.manager.now_ms() - at)).max(0)
    }
}

/// Kafka's `ControllerMutationQuotaManager`: a token bucket per quota entity, with the
/// limits and shared entities of [`ClientQuotaManager`] (`controller_mutation_rate`).
pub struct ControllerMutationQuotaManager {
    limits: ClientQuotaManager,
    samples: usize,
    window_s: f64,
    buckets: Mutex<HashMap<(String, String), TokenBucket>>,
}

impl std::fmt::Debug for ControllerMutationQuotaManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerMutationQuotaManager")
            .finish_non_exhaustive()
    }
}

impl ControllerMutationQuotaManager {
    /// A manager with `controller.quota.window.num` / `controller.quota.window.size.seconds`.
    pub fn new(window_num: i32, window_size_seconds: i32) -> Self {
        Self {
            limits: ClientQuotaManager::new(
                QuotaType::ControllerMutation,
                window_num,
                window_size_seconds,
            ),
            samples: usize::try_from(window_num.max(1)).unwrap_or(1),
            window_s: f64::from(window_size_seconds.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn now_ms(&self) -> i64 {
        self.limits.now_ms()
    }

    /// The quota of a request of `ctx` at `version` (strict from `strict_since_version`), or
    /// None when no `controller_mutation_rate` applies to it.
    pub fn quota_for(
        self: &Arc<Self>,
        image: &Arc<MetadataImage>,
        ctx: &RequestContext,
        strict_since_version: i16,
    ) -> Option<Arc<ControllerMutationQuota>> {
        let (key, limit) =
            self.limits
                .tags_and_quota(image, &ctx.principal.name, ctx.client_id())?;
        let quota = limit.filter(|q| *q > 0.0)?;
        Some(Arc::new(ControllerMutationQuota {
            manager: self.clone(),
            key,
            quota,
            strict: ctx.api_version() >= strict_since_version,
            last_throttle: Mutex::new((0, 0)),
        }))
    }
}

/// The per-IP `connection_creation_rate` quotas (KIP-612) from the broker's metadata image:
/// the quota of `ip=<address>`, else of `ip=<default>` (an entity name is compared as an
/// address, so `::1` and `0:0::1` are one). None once the broker is gone.
pub fn ip_connection_rates(
    broker: std::sync::Weak<crate::broker::Broker>,
) -> gregor_network::quotas::IpConnectionRates {
    use gregor_metadata::client_quota_control::{CONNECTION_CREATION_RATE, IP};
    gregor_network::quotas::IpConnectionRates(Arc::new(move |addr: std::net::IpAddr| {
        let broker = broker.upgrade()?;
        let image = broker.controller.image();
        let mut default = None;
        for (entity, values) in &image.client_quotas {
            let [(t, name)] = entity.as_slice() else {
                continue;
            };
            if t != IP {
                continue;
            }
            let Some(v) = values.get(CONNECTION_CREATION_RATE) else {
                continue;
            };
            match name {
                None => default = Some(*v),
                Some(n) if n.parse::<std::net::IpAddr>().is_ok_and(|a| a == addr) => {
                    return Some(*v)
                }
                Some(_) => {}
            }
        }
        default
    }))
}

/// The broker's client quota managers (Kafka's `QuotaManagers`).
#[derive(Debug)]
pub struct ClientQuotaManagers {
    /// `producer_byte_rate`: bytes of Produce requests (the whole request as read, header
    /// included, Kafka's `request.sizeInBytes`), acks=0 included.
    pub produce: ClientQuotaManager,
    /// `consumer_byte_rate`: bytes of consumers' Fetch responses (the record sets' bytes plus
    /// the response's other fields; replica fetches are not recorded).
    pub fetch: ClientQuotaManager,
    /// `request_percentage` (KIP-124): gregor records, per request, the wall time of its
    /// immediate part (decoding done, from the handler's start until it has a response or
    /// hands the rest to a deferred task; this includes the time the request's log I/O jobs
    /// take on the I/O pool), as a percentage of one second (Kafka records the request
    /// handler and network thread time). A quota of 100 is one thread's worth.
    pub request: ClientQuotaManager,
    /// `controller_mutation_rate` (KIP-599): partitions created or deleted by CreateTopics,
    /// CreatePartitions and DeleteTopics, on the active controller; its window is
    /// `controller.quota.window.*`.
    pub controller_mutation: Arc<ControllerMutationQuotaManager>,
}

impl ClientQuotaManagers {
    /// The managers with `quota.window.num` / `quota.window.size.seconds` and
    /// `controller.quota.window.num` / `controller.quota.window.size.seconds`.
    pub fn new(
        window_num: i32,
        window_size_seconds: i32,
        controller_window_num: i32,
        controller_window_size_seconds: i32,
    ) -> Self {
        Self {
            produce: ClientQuotaManager::new(QuotaType::Produce, window_num, window_size_seconds),
            fetch: ClientQuotaManager::new(QuotaType::Fetch, window_num, window_size_seconds),
            request: ClientQuotaManager::new(QuotaType::Request, window_num, window_size_seconds),
            controller_mutation: Arc::new(ControllerMutationQuotaManager::new(
                controller_window_num,
                controller_window_size_seconds,
            )),
        }
    }
}

impl ClientQuotaManagers {
    /// Records a Produce request (Kafka's `handleProduceRequest` response callback): its
    /// size against `producer_byte_rate` and, unless acks=0, `started`'s elapsed time against
    /// `request_percentage`. Returns the larger throttle time (ms), records it as the
    /// throttle-time metric of the quota that gave it, and mutes `ctx`'s connection for it.
    pub fn throttle_produce(
        &self,
        image: &Arc<MetadataImage>,
        ctx: &RequestContext,
        acks: i16,
        started: Instant,
    ) -> i64 {
        let (user, client_id) = (ctx.principal.name.as_str(), ctx.client_id());
        let now = self.produce.now_ms();
        let bandwidth = self.produce.record_and_get_throttle_time_ms(
            image,
            user,
            client_id,
            ctx.size_in_bytes as f64,
            now,
        );
        let request = if acks == 0 {
            0
        } else {
            self.record_request_time(image, ctx, started)
        };
        self.apply(image, ctx, &self.produce, bandwidth, request)
    }

    /// Records a consumer's Fetch response of `response_size` bytes (Kafka's
    /// `handleFetchRequest`): against `consumer_byte_rate` and `request_percentage`. A
    /// throttled fetch's bytes are taken back (its response carries no records, the caller
    /// sends [`crate::handlers::fetch`]'s throttled answer). Returns the throttle time (ms) and
    /// mutes the connection for it.
    pub fn throttle_fetch(
        &self,
        image: &Arc<MetadataImage>,
        ctx: &RequestContext,
        response_size: usize,
        started: Instant,
    ) -> i64 {
        let (user, client_id) = (ctx.principal.name.as_str(), ctx.client_id());
        let now = self.fetch.now_ms();
        let request = self.record_request_time(image, ctx, started);
        let bandwidth = self.fetch.record_and_get_throttle_time_ms(
            image,
            user,
            client_id,
            response_size as f64,
            now,
        );
        let throttle = self.apply(image, ctx, &self.fetch, bandwidth, request);
        if throttle > 0 {
            self.fetch
                .unrecord(image, user, client_id, response_size as f64, now);
        }
        throttle
    }

    /// Records `started`'s elapsed time as a percentage of one second against
    /// `request_percentage` (Kafka's `ClientRequestQuotaManager.nanosToPercentage`); the
    /// throttle time (ms), at most one quota window (`quota.window.size.seconds`, Kafka's
    /// `ClientRequestQuotaManager.throttleTime` through `QuotaUtils.boundedThrottleTime`).
    pub fn record_request_time(
        &self,
        image: &Arc<MetadataImage>,
        ctx: &RequestContext,
        started: Instant,
    ) -> i64 {
        self.record_request_duration(image, ctx, started.elapsed())
    }

    /// [`ClientQuotaManagers::record_request_time`] of a time already measured.
    fn record_request_duration(
        &self,
        image: &Arc<MetadataImage>,
        ctx: &RequestContext,
        took: std::time::Duration,
    ) -> i64 {
        let percent = took.as_nanos() as f64 * 100.0 / 1e9;
        self.request
            .record_and_get_throttle_time_ms(
                image,
                ctx.principal.name.as_str(),
                ctx.client_id(),
                percent,
                self.request.now_ms(),
            )
            .min(self.request.window_ms)
    }

    /// Records a request other than Produce and Fetch against `request_percentage` (Kafka's
    /// `RequestHandlerHelper.sendResponseMaybeThrottle`): `started`'s elapsed time; returns
    /// the throttle time (ms, at most one quota window), records it as the throttle-time
    /// metric and mutes `ctx`'s connection for it. 0 while no `request_percentage` quota
    /// exists.
    pub fn throttle_request(
        &self,
        image: &Arc<MetadataImage>,
        ctx: &RequestContext,
        started: Instant,
    ) -> i64 {
        let request = self.record_request_time(image, ctx, started);
        self.apply(image, ctx, &self.request, 0, request)
    }

    /// [`ClientQuotaManagers::throttle_request`] of a request whose handler time `took` was
    /// measured earlier (a response completed later, Kafka's `sendMaybeThrottle` in a
    /// coordinator's callback).
    pub fn throttle_request_time(
        &self,
        image: &Arc<MetadataImage>,
        ctx: &RequestContext,
        took: std::time::Duration,
    ) -> i64 {
        let request = self.record_request_duration(image, ctx, took);
        self.apply(image, ctx, &self.request, 0, request)
    }

    /// The larger of a type's throttle and the request quota's, recorded as the throttle-time
    /// metric of the quota that gave it (Kafka's `RequestHandlerHelper.throttle`), with the
    /// connection muted for it.
    fn apply(
        &self,
        image: &Arc<MetadataImage>,
        ctx: &RequestContext,
        manager: &ClientQuotaManager,
        own: i64,
        request: i64,
    ) -> i64 {
        let throttle = own.max(request).min(i64::from(i32::MAX));
        if throttle <= 0 {
            return 0;
        }
        let by = if own > request {
            manager
        } else {
            &self.request
        };
        by.record_throttle_time(
            image,
            ctx.principal.name.as_str(),
            ctx.client_id(),
            throttle,
        );
        ctx.throttle.throttle(throttle);
        throttle
    }
}

impl Default for ClientQuotaManagers {
    fn default() -> Self {
        Self::new(
            DEFAULT_QUOTA_WINDOW_NUM,
            DEFAULT_QUOTA_WINDOW_SIZE_SECONDS,
            DEFAULT_QUOTA_WINDOW_NUM,
            DEFAULT_QUOTA_WINDOW_SIZE_SECONDS,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// (entity components, quota key, value).
    type Quota<'a> = (&'a [(&'a str, Option<&'a str>)], &'a str, f64);

    fn image(quotas: &[Quota<'_>]) -> Arc<MetadataImage> {
        let mut image = MetadataImage::default();
        for (entity, key, value) in quotas {
            let mut e: Vec<(String, Option<String>)> = entity
                .iter()
                .map(|(t, n)| (t.to_string(), n.map(str::to_string)))
                .collect();
            e.sort();
            image
                .client_quotas
                .entry(e)
                .or_insert_with(BTreeMap::new)
                .insert(key.to_string(), *value);
        }
        Arc::new(image)
    }

    #[test]
    fn rate_measures_over_at_least_window_num_minus_one_windows() {
        let mut r = Rate::new(11, 1000);
        r.record(1000.0, 0);
        // 1000 bytes over the minimum 10 windows.
        assert!((r.measure(0) - 100.0).abs() < 1e-9);
        // 10 MB in the first second: 1 MB/s over 10 s.
        let mut r = Rate::new(11, 1000);
        r.record(10_000_000.0, 0);
        assert!((r.measure(0) - 1_000_000.0).abs() < 1e-6);
        // A bound of 500 KB/s: (1 MB - 500 KB) / 500 KB * 10 s = 10 s.
        assert_eq!(r.throttle_time_ms(500_000.0, 0), 10_000);
        // Half a second on, the window is 10.5 s (the minimum is added to the elapsed time).
        assert_eq!(r.window_size_ms(500), 10_500);
        // Within the quota: no throttle.
        assert_eq!(r.throttle_time_ms(2_000_000.0, 500), 0);
        // Samples older than window_num windows are forgotten.
        assert_eq!(r.measure(11_000), 0.0);
    }

    #[test]
    fn a_steady_rate_at_the_bound_is_not_throttled_and_twice_it_is() {
        let mut r = Rate::new(11, 1000);
        let mut most = 0;
        for t in 0..30_000 {
            // 1000 bytes every ms: 1 MB/s.
            r.record(1000.0, t);
            most = most.max(r.throttle_time_ms(1_000_000.0, t));
        }
        // The current millisecond's bytes count before its time has passed (as in Kafka):
        // at most a millisecond's worth of throttle.
        assert!(most <= 1, "{most}");
        for t in 30_000..31_000 {
            r.record(2000.0, t);
        }
        assert!(r.throttle_time_ms(1_000_000.0, 31_000) > 0);
    }

    #[test]
    fn precedence_is_kip_55s_eight_levels() {
        let all: Vec<Quota<'_>> = vec![
            (
                &[(USER, Some("u")), (CLIENT_ID, Some("c"))],
                PRODUCER_BYTE_RATE,
                1.0,
            ),
            (
                &[(USER, Some("u")), (CLIENT_ID, None)],
                PRODUCER_BYTE_RATE,
                2.0,
            ),
            (&[(USER, Some("u"))], PRODUCER_BYTE_RATE, 3.0),
            (
                &[(USER, None), (CLIENT_ID, Some("c"))],
                PRODUCER_BYTE_RATE,
                4.0,
            ),
            (&[(USER, None), (CLIENT_ID, None)], PRODUCER_BYTE_RATE, 5.0),
            (&[(USER, None)], PRODUCER_BYTE_RATE, 6.0),
            (&[(CLIENT_ID, Some("c"))], PRODUCER_BYTE_RATE, 7.0),
            (&[(CLIENT_ID, None)], PRODUCER_BYTE_RATE, 8.0),
        ];
        let m = ClientQuotaManager::new(QuotaType::Produce, 11, 1);
        // Remove the most specific level one at a time: the next one applies.
        for level in 0..all.len() {
            let img = image(&all[level..]);
            assert_eq!(
                m.quota(&img, "u", "c"),
                Some(level as f64 + 1.0),
                "level {level}"
            );
        }
        // Another user and client id only match the defaults.
        let img = image(&all);
        assert_eq!(m.quota(&img, "v", "d"), Some(5.0));
        // Only client-id quotas: a user's requests match by client id.
        let img = image(&all[6..]);
        assert_eq!(m.quota(&img, "v", "d"), Some(8.0));
        // A quota of another type does not apply.
        let img = image(&[(&[(CLIENT_ID, Some("c"))], CONSUMER_BYTE_RATE, 9.0)]);
        assert_eq!(m.quota(&img, "u", "c"), None);
    }

    #[test]
    fn entities_share_one_rate_as_kafkas_metric_tags() {
        let m = ClientQuotaManager::new(QuotaType::Produce, 11, 1);
        // A user quota: every client id of the user shares it.
        let img = image(&[(&[(USER, Some("u"))], PRODUCER_BYTE_RATE, 100.0)]);
        assert_eq!(
            m.record_and_get_throttle_time_ms(&img, "u", "a", 500.0, 0),
            0
        );
        // 1500 bytes over 10 s = 150/s > 100: (150-100)/100 * 10 s.
        assert_eq!(
            m.record_and_get_throttle_time_ms(&img, "u", "b", 1000.0, 0),
            5000
        );
        assert_eq!(m.sensor_count(), 1);
        // A default client-id quota: each client id has its own rate.
        let m = ClientQuotaManager::new(QuotaType::Produce, 11, 1);
        let img = image(&[(&[(CLIENT_ID, None)], PRODUCER_BYTE_RATE, 100.0)]);
        assert_eq!(
            m.record_and_get_throttle_time_ms(&img, "u", "a", 1000.0, 0),
            0
        );
        assert_eq!(
            m.record_and_get_throttle_time_ms(&img, "u", "b", 1000.0, 0),
            0
        );
        assert_eq!(m.sensor_count(), 2);
        // Unrecording takes the bytes back.
        assert!(m.record_and_get_throttle_time_ms(&img, "u", "a", 1000.0, 0) > 0);
        m.unrecord(&img, "u", "a", 1000.0, 0);
        assert_eq!(m.record_and_get_throttle_time_ms(&img, "u", "a", 0.0, 0), 0);
    }

    #[test]
    fn controller_mutations_take_tokens_strictly_or_permissively() {
        let m = Arc::new(ControllerMutationQuotaManager::new(11, 1));
        let img = image(&[(&[(CLIENT_ID, Some("c"))], CONTROLLER_MUTATION_RATE, 1.0)]);
        let ctx = |v: i16| {
            let mut c = RequestContext::local(
                gregor_protocol::kafka_protocol::messages::ApiKey::CreateTopics,
                v,
            );
            c.header.client_id =
                Some(gregor_protocol::kafka_protocol::protocol::StrBytes::from_static_str("c"));
            c
        };
        // No quota for another client id.
        let mut other = ctx(6);
        other.header.client_id = None;
        assert!(m.quota_for(&img, &other, 6).is_none());
        // Strict: a burst of 11 tokens; 20 partitions are taken whole (into debt), then refused.
        let q = m.quota_for(&img, &ctx(6), 6).expect("quota");
        assert!(q.record(20).is_ok());
        assert_eq!(q.throttle_time_ms(), 0);
        let e = q.record(1).expect_err("exhausted");
        assert_eq!(
            e.error_code(),
            gregor_protocol::error::ErrorCode::ThrottlingQuotaExceeded
        );
        // 9 tokens of debt at 1 per second: about 9 s.
        assert!(
            (8_900..=9_000).contains(&q.throttle_time_ms()),
            "{}",
            q.throttle_time_ms()
        );
        // Permissive (an older version): taken, and throttled.
        let p = m.quota_for(&img, &ctx(5), 6).expect("quota");
        assert!(p.record(1).is_ok());
        assert!(p.throttle_time_ms() >= 9_000);
    }

    #[test]
    fn nothing_is_recorded_without_quotas() {
        let m = ClientQuotaManager::new(QuotaType::Fetch, 11, 1);
        let img = image(&[]);
        assert_eq!(
            m.record_and_get_throttle_time_ms(&img, "u", "c", 1e12, 0),
            0
        );
        assert_eq!(m.sensor_count(), 0);
        assert_eq!(m.max_value_in_quota_window(&img, "u", "c"), f64::MAX);
        let img = image(&[(&[(CLIENT_ID, Some("c"))], CONSUMER_BYTE_RATE, 1000.0)]);
        assert_eq!(m.max_value_in_quota_window(&img, "u", "c"), 10_000.0);
    }
}
