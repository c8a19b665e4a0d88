//! The delayed-operation purgatory, as Kafka's `DelayedOperationPurgatory`: a delayed produce
//! (acks=all) or delayed fetch (long poll) that cannot complete at once is watched under the
//! keys of its partitions. Whatever may let it complete (a high-watermark move, new data, a
//! leadership change) calls [`DelayedOperationPurgatory::check_and_complete`] for the key,
//! which re-runs the operation's `try_complete` check. An operation completes once, by its
//! check or by expiry, and is then removed from **every** watch list it was on (and a watch list
//! left empty is dropped), so waits on idle partitions cannot accumulate (issue 9, defect 3).
//!
//! Expiry: the waiter's own timer ([`DelayedOperation::wait`], a tokio sleep until the
//! operation's deadline) plays the part of Kafka's timing wheel; [`DelayedOperationPurgatory::
//! expire_due`] expires every operation whose deadline has passed on the injected
//! [`Clock`](gregor_log::Clock), which is how tests and simulations drive time. A waiter that
//! is dropped (its connection closed) cancels the operation, which also leaves every list.
//!
//! Bound: an operation exists only while its request is in flight (at most
//! `queued.max.requests` per connection), watching the partitions of that one request; it
//! leaves at completion, expiry, or when its waiter is dropped. A connection layer that aborts
//! a closed connection's deferred requests therefore frees their operations at once, instead
//! of at their `max_wait_ms` / `timeout_ms`.
//!
//! Sizes are exported as `gregor_purgatory_size{delayed_operation="Fetch"|"Produce"}` (watch
//! list entries, Kafka's `PurgatorySize`) and `gregor_purgatory_delayed_operations` (pending
//! operations, Kafka's `NumDelayedOperations`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gregor_log::{SharedClock, TopicPartition};
use parking_lot::Mutex;
use tokio::sync::Notify;

/// Watch-list entries of a purgatory (Kafka's `PurgatorySize`), by `delayed_operation`.
pub const PURGATORY_SIZE: &str = "gregor_purgatory_size";
/// Operations waiting in a purgatory (Kafka's `NumDelayedOperations`), by `delayed_operation`.
pub const PURGATORY_DELAYED_OPERATIONS: &str = "gregor_purgatory_delayed_operations";

/// The check a delayed operation runs to see whether it can complete now. It must be cheap
/// (no disk I/O): it runs on every trigger of every key the operation watches.
pub type TryComplete = Box<dyn Fn() -> bool + Send + Sync>;

/// How a delayed operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Its `try_complete` check passed.
    Completed,
    /// Its deadline passed first.
    Expired,
}

struct Operation {
    id: u64,
    keys: Vec<TopicPartition>,
    deadline_ms: i64,
    try_complete: TryComplete,
    completed: AtomicBool,
    expired: AtomicBool,
    notify: Notify,
}

#[derive(Default)]
struct Watchers {
    /// Operations watching each key. Keys with no operation are removed.
    by_key: HashMap<TopicPartition, HashMap<u64, Arc<Operation>>>,
    /// Every pending operation.
    pending: HashMap<u64, Arc<Operation>>,
    /// Total entries over all watch lists.
    watched: usize,
}

/// A purgatory of one kind of delayed operation (`Fetch` or `Produce`).
pub struct DelayedOperationPurgatory {
    name: &'static str,
    clock: SharedClock,
    watchers: Mutex<Watchers>,
    /// Pending operations, readable without the lock (the append path skips the lock when 0).
    pending: AtomicUsize,
    next_id: AtomicU64,
}

impl DelayedOperationPurgatory {
    /// An empty purgatory named `name` (Kafka's `delayedOperation` tag: `Fetch`, `Produce`)
    /// reading deadlines on `clock`.
    pub fn new(name: &'static str, clock: SharedClock) -> Arc<Self> {
        let p = Arc::new(Self {
            name,
            clock,
            watchers: Mutex::new(Watchers::default()),
            pending: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        });
        p.publish_gauges(0, 0);
        p
    }

