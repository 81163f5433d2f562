//! The detector's logic, without actix: one detection over what the runtime
//! listed, the kubelet's record rules ([`Records::detect`]) and the records
//! to write back. The actor ([`super::DetectorActor`]) lists, calls
//! [`Detector::apply`] and runs the write it returns.

#[cfg(test)]
mod tests;

use std::sync::Arc;

use tracing::debug;

use super::{Detection, DetectorSettings};
use crate::clock::Clock;
use crate::domain::{Container, Image, ImageStatus, PodSandbox};
use crate::gc::detect::Records;
use crate::gc::in_use::{InUseSources, images_in_use};
use crate::gc::in_use_hints::InUseHints;
use crate::gc::record::{ImageRecord, RecordKey};

/// What one detection lists from the runtime.
#[derive(Debug, Clone, Default)]
pub struct Listed {
    /// Every image.
    pub images: Vec<Image>,
    /// Every container, in any state.
    pub containers: Vec<Container>,
    /// Pod sandboxes (pod names for explanations only).
    pub sandboxes: Vec<PodSandbox>,
    /// The sandbox image's status, when it resolved.
    pub sandbox: Option<ImageStatus>,
}

/// The records a detection changed, to write to the store.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordWrite {
    /// Every record is written and nothing else kept (after a failed
    /// write: what the store holds is unknown).
    pub replace_all: bool,
    /// Records added or changed (whole).
    pub upserts: Vec<ImageRecord>,
    /// Records whose only change is being last used at `used_at`.
    pub used: Vec<RecordKey>,
    /// When `used` were last used.
    pub used_at: std::time::SystemTime,
    /// Records of images no longer listed.
    pub deletes: Vec<RecordKey>,
}

/// What the last write left for the next one.
#[derive(Debug, Default)]
enum Rewrite {
    #[default]
    Nothing,
    /// Touched records the store did not have: write them whole.
    Records(Vec<RecordKey>),
    /// The write failed: replace every record.
    All,
}

/// The detector's state: the image records, the last detection, and what
/// decides "in use" (the manager's hints, the sandbox image, the window).
#[derive(Debug)]
pub struct Detector {
    sandbox_image: String,
    /// The id the sandbox image resolved to last (kept when a later
    /// `ImageStatus` of it fails).
    sandbox_id: Option<String>,
    recent_window: std::time::Duration,
    records: Arc<Records>,
    hints: InUseHints,
    clock: Clock,
    last: Option<Arc<Detection>>,
    rewrite: Rewrite,
    /// After records were loaded from the store: the ids they knew, which
    /// count as in use until the deadline (see [`Detector::load`]).
    restart_grace: Option<Arc<RestartGrace>>,
}

/// Until when every image counts as in use after a start on durable
/// records ("maybe ensured before imaged started"). Shared with each detection
/// in the grace rather than copied into its `in_use` (at 100,000 images that
/// copy took 23 MB).
#[derive(Debug)]
pub(super) struct RestartGrace {
    until: std::time::SystemTime,
}

impl RestartGrace {
    /// Whether the grace keeps image `id`: every image, those the loaded
    /// records did not know too — an image pulled and ensured just before
    /// a crash, before any detection recorded it, was told to a pod as
    /// much as one the records knew (and, never used, the max-age pass
    /// would take it at once: the loop's durable start is long past).
    #[allow(clippy::unused_self)] // the question is the grace's; the answer is the same for every id
    pub(super) fn knows(&self, _id: &str) -> bool {
        true
    }
}

impl Detector {
    /// A detector with no records yet.
    pub fn new(cfg: &DetectorSettings, hints: InUseHints, clock: Clock) -> Self {
        Self {
            sandbox_image: cfg.sandbox_image.clone(),
            sandbox_id: None,
            recent_window: cfg.recent_window,
            records: Arc::new(Records::default()),
            hints,
            clock,
            last: None,
            rewrite: Rewrite::Nothing,
            restart_grace: None,
        }
    }

    /// How the last [`RecordWrite`] ended: `Ok` with the touched records the
    /// store did not have (written whole next time), or `Err` (every record
    /// is written next time, as what the store holds is unknown).
    pub fn persisted(&mut self, outcome: Result<Vec<RecordKey>, ()>) {
        self.rewrite = match (std::mem::take(&mut self.rewrite), outcome) {
            (Rewrite::All, _) | (_, Err(())) => Rewrite::All,
            (Rewrite::Records(mut keys), Ok(more)) => {
                keys.extend(more);
                Rewrite::Records(keys)
            }
            (Rewrite::Nothing, Ok(keys)) if keys.is_empty() => Rewrite::Nothing,
            (Rewrite::Nothing, Ok(keys)) => Rewrite::Records(keys),
        };
    }

    /// The sandbox image to resolve before each detection ("" = none).
    pub fn sandbox_image(&self) -> &str {
        &self.sandbox_image
    }

    /// Images ensured within `window` count as in use from the next
    /// detection on (a reload of `gc.image_minimum_gc_age`).
    pub fn set_recent_window(&mut self, window: std::time::Duration) {
        self.recent_window = window;
    }

