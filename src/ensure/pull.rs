//! The pull step of an ensure: back-off, the KEP-2535 intent, the pull
//! queue (until its answer is one the pod may use), and what its end
//! records — the pulled record, the `Pulled` or `Failed` event, the
//! back-off's success or failure.

use tokio::time::Instant;

use super::credentials::{LazyLookup, credentials_used};
use super::kubelet_messages::*;
use super::{EnsureError, EnsureImageRequest, EnsureOk, ImageManager, RECORDS_DUE_WAIT, class_of_pull};
use crate::actors::backoff_registry::{
    BackoffKey, BeginAttempt, CheckBackoff, RecordFailure, RecordSuccess, RegistryRecovered,
};
use crate::actors::pull_queue::{EnqueuePull, PullFailure, PullOutcome, PullPod, PullRequest};
use crate::domain::pull_policy::PullPolicy;
use crate::domain::pull_record::ImagePullCredentials;
use crate::domain::{AuthConfig, ErrorClass, ImageErrorKind, ImageSpec, eval_cri_pull_err};
use crate::events::EventReason;

impl ImageManager {
    /// Pulls `spec` for `req`. `verify`: the image is present but the pod
    /// must show its credentials, so the pull must reach the registry.
    /// `again`: the second pull, after the first ended while GC was
    /// removing its image (it is answered as it ends).
    pub(super) async fn pull(
        &self,
        req: &EnsureImageRequest,
        spec: &ImageSpec,
        lookup: &LazyLookup<'_>,
        absent_at: Option<Instant>,
        verify: bool,
        again: bool,
    ) -> Result<EnsureOk, EnsureError> {
        let requested = req.image.as_str();
        let key = BackoffKey { pod_uid: req.pod.uid.clone(), image: requested.to_string() };
        // Credentials, before the back-off check as in the kubelet (1.35,
        // steps 4 and 7).
        // The steps before and after the wait are boxed (here and below):
        // a future is as large as the largest it awaits, and this one stays
        // alive, waiting on the queue, as long as the pull (actors.md,
        // "Per-waiter memory").
        let found = Box::pin(lookup.get()).await?;
        let (credentials, proves) = (&found.credentials, &found.proves);
        // Only hashed when asked for: the kubelet's path stays as it was.
        let cause = self.cfg.reset_backoff_on_credential_change.then(|| AuthConfig::list_identity(credentials));
        Box::pin(self.check_backoff(req, &key, cause.clone())).await?;
        // KEP-2535: the intent is on disk before the pull starts.
        let intent = match Box::pin(self.records.begin_pull(&spec.image)).await {
            Ok(guard) => guard,
            Err(e) => {
                let msg = failed_to_record_pull_intent(requested, &e.to_string());
                return Err(self.fail(ImageErrorKind::ErrImagePull, msg, ErrorClass::Transient));
            }
        };
        let start = Instant::now();
        let began = self.records.clock().now();
        self.recorder.started(&req.pod.uid, start);
        // Its subscribers hear of the pull now; its log line waits until the
        // pull's request is out (`queue_pull`): the line is the costliest
        // step before the pull, and while the pull runs nothing else does.
        let line = self.events.emit_owing_line(Self::event(req, EventReason::Pulling, &pulling(requested), None));
        let skip_if_present =
            !verify && req.pull_policy != PullPolicy::Always && req.pull_policy != PullPolicy::AlwaysWithLocalFallback;
        // While the pull runs, an image it would replace counts as in use for GC.
        let normalized = lookup.named().map(crate::domain::reference::Named::docker_ref);
        let registry = normalized
            .as_deref()
            .filter(|_| self.cfg.reset_backoff_on_registry_recovery)
            .map(|r| crate::actors::pull_queue::registry_of(r).to_string());
        let in_flight = normalized.map(|r| self.hints.pull_started(&r));
        let (mut result, joined) =
            self.queue_pull(req, spec, lookup, credentials, skip_if_present, absent_at, line).await;
        // Marked ensured before its record is written (GC keeps the records
        // of images ensured during its run); a pull that ended while GC was
        // removing its image waits for the removal, then pulls once more.
        let removed_meanwhile = match &result {
            Ok(outcome) => !self.mark_ensured_unless_removed(&outcome.image_ref).await,
            Err(_) => false,
        };
        // The guard is done with here: the pull's end is recorded below.
        intent.disarm();
        // A record that lets every pod use the image (the one written
        // unsynced, whose loss only costs a pull) is written behind the
        // answer, as the CRI front's: the caller does not wait for the store.
        // Until the write ends the pull counts as in flight and its record as
        // due, so a check of the name waits for it. Any other end (a record
        // naming who else may use the image, a failure) is on disk before the
        // answer (docs/daemon.md, "After a crash"); it runs to its end even if
        // this ensure is dropped (`pull_records::to_the_end`).
        let due = result.as_mut().ok().and_then(|o| o.record_due.take());
        let end = match &result {
            Ok(o) => o.pull_end(|credential| credentials_used(proves, credential, requested)),
            Err(f) => f.pull_end(),
        };
        if end.lets_every_pod() {
            drop(self.records.end_pull_behind(spec.image.clone(), end, began, due));
        } else {
            Box::pin(self.records.end_pull(&spec.image, end, began)).await;
            drop(due);
        }
        // Once per pull (by the request that started it), told with its
        // `Pulled` event (see `pulled`).
        let recovered = match (&result, joined, &registry) {
            (Ok(outcome), false, Some(registry)) if outcome.pulled => {
                Some(RegistryRecovered { registry: registry.clone() })
            }
            _ => None,
        };
        match result {
            Ok(_) if removed_meanwhile && !again => {
                // This pull brings no event: its recovery is told now.
                if let Some(r) = recovered {
                    let _ = self.backoff.recovered.try_send(r);
                }
                drop(in_flight);
                Box::pin(self.pull(req, spec, lookup, Some(Instant::now()), verify, true)).await
            }
            Ok(outcome) => {
                if removed_meanwhile {
                    self.mark_ensured_after_removals(&outcome.image_ref).await;
                }
                Ok(self.pulled(req, &outcome, start, recovered))
            }
            Err(failure) => Box::pin(self.pull_failed(req, spec, lookup, key, cause, registry, &failure)).await,
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
        // Nothing in back-off anywhere (the registry says so after each
        // change): the answer is known, and not asked for.
        if self.backoff.known_clear() {
            return Ok(());
        }
        let stopped =
            || self.fail(ImageErrorKind::ErrImagePull, "imaged is shutting down".into(), ErrorClass::Transient);
        let check =
            self.backoff.check.send(CheckBackoff { key: key.clone(), credentials }).await.map_err(|_| stopped())?;
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
            let _ = self.backoff.begin.send(BeginAttempt { key: key.clone() }).await;
        }
        Ok(())
    }

