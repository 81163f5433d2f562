//! The detector ticker: every `gc.detect_period` (and at start) it lists
//! images and containers (all states) through the CRI gateway, works out
//! which images are in use ([`images_in_use`]: containers' images, the
//! sandbox image by its resolved id, images ensured within the min-age
//! window or with a pull in flight), updates the image records as the
//! kubelet's `detectImages` does ([`Records::detect`]), and persists what
//! changed.
//! It is the records' only writer; the GC executor asks it for a detection.
//! The actor is a shell: [`Detector`] holds the records and decides, the
//! actor lists through the gateway and writes to the store.

mod detection;
#[cfg(test)]
mod tests;

pub use detection::{Detector, Listed, RecordWrite};

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::prelude::*;
use tracing::{debug, info, warn};

use crate::actors::cri_gateway::{GetImageStatus, ListContainers, ListImages, ListPodSandboxes};
use crate::clock::Clock;
use crate::cri::{CriError, CriErrorKind};
use crate::domain::{ContainerFilter, ImageSpec, PodSandboxFilter};
use crate::gc::detect::Records;
use crate::gc::in_use::{ENSURED_BEFORE_RESTART, InUse};
use crate::gc::in_use_hints::InUseHints;
use crate::store::Store;

/// What the detector needs from the CRI gateway (its recipients).
#[derive(Clone)]
pub struct DetectorCri {
    /// `ListImages`.
    pub list_images: Recipient<ListImages>,
    /// `ListContainers`.
    pub list_containers: Recipient<ListContainers>,
    /// `ListPodSandboxes` (pod names for explanations).
    pub list_sandboxes: Recipient<ListPodSandboxes>,
    /// `GetImageStatus` (resolving the sandbox image).
    pub image_status: Recipient<GetImageStatus>,
}

/// The detector's mailbox capacity unless its settings say otherwise.
pub const DEFAULT_MAILBOX_CAPACITY: usize = 64;

/// The detector's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetectorSettings {
    /// Detection period (the kubelet's 5 minutes).
    pub period: Duration,
    /// The sandbox image reference; empty = none.
    pub sandbox_image: String,
    /// Images ensured within this window count as in use (GC's min age).
    pub recent_window: Duration,
    /// Mailbox capacity, set in `started()` (`gc.detector_mailbox_capacity`,
    /// [`DEFAULT_MAILBOX_CAPACITY`] by default).
    pub mailbox_capacity: usize,
}

/// One detection: the records after it and who uses what.
#[derive(Debug, Clone)]
pub struct Detection {
    /// When it ran (wall clock).
    pub at: SystemTime,
    /// The records (shared; the detector copies on its next write).
    pub records: Arc<Records>,
    /// Image id → who uses it (`namespace/pod/container`, `sandbox image`,
    /// `ensured recently`, `pull in flight`; see [`images_in_use`]). Not
    /// the images kept by the restart grace: [`Detection::used_by`] and
    /// [`Detection::is_in_use`] say everything.
    pub in_use: InUse,
    /// The sandbox image's id, when it is present.
    pub sandbox_image_id: Option<String>,
    /// While the restart grace lasts: every image in use
    /// ([`ENSURED_BEFORE_RESTART`]; see [`Detector::load`]).
    restart_grace: Option<Arc<detection::RestartGrace>>,
}

impl Detection {
    /// Whether image `id` is in use (by [`Detection::in_use`] or the
    /// restart grace).
    pub fn is_in_use(&self, id: &str) -> bool {
        self.in_use.contains_key(id) || self.in_grace(id)
    }

    /// Who uses image `id` (empty: nobody).
    pub fn used_by(&self, id: &str) -> Vec<String> {
        let mut who = self.in_use.get(id).cloned().unwrap_or_default();
        if self.in_grace(id) {
            who.push(ENSURED_BEFORE_RESTART.to_string());
        }
        who
    }

    /// The ids in use, among the records'.
    pub fn in_use_ids(&self) -> HashSet<String> {
        let mut ids: HashSet<String> = self.in_use.keys().cloned().collect();
        if self.restart_grace.is_some() {
            ids.extend(self.records.iter().filter(|r| self.in_grace(&r.key.id)).map(|r| r.key.id.clone()));
        }
        ids
    }

    /// Whether the restart grace keeps image `id` (while it lasts, every
    /// image).
    fn in_grace(&self, id: &str) -> bool {
        self.restart_grace.as_ref().is_some_and(|g| g.knows(id))
    }
}

impl crate::gc::detect::InUseIds for Detection {
    fn contains_id(&self, id: &str) -> bool {
        self.is_in_use(id)
    }
}

/// Runs a detection now and returns it.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<Arc<Detection>, CriError>")]
pub struct DetectImages;

/// The last detection, without running one.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Option<Arc<Detection>>")]
pub struct GetLastDetection;

/// Changes the "ensured recently" window (`gc.image_minimum_gc_age`) from
/// the next detection on (SIGHUP, [`crate::node::Node::update_gc_policy`]).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct SetRecentWindow(pub Duration);

#[derive(Message)]
#[rtype(result = "()")]
struct Tick;

/// How a records write ended (see [`Detector::persisted`]).
#[derive(Message)]
#[rtype(result = "()")]
struct Persisted(Result<Vec<crate::gc::record::RecordKey>, ()>);

/// The detector actor: a shell over [`Detector`] that lists through the
/// gateway and writes records to the store. See `actors.md`.
pub struct DetectorActor {
    detector: Detector,
    cri: DetectorCri,
    store: Option<Arc<Store>>,
    mailbox_capacity: usize,
    period: Duration,
    in_flight: bool,
}

