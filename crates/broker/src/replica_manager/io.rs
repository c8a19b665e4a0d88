//! The I/O pool: log appends (with their segment rolls), reads, fsyncs and the schedulers'
//! disk work run on `num.io.threads` dedicated threads (Kafka's request handler pool,
//! default 8), never on the async workers that serve connections.
//!
//! Why: a write or fsync that stalls on one slow disk would otherwise hold an async worker
//! thread, and with a few such stalls every connection's task stops, including requests that
//! touch no disk (ApiVersions, Metadata). With the pool, a stall costs only I/O threads; the
//! connections keep being served, and disk work beyond `num.io.threads` queues.
//!
//! Cost on the hot path: one hop per request, not per partition. A produce or fetch submits
//! all its partitions as one job ([`IoPool::run`]) and awaits it. The connection's reader
//! awaits a request's immediate part before reading the next request, so appends still happen
//! in request order on each connection (an idempotent producer with five requests in flight
//! relies on it).
//!
//! The hop is not free: each job wakes an I/O thread and then the waiting async worker. At a
//! fixed 20 MB/s of produce with a tailing consumer (bench workload (e), about 600 jobs/s) the
//! broker used 1.5-1.6x the CPU of the build that wrote on the async workers (7.0 vs 4.3 CPU-s
//! a minute; latency and throughput unchanged within noise), almost all of it context
//! switches. Removing it needs fewer jobs per record (issue 15's cheaper produce path), not a
//! faster queue.
//!
//! The queue is bounded by its callers: each connection has at most one immediate part in
//! flight, deferred parts are bounded by `queued.max.requests` per connection, and a
//! connection's writer has at most one `sendfile` job (zero-copy fetch, [`IoPool::submit`])
//! queued at a time.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::thread::Thread;

use parking_lot::Mutex;
use thiserror::Error;
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Why a job gave no result.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum IoPoolError {
    /// The job panicked (a gregor bug); the I/O thread survives it.
    #[error("an I/O job panicked")]
    JobPanicked,
    /// The pool is shut down.
    #[error("the I/O pool is shut down")]
    ShutDown,
}

/// The queue and the idle threads, under one lock.
///
/// Idle threads form a stack: a job wakes the thread that went idle last (its stack and
/// allocator arena are warm) and only that one, so a lightly loaded broker keeps one or two
/// I/O threads busy and the rest asleep. (A `Mutex<mpsc::Receiver>` shared by all threads
/// wakes two threads per job, the receiver and the next waiter on the mutex, and spreads
/// allocations over every thread's arena; measured at 20 MB/s of produce, that doubled the
/// broker's context switches.)
struct State {
    queue: VecDeque<Job>,
    idle: Vec<Thread>,
    shut_down: bool,
}

struct Shared {
    state: Mutex<State>,
}

impl Shared {
    fn worker_loop(&self) {
        let me = std::thread::current();
        let mut state = self.state.lock();
        loop {
            if let Some(job) = state.queue.pop_front() {
                drop(state);
                job();
                state = self.state.lock();
                continue;
            }
            if state.shut_down {
                return;
            }
            state.idle.push(me.clone());
            drop(state);
            // A wake-up may come before the park (the token makes park return at once) or be
            // spurious; either way the queue is checked again and this thread is listed as
            // idle at most once.
            std::thread::park();
            state = self.state.lock();
            let id = me.id();
            state.idle.retain(|t| t.id() != id);
        }
    }
}

/// A fixed set of I/O threads taking jobs from one queue.
pub struct IoPool {
    shared: Arc<Shared>,
    threads: usize,
}

