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
}

impl InUseHints {
    /// `image_id` was ensured (pulled or found present) for a pod at `at`.
    pub fn ensured(&self, image_id: &str, at: SystemTime) {
        let mut m = self.ensured.lock().unwrap_or_else(|p| p.into_inner());
        match m.get_mut(image_id) {
            Some(t) => *t = at,
            None => {
                m.insert(image_id.to_string(), at);
            }
        }
    }

    /// Image ids ensured within `window` before `now`; older hints are dropped.
    pub fn recent(&self, now: SystemTime, window: Duration) -> Vec<String> {
        let mut m = self.ensured.lock().unwrap_or_else(|p| p.into_inner());
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
}
