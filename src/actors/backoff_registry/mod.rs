//! The backoff registry: decides whether an image may be pulled now for a
//! pod, after earlier failures, with the kubelet's image pull back-off
//! (10 s doubling to 300 s per pod and requested image, forgotten after
//! 600 s idle, no jitter).
//!
//! The logic is [`BackoffTable`], a plain struct driven by explicit `now`
//! instants; [`BackoffRegistryActor`] is its actix shell, which reads
//! `tokio::time::Instant::now()` per message and can run the table's GC on a
//! timer. The pull pipeline sends [`CheckBackoff`] before a pull,
//! [`BeginAttempt`] when it really pulls, then [`RecordFailure`] or
//! [`RecordSuccess`] (through a [`BackoffPort`], the recipients of those
//! messages); operators use [`ClearBackoff`] and [`ListBackoffs`].
//! The table lives in memory only: a restart forgets every back-off, as the
//! kubelet does.

mod actor;
mod messages;
mod settings;
mod table;
#[cfg(test)]
mod tests;

pub use actor::BackoffRegistryActor;
pub use messages::{
    BackoffCheck, BackoffOccupancy, BackoffPort, BeginAttempt, CheckBackoff, ClearBackoff, ListBackoffs, RecordFailure,
    RecordSuccess, RegistryRecovered, UpdateBackoffDelays,
};
pub use settings::BackoffSettings;
pub use table::{
    BackoffDelays, BackoffKey, BackoffTable, BackoffView, ClearScope, DEFAULT_INITIAL, DEFAULT_MAX, InvalidBackoff,
};
