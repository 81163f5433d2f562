//! The stall check: which of the runtime's downloads have written no byte
//! for `pull.stall_warning` while pulls run, each warned of once per stall.
//! CRI has no progress; containerd lists its downloads (ingests) through
//! its content service, and each carries the time of its last write. A
//! download is not tied to an image, so the warning names the pulls
//! running, and the pull only when it is the one running.

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
    /// Idle this long is a stall.
    pub(super) after: Duration,
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
    /// Downloads idle for the stall time or longer now.
    pub(super) stalled: usize,
    /// Those among them not warned of before.
    pub(super) newly: Vec<&'a Download>,
}

impl StallWatch {
    pub(super) fn new(after: Duration) -> Self {
        Self { after, warned: HashSet::new(), checking: false, unsupported_until: None, told_unsupported: false }
    }

    /// Whether to list the downloads now.
    pub(super) fn due(&self, now: Instant) -> bool {
        !self.checking && self.unsupported_until.is_none_or(|until| now >= until)
    }

    /// Takes in a listing made at `now`: the stalled downloads, the newly
    /// stalled ones, and forgets warnings of downloads that ended or moved
    /// again (a download that stalls a second time is warned of again).
    pub(super) fn review<'a>(&mut self, downloads: &'a [Download], now: SystemTime) -> Review<'a> {
        let stalled: Vec<&Download> = downloads.iter().filter(|d| d.stalled(now, self.after)).collect();
        self.warned.retain(|r| stalled.iter().any(|d| &d.reference == r));
        let newly: Vec<&Download> =
            stalled.iter().copied().filter(|d| self.warned.insert(d.reference.clone())).collect();
        Review { stalled: stalled.len(), newly }
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
        let r = w.review(listing, at(now));
        let newly = r.newly.iter().map(|d| if d.reference == "layer-a" { "layer-a" } else { "layer-b" }).collect();
        (r.stalled, newly)
    }

    #[test]
    fn a_download_is_warned_of_once_per_stall_and_again_after_it_moves_and_stalls_again() {
        let mut w = StallWatch::new(Duration::from_secs(60));
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
        let mut w = StallWatch::new(Duration::from_secs(60));
        let now = Instant::now();
        assert!(w.due(now));
        let unimplemented = CriError::from_status(StatusCode::Unimplemented, "unknown service");
        assert!(w.failed(&unimplemented, now), "news the first time");
        assert!(!w.due(now + Duration::from_secs(599)));
        assert!(w.due(now + UNSUPPORTED_RETRY));
        assert!(!w.failed(&unimplemented, now + UNSUPPORTED_RETRY), "told once");
        // Another failure changes nothing: asked again at the next tick.
        let mut w = StallWatch::new(Duration::from_secs(60));
        assert!(!w.failed(&CriError::new(CriErrorKind::DeadlineExceeded, "slow"), now));
        assert!(w.due(now));
        w.checking = true;
        assert!(!w.due(now), "one listing at a time");
    }
}