    /// Runs the pull through the pull queue until its answer is one the pod
    /// may use, and says whether it joined a pull another request started.
    /// An image found present when the pull's turn came (pulled by another
    /// pod, maybe with other credentials) is this pod's only if the records
    /// say so; otherwise it pulls for real. `line`, the `Pulling` event's
    /// log line, is written once the queue has the request and the pull's
    /// call (if it starts now) has gone out.
    #[allow(clippy::too_many_arguments)] // the pull's whole context, each used once
    async fn queue_pull(
        &self,
        req: &EnsureImageRequest,
        spec: &ImageSpec,
        lookup: &LazyLookup<'_>,
        credentials: &[AuthConfig],
        mut skip_if_present: bool,
        absent_at: Option<Instant>,
        line: crate::events::OwedLine,
    ) -> (Result<PullOutcome, PullFailure>, bool) {
        let mut line = Some(line);
        loop {
            // Made for each attempt and handed over whole: the queue keeps
            // it, this future (alive for the pull's length) does not.
            let request = PullRequest {
                image: spec.clone(),
                credentials: credentials.to_vec(),
                sandbox: req.sandbox.clone(),
                pod: (!(req.pod.name.is_empty() && req.pod.uid.is_empty())).then(|| PullPod {
                    namespace: req.pod.namespace.clone(),
                    name: req.pod.name.clone(),
                    uid: req.pod.uid.clone(),
                }),
                priority: req.pod.priority,
                skip_if_present,
                absent_at,
                deadline: req.deadline,
                wire: None,
                records: true,
            };
            let (result, joined) = match Box::pin(self.queue.send(EnqueuePull(request))).await {
                Ok(ticket) => {
                    if let Some(line) = line.take() {
                        // tokio runs a yielding task again only after every
                        // task it woke (the pull's call on its way out).
                        tokio::task::yield_now().await;
                        line.write();
                    }
                    let joined = ticket.joined;
                    (ticket.await, joined)
                }
                Err(_) => (Err(PullFailure::Stopped), false),
            };
            if let Ok(o) = &result
                && !o.pulled
            {
                let check = || {
                    Box::pin(
                        self.records
                            .must_attempt_pull_uncounted(&spec.image, &o.image_ref, || lookup.pod_credentials()),
                    )
                };
                let unsure = crate::pull_records::MustPullCheck { must_pull: true, result: None };
                let mut checked = check().await.unwrap_or(unsure);
                // The pull that brought it may have just been answered, its
                // records a commit away: they decide (never this pull's own:
                // it pulled nothing), and only the check acted on is counted.
                if checked.must_pull
                    && Box::pin(
                        self.records_due.written(&crate::pull_records::image_key(&spec.image), RECORDS_DUE_WAIT),
                    )
                    .await
                {
                    checked = check().await.unwrap_or(unsure);
                }
                self.records.count(checked);
                let must_pull = checked.must_pull;
                if must_pull {
                    skip_if_present = false;
                    continue;
                }
            }
            return (result, joined);
        }
    }

