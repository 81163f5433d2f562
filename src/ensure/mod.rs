//! `EnsureImageExists`: the kubelet's image manager flow over the actors.
//!
//! [`ImageManager`] is a cloneable handle (no actor of its own): each call
//! runs on the caller's task and talks to the CRI gateway (presence
//! checks, through a `CriReader`), the backoff registry and the pull queue
//! (through the recipients of the messages it sends them: a
//! [`BackoffPort`] and a `Recipient<EnqueuePull>`), emitting the kubelet's
//! events with its exact messages. It starts no actor: whoever wires the
//! node (`node::Node`) starts them and hands their ports to
//! [`ImageManager::new`]. See `actors.md` for the actors.
//!
//! - `mod.rs`: the handle and the flow's decision steps (policy, presence).
//! - `request.rs`: the request and its answer ([`EnsureImageRequest`],
//!   [`EnsureOk`], [`EnsureError`]).
//! - `settings.rs`: [`EnsureSettings`].
//! - `credentials.rs`: the credentials a pull tries and what each proves.
//! - `pull.rs`: the pull step (back-off, intent, queue, events, records).
//! - `prefetch.rs`, `presence.rs`, `recorder.rs`, `kubelet_messages.rs`.

mod credentials;
mod kubelet_messages;
mod prefetch;
mod presence;
mod pull;
mod recorder;
mod request;
mod settings;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use actix::Recipient;
use tokio::time::Instant;

use crate::events::{EventReason, EventSink, ImageEvent, ObjectRef};
pub use kubelet_messages::*;
pub use prefetch::{Prefetch, PrefetchDone, PrefetchRequest};
pub use presence::PresenceWindow;
pub use recorder::{PodPullTimes, PullingRecorder};
pub use request::{EnsureError, EnsureImageRequest, EnsureOk, PodInfo, class_of_cri, class_of_pull};
pub use settings::{DEFAULT_PRESENCE_CHECK_WINDOW, EnsureSettings, PRESENCE_CHECK_HOLD};

use crate::actors::backoff_registry::BackoffPort;
use crate::actors::cri_gateway::CriReader;
use crate::actors::pull_queue::EnqueuePull;
use crate::cri::CriError;
use crate::domain::pull_policy::PullPolicy;
use crate::domain::reference::apply_default_image_tag;
use crate::domain::{ErrorClass, ImageErrorKind, ImageSpec};
use crate::metrics::Tristate;
use crate::pull_records::{PullRecords, VerifyPolicy};
use credentials::LazyLookup;

/// Presence checks of one ensure: a present image that GC was removing is
/// looked at again once the removal ends (after that it is absent, or its
/// removal failed); the last look answers as it finds.
const MAX_LOOKS: u32 = 3;

/// How long an ensure that must pull a present image only because a pull
/// of it is in flight here, not yet recorded (`PullRecords::pulls_ended`),
/// waits for that pull: the runtime shows an image a little before its
/// `PullImage` returns (much more under a burst), and the record follows
/// the answer by a commit. Waiting for the pull in flight beats starting
/// another of the same image, which would take as long.
const PULL_END_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a pull found present at its turn waits for the records an
/// earlier pull of the image owes (`RecordsDue::written`): commits only.
const RECORDS_DUE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The handle embedders call. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ImageManager {
    /// Presence checks on the caller's task (the hot path).
    reader: CriReader,
    /// The pull queue's `EnqueuePull`.
    queue: Recipient<EnqueuePull>,
    /// What the ensure flow sends the backoff registry.
    backoff: BackoffPort,
    events: EventSink,
    recorder: PullingRecorder,
    hints: crate::gc::in_use_hints::InUseHints,
    /// KEP-2535 pull intents and records: who may use a present image.
    records: PullRecords,
    /// `applyDefaultImageTag` results: pods name the same images over and
    /// over, and the grammar's regular expression is the costliest step of
    /// a present-image ensure. Bounded; cleared when full.
    defaulted: Arc<Mutex<HashMap<String, DefaultedOrError>>>,
    cfg: EnsureSettings,
    /// Requests by policy/presence/pull-required; pull durations by size.
    metrics: crate::metrics::Metrics,
    /// The node's credentials (config files, plugins), tried after pod secrets.
    node_credentials: Option<Arc<crate::credentials::NodeCredentials>>,
    /// Turns for presence checks (`EnsureSettings::presence_window`).
    presence_checks: Option<presence::PresenceGate>,
    /// The pull queue's records due (`PullQueueSettings::records_due`).
    records_due: crate::actors::pull_queue::RecordsDue,
    /// `Pulled` events answered but not yet told (waiting for the size).
    untold: Arc<crate::settle::Pending>,
}

