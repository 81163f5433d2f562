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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

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
