//! The stall check: which of the runtime's downloads have written no byte
//! for `pull.stall_warning` while pulls run, each warned of once per stall,
//! and which for `pull.stall_timeout`, which ends the pull's runtime call.
//! CRI has no progress; containerd lists its downloads (ingests) through
//! its content service, and each carries the time of its last write. A
//! download is not tied to an image, so the warning names the pulls
//! running, and the pull only when it is the one running; only a download
//! written since the pulls started counts (a partial ingest an earlier,
//! abandoned pull left behind is no stall of theirs).

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::cri::{CriError, StatusCode};
use crate::domain::Download;

/// How long a runtime that answered `Unimplemented` is not asked again.
pub(super) const UNSUPPORTED_RETRY: Duration = Duration::from_secs(600);

/// The check's state: what was warned of, and whether the runtime lists
/// downloads at all.
#[derive(Debug)]
pub(super) struct StallWatch {
    /// Idle this long is warned of (`None`: never).
    pub(super) warn_after: Option<Duration>,
    /// Idle this long ends the pull's call (`None`: never).
    pub(super) cancel_after: Option<Duration>,
    /// Downloads warned of that have not moved since (by ingest key).
    warned: HashSet<String>,
    /// A listing is on its way (one at a time).
    pub(super) checking: bool,
    /// Not asked before this: the runtime answered `Unimplemented`.
    unsupported_until: Option<Instant>,
    /// The runtime's refusal was logged (once per process).
    told_unsupported: bool,
}

/// What one listing found.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Review<'a> {
    /// Downloads idle for the warning time (else the cancel time) or
    /// longer now.
    pub(super) stalled: usize,
    /// Those among them not warned of before.
    pub(super) newly: Vec<&'a Download>,
    /// Downloads idle for the cancel time or longer.
    pub(super) past_cancel: Vec<&'a Download>,
}

impl StallWatch {
    /// A check, or none when both times are off.
    pub(super) fn new(warn_after: Option<Duration>, cancel_after: Option<Duration>) -> Option<Self> {
        (warn_after.is_some() || cancel_after.is_some()).then(|| Self {
            warn_after,
            cancel_after,
            warned: HashSet::new(),
            checking: false,
            unsupported_until: None,
            told_unsupported: false,
        })
    }

    /// The shorter of the two times (what the check's period follows).
    pub(super) fn shortest(&self) -> Duration {
        [self.warn_after, self.cancel_after].into_iter().flatten().min().unwrap_or(Duration::MAX)
    }

    /// Whether to list the downloads now.
    pub(super) fn due(&self, now: Instant) -> bool {
        !self.checking && self.unsupported_until.is_none_or(|until| now >= until)
    }

