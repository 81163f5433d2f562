//! The prefetch ticker: keeps the declared images (`[prefetch] images`)
//! pulled. At start and every `prefetch.refresh` it prefetches each in
//! turn through the image manager ([`ImageManager::prefetch`]): a present
//! image costs one presence check; an absent one is queued at
//! [`PRIORITY`] with the node's credentials, and its pull goes on without
//! the ticker (the prefetch's own task records and logs its end). A round
//! that is still being admitted when the next tick comes (a full pull
//! queue) is not doubled: that tick is skipped.
//!
//! What each round made of each image — present, pulling, failed and why —
//! is kept in [`DeclaredImages`], which the node reads without a round trip
//! (`imagectl status`, `imaged_prefetch_images{state}`).
//!
//! The actor is a shell: what to prefetch comes from the configuration,
//! and everything a prefetch does is the manager's. It lives with the
//! node's wiring, above the ensure flow it drives (`tests/layering.rs`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use actix::prelude::*;
use tracing::{debug, info, warn};

use crate::ensure::{ImageManager, Prefetch, PrefetchRequest};

/// The declared images' pull priority: below pods' (0), so a pod's pull
/// queued meanwhile goes first.
pub const PRIORITY: i32 = -1;

/// What came of a declared image at its last check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeclaredState {
    /// Not checked yet: the first round, or one of a new list, has not
    /// come to it.
    Pending,
    /// On the node (found, or pulled by a round), with its image reference.
    Present(String),
    /// A pull is queued or running.
    Pulling,
    /// Not queued, or its pull failed: why. Tried again at each refresh,
    /// and failed still (since its first failure, with the last one's
    /// reason) while the retry runs, until one succeeds.
    Failed(String),
}

impl DeclaredState {
    /// Every state's name, as `imaged_prefetch_images{state}` and the API say it.
    pub const NAMES: [&'static str; 4] = ["pending", "present", "pulling", "failed"];

    /// This state's name.
    pub fn name(&self) -> &'static str {
        match self {
            DeclaredState::Pending => "pending",
            DeclaredState::Present(_) => "present",
            DeclaredState::Pulling => "pulling",
            DeclaredState::Failed(_) => "failed",
        }
    }
}

/// A declared image and its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredImage {
    /// The image, fully qualified, as declared.
    pub image: String,
    /// What came of it.
    pub state: DeclaredState,
    /// When it came to `state`.
    pub since: SystemTime,
    /// Which check of it `state` is the outcome of: a pull's end that
    /// comes after a later check (a pull under other credentials, a pull
    /// of an entry removed and declared again) changes nothing.
    check: u64,
}

/// The declared images in the list's order, with their states: a cheap
/// handle the ticker writes and the node reads.
#[derive(Debug, Clone, Default)]
pub struct DeclaredImages {
    images: Arc<Mutex<Vec<DeclaredImage>>>,
    /// Checks numbered across the whole list, so an entry declared again
    /// never takes a number its earlier self gave a pull.
    checks: Arc<std::sync::atomic::AtomicU64>,
    metrics: crate::metrics::Metrics,
}

impl DeclaredImages {
    fn new(images: &[String], metrics: crate::metrics::Metrics) -> Self {
        let this = Self { images: Arc::default(), checks: Arc::default(), metrics };
        this.replace(images);
        this
    }

