//! TEMPORARY stand-in for pull policies (replaced by the full module).
#![allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PullPolicy { Always, IfNotPresent, Never, AlwaysWithLocalFallback }
