//! The stall check: which of the runtime's downloads have stalled for
//! `pull.stall_warning` while pulls run — written no byte, or, with
//! `pull.min_download_rate`, fewer bytes than that floor asks (a drip) —
//! each warned of once per stall, and which for `pull.stall_timeout`, which
//! ends the pull's runtime call. CRI has no progress; containerd lists its
//! downloads (ingests) through its content service, each with its bytes
//! and the time of its last write, and the check keeps its own readings of
//! their bytes over the longer time, to measure what each wrote since. A
//! download is not tied to an image, so the warning names the pulls
//! running, and the pull only when it is the one running; only a download
//! written since the pulls started counts (a partial ingest an earlier,
//! abandoned pull left behind is no stall of theirs).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::cri::{CriError, StatusCode};
use crate::domain::{Download, Stall};

/// How long a runtime that answered `Unimplemented` is not asked again.
pub(super) const UNSUPPORTED_RETRY: Duration = Duration::from_secs(600);

/// The check's state: what was warned of, its readings of each download,
/// and whether the runtime lists downloads at all.
#[derive(Debug)]
pub(super) struct StallWatch {
    /// Stalled this long is warned of (`None`: never).
    pub(super) warn_after: Option<Duration>,
    /// Stalled this long ends the pull's call (`None`: never).
    pub(super) cancel_after: Option<Duration>,
    /// The floor, in bytes a second, a download must keep over each time
    /// (`pull.min_download_rate`; 0: any byte is enough).
    pub(super) min_rate: u64,
    /// Each download's (time, bytes) at the listings of the longer time
    /// (and the last one before it), oldest first; kept with a floor only.
    readings: HashMap<String, VecDeque<(SystemTime, u64)>>,
    /// Downloads warned of that have not recovered since (by ingest key).
    warned: HashSet<String>,
    /// Downloads the last listing found under the floor (by ingest key),
    /// for the listing of pulls, which keeps no readings.
    slow: HashSet<String>,
    /// A listing is on its way (one at a time).
    pub(super) checking: bool,
    /// Not asked before this: the runtime answered `Unimplemented`.
    unsupported_until: Option<Instant>,
    /// The runtime's refusal was logged (once per process).
    told_unsupported: bool,
}

/// A stalled download and how.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(super) struct Found<'a> {
    pub(super) download: &'a Download,
    pub(super) stall: Stall,
}

/// What one listing found.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Review<'a> {
    /// Downloads stalled for the warning time (else the cancel time) now.
    pub(super) stalled: usize,
    /// Those among them not warned of before.
    pub(super) newly: Vec<Found<'a>>,
    /// Downloads stalled for the cancel time.
    pub(super) past_cancel: Vec<Found<'a>>,
}

impl StallWatch {
    /// A check, or none when both times are off.
    pub(super) fn new(warn_after: Option<Duration>, cancel_after: Option<Duration>, min_rate: u64) -> Option<Self> {
        (warn_after.is_some() || cancel_after.is_some()).then(|| Self {
            warn_after,
            cancel_after,
            min_rate,
            readings: HashMap::new(),
            warned: HashSet::new(),
            slow: HashSet::new(),
            checking: false,
            unsupported_until: None,
            told_unsupported: false,
        })
    }

