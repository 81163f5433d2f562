//! Image garbage collection logic: records, detection, the explainable GC
//! plan and the filesystem measurements it needs. Pure (but `capacity`,
//! which measures a filesystem); the actors in `crate::actors` run it.

pub mod capacity;
pub mod detect;
pub mod eviction;
pub mod in_use;
pub mod in_use_hints;
pub mod plan;
pub mod policy;
pub mod record;
