//! The clock credential caches read: tokio's by default (so paused-time
//! tests drive it), or any function a test injects.

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

/// Where a credential cache reads "now". Cheap to clone.
#[derive(Clone)]
pub struct CacheClock(Arc<dyn Fn() -> Instant + Send + Sync>);

impl CacheClock {
    /// tokio's clock (follows paused time in tests).
    pub fn tokio() -> Self {
        Self(Arc::new(Instant::now))
    }

    /// A clock that reads `now` (tests).
    pub fn from_fn(now: impl Fn() -> Instant + Send + Sync + 'static) -> Self {
        Self(Arc::new(now))
    }

    /// Now.
    pub fn now(&self) -> Instant {
        (self.0)()
    }
}

impl Default for CacheClock {
    fn default() -> Self {
        Self::tokio()
    }
}

impl fmt::Debug for CacheClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CacheClock")
    }
}

/// A clock tests move by hand.
#[derive(Clone, Debug)]
pub struct ManualClock {
    base: Instant,
    offset: Arc<std::sync::Mutex<std::time::Duration>>,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    /// A clock standing at the current tokio time.
    pub fn new() -> Self {
        Self { base: Instant::now(), offset: Arc::default() }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: std::time::Duration) {
        *self.offset.lock().unwrap_or_else(|p| p.into_inner()) += d;
    }

    /// The [`CacheClock`] reading this clock.
    pub fn clock(&self) -> CacheClock {
        let me = self.clone();
        CacheClock::from_fn(move || me.base + *me.offset.lock().unwrap_or_else(|p| p.into_inner()))
    }
}
