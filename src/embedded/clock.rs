//! Precise waits for simulated pull latency.
//!
//! tokio's timer rounds every sleep up to the next millisecond tick, and a
//! thread sleep wakes late by the kernel's timer slack (50 µs by default), so
//! a simulated 20 ms pull would take visibly longer than asked. Spinning the
//! last stretch on each pull's own thread fixes that for one pull but not for
//! eight at once on a small machine: the spinners take the cores the RPCs
//! need. One thread per process holds every pending deadline in a heap,
//! sleeps until just before the earliest and spins the last [`SPIN`], waking
//! all that are due together: one spinner, however many pulls.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::OnceLock;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// A deadline and whom to wake at it (ordered by deadline, then arrival).
struct Due {
    at: Instant,
    seq: u64,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// A deadline request: when, and whom to wake.
type Request = (Instant, oneshot::Sender<()>);

/// The clock thread's inbox, started on first use; `None` if the thread
/// could not be started (callers then fall back to tokio's timer).
fn inbox() -> Option<&'static Sender<Request>> {
    static INBOX: OnceLock<Option<Sender<Request>>> = OnceLock::new();
    INBOX
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel();
            match std::thread::Builder::new().name("imaged-embedded-clock".into()).spawn(move || run(rx)) {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!(error = %e, "embedded runtime: no clock thread; simulated latency uses tokio's timer");
                    None
                }
            }
        })
        .as_ref()
}

/// How early the clock thread wakes to spin the rest of the way to a
/// deadline: a sleeping thread here wakes 100–200 µs late, with or without
/// timer slack.
const SPIN: Duration = Duration::from_micros(250);

fn run(rx: Receiver<Request>) {
    // The default 50 µs slack would make every wake later still.
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_timerslack(1) {
        tracing::debug!(error = %e, "embedded runtime: clock thread keeps the default timer slack");
    }
    let mut heap: BinaryHeap<Reverse<Due>> = BinaryHeap::new();
    let mut seq = 0u64;
    loop {
        let now = Instant::now();
        while heap.peek().is_some_and(|Reverse(d)| d.at <= now) {
            if let Some(Reverse(d)) = heap.pop() {
                // A cancelled RPC dropped its receiver: nothing to wake.
                let _ = d.wake.send(());
            }
        }
        let next = match heap.peek() {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(Reverse(d)) => match d.at.saturating_duration_since(now).checked_sub(SPIN) {
                Some(sleep) if !sleep.is_zero() => rx.recv_timeout(sleep),
                // Within SPIN of the deadline: spin, taking new deadlines as they come.
                _ => {
                    std::hint::spin_loop();
                    rx.try_recv().map_err(|e| match e {
                        mpsc::TryRecvError::Empty => RecvTimeoutError::Timeout,
                        mpsc::TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                    })
                }
            },
        };
        match next {
            Ok((at, wake)) => {
                seq += 1;
                heap.push(Reverse(Due { at, seq, wake }));
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Waits until `d` after now, precisely (within the kernel's wake-up latency,
/// typically tens of microseconds). Dropping the future abandons the wait.
pub(crate) async fn wait(d: Duration) {
    let at = Instant::now() + crate::domain::limits::clamp_duration(d);
    let (tx, rx) = oneshot::channel();
    let sent = inbox().is_some_and(|inbox| inbox.send((at, tx)).is_ok());
    if !sent || rx.await.is_err() {
        tokio::time::sleep_until(at.into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn waits_at_least_as_long_as_asked_and_wakes_in_deadline_order() {
        let started = Instant::now();
        let order = Mutex::new(Vec::new());
        let waits = [30u64, 10, 20].map(|ms| {
            let order = &order;
            async move {
                wait(Duration::from_millis(ms)).await;
                let elapsed = started.elapsed();
                assert!(elapsed >= Duration::from_millis(ms), "woke early: {elapsed:?} < {ms} ms");
                order.lock().map(|mut o| o.push(ms)).ok();
            }
        });
        futures_util::future::join_all(waits).await;
        assert_eq!(order.into_inner().ok(), Some(vec![10, 20, 30]));
    }

    #[tokio::test]
    async fn an_abandoned_wait_does_not_stop_the_clock() {
        let abandoned = tokio::time::timeout(Duration::from_millis(1), wait(Duration::from_millis(50))).await;
        assert!(abandoned.is_err(), "a 50 ms wait cannot end within 1 ms");
        let t = Instant::now();
        wait(Duration::from_millis(5)).await;
        assert!(t.elapsed() >= Duration::from_millis(5));
    }
}
