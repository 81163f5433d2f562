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

    /// Whether it has stalled as of `now`: no byte written for `after`, or,
    /// with a floor (`min_rate` bytes a second, `pull.min_download_rate`),
    /// fewer bytes than the floor asks since `anchor`, an earlier reading
    /// of it (time, offset) at least `after` ago and not before its start.
    /// Without such a reading the rate is not judged: its start is no
    /// baseline, as containerd keeps the start of an ingest an abandoned
    /// pull left and a new pull resumes, so an average since then would
    /// count the time it lay idle.
    pub fn stall(
        &self,
        now: SystemTime,
        after: Duration,
        min_rate: u64,
        anchor: Option<(SystemTime, u64)>,
    ) -> Option<Stall> {
        if self.stalled(now, after) {
            return Some(Stall::Idle(self.idle(now)));
        }
        if min_rate == 0 {
            return None;
        }
        let latest = now.checked_sub(after)?;
        let (at, offset) = anchor.filter(|(at, _)| *at <= latest && *at >= self.started)?;
        let over = now.duration_since(at).ok()?;
        let moved = self.offset.saturating_sub(offset);
        #[allow(clippy::cast_precision_loss)]
        let floor = min_rate as f64 * over.as_secs_f64();
        #[allow(clippy::cast_precision_loss)]
        ((moved as f64) < floor).then_some(Stall::Slow { moved, over })
    }
}

/// Why a download counts as stalled (see [`Download::stall`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stall {
    /// No byte written for this long.
    Idle(Duration),
    /// Only `moved` bytes written over the last `over`, under the floor.
    Slow {
        /// Bytes written over the span.
        moved: u64,
        /// The span (at least the stall time).
        over: Duration,
    },
}

impl Stall {
    /// What it did, for a log line or an error: "wrote no byte for 1m0s"
    /// or "wrote 12000 bytes in 1m0s, under pull.min_download_rate
    /// (1024 bytes/s)".
    pub fn text(&self, min_rate: u64) -> String {
        let go = |d: Duration| super::go_text::duration(Duration::from_millis(super::limits::millis(d)));
        match self {
            Self::Idle(idle) => format!("wrote no byte for {}", go(*idle)),
            Self::Slow { moved, over } => {
                format!("wrote {moved} bytes in {}, under pull.min_download_rate ({min_rate} bytes/s)", go(*over))
            }
        }
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
    fn a_download_under_the_floor_since_a_reading_at_least_the_stall_time_ago_is_slow() {
        let after = Duration::from_secs(60);
        // Started at 0, 6000 bytes by 100, written just now.
        let d = download(6000, 100_000, 100);
        assert_eq!(d.stall(at(100), after, 0, None), None, "no floor: moving is enough");
        // A reading at 30 (5000 bytes) is 70s old: 1000 bytes in 70s.
        let since_30 = Some((at(30), 5000));
        assert_eq!(
            d.stall(at(100), after, 20, since_30),
            Some(Stall::Slow { moved: 1000, over: Duration::from_secs(70) })
        );
        assert_eq!(d.stall(at(100), after, 14, since_30), None);
        // No reading, or one younger than the stall time: the rate is not
        // judged (its start is no baseline: a resumed ingest keeps an
        // abandoned pull's start, and 6000 bytes in 100s would read slow).
        assert_eq!(d.stall(at(100), after, 1_000_000, None), None);
        assert_eq!(d.stall(at(100), after, 1_000_000, Some((at(50), 5999))), None);
        // A reading from before its start (an ingest begun again) is not its own.
        let again = Download { started: at(20), ..d };
        assert_eq!(again.stall(at(100), after, 1_000_000, Some((at(10), 0))), None);
    }

    #[test]
    fn an_idle_download_is_idle_whatever_the_floor_and_both_read_as_go_text() {
        let d = download(6000, 100_000, 10);
        let idle = d.stall(at(100), Duration::from_secs(60), 1, None);
        assert_eq!(idle, Some(Stall::Idle(Duration::from_secs(90))));
        assert_eq!(idle.map(|s| s.text(1)).as_deref(), Some("wrote no byte for 1m30s"));
        let slow = Stall::Slow { moved: 1000, over: Duration::from_millis(70_500) };
        assert_eq!(slow.text(20), "wrote 1000 bytes in 1m10.5s, under pull.min_download_rate (20 bytes/s)");
    }

    #[test]
    fn progress_sums_and_counts_an_unknown_total_as_written_so_far() {
        assert_eq!(progress(&[]), (0, 0));
        assert_eq!(progress(&[download(10, 100, 0), download(5, 0, 0)]), (15, 105));
        assert_eq!(progress(&[download(u64::MAX, u64::MAX, 0), download(1, 1, 0)]), (u64::MAX, u64::MAX));
    }
}
