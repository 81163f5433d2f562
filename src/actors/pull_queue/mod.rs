//! The pull queue: admits image pull requests, merges duplicates
//! (single-flight), orders them by priority, and runs them through the CRI
//! gateway one at a time (serial mode) or up to a token limit (parallel
//! mode), under the registry throttle and an optional deadline.

mod actor;
mod messages;
mod pull_task;
pub mod queue;
mod records_due;
mod size_offers;
mod stalls;
pub mod throttle;

pub use actor::{DEFAULT_STALL_WARNING, PullQueueActor, PullQueueSettings};
pub use messages::{
    EnqueuePull, GetQueueStatus, ImageSize, ListPulls, ListSlowDownloads, PullFailure, PullInfo, PullOutcome,
    PullPhase, PullPhaseChanged, PullPod, PullRequest, PullResult, PullStage, PullTicket, QueueStatus, SubscribePhases,
    UpdateConcurrency, UpdatePullLimits, UpdatePullThrottle, UpdatePullWatch, UpdateRegistryLimits,
};
pub use pull_task::Retries;
pub use queue::{Concurrency, registry_of};
pub use records_due::{RecordDue, RecordsDue};
pub use size_offers::{OFFER_WAIT, SizeOffers};
pub use throttle::{RegistryRate, ThrottleMode};

/// The one text form of the mode (status, metrics labels, logs): `serial`,
/// `parallel(N)`, `parallel(unlimited)`.
impl std::fmt::Display for Concurrency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Concurrency::Serial => f.write_str("serial"),
            Concurrency::Parallel(Some(n)) => write!(f, "parallel({n})"),
            Concurrency::Parallel(None) => f.write_str("parallel(unlimited)"),
        }
    }
}

#[cfg(test)]
mod display_tests {
    use super::Concurrency;

    #[test]
    fn one_text_form_of_the_mode() {
        assert_eq!(Concurrency::Serial.to_string(), "serial");
        assert_eq!(Concurrency::Parallel(Some(4)).to_string(), "parallel(4)");
        assert_eq!(Concurrency::Parallel(None).to_string(), "parallel(unlimited)");
    }
}
