//! `EnsureImageExists`: the kubelet's image manager flow over the actors.
//!
//! [`ImageManager`] is a cloneable handle (no actor of its own): each call
//! runs on the caller's task and talks to the CRI gateway (presence
//! checks), the backoff registry and the pull queue, emitting the kubelet's
//! events with its exact messages. See `actors.md` for the actors.

mod kubelet_messages;
mod prefetch;
mod presence;
mod recorder;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Addr;
use tokio::time::Instant;

use crate::events::{EventReason, EventSink, ImageEvent, ObjectRef};
pub use kubelet_messages::*;
pub use prefetch::{Prefetch, PrefetchDone, PrefetchRequest};
pub use presence::PresenceWindow;
pub use recorder::{PodPullTimes, PullingRecorder};

use crate::actors::backoff_registry::{
    BackoffKey, BackoffRegistryActor, BeginAttempt, CheckBackoff, RecordFailure, RecordSuccess, RegistryRecovered,
};
use crate::actors::cri_gateway::{CriGatewayActor, CriReader, GetReader};
use crate::actors::pull_queue::{EnqueuePull, PullFailure, PullOutcome, PullQueueActor, PullRequest};
use crate::cri::{CriError, CriErrorKind};
use crate::domain::pull_policy::PullPolicy;
use crate::domain::pull_record::{ImagePullCredentials, ImagePullSecret};
use crate::domain::reference::apply_default_image_tag;
use crate::domain::{AuthConfig, ErrorClass, ImageErrorKind, ImageSpec, SandboxConfig, eval_cri_pull_err};
use crate::metrics::Tristate;
use crate::pull_records::{PodCredentials, PullRecords, VerifyPolicy};

/// The pod an image is for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// Pod UID (back-off is per pod UID and image).
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Pod annotations, passed to the runtime in the image spec.
    pub annotations: BTreeMap<String, String>,
    /// RuntimeClass handler; empty = the runtime's default.
    pub runtime_handler: String,
    /// Pull priority (e.g. from the pod's priority class); higher first.
    pub priority: i32,
}

/// One `EnsureImageExists` call.
#[derive(Debug, Clone)]
pub struct EnsureImageRequest {
    /// The pod.
    pub pod: PodInfo,
    /// Container name, for the event's object reference.
    pub container: Option<String>,
    /// The image as the pod spec gives it.
    pub image: String,
    /// The pull policy (see [`crate::domain::pull_policy::default_pull_policy`]
    /// for the API server's defaulting of an empty one).
    pub pull_policy: PullPolicy,
    /// The pod's pull secrets (`kubernetes.io/dockerconfigjson` or
    /// `kubernetes.io/dockercfg`); their credentials matching the image are
    /// tried first, in the kubelet's keyring order.
    pub pull_secrets: Vec<crate::credentials::PullSecret>,
    /// Further credentials tried after the secrets' and the node's ones.
    pub credentials: Vec<AuthConfig>,
    /// The pod sandbox config passed to `PullImage`.
    pub sandbox: Option<SandboxConfig>,
    /// Overall pull deadline for this request (overrides the configured one).
    pub deadline: Option<Duration>,
}

impl EnsureImageRequest {
    /// A request for `image` with `policy` for pod `uid`, anonymous.
    pub fn new(uid: impl Into<String>, image: impl Into<String>, policy: PullPolicy) -> Self {
        Self {
            pod: PodInfo { uid: uid.into(), ..PodInfo::default() },
            container: None,
            image: image.into(),
            pull_policy: policy,
            pull_secrets: Vec::new(),
            credentials: Vec::new(),
            sandbox: None,
            deadline: None,
        }
    }
}

/// The image is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsureOk {
    /// Image reference (image id) to create the container from.
    pub image_ref: String,
    /// The kubelet's message (non-empty when the image was already present).
    pub message: String,
}

/// The image is not there, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct EnsureError {
    /// The kubelet's error kind (the container's waiting reason).
    pub kind: ImageErrorKind,
    /// The kubelet's message (the container's waiting message).
    pub message: String,
    /// Whether retrying can help.
    pub class: ErrorClass,
}