impl IoPool {
    /// Starts `threads` I/O threads (at least one), named `gregor-io-<n>`. If the OS refuses
    /// every thread (logged), jobs run on the caller's thread instead: degraded, not failed.
    pub fn new(threads: usize) -> Self {
        let wanted = threads.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                idle: Vec::with_capacity(wanted),
                shut_down: false,
            }),
        });
        let mut started = 0;
        for n in 0..wanted {
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("gregor-io-{n}"))
                .spawn(move || s.worker_loop());
            match spawned {
                Ok(_) => started += 1,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start I/O thread {n} (num.io.threads)")
                }
            }
        }
        Self {
            shared,
            threads: started,
        }
    }

    /// The number of I/O threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// How many I/O threads wait for a job now (0 when every one is busy or the pool runs
    /// jobs on the caller's thread).
    pub fn idle_threads(&self) -> usize {
        let state = self.shared.state.lock();
        if state.shut_down || !state.queue.is_empty() {
            return 0;
        }
        state.idle.len()
    }

    /// Runs `job` on an I/O thread and returns its result.
    ///
    /// # Errors
    /// [`IoPoolError::JobPanicked`] when the job panicked, [`IoPoolError::ShutDown`] after
    /// [`IoPool::shutdown`].
    pub async fn run<R, F>(&self, job: F) -> Result<R, IoPoolError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let boxed: Job = Box::new(move || {
            if let Ok(r) = std::panic::catch_unwind(AssertUnwindSafe(job)) {
                let _ = tx.send(r);
            }
        });
        if self.threads == 0 {
            boxed();
        } else {
            let mut state = self.shared.state.lock();
            if state.shut_down {
                return Err(IoPoolError::ShutDown);
            }
            state.queue.push_back(boxed);
            let wake = state.idle.pop();
            drop(state);
            if let Some(thread) = wake {
                thread.unpark();
            }
        }
        rx.await.map_err(|_| IoPoolError::JobPanicked)
    }

    /// Queues `job` without waiting for it (the network writer's file transfers, which
    /// report back by their own channel). A panic in it is caught and logged.
    ///
    /// # Errors
    /// [`IoPoolError::ShutDown`] after [`IoPool::shutdown`]; the job is dropped unrun.
    pub fn submit(&self, job: Box<dyn FnOnce() + Send + 'static>) -> Result<(), IoPoolError> {
        let boxed: Job = Box::new(move || {
            if std::panic::catch_unwind(AssertUnwindSafe(job)).is_err() {
                tracing::error!("an I/O job panicked");
            }
        });
        if self.threads == 0 {
            boxed();
            return Ok(());
        }
        let mut state = self.shared.state.lock();
        if state.shut_down {
            return Err(IoPoolError::ShutDown);
        }
        state.queue.push_back(boxed);
        let wake = state.idle.pop();
        drop(state);
        if let Some(thread) = wake {
            thread.unpark();
        }
        Ok(())
    }

    /// Stops taking jobs; the threads exit after the jobs already queued.
    pub fn shutdown(&self) {
        let idle = {
            let mut state = self.shared.state.lock();
            state.shut_down = true;
            std::mem::take(&mut state.idle)
        };
        for thread in idle {
            thread.unpark();
        }
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn runs_jobs_and_survives_a_panicking_one() {
        let pool = IoPool::new(1);
        assert_eq!(pool.run(|| 6 * 7).await, Ok(42));
        #[allow(clippy::panic)]
        let r: Result<(), _> = pool.run(|| panic!("boom")).await;
        assert_eq!(r, Err(IoPoolError::JobPanicked));
        assert_eq!(pool.run(|| "still alive").await, Ok("still alive"));
        pool.shutdown();
        assert_eq!(pool.run(|| 1).await, Err(IoPoolError::ShutDown));
    }

    /// Many tasks submitting at once: every job runs exactly once and every caller gets its
    /// own result (no wake-up is lost between a thread listing itself idle and parking), and
    /// jobs queued before shutdown still run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_jobs_all_complete_once() {
        let pool = Arc::new(IoPool::new(3));
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..2_000usize {
            let pool = pool.clone();
            let ran = ran.clone();
            tasks.push(tokio::spawn(async move {
                pool.run(move || {
                    ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    i * 2
                })
                .await
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            let r = tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .expect("a job was never run (lost wake-up)")
                .expect("task");
            assert_eq!(r, Ok(i * 2));
        }
        assert_eq!(ran.load(std::sync::atomic::Ordering::Relaxed), 2_000);
    }

    /// A stalled job holds one I/O thread, not an async worker: on a single-threaded runtime
    /// other tasks keep running, and with two I/O threads other jobs still complete.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stalled_job_does_not_stall_the_runtime_or_the_other_threads() {
        let pool = Arc::new(IoPool::new(2));
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let p = pool.clone();
        let stalled = tokio::spawn(async move {
            p.run(move || release_rx.recv_timeout(Duration::from_secs(30)).is_ok())
                .await
        });
        // Another task on the only async worker still runs.
        let other = tokio::spawn(async { 1 + 1 });
        assert_eq!(other.await.ok(), Some(2));
        // And the second I/O thread takes other jobs.
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(10), pool.run(|| 3))
                .await
                .ok(),
            Some(Ok(3))
        );
        assert!(!stalled.is_finished());
        release_tx.send(()).expect("release");
        assert_eq!(stalled.await.ok(), Some(Ok(true)));
    }

    /// `idle_threads` counts the threads parked for work: all of them once started, one fewer
    /// while a job holds one, none after shutdown.
    #[tokio::test]
    async fn idle_threads_counts_the_threads_waiting_for_work() {
        let pool = Arc::new(IoPool::new(2));
        let until = |want: usize| {
            let pool = pool.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(30), async {
                    while pool.idle_threads() != want {
                        tokio::task::yield_now().await;
                    }
                })
                .await
                .unwrap_or_else(|_| panic!("idle_threads never became {want}"));
            }
        };
        until(2).await;
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let p = pool.clone();
        let held = tokio::spawn(async move {
            p.run(move || release_rx.recv_timeout(Duration::from_secs(30)).is_ok())
                .await
        });
        until(1).await;
        release_tx.send(()).expect("release");
        assert_eq!(held.await.ok(), Some(Ok(true)));
        until(2).await;
        pool.shutdown();
        assert_eq!(pool.idle_threads(), 0);
    }
}
