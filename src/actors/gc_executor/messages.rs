//! The GC executor's messages (the private timer tick is in `actor.rs`).

use std::sync::Arc;

use actix::Message;

use super::report::{GcError, GcReport};
use crate::gc::policy::{GcPolicy, ProtectionRules};

/// Runs GC now (threshold mode); `dry_run` plans without removing.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<Arc<GcReport>, GcError>")]
pub struct RunGc {
    /// Plan only.
    pub dry_run: bool,
}

/// Disk-pressure reclaim: removes every unused image old enough (min age
/// still applies), whatever the thresholds.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<Arc<GcReport>, GcError>")]
pub struct DeleteUnusedImages {
    /// Plan only.
    pub dry_run: bool,
}

/// The last report (of a non-dry run), if any.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Option<Arc<GcReport>>")]
pub struct GetLastGcReport;

/// Replaces the policy and protection rules (a configuration reload). Takes
/// effect from the next run; a run going on finishes with the old ones.
/// Enabling a disabled GC runs it at once; the periodic timer runs all along.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct UpdateGcPolicy {
    /// Thresholds and ages.
    pub policy: GcPolicy,
    /// Pinned patterns and retention (the sandbox image id is kept).
    pub rules: ProtectionRules,
}
