//! The GC executor: every `gc.gc_period` it measures the image filesystem,
//! asks the detector for a fresh detection, computes the kubelet's GC plan
//! (max-age pass, then the free-space pass down to the low threshold) with
//! an explanation for every image, removes the chosen images through the
//! CRI gateway, measures again, and reports. It also runs on demand
//! (`RunGc { dry_run }`) and for disk-pressure reclaim (`DeleteUnusedImages`).
//! After the removals of a run it prunes the KEP-2535 pulled records of
//! images the runtime no longer has (`PullRecords::prune_unknown_records`).
//!
//! - `executor.rs`: [`GcExecutor`], the state and decisions (no actix);
//! - `run.rs`: [`run_gc`], one run's I/O over [`GcPorts`];
//! - `actor.rs`: [`GcExecutorActor`], the thin actix shell;
//! - `report.rs`, `messages.rs`: what callers send and get back.

mod actor;
mod executor;
mod messages;
mod report;
mod run;
#[cfg(test)]
mod tests;

pub use actor::GcExecutorActor;
pub use executor::{GcExecutor, GcExecutorSettings, NodeEvent, RunEnd, RunSpec};
pub use messages::{DeleteUnusedImages, GetLastGcReport, RunGc, UpdateGcPolicy};
pub use report::{GcError, GcReport, KEPT_LISTED_PER_REASON, RemovedImage, ReportEntry};
pub use run::{GcPorts, run_gc};

pub use crate::gc::plan::GcMode;

/// The GC executor's mailbox capacity unless its settings say otherwise.
pub const DEFAULT_MAILBOX_CAPACITY: usize = 16;