    /// Every declared image with its state, in the list's order.
    pub fn snapshot(&self) -> Vec<DeclaredImage> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<DeclaredImage>> {
        // A panic while holding it cannot leave the list half-written.
        self.images.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new list: images still declared keep their states; new ones are
    /// pending. The node calls it when it sends the list to the ticker, so
    /// a status read at once shows the new list.
    pub(super) fn replace(&self, images: &[String]) {
        let mut list = self.lock();
        let now = SystemTime::now();
        let next = images
            .iter()
            .map(|image| match list.iter().find(|d| d.image == *image) {
                Some(kept) => kept.clone(),
                None => DeclaredImage { image: image.clone(), state: DeclaredState::Pending, since: now, check: 0 },
            })
            .collect();
        *list = next;
        self.count(&list);
    }

    /// A round's check of `image` came to `state`: a new check, whose
    /// number (for [`finish`](Self::finish)) is returned; `None` when the
    /// image is no longer declared (it stays off the list).
    fn checked(&self, image: &str, state: DeclaredState) -> Option<u64> {
        let mut list = self.lock();
        let d = list.iter_mut().find(|d| d.image == image)?;
        let check = self.checks.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        d.check = check;
        // A retry leaves a failure as it is until it ends.
        let retrying_a_failure = matches!(d.state, DeclaredState::Failed(_)) && state == DeclaredState::Pulling;
        if !retrying_a_failure {
            Self::put(d, state);
            self.count(&list);
        }
        Some(check)
    }

    /// The pull check number `check` of `image` started ended in `state`,
    /// unless a later check (or a new entry of the name) came since.
    fn finish(&self, image: &str, check: u64, state: DeclaredState) {
        let mut list = self.lock();
        if let Some(d) = list.iter_mut().find(|d| d.image == image && d.check == check) {
            Self::put(d, state);
            self.count(&list);
        }
    }

    fn put(d: &mut DeclaredImage, state: DeclaredState) {
        if d.state.name() != state.name() {
            d.since = SystemTime::now();
        }
        d.state = state;
    }

    fn count(&self, list: &[DeclaredImage]) {
        let by_state = DeclaredState::NAMES.map(|name| (name, list.iter().filter(|d| d.state.name() == name).count()));
        self.metrics.set_prefetch_images(&by_state);
    }
}

/// See the module docs.
pub struct PrefetchTickerActor {
    manager: ImageManager,
    images: Arc<[String]>,
    declared: DeclaredImages,
    refresh: Option<Duration>,
    /// The refresh timer, replaced when a reload changes the period.
    timer: Option<SpawnHandle>,
    /// A round is being admitted.
    busy: bool,
    /// The list changed while a round was being admitted: a round of the
    /// new list runs when that one ends.
    again: bool,
}

/// Replaces the declared list and its refresh period (a SIGHUP reload of
/// `[prefetch] images`, `refresh`): a round of the new list runs at once
/// when the list changed (an image added is pulled now, not at the next
/// refresh), and the timer restarts when the period changed. A round
/// being admitted finishes with the list it began with, and the new list's
/// round follows it.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct UpdatePrefetchList {
    /// The images, fully qualified.
    pub images: Vec<String>,
    /// The refresh period (`None`: no refresh).
    pub refresh: Option<Duration>,
}

impl PrefetchTickerActor {
    /// A ticker for `images` (fully qualified), every `refresh` (`None`:
    /// once, at start).
    /// `metrics` gets `imaged_prefetch_images{state}`.
    pub fn new(
        manager: ImageManager,
        images: Vec<String>,
        refresh: Option<Duration>,
        metrics: crate::metrics::Metrics,
    ) -> Self {
        let declared = DeclaredImages::new(&images, metrics);
        Self { manager, images: images.into(), declared, refresh, timer: None, busy: false, again: false }
    }

    /// The declared images' states, as this ticker keeps them.
    pub fn declared(&self) -> DeclaredImages {
        self.declared.clone()
    }

    fn start_timer(&mut self, ctx: &mut Context<Self>) {
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
        self.timer = self.refresh.map(|every| ctx.run_interval(every, Self::round));
    }

    fn round(&mut self, ctx: &mut Context<Self>) {
        if self.busy {
            debug!("prefetch: the last round is still being admitted; this tick is skipped");
            return;
        }
        self.busy = true;
        let (manager, images, declared) = (self.manager.clone(), self.images.clone(), self.declared.clone());
        let round = async move {
            for image in images.iter() {
                prefetch_one(&manager, image, &declared).await;
            }
        };
        ctx.spawn(round.into_actor(self).map(|(), actor, ctx| {
            actor.busy = false;
            if std::mem::take(&mut actor.again) {
                actor.round(ctx);
            }
        }));
    }
}

