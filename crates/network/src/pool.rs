//! The request memory pool: `queued.max.request.bytes` (Kafka's `SimpleMemoryPool` in
//! non-strict mode, as `SocketServer` builds it). Before reading a request body the reader
//! reserves the size its prefix declares; while the pool is exhausted, readers wait instead of
//! reading more. The reservation is returned when the request's immediate part has run (or the
//! connection closes mid-frame). Unbounded when the config is `<= 0` (Kafka's default -1).

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// Bytes left in the request memory pool (gauge; only when `queued.max.request.bytes` is set;
/// Kafka's `MemoryPoolAvailable`).
pub const MEMORY_POOL_AVAILABLE_BYTES: &str = "gregor_memory_pool_available_bytes";

/// A byte budget shared by every connection.
#[derive(Debug)]
pub struct MemoryPool {
    /// `None` when unbounded.
    capacity_bytes: Option<i64>,
    available_bytes: Mutex<i64>,
    released: Notify,
}

impl MemoryPool {
    /// A pool of `queued_max_request_bytes`; `<= 0` means unbounded.
    pub fn new(queued_max_request_bytes: i64) -> Arc<Self> {
        let capacity_bytes = (queued_max_request_bytes > 0).then_some(queued_max_request_bytes);
        if let Some(c) = capacity_bytes {
            metrics::gauge!(MEMORY_POOL_AVAILABLE_BYTES).set(c as f64);
        }
        Arc::new(Self {
            capacity_bytes,
            available_bytes: Mutex::new(capacity_bytes.unwrap_or(0)),
            released: Notify::new(),
        })
    }

    /// Bytes still available (may be negative: non-strict mode lets one request take more than
    /// what is left); `None` when unbounded.
    pub fn available_bytes(&self) -> Option<i64> {
        self.capacity_bytes.map(|_| *self.available_bytes.lock())
    }

    /// Reserves `size_bytes`, waiting while no memory at all is available. As Kafka's
    /// non-strict pool, a reservation succeeds as soon as at least one byte is free, so the
    /// pool can be overdrawn by up to one `socket.request.max.bytes`.
    pub async fn reserve(self: &Arc<Self>, size_bytes: usize) -> Reservation {
        let size = i64::try_from(size_bytes).unwrap_or(i64::MAX);
        if self.capacity_bytes.is_none() {
            return Reservation {
                pool: self.clone(),
                size_bytes: 0,
            };
        }
        loop {
            let notified = self.released.notified();
            tokio::pin!(notified);
            // Register before checking, so a release between the check and the wait is seen.
            notified.as_mut().enable();
            {
                let mut available = self.available_bytes.lock();
                if *available >= 1 {
                    *available = available.saturating_sub(size);
                    metrics::gauge!(MEMORY_POOL_AVAILABLE_BYTES).set(*available as f64);
                    return Reservation {
                        pool: self.clone(),
                        size_bytes: size,
                    };
                }
            }
            notified.await;
        }
    }

    fn release(&self, size_bytes: i64) {
        if size_bytes == 0 {
            return;
        }
        {
            let mut available = self.available_bytes.lock();
            *available = available.saturating_add(size_bytes);
            metrics::gauge!(MEMORY_POOL_AVAILABLE_BYTES).set(*available as f64);
        }
        self.released.notify_waiters();
    }
}

/// Bytes held from a [`MemoryPool`], returned on drop.
#[derive(Debug)]
pub struct Reservation {
    pool: Arc<MemoryPool>,
    size_bytes: i64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pool.release(self.size_bytes);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn unbounded_pool_never_waits() {
        let pool = MemoryPool::new(-1);
        let _a = pool.reserve(usize::MAX).await;
        let _b = pool.reserve(100).await;
        assert_eq!(pool.available_bytes(), None);
    }

    #[tokio::test]
    async fn exhausted_pool_waits_until_a_reservation_is_dropped() {
        let pool = MemoryPool::new(100);
        // Non-strict: 150 > 100 is granted because memory was available.
        let a = pool.reserve(150).await;
        assert_eq!(pool.available_bytes(), Some(-50));
        let p = pool.clone();
        let waiter = tokio::spawn(async move { p.reserve(10).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "reserved from an exhausted pool");
        drop(a);
        let b = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken by the release")
            .expect("task");
        assert_eq!(pool.available_bytes(), Some(90));
        drop(b);
        assert_eq!(pool.available_bytes(), Some(100));
    }
}
