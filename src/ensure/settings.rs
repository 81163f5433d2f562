//! The ensure flow's settings (validated from `[pull]` and `[backoff]` by
//! `config`) and the presence-check window they ask for.

use std::time::Duration;

use super::PresenceWindow;

/// Settings of the ensure flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsureSettings {
    /// Append the error class (`(permanent)`/`(transient)`) to returned
    /// failure messages. Off by default: messages stay the kubelet's.
    pub annotate_error_class: bool,
    /// Beyond the kubelet: a request whose credentials differ from those of
    /// its key's last failed pull (a pull secret was added or changed) is not
    /// held in back-off; the back-off is reset and the pull goes ahead. Off
    /// by default: the kubelet waits out the back-off.
    pub reset_backoff_on_credential_change: bool,
    /// Beyond the kubelet: a pull that succeeds from a registry ends the
    /// back-offs of transient failures from that registry (an outage is
    /// over: its pods retry at once). Off by default: the kubelet waits.
    pub reset_backoff_on_registry_recovery: bool,
    /// Most presence checks (`ImageStatus` before deciding to pull) in
    /// flight at once; later ones wait their turn in arrival order (`None`
    /// = no limit, as the kubelet). A burst of requests is then answered in
    /// arrival order instead of all together, so the first pulls start
    /// sooner. Alone, a fixed limit; with
    /// [`presence_check_window`](Self::presence_check_window), the most the
    /// window grows to. A check holds its turn for at most
    /// [`PRESENCE_CHECK_HOLD`]: a runtime that stops answering cannot hold up
    /// the others longer.
    pub presence_check_concurrency: Option<usize>,
    /// A window of presence checks that grows as they are answered: it
    /// starts at this many checks in flight and each answer adds one (up to
    /// `presence_check_concurrency`, if set), so it doubles every round trip,
    /// and it is back at its start once no check is in flight. The first
    /// checks of a burst are answered first, as with a fixed limit, while a
    /// long burst of present images soon has its checks sent without waiting
    /// on round trips (`cargo bench --bench ensure` measures both). Only the
    /// timing of the checks changes, never an answer, event or message.
    /// [`DEFAULT_PRESENCE_CHECK_WINDOW`] by default; `None` = no window
    /// (only the fixed limit, if any; with neither, every check goes out at
    /// once, as the kubelet's).
    pub presence_check_window: Option<usize>,
}

/// `pull.presence_check_window` by default.
pub const DEFAULT_PRESENCE_CHECK_WINDOW: usize = 8;

impl Default for EnsureSettings {
    fn default() -> Self {
        Self {
            annotate_error_class: false,
            reset_backoff_on_credential_change: false,
            reset_backoff_on_registry_recovery: false,
            presence_check_concurrency: None,
            presence_check_window: Some(DEFAULT_PRESENCE_CHECK_WINDOW),
        }
    }
}

impl EnsureSettings {
    /// The window of presence-check turns these settings ask for, if any.
    pub fn presence_window(&self) -> Option<PresenceWindow> {
        match (self.presence_check_window, self.presence_check_concurrency) {
            (Some(start), cap) => Some(PresenceWindow::new(start, cap)),
            (None, Some(n)) => Some(PresenceWindow::fixed(n)),
            (None, None) => None,
        }
    }
}

/// How long one presence check may hold its turn (see
/// [`EnsureSettings::presence_check_window`]); a check still running then goes
/// on without it, and the window grows as if it had been answered.
pub const PRESENCE_CHECK_HOLD: Duration = Duration::from_millis(50);
