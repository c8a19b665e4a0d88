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
//! The queue is bounded by its callers: each connection has at most one immediate part in
//! flight, and deferred parts are bounded by `queued.max.requests` per connection.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::Arc;

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

/// A fixed set of I/O threads taking jobs from one queue.
pub struct IoPool {
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    threads: usize,
}

impl IoPool {
    /// Starts `threads` I/O threads (at least one), named `gregor-io-<n>`. If the OS refuses
    /// every thread (logged), jobs run on the caller's thread instead: degraded, not failed.
    pub fn new(threads: usize) -> Self {
        let wanted = threads.max(1);
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for n in 0..wanted {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("gregor-io-{n}"))
                .spawn(move || loop {
                    // The lock is held only while taking a job, so one long job does not stop
                    // the other threads from taking theirs.
                    let job = rx.lock().recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                });
            match spawned {
                Ok(_) => started += 1,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start I/O thread {n} (num.io.threads)")
                }
            }
        }
        Self {
            sender: Mutex::new((started > 0).then_some(tx)),
            threads: started,
        }
    }

    /// The number of I/O threads.
    pub fn threads(&self) -> usize {
        self.threads
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
            let sender = self.sender.lock();
            let Some(s) = sender.as_ref() else {
                return Err(IoPoolError::ShutDown);
            };
            s.send(boxed).map_err(|_| IoPoolError::ShutDown)?;
        }
        rx.await.map_err(|_| IoPoolError::JobPanicked)
    }

    /// Stops taking jobs; the threads exit after the jobs already queued.
    pub fn shutdown(&self) {
        self.sender.lock().take();
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
}
