//! What the demo counts while it runs ([`Tally`]) and the closing summary
//! computed from it, including the comparison with the kubelet: every claim
//! there is a number measured in this run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// Counters of the run, updated by the pod drivers, the event and phase
/// subscriber, and the runtime/GC poll.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Pods in the workload.
    pub pods_total: usize,
    /// Pods whose images were all ensured (containers created).
    pub pods_started: usize,
    /// Started pods that completed or were replaced since.
    pub pods_stopped: usize,
    /// Pods waiting on an image error now (retrying).
    pub pods_failing: usize,
    /// Pods that never started: deleted or past the horizon, by their last error kind.
    pub never_started: BTreeMap<String, usize>,
    /// Pods whose driver has finished.
    pub pods_settled: usize,
    /// `EnsureImageExists` calls made.
    pub ensure_calls: u64,
    /// Latency of each successful call.
    pub ensure_ok: Vec<Duration>,
    /// Failed calls by error kind (`ErrImagePull`, `ImagePullBackOff`, ...).
    pub ensure_errors: BTreeMap<String, u64>,
    /// Failed calls whose message is the kubelet's "pull QPS exceeded".
    pub qps_exceeded: u64,
    /// Requests that went to the pull queue (`Pulling` events).
    pub pull_requests: u64,
    /// `Failed` events, and how many were classified permanent.
    pub failed_events: u64,
    /// `Failed` events classified permanent.
    pub failed_permanent: u64,
    /// Requests that joined a pull already queued or running.
    pub joins: u64,
    /// Pulls that found the image present when their turn came.
    pub present_at_turn: u64,
    /// Pulls that found no throttle token and waited.
    pub throttled_pulls: u64,
    /// Pulls running, queued and parked now.
    pub running: usize,
    /// Pulls queued now.
    pub queued: usize,
    /// Requests parked (queue full) now.
    pub parked: usize,
    /// `PullImage` calls the runtime received.
    pub cri_pulls: u64,
    /// Most pulls the runtime ran at once.
    pub max_parallel_pulls: u64,
    /// Image filesystem: capacity, used now, most used.
    pub disk_capacity: u64,
    /// Bytes used now.
    pub disk_used: u64,
    /// Most bytes used at any poll.
    pub disk_peak: u64,
    /// GC runs (periodic) that completed, with or without removals.
    pub gc_runs: u64,
    /// GC runs that could not reach the low threshold (`FreeDiskSpaceFailed`);
    /// they remove what they can, and are not in `gc_runs`.
    pub gc_runs_short: u64,
    /// Images removed (as the runtime saw them go).
    pub gc_images_removed: u64,
    /// Bytes those images took.
    pub gc_bytes_freed: u64,
}

/// Nearest-rank percentile `p` (0–100) of `samples`; `None` when empty.
pub fn percentile(samples: &[Duration], p: u32) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_unstable();
    let rank = (u64::from(p.min(100)) * v.len() as u64).div_ceil(100).max(1);
    let i = usize::try_from(rank - 1).unwrap_or(0).min(v.len() - 1);
    Some(v[i])
}

/// `1.23 GB`, `456 MB`, `789 kB` (decimal units, as registries show sizes).
pub fn bytes(n: u64) -> String {
    let f = n as f64;
    if n >= 1_000_000_000 {
        format!("{:.2} GB", f / 1e9)
    } else if n >= 1_000_000 {
        format!("{:.0} MB", f / 1e6)
    } else if n >= 1_000 {
        format!("{:.0} kB", f / 1e3)
    } else {
        format!("{n} B")
    }
}

/// `0.4 ms`, `12 ms`, `1.91 s`.
pub fn latency(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else if ms < 1_000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.2} s", ms / 1e3)
    }
}

/// Usage in percent (0 when the capacity is unknown).
pub fn percent(used: u64, capacity: u64) -> u64 {
    used.saturating_mul(100).checked_div(capacity).unwrap_or(0)
}

/// What the demo knew about its own configuration, for the summary's text.
#[derive(Debug, Clone, PartialEq)]
pub struct RunFacts {
    /// The workload's seed.
    pub seed: u64,
    /// How long the run took.
    pub elapsed: Duration,
    /// `registry_pull_qps` and `registry_burst`.
    pub qps: f64,
    /// `registry_burst`.
    pub burst: u32,
}

