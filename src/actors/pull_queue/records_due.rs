//! Pulls the runtime has answered whose requests have yet to write their
//! KEP-2535 pulled records, by image: a board shared by the pull queue
//! (which marks each request's record due as it answers it) and the
//! ensure flow (which waits on it).
//!
//! The queue answers a pull's requests when the runtime's `PullImage`
//! returns; each then writes its record (a durable commit). A request for
//! the same image whose own pull found the image present at its turn (the
//! earlier pull ended just before it was queued) meanwhile finds no record,
//! and its pod would have to pull again to show its credentials. Waiting
//! for the records due — never its own, as its own pull pulled nothing —
//! lets the record that is a commit away decide.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

/// See the module docs. Cheap to clone; every clone is the same board.
#[derive(Debug, Clone, Default)]
pub struct RecordsDue(Arc<Board>);

#[derive(Debug, Default)]
struct Board {
    /// Image key (normalised reference) → records due.
    due: Mutex<HashMap<String, usize>>,
    /// Told when a record due is written (or given up).
    written: Notify,
}

/// One request's record still to write, for the image it names; the count
/// goes down when the last clone is dropped (written, or the request gone).
#[derive(Debug)]
pub struct RecordDue {
    board: RecordsDue,
    key: String,
}

/// Two are equal when due for the same image (an outcome compares so).
impl PartialEq for RecordDue {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for RecordDue {}

impl Drop for RecordDue {
    fn drop(&mut self) {
        {
            let mut due = self.board.0.due.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = due.get_mut(&self.key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    due.remove(&self.key);
                }
            }
        }
        self.board.0.written.notify_waiters();
    }
}

/// Every board is equal: settings that differ only in their board are the
/// same settings (as [`super::SizeOffers`]).
impl PartialEq for RecordsDue {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl RecordsDue {
    /// A record of a pull of `key` (normalised reference) is due.
    pub(crate) fn owe(&self, key: &str) -> Arc<RecordDue> {
        *self.0.due.lock().unwrap_or_else(PoisonError::into_inner).entry(key.to_string()).or_default() += 1;
        Arc::new(RecordDue { board: self.clone(), key: key.to_string() })
    }

    fn any_due(&self, key: &str) -> bool {
        self.0.due.lock().unwrap_or_else(PoisonError::into_inner).get(key).is_some_and(|n| *n > 0)
    }

    /// Waits, for at most `within`, until no record of a pull of `key` is
    /// due; true when some were (a must-pull check made before is worth
    /// making again, whether they were all written or the wait ran out).
    pub async fn written(&self, key: &str, within: Duration) -> bool {
        crate::settle::settled(&self.0.written, within, || self.any_due(key)).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_when_every_record_due_for_the_image_is_written_and_not_later_than_told() {
        let board = RecordsDue::default();
        let within = Duration::from_millis(500);
        assert!(!board.written("docker.io/library/a:1", within).await, "nothing due: no wait");
        let (first, second) = (board.owe("docker.io/library/a:1"), board.owe("docker.io/library/a:1"));
        let other = board.owe("docker.io/library/b:1");
        let started = tokio::time::Instant::now();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(first);
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(second);
        });
        assert!(board.written("docker.io/library/a:1", within).await, "both written");
        assert_eq!(started.elapsed(), Duration::from_millis(20), "after the second, not the first");
        writer.await.unwrap();
        let started = tokio::time::Instant::now();
        assert!(board.written("docker.io/library/b:1", within).await, "b's was due: look again");
        assert_eq!(started.elapsed(), within, "not written: waited no longer than told");
        let clone = other.clone();
        drop(other);
        assert!(board.any_due("docker.io/library/b:1"), "a clone keeps it due");
        drop(clone);
        assert!(!board.any_due("docker.io/library/b:1"));
    }
}
