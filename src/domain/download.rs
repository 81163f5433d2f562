//! Downloads the runtime has in progress (containerd's ingests): how far a
//! pull has got, and whether it has stopped moving. CRI has no progress;
//! containerd's content service lists every blob being written, on the same
//! socket. An ingest is not tied to an image: a pull writes one per blob it
//! fetches (`layer-sha256:…`, `manifest-sha256:…`), and any other client in
//! the namespace can write one too.

use std::time::{Duration, SystemTime};

/// One blob being written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Download {
    /// The ingest's key (`layer-sha256:…` for a pull's layer).
    pub reference: String,
    /// The digest the blob must have, when the writer said.
    pub digest: String,
    /// Bytes written so far.
    pub offset: u64,
    /// Expected size; 0 when unknown.
    pub total: u64,
    /// When the write began.
    pub started: SystemTime,
    /// The last write to it.
    pub updated: SystemTime,
}

impl Download {
    /// How long no byte has been written to it, as of `now` (zero when
    /// the runtime's clock is ahead of ours).
    pub fn idle(&self, now: SystemTime) -> Duration {
        now.duration_since(self.updated).unwrap_or_default()
    }

    /// Whether it has not moved for `after` or longer, as of `now`.
    pub fn stalled(&self, now: SystemTime, after: Duration) -> bool {
        self.idle(now) >= after
    }
}

/// The bytes written and expected over `downloads` (a pull's progress when
/// they are all its own); the expected sum counts unknown totals as what
/// was written so far.
pub fn progress(downloads: &[Download]) -> (u64, u64) {
    downloads
        .iter()
        .fold((0, 0), |(done, total), d| (done.saturating_add(d.offset), total.saturating_add(d.total.max(d.offset))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn download(offset: u64, total: u64, updated: u64) -> Download {
        Download {
            reference: "layer-sha256:ab".into(),
            digest: "sha256:ab".into(),
            offset,
            total,
            started: at(0),
            updated: at(updated),
        }
    }

    #[test]
    fn a_download_is_stalled_once_it_has_not_moved_for_the_whole_span() {
        let d = download(10, 100, 100);
        assert_eq!(d.idle(at(130)), Duration::from_secs(30));
        assert!(!d.stalled(at(159), Duration::from_secs(60)));
        assert!(d.stalled(at(160), Duration::from_secs(60)));
    }

    #[test]
    fn a_runtime_clock_ahead_of_ours_reads_as_just_moved() {
        let d = download(10, 100, 200);
        assert_eq!(d.idle(at(100)), Duration::ZERO);
        assert!(!d.stalled(at(100), Duration::from_secs(1)));
    }

    #[test]
    fn progress_sums_and_counts_an_unknown_total_as_written_so_far() {
        assert_eq!(progress(&[]), (0, 0));
        assert_eq!(progress(&[download(10, 100, 0), download(5, 0, 0)]), (15, 105));
        assert_eq!(progress(&[download(u64::MAX, u64::MAX, 0), download(1, 1, 0)]), (u64::MAX, u64::MAX));
    }
}
