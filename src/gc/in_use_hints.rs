//! In-use hints from the pull path: images ensured recently count as in use
//! for GC, so an image pulled for a container that is about to be created is
//! not collected in between (beyond the kubelet, which relies on min age).
//!
//! They also keep an ensure and a GC removal of the same image apart. A GC
//! run plans from a detection, then removes its deletions one by one, which
//! can take a while (each `RemoveImage` has its CRI deadline): an image
//! ensured meanwhile would be removed under the container about to be
//! created on it. So each removal is claimed first ([`InUseHints::claim_removal`]):
//! refused for an image ensured since the run began or with a pull of one of
//! its names in flight; and an ensure that finds the image present while its
//! removal is in flight waits for it and looks again
//! ([`InUseHints::ensured_unless_removing`]). The check and the mark are one
//! step under one lock, so one of the two always sees the other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;

/// How long an ensure is remembered at least, whatever the detector's window
/// (a removal claim compares it with the start of its run).
const REMEMBER: Duration = Duration::from_secs(3_600);

#[derive(Debug, Default)]
struct Marks {
    /// Image id → when it was last ensured.
    ensured: HashMap<String, SystemTime>,
    /// Image ids a GC run is removing → closed when the removal ends.
    removing: HashMap<String, Arc<Semaphore>>,
}

/// Shared between the `ImageManager` (writer) and the detector (reader).
#[derive(Debug, Clone, Default)]
pub struct InUseHints {
    marks: Arc<Mutex<Marks>>,
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
        let mut m = self.hints.pulling.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = m.get_mut(&self.reference) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.reference);
            }
        }
    }
}

/// A GC run's claim on removing an image: while it is held, an ensure that
/// finds the image waits. Dropped when the removal ended (or was given up).
#[derive(Debug)]
pub struct RemovalClaim {
    hints: InUseHints,
    image_id: String,
}

impl Drop for RemovalClaim {
    fn drop(&mut self) {
        if let Some(done) = self.hints.marks().removing.remove(&self.image_id) {
            done.close();
        }
    }
}

/// Why an image counts as in use for a removal
/// ([`InUseHints::claim_client_removal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// It was ensured (pulled, or found by an `ImageStatus`, through imaged) at `at`.
    Ensured {
        /// When it was last ensured.
        at: SystemTime,
    },
    /// A pull of one of its names is in flight.
    Pulling,
}

/// What [`InUseHints::claim_client_removal`] got.
#[derive(Debug)]
pub enum ClientClaim {
    /// The claim: the removal may go ahead while it is held.
    Mine(RemovalClaim),
    /// Another removal of the image holds it.
    Other(RemovalInFlight),
}

/// A removal in flight an ensure must wait for.
#[derive(Debug)]
pub struct RemovalInFlight(Arc<Semaphore>);

impl RemovalInFlight {
    /// Resolves when the removal has ended (at once if it has already).
    pub async fn ended(self) {
        // Never given a permit: `acquire` returns only once it is closed.
        let _ = self.0.acquire().await;
    }
}

impl InUseHints {
    fn marks(&self) -> MutexGuard<'_, Marks> {
        self.marks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `image_id` was ensured (pulled or found present) for a pod at `at`.
    pub fn ensured(&self, image_id: &str, at: SystemTime) {
        mark(&mut self.marks(), image_id, at);
    }

    /// Marks `image_id` ensured at `at`, unless a GC run is removing it:
    /// then nothing is marked and the removal is returned to wait for (the
    /// image may be gone after it: look again).
    pub fn ensured_unless_removing(&self, image_id: &str, at: SystemTime) -> Result<(), RemovalInFlight> {
        let mut m = self.marks();
        if let Some(done) = m.removing.get(image_id) {
            return Err(RemovalInFlight(done.clone()));
        }
        mark(&mut m, image_id, at);
        Ok(())
    }

    /// Claims the removal of `image_id` (known by `names`) for a GC run that
    /// began at `since`: `None` when it was ensured since, a pull of one of
    /// its names is in flight, or another removal of it is.
    pub fn claim_removal(&self, image_id: &str, names: &[String], since: SystemTime) -> Option<RemovalClaim> {
        match self.claim_client_removal(image_id, names, since) {
            Ok(ClientClaim::Mine(claim)) => Some(claim),
            Ok(ClientClaim::Other(_)) | Err(_) => None,
        }
    }

    /// [`InUseHints::claim_removal`] for a client's `RemoveImage` (the
    /// kubelet's GC through the CRI front), which says why it may not
    /// remove: `Err` when the image was ensured at or after `since` or a
    /// pull of one of its names is in flight; [`ClientClaim::Other`] when
    /// another removal of it holds the claim (wait for it, then ask again).
    pub fn claim_client_removal(
        &self,
        image_id: &str,
        names: &[String],
        since: SystemTime,
    ) -> Result<ClientClaim, Kept> {
        let mut m = self.marks();
        if let Some(at) = m.ensured.get(image_id).filter(|at| **at >= since) {
            return Err(Kept::Ensured { at: *at });
        }
        if self.pulling_any(names.iter()) {
            return Err(Kept::Pulling);
        }
        if let Some(done) = m.removing.get(image_id) {
            return Ok(ClientClaim::Other(RemovalInFlight(done.clone())));
        }
        m.removing.insert(image_id.to_string(), Arc::new(Semaphore::new(0)));
        Ok(ClientClaim::Mine(RemovalClaim { hints: self.clone(), image_id: image_id.to_string() }))
    }

