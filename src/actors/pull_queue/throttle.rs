//! The registry pull throttle: a token bucket (`registry_pull_qps`,
//! `registry_burst`) on `PullImage` calls, and optionally one per registry
//! (`[[pull.registries]]` `qps`, `burst`), on tokio's clock so paused-time
//! tests drive it. A pull takes its registry's token first, then the
//! node's: in fail mode a registry without a token fails the pull before
//! the node's is spent; in wait mode the pull queue takes the registry's
//! token as it starts a pull, passing over pulls whose registry has none.

use std::collections::HashMap;

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

/// The throttle; `disabled` when `registry_pull_qps` is 0. Shared by the
/// queue and its pull tasks; [`PullThrottle::set`] replaces its bucket for
/// all of them (a reload).
pub struct PullThrottle {
    state: std::sync::RwLock<State>,
    /// Woken by [`PullThrottle::set`]: a pull waiting for a token of the
    /// old bucket asks the new one.
    replaced: tokio::sync::Notify,
}

struct State {
    limiter: Option<Bucket>,
    mode: ThrottleMode,
    /// Each registry's own bucket (registries without a rate have none).
    registries: HashMap<String, Bucket>,
}

/// A token bucket and the rate it was made for (`qps` bits, burst): a
/// reload keeps a bucket whose rate it does not change.
struct Bucket {
    limiter: Limiter,
    clock: TokioClock,
    rate: (u64, u32),
}

/// One registry's own rate (`[[pull.registries]]`), under the node's.
#[derive(Debug, Clone, PartialEq)]
pub struct RegistryRate {
    /// The registry as imaged names an image's domain (`docker.io`).
    pub registry: String,
    /// Pulls per second from it (0 = none of its own: only the node's).
    pub qps: f64,
    /// Its bucket (0 is taken as 1).
    pub burst: u32,
}

fn registry_buckets(rates: &[RegistryRate]) -> HashMap<String, Bucket> {
    rates.iter().filter_map(|r| Some((r.registry.clone(), limiter(r.qps, r.burst)?))).collect()
}

impl std::fmt::Debug for PullThrottle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state();
        f.debug_struct("PullThrottle").field("enabled", &st.limiter.is_some()).field("mode", &st.mode).finish()
    }
}

/// The kubelet's error text when the bucket is empty.
pub const QPS_EXCEEDED: &str = "pull QPS exceeded";

impl PullThrottle {
    /// A throttle of `qps` pulls per second with bursts of `burst` (0 QPS =
    /// no throttle; a burst of 0 is treated as 1).
    pub fn new(qps: f64, burst: u32, mode: ThrottleMode) -> Self {
        Self::with_registries(qps, burst, mode, &[])
    }

    /// [`PullThrottle::new`] with each of `registries`' own bucket.
    pub fn with_registries(qps: f64, burst: u32, mode: ThrottleMode, registries: &[RegistryRate]) -> Self {
        Self {
            state: std::sync::RwLock::new(State {
                limiter: limiter(qps, burst),
                mode,
                registries: registry_buckets(registries),
            }),
            replaced: tokio::sync::Notify::new(),
        }
    }

    /// Replaces the bucket (full, `burst` tokens) and the mode: the pulls
    /// that take a token from now on, waiting ones included, take it here.
    pub fn set(&self, qps: f64, burst: u32, mode: ThrottleMode, registries: &[RegistryRate]) {
        let mut st = self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A bucket whose rate is unchanged is kept as it is (a reload that
        // changes one registry's rate gives no other a fresh burst).
        let same = |b: &Bucket, qps: f64, burst: u32| b.rate == (qps.to_bits(), burst);
        let node = match st.limiter.take() {
            Some(b) if same(&b, qps, burst) => Some(b),
            _ => limiter(qps, burst),
        };
        let mut old = std::mem::take(&mut st.registries);
        let registries = registries
            .iter()
            .filter_map(|r| {
                let kept = old.remove(&r.registry).filter(|b| same(b, r.qps, r.burst));
                Some((r.registry.clone(), kept.or_else(|| limiter(r.qps, r.burst))?))
            })
            .collect();
        *st = State { limiter: node, mode, registries };
        drop(st);
        self.replaced.notify_waiters();
    }

    /// Resolves when [`PullThrottle::set`] replaces the bucket after this
    /// call: taken before [`PullThrottle::try_acquire`], it misses no
    /// replacement between the two.
    pub fn replaced(&self) -> tokio::sync::futures::Notified<'_> {
        self.replaced.notified()
    }

    fn state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The mode.
    pub fn mode(&self) -> ThrottleMode {
        self.state().mode
    }

    /// Takes a token of the node's bucket, or says how long until one is
    /// free.
    #[cfg(test)] // the pull path uses `acquire` (token and mode under one lock)
    pub fn try_acquire(&self) -> Result<(), Duration> {
        take(self.state().limiter.as_ref())
    }

    /// Takes a token of `registry`'s own bucket (at once when it has none),
    /// or says how long until one is free.
    #[cfg(test)] // the pull path uses `acquire` (token and mode under one lock)
    pub fn try_acquire_registry(&self, registry: &str) -> Result<(), Duration> {
        take(self.state().registries.get(registry))
    }