    /// Takes in a listing made at `now` while pulls that started at
    /// `since` or later run: the stalled downloads written since then, the
    /// newly stalled ones, those past the cancel time; and forgets
    /// warnings of downloads that ended or moved again (a download that
    /// stalls a second time is warned of again).
    pub(super) fn review<'a>(&mut self, downloads: &'a [Download], now: SystemTime, since: SystemTime) -> Review<'a> {
        let ours = || downloads.iter().filter(move |d| d.updated >= since);
        let idle_for = |after: Option<Duration>| -> Vec<&'a Download> {
            after.map(|a| ours().filter(|d| d.stalled(now, a)).collect()).unwrap_or_default()
        };
        let warn = idle_for(self.warn_after);
        let past_cancel = idle_for(self.cancel_after);
        self.warned.retain(|r| warn.iter().any(|d| &d.reference == r));
        let newly: Vec<&Download> = warn.iter().copied().filter(|d| self.warned.insert(d.reference.clone())).collect();
        let stalled = if self.warn_after.is_some() { warn.len() } else { past_cancel.len() };
        Review { stalled, newly, past_cancel }
    }

    /// Takes in a failed listing: after `Unimplemented` the runtime is not
    /// asked for [`UNSUPPORTED_RETRY`]. True when the refusal is news (to
    /// be logged once).
    pub(super) fn failed(&mut self, e: &CriError, now: Instant) -> bool {
        if e.code() != StatusCode::Unimplemented {
            return false;
        }
        self.unsupported_until = Some(now + UNSUPPORTED_RETRY);
        self.warned.clear();
        !std::mem::replace(&mut self.told_unsupported, true)
    }

    /// No pull runs: nothing is warned of any more.
    pub(super) fn idle(&mut self) {
        self.warned.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::CriErrorKind;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn download(reference: &str, updated: u64) -> Download {
        Download {
            reference: reference.into(),
            digest: String::new(),
            offset: 1,
            total: 10,
            started: at(0),
            updated: at(updated),
        }
    }

    /// A review's stalled count and newly stalled keys.
    fn look(w: &mut StallWatch, listing: &[Download], now: u64) -> (usize, Vec<&'static str>) {
        let r = w.review(listing, at(now), at(0));
        let newly = r.newly.iter().map(|d| if d.reference == "layer-a" { "layer-a" } else { "layer-b" }).collect();
        (r.stalled, newly)
    }

    #[test]
    fn a_download_is_warned_of_once_per_stall_and_again_after_it_moves_and_stalls_again() {
        let mut w = StallWatch::new(Some(Duration::from_secs(60)), None).unwrap();
        let listing = [download("layer-a", 100), download("layer-b", 100)];
        assert_eq!(look(&mut w, &listing, 130), (0, vec![]), "idle 30s is no stall");
        assert_eq!(look(&mut w, &listing, 160), (2, vec!["layer-a", "layer-b"]));
        assert_eq!(look(&mut w, &listing, 200), (2, vec![]), "warned once");
        // layer-b writes again, then stalls again: a second warning.
        let moved = [download("layer-a", 100), download("layer-b", 190)];
        assert_eq!(look(&mut w, &moved, 200), (1, vec![]));
        assert_eq!(look(&mut w, &moved, 250), (2, vec!["layer-b"]));
        // A download that ended and comes back (a retried pull) is news.
        assert_eq!(look(&mut w, &moved[1..], 260), (1, vec![]));
        assert_eq!(look(&mut w, &moved, 270), (2, vec!["layer-a"]));
    }

    #[test]
    fn a_runtime_without_the_listing_is_told_once_and_asked_again_only_after_a_while() {
        let mut w = StallWatch::new(Some(Duration::from_secs(60)), None).unwrap();
        let now = Instant::now();
        assert!(w.due(now));
        let unimplemented = CriError::from_status(StatusCode::Unimplemented, "unknown service");
        assert!(w.failed(&unimplemented, now), "news the first time");
        assert!(!w.due(now + Duration::from_secs(599)));
        assert!(w.due(now + UNSUPPORTED_RETRY));
        assert!(!w.failed(&unimplemented, now + UNSUPPORTED_RETRY), "told once");
        // Another failure changes nothing: asked again at the next tick.
        let mut w = StallWatch::new(Some(Duration::from_secs(60)), None).unwrap();
        assert!(!w.failed(&CriError::new(CriErrorKind::DeadlineExceeded, "slow"), now));
        assert!(w.due(now));
        w.checking = true;
        assert!(!w.due(now), "one listing at a time");
    }

    #[test]
    fn only_downloads_written_since_the_pulls_started_count_and_the_cancel_time_has_its_own_list() {
        let mut w = StallWatch::new(Some(Duration::from_secs(60)), Some(Duration::from_secs(120))).unwrap();
        // An ingest an abandoned pull left at 50 is no stall of pulls
        // started at 100; one written at 150 is.
        let listing = [download("layer-a", 50), download("layer-b", 150)];
        let r = w.review(&listing, at(230), at(100));
        assert_eq!((r.stalled, r.newly.len(), r.past_cancel.len()), (1, 1, 0));
        assert_eq!(r.newly[0].reference, "layer-b");
        let r = w.review(&listing, at(270), at(100));
        assert_eq!((r.stalled, r.newly.len()), (1, 0));
        assert_eq!(r.past_cancel.iter().map(|d| d.reference.as_str()).collect::<Vec<_>>(), ["layer-b"]);
        // Cancel alone: no warnings, the count by the cancel time.
        let mut c = StallWatch::new(None, Some(Duration::from_secs(120))).unwrap();
        let r = c.review(&listing, at(230), at(100));
        assert_eq!((r.stalled, r.newly.len(), r.past_cancel.len()), (0, 0, 0));
        let r = c.review(&listing, at(270), at(100));
        assert_eq!((r.stalled, r.newly.len(), r.past_cancel.len()), (1, 0, 1));
        assert!(StallWatch::new(None, None).is_none(), "both off: no check");
    }

    #[test]
    fn the_check_follows_the_shorter_time() {
        let s = Duration::from_secs;
        assert_eq!(StallWatch::new(Some(s(60)), None).unwrap().shortest(), s(60));
        assert_eq!(StallWatch::new(Some(s(60)), Some(s(20))).unwrap().shortest(), s(20));
        assert_eq!(StallWatch::new(None, Some(s(90))).unwrap().shortest(), s(90));
    }
}