    /// A failed pull: the local image under `AlwaysWithLocalFallback` when
    /// the registry is unreachable and the pod may use it; otherwise the
    /// kubelet's `Failed` event and error, and the failure recorded for
    /// back-off.
    #[allow(clippy::too_many_arguments)] // the failed pull's whole context, each used once
    async fn pull_failed(
        &self,
        req: &EnsureImageRequest,
        spec: &ImageSpec,
        lookup: &LazyLookup<'_>,
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
                .must_attempt_pull_with(&spec.image, &image_ref, || lookup.pod_credentials())
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
        let _ = self
            .backoff
            .failure
            .send(RecordFailure { key, error_text: previous, credentials, transient_registry })
            .await;
        Err(self.fail(kind, msg, class))
    }

    /// KEP-2535: what a pull's end proves. Pulled (an outcome with
    /// `pulled`): the record, with what the credential that worked proves
    /// (`proves`, one per credential tried); failed, or found present: the
    /// pull only ends its intent; failed in a way that leaves the runtime's
    /// pull unknown ([`PullFailure::outcome_unknown`]): the intent stays.
    /// `began`: when this request's pull began (its intent recorded), on
    /// the records' clock: another request of the same pull that already
    /// wrote the same record spares this one its write.
    pub(super) async fn record_pull_end(
        &self,
        image: &str,
        requested: &str,
        result: Result<&PullOutcome, &PullFailure>,
        proves: &[ImagePullCredentials],
        began: std::time::SystemTime,
    ) {
        let end = match result {
            Ok(o) => o.pull_end(|credential| credentials_used(proves, credential, requested)),
            Err(f) => f.pull_end(),
        };
        self.records.end_pull(image, end, began).await;
    }