/// Most remembered `applyDefaultImageTag` results.
const DEFAULTED_CACHE: usize = 4096;

/// A name worked out, or why it could not be.
type DefaultedOrError = Result<Arc<Defaulted>, String>;

/// An image name as pods write it, worked out once (see
/// `ImageManager::defaulted`).
#[derive(Debug)]
struct Defaulted {
    /// The name with the default tag applied.
    image: String,
    /// Its "already present" message: Go-quoting it anew was a tenth of
    /// a present-image ensure's own work.
    present: String,
    /// The name with the default tag, normalised: a pull's credential
    /// lookup and in-use hint need it, and each parse of it cost a pull
    /// about 5 µs.
    named: Result<crate::domain::reference::Named, crate::domain::reference::ReferenceError>,
}

impl ImageManager {
    /// A manager over running actors: the gateway's `reader` (from
    /// `GetReader`) for presence checks, the pull queue's `queue` (its
    /// `EnqueuePull`) and the backoff registry's `backoff` (e.g.
    /// the port `BackoffRegistryActor::start_with_port` returns, so no
    /// `CheckBackoff` is sent while nothing backs off). It reports to a private metrics
    /// registry until [`with_metrics`](Self::with_metrics).
    pub fn new(reader: CriReader, queue: Recipient<EnqueuePull>, backoff: BackoffPort, cfg: EnsureSettings) -> Self {
        Self {
            reader,
            queue,
            backoff,
            events: EventSink::default(),
            recorder: PullingRecorder::default(),
            hints: crate::gc::in_use_hints::InUseHints::default(),
            records: PullRecords::in_memory(VerifyPolicy::default()),
            defaulted: Arc::default(),
            untold: Arc::default(),
            presence_checks: cfg.presence_window().map(|w| presence::PresenceGate::new(w, PRESENCE_CHECK_HOLD)),
            cfg,
            metrics: crate::metrics::Metrics::default(),
            node_credentials: None,
            records_due: crate::actors::pull_queue::RecordsDue::default(),
        }
    }

    /// The same manager waiting on `due` (the queue's
    /// `PullQueueSettings::records_due`) when its pull finds the image an
    /// earlier pull just brought, before that pull's records are written.
    #[must_use]
    pub fn with_records_due(mut self, due: crate::actors::pull_queue::RecordsDue) -> Self {
        self.records_due = due;
        self
    }

    /// Waits until what the ensures answered so far left running is done:
    /// each pull's `Pulled` event told (it waits for the image's size,
    /// looked up after the answer) and its KEP-2535 record written
    /// ([`PullRecords::written`]). For a caller that reads the events or the
    /// records right after an ensure; nothing else needs it.
    pub async fn settled(&self) {
        self.untold.settled(std::time::Duration::MAX).await;
        self.records.written().await;
    }

    /// The manager reporting its requests and pull durations to `metrics`,
    /// and so its default pull records their must-pull checks (records given
    /// by [`ImageManager::with_pull_records`] keep their own metrics handle).
    #[must_use]
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Self {
        self.records = self.records.clone().with_metrics(metrics.clone());
        self.metrics = metrics;
        self
    }

    /// The same manager keeping its pull intents and records in `records`
    /// (by default: in memory only, policy `NeverVerifyPreloadedImages`).
    /// Give the same handle to `GcService::start` so records of
    /// removed images are pruned.
    #[must_use]
    pub fn with_pull_records(mut self, records: PullRecords) -> Self {
        self.records = records;
        self
    }

    /// The pull intents and records (KEP-2535).
    pub fn pull_records(&self) -> &PullRecords {
        &self.records
    }

    /// The same manager, looking up `node` credentials (docker config files,
    /// credential-provider plugins) after each pod's pull secrets.
    #[must_use]
    pub fn with_node_credentials(mut self, node: Arc<crate::credentials::NodeCredentials>) -> Self {
        self.node_credentials = Some(node);
        self
    }

