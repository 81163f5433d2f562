//! imaged's one clock. It follows tokio's time, so paused-time tests drive
//! every cache, timer and age, and it reads two ways: as an [`Instant`]
//! (credential caches, deadlines) and as wall-clock time (records that must
//! survive a restart: the system time when the clock was made plus tokio
//! time since). A [`ManualClock`] stands still until a test moves it.
//! [`Clock::system`] reads the system's own time instead, to compare with
//! another process's time stamps (a runtime's downloads).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// A clock: cheap to clone, clones read the same time.
#[derive(Debug, Clone)]
pub struct Clock {
    base: SystemTime,
    start: Instant,
    /// Set for a [`ManualClock`]'s clock: time moved by hand since `start`.
    manual: Option<Arc<Mutex<Duration>>>,
    /// [`now`](Self::now) reads the system's time ([`Clock::system`]).
    system: bool,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// A clock on tokio's time, starting at the current system time.
    pub fn new() -> Self {
        Self::starting_at(SystemTime::now())
    }

    /// A clock on tokio's time whose wall-clock reading starts at `base`
    /// (tests).
    pub fn starting_at(base: SystemTime) -> Self {
        Self { base, start: Instant::now(), manual: None, system: false }
    }

    /// A clock whose wall-clock reading is the system's own time, as
    /// another process on the node stamps it (containerd's downloads): it
    /// follows the system clock's steps, which tokio time does not. Its
    /// [`instant`](Self::instant) is tokio's.
    pub fn system() -> Self {
        Self { system: true, ..Self::new() }
    }

    fn elapsed(&self) -> Duration {
        match &self.manual {
            Some(moved) => *moved.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
            None => self.start.elapsed(),
        }
    }

    /// Now, as a tokio instant.
    pub fn instant(&self) -> Instant {
        self.start + self.elapsed()
    }

    /// Now, as wall-clock time.
    pub fn now(&self) -> SystemTime {
        if self.system {
            return SystemTime::now();
        }
        self.base + self.elapsed()
    }

    /// Wall-clock time since `t` (zero when `t` is in the future).
    pub fn since(&self, t: SystemTime) -> Duration {
        self.now().duration_since(t).unwrap_or(Duration::ZERO)
    }
}

/// A clock tests move by hand: it stands at the tokio time and system time
/// of its creation until [`advance`](Self::advance)d.
#[derive(Debug, Clone)]
pub struct ManualClock(Clock);

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    /// A clock standing at now.
    pub fn new() -> Self {
        Self(Clock { manual: Some(Arc::default()), ..Clock::new() })
    }

    /// Moves the clock (and every [`Clock`] it handed out) forward by `d`.
    pub fn advance(&self, d: Duration) {
        if let Some(moved) = &self.0.manual {
            *moved.lock().unwrap_or_else(std::sync::PoisonError::into_inner) += d;
        }
    }

    /// The [`Clock`] reading this clock.
    pub fn clock(&self) -> Clock {
        self.0.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn follows_paused_tokio_time() {
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let c = Clock::starting_at(base);
        let t0 = c.instant();
        tokio::time::advance(Duration::from_secs(300)).await;
        assert_eq!(c.now(), base + Duration::from_secs(300));
        assert_eq!(c.instant() - t0, Duration::from_secs(300));
        assert_eq!(c.since(base), Duration::from_secs(300));
        assert_eq!(c.since(base + Duration::from_secs(10_000)), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_manual_clock_moves_only_by_hand_and_its_clones_follow() {
        let m = ManualClock::new();
        let c = m.clock();
        let (t0, w0) = (c.instant(), c.now());
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!((c.instant(), c.now()), (t0, w0));
        m.advance(Duration::from_secs(5));
        assert_eq!(c.instant() - t0, Duration::from_secs(5));
        assert_eq!(m.clock().since(w0), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_system_clock_reads_the_system_time_whatever_tokio_time_does() {
        let c = Clock::system();
        let t0 = c.instant();
        tokio::time::advance(Duration::from_secs(3_600)).await;
        assert_eq!(c.instant() - t0, Duration::from_secs(3_600));
        // Paused tokio time moved an hour; the system's barely did.
        let (before, read, after) = (SystemTime::now(), c.now(), SystemTime::now());
        assert!(before <= read && read <= after, "{read:?} not between {before:?} and {after:?}");
    }
}
