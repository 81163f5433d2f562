//! The pod pulling-time recorder (the kubelet's `PodStartupLatencyTracker`
//! image part): first pull start and last pull finish per pod UID.
//!
//! The kubelet forgets a pod when it is deleted; imaged is not told of
//! deletions (only an embedder calling [`PullingRecorder::forget`] is), so
//! the recorder keeps the [`MAX_PODS`] pods touched last: with pods coming
//! and going on a node for days it would otherwise grow without end (the
//! soak bench found it: about 1 MB a minute at 50 new pods a second).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

/// First start and last finish of image pulls for one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodPullTimes {
    /// When the pod's first pull started.
    pub first_started: Option<Instant>,
    /// When the pod's last pull (or presence check) finished.
    pub last_finished: Option<Instant>,
}

/// Most pods the recorder keeps (a node runs at most a few hundred at once).
/// When a new pod would pass it, the half touched longest ago is forgotten.
pub const MAX_PODS: usize = 4096;

/// One pod's times and when they last changed.
#[derive(Debug, Clone, Copy)]
struct Entry {
    times: PodPullTimes,
    touched: Instant,
}

/// Shared recorder; clones share state.
#[derive(Debug, Clone, Default)]
pub struct PullingRecorder {
    pods: Arc<Mutex<HashMap<String, Entry>>>,
}

impl PullingRecorder {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Entry>) -> T) -> T {
        f(&mut self.pods.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Applies `f` to the entry of `pod_uid`, made (within [`MAX_PODS`])
    /// if missing, touched at `at`. A known pod (every ensure after its
    /// first) costs one lookup and no allocation.
    fn touch(m: &mut HashMap<String, Entry>, pod_uid: &str, at: Instant, f: impl FnOnce(&mut PodPullTimes)) {
        if let Some(e) = m.get_mut(pod_uid) {
            e.touched = e.touched.max(at);
            f(&mut e.times);
            return;
        }
        if m.len() >= MAX_PODS {
            forget_oldest_half(m);
        }
        let mut e = Entry { times: PodPullTimes { first_started: None, last_finished: None }, touched: at };
        f(&mut e.times);
        m.insert(pod_uid.to_string(), e);
    }

    /// A pull started for `pod_uid`: kept only if it is the first.
    pub fn started(&self, pod_uid: &str, at: Instant) {
        self.with(|m| {
            Self::touch(m, pod_uid, at, |t| {
                t.first_started.get_or_insert(at);
            });
        });
    }

    /// A pull (or presence check) finished for `pod_uid`: overwrites the last finish.
    pub fn finished(&self, pod_uid: &str, at: Instant) {
        self.with(|m| Self::touch(m, pod_uid, at, |t| t.last_finished = Some(at)));
    }

    /// The times recorded for `pod_uid`.
    pub fn get(&self, pod_uid: &str) -> Option<PodPullTimes> {
        self.with(|m| m.get(pod_uid).map(|e| e.times))
    }

    /// How many pods are remembered.
    pub fn len(&self) -> usize {
        self.with(|m| m.len())
    }

    /// Whether no pod is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets a pod (when it is deleted).
    pub fn forget(&self, pod_uid: &str) {
        self.with(|m| {
            m.remove(pod_uid);
        });
    }
}

/// Keeps the half of `m` touched last.
fn forget_oldest_half(m: &mut HashMap<String, Entry>) {
    let mut times: Vec<Instant> = m.values().map(|e| e.touched).collect();
    let keep = times.len() / 2;
    if keep == 0 {
        m.clear();
        return;
    }
    let cut = times.len() - keep;
    let (_, nth, _) = times.select_nth_unstable(cut);
    let cutoff = *nth;
    m.retain(|_, e| e.touched >= cutoff);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn keeps_first_start_and_last_finish() {
        let r = PullingRecorder::default();
        let t0 = Instant::now();
        r.started("p", t0);
        r.started("p", t0 + Duration::from_secs(1));
        r.finished("p", t0 + Duration::from_secs(2));
        r.finished("p", t0 + Duration::from_secs(5));
        assert_eq!(
            r.get("p"),
            Some(PodPullTimes { first_started: Some(t0), last_finished: Some(t0 + Duration::from_secs(5)) })
        );
        assert_eq!(r.get("other"), None);
        r.forget("p");
        assert_eq!(r.get("p"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn pods_never_forgotten_by_the_caller_stay_bounded_and_the_recent_ones_stay() {
        let r = PullingRecorder::default();
        let t0 = Instant::now();
        let at = |i: u64| t0 + Duration::from_millis(i);
        r.started("busy", at(0));
        for i in 0..(MAX_PODS as u64 * 3) {
            r.finished(&format!("pod-{i}"), at(i + 1));
            if i % 100 == 0 {
                // A pod still pulling now and then stays among the recent.
                r.finished("busy", at(i + 1));
            }
        }
        assert!(r.len() <= MAX_PODS, "{} pods kept", r.len());
        let last = MAX_PODS as u64 * 3 - 1;
        assert!(r.get(&format!("pod-{last}")).is_some(), "the newest pod is kept");
        assert!(r.get("pod-0").is_none(), "the oldest is forgotten");
        assert_eq!(r.get("busy").and_then(|t| t.first_started), Some(t0), "a pod touched lately keeps its first start");
    }
}
