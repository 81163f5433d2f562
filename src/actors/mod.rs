//! The actors. Each one's contract (mailbox, messages, timers, failure and
//! shutdown policy) is written down in `actors.md` at the repository root.

pub mod backoff_registry;
pub mod cache_refresher;
pub mod cri_gateway;
pub mod detector;
pub mod gc_executor;
pub mod pull_queue;
