//! The pull queue: admits image pull requests, merges duplicates
//! (single-flight), orders them by priority, and runs them through the CRI
//! gateway one at a time (serial mode) or up to a token limit (parallel
//! mode), under the registry throttle and an optional deadline.

mod actor;
mod messages;
pub mod queue;
pub mod throttle;

pub use actor::{PullQueueActor, PullQueueConfig};
pub use messages::{
    EnqueuePull, GetQueueStatus, ListPulls, PullFailure, PullInfo, PullOutcome, PullPhase, PullPhaseChanged,
    PullRequest, PullResult, PullStage, PullTicket, QueueStatus, SubscribePhases,
};
pub use queue::{Concurrency, registry_of};
pub use throttle::ThrottleMode;
