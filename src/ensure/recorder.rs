//! The pod pulling-time recorder (the kubelet's `PodStartupLatencyTracker`
//! image part): first pull start and last pull finish per pod UID.

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

/// Shared recorder; clones share state.
#[derive(Debug, Clone, Default)]
pub struct PullingRecorder {
    pods: Arc<Mutex<HashMap<String, PodPullTimes>>>,
}

impl PullingRecorder {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, PodPullTimes>) -> T) -> T {
        f(&mut self.pods.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// A pull started for `pod_uid`: kept only if it is the first.
    pub fn started(&self, pod_uid: &str, at: Instant) {
        self.with(|m| {
            let e = m.entry(pod_uid.to_string()).or_insert(PodPullTimes { first_started: None, last_finished: None });
            e.first_started.get_or_insert(at);
        });
    }

    /// A pull (or presence check) finished for `pod_uid`: overwrites the last finish.
    pub fn finished(&self, pod_uid: &str, at: Instant) {
        self.with(|m| match m.get_mut(pod_uid) {
            Some(e) => e.last_finished = Some(at),
            None => {
                m.insert(pod_uid.to_string(), PodPullTimes { first_started: None, last_finished: Some(at) });
            }
        });
    }

    /// The times recorded for `pod_uid`.
    pub fn get(&self, pod_uid: &str) -> Option<PodPullTimes> {
        self.with(|m| m.get(pod_uid).copied())
    }

    /// Forgets a pod (when it is deleted).
    pub fn forget(&self, pod_uid: &str) {
        self.with(|m| {
            m.remove(pod_uid);
        });
    }
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
}
