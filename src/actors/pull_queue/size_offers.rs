//! Image sizes offered by the CRI front to the pulls it started.
//!
//! A kubelet behind imaged's CRI front asks for a pulled image's size
//! itself (`ImageStatus` of the image's id, at once after its
//! `PullImage`), to word its own event. The front's pull needs the same
//! size for imaged's `Pulled` event and metric: instead of a second
//! `ImageStatus` to the runtime, it waits a little for the size in the
//! answer to the kubelet's call as the front forwards it, and looks it up
//! itself only when none comes (a client that does not ask, such as
//! `crictl pull`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

/// How long a front's pull waits for its size to be offered before it
/// looks it up itself.
pub const OFFER_WAIT: Duration = Duration::from_millis(500);

/// Shared between the pull queue and the CRI front (see the module). A
/// cheap handle; every clone is the same board.
#[derive(Debug, Clone, Default)]
pub struct SizeOffers(Arc<Board>);

#[derive(Debug, Default)]
struct Board {
    /// A front offers sizes (its pulls may wait for them).
    attached: AtomicBool,
    /// Pulls waiting (read without the lock on every forwarded answer).
    waiting: AtomicUsize,
    by_id: Mutex<HashMap<String, Vec<oneshot::Sender<u64>>>>,
}

/// One pull's wait for its size, registered before its caller is answered
/// (so the caller's own `ImageStatus` cannot pass first).
#[derive(Debug)]
pub(crate) struct SizeWait {
    board: SizeOffers,
    id: String,
    offered: oneshot::Receiver<u64>,
}

/// Every board is alike as a setting (as [`crate::metrics::Metrics`]).
impl PartialEq for SizeOffers {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl SizeOffers {
    /// A front will offer the sizes it sees: its pulls wait for them.
    pub fn attach(&self) {
        self.0.attached.store(true, Ordering::Release);
    }

    /// Whether a front offers sizes.
    pub fn attached(&self) -> bool {
        self.0.attached.load(Ordering::Acquire)
    }

    /// Whether any pull waits for a size (the front looks at an answer
    /// only then).
    pub fn wanted(&self) -> bool {
        self.0.waiting.load(Ordering::Acquire) > 0
    }

    /// Starts waiting for the size of image `id`.
    pub(crate) fn expect(&self, id: &str) -> SizeWait {
        let (tx, offered) = oneshot::channel();
        self.lock().entry(id.to_string()).or_default().push(tx);
        self.0.waiting.fetch_add(1, Ordering::AcqRel);
        SizeWait { board: self.clone(), id: id.to_string(), offered }
    }

    /// The runtime said image `id` is `size` bytes: every pull waiting for
    /// it has its size.
    pub fn offer(&self, id: &str, size: u64) {
        let Some(waiters) = self.lock().remove(id) else { return };
        for w in waiters {
            let _ = w.send(size);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<oneshot::Sender<u64>>>> {
        // A panic while holding this lock leaves the map whole.
        self.0.by_id.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl SizeWait {
    /// The size offered within `within`, or `None`.
    pub(crate) async fn offered(mut self, within: Duration) -> Option<u64> {
        tokio::time::timeout(within, &mut self.offered).await.ok().and_then(Result::ok)
    }
}

impl Drop for SizeWait {
    /// Offered or not, this wait is over: its entry goes (the other
    /// waiters' stay).
    fn drop(&mut self) {
        // Closed first, so this wait's sender reads as closed below.
        self.offered.close();
        self.board.0.waiting.fetch_sub(1, Ordering::AcqRel);
        let mut by_id = self.board.lock();
        if let Some(waiters) = by_id.get_mut(&self.id) {
            waiters.retain(|w| !w.is_closed());
            if waiters.is_empty() {
                by_id.remove(&self.id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_offer_reaches_every_wait_for_its_image_and_only_those() {
        let board = SizeOffers::default();
        assert!(!board.wanted());
        let (a, b, other) = (board.expect("sha256:a"), board.expect("sha256:a"), board.expect("sha256:b"));
        assert!(board.wanted());
        board.offer("sha256:a", 7);
        board.offer("sha256:c", 9);
        assert_eq!(a.offered(OFFER_WAIT).await, Some(7));
        assert_eq!(b.offered(OFFER_WAIT).await, Some(7));
        assert_eq!(other.offered(OFFER_WAIT).await, None, "no offer for b within the wait");
        assert!(!board.wanted(), "every wait is over");
        assert!(board.lock().is_empty(), "and left nothing behind");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_given_up_leaves_the_others_waiting() {
        let board = SizeOffers::default();
        let gone = board.expect("sha256:a");
        let stays = board.expect("sha256:a");
        drop(gone);
        assert!(board.wanted());
        board.offer("sha256:a", 3);
        assert_eq!(stays.offered(OFFER_WAIT).await, Some(3));
        assert!(!board.wanted());
    }
}
