//! Where the image filesystem's capacity and free space come from. CRI's
//! `ImageFsInfo` says only what images use; like the kubelet (which asks
//! cAdvisor), imaged measures the filesystem behind the reported mountpoint,
//! or asks the embedded runtime for its simulated one.

use std::fmt;
use std::sync::Arc;

use crate::domain::FilesystemUsage;

/// Capacity and available bytes of the image filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsCapacity {
    /// Total bytes.
    pub capacity: u64,
    /// Bytes free for use.
    pub available: u64,
}

/// A source of [`FsCapacity`] for the filesystem `ImageFsInfo` reported.
#[derive(Clone)]
pub enum CapacitySource {
    /// `statvfs(2)` on the reported mountpoint (real runtimes).
    Statvfs,
    /// A capacity from a function; available = capacity − the used bytes
    /// `ImageFsInfo` reported (the embedded runtime's simulated filesystem,
    /// and tests).
    Simulated(Arc<dyn Fn() -> u64 + Send + Sync>),
}

impl fmt::Debug for CapacitySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CapacitySource::Statvfs => f.write_str("Statvfs"),
            CapacitySource::Simulated(_) => f.write_str("Simulated"),
        }
    }
}

impl CapacitySource {
    /// A fixed simulated capacity.
    pub fn fixed(capacity: u64) -> Self {
        CapacitySource::Simulated(Arc::new(move || capacity))
    }

    /// Measures the filesystem `usage` describes. Blocking for `Statvfs`
    /// (call it off the actor's thread).
    pub fn measure(&self, usage: &FilesystemUsage) -> Result<FsCapacity, String> {
        match self {
            CapacitySource::Simulated(capacity) => {
                let capacity = capacity();
                let used = usage.used_bytes.unwrap_or(0);
                Ok(FsCapacity { capacity, available: capacity.saturating_sub(used) })
            }
            CapacitySource::Statvfs => {
                if usage.mountpoint.is_empty() {
                    return Err("the runtime reported no mountpoint for its image filesystem".into());
                }
                let st = nix::sys::statvfs::statvfs(usage.mountpoint.as_str())
                    .map_err(|e| format!("statvfs {}: {e}", usage.mountpoint))?;
                let frsize = st.fragment_size() as u64;
                Ok(FsCapacity {
                    capacity: (st.blocks() as u64).saturating_mul(frsize),
                    available: (st.blocks_available() as u64).saturating_mul(frsize),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn usage(mountpoint: &str, used: u64) -> FilesystemUsage {
        FilesystemUsage {
            timestamp: SystemTime::now(),
            mountpoint: mountpoint.into(),
            used_bytes: Some(used),
            inodes_used: None,
        }
    }

    #[test]
    fn simulated_capacity_subtracts_what_images_use() {
        let c = CapacitySource::fixed(1_000).measure(&usage("", 300)).unwrap();
        assert_eq!(c, FsCapacity { capacity: 1_000, available: 700 });
        let over = CapacitySource::fixed(100).measure(&usage("", 300)).unwrap();
        assert_eq!(over.available, 0);
    }

    #[test]
    fn statvfs_measures_a_real_mountpoint_and_names_a_bad_one() {
        let dir = std::env::temp_dir();
        let c = CapacitySource::Statvfs.measure(&usage(dir.to_str().unwrap(), 0)).unwrap();
        assert!(c.capacity > 0 && c.available <= c.capacity);
        let e = CapacitySource::Statvfs.measure(&usage("/definitely/not/here", 0)).unwrap_err();
        assert!(e.contains("/definitely/not/here"), "{e}");
        assert!(CapacitySource::Statvfs.measure(&usage("", 0)).is_err());
    }
}