    /// Records loaded from the store replace the ones in memory.
    ///
    /// Every image also counts as in use for one "ensured recently" window
    /// from now ([`ENSURED_BEFORE_RESTART`](crate::gc::in_use::ENSURED_BEFORE_RESTART)): the hints of which images were
    /// ensured just before a restart (or a crash) died with the process, and
    /// durable first-detected times (and the GC loop's durable start, which
    /// lets the max-age pass run at once) no longer make every image safe
    /// after a restart, as they do in the kubelet (whose records live in
    /// memory). An image the kubelet was just told is present is not
    /// collected before its container starts, whether a detection recorded
    /// it before the crash or not, and whether there were records at all.
    /// The grace does not count as a use: last-used times stay as they were.
    pub fn load(&mut self, records: Vec<ImageRecord>) {
        self.restart_grace = (!self.recent_window.is_zero())
            .then(|| Arc::new(RestartGrace { until: self.clock.now() + self.recent_window }));
        self.records = Arc::new(records.into_iter().collect());
    }

    /// One detection over `listed`, now: who uses which image, the records
    /// updated by the kubelet's rules, and what to write back (`None` when
    /// nothing changed).
    pub fn apply(&mut self, listed: Listed) -> (Arc<Detection>, Option<RecordWrite>) {
        // The last detection shares the records; let it go first, so the
        // records are updated in place instead of copied whole (at 100,000
        // images, a second full copy at every detection's peak). A copy is
        // made only while someone else (a GC run planning) still holds one.
        self.last = None;
        let now = self.clock.now();
        let Listed { images, containers, sandboxes, sandbox } = listed;
        let sandbox_image_id = match sandbox {
            Some(status) => status.image.map(|i| i.id),
            None => self.sandbox_fallback(&images),
        };
        if sandbox_image_id.is_some() {
            self.sandbox_id.clone_from(&sandbox_image_id);
        }
        let ensured_recently = self.hints.recent(now, self.recent_window);
        let sources = InUseSources {
            images: &images,
            containers: &containers,
            sandboxes: &sandboxes,
            sandbox_image_id: sandbox_image_id.as_deref(),
            ensured_recently: &ensured_recently,
        };
        let hints = &self.hints;
        let in_use = images_in_use(sources, |i| hints.pulling_any(i.repo_tags.iter().chain(&i.repo_digests)));
        let records = Arc::make_mut(&mut self.records);
        // Used: what a container, the sandbox, an ensure or a pull uses (not
        // the restart grace below, which protects without marking used).
        let diff = records.detect(&images, &in_use, now);
        if self.restart_grace.as_ref().is_some_and(|g| now >= g.until) {
            self.restart_grace = None;
        }
        // The runtime's list is not needed past this point.
        drop((images, containers, sandboxes));
        debug!(
            in_use = in_use.len(),
            added = diff.added.len(),
            updated = diff.updated.len(),
            used = diff.used.len(),
            removed = diff.removed.len(),
            "images detected"
        );
        let write = self.write(diff, now);
        let detection = Arc::new(Detection {
            at: now,
            records: self.records.clone(),
            in_use,
            sandbox_image_id,
            restart_grace: self.restart_grace.clone(),
        });
        self.last = Some(detection.clone());
        (detection, write)
    }

    /// The sandbox image's id when its `ImageStatus` failed (or was not
    /// asked): the listed image carrying its name, else the id it resolved
    /// to last time if that image is still listed. A failed status call must
    /// not leave the sandbox image for GC to remove (the kubelet's
    /// `detectImages` does; found by the simulator, seed 1).
    fn sandbox_fallback(&self, images: &[Image]) -> Option<String> {
        if self.sandbox_image.is_empty() {
            return None;
        }
        let name = crate::domain::reference::parse_normalized_named(&self.sandbox_image)
            .map_or_else(|_| self.sandbox_image.clone(), |n| n.docker_ref());
        images
            .iter()
            .find(|i| i.repo_tags.iter().chain(&i.repo_digests).any(|n| *n == name || *n == self.sandbox_image))
            .or_else(|| self.sandbox_id.as_ref().and_then(|id| images.iter().find(|i| i.id == *id)))
            .map(|i| i.id.clone())
    }

    /// What to write for `diff`, with what the last write left over.
    fn write(&mut self, diff: crate::gc::detect::DetectDiff, now: std::time::SystemTime) -> Option<RecordWrite> {
        let whole = |keys: &mut dyn Iterator<Item = &RecordKey>| -> Vec<ImageRecord> {
            keys.filter_map(|k| self.records.get(k).cloned()).collect()
        };
        match std::mem::take(&mut self.rewrite) {
            Rewrite::All => Some(RecordWrite {
                replace_all: true,
                upserts: self.records.iter().cloned().collect(),
                used: Vec::new(),
                used_at: now,
                deletes: Vec::new(),
            }),
            rewrite => {
                let again = match &rewrite {
                    Rewrite::Records(keys) => keys.as_slice(),
                    _ => &[],
                };
                if diff.is_empty() && again.is_empty() {
                    return None;
                }
                let mut upserts = whole(&mut diff.added.iter().chain(&diff.updated));
                // Written whole, so not touched as well.
                let again: std::collections::HashSet<&RecordKey> = again.iter().collect();
                upserts.extend(whole(&mut again.iter().copied()));
                let used = diff.used.into_iter().filter(|k| !again.contains(k)).collect();
                Some(RecordWrite { replace_all: false, upserts, used, used_at: now, deletes: diff.removed })
            }
        }
    }

    /// The last detection.
    pub fn last(&self) -> Option<Arc<Detection>> {
        self.last.clone()
    }
}