    /// A pull's success; `recovered`, the registry this pull shows
    /// recovered (`reset_backoff_on_registry_recovery`).
    fn pulled(
        &self,
        req: &EnsureImageRequest,
        outcome: &PullOutcome,
        start: Instant,
        recovered: Option<RegistryRecovered>,
    ) -> EnsureOk {
        let requested = req.image.as_str();
        let now = Instant::now();
        self.recorder.finished(&req.pod.uid, now);
        self.mark_ensured(&outcome.image_ref);
        // Fire and forget, and without needing an actix LocalSet on this
        // task (callers may be plain tokio tasks, e.g. the API server's):
        // a full mailbox only delays the entry GC to its periodic run. Its
        // only work, collecting expired entries, has none to do in a table
        // known empty.
        if !self.backoff.known_clear() {
            let _ = self.backoff.success.try_send(RecordSuccess);
        }
        if !outcome.pulled {
            // Found present when the pull's turn came (another pod pulled
            // it) and the pod may use it.
            let msg = already_present_accessible(requested);
            self.emit_present(req, &msg);
            return EnsureOk { image_ref: outcome.image_ref.clone(), message: msg };
        }
        // The event names the image's size, which the pull task looks up
        // after answering its waiters: it is sent once the lookup returns
        // (at once when the size is known), and the caller, who needs only
        // the image reference, does not wait for it. Its times end here.
        let (took, pulled_in) = (now.duration_since(start), outcome.pull_duration);
        let (metrics, events) = (self.metrics.clone(), self.events.clone());
        let recovery = recovered.map(|r| (self.backoff.recovered.clone(), r));
        let mut event = Self::event(req, EventReason::Pulled, "", None);
        let untold = self.untold.begin();
        outcome.size.when_known(move |size| {
            // At the instant of the event, fire and forget, ahead of any
            // check sent after it.
            if let Some((registry, recovered)) = recovery {
                let _ = registry.try_send(recovered);
            }
            metrics.image_pulled(size, took);
            event.message = successfully_pulled(&event.image, pulled_in, took, size);
            events.emit(event);
            drop(untold);
        });
        EnsureOk { image_ref: outcome.image_ref.clone(), message: String::new() }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test
    use std::time::Duration;

    use crate::actors::backoff_registry::{
        BackoffSettings, BeginAttempt, CheckBackoff, RecordFailure, RecordSuccess, RegistryRecovered,
    };
    use crate::actors::cri_gateway::{CriGatewayActor, CriSettings};
    use crate::actors::pull_queue::PullQueueSettings;
    use crate::cri::Rpc;
    use crate::domain::pull_policy::PullPolicy;
    use crate::embedded::{EmbeddedRuntime, RemoteImage};
    use crate::ensure::{EnsureImageRequest, EnsureSettings};
    use crate::testing::start_manager;

    #[actix::test]
    async fn a_pull_found_present_at_its_turn_waits_for_the_records_an_earlier_pull_owes() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = EmbeddedRuntime::start_in(dir.path()).unwrap();
        let (gateway, _) = CriGatewayActor::connect(&runtime.endpoint(), &CriSettings::default()).await.unwrap();
        // Serial pulls: the one for `wanted` waits behind a slow one, long
        // enough that its turn looks at the runtime again.
        let pull = PullQueueSettings { qps: 0.0, ..PullQueueSettings::default() };
        let m = start_manager(&gateway, &pull, &BackoffSettings::default(), EnsureSettings::default())
            .await
            .unwrap()
            .manager;
        let (slow, wanted) = ("example.com/team/slow:1", "example.com/team/wanted:1");
        runtime.add_remote(RemoteImage::new(slow, 10).latency(Duration::from_millis(1_300))).unwrap();
        runtime.add_remote(RemoteImage::new(wanted, 10)).unwrap();
        let first = m.clone();
        let slow_pull = tokio::spawn(async move {
            first.ensure_image_exists(&EnsureImageRequest::new("a", slow, PullPolicy::IfNotPresent)).await
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = m.clone();
        let mine = tokio::spawn(async move {
            second.ensure_image_exists(&EnsureImageRequest::new("b", wanted, PullPolicy::IfNotPresent)).await
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Meanwhile another pull brings `wanted`: the runtime has answered
        // it, its request has still to write its record (node-wide).
        let id = runtime.preload(RemoteImage::new(wanted, 10)).unwrap();
        let due = pull.records_due.owe(&crate::pull_records::image_key(wanted));
        slow_pull.await.unwrap().expect("the slow pull");
        // `mine`'s turn found the image present and waits for that record.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!mine.is_finished(), "waiting for the record due");
        // That other pull's intent, then its record (which ends the intent).
        let records = m.pull_records();
        records.begin_pull(wanted).await.unwrap().disarm();
        let creds = crate::domain::pull_record::ImagePullCredentials::node_accessible();
        records.record_image_pulled(wanted, &id, &creds).await.unwrap();
        drop(due);
        let ok = mine.await.unwrap().expect("served");
        assert_eq!(ok.image_ref, id);
        assert_eq!(
            runtime.stats().calls(Rpc::PullImage),
            1,
            "only the slow image was pulled: no second pull of `wanted`"
        );
    }

    /// Answers every back-off message as an empty registry would, counting
    /// the `CheckBackoff`s and `RecordSuccess`es it gets.
    #[derive(Default)]
    struct CountingRegistry(std::sync::Arc<[std::sync::atomic::AtomicUsize; 2]>);

    impl actix::Actor for CountingRegistry {
        type Context = actix::Context<Self>;
    }

    impl actix::Handler<CheckBackoff> for CountingRegistry {
        type Result = actix::MessageResult<CheckBackoff>;
        fn handle(&mut self, _: CheckBackoff, _: &mut Self::Context) -> Self::Result {
            self.0[0].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            actix::MessageResult(crate::actors::backoff_registry::BackoffCheck {
                in_backoff: false,
                previous_error: None,
                retry_in: None,
                backoff: None,
                credentials_changed: false,
            })
        }
    }

    impl actix::Handler<BeginAttempt> for CountingRegistry {
        type Result = ();
        fn handle(&mut self, _: BeginAttempt, _: &mut Self::Context) {}
    }

    impl actix::Handler<RecordFailure> for CountingRegistry {
        type Result = actix::MessageResult<RecordFailure>;
        fn handle(&mut self, _: RecordFailure, _: &mut Self::Context) -> Self::Result {
            actix::MessageResult(Duration::from_secs(10))
        }
    }

    impl actix::Handler<RecordSuccess> for CountingRegistry {
        type Result = ();
        fn handle(&mut self, _: RecordSuccess, _: &mut Self::Context) {
            self.0[1].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// A message the counting registry answers at once: when its answer
    /// comes, every message sent before it has been handled.
    #[derive(actix::Message)]
    #[rtype(result = "()")]
    struct ListNothing;

    impl actix::Handler<ListNothing> for CountingRegistry {
        type Result = ();
        fn handle(&mut self, _: ListNothing, _: &mut Self::Context) {}
    }

    impl actix::Handler<RegistryRecovered> for CountingRegistry {
        type Result = actix::MessageResult<RegistryRecovered>;
        fn handle(&mut self, _: RegistryRecovered, _: &mut Self::Context) -> Self::Result {
            actix::MessageResult(0)
        }
    }

    #[actix::test]
    async fn the_registry_is_not_asked_or_told_while_known_empty_and_is_with_a_port_of_an_address() {
        use actix::Actor as _;

        use crate::actors::backoff_registry::{BackoffPort, BackoffRegistryActor};
        use crate::actors::cri_gateway::GetReader;
        use crate::actors::pull_queue::PullQueueActor;
        use crate::ensure::ImageManager;

        let dir = tempfile::tempdir().unwrap();
        let runtime = EmbeddedRuntime::start_in(dir.path()).unwrap();
        let (gateway, _) = CriGatewayActor::connect(&runtime.endpoint(), &CriSettings::default()).await.unwrap();
        let reader = gateway.send(GetReader).await.unwrap();
        let queue = PullQueueActor::new(PullQueueSettings::default(), reader.clone()).start();
        let image = "example.com/team/app:1";
        runtime.add_remote(RemoteImage::new(image, 10)).unwrap();
        // A registry's occupancy (empty once started), the checks counted
        // by a registry of the test's.
        let registry = BackoffRegistryActor::from_settings(&BackoffSettings::default());
        let occupancy = registry.occupancy();
        let registry = registry.start();
        registry.send(crate::actors::backoff_registry::ListBackoffs).await.unwrap();
        let counts =
            std::sync::Arc::new([std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0)]);
        let counting = CountingRegistry(counts.clone()).start();
        let count = || counts[0].load(std::sync::atomic::Ordering::SeqCst);
        // Told with `try_send`: handled once the registry has had its turn.
        let successes = || {
            let (registry, counts) = (counting.clone(), counts.clone());
            async move {
                registry.send(ListNothing).await.unwrap();
                counts[1].load(std::sync::atomic::Ordering::SeqCst)
            }
        };
        let manager = |port: BackoffPort| {
            ImageManager::new(reader.clone(), queue.clone().recipient(), port, EnsureSettings::default())
        };
        let req = |uid: &str| EnsureImageRequest::new(uid, image, PullPolicy::Always);
        // Known empty: the pull goes ahead without asking.
        let known = manager(BackoffPort::from(&counting).with_occupancy(occupancy.clone()));
        known.ensure_image_exists(&req("a")).await.expect("pulled");
        assert_eq!(count(), 0, "no check sent while nothing backs off");
        assert_eq!(successes().await, 0, "nor the success, which collects nothing");
        // Not known (a port of an address alone): asked before each pull.
        let asking = manager(BackoffPort::from(&counting));
        asking.ensure_image_exists(&req("b")).await.expect("pulled");
        assert_eq!(count(), 1, "a port without the occupancy asks");
        assert_eq!(successes().await, 1, "and tells the success");
        // An entry in the registry: asked again.
        let failed = RecordFailure::new(crate::actors::backoff_registry::BackoffKey::new("z", "other:1"), "x");
        registry.send(failed).await.unwrap();
        known.ensure_image_exists(&req("c")).await.expect("pulled");
        assert_eq!(count(), 2, "something backs off: every check is sent");
        assert_eq!(successes().await, 2, "and every success");
        assert_eq!(runtime.stats().calls(Rpc::PullImage), 3);
    }
}