/// Settings of the ensure flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsureConfig {
    /// Append the error class (`(permanent)`/`(transient)`) to returned
    /// failure messages. Off by default: messages stay the kubelet's.
    pub annotate_error_class: bool,
    /// Beyond the kubelet: a request whose credentials differ from those of
    /// its key's last failed pull (a pull secret was added or changed) is not
    /// held in back-off; the back-off is reset and the pull goes ahead. Off
    /// by default: the kubelet waits out the back-off.
    pub reset_backoff_on_credential_change: bool,
    /// Beyond the kubelet: a pull that succeeds from a registry ends the
    /// back-offs of transient failures from that registry (an outage is
    /// over: its pods retry at once). Off by default: the kubelet waits.
    pub reset_backoff_on_registry_recovery: bool,
    /// Most presence checks (`ImageStatus` before deciding to pull) in
    /// flight at once; later ones wait their turn in arrival order (`None`
    /// = no limit, as the kubelet). A burst of requests is then answered in
    /// arrival order instead of all together, so the first pulls start
    /// sooner. Alone, a fixed limit; with
    /// [`presence_check_window`](Self::presence_check_window), the most the
    /// window grows to. A check holds its turn for at most
    /// [`PRESENCE_CHECK_HOLD`]: a runtime that stops answering cannot hold up
    /// the others longer.
    pub presence_check_concurrency: Option<usize>,
    /// A window of presence checks that grows as they are answered: it
    /// starts at this many checks in flight and each answer adds one (up to
    /// `presence_check_concurrency`, if set), so it doubles every round trip,
    /// and it is back at its start once no check is in flight. The first
    /// checks of a burst are answered first, as with a fixed limit, while a
    /// long burst of present images soon has its checks sent without waiting
    /// on round trips (`cargo bench --bench ensure` measures both). Only the
    /// timing of the checks changes, never an answer, event or message.
    /// [`DEFAULT_PRESENCE_CHECK_WINDOW`] by default; `None` = no window
    /// (only the fixed limit, if any; with neither, every check goes out at
    /// once, as the kubelet's).
    pub presence_check_window: Option<usize>,
}

/// `pull.presence_check_window` by default.
pub const DEFAULT_PRESENCE_CHECK_WINDOW: usize = 8;

impl Default for EnsureConfig {
    fn default() -> Self {
        Self {
            annotate_error_class: false,
            reset_backoff_on_credential_change: false,
            reset_backoff_on_registry_recovery: false,
            presence_check_concurrency: None,
            presence_check_window: Some(DEFAULT_PRESENCE_CHECK_WINDOW),
        }
    }
}

impl EnsureConfig {
    /// The window of presence-check turns these settings ask for, if any.
    pub fn presence_window(&self) -> Option<PresenceWindow> {
        match (self.presence_check_window, self.presence_check_concurrency) {
            (Some(start), cap) => Some(PresenceWindow::new(start, cap)),
            (None, Some(n)) => Some(PresenceWindow::fixed(n)),
            (None, None) => None,
        }
    }
}

/// How long one presence check may hold its turn (see
/// [`EnsureConfig::presence_check_window`]); a check still running then goes
/// on without it, and the window grows as if it had been answered.
pub const PRESENCE_CHECK_HOLD: Duration = Duration::from_millis(50);

/// The handle embedders call. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ImageManager {
    gateway: Addr<CriGatewayActor>,
    /// Presence checks on the caller's task (the hot path).
    reader: CriReader,
    queue: Addr<PullQueueActor>,
    backoff: Addr<BackoffRegistryActor>,
    events: EventSink,
    recorder: PullingRecorder,
    hints: crate::gc::in_use_hints::InUseHints,
    /// KEP-2535 pull intents and records: who may use a present image.
    records: PullRecords,
    /// `applyDefaultImageTag` results: pods name the same images over and
    /// over, and the grammar's regular expression is the costliest step of
    /// a present-image ensure. Bounded; cleared when full.
    defaulted: Arc<Mutex<HashMap<String, Result<String, String>>>>,
    cfg: EnsureConfig,
    /// Requests by policy/presence/pull-required; pull durations by size.
    metrics: crate::metrics::Metrics,
    /// The node's credentials (config files, plugins), tried after pod secrets.
    node_credentials: Option<Arc<crate::credentials::NodeCredentials>>,
    /// Turns for presence checks (`EnsureConfig::presence_window`).
    presence_checks: Option<presence::PresenceGate>,
}

