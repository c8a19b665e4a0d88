//! The clock that the log, the coordinators and the replica manager read, injected so tests and
//! the deterministic simulation can drive time. Production code uses [`SystemClock`]; tests use
//! [`ManualClock`] and move it with [`ManualClock::advance_ms`].

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch (Kafka's `Time.milliseconds`).
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// The system clock as a [`SharedClock`].
pub fn system_clock() -> SharedClock {
    Arc::new(SystemClock)
}

/// A clock that moves only when told to (Kafka's `MockTime`).
#[derive(Debug)]
pub struct ManualClock {
    now_ms: AtomicI64,
}

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: i64) -> Arc<Self> {
        Arc::new(Self {
            now_ms: AtomicI64::new(start_ms),
        })
    }

    /// Moves the clock forward by `ms` (negative values move it back, as a clock jump would).
    pub fn advance_ms(&self, ms: i64) {
        self.now_ms.fetch_add(ms, Ordering::AcqRel);
    }

    /// Sets the clock to `now_ms`.
    pub fn set_ms(&self, now_ms: i64) {
        self.now_ms.store(now_ms, Ordering::Release);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(1_000);
        assert_eq!(c.now_ms(), 1_000);
        c.advance_ms(250);
        assert_eq!(c.now_ms(), 1_250);
        c.set_ms(5);
        assert_eq!(c.now_ms(), 5);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }
}
