//! One replica fetcher task (Kafka's `ReplicaFetcherThread` / `AbstractFetcherThread.doWork`):
//! build a fetch of the ready partitions, send it, apply the response on the I/O pool, repeat.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gregor_log::TopicPartition;
use gregor_protocol::kafka_protocol::messages::fetch_request::{
    FetchPartition, FetchTopic, ReplicaState,
};
use gregor_protocol::kafka_protocol::messages::list_offsets_request::{
    ListOffsetsPartition, ListOffsetsTopic,
};
use gregor_protocol::kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, RequestKind, ResponseKind,
    TopicName,
};
use gregor_protocol::kafka_protocol::protocol::StrBytes;
use tokio::sync::watch;
use uuid::Uuid;

use super::connection::{BrokerConnection, ConnectionError};
use super::{
    FetcherContext, FetcherShared, FollowedPartition, FETCH_VERSION, LIST_OFFSETS_VERSION,
};
use crate::error_codes as ec;
use crate::replication::follower::{
    on_fetch_response, resolve_out_of_range, truncation_for_diverging_epoch, EpochEndOffset,
    FetchDecision, FetchStatus, FetchedPartition, OutOfRange,
};

/// What a fetch asked for one partition: (fetch offset, current leader epoch).
type Sent = BTreeMap<TopicPartition, (i64, i32)>;

/// A partition that answered OFFSET_OUT_OF_RANGE: (partition, fetch offset, leader epoch).
type OutOfRangeEntry = (TopicPartition, i64, i32);

/// Longest idle wait when no partition is ready and none is delayed (ms); an added partition
/// wakes the task at once.
const IDLE_WAIT_MS: i64 = 60_000;

pub(crate) async fn run(
    ctx: Arc<FetcherContext>,
    shared: Arc<FetcherShared>,
    source: i32,
    fetcher_id: usize,
    address: String,
    mut stop: watch::Receiver<bool>,
) {
    let client_id = format!("broker-{}-fetcher-{fetcher_id}", ctx.config.node_id);
    let timeout = Duration::from_millis(ctx.config.socket_timeout_ms.max(1) as u64);
    let mut conn: Option<BrokerConnection> = None;
    // KIP-227: one fetch session with the leader, as Kafka's FetchSessionHandler.
    let mut session = super::session::FollowerSession::default();
    loop {
        if *stop.borrow() {
            return;
        }
        let now = ctx.clock.now_ms();
        let (request, sent, next_due) = build_fetch(&ctx, &shared, now);
        if sent.is_empty() {
            let wait_ms = next_due.map_or(IDLE_WAIT_MS, |due| (due - now).clamp(1, IDLE_WAIT_MS));
            tokio::select! {
                _ = shared.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(wait_ms as u64)) => {}
                _ = stop.changed() => return,
            }
            continue;
        }
        if conn.is_none() {
            let connected = tokio::select! {
                c = BrokerConnection::connect(&ctx.config.security, &address, client_id.clone(), timeout, ctx.config.max_response_bytes) => c,
                _ = stop.changed() => return,
            };
            match connected {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::debug!(source, %address, error = %e, "replica fetcher cannot connect; backing off");
                    delay_all(&ctx, &shared, &sent);
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let request = session.prepare(request);
        let response = tokio::select! {
            r = c.request(ApiKey::Fetch, FETCH_VERSION, RequestKind::Fetch(request)) => r,
            _ = stop.changed() => return,
        };
        let response = match response {
            Ok(ResponseKind::Fetch(r)) => r,
            Ok(_) => {
                tracing::warn!(source, "unexpected response kind to Fetch; reconnecting");
                conn = None;
                session.on_connection_error();
                delay_all(&ctx, &shared, &sent);
                continue;
            }
            Err(e) => {
                log_connection_error(source, &e);
                conn = None;
                session.on_connection_error();
                delay_all(&ctx, &shared, &sent);
                continue;
            }
        };
        if !session.on_response(&response) {
            tracing::warn!(
                source,
                error_code = response.error_code,
                "fetch failed as a whole; backing off"
            );
            delay_all(&ctx, &shared, &sent);
            continue;
        }
        let job = {
            let (ctx, shared) = (ctx.clone(), shared.clone());
            move || apply_fetch_response(&ctx, &shared, &sent, response)
        };
        let out_of_range = match ctx.io.run(job).await {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(source, error = %e, "applying a fetch response failed");
                continue;
            }
        };
        for (tp, fetch_offset, leader_epoch) in out_of_range {
            let Some(c) = conn.as_mut() else { break };
            let offsets = tokio::select! {
                o = leader_offsets(c, ctx.config.node_id, &tp, leader_epoch) => o,
                _ = stop.changed() => return,
            };
            match offsets {
                Ok(result) => {
                    let job = {
                        let (ctx, shared) = (ctx.clone(), shared.clone());
                        move || {
                            apply_out_of_range(
                                &ctx,
                                &shared,
                                &tp,
                                fetch_offset,
                                leader_epoch,
                                result,
                            )
                        }
                    };
                    if let Err(e) = ctx.io.run(job).await {
                        tracing::error!(source, error = %e, "out-of-range recovery failed");
                    }
                }
                Err(e) => {
                    log_connection_error(source, &e);
                    conn = None;
                    session.on_connection_error();
                    let sent = BTreeMap::from([(tp, (fetch_offset, leader_epoch))]);
                    delay_all(&ctx, &shared, &sent);
                }
            }
        }
    }
}

