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
    /// `statvfs(2)` on the reported mountpoint (a runtime on this host).
    /// When the mountpoint is not on this host (it does not exist, or is
    /// not a directory: a runtime in another mount namespace, or a
    /// separately served embedded runtime), CRI says only what images use
    /// (`FilesystemUsage` has no capacity field): then the capacity is
    /// `remote_capacity` (`gc.image_fs_capacity`) and available = capacity −
    /// the used bytes `ImageFsInfo` reported; without it, measuring fails
    /// naming the mountpoint and the key.
    Statvfs {
        /// The capacity to assume when the mountpoint is not on this host.
        remote_capacity: Option<u64>,
    },
    /// A capacity from a function; available = capacity − the used bytes
    /// `ImageFsInfo` reported (the embedded runtime's simulated filesystem,
    /// and tests).
    Simulated(Arc<dyn Fn() -> u64 + Send + Sync>),
}

impl fmt::Debug for CapacitySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CapacitySource::Statvfs { remote_capacity } => {
                f.debug_struct("Statvfs").field("remote_capacity", remote_capacity).finish()
            }
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
        self.measure_with_origin(usage).map(|(c, _)| c)
    }

    /// [`CapacitySource::measure`], and how it measured.
    pub fn measure_with_origin(&self, usage: &FilesystemUsage) -> Result<(FsCapacity, MeasuredBy), String> {
        match self {
            CapacitySource::Simulated(capacity) => Ok((from_used(capacity(), usage), MeasuredBy::Simulated)),
            CapacitySource::Statvfs { remote_capacity } => {
                if usage.mountpoint.is_empty() {
                    return Err("the runtime reported no mountpoint for its image filesystem".into());
                }
                match nix::sys::statvfs::statvfs(usage.mountpoint.as_str()) {
                    // fsblkcnt_t and c_ulong are u32 on 32-bit targets.
                    #[allow(clippy::unnecessary_cast)]
                    Ok(st) => {
                        let frsize = st.fragment_size() as u64;
                        let c = FsCapacity {
                            capacity: (st.blocks() as u64).saturating_mul(frsize),
                            available: (st.blocks_available() as u64).saturating_mul(frsize),
                        };
                        Ok((c, MeasuredBy::Statvfs { mountpoint: usage.mountpoint.clone() }))
                    }
                    Err(e @ (nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR)) => match remote_capacity {
                        Some(capacity) => Ok((
                            from_used(*capacity, usage),
                            MeasuredBy::Reported { mountpoint: usage.mountpoint.clone(), capacity: *capacity },
                        )),
                        None => Err(format!(
                            "statvfs {}: {e}: the runtime's image filesystem is not on this host, and CRI \
                             ImageFsInfo reports only the bytes images use, not the capacity; set \
                             gc.image_fs_capacity to its size in bytes",
                            usage.mountpoint
                        )),
                    },
                    Err(e) => Err(format!("statvfs {}: {e}", usage.mountpoint)),
                }
            }
        }
    }
}

/// `capacity`, and available = capacity − what `ImageFsInfo` says images use.
fn from_used(capacity: u64, usage: &FilesystemUsage) -> FsCapacity {
    let used = usage.used_bytes.unwrap_or(0);
    FsCapacity { capacity, available: capacity.saturating_sub(used) }
}

/// How [`CapacitySource::measure_with_origin`] measured the image
/// filesystem (shown in GC reports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeasuredBy {
    /// `statvfs` on the mountpoint, on this host.
    Statvfs {
        /// The mountpoint.
        mountpoint: String,
    },
    /// The mountpoint is not on this host: `ImageFsInfo`'s used bytes and
    /// `gc.image_fs_capacity`.
    Reported {
        /// The mountpoint the runtime reported.
        mountpoint: String,
        /// The configured capacity.
        capacity: u64,
    },
    /// The embedded runtime's simulated filesystem (or a test's capacity).
    Simulated,
}

impl fmt::Display for MeasuredBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MeasuredBy::Statvfs { mountpoint } => write!(f, "statvfs {mountpoint}"),
            MeasuredBy::Reported { mountpoint, capacity } => write!(
                f,
                "ImageFsInfo used bytes, capacity {capacity} bytes from gc.image_fs_capacity ({mountpoint} is not on this host)"
            ),
            MeasuredBy::Simulated => f.write_str("the embedded runtime's simulated filesystem"),
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
        let local = CapacitySource::Statvfs { remote_capacity: None };
        let (c, by) = local.measure_with_origin(&usage(dir.to_str().unwrap(), 0)).unwrap();
        assert!(c.capacity > 0 && c.available <= c.capacity);
        assert_eq!(by, MeasuredBy::Statvfs { mountpoint: dir.to_str().unwrap().into() });
        let e = local.measure(&usage("/definitely/not/here", 0)).unwrap_err();
        assert!(e.contains("/definitely/not/here") && e.contains("gc.image_fs_capacity"), "{e}");
        assert!(local.measure(&usage("", 0)).is_err());
    }

    #[test]
    fn a_mountpoint_not_on_this_host_uses_the_reported_bytes_and_the_configured_capacity() {
        let remote = CapacitySource::Statvfs { remote_capacity: Some(1_000) };
        let (c, by) = remote.measure_with_origin(&usage("/definitely/not/here", 300)).unwrap();
        assert_eq!(c, FsCapacity { capacity: 1_000, available: 700 });
        assert_eq!(by, MeasuredBy::Reported { mountpoint: "/definitely/not/here".into(), capacity: 1_000 });
        assert!(by.to_string().contains("not on this host"), "{by}");
        // A file where a directory should be is "not on this host" too.
        let file = tempfile::NamedTempFile::new().unwrap();
        let below = format!("{}/x", file.path().display());
        assert!(matches!(remote.measure_with_origin(&usage(&below, 0)).unwrap().1, MeasuredBy::Reported { .. }));
        // A local mountpoint is still measured, whatever is configured.
        let dir = std::env::temp_dir();
        let (_, by) = remote.measure_with_origin(&usage(dir.to_str().unwrap(), 0)).unwrap();
        assert!(matches!(by, MeasuredBy::Statvfs { .. }), "{by:?}");
    }
}
