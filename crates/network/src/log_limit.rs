//! Rate limiting for the warnings that clients can trigger at will (a malformed frame, a size
//! prefix out of range, an unsupported request version), so that a client opening bad
//! connections in a loop cannot fill the broker's log or its disk. Kafka logs these per
//! connection too; a new-user trial of gregor turned 12,551 bad connections into 1.4 MB of log.
//!
//! A [`LogLimiter`] lets `burst` lines through per `window`; the rest are counted, and the
//! next line let through says how many were suppressed since. Every event is still counted in
//! the connection-close metrics; only the log lines are limited.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Allows at most `burst` log lines per `window`.
#[derive(Debug)]
pub struct LogLimiter {
    burst: u32,
    window: Duration,
    state: Mutex<WindowState>,
}

#[derive(Debug)]
struct WindowState {
    started: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

impl LogLimiter {
    /// A limiter letting `burst` lines through per `window`.
    pub const fn new(burst: u32, window: Duration) -> Self {
        Self {
            burst,
            window,
            state: Mutex::new(WindowState {
                started: None,
                logged: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether a line may be logged at `now`: `Some(n)` with the number of lines suppressed
    /// since the last one let through (to be mentioned in it), or `None` to drop this one.
    pub fn check(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock();
        let expired = s
            .started
            .is_none_or(|t| now.saturating_duration_since(t) >= self.window);
        if expired {
            s.started = Some(now);
            s.logged = 0;
        }
        if s.logged < self.burst {
            s.logged += 1;
            Some(std::mem::take(&mut s.suppressed))
        } else {
            s.suppressed = s.suppressed.saturating_add(1);
            None
        }
    }
}

/// The limiter of the client-triggered connection warnings: 10 lines per 10 seconds.
pub static BAD_CONNECTION_WARNINGS: LogLimiter = LogLimiter::new(10, Duration::from_secs(10));

/// Failed SASL authentications (each logged once with its peer, at most 10 per 10 s).
pub static AUTHENTICATION_FAILURES: LogLimiter = LogLimiter::new(10, Duration::from_secs(10));

/// The limiter of `accept` failures (EMFILE when a client holds every descriptor, retried
/// every 50 ms): 10 lines per 10 seconds.
pub static ACCEPT_FAILURE_WARNINGS: LogLimiter = LogLimiter::new(10, Duration::from_secs(10));

/// The limiter of connections closed by the descriptor reserve (a client can open them in a
/// loop): one line per 10 seconds, which says how many were not logged.
pub static DESCRIPTOR_RESERVE_WARNINGS: LogLimiter = LogLimiter::new(1, Duration::from_secs(10));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lets_a_burst_through_then_counts_and_reports_the_suppressed() {
        let l = LogLimiter::new(3, Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(l.check(t0), Some(0));
        assert_eq!(l.check(t0), Some(0));
        assert_eq!(l.check(t0), Some(0));
        for _ in 0..1000 {
            assert_eq!(l.check(t0 + Duration::from_secs(5)), None);
        }
        // A new window: the first line tells how many were dropped.
        assert_eq!(l.check(t0 + Duration::from_secs(10)), Some(1000));
        assert_eq!(l.check(t0 + Duration::from_secs(10)), Some(0));
    }
}
