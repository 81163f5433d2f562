//! Files that come from outside — configuration, KubeletConfiguration, fault
//! plans, credential-provider configs, docker config files, kubeconfigs,
//! pull Secret manifests — are read only when they are regular files no
//! larger than a limit: `/dev/zero`, a FIFO or a runaway file is refused
//! naming what was wrong, instead of being read without end (or blocking
//! on a FIFO until a writer comes).

use std::io::Read;
use std::path::Path;

/// The limit for configuration-like files (4 MiB: a kubelet configuration
/// or a docker config with hundreds of registries is a few KiB).
pub const CONFIG_FILE_LIMIT: u64 = 4 << 20;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum InputFileError {
    /// Reading it failed (missing, no permission, not UTF-8 where text is needed).
    #[error("cannot read it: {0}")]
    Io(#[from] std::io::Error),
    /// A device, FIFO, socket or directory.
    #[error("not a regular file")]
    NotRegular,
    /// Larger than the limit.
    #[error("larger than {limit} bytes")]
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
}

impl InputFileError {
    /// Whether the file does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, InputFileError::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Checks that `path` is a regular file of at most `limit` bytes, without
/// reading it (for readers that open the file themselves).
pub fn check(path: &Path, limit: u64) -> Result<(), InputFileError> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(InputFileError::NotRegular);
    }
    if meta.len() > limit {
        return Err(InputFileError::TooLarge { limit });
    }
    Ok(())
}

/// Reads `path` if it is a regular file of at most `limit` bytes. The read
/// itself stops after `limit + 1` bytes, so a file that grows meanwhile is
/// refused too.
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, InputFileError> {
    // stat before open: opening a FIFO would block until a writer comes.
    check(path, limit)?;
    let file = std::fs::File::open(path)?;
    if !file.metadata()?.is_file() {
        return Err(InputFileError::NotRegular);
    }
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(InputFileError::TooLarge { limit });
    }
    Ok(bytes)
}

/// [`read`] as UTF-8 text.
pub fn read_to_string(path: &Path, limit: u64) -> Result<String, InputFileError> {
    String::from_utf8(read(path, limit)?)
        .map_err(|e| InputFileError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_fifos_directories_and_large_files_are_refused_by_name() {
        assert!(matches!(read(Path::new("/dev/zero"), 10), Err(InputFileError::NotRegular)));
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(read(dir.path(), 10), Err(InputFileError::NotRegular)));
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(read(&fifo, 10).unwrap_err().to_string(), "not a regular file", "refused without blocking");
        let big = dir.path().join("big");
        std::fs::write(&big, [b'x'; 11]).unwrap();
        assert_eq!(read(&big, 10).unwrap_err().to_string(), "larger than 10 bytes");
        assert_eq!(read(&big, 11).unwrap().len(), 11);
        let missing = read(&dir.path().join("none"), 10).unwrap_err();
        assert!(missing.is_not_found() && missing.to_string().starts_with("cannot read it: "), "{missing}");
        std::fs::write(&big, [0xff, 0xfe]).unwrap();
        assert!(read_to_string(&big, 10).is_err(), "not UTF-8");
    }
}