/// Most remembered `applyDefaultImageTag` results.
const DEFAULTED_CACHE: usize = 4096;

/// Class of a CRI failure.
pub fn class_of_cri(e: &CriError) -> ErrorClass {
    match e.kind() {
        CriErrorKind::NotFound
        | CriErrorKind::Unauthorized
        | CriErrorKind::InvalidArgument
        | CriErrorKind::SignatureValidationFailed => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

/// Class of a failed pull: permanent only when every attempt failed permanently.
pub fn class_of_pull(f: &PullFailure) -> ErrorClass {
    match f {
        PullFailure::Cri(errs) if !errs.is_empty() && errs.iter().all(|e| class_of_cri(e) == ErrorClass::Permanent) => {
            ErrorClass::Permanent
        }
        _ => ErrorClass::Transient,
    }
}

impl ImageManager {
    /// A manager over running actors.
    pub fn new(
        gateway: Addr<CriGatewayActor>,
        reader: CriReader,
        queue: Addr<PullQueueActor>,
        backoff: Addr<BackoffRegistryActor>,
        cfg: EnsureConfig,
    ) -> Self {
        Self {
            gateway,
            reader,
            queue,
            backoff,
            events: EventSink::default(),
            recorder: PullingRecorder::default(),
            hints: crate::gc::in_use_hints::InUseHints::default(),
            records: PullRecords::in_memory(VerifyPolicy::default()),
            defaulted: Arc::default(),
            presence_checks: cfg.presence_window().map(|w| presence::PresenceGate::new(w, PRESENCE_CHECK_HOLD)),
            cfg,
            metrics: crate::metrics::Metrics::default(),
            node_credentials: None,
        }
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

    /// Starts a backoff registry and a pull queue on the current actix
    /// arbiter and returns a manager over them and `gateway`. Fails only if
    /// the gateway has stopped. The queue and this manager report to
    /// `pull.metrics`, the registry to `backoff.metrics`.
    pub async fn start(
        gateway: Addr<CriGatewayActor>,
        pull: &crate::actors::pull_queue::PullQueueConfig,
        backoff: &crate::actors::backoff_registry::BackoffSettings,
        cfg: EnsureConfig,
    ) -> Result<Self, actix::MailboxError> {
        use actix::Actor as _;
        let reader = gateway.send(GetReader).await?;
        let queue = PullQueueActor::new(pull.clone(), reader.clone()).start();
        let backoff = BackoffRegistryActor::new(backoff.backoff, backoff.mailbox_capacity, backoff.gc_interval)
            .with_metrics(backoff.metrics.clone())
            .start();
        Ok(Self::new(gateway, reader, queue, backoff, cfg).with_metrics(pull.metrics.clone()))
    }

    /// The pull queue.
    pub fn queue(&self) -> &Addr<PullQueueActor> {
        &self.queue
    }

    /// The backoff registry (send it `ClearBackoff` to retry now).
    pub fn backoff(&self) -> &Addr<BackoffRegistryActor> {
        &self.backoff
    }

    /// The CRI gateway.
    pub fn gateway(&self) -> &Addr<CriGatewayActor> {
        &self.gateway
    }

    /// The event sink (subscribe to it for events).
    pub fn events(&self) -> &EventSink {
        &self.events
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
        self.events.emit(ImageEvent {
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
        });
    }

    fn fail(&self, kind: ImageErrorKind, message: String, class: ErrorClass) -> EnsureError {
        let message = if self.cfg.annotate_error_class { format!("{message} ({class})") } else { message };
        EnsureError { kind, message, class }
    }

    fn default_tag(&self, image: &str) -> Result<String, String> {
        let mut cache = self.defaulted.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = cache.get(image) {
            return r.clone();
        }
        let r = apply_default_image_tag(image).map_err(|e| e.to_string());
        if cache.len() >= DEFAULTED_CACHE {
            cache.clear();
        }
        cache.insert(image.to_string(), r.clone());
        r
    }

    async fn image_present(&self, spec: &ImageSpec) -> Result<Option<String>, CriError> {
        let call = self.reader.image_status(spec.clone(), false);
        let status = match &self.presence_checks {
            None => call.await?,
            Some(gate) => {
                // A check that holds its turn too long loses it (the gate
                // sees to it), so a hung runtime cannot hold up the others.
                let turn = gate.turn().await;
                let r = call.await;
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
        let image = match self.default_tag(requested) {
            Ok(i) => i,
            Err(e) => {
                let msg = failed_to_apply_default_tag(requested, &e);
                self.emit(req, EventReason::InspectFailed, &msg, Some(ErrorClass::Permanent));
                return Err(self.fail(ImageErrorKind::InvalidImageName, msg, ErrorClass::Permanent));
            }
        };
        // 2. Image spec.
        let spec = ImageSpec {
            image,
            annotations: req.pod.annotations.clone(),
            user_specified_image: requested.to_string(),
            runtime_handler: req.pod.runtime_handler.clone(),
            image_ref: String::new(),
        };
        // 3. Pre-check by policy.
        let mut absent_at = None;
        if matches!(req.pull_policy, PullPolicy::IfNotPresent | PullPolicy::Never) {
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
                    let must_pull = self
                        .records
                        .must_attempt_pull(&spec.image, &image_ref, || pod_credentials(req, &spec.image))
                        .await
                        .map_err(|e| self.fail(ImageErrorKind::ErrImagePull, e.to_string(), ErrorClass::Permanent))?;
                    if !must_pull {
                        tally.pull_required = Tristate::False;
                        self.hints.ensured(&image_ref, std::time::SystemTime::now());
                        let msg = already_present_accessible(requested);
                        self.emit(req, EventReason::Pulled, &msg, None);
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
                    return self.pull(req, spec, None, true).await;
                }
                None if req.pull_policy == PullPolicy::Never => {
                    let msg = never_pull(requested);
                    self.emit(req, EventReason::ErrImageNeverPull, &msg, Some(ErrorClass::Permanent));
                    return Err(self.fail(ImageErrorKind::ErrImageNeverPull, msg, ErrorClass::Permanent));
                }
                None => absent_at = Some(Instant::now()),
            }
        }
        tally.pull_required = Tristate::True;
        self.pull(req, spec, absent_at, false).await
    }

    /// The credentials to try for `image`, in order: the pull secrets'
    /// matching ones (a secret that does not decode fails the request), the
    /// node's (config files, plugins), then `extra`. With each, what a
    /// successful pull with it proves, for the pull record: a secret's
    /// coordinates and hash, or (node-level and `extra`) access for every pod.
    async fn credentials_for(
        &self,
        pull_secrets: &[crate::credentials::PullSecret],
        extra: &[AuthConfig],
        image: &str,
    ) -> Result<(Vec<AuthConfig>, Vec<ImagePullCredentials>), EnsureError> {
        let tracked = if pull_secrets.is_empty() {
            Vec::new()
        } else {
            crate::credentials::tracked_credentials_for_image(pull_secrets, None, image)
                .map_err(|e| self.fail(ImageErrorKind::ErrImagePull, e.to_string(), ErrorClass::Permanent))?
        };
        let node = crate::credentials::lookup_credentials(&[], self.node_credentials.as_deref(), image)
            .await
            .map_err(|e| self.fail(ImageErrorKind::ErrImagePull, e.to_string(), ErrorClass::Permanent))?;
        let mut credentials = Vec::with_capacity(tracked.len() + node.len() + extra.len());
        let mut proves = Vec::with_capacity(credentials.capacity());
        for t in tracked {
            proves.push(match t.source {
                Some(s) => ImagePullCredentials::secret(ImagePullSecret {
                    uid: s.secret_uid,
                    namespace: s.namespace,
                    name: s.name,
                    credential_hash: t.hash,
                }),
                None => ImagePullCredentials::node_accessible(),
            });
            credentials.push(t.auth);
        }
        for c in node.into_iter().chain(extra.iter().cloned()) {
            credentials.push(c);
            proves.push(ImagePullCredentials::node_accessible());
        }
        Ok((credentials, proves))
    }

    /// Pulls `spec` for `req`. `verify`: the image is present but the pod
    /// must show its credentials, so the pull must reach the registry.
    async fn pull(
        &self,
        req: &EnsureImageRequest,
        spec: ImageSpec,
        absent_at: Option<Instant>,
        verify: bool,
    ) -> Result<EnsureOk, EnsureError> {
        let requested = req.image.as_str();
        let key = BackoffKey { pod_uid: req.pod.uid.clone(), image: requested.to_string() };
        // Credentials, before the back-off check as in the kubelet (1.35,
        // steps 4 and 7).
        let (credentials, proves) = self.credentials_for(&req.pull_secrets, &req.credentials, &spec.image).await?;
        // Only hashed when asked for: the kubelet's path stays as it was.
        let cause = self.cfg.reset_backoff_on_credential_change.then(|| AuthConfig::list_identity(&credentials));
        self.check_backoff(req, &key, cause.clone()).await?;
        // KEP-2535: the intent is on disk before the pull starts.
        let intent = match self.records.begin_pull(&spec.image).await {
            Ok(guard) => guard,
            Err(e) => {
                let msg = failed_to_record_pull_intent(requested, &e.to_string());
                return Err(self.fail(ImageErrorKind::ErrImagePull, msg, ErrorClass::Transient));
            }
        };
        let start = Instant::now();
        self.recorder.started(&req.pod.uid, start);
        self.emit(req, EventReason::Pulling, &pulling(requested), None);
        let request = PullRequest {
            image: spec.clone(),
            credentials,
            sandbox: req.sandbox.clone(),
            priority: req.pod.priority,
            skip_if_present: !verify
                && req.pull_policy != PullPolicy::Always
                && req.pull_policy != PullPolicy::AlwaysWithLocalFallback,
            absent_at,
            deadline: req.deadline,
        };
        // While the pull runs, an image it would replace counts as in use for GC.
        let normalized = crate::domain::reference::parse_normalized_named(&spec.image).map(|n| n.docker_ref()).ok();
        let registry = normalized
            .as_deref()
            .filter(|_| self.cfg.reset_backoff_on_registry_recovery)
            .map(|r| crate::actors::pull_queue::registry_of(r).to_string());
        let _in_flight = normalized.map(|r| self.hints.pull_started(&r));
        let (result, joined) = self.queue_pull(req, &spec, request).await;
        // Once per pull (by the request that started it), fire and forget,
        // ahead of any later check in the mailbox.
        if let (Ok(outcome), false, Some(registry)) = (&result, joined, &registry)
            && outcome.pulled
        {
            let _ = self.backoff.try_send(RegistryRecovered { registry: registry.clone() });
        }
        self.record_pull_end(&spec.image, requested, result.as_ref().ok(), &proves).await;
        intent.disarm();
        match result {
            Ok(outcome) => Ok(self.pulled(req, &outcome, start)),
            Err(failure) => self.pull_failed(req, &spec, key, cause, registry, &failure).await,
        }
    }

    /// The back-off check before a pull: the kubelet's `ImagePullBackOff`
    /// while the key backs off; otherwise the stored previous error is
    /// deleted when there is one (the kubelet does so when it really
    /// attempts a pull).
    async fn check_backoff(
        &self,
        req: &EnsureImageRequest,
        key: &BackoffKey,
        credentials: Option<String>,
    ) -> Result<(), EnsureError> {
        let stopped =
            || self.fail(ImageErrorKind::ErrImagePull, "imaged is shutting down".into(), ErrorClass::Transient);
        let check = self.backoff.send(CheckBackoff { key: key.clone(), credentials }).await.map_err(|_| stopped())?;
        if check.in_backoff {
            let event_msg = back_off_pulling(&req.image);
            self.emit(req, EventReason::BackOff, &event_msg, None);
            let msg = match &check.previous_error {
                Some(prev) => format!("{event_msg}: {prev}"),
                None => event_msg,
            };
            let class = if check.previous_error.as_deref().is_some_and(|p| p.contains("(permanent)")) {
                ErrorClass::Permanent
            } else {
                ErrorClass::Transient
            };
            return Err(self.fail(ImageErrorKind::ImagePullBackOff, msg, class));
        }
        if check.previous_error.is_some() {
            let _ = self.backoff.send(BeginAttempt { key: key.clone() }).await;
        }
        Ok(())
    }

    /// Runs `request` through the pull queue until its answer is one the pod
    /// may use, and says whether it joined a pull another request started.
    /// An image found present when the pull's turn came (pulled by another
    /// pod, maybe with other credentials) is this pod's only if the records
    /// say so; otherwise it pulls for real.
    async fn queue_pull(
        &self,
        req: &EnsureImageRequest,
        spec: &ImageSpec,
        mut request: PullRequest,
    ) -> (Result<PullOutcome, PullFailure>, bool) {
        loop {
            let (result, joined) = match self.queue.send(EnqueuePull(request.clone())).await {
                Ok(ticket) => {
                    let joined = ticket.joined;
                    (ticket.await, joined)
                }
                Err(_) => (Err(PullFailure::Stopped), false),
            };
            if let Ok(o) = &result
                && !o.pulled
                && self
                    .records
                    .must_attempt_pull(&spec.image, &o.image_ref, || pod_credentials(req, &spec.image))
                    .await
                    .unwrap_or(true)
            {
                request.skip_if_present = false;
                continue;
            }
            return (result, joined);
        }
    }

    /// A failed pull: the local image under `AlwaysWithLocalFallback` when
    /// the registry is unreachable and the pod may use it; otherwise the
    /// kubelet's `Failed` event and error, and the failure recorded for
    /// back-off.
    async fn pull_failed(
        &self,
        req: &EnsureImageRequest,
        spec: &ImageSpec,
        key: BackoffKey,
        credentials: Option<String>,
        registry: Option<String>,
        failure: &PullFailure,
    ) -> Result<EnsureOk, EnsureError> {
        let requested = req.image.as_str();
        if req.pull_policy == PullPolicy::AlwaysWithLocalFallback
            && failure.registry_unreachable()
            && let Ok(Some(image_ref)) = self.image_present(spec).await
            // The local image only for a pod that may use it (KEP-2535).
            && !self
                .records
                .must_attempt_pull(&spec.image, &image_ref, || pod_credentials(req, &spec.image))
                .await
                .unwrap_or(true)
        {
            let msg = using_local_image(requested, &failure.to_string());
            self.emit(req, EventReason::Pulled, &msg, Some(ErrorClass::Transient));
            self.recorder.finished(&req.pod.uid, Instant::now());
            return Ok(EnsureOk { image_ref, message: msg });
        }
        let err_text = failure.to_string();
        let class = class_of_pull(failure);
        self.emit(req, EventReason::Failed, &failed_to_pull(requested, &err_text), Some(class));
        let (msg, kind) = eval_cri_pull_err(requested, &err_text);
        // The kubelet keeps "<error>: <message>" for the next back-off message.
        let mut previous = format!("{kind}: {msg}");
        if self.cfg.annotate_error_class {
            previous = format!("{previous} ({class})");
        }
        // Only a transient failure from the registry itself waits for it to recover.
        let from_registry = matches!(failure, PullFailure::Cri(_) | PullFailure::DeadlineExceeded(_));
        let transient_registry = registry.filter(|_| from_registry && class == ErrorClass::Transient);
        let _ = self.backoff.send(RecordFailure { key, error_text: previous, credentials, transient_registry }).await;
        Err(self.fail(kind, msg, class))
    }

    /// KEP-2535: what a pull's end proves. Pulled (`outcome` with `pulled`):
    /// the record, with what the credential that worked proves (`proves`,
    /// one per credential tried); otherwise (failed, or found present) the
    /// pull only ends its intent.
    async fn record_pull_end(
        &self,
        image: &str,
        requested: &str,
        outcome: Option<&PullOutcome>,
        proves: &[ImagePullCredentials],
    ) {
        match outcome.filter(|o| o.pulled) {
            Some(o) => {
                let used = credentials_used(proves, o.credential, requested);
                if let Err(e) = self.records.record_image_pulled(image, &o.image_ref, &used).await {
                    tracing::warn!(image = requested, error = %e, "failed to record an image pulled record");
                }
            }
            None => self.records.record_image_pull_failed(image).await,
        }
    }

    fn pulled(&self, req: &EnsureImageRequest, outcome: &PullOutcome, start: Instant) -> EnsureOk {
        let requested = req.image.as_str();
        let now = Instant::now();
        self.recorder.finished(&req.pod.uid, now);
        self.hints.ensured(&outcome.image_ref, std::time::SystemTime::now());
        // Fire and forget, and without needing an actix LocalSet on this
        // task (callers may be plain tokio tasks, e.g. the API server's):
        // a full mailbox only delays the entry GC to its periodic run.
        let _ = self.backoff.try_send(RecordSuccess);
        if !outcome.pulled {
            // Found present when the pull's turn came (another pod pulled
            // it) and the pod may use it.
            let msg = already_present_accessible(requested);
            self.emit(req, EventReason::Pulled, &msg, None);
            return EnsureOk { image_ref: outcome.image_ref.clone(), message: msg };
        }
        self.metrics.image_pulled(outcome.size, now.duration_since(start));
        let msg = successfully_pulled(requested, outcome.pull_duration, now.duration_since(start), outcome.size);
        self.emit(req, EventReason::Pulled, &msg, None);
        EnsureOk { image_ref: outcome.image_ref.clone(), message: String::new() }
    }
}

/// The pod's credentials with a known source for `image` (the kubelet's
/// `getPodCredentials`): every matching pull-secret credential, with its
/// coordinates and hash. Node-level credentials are left out.
fn pod_credentials(
    req: &EnsureImageRequest,
    image: &str,
) -> Result<PodCredentials, crate::credentials::CredentialError> {
    if req.pull_secrets.is_empty() {
        return Ok(PodCredentials::default());
    }
    let tracked = crate::credentials::tracked_credentials_for_image(&req.pull_secrets, None, image)?;
    Ok(PodCredentials {
        secrets: tracked
            .into_iter()
            .filter_map(|t| {
                t.source.map(|s| ImagePullSecret {
                    uid: s.secret_uid,
                    namespace: s.namespace,
                    name: s.name,
                    credential_hash: t.hash,
                })
            })
            .collect(),
        service_account: None,
    })
}

/// What the pull that succeeded with credential `index` (of the request's
/// list, whose proofs are `proves`) proves for the pulled record: no
/// credential (anonymous pull) → every pod may use the image; an index the
/// list does not have (a bug) → nothing, logged: a record without
/// credentials, so every pod must pull to use the image.
fn credentials_used(proves: &[ImagePullCredentials], index: Option<usize>, image: &str) -> ImagePullCredentials {
    let Some(i) = index else { return ImagePullCredentials::node_accessible() };
    match proves.get(i) {
        Some(p) => p.clone(),
        None => {
            tracing::warn!(
                image,
                index = i,
                credentials = proves.len(),
                "the pull reported a credential it was not given; recording no credentials"
            );
            ImagePullCredentials::default()
        }
    }
}
