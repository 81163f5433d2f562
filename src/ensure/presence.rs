//! Turns for presence checks (the `ImageStatus` an ensure makes before
//! deciding to pull): how many may be in flight at once.
//!
//! A burst of checks sent all at once is answered all together: a runtime
//! that takes every request before it answers any (imaged's embedded one
//! does; a busy containerd behaves alike) answers the first only when it has
//! served the last, so no pull of the burst starts before then. A window of
//! turns answers the burst in arrival order instead.
//!
//! The window can be fixed (`cap` = `start`), or grow as checks are answered:
//! it starts at `start` turns and each answered check adds one, up to `cap`
//! (doubling every round trip, as TCP's slow start), and it shrinks back to
//! `start` when no check is in flight or waiting. The first checks of a
//! burst go out at once and get their answers first; a long burst of present
//! images is soon checked with a window wide enough not to wait on round
//! trips.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// The shape of a window of presence-check turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PresenceWindow {
    /// Turns when no check is in flight (at least 1).
    pub start: usize,
    /// Most turns the window grows to (`usize::MAX`: no limit); at least `start`.
    pub cap: usize,
}

impl PresenceWindow {
    /// A window that starts at `start` turns and grows up to `cap` (`None`:
    /// without limit); both at least 1. A cap below `start` is the most
    /// checks in flight all the same: the window starts there and stays.
    pub fn new(start: usize, cap: Option<usize>) -> Self {
        let cap = cap.map_or(usize::MAX, |c| c.max(1));
        Self { start: start.clamp(1, cap), cap }
    }

    /// A window that never grows: at most `n` checks in flight.
    pub fn fixed(n: usize) -> Self {
        Self::new(n, Some(n))
    }
}

#[derive(Debug)]
struct State {
    in_flight: usize,
    window: usize,
    /// Checks waiting for a turn, in arrival order.
    waiting: VecDeque<oneshot::Sender<()>>,
}

/// Hands out turns for presence checks. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct PresenceGate {
    shape: PresenceWindow,
    state: Arc<Mutex<State>>,
}

/// A check's turn; ended with [`Turn::end`] (the window grows) or by
/// dropping it (a check abandoned by its caller: the window does not grow).
#[derive(Debug)]
pub(crate) struct Turn {
    gate: PresenceGate,
    ended: bool,
}

impl Turn {
    /// The check was answered (successfully or not), or held its turn as
    /// long as it may: its turn ends and the window grows by one.
    pub(crate) fn end(mut self) {
        self.ended = true;
        self.gate.release(true);
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if !self.ended {
            self.gate.release(false);
        }
    }
}

/// A wait for a turn; a turn handed to a wait that is dropped before it sees
/// it is passed on.
struct Waiting {
    gate: PresenceGate,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take()
            && rx.try_recv().is_ok()
        {
            self.gate.release(false);
        }
    }
}