/// The closing summary.
pub fn render(t: &Tally, f: &RunFacts) -> String {
    let mut s = String::new();
    let never: usize = t.never_started.values().sum();
    let never_why = if never == 0 {
        String::new()
    } else {
        let why: Vec<String> = t.never_started.iter().map(|(k, n)| format!("{n} {k}")).collect();
        format!("; never started: {}", why.join(", "))
    };
    let failed: u64 = t.ensure_errors.values().sum();
    let p = |q| percentile(&t.ensure_ok, q).map_or_else(|| "-".to_string(), latency);
    let _ = writeln!(s, "Summary (seed {}, {:.1} s)", f.seed, f.elapsed.as_secs_f64());
    let _ = writeln!(
        s,
        "  pods started            {} of {} ({} since completed or replaced{never_why})",
        t.pods_started, t.pods_total, t.pods_stopped
    );
    let _ = writeln!(
        s,
        "  ensure requests         {} ({} ok: p50 {}, p99 {}; {failed} failed)",
        t.ensure_calls,
        t.ensure_ok.len(),
        p(50),
        p(99)
    );
    let _ = writeln!(s, "  requests needing a pull {}", t.pull_requests);
    let _ = writeln!(s, "  CRI pulls made          {} (at most {} at once)", t.cri_pulls, t.max_parallel_pulls);
    let _ = writeln!(s, "  shared pulls            {} requests joined a pull in flight", t.joins);
    if t.present_at_turn > 0 {
        let _ = writeln!(s, "  present by their turn   {} requests (no pull made)", t.present_at_turn);
    }
    let _ = writeln!(s, "  throttled pulls         {} waited for a registry QPS token", t.throttled_pulls);
    let _ = writeln!(
        s,
        "  back-offs               {} requests answered ImagePullBackOff",
        t.ensure_errors.get("ImagePullBackOff").copied().unwrap_or(0)
    );
    let errors: Vec<String> = t.ensure_errors.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = writeln!(
        s,
        "  pull failures           {} Failed events ({} permanent){}",
        t.failed_events,
        t.failed_permanent,
        if errors.is_empty() { String::new() } else { format!("; request errors: {}", errors.join(", ")) }
    );
    let short = match t.gc_runs_short {
        0 => String::new(),
        n => format!(" ({n} could not reach the low threshold: the rest was in use or too young)"),
    };
    let _ = writeln!(s, "  GC runs                 {}{short}", t.gc_runs + t.gc_runs_short);
    let _ = writeln!(
        s,
        "  GC freed                {} bytes ({}), {} images",
        t.gc_bytes_freed,
        bytes(t.gc_bytes_freed),
        t.gc_images_removed
    );
    let _ = writeln!(
        s,
        "  disk                    peak {}% of {}, {}% at the end",
        percent(t.disk_peak, t.disk_capacity),
        bytes(t.disk_capacity),
        percent(t.disk_used, t.disk_capacity)
    );
    let _ = writeln!(s);
    let _ = writeln!(s, "What imaged did better than the kubelet (measured in this run)");
    for line in advantages(t, f) {
        let _ = writeln!(s, "  - {line}");
    }
    s
}