    /// The event sink (subscribe to it for events).
    pub fn events(&self) -> &EventSink {
        &self.events
    }

    /// Marks `image_ref` ensured now, on the pull records' clock: the one
    /// the GC actors read the hints with (`GcService::start`).
    fn mark_ensured(&self, image_ref: &str) {
        self.hints.ensured(image_ref, self.records.clock().now());
    }

    /// Marks `image_ref` ensured now unless GC is removing it; then waits
    /// for the removal to end and returns false (the image may be gone).
    async fn mark_ensured_unless_removed(&self, image_ref: &str) -> bool {
        match self.hints.ensured_unless_removing(image_ref, self.records.clock().now()) {
            Ok(()) => true,
            Err(removal) => {
                tracing::debug!(image_ref, "GC is removing the image; waiting to look again");
                removal.ended().await;
                false
            }
        }
    }

    /// Marks `image_ref` ensured now, after any GC removal of it in flight
    /// (its answer then names an image that may be gone: the container's
    /// creation fails and the kubelet asks again).
    async fn mark_ensured_after_removals(&self, image_ref: &str) {
        while !self.mark_ensured_unless_removed(image_ref).await {}
    }

    /// In-use hints for GC: every image this manager ensures is marked, so
    /// GC keeps it for the min-age window (give these to `GcService::start`).
    pub fn hints(&self) -> &crate::gc::in_use_hints::InUseHints {
        &self.hints
    }

    /// The pod pulling-time recorder.
    pub fn recorder(&self) -> &PullingRecorder {
        &self.recorder
    }

    fn emit(&self, req: &EnsureImageRequest, reason: EventReason, message: &str, class: Option<ErrorClass>) {
        self.events.emit(Self::event(req, reason, message, class));
    }

    /// The `Pulled` "already present" event of a pod that may use the
    /// present image: to subscribers as any event, to the log at debug.
    fn emit_present(&self, req: &EnsureImageRequest, message: &str) {
        if self.events.wants_routine() {
            self.events.emit_routine(Self::event(req, EventReason::Pulled, message, None));
        }
    }

    fn event(req: &EnsureImageRequest, reason: EventReason, message: &str, class: Option<ErrorClass>) -> ImageEvent {
        ImageEvent {
            event_type: reason.event_type(),
            reason,
            message: message.to_string(),
            object: ObjectRef {
                pod_uid: req.pod.uid.clone(),
                namespace: req.pod.namespace.clone(),
                pod_name: req.pod.name.clone(),
                container: req.container.clone(),
            },
            image: req.image.clone(),
            class,
        }
    }

    fn fail(&self, kind: ImageErrorKind, message: String, class: ErrorClass) -> EnsureError {
        let message = if self.cfg.annotate_error_class { format!("{message} ({class})") } else { message };
        EnsureError { kind, message, class }
    }

    fn default_tag(&self, image: &str) -> Result<Arc<Defaulted>, String> {
        let mut cache = self.defaulted.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(r) = cache.get(image) {
            return r.clone();
        }
        let r = apply_default_image_tag(image)
            .map(|tagged| {
                let named = crate::domain::reference::parse_normalized_named(&tagged);
                Arc::new(Defaulted { image: tagged, present: already_present_accessible(image), named })
            })
            .map_err(|e| e.to_string());
        if cache.len() >= DEFAULTED_CACHE {
            cache.clear();
        }
        cache.insert(image.to_string(), r.clone());
        r
    }

    async fn image_present(&self, spec: &ImageSpec) -> Result<Option<String>, CriError> {
        // Boxed, and made once the check has its turn: the call's future is
        // large, and every ensure of a burst waits for a turn (then for the
        // pull) holding what is unboxed here (actors.md, "Per-waiter memory").
        let call = || Box::pin(self.reader.image_status(spec.clone(), false));
        let status = match &self.presence_checks {
            None => call().await?,
            Some(gate) => {
                // A check that holds its turn too long loses it (the gate
                // sees to it), so a hung runtime cannot hold up the others.
                let turn = gate.turn().await;
                let r = call().await;
                turn.end();
                r?
            }
        };
        Ok(status.image.map(|i| i.id))
    }