impl PresenceGate {
    pub(crate) fn new(shape: PresenceWindow) -> Self {
        let state = State { in_flight: 0, window: shape.start, waiting: VecDeque::new() };
        Self { shape, state: Arc::new(Mutex::new(state)) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain counters: a poisoned lock is still consistent enough to use.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a turn, in arrival order.
    pub(crate) async fn turn(&self) -> Turn {
        let rx = {
            let mut st = self.lock();
            if st.waiting.is_empty() && st.in_flight < st.window {
                st.in_flight += 1;
                return Turn { gate: self.clone(), ended: false };
            }
            let (tx, rx) = oneshot::channel();
            st.waiting.push_back(tx);
            rx
        };
        let mut wait = Waiting { gate: self.clone(), rx: Some(rx) };
        if let Some(rx) = wait.rx.as_mut() {
            // The gate never drops a waiter's sender without a turn: a
            // closed channel cannot happen, and would only mean "go on".
            let _ = rx.await;
        }
        wait.rx = None;
        Turn { gate: self.clone(), ended: false }
    }

    fn release(&self, grow: bool) {
        let mut st = self.lock();
        st.in_flight = st.in_flight.saturating_sub(1);
        if grow && st.window < self.shape.cap {
            st.window += 1;
        }
        if st.in_flight == 0 && st.waiting.is_empty() {
            st.window = self.shape.start;
        }
        while st.in_flight < st.window {
            let Some(next) = st.waiting.pop_front() else { break };
            // A waiter that went away takes no turn.
            if next.send(()).is_ok() {
                st.in_flight += 1;
            }
        }
    }

    /// Checks in flight and the window now (for tests).
    #[cfg(test)]
    fn now(&self) -> (usize, usize) {
        let st = self.lock();
        (st.in_flight, st.window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    /// `n` turns taken one after another without waiting (panics if one waits).
    fn take(gate: &PresenceGate, n: usize) -> Vec<Turn> {
        (0..n).map(|_| gate.turn().now_or_never().expect("a free turn")).collect()
    }

    #[test]
    fn a_window_starts_at_one_turn_at_least_and_never_above_its_cap() {
        assert_eq!(PresenceWindow::new(8, None), PresenceWindow { start: 8, cap: usize::MAX });
        assert_eq!(PresenceWindow::new(8, Some(32)), PresenceWindow { start: 8, cap: 32 });
        assert_eq!(PresenceWindow::new(8, Some(2)), PresenceWindow { start: 2, cap: 2 });
        assert_eq!(PresenceWindow::new(0, Some(0)), PresenceWindow { start: 1, cap: 1 });
        assert_eq!(PresenceWindow::fixed(3), PresenceWindow { start: 3, cap: 3 });
    }

    #[test]
    fn a_fixed_window_never_grows() {
        let gate = PresenceGate::new(PresenceWindow::fixed(3));
        let mut turns = take(&gate, 3);
        assert!(gate.turn().now_or_never().is_none(), "the fourth check waits");
        for _ in 0..10 {
            turns.pop().expect("a turn").end();
            turns.extend(take(&gate, 1));
            assert_eq!(gate.now(), (3, 3));
        }
        assert!(gate.turn().now_or_never().is_none());
    }

    #[test]
    fn each_answer_widens_the_window_up_to_its_cap() {
        let gate = PresenceGate::new(PresenceWindow::new(2, Some(5)));
        let mut turns = take(&gate, 2);
        assert!(gate.turn().now_or_never().is_none());
        // One answer: one turn back and one more.
        turns.pop().expect("a turn").end();
        turns.extend(take(&gate, 2));
        assert_eq!(gate.now(), (3, 3));
        assert!(gate.turn().now_or_never().is_none());
        for _ in 0..10 {
            turns.pop().expect("a turn").end();
            while let Some(t) = gate.turn().now_or_never() {
                turns.push(t);
            }
        }
        assert_eq!(gate.now(), (5, 5), "capped");
    }

    #[test]
    fn an_abandoned_check_does_not_widen_the_window() {
        let gate = PresenceGate::new(PresenceWindow::new(2, None));
        let mut turns = take(&gate, 2);
        drop(turns.pop());
        assert_eq!(gate.now(), (1, 2));
        turns.extend(take(&gate, 1));
        assert!(gate.turn().now_or_never().is_none());
    }

    #[test]
    fn the_window_shrinks_back_once_nothing_is_in_flight() {
        let gate = PresenceGate::new(PresenceWindow::new(2, None));
        let mut turns = take(&gate, 2);
        for _ in 0..6 {
            turns.pop().expect("a turn").end();
            while let Some(t) = gate.turn().now_or_never() {
                turns.push(t);
            }
        }
        assert!(gate.now().1 > 2, "grown: {:?}", gate.now());
        for t in turns.drain(..) {
            t.end();
        }
        assert_eq!(gate.now(), (0, 2), "idle: back to its start");
        let _held = take(&gate, 2);
        assert!(gate.turn().now_or_never().is_none());
    }

    #[tokio::test]
    async fn waiters_get_their_turns_in_arrival_order() {
        let gate = PresenceGate::new(PresenceWindow::fixed(1));
        let first = gate.turn().await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let waiters: Vec<_> = (0..5)
            .map(|i| {
                let (gate, order) = (gate.clone(), order.clone());
                tokio::spawn(async move {
                    let t = gate.turn().await;
                    order.lock().map(|mut o| o.push(i)).ok();
                    t.end();
                })
            })
            .collect();
        // Let every waiter queue up, in spawn order.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        first.end();
        for w in waiters {
            w.await.expect("waiter");
        }
        assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3, 4]);
        assert_eq!(gate.now(), (0, 1));
    }

    #[tokio::test]
    async fn a_waiter_that_goes_away_passes_its_turn_on() {
        let gate = PresenceGate::new(PresenceWindow::fixed(1));
        let first = gate.turn().await;
        // Gone before its turn comes.
        let mut gone = Box::pin(gate.turn());
        assert!((&mut gone).now_or_never().is_none());
        let next = tokio::spawn({
            let gate = gate.clone();
            async move { gate.turn().await.end() }
        });
        tokio::task::yield_now().await;
        drop(gone);
        first.end();
        next.await.expect("the next waiter got the turn");
        assert_eq!(gate.now(), (0, 1));
        // Handed a turn, then gone before seeing it: the turn comes back.
        let first = gate.turn().await;
        let mut late = Box::pin(gate.turn());
        assert!((&mut late).now_or_never().is_none());
        first.end();
        drop(late);
        assert_eq!(gate.now(), (0, 1));
        take(&gate, 1);
    }
}