    /// Takes new times and floor (a reload); what was warned of and the
    /// readings stay (the readings' span follows at the next listing).
    pub(super) fn retime(&mut self, warn_after: Option<Duration>, cancel_after: Option<Duration>, min_rate: u64) {
        (self.warn_after, self.cancel_after, self.min_rate) = (warn_after, cancel_after, min_rate);
        if min_rate == 0 {
            self.readings.clear();
        }
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
    /// warnings of downloads that ended or recovered (a download that
    /// stalls a second time is warned of again).
    pub(super) fn review<'a>(&mut self, downloads: &'a [Download], now: SystemTime, since: SystemTime) -> Review<'a> {
        let ours: Vec<&Download> = downloads.iter().filter(|d| d.updated >= since).collect();
        let stalled_for = |after: Option<Duration>| -> Vec<Found<'a>> {
            let Some(after) = after else { return Vec::new() };
            ours.iter()
                .filter_map(|&d| {
                    let anchor = self.anchor(d, now, after, since);
                    d.stall(now, after, self.min_rate, anchor).map(|stall| Found { download: d, stall })
                })
                .collect()
        };
        let warn = stalled_for(self.warn_after);
        let past_cancel = stalled_for(self.cancel_after);
        self.read(downloads, now);
        self.warned.retain(|r| warn.iter().any(|f| &f.download.reference == r));
        let newly: Vec<Found> =
            warn.iter().copied().filter(|f| self.warned.insert(f.download.reference.clone())).collect();
        self.slow = warn
            .iter()
            .chain(&past_cancel)
            .filter(|f| matches!(f.stall, Stall::Slow { .. }))
            .map(|f| f.download.reference.clone())
            .collect();
        let stalled = if self.warn_after.is_some() { warn.len() } else { past_cancel.len() };
        Review { stalled, newly, past_cancel }
    }

    /// The latest reading of `d` at least `after` before `now`, taken
    /// since the pulls began (`since`): an earlier one may predate a
    /// resume of the download, and its bytes lay still meanwhile.
    fn anchor(&self, d: &Download, now: SystemTime, after: Duration, since: SystemTime) -> Option<(SystemTime, u64)> {
        let latest = now.checked_sub(after)?;
        let reading = self.readings.get(&d.reference)?.iter().rev().find(|(at, _)| *at <= latest).copied();
        reading.filter(|(at, _)| *at >= since)
    }

    /// Keeps this listing's readings (with a floor): each download's bytes
    /// now, the readings of the longer time and the last before it; a
    /// download that ended, or began again (fewer bytes), is forgotten.
    fn read(&mut self, downloads: &[Download], now: SystemTime) {
        if self.min_rate == 0 {
            return;
        }
        let longest = [self.warn_after, self.cancel_after].into_iter().flatten().max().unwrap_or_default();
        let oldest = now.checked_sub(longest);
        self.readings.retain(|r, _| downloads.iter().any(|d| &d.reference == r));
        for d in downloads {
            let kept = self.readings.entry(d.reference.clone()).or_default();
            if kept.back().is_some_and(|(_, bytes)| *bytes > d.offset) {
                kept.clear();
            }
            kept.push_back((now, d.offset));
            while let (Some(oldest), Some((second, _))) = (oldest, kept.get(1))
                && *second <= oldest
            {
                kept.pop_front();
            }
        }
    }

    /// Takes in a failed listing: after `Unimplemented` the runtime is not
    /// asked for [`UNSUPPORTED_RETRY`]. True when the refusal is news (to
    /// be logged once).
    pub(super) fn failed(&mut self, e: &CriError, now: Instant) -> bool {
        if e.code() != StatusCode::Unimplemented {
            return false;
        }
        self.unsupported_until = Some(now + UNSUPPORTED_RETRY);
        self.idle();
        !std::mem::replace(&mut self.told_unsupported, true)
    }

    /// No pull runs: nothing is warned of any more, no reading kept.
    pub(super) fn idle(&mut self) {
        self.warned.clear();
        self.readings.clear();
        self.slow.clear();
    }

    /// The downloads the last listing found under the floor, by ingest key.
    pub(super) fn slow(&self) -> Vec<String> {
        let mut slow: Vec<String> = self.slow.iter().cloned().collect();
        slow.sort();
        slow
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
        let newly =
            r.newly.iter().map(|f| if f.download.reference == "layer-a" { "layer-a" } else { "layer-b" }).collect();
        (r.stalled, newly)
    }

    #[test]
    fn a_download_is_warned_of_once_per_stall_and_again_after_it_moves_and_stalls_again() {
        let mut w = StallWatch::new(Some(Duration::from_secs(60)), None, 0).unwrap();
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
        let mut w = StallWatch::new(Some(Duration::from_secs(60)), None, 0).unwrap();
        let now = Instant::now();
        assert!(w.due(now));
        let unimplemented = CriError::from_status(StatusCode::Unimplemented, "unknown service");
        assert!(w.failed(&unimplemented, now), "news the first time");
        assert!(!w.due(now + Duration::from_secs(599)));
        assert!(w.due(now + UNSUPPORTED_RETRY));
        assert!(!w.failed(&unimplemented, now + UNSUPPORTED_RETRY), "told once");
        // Another failure changes nothing: asked again at the next tick.
        let mut w = StallWatch::new(Some(Duration::from_secs(60)), None, 0).unwrap();
        assert!(!w.failed(&CriError::new(CriErrorKind::DeadlineExceeded, "slow"), now));
        assert!(w.due(now));
        w.checking = true;
        assert!(!w.due(now), "one listing at a time");
    }

    #[test]
    fn only_downloads_written_since_the_pulls_started_count_and_the_cancel_time_has_its_own_list() {
        let mut w = StallWatch::new(Some(Duration::from_secs(60)), Some(Duration::from_secs(120)), 0).unwrap();
        // An ingest an abandoned pull left at 50 is no stall of pulls
        // started at 100; one written at 150 is.
        let listing = [download("layer-a", 50), download("layer-b", 150)];
        let r = w.review(&listing, at(230), at(100));
        assert_eq!((r.stalled, r.newly.len(), r.past_cancel.len()), (1, 1, 0));
        assert_eq!(r.newly[0].download.reference, "layer-b");
        let r = w.review(&listing, at(270), at(100));
        assert_eq!((r.stalled, r.newly.len()), (1, 0));
        assert_eq!(r.past_cancel.iter().map(|f| f.download.reference.as_str()).collect::<Vec<_>>(), ["layer-b"]);
        // Cancel alone: no warnings, the count by the cancel time.
        let mut c = StallWatch::new(None, Some(Duration::from_secs(120)), 0).unwrap();
        let r = c.review(&listing, at(230), at(100));
        assert_eq!((r.stalled, r.newly.len(), r.past_cancel.len()), (0, 0, 0));
        let r = c.review(&listing, at(270), at(100));
        assert_eq!((r.stalled, r.newly.len(), r.past_cancel.len()), (1, 0, 1));
        assert!(StallWatch::new(None, None, 0).is_none(), "both off: no check");
    }

    #[test]
    fn with_a_floor_a_drip_is_found_by_the_checks_own_readings_not_by_the_average_since_its_start() {
        // 10 kB/s for its first 100s, then a drip of 10 bytes a second.
        let read_at = |t: u64| Download {
            offset: if t <= 100 { t * 10_000 } else { 1_000_000 + (t - 100) * 10 },
            total: 10_000_000,
            ..download("layer-a", t)
        };
        let first = |min_rate: u64| {
            let mut w =
                StallWatch::new(Some(Duration::from_secs(60)), Some(Duration::from_secs(120)), min_rate).unwrap();
            let (mut warned, mut cancelled) = (None, None);
            // Listed every 15s from 100 (the check's period: a quarter).
            for t in (100..=400).step_by(15) {
                let listing = [read_at(t)];
                let r = w.review(&listing, at(t), at(0));
                if let Some(f) = r.newly.first() {
                    warned.get_or_insert((t, f.stall));
                }
                if let Some(f) = r.past_cancel.first() {
                    cancelled.get_or_insert((t, f.stall));
                }
            }
            (warned, cancelled)
        };
        let s = Duration::from_secs;
        // Since its start, it averages over 2500 bytes a second all along,
        // and that average is not used: the readings, from 100, show the
        // drip, a minute later.
        assert_eq!(
            first(100),
            (
                Some((160, Stall::Slow { moved: 600, over: s(60) })),
                Some((220, Stall::Slow { moved: 1200, over: s(120) }))
            )
        );
        assert_eq!(first(0), (None, None), "no floor: a moving download never stalls");
        assert_eq!(first(10), (None, None), "a drip at the floor is no stall");
    }

    #[test]
    fn the_downloads_under_the_floor_are_named_for_the_listing_until_they_move_or_no_pull_runs() {
        let mut w = StallWatch::new(Some(Duration::from_secs(60)), None, 100).unwrap();
        // layer-a drips (10 bytes a second) but from 300 to 310, when it
        // writes 3 MB; layer-b lies idle since 100.
        let listing = |t: u64, a: u64| {
            [Download { offset: a, ..download("layer-a", t) }, Download { offset: 5, ..download("layer-b", 100) }]
        };
        for t in (100..=145).step_by(15) {
            w.review(&listing(t, 10 * t), at(t), at(0));
        }
        assert!(w.slow().is_empty(), "no reading a minute old yet");
        w.review(&listing(160, 1_600), at(160), at(0));
        // The idle one is stalled, not slow: the listing tells it itself.
        assert_eq!(w.slow(), ["layer-a"]);
        // It moved: slow no more.
        w.review(&listing(310, 3_000_000), at(310), at(0));
        assert!(w.slow().is_empty());
        w.review(&listing(400, 3_000_900), at(400), at(0));
        assert_eq!(w.slow(), ["layer-a"], "900 bytes in 90 s");
        w.idle();
        assert!(w.slow().is_empty(), "no pull runs: nothing named");
    }

    #[test]
    fn a_reading_from_before_the_pulls_began_is_no_baseline_for_a_resumed_download() {
        let mut w = StallWatch::new(Some(Duration::from_secs(60)), None, 10_000).unwrap();
        // While an earlier pull ran, an abandoned ingest lay still (1000
        // bytes, last written at 50): read from 100 to 190.
        for t in (100..=190).step_by(15) {
            w.review(&[Download { offset: 1000, ..download("layer-x", 50) }], at(t), at(0));
        }
        // A pull starting at 200 resumes it at 10 kB/s, the floor. From the
        // reading at 160, 300 kB in 70 s would read as a drip.
        let resumed = [Download { offset: 1000 + 300_000, ..download("layer-x", 230) }];
        let r = w.review(&resumed, at(230), at(200));
        assert_eq!((r.stalled, r.newly.len()), (0, 0), "{r:?}");
    }

    #[test]
    fn readings_are_kept_for_the_longer_time_and_forgotten_with_their_download() {
        let mut w = StallWatch::new(Some(Duration::from_secs(60)), Some(Duration::from_secs(120)), 1).unwrap();
        for t in (0..=600).step_by(15) {
            w.review(&[Download { offset: t, ..download("layer-a", t) }], at(t), at(0));
        }
        // The longer time back from 600 is 480: the readings since.
        assert_eq!(w.readings["layer-a"].len(), 9);
        assert_eq!(w.readings["layer-a"].front(), Some(&(at(480), 480)));
        // Fewer bytes: the ingest began again, the old readings are not its.
        w.review(&[Download { offset: 3, ..download("layer-a", 610) }], at(610), at(0));
        assert_eq!(w.readings["layer-a"].len(), 1);
        w.review(&[], at(620), at(0));
        assert!(w.readings.is_empty(), "its download ended");
        let mut no_floor = StallWatch::new(Some(Duration::from_secs(60)), None, 0).unwrap();
        no_floor.review(&[download("layer-a", 10)], at(10), at(0));
        assert!(no_floor.readings.is_empty(), "no floor, no readings");
    }

    #[test]
    fn new_times_keep_the_warnings_and_a_floor_turned_off_drops_the_readings() {
        let mut w = StallWatch::new(Some(Duration::from_secs(60)), None, 1).unwrap();
        let listing = [download("layer-a", 100)];
        assert_eq!(look(&mut w, &listing, 160), (1, vec!["layer-a"]));
        assert_eq!(w.readings.len(), 1);
        w.retime(Some(Duration::from_secs(30)), Some(Duration::from_secs(90)), 1);
        assert_eq!(look(&mut w, &listing, 170), (1, vec![]), "already warned of");
        assert_eq!(w.shortest(), Duration::from_secs(30));
        w.retime(Some(Duration::from_secs(30)), None, 0);
        assert!(w.readings.is_empty());
    }

    #[test]
    fn the_check_follows_the_shorter_time() {
        let s = Duration::from_secs;
        assert_eq!(StallWatch::new(Some(s(60)), None, 0).unwrap().shortest(), s(60));
        assert_eq!(StallWatch::new(Some(s(60)), Some(s(20)), 0).unwrap().shortest(), s(20));
        assert_eq!(StallWatch::new(None, Some(s(90)), 0).unwrap().shortest(), s(90));
    }
}