    /// The kubelet's `EnsureImageExists`: makes sure the image is present
    /// according to the pull policy, pulling it if needed.
    pub async fn ensure_image_exists(&self, req: &EnsureImageRequest) -> Result<EnsureOk, EnsureError> {
        let requested = req.image.as_str();
        // Counted when this returns, with what was learnt (the kubelet's deferred increment).
        let mut tally = self.metrics.ensure_request(req.pull_policy);
        // 1. Default tag.
        let defaulted = match self.default_tag(requested) {
            Ok(d) => d,
            Err(e) => {
                let msg = failed_to_apply_default_tag(requested, &e);
                self.emit(req, EventReason::InspectFailed, &msg, Some(ErrorClass::Permanent));
                return Err(self.fail(ImageErrorKind::InvalidImageName, msg, ErrorClass::Permanent));
            }
        };
        // 2. Image spec.
        let spec = ImageSpec {
            image: defaulted.image.clone(),
            annotations: req.pod.annotations.clone(),
            user_specified_image: requested.to_string(),
            runtime_handler: req.pod.runtime_handler.clone(),
            image_ref: String::new(),
        };
        // Credentials: looked up once, when first needed.
        let lookup = LazyLookup::new(self, req, &spec.image, &defaulted.named);
        // 3. Pre-check by policy.
        let mut absent_at = None;
        // A present image GC was removing is looked at again once removed.
        let mut looks = 0;
        if matches!(req.pull_policy, PullPolicy::IfNotPresent | PullPolicy::Never) {
            loop {
                looks += 1;
                let image_ref = match self.image_present(&spec).await {
                    Ok(r) => r,
                    Err(e) => {
                        // The kubelet prints the (empty) image ref here, not the image.
                        let msg = failed_to_inspect("", &e.to_string());
                        self.emit(req, EventReason::InspectFailed, &msg, Some(class_of_cri(&e)));
                        return Err(self.fail(ImageErrorKind::ImageInspectError, msg, class_of_cri(&e)));
                    }
                };
                tally.present_locally = image_ref.is_some().into();
                match image_ref {
                    Some(image_ref) => {
                        // KEP-2535: may this pod use the image without pulling it?
                        let check = || {
                            Box::pin(
                                self.records
                                    .must_attempt_pull_uncounted(&spec.image, &image_ref, || lookup.pod_credentials()),
                            )
                        };
                        let mut checked = check().await?;
                        // A pull of it by imaged may be just ending, its
                        // record not yet written: that record decides (and
                        // only the check acted on is counted).
                        if checked.must_pull && Box::pin(self.records.pulls_ended(&spec.image, PULL_END_WAIT)).await {
                            checked = check().await?;
                        }
                        self.records.count(checked);
                        let must_pull = checked.must_pull;
                        if !must_pull {
                            if looks < MAX_LOOKS {
                                // Marks it (one lock), unless GC is removing it.
                                if !self.mark_ensured_unless_removed(&image_ref).await {
                                    continue;
                                }
                            } else {
                                self.mark_ensured(&image_ref);
                            }
                            tally.pull_required = Tristate::False;
                            let msg = defaulted.present.clone();
                            self.emit_present(req, &msg);
                            self.recorder.finished(&req.pod.uid, Instant::now());
                            return Ok(EnsureOk { image_ref, message: msg });
                        }
                        if req.pull_policy == PullPolicy::Never {
                            // As the kubelet: the same answer as for an absent
                            // image, so the pod learns nothing about the node.
                            let msg = never_pull(requested);
                            self.emit(req, EventReason::ErrImageNeverPull, &msg, Some(ErrorClass::Permanent));
                            return Err(self.fail(ImageErrorKind::ErrImageNeverPull, msg, ErrorClass::Permanent));
                        }
                        // Pull with the pod's credentials: the runtime checks them.
                        tally.pull_required = Tristate::True;
                        return self.pull(req, &spec, &lookup, None, true, false).await;
                    }
                    None if req.pull_policy == PullPolicy::Never => {
                        let msg = never_pull(requested);
                        self.emit(req, EventReason::ErrImageNeverPull, &msg, Some(ErrorClass::Permanent));
                        return Err(self.fail(ImageErrorKind::ErrImageNeverPull, msg, ErrorClass::Permanent));
                    }
                    None => {
                        absent_at = Some(Instant::now());
                        break;
                    }
                }
            }
        }
        tally.pull_required = Tristate::True;
        self.pull(req, &spec, &lookup, absent_at, false, false).await
    }
}
