//! The registry pull throttle: a token bucket (`registry_pull_qps`,
//! `registry_burst`) on `PullImage` calls, on tokio's clock so paused-time
//! tests drive it.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokio::time::Instant;

/// What a pull does when no token is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleMode {
    /// Fail at once with `pull QPS exceeded` (the kubelet).
    Fail,
    /// Wait until a token is free.
    Wait,
}

/// governor clock reading tokio's (pausable) time as the offset from a start.
#[derive(Debug, Clone)]
struct TokioClock {
    origin: Instant,
}

impl Clock for TokioClock {
    type Instant = Duration;
    fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.origin)
    }
}

type Limiter = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Duration>>;

/// The throttle; `disabled` when `registry_pull_qps` is 0.
pub struct PullThrottle {
    limiter: Option<(Limiter, TokioClock)>,
    mode: ThrottleMode,
}

impl std::fmt::Debug for PullThrottle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullThrottle").field("enabled", &self.limiter.is_some()).field("mode", &self.mode).finish()
    }
}

/// The kubelet's error text when the bucket is empty.
pub const QPS_EXCEEDED: &str = "pull QPS exceeded";

impl PullThrottle {
    /// A throttle of `qps` pulls per second with bursts of `burst` (0 QPS =
    /// no throttle; a burst of 0 is treated as 1).
    pub fn new(qps: f64, burst: u32, mode: ThrottleMode) -> Self {
        let Some(period) = crate::domain::limits::period_of_rate(qps) else {
            return Self { limiter: None, mode };
        };
        let burst = NonZeroU32::new(burst.max(1)).unwrap_or(NonZeroU32::MIN);
        // governor multiplies the period by the burst in u64 nanoseconds: a
        // vanishing rate must not overflow it.
        let period = period.min(Duration::from_nanos(u64::MAX / u64::from(burst.get())));
        let quota = Quota::with_period(period).map(|q| q.allow_burst(burst));
        match quota {
            Some(q) => {
                let clock = TokioClock { origin: Instant::now() };
                Self { limiter: Some((RateLimiter::direct_with_clock(q, clock.clone()), clock)), mode }
            }
            None => Self { limiter: None, mode },
        }
    }

    /// The mode.
    pub fn mode(&self) -> ThrottleMode {
        self.mode
    }

    /// Takes a token, or says how long until one is free.
    pub fn try_acquire(&self) -> Result<(), Duration> {
        match &self.limiter {
            None => Ok(()),
            Some((l, clock)) => l.check().map_err(|not_until| not_until.wait_time_from(clock.now())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_one_token_per_period() {
        let t = PullThrottle::new(5.0, 10, ThrottleMode::Fail);
        for _ in 0..10 {
            assert!(t.try_acquire().is_ok());
        }
        let wait = t.try_acquire().expect_err("bucket empty");
        assert!(wait <= Duration::from_millis(200) && wait > Duration::ZERO, "{wait:?}");
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(t.try_acquire().is_ok());
        assert!(t.try_acquire().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_vanishing_rate_throttles_without_overflow() {
        // A period of ~292 years times a burst of u32::MAX would overflow
        // governor's u64 nanoseconds: the period is capped instead.
        let huge = PullThrottle::new(1e-300, u32::MAX, ThrottleMode::Wait);
        assert!(huge.try_acquire().is_ok());
        let one = PullThrottle::new(f64::MIN_POSITIVE, 1, ThrottleMode::Wait);
        assert!(one.try_acquire().is_ok());
        let wait = one.try_acquire().expect_err("one token per ~292 years");
        assert!(wait > Duration::from_secs(100 * 365 * 86_400), "{wait:?}");
    }

    #[test]
    fn zero_qps_disables_it() {
        let t = PullThrottle::new(0.0, 10, ThrottleMode::Fail);
        for _ in 0..1000 {
            assert!(t.try_acquire().is_ok());
        }
    }
}
