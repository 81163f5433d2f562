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

use std::cell::Cell;

thread_local! {
    static INLINE: Cell<bool> = const { Cell::new(false) };
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
        return Ok(f());
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
}
