//! A bounded wait for a condition a [`Notify`] announces changes of: the
//! shape both single-flight waits share (`PullRecords::pulls_ended`, pulls
//! of an image still in flight; `RecordsDue::written`, records still to
//! write), written once so the "register before the look" rule that keeps
//! a change between the look and the wait from being missed lives in one
//! place.

use std::time::Duration;

use tokio::sync::Notify;

/// Waits, for at most `within`, until `pending` reads false, looking again
/// each time `changed` is told (with `notify_waiters`). True when something
/// was pending at the first look (whether it then settled or the wait ran
/// out); false, at once, when nothing was.
pub(crate) async fn settled(changed: &Notify, within: Duration, pending: impl Fn() -> bool) -> bool {
    if !pending() {
        return false;
    }
    let settle = async {
        loop {
            let told = changed.notified();
            tokio::pin!(told);
            // Registered before the look: a change between the two is not missed.
            told.as_mut().enable();
            if !pending() {
                return;
            }
            told.await;
        }
    };
    let _ = tokio::time::timeout(within, settle).await;
    true
}

/// Work left running behind an answer (a pull's record write, its
/// `Pulled` event waiting for the size), counted so that whoever must see
/// it done can wait ([`Pending::settled`]).
#[derive(Debug, Default)]
pub(crate) struct Pending {
    count: std::sync::atomic::AtomicUsize,
    ended: Notify,
}

/// One piece of [`Pending`] work: counted until dropped (done, or dropped
/// unfinished: a task cancelled at a runtime's end counts out too).
#[derive(Debug)]
pub(crate) struct PendingGuard(std::sync::Arc<Pending>);

impl Pending {
    /// Counts one piece of work until the guard drops.
    pub(crate) fn begin(self: &std::sync::Arc<Self>) -> PendingGuard {
        self.count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        PendingGuard(self.clone())
    }

    /// Waits, for at most `within`, until no work is counted.
    pub(crate) async fn settled(&self, within: Duration) {
        settled(&self.ended, within, || self.count.load(std::sync::atomic::Ordering::Acquire) > 0).await;
    }
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        self.0.ended.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pending_work_is_waited_for_until_every_guard_drops() {
        let pending = Arc::new(Pending::default());
        let (a, b) = (pending.begin(), pending.begin());
        let t = tokio::time::Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(a);
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(b);
        });
        pending.settled(Duration::from_secs(5)).await;
        assert_eq!(t.elapsed(), Duration::from_millis(200));
        let _stuck = pending.begin();
        pending.settled(Duration::from_secs(1)).await;
        assert_eq!(t.elapsed(), Duration::from_millis(1200), "bounded by within");
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_pending_returns_at_once_false() {
        let changed = Notify::new();
        let t = tokio::time::Instant::now();
        assert!(!settled(&changed, Duration::from_secs(5), || false).await);
        assert_eq!(t.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_when_told_the_condition_cleared_and_no_later_than_within() {
        let changed = Arc::new(Notify::new());
        let left = Arc::new(AtomicUsize::new(2));
        let t = tokio::time::Instant::now();
        let (c, l) = (changed.clone(), left.clone());
        tokio::spawn(async move {
            for _ in 0..2 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                l.fetch_sub(1, Ordering::SeqCst);
                c.notify_waiters();
            }
        });
        assert!(settled(&changed, Duration::from_secs(5), || left.load(Ordering::SeqCst) > 0).await);
        assert_eq!(t.elapsed(), Duration::from_millis(200), "ends at the second change, not before or after");

        // Never cleared: the wait runs out at `within` and still says something was pending.
        let t = tokio::time::Instant::now();
        assert!(settled(&changed, Duration::from_millis(300), || true).await);
        assert_eq!(t.elapsed(), Duration::from_millis(300));
    }
}
