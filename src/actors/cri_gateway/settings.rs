//! The CRI gateway's settings (validated from `[runtime]` by `config`).

use std::time::Duration;

use crate::cri::Rpc;
use crate::metrics::Metrics;

/// Per-RPC deadlines; `None` = no deadline. Read on every call: indexed
/// by the RPC, not hashed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriDeadlines {
    deadlines: [Option<Duration>; Rpc::ALL.len()],
}

impl CriDeadlines {
    /// Every call gets `d` (tests and embedders).
    pub fn uniform(d: Option<Duration>) -> Self {
        Self { deadlines: [d; Rpc::ALL.len()] }
    }

    /// The deadline of one call kind.
    pub fn get(&self, rpc: Rpc) -> Option<Duration> {
        self.deadlines[rpc as usize]
    }

    /// Sets one call kind's deadline.
    #[must_use]
    pub fn with(mut self, rpc: Rpc, d: Option<Duration>) -> Self {
        self.deadlines[rpc as usize] = d;
        self
    }
}

/// The CRI gateway's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriSettings {
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// How long to retry `Version` at start.
    pub startup_timeout: Duration,
    /// Gateway mailbox capacity.
    pub mailbox_capacity: usize,
    /// Per-call deadlines.
    pub deadlines: CriDeadlines,
    /// Where the gateway reports call latencies and errors.
    pub metrics: Metrics,
}

impl Default for CriSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            startup_timeout: Duration::from_secs(30),
            mailbox_capacity: 256,
            deadlines: CriDeadlines::uniform(Some(Duration::from_secs(120)))
                .with(Rpc::PullImage, None)
                .with(Rpc::ListStatuses, Some(super::DOWNLOADS_DEADLINE)),
            metrics: Metrics::default(),
        }
    }
}
