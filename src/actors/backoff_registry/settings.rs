//! The backoff registry's settings (validated from `[backoff]` by `config`).

use std::time::Duration;

use super::BackoffDelays;
use crate::metrics::Metrics;

/// The backoff registry's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackoffSettings {
    /// Delays.
    pub delays: BackoffDelays,
    /// Periodic GC of expired entries (None = only after successful pulls).
    pub gc_interval: Option<Duration>,
    /// Mailbox capacity.
    pub mailbox_capacity: usize,
    /// Where the registry reports its size.
    pub metrics: Metrics,
}

impl Default for BackoffSettings {
    fn default() -> Self {
        Self {
            delays: BackoffDelays::default(),
            gc_interval: Some(Duration::from_secs(60)),
            mailbox_capacity: 1024,
            metrics: Metrics::default(),
        }
    }
}