/// The comparison lines; each states only what this run measured.
pub fn advantages(t: &Tally, f: &RunFacts) -> Vec<String> {
    let mut v = Vec::new();
    if t.pull_requests > 0 {
        let extra = t.pull_requests.saturating_sub(t.cri_pulls);
        let present = if t.present_at_turn > 0 {
            format!(", {} found the image present by their turn", t.present_at_turn)
        } else {
            String::new()
        };
        v.push(format!(
            "shared pulls: {} requests found their image absent and needed a pull; imaged served them with {} \
             CRI PullImage calls ({} requests joined a pull in flight{present}). The kubelet makes one PullImage \
             call per such request: {} calls, {extra} more.",
            t.pull_requests, t.cri_pulls, t.joins, t.pull_requests
        ));
    }
    let qps = format!("{} pulls/s, burst {}", f.qps, f.burst);
    if t.throttled_pulls > 0 {
        v.push(format!(
            "throttle wait mode: {} pulls found the registry limit ({qps}) exhausted and waited for a token; \
             {} requests failed with \"pull QPS exceeded\". The kubelet's limiter fails a pull that finds no \
             token: each of those {} pulls would have failed with \"pull QPS exceeded\" and sent its pods into back-off.",
            t.throttled_pulls, t.qps_exceeded, t.throttled_pulls
        ));
    } else {
        v.push(format!(
            "throttle: no pull found the registry limit ({qps}) exhausted in this run, so the wait mode made \
             no difference here."
        ));
    }
    if t.failed_events > 0 {
        v.push(format!(
            "error classes: {} of {} pull failures were marked permanent on their events (retrying cannot help: \
             image not found, unauthorized); the kubelet's events do not tell permanent from transient.",
            t.failed_permanent, t.failed_events
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&s, 50), Some(ms(50)));
        assert_eq!(percentile(&s, 99), Some(ms(99)));
        assert_eq!(percentile(&s, 100), Some(ms(100)));
        assert_eq!(percentile(&[ms(7)], 99), Some(ms(7)));
        assert_eq!(percentile(&[ms(3), ms(1), ms(2)], 50), Some(ms(2)));
        assert_eq!(percentile(&[], 50), None);
    }

    #[test]
    fn sizes_and_latencies_read_well() {
        assert_eq!(bytes(6_123_000_000), "6.12 GB");
        assert_eq!(bytes(184_025_088), "184 MB");
        assert_eq!(bytes(320_368), "320 kB");
        assert_eq!(latency(Duration::from_micros(420)), "0.4 ms");
        assert_eq!(latency(ms(1_910)), "1.91 s");
        assert_eq!(percent(50, 200), 25);
        assert_eq!(percent(1, 0), 0);
    }

    fn facts() -> RunFacts {
        RunFacts { seed: 1, elapsed: Duration::from_secs(20), qps: 5.0, burst: 10 }
    }

    #[test]
    fn the_comparison_states_the_measured_numbers() {
        let t = Tally {
            pull_requests: 200,
            cri_pulls: 40,
            joins: 130,
            present_at_turn: 30,
            throttled_pulls: 6,
            ..Tally::default()
        };
        let lines = advantages(&t, &facts());
        assert!(
            lines[0].contains("200 requests")
                && lines[0].contains("40 CRI PullImage calls")
                && lines[0].contains("160 more"),
            "{}",
            lines[0]
        );
        assert!(lines[1].starts_with("throttle wait mode: 6 pulls"), "{}", lines[1]);
        assert_eq!(lines.len(), 2, "no failures, no error-class line");
    }

    #[test]
    fn no_throttling_claims_nothing_for_the_wait_mode() {
        let t = Tally { pull_requests: 1, cri_pulls: 1, ..Tally::default() };
        let lines = advantages(&t, &facts());
        assert!(lines.iter().any(|l| l.contains("made no difference")), "{lines:?}");
        assert!(!lines.iter().any(|l| l.contains("would have failed")), "{lines:?}");
    }

    #[test]
    fn the_summary_names_every_figure() {
        let mut t = Tally {
            pods_total: 3,
            pods_started: 2,
            cri_pulls: 4,
            gc_bytes_freed: 2_000_000_000,
            gc_images_removed: 2,
            disk_capacity: 10,
            disk_peak: 9,
            disk_used: 5,
            ..Tally::default()
        };
        t.never_started.insert("ImagePullBackOff".into(), 1);
        t.ensure_errors.insert("ImagePullBackOff".into(), 5);
        t.ensure_ok = vec![ms(1), ms(2)];
        let s = render(&t, &facts());
        for want in [
            "pods started            2 of 3 (0 since completed or replaced; never started: 1 ImagePullBackOff)",
            "CRI pulls made          4",
            "back-offs               5 requests",
            "GC freed                2000000000 bytes (2.00 GB), 2 images",
            "disk                    peak 90% of 10 B, 50% at the end",
        ] {
            assert!(s.contains(want), "missing {want:?} in\n{s}");
        }
    }
}