/// Prefetches one declared image, saying what came of it (in the log and
/// in `declared`; a pull's end is recorded when it comes, by a task of its
/// own, so the round goes on to the next image at once).
async fn prefetch_one(manager: &ImageManager, image: &str, declared: &DeclaredImages) {
    let req = PrefetchRequest { priority: PRIORITY, ..PrefetchRequest::new(image) };
    match manager.prefetch(&req).await {
        Ok(Prefetch::Present { image_ref }) => {
            debug!(image, "prefetch: declared image present");
            declared.checked(image, DeclaredState::Present(image_ref));
        }
        Ok(Prefetch::Pulling { joined, done }) => {
            info!(image, joined, "prefetch: pulling a declared image");
            let Some(check) = declared.checked(image, DeclaredState::Pulling) else { return };
            let (declared, image) = (declared.clone(), image.to_string());
            actix::spawn(async move {
                let state = match done.await {
                    Ok(image_ref) => DeclaredState::Present(image_ref),
                    Err(e) => DeclaredState::Failed(e),
                };
                declared.finish(&image, check, state);
            });
        }
        Err(e) => {
            warn!(image, reason = %e.kind, error = %e.message, "prefetch: declared image not queued; trying again at the next refresh");
            declared.checked(image, DeclaredState::Failed(format!("{}: {}", e.kind, e.message)));
        }
    }
}

impl Handler<crate::actors::Stop> for PrefetchTickerActor {
    type Result = ();
    fn handle(&mut self, _: crate::actors::Stop, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Handler<UpdatePrefetchList> for PrefetchTickerActor {
    type Result = ();
    fn handle(&mut self, m: UpdatePrefetchList, ctx: &mut Self::Context) {
        let changed_list = *self.images != *m.images;
        let changed_period = self.refresh != m.refresh;
        info!(images = m.images.len(), refresh = ?m.refresh, "prefetch: declared list replaced");
        self.declared.replace(&m.images);
        self.images = m.images.into();
        self.refresh = m.refresh;
        if changed_period {
            self.start_timer(ctx);
        }
        if changed_list && self.busy {
            debug!("prefetch: a round is being admitted; the new list's round follows it");
            self.again = true;
        } else if changed_list {
            self.round(ctx);
        }
    }
}

impl Actor for PrefetchTickerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.round(ctx);
        self.start_timer(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(d: &DeclaredImages) -> Vec<&'static str> {
        d.snapshot().iter().map(|i| i.state.name()).collect()
    }

    #[test]
    fn a_pulls_end_counts_only_for_the_check_that_started_it() {
        let d = DeclaredImages::new(&["a".into(), "b".into()], crate::metrics::Metrics::default());
        assert_eq!(names(&d), ["pending", "pending"]);
        let first = d.checked("a", DeclaredState::Pulling).expect("declared");
        // A later round's pull (other credentials: not joined) ends first.
        let second = d.checked("a", DeclaredState::Pulling).expect("declared");
        d.finish("a", second, DeclaredState::Present("sha256:1".into()));
        d.finish("a", first, DeclaredState::Failed("late".into()));
        assert_eq!(d.snapshot()[0].state, DeclaredState::Present("sha256:1".into()), "the stale end is dropped");

        // Taken off the list and declared again: the old pull's end is not its.
        let old = d.checked("b", DeclaredState::Pulling).expect("declared");
        d.replace(&["a".into()]);
        assert_eq!(d.checked("b", DeclaredState::Pulling), None, "off the list, it stays off");
        d.replace(&["a".into(), "b".into()]);
        let new = d.checked("b", DeclaredState::Pulling).expect("declared again");
        assert_ne!(old, new);
        d.finish("b", old, DeclaredState::Failed("the old pull".into()));
        assert_eq!(names(&d), ["present", "pulling"]);
    }

    #[test]
    fn a_retry_leaves_a_failure_failed_since_its_first_time() {
        let d = DeclaredImages::new(&["a".into()], crate::metrics::Metrics::default());
        let check = d.checked("a", DeclaredState::Pulling).expect("declared");
        d.finish("a", check, DeclaredState::Failed("not found".into()));
        let failed = d.snapshot().remove(0);
        std::thread::sleep(Duration::from_millis(2));
        let retry = d.checked("a", DeclaredState::Pulling).expect("declared");
        assert_eq!(d.snapshot()[0], DeclaredImage { check: retry, ..failed.clone() }, "still failed while it retries");
        d.finish("a", retry, DeclaredState::Failed("still not found".into()));
        let again = d.snapshot().remove(0);
        assert_eq!((again.state, again.since), (DeclaredState::Failed("still not found".into()), failed.since));
        let ok = d.checked("a", DeclaredState::Pulling).expect("declared");
        d.finish("a", ok, DeclaredState::Present("sha256:2".into()));
        assert!(d.snapshot()[0].since > failed.since, "present since the pull ended");
    }
}
