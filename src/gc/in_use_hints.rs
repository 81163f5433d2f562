//! In-use hints from the pull path: images ensured recently count as in use
//! for GC, so an image pulled for a container that is about to be created is
//! not collected in between (beyond the kubelet, which relies on min age).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Shared between the `ImageManager` (writer) and the detector (reader).
#[derive(Debug, Clone, Default)]
pub struct InUseHints {
    ensured: Arc<Mutex<HashMap<String, SystemTime>>>,
    /// Normalised references with a pull in flight, and how many.
    pulling: Arc<Mutex<HashMap<String, usize>>>,
}

/// Marks a pull in flight until dropped.
#[derive(Debug)]
pub struct PullInFlight {
    hints: InUseHints,
    reference: String,
}

impl Drop for PullInFlight {
    fn drop(&mut self) {
        let mut m = self.hints.pulling.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = m.get_mut(&self.reference) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.reference);
            }
        }
    }
}

impl InUseHints {
    /// `image_id` was ensured (pulled or found present) for a pod at `at`.
    pub fn ensured(&self, image_id: &str, at: SystemTime) {
        let mut m = self.ensured.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match m.get_mut(image_id) {
            Some(t) => *t = at,
            None => {
                m.insert(image_id.to_string(), at);
            }
        }
    }

    /// A pull of `reference` (normalised, as the runtime names images) is in
    /// flight until the returned guard is dropped: the image it replaces, if
    /// present, counts as in use meanwhile.
    pub fn pull_started(&self, reference: &str) -> PullInFlight {
        *self
            .pulling
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(reference.to_string())
            .or_insert(0) += 1;
        PullInFlight { hints: self.clone(), reference: reference.to_string() }
    }

    /// Whether any of these references has a pull in flight.
    pub fn pulling_any<'a>(&self, mut references: impl Iterator<Item = &'a String>) -> bool {
        let m = self.pulling.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        !m.is_empty() && references.any(|r| m.contains_key(r))
    }

    /// Image ids ensured within `window` before `now`; older hints are dropped.
    pub fn recent(&self, now: SystemTime, window: Duration) -> Vec<String> {
        let mut m = self.ensured.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        m.retain(|_, at| now.duration_since(*at).map_or(true, |age| age <= window));
        m.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_expire_after_the_window() {
        let h = InUseHints::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        h.ensured("sha256:a", t0);
        h.ensured("sha256:b", t0 + Duration::from_secs(100));
        let mut recent = h.recent(t0 + Duration::from_secs(150), Duration::from_secs(120));
        recent.sort();
        assert_eq!(recent, ["sha256:b"]);
        assert!(h.recent(t0 + Duration::from_secs(1_000), Duration::from_secs(120)).is_empty());
    }

    #[test]
    fn pulls_in_flight_last_as_long_as_their_guards() {
        let h = InUseHints::default();
        let r = "docker.io/library/nginx:1.27".to_string();
        let g1 = h.pull_started(&r);
        let g2 = h.pull_started(&r);
        assert!(h.pulling_any([r.clone()].iter()));
        drop(g1);
        assert!(h.pulling_any([r.clone()].iter()));
        drop(g2);
        assert!(!h.pulling_any([r].iter()));
    }
}