    /// The `delayed_operation` name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Kafka's `tryCompleteElseWatch`: runs `try_complete`; if it does not pass, watches the
    /// operation under every key in `keys`, runs the check once more (a trigger between the
    /// first check and the watch would otherwise be missed) and returns the operation to wait
    /// on. Returns `None` when the operation completed at once. `timeout_ms` is from now on the
    /// purgatory's clock.
    pub fn try_complete_else_watch(
        self: &Arc<Self>,
        keys: Vec<TopicPartition>,
        timeout_ms: i64,
        try_complete: TryComplete,
    ) -> Option<DelayedOperation> {
        if try_complete() {
            return None;
        }
        let op = Arc::new(Operation {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            keys,
            deadline_ms: self.clock.now_ms().saturating_add(timeout_ms.max(0)),
            try_complete,
            completed: AtomicBool::new(false),
            expired: AtomicBool::new(false),
            notify: Notify::new(),
        });
        {
            let mut w = self.watchers.lock();
            for key in &op.keys {
                let list = w.by_key.entry(key.clone()).or_default();
                if list.insert(op.id, op.clone()).is_none() {
                    w.watched += 1;
                }
            }
            w.pending.insert(op.id, op.clone());
            self.pending.store(w.pending.len(), Ordering::Release);
            self.publish_gauges(w.watched, w.pending.len());
        }
        if (op.try_complete)() && self.finish(&op, false) {
            return None;
        }
        Some(DelayedOperation {
            purgatory: self.clone(),
            op,
        })
    }

    /// Kafka's `checkAndComplete`: re-runs the check of every operation watching `key` and
    /// completes those that pass. Returns how many completed. Cheap when nothing waits.
    pub fn check_and_complete(&self, key: &TopicPartition) -> usize {
        if self.pending.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let ops: Vec<Arc<Operation>> = match self.watchers.lock().by_key.get(key) {
            Some(list) => list.values().cloned().collect(),
            None => return 0,
        };
        // Checks run outside the lock: they read partition state.
        ops.iter()
            .filter(|op| !op.completed.load(Ordering::Acquire) && (op.try_complete)())
            .filter(|op| self.finish(op, false))
            .count()
    }

    /// Expires every operation whose deadline is at or before the clock's now (Kafka's
    /// expiration reaper advancing the timer). Returns how many expired.
    pub fn expire_due(&self) -> usize {
        let now_ms = self.clock.now_ms();
        let due: Vec<Arc<Operation>> = self
            .watchers
            .lock()
            .pending
            .values()
            .filter(|op| op.deadline_ms <= now_ms)
            .cloned()
            .collect();
        due.iter().filter(|op| self.finish(op, true)).count()
    }

    /// Entries over all watch lists (Kafka's `PurgatorySize`): an operation on three
    /// partitions counts three.
    pub fn watched(&self) -> usize {
        self.watchers.lock().watched
    }

    /// Operations waiting (Kafka's `NumDelayedOperations`).
    pub fn delayed(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Keys that have a watch list.
    pub fn watch_keys(&self) -> usize {
        self.watchers.lock().by_key.len()
    }

    /// Marks `op` done (the first caller wins), removes it from every watch list and wakes its
    /// waiter. Returns false when it was already done.
    fn finish(&self, op: &Arc<Operation>, expired: bool) -> bool {
        if op
            .completed
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        if expired {
            op.expired.store(true, Ordering::Release);
        }
        self.remove(op);
        op.notify.notify_one();
        true
    }

    fn remove(&self, op: &Operation) {
        let mut w = self.watchers.lock();
        for key in &op.keys {
            let mut emptied = false;
            if let Some(list) = w.by_key.get_mut(key) {
                let removed = list.remove(&op.id).is_some();
                emptied = list.is_empty();
                if removed {
                    w.watched -= 1;
                }
            }
            if emptied {
                w.by_key.remove(key);
            }
        }
        w.pending.remove(&op.id);
        self.pending.store(w.pending.len(), Ordering::Release);
        debug_assert!(w.watched >= w.pending.len() || w.pending.is_empty());
        self.publish_gauges(w.watched, w.pending.len());
    }

    fn publish_gauges(&self, watched: usize, pending: usize) {
        metrics::gauge!(PURGATORY_SIZE, "delayed_operation" => self.name).set(watched as f64);
        metrics::gauge!(PURGATORY_DELAYED_OPERATIONS, "delayed_operation" => self.name)
            .set(pending as f64);
    }
}

/// A watched operation, held by whoever waits for it. Dropping it before completion cancels
/// the operation (it leaves every watch list).
pub struct DelayedOperation {
    purgatory: Arc<DelayedOperationPurgatory>,
    op: Arc<Operation>,
}

impl DelayedOperation {
    /// Waits until the operation completes (its check passed after a trigger) or its deadline
    /// passes, and says which. On return it is on no watch list.
    pub async fn wait(self) -> Completion {
        let remaining_ms = self
            .op
            .deadline_ms
            .saturating_sub(self.purgatory.clock.now_ms())
            .max(0);
        let timer = tokio::time::sleep(Duration::from_millis(remaining_ms as u64));
        tokio::select! {
            () = self.op.notify.notified() => {}
            () = timer => {
                self.purgatory.finish(&self.op, true);
            }
        }
        if self.op.expired.load(Ordering::Acquire) {
            Completion::Expired
        } else {
            Completion::Completed
        }
    }

