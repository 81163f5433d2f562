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
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

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
    window: usize,
    /// Turns being held.
    in_flight: usize,
    /// Every turn given since the oldest one still held, in the order given
    /// (so by start time): its start while held, `None` once ended.
    turns: VecDeque<Option<Instant>>,
    /// The number of `turns[0]`: a turn's number minus it is its index.
    first: u64,
    /// Checks waiting for a turn, in arrival order; each is sent the number
    /// of the turn it is given.
    waiting: VecDeque<oneshot::Sender<u64>>,
}

impl State {
    /// Gives the next turn, started `now`; its number.
    fn give(&mut self, now: Instant) -> u64 {
        self.in_flight += 1;
        self.turns.push_back(Some(now));
        self.first + (self.turns.len() as u64 - 1)
    }

    /// Ends turn `n` if it is still held; whether it was.
    fn end(&mut self, n: u64) -> bool {
        let held = n
            .checked_sub(self.first)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.turns.get_mut(i))
            .and_then(Option::take)
            .is_some();
        if held {
            self.in_flight -= 1;
        }
        held
    }

    /// `by` more turns, up to `cap`.
    fn widen(&mut self, by: usize, cap: usize) {
        self.window = self.window.saturating_add(by).min(cap);
    }

    /// When the oldest turn still held started.
    fn oldest(&self) -> Option<Instant> {
        self.turns.iter().flatten().next().copied()
    }
}

/// Hands out turns for presence checks. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct PresenceGate {
    shape: PresenceWindow,
    /// How long a check may hold its turn: a turn held longer is ended (as
    /// answered: the window grows) when the next check comes or a waiting
    /// one has waited for it, so a runtime that stops answering cannot hold
    /// up the other checks. Checked by those, not timed per check: a check
    /// that is not kept waiting costs no timer.
    hold: Duration,
    state: Arc<Mutex<State>>,
}

/// A check's turn; ended with [`Turn::end`] (the window grows) or by
/// dropping it (a check abandoned by its caller: the window does not grow).
#[derive(Debug)]
pub(crate) struct Turn {
    gate: PresenceGate,
    /// Its number; `None` once ended.
    n: Option<u64>,
}

impl Turn {
    /// The check was answered (successfully or not): its turn ends and the
    /// window grows by one.
    pub(crate) fn end(mut self) {
        if let Some(n) = self.n.take() {
            self.gate.release(n, true);
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(n) = self.n.take() {
            self.gate.release(n, false);
        }
    }
}

/// A wait for a turn; a turn handed to a wait that is dropped before it sees
/// it is passed on.
struct Waiting {
    gate: PresenceGate,
    rx: oneshot::Receiver<u64>,
    /// Its turn was seen (and is now a [`Turn`]'s to end).
    seen: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.seen
            && let Ok(n) = self.rx.try_recv()
        {
            self.gate.release(n, false);
        }
    }
}

impl PresenceGate {
    pub(crate) fn new(shape: PresenceWindow, hold: Duration) -> Self {
        let state =
            State { window: shape.start, in_flight: 0, turns: VecDeque::new(), first: 0, waiting: VecDeque::new() };
        Self { shape, hold, state: Arc::new(Mutex::new(state)) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain counters: a poisoned lock is still consistent enough to use.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for a turn, in arrival order.
    pub(crate) async fn turn(&self) -> Turn {
        let now = Instant::now();
        let rx = {
            let mut st = self.lock();
            self.expire(&mut st, now);
            if st.waiting.is_empty() && st.in_flight < st.window {
                let n = st.give(now);
                return Turn { gate: self.clone(), n: Some(n) };
            }
            let (tx, rx) = oneshot::channel();
            st.waiting.push_back(tx);
            rx
        };
        let mut wait = Waiting { gate: self.clone(), rx, seen: false };
        let got = loop {
            // Wait until the oldest turn held has held it too long, then end it.
            let overdue = self.lock().oldest().map(|t| t + self.hold);
            match overdue {
                Some(at) => match tokio::time::timeout_at(at, &mut wait.rx).await {
                    Ok(got) => break got,
                    Err(_) => {
                        let mut st = self.lock();
                        self.expire(&mut st, Instant::now());
                    }
                },
                None => break (&mut wait.rx).await,
            }
        };
        wait.seen = true;
        // The gate never drops a waiter's sender without a turn: a closed
        // channel cannot happen, and would only mean "go on" (uncounted).
        Turn { gate: self.clone(), n: got.ok() }
    }

    fn release(&self, n: u64, grow: bool) {
        let mut st = self.lock();
        if st.end(n) && grow {
            st.widen(1, self.shape.cap);
        }
        self.settle(&mut st);
    }

    /// Ends the turns held for `hold` or longer at `now` (as answered), and
    /// hands out what is free.
    fn expire(&self, st: &mut State, now: Instant) {
        let mut ended = 0;
        for t in &mut st.turns {
            match *t {
                Some(start) if start + self.hold <= now => {
                    *t = None;
                    ended += 1;
                }
                Some(_) => break,
                None => {}
            }
        }
        if ended > 0 {
            st.in_flight -= ended;
            st.widen(ended, self.shape.cap);
            self.settle(st);
        }
    }

    /// Forgets ended turns at the front, shrinks an idle window back to its
    /// start and hands free turns to waiters in arrival order.
    fn settle(&self, st: &mut State) {
        if st.in_flight == 0 && st.waiting.is_empty() {
            st.window = self.shape.start;
        }
        // The clock is read only when a turn is handed on.
        let mut now = None;
        while st.in_flight < st.window {
            let Some(next) = st.waiting.pop_front() else { break };
            let n = st.give(*now.get_or_insert_with(Instant::now));
            // A waiter that went away takes no turn.
            if next.send(n).is_err() {
                st.end(n);
            }
        }
        // Forget the ended turns in front of the oldest one still held.
        while st.turns.front().is_some_and(Option::is_none) {
            st.turns.pop_front();
            st.first += 1;
        }
    }

    /// Checks in flight and the window now (for tests).
    #[cfg(test)]
    fn now(&self) -> (usize, usize) {
        let st = self.lock();
        (st.in_flight, st.window)
    }

    /// Turns remembered (held, or ended behind one still held), for tests.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.lock().turns.len()
    }
}

#[cfg(test)]
#[allow(clippy::pedantic)] // test code: pedantic lints are for what ships
mod tests {
    use super::*;
    use futures_util::FutureExt;

