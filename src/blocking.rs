//! Blocking work — the store's disk transactions, `statvfs` — kept off the
//! async threads: on tokio's blocking pool, except on a thread the
//! simulator (`crate::sim`) marked deterministic, where it runs inline.
//!
//! The blocking pool is a second set of threads: its work finishes at a
//! moment the OS decides, so a whole-node simulation that used it would
//! interleave store writes with everything else differently on every run.
//! Run inline, a write is one step between two polls of the single-threaded
//! simulation, and a simulated crash (dropping every task) always falls
//! between two transactions, as redb's atomic commit makes it look to a
//! process killed for real.
//!
//! The simulator may also give inline work a duration
//! ([`answer_inline_after`]): the work still runs at once, and its caller
//! hears of it that much later, as from a disk that takes its time to
//! sync. Writers queue behind one another meanwhile (the pull intents'
//! group commit needs them to), and a caller dropped or killed while it
//! waits leaves the work done and unheard of, as one whose
//! `spawn_blocking` it stopped waiting for would.

use std::cell::{Cell, RefCell};
use std::time::Duration;

/// How long inline work takes to answer, drawn per call.
pub type InlineLatency = Box<dyn FnMut() -> Duration>;

thread_local! {
    static INLINE: Cell<bool> = const { Cell::new(false) };
    static LATENCY: RefCell<Option<InlineLatency>> = const { RefCell::new(None) };
}

/// Runs [`unblock`]'s work inline on this thread from now on (`true`) or on
/// the blocking pool again (`false`, the default). The simulator sets it on
/// its one thread; nothing else should.
pub fn run_inline_on_this_thread(inline: bool) {
    INLINE.with(|c| c.set(inline));
}

/// Whether [`unblock`] runs work inline on this thread.
pub fn inline_on_this_thread() -> bool {
    INLINE.with(Cell::get)
}

/// Inline work on this thread answers after the duration `latency` draws
/// for it (`None`: at once, the default). The simulator sets it with its
/// model of a disk; nothing else should.
pub fn answer_inline_after(latency: Option<InlineLatency>) {
    LATENCY.with(|l| *l.borrow_mut() = latency);
}

/// Blocking work that could not run to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("blocking task failed: {0}")]
pub struct BlockingError(String);

/// Runs `f` on tokio's blocking pool and waits for it, or runs it at once on
/// a thread marked by [`run_inline_on_this_thread`].
pub async fn unblock<T, F>(f: F) -> Result<T, BlockingError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if inline_on_this_thread() {
        let done = f();
        let after = LATENCY.with(|l| l.borrow_mut().as_mut().map(|draw| draw()));
        if let Some(after) = after.filter(|d| !d.is_zero()) {
            tokio::time::sleep(after).await;
        }
        return Ok(done);
    }
    tokio::task::spawn_blocking(f).await.map_err(|e| BlockingError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_the_pool_unless_this_thread_is_marked() {
        let here = std::thread::current().id();
        let there = unblock(|| std::thread::current().id()).await.unwrap();
        assert_ne!(there, here, "unmarked: the blocking pool");
        run_inline_on_this_thread(true);
        let inline = unblock(|| std::thread::current().id()).await.unwrap();
        run_inline_on_this_thread(false);
        assert_eq!(inline, here, "marked: inline");
    }

    #[tokio::test(start_paused = true)]
    async fn inline_work_runs_at_once_and_answers_after_its_drawn_latency() {
        run_inline_on_this_thread(true);
        let mut draws = vec![Duration::from_millis(3), Duration::ZERO].into_iter();
        answer_inline_after(Some(Box::new(move || draws.next().unwrap_or_default())));
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let start = tokio::time::Instant::now();
        let mut slow = Box::pin(unblock(move || flag.store(true, std::sync::atomic::Ordering::SeqCst)));
        // One poll runs the work; the answer waits for the latency.
        assert!(futures_util::poll!(slow.as_mut()).is_pending());
        assert!(ran.load(std::sync::atomic::Ordering::SeqCst), "the work ran at the call");
        slow.await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(3));
        let again = tokio::time::Instant::now();
        unblock(|| ()).await.unwrap();
        assert_eq!(again.elapsed(), Duration::ZERO, "a zero draw answers at once");
        answer_inline_after(None);
        run_inline_on_this_thread(false);
    }
}