fn log_connection_error(source: i32, e: &ConnectionError) {
    tracing::info!(source, error = %e, "replica fetch failed; reconnecting after backoff");
}

/// The full fetch of every ready partition (the session turns it into its next fetch), what it
/// asks per partition, and when the next delayed partition becomes ready (ms).
pub(super) fn build_fetch(
    ctx: &FetcherContext,
    shared: &FetcherShared,
    now_ms: i64,
) -> (FetchRequest, Sent, Option<i64>) {
    let cfg = &ctx.config;
    let mut sent = Sent::new();
    let mut topics: BTreeMap<Uuid, Vec<FetchPartition>> = BTreeMap::new();
    let mut next_due: Option<i64> = None;
    let follower_quota = &ctx.quotas.follower;
    for (tp, f) in shared.partitions.lock().iter_mut() {
        if !f.state.is_ready(now_ms) {
            if let FetchStatus::Delayed { until_ms } = f.state.status {
                next_due = Some(next_due.map_or(until_ms, |d| d.min(until_ms)));
            }
            continue;
        }
        // Kafka's shouldFollowerThrottle: an out-of-sync replica of a throttled partition is
        // left out while the follower quota is exceeded (with nothing else to fetch, the
        // fetcher looks again after replica.fetch.backoff.ms, as Kafka's does).
        if follower_quota.should_throttle(f.is_replica_in_sync(), &tp.topic, tp.partition) {
            let due = now_ms.saturating_add(cfg.backoff_ms.max(1));
            next_due = Some(next_due.map_or(due, |d| d.min(due)));
            continue;
        }
        sent.insert(
            tp.clone(),
            (f.state.fetch_offset, f.state.current_leader_epoch),
        );
        topics.entry(f.topic_id).or_default().push(
            FetchPartition::default()
                .with_partition(tp.partition)
                .with_current_leader_epoch(f.state.current_leader_epoch)
                .with_fetch_offset(f.state.fetch_offset)
                .with_last_fetched_epoch(f.state.last_fetched_epoch.unwrap_or(-1))
                .with_log_start_offset(f.partition.log.log_start_offset())
                .with_partition_max_bytes(cfg.partition_max_bytes),
        );
    }
    let request = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_replica_state(
            ReplicaState::default()
                .with_replica_id(BrokerId(cfg.node_id))
                .with_replica_epoch(ctx.broker_epoch.load(Ordering::Relaxed)),
        )
        .with_max_wait_ms(cfg.max_wait_ms)
        .with_min_bytes(cfg.min_bytes)
        .with_max_bytes(cfg.max_bytes)
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(0)
        .with_topics(
            topics
                .into_iter()
                .map(|(id, partitions)| {
                    FetchTopic::default()
                        .with_topic_id(id)
                        .with_partitions(partitions)
                })
                .collect(),
        );
    (request, sent, next_due)
}