fn closed(_: MailboxError) -> CriError {
    CriError::new(CriErrorKind::RuntimeUnavailable, "CRI gateway stopped")
}

impl DetectorActor {
    /// A detector; with a `store`, records are loaded from it at start and
    /// every change is written back.
    pub fn new(
        cfg: DetectorSettings,
        cri: DetectorCri,
        store: Option<Arc<Store>>,
        hints: InUseHints,
        clock: Clock,
    ) -> Self {
        Self {
            detector: Detector::new(&cfg, hints, clock),
            cri,
            store,
            mailbox_capacity: cfg.mailbox_capacity,
            period: cfg.period,
            in_flight: false,
        }
    }

    fn detect(&mut self) -> ResponseActFuture<Self, Result<Arc<Detection>, CriError>> {
        self.in_flight = true;
        let list = list(self.cri.clone(), self.detector.sandbox_image().to_string());
        Box::pin(list.into_actor(self).map(|listed, act, ctx| {
            act.in_flight = false;
            let listed = listed.inspect_err(|e| warn!(error = %e, "Failed to monitor images"))?;
            let (detection, write) = act.detector.apply(listed);
            if let Some(write) = write {
                act.persist(write, ctx.address());
            }
            Ok(detection)
        }))
    }

    /// Writes the changed records off the actor's thread, then tells the
    /// detector how it went ([`Persisted`]): touched records the store did
    /// not have are written whole next time, and after a failed write every
    /// record is. The records in memory stay right either way.
    fn persist(&self, write: RecordWrite, me: Addr<Self>) {
        let Some(store) = self.store.clone() else { return };
        actix::spawn(async move {
            let r = crate::blocking::unblock(move || {
                if write.replace_all {
                    store.replace_image_records(&write.upserts).map(|()| Vec::new())
                } else {
                    store.apply_image_records_touching(&write.upserts, &write.used, write.used_at, &write.deletes)
                }
            })
            .await;
            let outcome = match r {
                Ok(Ok(missing)) => Ok(missing),
                Ok(Err(e)) => {
                    warn!(error = %e, "could not persist image records; all are written at the next detection");
                    Err(())
                }
                Err(e) => {
                    warn!(error = %e, "could not persist image records; all are written at the next detection");
                    Err(())
                }
            };
            // A stopped detector has nothing left to write.
            let _ = me.try_send(Persisted(outcome));
        });
    }
}

/// Lists what one detection needs: images and containers (a failure fails
/// the detection), sandboxes and the sandbox image (a failure only loses
/// pod names; a sandbox image whose status fails is found by its name in
/// the list, or by the id it had last time).
async fn list(cri: DetectorCri, sandbox_image: String) -> Result<Listed, CriError> {
    let all = ContainerFilter::default();
    let (images, containers, sandboxes) = tokio::join!(
        cri.list_images.send(ListImages::default()),
        cri.list_containers.send(ListContainers { filter: all }),
        cri.list_sandboxes.send(ListPodSandboxes { filter: PodSandboxFilter::default() }),
    );
    let sandbox = if sandbox_image.is_empty() {
        None
    } else {
        cri.image_status
            .send(GetImageStatus { image: ImageSpec::new(sandbox_image), verbose: false })
            .await
            .ok()
            .and_then(Result::ok)
    };
    Ok(Listed {
        images: images.map_err(closed)??,
        containers: containers.map_err(closed)??,
        sandboxes: sandboxes.ok().and_then(Result::ok).unwrap_or_default(),
        sandbox,
    })
}

impl Actor for DetectorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
        if let Some(store) = self.store.clone() {
            // Load durable records before the first detection (the mailbox
            // waits meanwhile), so first-detected and last-used survive restarts.
            let load = async move { crate::blocking::unblock(move || store.image_records_with_skipped()).await };
            ctx.wait(load.into_actor(self).map(|r, act, _| match r {
                Ok(Ok((records, skipped))) => {
                    info!(records = records.len(), skipped, "image records loaded");
                    act.detector.load(records);
                }
                Ok(Err(e)) => warn!(error = %e, "could not load image records; starting without them"),
                Err(e) => warn!(error = %e, "could not load image records; starting without them"),
            }));
        }
        ctx.notify(Tick);
        ctx.run_interval(self.period, |_, ctx| ctx.notify(Tick));
    }
}

impl Handler<Tick> for DetectorActor {
    type Result = ();
    /// Detects unless a detection is running.
    fn handle(&mut self, _: Tick, ctx: &mut Self::Context) {
        if self.in_flight {
            debug!("detection still running; tick skipped");
            return;
        }
        let fut = self.detect().map(|_, _, _| ());
        ctx.spawn(fut);
    }
}

impl Handler<DetectImages> for DetectorActor {
    type Result = ResponseActFuture<Self, Result<Arc<Detection>, CriError>>;
    /// Detects now.
    fn handle(&mut self, _: DetectImages, _: &mut Self::Context) -> Self::Result {
        self.detect()
    }
}

impl Handler<Persisted> for DetectorActor {
    type Result = ();
    fn handle(&mut self, Persisted(outcome): Persisted, _: &mut Self::Context) {
        self.detector.persisted(outcome);
    }
}

impl Handler<SetRecentWindow> for DetectorActor {
    type Result = ();
    /// The window applies from the next detection; one running keeps its own.
    fn handle(&mut self, SetRecentWindow(window): SetRecentWindow, _: &mut Self::Context) {
        info!(recent_window = ?window, "detector: ensured-recently window updated");
        self.detector.set_recent_window(window);
    }
}

impl Handler<GetLastDetection> for DetectorActor {
    type Result = MessageResult<GetLastDetection>;
    /// The last detection.
    fn handle(&mut self, _: GetLastDetection, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.detector.last())
    }
}
