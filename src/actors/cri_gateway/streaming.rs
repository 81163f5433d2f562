//! Whether to list images with `StreamImages` (KEP-5825): tried while the
//! runtime offers it; after an `Unimplemented` answer `ListImages` is used,
//! and the stream tried again once [`REPROBE_AFTER`] has passed (a runtime
//! upgraded in place gains it without imaged restarting). No actix, no I/O.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// How long a runtime that answered `Unimplemented` is not asked again.
pub const REPROBE_AFTER: Duration = Duration::from_secs(600);

/// Shared by the gateway's calls (cloning shares it).
#[derive(Debug, Clone, Default)]
pub struct Streaming {
    /// When the runtime last answered `Unimplemented`; `None`: try the stream.
    refused_at: Arc<Mutex<Option<Instant>>>,
}

impl Streaming {
    fn refused(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.refused_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether this listing tries `StreamImages` first.
    pub fn should_try(&self) -> bool {
        self.refused().is_none_or(|at| at.elapsed() >= REPROBE_AFTER)
    }

    /// The runtime answered a stream.
    pub fn offered(&self) {
        *self.refused() = None;
    }

    /// The runtime answered `Unimplemented`: `ListImages` until [`REPROBE_AFTER`].
    pub fn not_offered(&self) {
        let mut at = self.refused();
        if at.is_none() {
            tracing::info!("the runtime does not serve StreamImages; listing images with ListImages");
        }
        *at = Some(Instant::now());
    }

    /// Whether the last answer was `Unimplemented`.
    #[cfg(test)]
    pub fn refused_by_runtime(&self) -> bool {
        self.refused().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_unimplemented_stream_is_asked_again_only_after_a_while() {
        let s = Streaming::default();
        assert!(s.should_try() && !s.refused_by_runtime());
        s.not_offered();
        assert!(!s.should_try() && s.refused_by_runtime());
        tokio::time::advance(REPROBE_AFTER.saturating_sub(Duration::from_secs(1))).await;
        assert!(!s.should_try());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(s.should_try(), "probed again");
        s.offered();
        assert!(s.should_try() && !s.refused_by_runtime());
    }
}
