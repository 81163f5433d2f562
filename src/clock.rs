//! Wall-clock time that follows tokio's clock, so paused-time tests drive
//! the ages GC compares (records store wall-clock times to survive restarts).

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// A wall clock: the system time at creation plus tokio time elapsed since.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    base: SystemTime,
    start: Instant,
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new()
    }
}

impl WallClock {
    /// A clock starting at the current system time.
    pub fn new() -> Self {
        Self { base: SystemTime::now(), start: Instant::now() }
    }

    /// A clock starting at `base` (tests).
    pub fn starting_at(base: SystemTime) -> Self {
        Self { base, start: Instant::now() }
    }

    /// Now.
    pub fn now(&self) -> SystemTime {
        self.base + self.start.elapsed()
    }

    /// Time since `t` (zero when `t` is in the future).
    pub fn since(&self, t: SystemTime) -> Duration {
        self.now().duration_since(t).unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_paused_tokio_time() {
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let c = WallClock::starting_at(base);
        tokio::time::advance(Duration::from_secs(300)).await;
        assert_eq!(c.now(), base + Duration::from_secs(300));
        assert_eq!(c.since(base), Duration::from_secs(300));
        assert_eq!(c.since(base + Duration::from_secs(10_000)), Duration::ZERO);
    }
}