    const HOLD: Duration = Duration::from_millis(50);

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

    #[tokio::test]
    async fn a_fixed_window_never_grows() {
        let gate = PresenceGate::new(PresenceWindow::fixed(3), HOLD);
        let mut turns = take(&gate, 3);
        assert!(gate.turn().now_or_never().is_none(), "the fourth check waits");
        for _ in 0..10 {
            turns.pop().expect("a turn").end();
            turns.extend(take(&gate, 1));
            assert_eq!(gate.now(), (3, 3));
        }
        assert!(gate.turn().now_or_never().is_none());
    }

    #[tokio::test]
    async fn each_answer_widens_the_window_up_to_its_cap() {
        let gate = PresenceGate::new(PresenceWindow::new(2, Some(5)), HOLD);
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

    #[tokio::test]
    async fn an_abandoned_check_does_not_widen_the_window() {
        let gate = PresenceGate::new(PresenceWindow::new(2, None), HOLD);
        let mut turns = take(&gate, 2);
        drop(turns.pop());
        assert_eq!(gate.now(), (1, 2));
        turns.extend(take(&gate, 1));
        assert!(gate.turn().now_or_never().is_none());
    }

    #[tokio::test]
    async fn the_window_shrinks_back_once_nothing_is_in_flight() {
        let gate = PresenceGate::new(PresenceWindow::new(2, None), HOLD);
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
        let gate = PresenceGate::new(PresenceWindow::fixed(1), HOLD);
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
        let gate = PresenceGate::new(PresenceWindow::fixed(1), HOLD);
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

    #[tokio::test(start_paused = true)]
    async fn a_turn_held_too_long_is_ended_when_the_next_check_comes() {
        let gate = PresenceGate::new(PresenceWindow::fixed(1), HOLD);
        let _hung = gate.turn().await;
        assert!(gate.turn().now_or_never().is_none(), "held");
        tokio::time::advance(HOLD).await;
        // Overdue: the next check ends it and takes the turn at once.
        let next = gate.turn().now_or_never().expect("the hung turn was ended");
        assert_eq!(gate.now(), (1, 1));
        next.end();
        drop(_hung);
        assert_eq!(gate.now(), (0, 1), "the late end of an ended turn changes nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_check_gets_its_turn_when_the_turn_it_waits_on_is_overdue() {
        let gate = PresenceGate::new(PresenceWindow::new(1, None), HOLD);
        let _hung = gate.turn().await;
        tokio::time::advance(Duration::from_millis(20)).await;
        let t = Instant::now();
        let turn = gate.turn().await;
        // It waited what was left of the hung turn's hold, no more.
        assert_eq!(t.elapsed(), Duration::from_millis(30));
        // The hung turn counts as answered: the window grew.
        assert_eq!(gate.now(), (1, 2));
        turn.end();
        assert_eq!(gate.now(), (0, 1), "idle: back to its start");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_turn_is_not_remembered_forever() {
        let gate = PresenceGate::new(PresenceWindow::new(4, None), HOLD);
        let _hung = gate.turn().await;
        for _ in 0..100 {
            gate.turn().await.end();
        }
        // Every turn after the hung one is remembered while it is held...
        assert_eq!(gate.remembered(), 101);
        tokio::time::advance(HOLD).await;
        // ...and forgotten once it is overdue and the next check comes.
        gate.turn().await.end();
        assert_eq!(gate.remembered(), 0);
        assert_eq!(gate.now(), (0, 4));
    }
}