/// Leaves every partition of `sent` out of fetches for `replica.fetch.backoff.ms`.
fn delay_all(ctx: &FetcherContext, shared: &FetcherShared, sent: &Sent) {
    let now = ctx.clock.now_ms();
    let mut partitions = shared.partitions.lock();
    for (tp, (offset, epoch)) in sent {
        if let Some(f) = partitions.get_mut(tp) {
            if f.state.fetch_offset == *offset && f.state.current_leader_epoch == *epoch {
                f.state.delay(now, ctx.config.backoff_ms);
            }
        }
    }
}

/// The length of the whole batches at the start of `records` (a Kafka leader may end a fetch
/// response with a partial batch, which the follower drops and fetches again).
fn whole_batches_len(records: &[u8]) -> usize {
    let mut pos = 0usize;
    while pos + 12 <= records.len() {
        let len = i32::from_be_bytes([
            records[pos + 8],
            records[pos + 9],
            records[pos + 10],
            records[pos + 11],
        ]);
        let Ok(len) = usize::try_from(len) else { break };
        let Some(end) = pos.checked_add(12).and_then(|p| p.checked_add(len)) else {
            break;
        };
        if end > records.len() {
            break;
        }
        pos = end;
    }
    pos
}

/// Applies one fetch response under the fetcher's lock (on an I/O thread). Returns the
/// partitions that need out-of-range recovery.
pub(super) fn apply_fetch_response(
    ctx: &FetcherContext,
    shared: &FetcherShared,
    sent: &Sent,
    response: FetchResponse,
) -> Vec<OutOfRangeEntry> {
    let now = ctx.clock.now_ms();
    let mut out_of_range = Vec::new();
    let mut partitions = shared.partitions.lock();
    let names: BTreeMap<Uuid, String> = partitions
        .iter()
        .map(|(tp, f)| (f.topic_id, tp.topic.clone()))
        .collect();
    for topic in response.responses {
        let Some(name) = names.get(&topic.topic_id) else {
            continue;
        };
        for pd in topic.partitions {
            let tp = TopicPartition::new(name.clone(), pd.partition_index);
            let (Some(&(offset, epoch)), Some(f)) = (sent.get(&tp), partitions.get_mut(&tp)) else {
                continue;
            };
            if !f
                .partition
                .is_follower_of(f.leader, f.state.current_leader_epoch)
            {
                continue;
            }
            let diverging = (pd.diverging_epoch.epoch >= 0 || pd.diverging_epoch.end_offset >= 0)
                .then_some(EpochEndOffset {
                    epoch: pd.diverging_epoch.epoch,
                    end_offset: pd.diverging_epoch.end_offset,
                });
            let records = pd.records.unwrap_or_default();
            let fetched = FetchedPartition {
                error_code: pd.error_code,
                high_watermark: pd.high_watermark,
                log_start_offset: pd.log_start_offset,
                diverging_epoch: diverging,
                records_bytes: records.len(),
            };
            match on_fetch_response(&f.state, offset, epoch, &fetched) {
                FetchDecision::Append {
                    leader_high_watermark,
                    leader_log_start_offset,
                } => append(
                    ctx,
                    f,
                    &tp,
                    records,
                    leader_high_watermark,
                    leader_log_start_offset,
                    now,
                ),
                FetchDecision::Diverged(d) => truncate_diverging(ctx, f, &tp, d, now),
                FetchDecision::ResolveOutOfRange => out_of_range.push((tp, offset, epoch)),
                FetchDecision::AwaitMetadata => {
                    tracing::info!(partition = %tp, leader_epoch = epoch,
                        "fenced by the leader (a newer leader epoch); waiting for metadata");
                    f.state.status = FetchStatus::AwaitingMetadata;
                }
                FetchDecision::Backoff => {
                    tracing::debug!(partition = %tp, error_code = pd.error_code, "fetch error; backing off");
                    f.state.delay(now, ctx.config.backoff_ms);
                }
                FetchDecision::Ignore => {}
            }
        }
    }
    // A partition whose dir went offline (an append of this response, or any other write)
    // leaves the fetcher at once, as Kafka's `handleLogDirFailure` removes its fetcher: the
    // next fetch forgets it (KIP-227), so the leader stops counting it as a follower catching
    // up. The manager forgets it too when the broker sees the dir change
    // ([`ReplicaFetchers::on_log_dirs_changed`](crate::replica_manager::ReplicaFetchers)).
    partitions.retain(|tp, f| {
        let offline = super::log_dir_offline(&f.partition);
        if offline {
            tracing::info!(partition = %tp,
                "stopped following: the partition's log dir is offline");
        }
        !offline
    });
    out_of_range.retain(|(tp, _, _)| partitions.contains_key(tp));
    out_of_range
}