    /// A token of the node's bucket (`registry` `None`) or of a registry's,
    /// or how long until one is free with the mode in force — read under
    /// one lock, so a reload between the two cannot pair the old bucket's
    /// answer with the new mode.
    pub fn acquire(&self, registry: Option<&str>) -> Result<(), (Duration, ThrottleMode)> {
        let st = self.state();
        let bucket = match registry {
            None => st.limiter.as_ref(),
            Some(r) => st.registries.get(r),
        };
        take(bucket).map_err(|wait| (wait, st.mode))
    }

    /// Whether any registry has a bucket of its own.
    pub fn has_registry_rates(&self) -> bool {
        !self.state().registries.is_empty()
    }

    /// Whether `registry` has a bucket of its own.
    #[cfg(test)] // the pull path uses `acquire` (token and mode under one lock)
    pub fn limits_registry(&self, registry: &str) -> bool {
        self.state().registries.contains_key(registry)
    }
}

fn take(bucket: Option<&Bucket>) -> Result<(), Duration> {
    match bucket {
        None => Ok(()),
        Some(b) => b.limiter.check().map_err(|not_until| not_until.wait_time_from(b.clock.now())),
    }
}

/// A bucket of `qps` tokens per second holding `burst` (none at 0 QPS).
fn limiter(qps: f64, given_burst: u32) -> Option<Bucket> {
    let period = crate::domain::limits::period_of_rate(qps)?;
    let burst = NonZeroU32::new(given_burst.max(1)).unwrap_or(NonZeroU32::MIN);
    // governor multiplies the period by the burst in u64 nanoseconds: a
    // vanishing rate must not overflow it.
    let period = period.min(Duration::from_nanos(u64::MAX / u64::from(burst.get())));
    let quota = Quota::with_period(period)?.allow_burst(burst);
    let clock = TokioClock { origin: Instant::now() };
    let limiter = RateLimiter::direct_with_clock(quota, clock.clone());
    Some(Bucket { limiter, clock, rate: (qps.to_bits(), given_burst) })
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

    #[tokio::test(start_paused = true)]
    async fn a_new_rate_replaces_the_bucket_for_every_holder() {
        let t = std::sync::Arc::new(PullThrottle::new(1.0, 1, ThrottleMode::Fail));
        let task = t.clone();
        assert!(task.try_acquire().is_ok());
        assert!(task.try_acquire().is_err(), "one token a second");
        t.set(100.0, 3, ThrottleMode::Wait, &[]);
        assert_eq!(task.mode(), ThrottleMode::Wait);
        for _ in 0..3 {
            assert!(task.try_acquire().is_ok(), "a full bucket of the new burst");
        }
        let wait = task.try_acquire().expect_err("empty");
        assert!(wait <= Duration::from_millis(10), "the new rate: {wait:?}");
        t.set(0.0, 0, ThrottleMode::Fail, &[]);
        for _ in 0..1000 {
            assert!(task.try_acquire().is_ok(), "0 QPS: off");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_replacement_wakes_whoever_waits_on_the_old_bucket() {
        let t = PullThrottle::new(1.0, 1, ThrottleMode::Wait);
        let replaced = t.replaced();
        assert!(t.try_acquire().is_ok());
        t.set(0.0, 0, ThrottleMode::Wait, &[]);
        tokio::time::timeout(Duration::from_millis(1), replaced).await.expect("taken before set: woken");
        let later = t.replaced();
        assert!(tokio::time::timeout(Duration::from_secs(60), later).await.is_err(), "no replacement since: not woken");
    }

    #[tokio::test(start_paused = true)]
    async fn a_registry_with_a_rate_has_its_own_bucket_under_the_nodes() {
        let hub = RegistryRate { registry: "docker.io".into(), qps: 0.5, burst: 2 };
        let idle = RegistryRate { registry: "quay.io".into(), qps: 0.0, burst: 5 };
        let t = PullThrottle::with_registries(0.0, 10, ThrottleMode::Wait, &[hub.clone(), idle]);
        assert!(t.limits_registry("docker.io") && !t.limits_registry("quay.io"), "0 QPS: no bucket");
        for _ in 0..2 {
            assert!(t.try_acquire_registry("docker.io").is_ok());
        }
        let wait = t.try_acquire_registry("docker.io").expect_err("its burst of two spent");
        assert!(wait > Duration::from_millis(1900) && wait <= Duration::from_secs(2), "{wait:?}");
        for _ in 0..100 {
            assert!(t.try_acquire_registry("quay.io").is_ok() && t.try_acquire_registry("ghcr.io").is_ok());
        }
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(t.try_acquire_registry("docker.io").is_ok(), "one more every two seconds");
        // A reload that leaves a registry's rate as it was keeps its bucket
        // (no fresh burst), while another registry's changes.
        let quay = RegistryRate { registry: "quay.io".into(), qps: 1.0, burst: 1 };
        t.set(0.0, 10, ThrottleMode::Wait, &[hub.clone(), quay]);
        assert!(t.try_acquire_registry("docker.io").is_err(), "still empty");
        assert!(t.try_acquire_registry("quay.io").is_ok(), "the new one's burst");
        // A reload that changes it replaces it.
        t.set(0.0, 10, ThrottleMode::Wait, &[RegistryRate { burst: 1, ..hub }]);
        assert!(t.try_acquire_registry("docker.io").is_ok());
        assert!(t.try_acquire_registry("docker.io").is_err(), "the new burst of one");
        t.set(0.0, 10, ThrottleMode::Wait, &[]);
        assert!(!t.limits_registry("docker.io"));
    }
}