    /// A pull of `reference` (normalised, as the runtime names images) is in
    /// flight until the returned guard is dropped: the image it replaces, if
    /// present, counts as in use meanwhile.
    pub fn pull_started(&self, reference: &str) -> PullInFlight {
        *self.pulling.lock().unwrap_or_else(PoisonError::into_inner).entry(reference.to_string()).or_insert(0) += 1;
        PullInFlight { hints: self.clone(), reference: reference.to_string() }
    }

    /// Whether any of these references has a pull in flight.
    pub fn pulling_any<'a>(&self, mut references: impl Iterator<Item = &'a String>) -> bool {
        let m = self.pulling.lock().unwrap_or_else(PoisonError::into_inner);
        !m.is_empty() && references.any(|r| m.contains_key(r))
    }

    /// Image ids ensured at or after `since`.
    pub fn ensured_since(&self, since: SystemTime) -> Vec<String> {
        self.marks().ensured.iter().filter(|(_, at)| **at >= since).map(|(id, _)| id.clone()).collect()
    }

    /// Image ids ensured within `window` before `now`; hints older than
    /// both the window and an hour are dropped.
    pub fn recent(&self, now: SystemTime, window: Duration) -> Vec<String> {
        let age = |at: &SystemTime| now.duration_since(*at).unwrap_or(Duration::ZERO);
        let mut m = self.marks();
        let keep = window.max(REMEMBER);
        m.ensured.retain(|_, at| age(at) <= keep);
        m.ensured.iter().filter(|(_, at)| age(at) <= window).map(|(id, _)| id.clone()).collect()
    }
}

fn mark(m: &mut Marks, image_id: &str, at: SystemTime) {
    match m.ensured.get_mut(image_id) {
        Some(t) => *t = at,
        None => {
            m.ensured.insert(image_id.to_string(), at);
        }
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

    #[tokio::test]
    async fn a_removal_is_refused_for_an_image_ensured_or_pulled_since_its_run_began() {
        let h = InUseHints::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let names = ["docker.io/library/nginx:1.27".to_string()];
        h.ensured("sha256:a", t0 - Duration::from_secs(5));
        let claim = h.claim_removal("sha256:a", &names, t0).expect("ensured before the run: removable");
        assert!(h.claim_removal("sha256:a", &names, t0).is_none(), "one removal of an image at a time");
        drop(claim);
        h.ensured("sha256:a", t0 + Duration::from_secs(1));
        assert!(h.claim_removal("sha256:a", &names, t0).is_none(), "ensured since the run began");
        let pulling = h.pull_started(&names[0]);
        assert!(h.claim_removal("sha256:b", &names, t0).is_none(), "a pull of its name in flight");
        drop(pulling);
        assert!(h.claim_removal("sha256:b", &names, t0).is_some());
        // A window of 0 s (min age 0) does not forget an ensure a run compares with.
        assert!(h.recent(t0 + Duration::from_secs(2), Duration::ZERO).is_empty());
        assert!(h.claim_removal("sha256:a", &names, t0).is_none(), "still remembered");
    }

    #[tokio::test]
    async fn a_clients_removal_is_told_why_it_is_refused_and_waits_for_another() {
        let h = InUseHints::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let names = ["docker.io/library/nginx:1.27".to_string()];
        let given = t0 + Duration::from_secs(3);
        h.ensured("sha256:a", given);
        assert_eq!(h.claim_client_removal("sha256:a", &names, t0).err(), Some(Kept::Ensured { at: given }));
        let later = t0 + Duration::from_secs(4);
        let Ok(ClientClaim::Mine(claim)) = h.claim_client_removal("sha256:a", &names, later) else {
            panic!("given before since: claimed")
        };
        let Ok(ClientClaim::Other(first)) = h.claim_client_removal("sha256:a", &names, later) else {
            panic!("another removal holds it: wait for it, no refusal")
        };
        assert!(h.claim_removal("sha256:a", &names, later).is_none(), "a GC run does not take it either");
        drop(claim);
        first.ended().await;
        assert!(matches!(h.claim_client_removal("sha256:a", &names, later), Ok(ClientClaim::Mine(_))), "then its turn");
        let pulling = h.pull_started(&names[0]);
        assert_eq!(h.claim_client_removal("sha256:b", &names, later).err(), Some(Kept::Pulling));
        drop(pulling);
        assert!(matches!(h.claim_client_removal("sha256:b", &names, later), Ok(ClientClaim::Mine(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn an_ensure_waits_for_a_removal_in_flight_and_is_not_marked_meanwhile() {
        let h = InUseHints::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let claim = h.claim_removal("sha256:a", &[], t0).expect("claimed");
        let waiting = h.ensured_unless_removing("sha256:a", t0 + Duration::from_secs(1)).expect_err("being removed");
        assert!(h.recent(t0 + Duration::from_secs(1), Duration::from_secs(60)).is_empty(), "not marked");
        let ended = tokio::spawn(waiting.ended());
        tokio::task::yield_now().await;
        assert!(!ended.is_finished(), "waits while the removal runs");
        drop(claim);
        tokio::time::timeout(Duration::from_secs(1), ended).await.expect("woken").expect("joins");
        // Ended before the wait began: no wait at all.
        let claim = h.claim_removal("sha256:b", &[], t0).expect("claimed");
        let waiting = h.ensured_unless_removing("sha256:b", t0).expect_err("being removed");
        drop(claim);
        tokio::time::timeout(Duration::from_millis(1), waiting.ended()).await.expect("at once");
        h.ensured_unless_removing("sha256:b", t0).expect("no removal now: marked");
        assert_eq!(h.recent(t0, Duration::from_secs(60)), ["sha256:b"]);
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