fn append(
    ctx: &FetcherContext,
    f: &mut FollowedPartition,
    tp: &TopicPartition,
    records: Bytes,
    leader_hw: i64,
    leader_log_start: i64,
    now: i64,
) {
    let whole = whole_batches_len(&records);
    if whole > 0 {
        if let Err(e) = f.partition.append_records_as_follower(&records[..whole]) {
            if matches!(e, gregor_log::LogError::LogDirOffline { .. }) {
                // The directory's own WARN said why and what to do; no line per fetch.
                tracing::debug!(partition = %tp, fetch_offset = f.state.fetch_offset, error = %e,
                    "follower append refused: log dir offline; backing off");
            } else {
                tracing::error!(partition = %tp, fetch_offset = f.state.fetch_offset, error = %e,
                    "follower append failed; backing off");
            }
            f.state.advance(
                f.partition.log.log_end_offset(),
                f.partition.log.latest_leader_epoch(),
            );
            f.state.delay(now, ctx.config.backoff_ms);
            return;
        }
        // Appended bytes of throttled partitions count against the follower quota, in sync
        // or not (Kafka's ReplicaFetcherThread.processPartitionData).
        if ctx.quotas.follower.is_throttled(&tp.topic, tp.partition) {
            ctx.quotas.follower.record(whole as u64);
        }
    }
    if f.partition
        .update_follower_offsets(leader_hw, leader_log_start)
    {
        ctx.log_start_moved.store(true, Ordering::Release);
    }
    f.state.advance(
        f.partition.log.log_end_offset(),
        f.partition.log.latest_leader_epoch(),
    );
    // Kafka's lag: updated when records came or before the first answer.
    if whole > 0 || f.lag.is_none() {
        f.lag = Some((leader_hw - f.state.fetch_offset).max(0));
    }
}

fn truncate_diverging(
    ctx: &FetcherContext,
    f: &mut FollowedPartition,
    tp: &TopicPartition,
    diverging: EpochEndOffset,
    now: i64,
) {
    let log = &f.partition.log;
    let truncation = truncation_for_diverging_epoch(diverging, log.log_end_offset(), |epoch| {
        let (e, end) = log.end_offset_for_leader_epoch(epoch);
        (end >= 0).then_some(EpochEndOffset {
            epoch: e,
            end_offset: end,
        })
    });
    tracing::info!(partition = %tp, leader_epoch = diverging.epoch, leader_end_offset = diverging.end_offset,
        offset = truncation.offset, complete = truncation.complete, "truncating a diverging log");
    let result = f.partition.truncate_as_follower(truncation.offset);
    f.state
        .advance(log.log_end_offset(), log.latest_leader_epoch());
    if let Err(e) = result {
        tracing::error!(partition = %tp, error = %e, "truncation failed; backing off");
        f.state.delay(now, ctx.config.backoff_ms);
    }
}