    /// The deadline in ms on the purgatory's clock.
    pub fn deadline_ms(&self) -> i64 {
        self.op.deadline_ms
    }
}

impl Drop for DelayedOperation {
    fn drop(&mut self) {
        // A no-op when it already completed or expired.
        self.purgatory.finish(&self.op, true);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicI64;

    use gregor_log::ManualClock;

    use super::*;

    fn tps(n: i32) -> Vec<TopicPartition> {
        (0..n).map(|i| TopicPartition::new("t", i)).collect()
    }

    #[test]
    fn completes_at_once_without_watching() {
        let p = DelayedOperationPurgatory::new("Fetch", ManualClock::new(0));
        assert!(p
            .try_complete_else_watch(tps(2), 100, Box::new(|| true))
            .is_none());
        assert_eq!((p.watched(), p.delayed(), p.watch_keys()), (0, 0, 0));
    }

    #[tokio::test]
    async fn a_trigger_completes_and_removes_from_every_watch_list() {
        let p = DelayedOperationPurgatory::new("Produce", ManualClock::new(0));
        let hw = Arc::new(AtomicI64::new(0));
        let h = hw.clone();
        let op = p
            .try_complete_else_watch(
                tps(3),
                60_000,
                Box::new(move || h.load(Ordering::Acquire) >= 5),
            )
            .expect("waits");
        assert_eq!((p.watched(), p.delayed(), p.watch_keys()), (3, 1, 3));
        assert_eq!(p.check_and_complete(&TopicPartition::new("t", 1)), 0);
        hw.store(5, Ordering::Release);
        // A trigger on one key completes it; it leaves the other two lists as well.
        assert_eq!(p.check_and_complete(&TopicPartition::new("t", 2)), 1);
        assert_eq!((p.watched(), p.delayed(), p.watch_keys()), (0, 0, 0));
        assert_eq!(op.wait().await, Completion::Completed);
    }

    #[tokio::test]
    async fn many_long_polls_on_idle_partitions_expire_and_leave_no_entry() {
        let clock = ManualClock::new(1_000);
        let p = DelayedOperationPurgatory::new("Fetch", clock.clone());
        let mut ops = Vec::new();
        for i in 0..1_000 {
            let op = p
                .try_complete_else_watch(tps(1 + i % 4), 500, Box::new(|| false))
                .expect("idle partitions: nothing to complete");
            ops.push(op);
        }
        assert_eq!(p.delayed(), 1_000);
        assert_eq!(p.watch_keys(), 4);
        // Triggers on idle partitions complete nothing.
        assert_eq!(p.check_and_complete(&TopicPartition::new("t", 0)), 0);
        clock.advance_ms(499);
        assert_eq!(p.expire_due(), 0);
        clock.advance_ms(1);
        assert_eq!(p.expire_due(), 1_000);
        assert_eq!((p.watched(), p.delayed(), p.watch_keys()), (0, 0, 0));
        for op in ops {
            assert_eq!(op.wait().await, Completion::Expired);
        }
    }

    #[tokio::test]
    async fn the_waiters_timer_expires_it() {
        let p = DelayedOperationPurgatory::new("Fetch", gregor_log::clock::system_clock());
        let op = p
            .try_complete_else_watch(tps(2), 200, Box::new(|| false))
            .expect("waits");
        assert_eq!(op.wait().await, Completion::Expired);
        assert_eq!((p.watched(), p.delayed(), p.watch_keys()), (0, 0, 0));
    }

    #[test]
    fn a_dropped_waiter_cancels_its_operation() {
        let p = DelayedOperationPurgatory::new("Fetch", ManualClock::new(0));
        let op = p
            .try_complete_else_watch(tps(2), 10_000, Box::new(|| false))
            .expect("waits");
        assert_eq!(p.watched(), 2);
        drop(op);
        assert_eq!((p.watched(), p.delayed(), p.watch_keys()), (0, 0, 0));
    }
}