/// The leader's (log end offset, log start offset) of `tp`, or an error code (Kafka's
/// `fetchLatestOffset` / `fetchEarliestOffset`: ListOffsets latest and earliest with this
/// broker's id and the current leader epoch).
async fn leader_offsets(
    conn: &mut BrokerConnection,
    node_id: i32,
    tp: &TopicPartition,
    leader_epoch: i32,
) -> Result<Result<(i64, i64), i16>, ConnectionError> {
    let mut out = [0i64; 2];
    for (i, timestamp) in [-1i64, -2].into_iter().enumerate() {
        let request = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(node_id))
            .with_isolation_level(0)
            .with_timeout_ms(30_000)
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_string(tp.topic.clone())))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(tp.partition)
                    .with_current_leader_epoch(leader_epoch)
                    .with_timestamp(timestamp)])]);
        let response = conn
            .request(
                ApiKey::ListOffsets,
                LIST_OFFSETS_VERSION,
                RequestKind::ListOffsets(request),
            )
            .await?;
        let ResponseKind::ListOffsets(r) = response else {
            return Ok(Err(ec::UNKNOWN_SERVER_ERROR));
        };
        let Some(p) = r
            .topics
            .iter()
            .filter(|t| t.name.0.as_str() == tp.topic)
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == tp.partition)
        else {
            return Ok(Err(ec::UNKNOWN_TOPIC_OR_PARTITION));
        };
        if p.error_code != ec::NONE {
            return Ok(Err(p.error_code));
        }
        out[i] = p.offset;
    }
    Ok(Ok((out[0], out[1])))
}

/// Applies the out-of-range recovery of `tp` (on an I/O thread), if the partition is still
/// where the fetch left it.
fn apply_out_of_range(
    ctx: &FetcherContext,
    shared: &FetcherShared,
    tp: &TopicPartition,
    fetch_offset: i64,
    leader_epoch: i32,
    leader: Result<(i64, i64), i16>,
) {
    let now = ctx.clock.now_ms();
    let mut partitions = shared.partitions.lock();
    let Some(f) = partitions.get_mut(tp) else {
        return;
    };
    if f.state.fetch_offset != fetch_offset
        || f.state.current_leader_epoch != leader_epoch
        || !f.partition.is_follower_of(f.leader, leader_epoch)
    {
        return;
    }
    let (leader_end, leader_start) = match leader {
        Ok(o) => o,
        Err(code) if code == ec::FENCED_LEADER_EPOCH => {
            f.state.status = FetchStatus::AwaitingMetadata;
            return;
        }
        Err(code) => {
            tracing::info!(partition = %tp, error_code = code, "could not learn the leader's offsets; backing off");
            f.state.delay(now, ctx.config.backoff_ms);
            return;
        }
    };
    let log = &f.partition.log;
    let leo = log.log_end_offset();
    let result = match resolve_out_of_range(leader_end, leader_start, leo) {
        OutOfRange::TruncateTo(o) => {
            tracing::warn!(partition = %tp, from = leo, to = o,
                "the leader's log ends below ours; truncating to it");
            f.partition.truncate_as_follower(o).map(|_| ())
        }
        OutOfRange::TruncateFullyAndStartAt(o) => {
            tracing::warn!(partition = %tp, log_end_offset = leo, leader_log_start_offset = o,
                "our log ends below the leader's log start offset; starting over there");
            let r = f.partition.truncate_fully_as_follower(o);
            ctx.log_start_moved.store(true, Ordering::Release);
            r
        }
        OutOfRange::FetchFrom(_) => Ok(()),
    };
    f.state
        .advance(log.log_end_offset(), log.latest_leader_epoch());
    if let Err(e) = result {
        tracing::error!(partition = %tp, error = %e, "out-of-range truncation failed; backing off");
        f.state.delay(now, ctx.config.backoff_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::whole_batches_len;

    #[test]
    fn partial_trailing_batches_are_cut() {
        let mut b = vec![0u8; 12];
        b[8..12].copy_from_slice(&10i32.to_be_bytes());
        b.extend_from_slice(&[1; 10]);
        let one = b.len();
        let mut two = b.clone();
        two.extend_from_slice(&b);
        assert_eq!(whole_batches_len(&b), one);
        assert_eq!(whole_batches_len(&two), 2 * one);
        assert_eq!(whole_batches_len(&two[..2 * one - 1]), one);
        assert_eq!(whole_batches_len(&two[..one + 5]), one);
        let mut negative = b.clone();
        negative[8..12].copy_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(whole_batches_len(&negative), 0);
        assert_eq!(whole_batches_len(&[]), 0);
    }
}
