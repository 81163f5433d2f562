//! imaged in the kubelet's path: the CRI `ImageService` served on imaged's
//! own socket, in front of the runtime the gateway talks to, so a kubelet
//! whose `imageServiceEndpoint` points here pulls through imaged's queue
//! (shared pulls, limits, throttle, priorities, deadlines) with no change of
//! its own. The protocol side is [`crate::cri::server`]; this is what each
//! call does:
//!
//! - `PullImage` becomes one pull in the pull queue with the call's one
//!   credential: identical concurrent calls (same image, same credential)
//!   share one runtime `PullImage`, different credentials never do, and a
//!   failure answers only the calls that shared it (no back-off: the kubelet
//!   keeps its own). The pull always reaches the registry (the kubelet
//!   decided to pull). A caller's own deadline is honoured and answered
//!   `DeadlineExceeded`; a caller that goes away stops waiting without
//!   cancelling the pull for the others.
//! - `ListImages`, `ImageStatus`, `ImageFsInfo` and `RemoveImage` are
//!   forwarded as bytes through the gateway's [`CriReader`] (its deadlines,
//!   fault plan and metrics), never through the queue or a mailbox, so they
//!   never wait behind pulls. Images matching `gc.pinned_images`, and the
//!   sandbox image unless told otherwise, are reported `pinned`.
//!
//! Credentials in `auth` serve that pull only: they are never logged,
//! stored or shown, and never replaced by node credentials.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix::Recipient;
use prost::bytes::Bytes;

use crate::actors::cache_refresher::ImageRemoved;
use crate::actors::cri_gateway::{CriReader, GetReader};
use crate::actors::pull_queue::{EnqueuePull, PullFailure, PullRequest, RecordDue, SizeOffers};
use crate::api::server::ApiSocket;
use crate::clock::Clock;
pub use crate::config::PRIORITY_NAMESPACE_PULL;
use crate::config::{CriServerSettings, PriorityRule};
use crate::cri::proto as pb;
use crate::cri::server::{FrontFuture, ImageFront, ImageServiceServer, PullCall, pull_answer};
use crate::cri::{CriError, CriErrorKind, Rpc};
use crate::domain::pull_record::{ImagePullCredentials, ImagePullSecret};
use crate::domain::{AuthConfig, ImageSpec, SandboxConfig};
use crate::ensure::{class_of_pull, failed_to_pull, pulling, successfully_pulled, using_local_image};
use crate::error::AppError;
use crate::events::{EventReason, EventSink, EventType, ImageEvent, ObjectRef, OwedLine};
use crate::gc::in_use_hints::{ClientClaim, InUseHints, Kept, RemovalInFlight};
use crate::gc::policy::pattern_matches;
use crate::metrics::{Metrics, RemoveRefused};
use crate::node::Node;
use crate::pull_records::{PodCredentials, PullEnd, PullRecords, VerifyPolicy};

/// How long the first `ImageFsInfo` waits for a runtime that is not
/// answering yet (the kubelet allows its first call 2 minutes, and exits
/// when it fails).
pub const FIRST_FS_INFO_WAIT: Duration = Duration::from_secs(110);

/// Pause between tries of that first `ImageFsInfo`.
const FS_INFO_RETRY: Duration = Duration::from_millis(200);

/// What the kubelet's pulls and image calls go through.
pub struct CriFront {
    reader: CriReader,
    pulls: Recipient<EnqueuePull>,
    /// Which images are reported pinned: `gc.pinned_images` as the node
    /// has them now (a SIGHUP reload changes them: see [`CriFront::over`]).
    pins: LivePins,
    priorities: Priorities,
    /// Where the kubelet's pulls are told (`Pulling`, `Pulled`, `Failed`,
    /// with the pod), as ensure's are.
    events: EventSink,
    metrics: Metrics,
    /// Refuse `RemoveImage` of a pinned image.
    refuse_remove_pinned: bool,
    /// Refuse `RemoveImage` of an image in use as the hints tell (given
    /// to a pod within the minimum age, or being pulled).
    refuse_remove_in_use: bool,
    /// `local_fallback_images` / `local_fallback_namespaces`.
    fallback_images: Vec<String>,
    fallback_namespaces: Vec<String>,
    /// What a forwarded `RemoveImage` tells, so imaged's records follow.
    removed: RemoveFollowers,
    /// Whether an `ImageFsInfo` has been answered yet (until then it waits
    /// for the runtime instead of failing).
    fs_info_answered: Arc<AtomicBool>,
    /// `ImageStatus` and `ListImages` answers served again
    /// (`cri_server.read_cache_ttl`).
    reads: ReadCache,
    /// Where the sizes in forwarded `ImageStatus` answers go to the
    /// front's pulls waiting for them (attached by [`with_size_offers`](Self::with_size_offers)).
    offers: SizeOffers,
    /// imaged's GC's in-use hints, told of the kubelet's image checks and
    /// pulls (attached by [`with_in_use_hints`](Self::with_in_use_hints)).
    hints: Option<FrontHints>,
    /// KEP-2535: the kubelet's pulls write intents and pulled records, so
    /// an image it pulled with a pod's credential is not taken for a
    /// preloaded one by imaged's own ensures (attached by
    /// [`with_pull_records`](Self::with_pull_records)).
    records: Option<PullRecords>,
    /// The node's flag: once it turns false (the daemon drains at
    /// shutdown), a new `PullImage` is refused `Unavailable` (attached by
    /// [`with_accepting`](Self::with_accepting)).
    accepting: Option<Arc<AtomicBool>>,
}

/// The in-use hints a front tells, and the clock their times are read on
/// (the pull records', as `ImageManager` marks them).
#[derive(Clone)]
struct FrontHints {
    hints: InUseHints,
    clock: Clock,
    /// How long an ensured image counts as in use for a client's
    /// `RemoveImage` (`gc.image_minimum_gc_age`, followed live), in
    /// milliseconds.
    keep_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl FrontHints {
    fn keep_for(&self) -> Duration {
        Duration::from_millis(self.keep_ms.load(Ordering::Relaxed))
    }

    fn set_keep_for(&self, window: Duration) {
        self.keep_ms.store(u64::try_from(window.as_millis()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

/// Looks of one `ImageStatus` while GC removes the image it finds: after a
/// removal ends the runtime is asked again; the last look answers as it
/// finds (as an ensure's presence check does).
const STATUS_LOOKS: u32 = 3;

/// The two fields of an `ImageStatusResponse` the front reads: the image's
/// id and size (field numbers as in `runtime.v1`; the rest is skipped
/// undecoded, so a kept answer costs no decode of its tags and digests).
#[derive(Clone, PartialEq, prost::Message)]
struct StatusFound {
    #[prost(message, optional, tag = "1")]
    image: Option<ImageFound>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ImageFound {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(uint64, tag = "4")]
    size: u64,
}

/// The image an encoded `ImageStatusResponse` names, if any.
fn image_found(answer: &[u8]) -> Option<ImageFound> {
    crate::cri::wire::peek::<StatusFound>(answer).ok()?.image.filter(|i| !i.id.is_empty())
}

/// Answers to `ImageStatus` and `ListImages`, by request bytes, served
/// again for up to `ttl` while no pull or remove through the gateway has
/// ended since they were read ([`CriReader::image_changes`]). The kubelet
/// asks `ImageStatus` before every container start and `ListImages` every
/// few seconds; most answers are the same as the last.
#[derive(Clone, Default)]
struct ReadCache {
    ttl: Duration,
    entries: Arc<std::sync::Mutex<ReadEntries>>,
}

#[derive(Default)]
struct ReadEntries {
    by_request: std::collections::HashMap<(Rpc, Bytes), ReadEntry>,
    bytes: usize,
}

struct ReadEntry {
    changes: u64,
    read_at: tokio::time::Instant,
    answer: Bytes,
}

/// At most this many answers, or this many bytes of them, are kept; past
/// either, the cache starts over.
const READ_CACHE_ENTRIES: usize = 4096;
const READ_CACHE_BYTES: usize = 64 << 20;

impl ReadCache {
    fn new(ttl: Duration) -> Self {
        Self { ttl, entries: Arc::default() }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, ReadEntries> {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The answer to `request`, if one read since the last change and
    /// within the ttl is kept.
    fn get(&self, key: &(Rpc, Bytes), changes: u64) -> Option<Bytes> {
        let entries = self.entries();
        let e = entries.by_request.get(key)?;
        (e.changes == changes && e.read_at.elapsed() < self.ttl).then(|| e.answer.clone())
    }

    /// Keeps `answer`, read at `read_at` with `changes` before and after.
    fn put(&self, key: (Rpc, Bytes), answer: &Bytes, changes: u64, read_at: tokio::time::Instant) {
        let mut entries = self.entries();
        let size = key.1.len() + answer.len();
        if entries.by_request.len() >= READ_CACHE_ENTRIES || entries.bytes + size > READ_CACHE_BYTES {
            *entries = ReadEntries::default();
        }
        entries.bytes += size;
        let key_len = key.1.len();
        if let Some(old) = entries.by_request.insert(key, ReadEntry { changes, read_at, answer: answer.clone() }) {
            // The same key: counted once.
            entries.bytes = entries.bytes.saturating_sub(key_len + old.answer.len());
        }
    }
}

impl std::fmt::Debug for CriFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriFront").field("pins", &*self.pins.now()).finish_non_exhaustive()
    }
}

/// The front's [`Pins`], replaced whole when the node's pinned images change.
#[derive(Debug, Clone, Default)]
struct LivePins(Arc<std::sync::RwLock<Arc<Pins>>>);

impl LivePins {
    fn new(pins: Pins) -> Self {
        Self(Arc::new(std::sync::RwLock::new(Arc::new(pins))))
    }

    /// The pins in force.
    fn now(&self) -> Arc<Pins> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Puts `pins` in force; false when they are the ones in force already.
    fn set(&self, pins: Pins) -> bool {
        let mut now = self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if **now == pins {
            return false;
        }
        *now = Arc::new(pins);
        true
    }
}

/// Which images are reported pinned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pins {
    /// `gc.pinned_images` patterns.
    pub patterns: Vec<String>,
    /// The sandbox image, fully qualified (`registry.k8s.io/pause:3.10`), if pinned.
    pub sandbox_image: Option<String>,
}

impl Pins {
    /// The pins of `patterns` and, when `pin_sandbox` is set, `sandbox_image`
    /// (normalised as the runtime names it; an unparsable or empty name pins
    /// nothing).
    pub fn new(patterns: Vec<String>, sandbox_image: &str, pin_sandbox: bool) -> Self {
        let sandbox_image = pin_sandbox
            .then(|| crate::domain::reference::parse_normalized_named(sandbox_image).ok())
            .flatten()
            .map(|n| n.to_string());
        Self { patterns, sandbox_image }
    }

    /// Whether an image with these tags and digests is pinned.
    pub fn pins(&self, repo_tags: &[String], repo_digests: &[String]) -> bool {
        let names = || repo_tags.iter().chain(repo_digests);
        self.sandbox_image.as_ref().is_some_and(|s| names().any(|n| n == s))
            || self.patterns.iter().any(|p| names().any(|n| pattern_matches(p, n)))
    }

    /// False when no image in this encoded answer can be pinned: nothing
    /// is pinned, or only the sandbox image is and its name occurs nowhere
    /// in the bytes (one scan instead of decoding every image of a
    /// `ListImages`). Patterns are globs: with any, the images are read.
    pub fn may_pin(&self, answer: &[u8]) -> bool {
        match (&self.sandbox_image, self.patterns.is_empty()) {
            (_, false) => true,
            (None, true) => false,
            (Some(name), true) => memchr::memmem::find(answer, name.as_bytes()).is_some(),
        }
    }

    /// True when nothing is pinned.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty() && self.sandbox_image.is_none()
    }
}

/// The pull priority of a pod: the highest of the `[[cri_server.priority]]`
/// rules it matches and `priority_namespaces` ([`PRIORITY_NAMESPACE_PULL`]);
/// 0 when nothing matches (and for a pull that names no pod).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Priorities {
    rules: Vec<PriorityRule>,
}

impl Priorities {
    /// The rules of `settings`, `priority_namespaces` folded in as
    /// namespace rules.
    pub fn new(settings: &CriServerSettings) -> Self {
        let namespaces = settings.priority_namespaces.iter().map(|n| PriorityRule {
            namespace: Some(n.clone()),
            label: None,
            annotation: None,
            priority: PRIORITY_NAMESPACE_PULL,
        });
        Self { rules: namespaces.chain(settings.priority.iter().cloned()).collect() }
    }

    /// The priority of a pull for `pod`.
    pub fn of(&self, pod: &SandboxConfig) -> i32 {
        self.rules
            .iter()
            .filter(|r| r.matches(&pod.namespace, &pod.labels, &pod.annotations))
            .map(|r| r.priority)
            .max()
            .unwrap_or(0)
    }
}

impl CriFront {
    /// A front forwarding through `reader` and pulling through `pulls`
    /// (its events to no one, its metrics to a registry of its own: see
    /// [`with_events`](Self::with_events)).
    pub fn new(reader: CriReader, pulls: Recipient<EnqueuePull>, pins: Pins, settings: &CriServerSettings) -> Self {
        Self {
            reader,
            pulls,
            pins: LivePins::new(pins),
            priorities: Priorities::new(settings),
            events: EventSink::default(),
            metrics: Metrics::default(),
            refuse_remove_pinned: settings.refuse_remove_pinned,
            refuse_remove_in_use: settings.refuse_remove_in_use,
            fallback_images: settings.local_fallback_images.clone(),
            fallback_namespaces: settings.local_fallback_namespaces.clone(),
            removed: RemoveFollowers::default(),
            fs_info_answered: Arc::default(),
            reads: ReadCache::new(settings.read_cache_ttl),
            offers: SizeOffers::default(),
            hints: None,
            records: None,
            accepting: None,
        }
    }

    /// The same front refusing new pulls once `accepting` turns false, as
    /// the node refuses new ensures: the kubelet is told `Unavailable`
    /// "imaged is shutting down" and retries (against the next imaged,
    /// when systemd holds the socket), where a pull taken now would stretch
    /// the drain and be abandoned at its end. Reads and removes are still
    /// forwarded.
    pub fn with_accepting(self, accepting: Arc<AtomicBool>) -> Self {
        Self { accepting: Some(accepting), ..self }
    }

    /// The same front keeping KEP-2535 `records` of the kubelet's pulls, as
    /// imaged's own pulls keep them: the intent on disk before the pull
    /// starts; once it ends, the pulled record with what the call's one
    /// credential proves ([`front_proves`]), or the intent ended. The
    /// record is written after the kubelet is answered (the intent covers
    /// a crash meanwhile; imaged's own checks wait for it).
    pub fn with_pull_records(self, records: PullRecords) -> Self {
        Self { records: Some(records), ..self }
    }

    /// The same front telling `hints` (imaged's GC's) what the kubelet
    /// uses, at times read on `clock`: an image an `ImageStatus` finds, or
    /// a pull brings, counts as ensured (in use for GC for its minimum
    /// age, as an API ensure does); a pull in flight keeps the image it
    /// replaces; and an `ImageStatus` that finds an image GC is removing
    /// waits for the removal and asks again, so the kubelet is not told
    /// of an image about to go.
    ///
    /// `keep_for` (the GC's minimum age): with
    /// `cri_server.refuse_remove_in_use`, how long an ensured image is
    /// kept from a client's `RemoveImage`.
    pub fn with_in_use_hints(self, hints: InUseHints, clock: Clock, keep_for: Duration) -> Self {
        let h = FrontHints { hints, clock, keep_ms: Arc::default() };
        h.set_keep_for(keep_for);
        Self { hints: Some(h), ..self }
    }

    /// The same front offering the sizes its clients' `ImageStatus` answers
    /// give to its pulls waiting for them (the pull queue's
    /// [`SizeOffers`]): a kubelet's pull then costs the runtime no
    /// `ImageStatus` of imaged's own.
    pub fn with_size_offers(self, offers: SizeOffers) -> Self {
        offers.attach();
        Self { offers, ..self }
    }

    /// `ImageStatus` or `ListImages` ([`read_kept`](Self::read_kept)). An
    /// image an `ImageStatus` answer names is marked ensured in the in-use
    /// hints (after any GC removal of it in flight, and a new look), and
    /// its size offered to a pull waiting for it.
    fn read(&self, rpc: Rpc, body: Bytes, deadline: Option<Duration>) -> FrontFuture<Bytes> {
        let hints = self.hints.clone().filter(|_| rpc == Rpc::ImageStatus);
        let offers = (rpc == Rpc::ImageStatus && self.offers.wanted()).then(|| self.offers.clone());
        if hints.is_none() && offers.is_none() {
            return self.read_kept(rpc, body, deadline);
        }
        let again = hints.as_ref().map(|_| (self.reader.clone(), body.clone()));
        let answer = self.read_kept(rpc, body, deadline);
        Box::pin(async move {
            let mut answer = answer.await?;
            let mut looks = 1;
            loop {
                let Some(found) = image_found(&answer) else { return Ok(answer) };
                if let Some(offers) = &offers {
                    offers.offer(&found.id, found.size);
                }
                let (Some(h), Some((reader, body))) = (&hints, &again) else { return Ok(answer) };
                let now = h.clock.now();
                if looks >= STATUS_LOOKS {
                    h.hints.ensured(&found.id, now);
                    return Ok(answer);
                }
                match h.hints.ensured_unless_removing(&found.id, now) {
                    Ok(()) => return Ok(answer),
                    Err(removal) => {
                        tracing::debug!(
                            image = found.id,
                            "GC is removing the image an ImageStatus found; asking again"
                        );
                        removal.ended().await;
                        looks += 1;
                        let image = if reader.has_faults() { image_read(rpc, body) } else { None };
                        answer = reader.forward(rpc, image.as_deref(), body.clone(), deadline).await?;
                    }
                }
            }
        })
    }

    /// `ImageStatus` or `ListImages`: a kept answer when one is good
    /// ([`ReadCache`]), else the runtime's, kept if no image changed
    /// through imaged while it was read. Not while a fault plan is set.
    fn read_kept(&self, rpc: Rpc, body: Bytes, deadline: Option<Duration>) -> FrontFuture<Bytes> {
        if self.reader.has_faults() {
            // The plan's image rules match forwarded reads as they match
            // imaged's own: by the image the request names.
            let image = image_read(rpc, &body);
            return Box::pin(self.reader.forward(rpc, image.as_deref(), body, deadline));
        }
        if self.reads.ttl.is_zero() {
            return Box::pin(self.reader.forward(rpc, None, body, deadline));
        }
        let key = (rpc, body);
        let before = self.reader.image_changes();
        if let Some(answer) = self.reads.get(&key, before) {
            self.metrics.front_answer_cached(rpc);
            return Box::pin(std::future::ready(Ok(answer)));
        }
        let (reader, reads) = (self.reader.clone(), self.reads.clone());
        Box::pin(async move {
            let read_at = tokio::time::Instant::now();
            let answer = reader.forward(rpc, None, key.1.clone(), deadline).await?;
            if reader.image_changes() == before {
                reads.put(key, &answer, before, read_at);
            }
            Ok(answer)
        })
    }

    /// The same front telling what a forwarded `RemoveImage` removed to
    /// `removed`.
    pub fn with_remove_followers(self, removed: RemoveFollowers) -> Self {
        Self { removed, ..self }
    }

    /// `RemoveImage`: the image's names first (`ImageStatus`: the call
    /// carries a ref or an id only), refused when pinned and
    /// `refuse_remove_pinned` is set, or in use as the in-use hints tell
    /// and `refuse_remove_in_use` is set (then the removal holds imaged's
    /// claim on it while it runs: a check of the image meanwhile waits for
    /// it), then forwarded; once removed, the pull records and the node's
    /// image list let it go.
    fn remove(&self, body: Bytes, deadline: Option<Duration>) -> FrontFuture<Bytes> {
        let spec: ImageSpec = match <pb::RemoveImageRequest as prost::Message>::decode(&body[..]) {
            Ok(req) => req.image.map(Into::into).unwrap_or_default(),
            Err(e) => {
                let e = CriError::new(CriErrorKind::InvalidArgument, format!("RemoveImageRequest: {e}"));
                return Box::pin(std::future::ready(Err(e)));
            }
        };
        if let Err(e) = crate::cri::server::image_named("RemoveImageRequest", &spec) {
            return Box::pin(std::future::ready(Err(e)));
        }
        let reader = self.reader.clone();
        let refuse = self.refuse_remove_pinned.then(|| self.pins.now());
        let in_use = self.hints.clone().filter(|_| self.refuse_remove_in_use);
        let removed = self.removed.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let image = match reader.image_status(spec.clone(), false).await {
                Ok(s) => s.image,
                Err(e) if refuse.is_some() || in_use.is_some() => return Err(e),
                Err(e) => {
                    tracing::debug!(image = %spec.image, error = %e, "no ImageStatus before RemoveImage; records follow at the next refresh");
                    None
                }
            };
            let named = |img: &crate::domain::Image| {
                format!(
                    "{:?} ({}{})",
                    spec.image,
                    img.id,
                    img.repo_tags.first().map(|t| format!(", {t}")).unwrap_or_default()
                )
            };
            if let (Some(pins), Some(img)) = (&refuse, &image)
                && (img.pinned || pins.pins(&img.repo_tags, &img.repo_digests))
            {
                metrics.front_remove_refused(RemoveRefused::Pinned);
                return Err(CriError::from_status(
                    crate::cri::StatusCode::FailedPrecondition,
                    format!(
                        "imaged refuses to remove image {}: it is pinned (gc.pinned_images, the sandbox image or \
                         the runtime's pin) and cri_server.refuse_remove_pinned is set",
                        named(img),
                    ),
                ));
            }
            let _claim = match (&in_use, &image) {
                (Some(h), Some(img)) => {
                    let names: Vec<String> = img.repo_tags.iter().chain(&img.repo_digests).cloned().collect();
                    let mut waits = 0;
                    loop {
                        let (now, window) = (h.clock.now(), h.keep_for());
                        let since = now.checked_sub(window).unwrap_or(std::time::SystemTime::UNIX_EPOCH);
                        match h.hints.claim_client_removal(&img.id, &names, since) {
                            Ok(ClientClaim::Mine(claim)) => break Some(claim),
                            // Another removal of it (imaged's GC, another
                            // client's): its turn after it, asked again.
                            Ok(ClientClaim::Other(removal)) if waits < STATUS_LOOKS => {
                                waits += 1;
                                removal.ended().await;
                            }
                            Ok(ClientClaim::Other(_)) => break None,
                            Err(kept) => {
                                metrics.front_remove_refused(match kept {
                                    Kept::Ensured { .. } => RemoveRefused::InUse,
                                    Kept::Pulling => RemoveRefused::Pulling,
                                });
                                return Err(in_use_refusal(&named(img), kept, now, window));
                            }
                        }
                    }
                }
                _ => None,
            };
            let until = removed.records.as_ref().map(|r| r.clock().now());
            let answer = reader.forward(Rpc::RemoveImage, Some(&spec.image), body, deadline).await?;
            if let Some(img) = image {
                removed.image_removed(&img.id, until).await;
            }
            Ok(answer)
        })
    }

    /// The same front telling its pulls to `events` and `metrics`.
    pub fn with_events(self, events: EventSink, metrics: Metrics) -> Self {
        Self { events, metrics, ..self }
    }

    /// Whether a failed pull of this call falls back to the local image in
    /// a registry outage (`normalized`: its image's name normalised, if it
    /// parses).
    fn falls_back(&self, call: &PullCall, normalized: Option<&str>) -> bool {
        let image = normalized.unwrap_or(&call.image.image);
        self.fallback_images.iter().any(|p| pattern_matches(p, image))
            || call.sandbox.as_ref().is_some_and(|s| self.fallback_namespaces.contains(&s.namespace))
    }

    /// The queue request for a call: its one credential, must reach the
    /// registry, priority by the pod's namespace, labels and annotations,
    /// pulled as the client's bytes.
    fn request(&self, call: PullCall) -> PullRequest {
        let priority = call.sandbox.as_ref().map_or(0, |s| self.priorities.of(s));
        PullRequest {
            credentials: call.auth.into_iter().collect(),
            sandbox: call.sandbox,
            priority,
            wire: Some(call.wire),
            records: self.records.is_some(),
            ..PullRequest::new(call.image)
        }
    }
}

/// What a forwarded `RemoveImage` tells (as GC's removals end in the
/// pull records' prune and the next image list).
#[derive(Clone, Default)]
pub struct RemoveFollowers {
    /// KEP-2535 pull records: the removed image's record goes.
    pub records: Option<PullRecords>,
    /// The cache refresher: the node's image list drops the image.
    pub image_list: Option<Recipient<ImageRemoved>>,
}

impl std::fmt::Debug for RemoveFollowers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoveFollowers").finish_non_exhaustive()
    }
}

impl RemoveFollowers {
    /// The image with `id` is gone; `until`: when the remove started (a
    /// record written since is a new pull's and stays).
    async fn image_removed(&self, id: &str, until: Option<std::time::SystemTime>) {
        if let (Some(records), Some(until)) = (&self.records, until)
            && let Err(e) = records.forget_removed_image(id, until).await
        {
            tracing::warn!(image = id, error = %e, "failed to delete the pulled record of a removed image");
        }
        if let Some(list) = &self.image_list {
            // A full mailbox leaves it to the next refresh.
            let _ = list.try_send(ImageRemoved { id: id.to_string() });
        }
    }
}

/// How a front pull reaches the queue: sent at once (no records to
/// keep), or once its intent is on disk (the request boxed meanwhile, so
/// the waiting future stays small).
// The send holds its request inline: boxing it would cost the no-records
// path an allocation per pull, and the future held it unboxed before.
#[allow(clippy::large_enum_variant)]
enum Enqueue {
    Sent(actix::prelude::RecipientRequest<EnqueuePull>),
    AfterIntent(Recipient<EnqueuePull>, Box<PullRequest>),
}

/// A front pull's KEP-2535 bookkeeping: the records, the image as the
/// kubelet named it, what its credential proves.
struct FrontRecord {
    records: PullRecords,
    image: String,
    proves: ImagePullCredentials,
}

impl FrontRecord {
    /// What `call` records in `records`; `None` for a name that does not
    /// parse: the runtime's to refuse, and no intent is written of it (its
    /// text may hold anything) since no record could name it.
    fn of(records: &PullRecords, call: &PullCall) -> Option<Box<Self>> {
        crate::pull_records::image_repo(&call.image.image)?;
        Some(Box::new(Self {
            records: records.clone(),
            image: call.image.image.clone(),
            proves: front_proves(call.auth.as_ref()),
        }))
    }

    /// The pull ended as `end` (pulled: with `proves`, what the call's
    /// credential proves): its record written, or its intent ended or
    /// kept, on a task of its own so the kubelet is answered meanwhile
    /// (its handle, for a caller that must wait for it); `due`, the record
    /// the queue holds due, goes once written.
    fn end(
        self,
        intent: crate::pull_records::IntentGuard,
        began: std::time::SystemTime,
        end: PullEnd,
        due: Option<std::sync::Arc<RecordDue>>,
    ) -> tokio::task::JoinHandle<()> {
        intent.disarm();
        let Self { records, image, .. } = self;
        records.end_pull_behind(image, end, began, due)
    }
}

/// What a pull that failed in a registry outage may fall back to: the
/// image on the node, for a call whose credential (`auth`) imaged's
/// KEP-2535 `records` show may use it (none without records: every pod
/// may).
struct Fallback {
    reader: CriReader,
    spec: ImageSpec,
    records: Option<PullRecords>,
    auth: Option<AuthConfig>,
}

/// What [`Fallback::local`] found.
enum Local {
    /// On the node, and the call may use it: its id.
    Usable(String),
    /// On the node, but the call's credential has not been shown to the
    /// registry for it: the kubelet may be pulling to verify a pod's
    /// credentials (`ensureSecretPulledImages`), which an outage must not
    /// answer for the registry. What to add to the error, saying so.
    NotShown(String),
    /// Not on the node (or the runtime did not say).
    Absent,
}

impl Fallback {
    /// The image on the node, if the call may use it: its credential
    /// checked as a pod's (the entry [`front_proves`] records of it,
    /// matched by its hash; none for no credential or a token).
    async fn local(self) -> Local {
        let Some(img) = self.reader.image_status(self.spec.clone(), false).await.ok().and_then(|s| s.image) else {
            return Local::Absent;
        };
        if let Some(records) = self.records {
            let proves = front_proves(self.auth.as_ref());
            let which = if proves.node_pods_accessible {
                "a pull without a credential"
            } else if proves.kubernetes_secrets.is_empty() {
                "a pull with a token (a token is not matched: every pod pulls to use the image)"
            } else {
                "the credential of this pull"
            };
            let pod = PodCredentials { secrets: proves.kubernetes_secrets, service_account: None };
            let pod = std::future::ready(Ok::<_, std::convert::Infallible>(pod));
            // Infallible: the credential is the call's own.
            if records.must_attempt_pull_with(&self.spec.image, &img.id, || pod).await.unwrap_or(true) {
                return Local::NotShown(format!(
                    "; the image on the node was not used: imaged's pull records do not show that {which} may use it \
                     (KEP-2535)"
                ));
            }
        }
        Local::Usable(img.id)
    }
}

/// What a front pull that succeeded with `auth` (the call's one
/// credential) proves, for KEP-2535: none (or an empty one), every pod
/// may use the image, as after an anonymous ensure; a user name and
/// password as the runtime uses them ([`AuthConfig::basic_credentials`]),
/// pods whose secrets hold the same credential (matched by its hash: the
/// kubelet does not say which secret it came from, so the entry names
/// none, its uid the hash so that each credential keeps its own); a token,
/// nothing (every pod must pull to use the image).
pub fn front_proves(auth: Option<&AuthConfig>) -> ImagePullCredentials {
    let Some(auth) = auth.filter(|a| {
        !(a.username.is_empty()
            && a.password.is_empty()
            && a.auth.is_empty()
            && a.identity_token.is_empty()
            && a.registry_token.is_empty())
    }) else {
        return ImagePullCredentials::node_accessible();
    };
    match auth.basic_credentials() {
        Some((user, password)) => {
            let credential_hash = crate::credentials::Credential::new(user, password, "").auth_config_hash();
            ImagePullCredentials::secret(ImagePullSecret {
                uid: credential_hash.clone(),
                namespace: String::new(),
                name: String::new(),
                credential_hash,
            })
        }
        None => ImagePullCredentials::default(),
    }
}

/// How a front pull is told in imaged's events: as ensure tells a pod's
/// pull, with the pod the kubelet named (no container: `PullImage` names
/// none). Never with its credentials.
struct Told {
    events: EventSink,
    object: ObjectRef,
    image: String,
}

impl Told {
    fn new(request: &PullRequest, events: EventSink) -> Self {
        let object = request.sandbox.as_ref().map_or_else(ObjectRef::default, |s| ObjectRef {
            pod_uid: s.uid.clone(),
            namespace: s.namespace.clone(),
            pod_name: s.name.clone(),
            container: None,
        });
        Self { events, object, image: request.image.image.clone() }
    }

    fn emit(&self, reason: EventReason, message: String, failure: Option<&PullFailure>) {
        self.emit_as(reason.event_type(), reason, message, failure);
    }

    /// The `Pulling` event: to subscribers now, its log line owed (written
    /// once the pull's call is out, as an ensure's; see `actors.md`).
    fn pulling(&self) -> OwedLine {
        self.events.emit_owing_line(ImageEvent {
            event_type: EventReason::Pulling.event_type(),
            reason: EventReason::Pulling,
            message: pulling(&self.image),
            object: self.object.clone(),
            image: self.image.clone(),
            class: None,
        })
    }

    fn emit_as(&self, event_type: EventType, reason: EventReason, message: String, failure: Option<&PullFailure>) {
        self.events.emit(ImageEvent {
            event_type,
            reason,
            message,
            object: self.object.clone(),
            image: self.image.clone(),
            class: failure.map(class_of_pull),
        });
    }
}

/// The image an `ImageStatus` names, or a `ListImages` filters on; `None`
/// for another call, no image, or bytes that do not decode (the runtime
/// answers those itself).
fn image_read(rpc: Rpc, body: &[u8]) -> Option<String> {
    use crate::cri::wire::peek;
    match rpc {
        Rpc::ImageStatus => peek::<pb::ImageStatusRequest>(body).ok()?.image.map(|s| s.image),
        Rpc::ListImages => peek::<pb::ListImagesRequest>(body).ok()?.filter?.image.map(|s| s.image),
        _ => None,
    }
    .filter(|image| !image.is_empty())
}

/// Whether image `id`, which a pull brought while `removal` of it was in
/// flight, is there once that removal ended (`ImageStatus`); marked
/// ensured if so (looked at up to [`STATUS_LOOKS`] times while removals
/// of it follow one another).
async fn there_after(removal: RemovalInFlight, h: &FrontHints, reader: &CriReader, id: &str) -> bool {
    let mut removal = removal;
    for _ in 0..STATUS_LOOKS {
        removal.ended().await;
        let found = reader.image_status(ImageSpec::new(id), false).await.ok().and_then(|s| s.image);
        if found.is_none() {
            return false;
        }
        match h.hints.ensured_unless_removing(id, h.clock.now()) {
            Ok(()) => return true,
            Err(next) => removal = next,
        }
    }
    false
}

/// The refusal of a `RemoveImage` of `named` (the call's image, its id
/// and first tag) that the in-use hints keep (`kept`), at `now`, an image
/// ensured counting as in use for `window`.
fn in_use_refusal(named: &str, kept: Kept, now: std::time::SystemTime, window: Duration) -> CriError {
    let why = match kept {
        Kept::Ensured { at } => format!(
            "it was ensured {} ago (pulled, or found by an ImageStatus, through imaged), and an ensured image \
             counts as in use for gc.image_minimum_gc_age ({})",
            crate::domain::go_text::duration_truncated_ms(now.duration_since(at).unwrap_or_default()),
            crate::domain::go_text::duration(window),
        ),
        Kept::Pulling => "a pull of it is in flight".to_string(),
    };
    CriError::from_status(
        crate::cri::StatusCode::FailedPrecondition,
        format!("imaged refuses to remove image {named}: {why}, and cri_server.refuse_remove_in_use is set"),
    )
}

/// A pull refused for a registry outage with no local image to fall back
/// to: code `Unknown` and a message starting `RegistryUnavailable`, the one
/// form the kubelet reports as `ErrRegistryUnavailable`.
pub fn registry_unavailable(failure: &str) -> CriError {
    let message = if failure.starts_with("RegistryUnavailable") {
        failure.to_string()
    } else {
        format!("RegistryUnavailable: {failure}")
    };
    CriError::from_status(crate::cri::StatusCode::Unknown, message)
}

/// A failed pull as the CRI error the client sees: the runtime's own code
/// and message when the runtime failed it, a fitting code for imaged's own.
pub fn pull_error(failure: PullFailure) -> CriError {
    match failure {
        PullFailure::Cri(mut errors) if errors.len() == 1 => errors.remove(0),
        PullFailure::Cri(errors) => match errors.first() {
            Some(first) => CriError::from_status(first.code(), PullFailure::Cri(errors.clone()).to_string()),
            None => CriError::new(CriErrorKind::Other, "image pull failed"),
        },
        f @ PullFailure::QpsExceeded => CriError::new(CriErrorKind::ResourceExhausted, f.to_string()),
        f @ PullFailure::DeadlineExceeded(_) => CriError::new(CriErrorKind::DeadlineExceeded, f.to_string()),
        f @ PullFailure::Stopped => CriError::new(CriErrorKind::RuntimeUnavailable, f.to_string()),
    }
}

impl ImageFront for CriFront {
    fn forward(&self, rpc: Rpc, body: Bytes, deadline: Option<Duration>) -> FrontFuture<Bytes> {
        if rpc == Rpc::RemoveImage {
            return self.remove(body, deadline);
        }
        if Rpc::KEPT_BY_FRONT.contains(&rpc) {
            return self.read(rpc, body, deadline);
        }
        if rpc != Rpc::ImageFsInfo || self.fs_info_answered.load(Ordering::Acquire) {
            return Box::pin(self.reader.forward(rpc, None, body, deadline));
        }
        // The kubelet's first ImageFsInfo, when it connects: a runtime not
        // answering yet (imaged started first) is waited for within the
        // call, as the kubelet exits when this call fails.
        let (reader, answered) = (self.reader.clone(), self.fs_info_answered.clone());
        Box::pin(async move {
            let give_up = tokio::time::Instant::now() + deadline.unwrap_or(FIRST_FS_INFO_WAIT).min(FIRST_FS_INFO_WAIT);
            loop {
                match reader.forward(rpc, None, body.clone(), deadline).await {
                    Ok(answer) => {
                        answered.store(true, Ordering::Release);
                        return Ok(answer);
                    }
                    Err(e)
                        if e.kind() == CriErrorKind::RuntimeUnavailable
                            && tokio::time::Instant::now() + FS_INFO_RETRY < give_up =>
                    {
                        tracing::debug!(error = %e, "the runtime is not answering ImageFsInfo yet; waiting");
                        tokio::time::sleep(FS_INFO_RETRY).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        })
    }

    fn pull(&self, call: PullCall) -> FrontFuture<Bytes> {
        // What a pull holds while it waits is kept small: a burst of
        // kubelets' pulls waits by the thousand (actors.md, "Per-waiter
        // memory"). The rare fallback's state is boxed, the request is sent
        // now (not kept in the future beside the send), and only a call
        // with a deadline carries its timer.
        if self.accepting.as_ref().is_some_and(|a| !a.load(Ordering::Acquire)) {
            return Box::pin(std::future::ready(Err(CriError::new(
                CriErrorKind::RuntimeUnavailable,
                "imaged is shutting down",
            ))));
        }
        let deadline = call.deadline;
        let normalized = crate::domain::reference::parse_normalized_named(&call.image.image).map(|n| n.docker_ref());
        let fallback = self.falls_back(&call, normalized.as_deref().ok()).then(|| {
            Box::new(Fallback {
                reader: self.reader.clone(),
                spec: call.image.clone(),
                records: self.records.clone(),
                auth: call.auth.clone(),
            })
        });
        // While the pull runs, an image it would replace counts as in use
        // for GC; what it brings is marked ensured (as an ensure's pull).
        let hints = self.hints.clone();
        let in_flight = hints.as_ref().zip(normalized.ok()).map(|(h, r)| h.hints.pull_started(&r));
        let recheck = hints.as_ref().map(|_| Box::new(self.reader.clone()));
        let recording = self.records.as_ref().and_then(|records| FrontRecord::of(records, &call));
        let request = self.request(call);
        let told = Told::new(&request, self.events.clone());
        let metrics = self.metrics.clone();
        let start = tokio::time::Instant::now();
        let mut line = Some(told.pulling());
        // Without records the request is sent now; with them, once its
        // intent is on disk (boxed meanwhile: the future stays small).
        let enqueue = match &recording {
            None => Enqueue::Sent(self.pulls.send(EnqueuePull(request))),
            Some(_) => Enqueue::AfterIntent(self.pulls.clone(), Box::new(request)),
        };
        let wait = async move {
            let mut intent = None;
            if let Some(r) = &recording {
                // Boxed: a waiting pull's future keeps no room for it.
                match Box::pin(r.records.begin_pull(&r.image)).await {
                    Ok(guard) => intent = Some((guard, r.records.clock().now())),
                    Err(e) => {
                        drop(line.take());
                        let text = format!("imaged could not record the pull's intent: {e}");
                        told.emit(EventReason::Failed, failed_to_pull(&told.image, &text), None);
                        return Err(CriError::new(CriErrorKind::Other, text));
                    }
                }
            }
            let sent = match enqueue {
                Enqueue::Sent(send) => send,
                Enqueue::AfterIntent(pulls, request) => pulls.send(EnqueuePull(*request)),
            };
            let sent = sent.await;
            if let Some(line) = line.take() {
                // As an ensure's: once the tasks woken meanwhile (the pull's
                // call on its way out) have run.
                if sent.is_ok() {
                    tokio::task::yield_now().await;
                }
                line.write();
            }
            let Ok(ticket) = sent else {
                let failure = PullFailure::Stopped;
                if let (Some(r), Some((guard, began))) = (recording, intent) {
                    r.end(guard, began, failure.pull_end(), None);
                }
                told.emit(EventReason::Failed, failed_to_pull(&told.image, &failure.to_string()), Some(&failure));
                return Err(CriError::new(CriErrorKind::RuntimeUnavailable, "imaged's pull queue has stopped"));
            };
            let mut result = ticket.await;
            let mut ended = None;
            if let (Some(r), Some((guard, began))) = (recording, intent) {
                let (end, due) = match &mut result {
                    Ok(o) => (o.pull_end(|_| r.proves.clone()), o.record_due.take()),
                    Err(f) => (f.pull_end(), None),
                };
                ended = Some(r.end(guard, began, end, due));
            }
            if let (Some(h), Ok(o)) = (&hints, &result)
                && let Err(removal) = h.hints.ensured_unless_removing(&o.image_ref, h.clock.now())
            {
                // A removal of what it brought is in flight (imaged's GC's,
                // or a client's through this socket claimed before the pull
                // began): the kubelet is not told of an image about to go.
                // Boxed: a rare path.
                let there = match &recheck {
                    Some(reader) => Box::pin(there_after(removal, h, reader, &o.image_ref)).await,
                    None => false,
                };
                if !there {
                    let text = "the image was removed through imaged while it was pulled; pull it again".to_string();
                    told.emit(EventReason::Failed, failed_to_pull(&told.image, &text), None);
                    return Err(CriError::new(CriErrorKind::Other, text));
                }
            }
            drop(in_flight);
            match result {
                Ok(o) => {
                    let total = start.elapsed();
                    let answer = o.answer.clone().unwrap_or_else(|| pull_answer(o.image_ref.clone()));
                    // The caller is answered now; the event waits for the
                    // size (the caller's own size lookup comes next).
                    let (pulled, pull_duration) = (o.pulled, o.pull_duration);
                    o.size.when_known(move |size| {
                        if pulled {
                            metrics.image_pulled(size, total);
                        }
                        let text = successfully_pulled(&told.image, pull_duration, total, size);
                        told.emit(EventReason::Pulled, text, None);
                    });
                    Ok(answer)
                }
                Err(failure) if fallback.is_some() && failure.registry_unreachable() => {
                    // The pull's own intent ended first: while it counts, the
                    // records take the image for one imaged pulled, not a
                    // preloaded one (as an ensure's fallback, which asks
                    // after its pull's end is recorded).
                    if let Some(ended) = ended {
                        let _ = ended.await;
                    }
                    let local = match fallback {
                        // Boxed: a rare path, and every waiting pull would
                        // otherwise hold room for this call's future.
                        Some(f) => Box::pin(f.local()).await,
                        None => Local::Absent,
                    };
                    let mut text = failure.to_string();
                    match local {
                        Local::Usable(id) => {
                            if let Some(h) = &hints {
                                h.hints.ensured(&id, h.clock.now());
                            }
                            let msg = using_local_image(&told.image, &text);
                            told.emit_as(EventType::Warning, EventReason::Pulled, msg, Some(&failure));
                            return Ok(pull_answer(id));
                        }
                        Local::NotShown(why) => text.push_str(&why),
                        Local::Absent => {}
                    }
                    told.emit(EventReason::Failed, failed_to_pull(&told.image, &text), Some(&failure));
                    Err(registry_unavailable(&text))
                }
                Err(failure) => {
                    told.emit(EventReason::Failed, failed_to_pull(&told.image, &failure.to_string()), Some(&failure));
                    Err(pull_error(failure))
                }
            }
        };
        match deadline {
            // The caller's deadline bounds its own wait only: the pull goes
            // on for the others (and is joined by the caller's next try).
            Some(d) => Box::pin(async move {
                tokio::time::timeout(d, wait).await.unwrap_or_else(|_| {
                    Err(CriError::new(
                        CriErrorKind::DeadlineExceeded,
                        "the caller's deadline passed while its pull was queued or running",
                    ))
                })
            }),
            None => Box::pin(wait),
        }
    }

    fn pins(&self, _id: &str, repo_tags: &[String], repo_digests: &[String]) -> bool {
        self.pins.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).pins(repo_tags, repo_digests)
    }

    fn may_pin(&self, answer: &[u8]) -> bool {
        self.pins.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).may_pin(answer)
    }
}

impl CriFront {
    /// The front over `node`: its gateway's reader, its pull queue, and
    /// the pins of its GC settings, which follow the node's (a SIGHUP
    /// reload of `gc.pinned_images` reaches the kubelet's next call).
    pub async fn over(node: &Node, settings: &CriServerSettings) -> Result<Self, AppError> {
        let reader = node.gateway().send(GetReader).await.map_err(|_| AppError::Mailbox("CRI gateway".into()))?;
        let pin_sandbox = settings.pin_sandbox_image;
        let pins_of =
            move |gc: &crate::config::GcSettings| Pins::new(gc.pinned_images.clone(), &gc.sandbox_image, pin_sandbox);
        let mut gc = node.watch_gc_settings();
        let pins = pins_of(&gc.borrow_and_update());
        let front = Self::new(reader, node.queue().clone().recipient(), pins, settings)
            .with_events(node.manager().events().clone(), node.config().pull.metrics.clone())
            .with_size_offers(node.config().pull.size_offers.clone())
            .with_in_use_hints(
                node.manager().hints().clone(),
                node.manager().pull_records().clock(),
                gc.borrow().min_age,
            )
            .with_pull_records(node.manager().pull_records().clone())
            .with_accepting(node.accepting_flag())
            .with_remove_followers(RemoveFollowers {
                records: Some(node.manager().pull_records().clone()),
                image_list: Some(node.gc().refresher.clone().recipient()),
            });
        // Ends when the node is dropped.
        let (live, keep) = (front.pins.clone(), front.hints.clone());
        tokio::spawn(async move {
            while gc.changed().await.is_ok() {
                let settings = gc.borrow_and_update().clone();
                if live.set(pins_of(&settings)) {
                    tracing::info!("CRI front: pinned images updated");
                }
                if let Some(h) = &keep {
                    h.set_keep_for(settings.min_age);
                }
            }
        });
        Ok(front)
    }
}

/// Serves `front` on `socket` until `shutdown` resolves; calls in flight
/// finish first. The socket file is removed when serving ends.
pub async fn serve(
    mut socket: ApiSocket,
    front: CriFront,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), AppError> {
    let incoming = socket.incoming()?;
    // Bounded streams and window: a burst cannot close a connection.
    crate::cri::transport::server()
        .add_service(ImageServiceServer::new(Arc::new(front)))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| AppError::Other(format!("CRI server on {}: {e}", socket.path().display())))
}

/// Why the outage fallback (`cri_server.local_fallback_*`) may answer a
/// kubelet pull the kubelet itself would have had verify a pod's
/// credentials: it decides KEP-2535 on imaged's records and policy, which
/// stand for the kubelet's only when they saw the same pulls and apply
/// the same policy. One text per reason, none when the fallback is off or
/// no reason is known. `kubelet`: the kubelet's configuration, when given
/// (`--kubelet-config`); `in_memory`: `state.dir = "memory"`.
pub fn fallback_warnings(
    settings: &CriServerSettings,
    verification: &VerifyPolicy,
    in_memory: bool,
    kubelet: Option<&crate::kubelet_config::KubeletImageFields>,
) -> Vec<String> {
    use crate::pull_records::VerificationPolicy as P;
    if settings.local_fallback_images.is_empty() && settings.local_fallback_namespaces.is_empty() {
        return Vec::new();
    }
    let ours = verification.policy;
    let mut out = Vec::new();
    if in_memory && !matches!(ours, P::AlwaysVerify | P::NeverVerify) {
        out.push(format!(
            "imaged's KEP-2535 pull records are in memory (state.dir = \"memory\"): after a restart every image on \
             the node counts as preloaded under credential_verification.policy {ours:?}, and in a registry outage \
             cri_server.local_fallback_* would let any pod use an image the kubelet pulled with a secret; set state.dir",
            ours = ours.as_str()
        ));
    }
    match kubelet {
        None => out.push(format!(
            "cri_server.local_fallback_* decides KEP-2535 with imaged's credential_verification.policy {:?}, and \
             without the kubelet's configuration (--kubelet-config) imaged cannot tell whether the kubelet's \
             imagePullCredentialsVerificationPolicy is the same",
            ours.as_str()
        )),
        Some(k) => {
            // The kubelet's default when the field is absent.
            let theirs =
                k.image_pull_credentials_verification_policy.as_deref().unwrap_or("NeverVerifyPreloadedImages");
            if theirs != ours.as_str() {
                out.push(format!(
                    "credential_verification.policy is {:?} but the kubelet's imagePullCredentialsVerificationPolicy \
                     is {theirs:?} ({}): in a registry outage cri_server.local_fallback_* may let a pod use an image \
                     the kubelet would have it verify",
                    ours.as_str(),
                    k.file.display()
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_warns_when_imageds_records_or_policy_may_not_stand_for_the_kubelets() {
        use crate::kubelet_config::KubeletImageFields;
        use crate::pull_records::VerificationPolicy as P;
        let off = crate::config::Config::defaults().unwrap().cri_server;
        let on = CriServerSettings { local_fallback_namespaces: vec!["shop".into()], ..off.clone() };
        let preloaded = VerifyPolicy::new(P::NeverVerifyPreloadedImages);
        let same = KubeletImageFields { file: "/var/lib/kubelet/config.yaml".into(), ..KubeletImageFields::default() };
        // Off: nothing to say, whatever the rest.
        assert!(fallback_warnings(&off, &preloaded, true, None).is_empty());
        // The kubelet's config given, its policy (absent: the default) the same, records on disk.
        assert!(fallback_warnings(&on, &preloaded, false, Some(&same)).is_empty());
        // Not given: imaged cannot tell.
        let w = fallback_warnings(&on, &preloaded, false, None);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("--kubelet-config") && w[0].contains("\"NeverVerifyPreloadedImages\""), "{w:?}");
        // Given, another policy: both named, and the file.
        let always = KubeletImageFields {
            image_pull_credentials_verification_policy: Some("AlwaysVerify".into()),
            ..same.clone()
        };
        let w = fallback_warnings(&on, &preloaded, false, Some(&always));
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("\"NeverVerifyPreloadedImages\"")
                && w[0].contains("is \"AlwaysVerify\"")
                && w[0].contains("/var/lib/kubelet/config.yaml"),
            "{w:?}"
        );
        // Records in memory: a restart makes every image preloaded.
        let w = fallback_warnings(&on, &preloaded, true, Some(&same));
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("state.dir"), "{w:?}");
        // ... which AlwaysVerify does not exempt (and the kubelet's is the same).
        let both_always = VerifyPolicy::new(P::AlwaysVerify);
        assert!(fallback_warnings(&on, &both_always, true, Some(&always)).is_empty());
    }

    #[test]
    fn an_answer_is_read_for_pins_only_when_a_pinned_name_can_be_in_it() {
        let sandbox = Pins::new(Vec::new(), "registry.k8s.io/pause:3.10", true);
        assert!(sandbox.may_pin(b"..registry.k8s.io/pause:3.10.."), "the sandbox image's name occurs");
        assert!(!sandbox.may_pin(b"..registry.k8s.io/pause:3.9.."), "it does not: nothing to read");
        assert!(!Pins::default().may_pin(b"anything"), "nothing pinned");
        let patterns = Pins::new(vec!["example.com/*".into()], "", false);
        assert!(patterns.may_pin(b""), "patterns are globs: always read");
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(std::string::ToString::to_string).collect()
    }

    #[test]
    fn the_sandbox_image_and_pinned_patterns_pin_by_tag_or_digest() {
        let pins = Pins::new(s(&["quay.io/team/*"]), "registry.k8s.io/pause:3.10", true);
        assert!(pins.pins(&s(&["registry.k8s.io/pause:3.10"]), &[]));
        assert!(!pins.pins(&s(&["registry.k8s.io/pause:3.9"]), &[]));
        assert!(pins.pins(&[], &s(&["quay.io/team/app@sha256:abcd"])));
        assert!(!pins.pins(&s(&["docker.io/library/nginx:1"]), &[]));
        let short = Pins::new(vec![], "pause:3.10", true);
        assert_eq!(short.sandbox_image.as_deref(), Some("docker.io/library/pause:3.10"));
        let off = Pins::new(vec![], "registry.k8s.io/pause:3.10", false);
        assert!(off.is_empty());
        assert!(!off.pins(&s(&["registry.k8s.io/pause:3.10"]), &[]));
    }

    fn pod(namespace: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> SandboxConfig {
        let map = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        SandboxConfig {
            namespace: namespace.into(),
            labels: map(labels),
            annotations: map(annotations),
            ..Default::default()
        }
    }

    fn priorities(toml: &str) -> Priorities {
        Priorities::new(&crate::config::Config::from_toml(toml).unwrap().cri_server)
    }

    #[test]
    fn by_default_kube_system_and_static_pods_go_first_and_api_pods_do_not() {
        let p = priorities("");
        assert_eq!(p.of(&pod("kube-system", &[], &[("kubernetes.io/config.source", "api")])), 1000);
        assert_eq!(p.of(&pod("default", &[], &[("kubernetes.io/config.source", "file")])), 1000);
        assert_eq!(p.of(&pod("monitoring", &[], &[("kubernetes.io/config.source", "http")])), 1000);
        assert_eq!(p.of(&pod("default", &[], &[("kubernetes.io/config.source", "api")])), 0);
        assert_eq!(p.of(&pod("default", &[], &[])), 0);
    }

    #[test]
    fn the_highest_matching_rule_wins_and_every_matcher_of_a_rule_must_match() {
        let p = priorities(
            r#"
            [cri_server]
            priority_namespaces = ["ops"]
            [[cri_server.priority]]
            namespace = "team-a"
            priority = 10
            [[cri_server.priority]]
            namespace = "team-a"
            label = "tier=frontend"
            priority = 50
            [[cri_server.priority]]
            annotation = "example.com/urgent="
            priority = 2000
            [[cri_server.priority]]
            label = "batch=true"
            priority = -5
            "#,
        );
        assert_eq!(p.of(&pod("team-a", &[], &[])), 10);
        assert_eq!(p.of(&pod("team-a", &[("tier", "frontend")], &[])), 50, "both matchers match: 50 > 10");
        assert_eq!(p.of(&pod("team-b", &[("tier", "frontend")], &[])), 0, "the namespace does not match");
        assert_eq!(p.of(&pod("team-a", &[("tier", "backend")], &[])), 10);
        assert_eq!(p.of(&pod("ops", &[], &[])), 1000, "priority_namespaces still work");
        assert_eq!(p.of(&pod("ops", &[], &[("example.com/urgent", "")])), 2000, "an empty value matches");
        assert_eq!(p.of(&pod("x", &[], &[("example.com/urgent", "no")])), 0);
        assert_eq!(p.of(&pod("x", &[("batch", "true")], &[])), -5, "a rule may put pods last");
        assert_eq!(p.of(&pod("team-a", &[("batch", "true")], &[])), 10, "the highest wins");
        // The list replaces the default rules: static pods are not first any more.
        assert_eq!(p.of(&pod("default", &[], &[("kubernetes.io/config.source", "file")])), 0);
        assert_eq!(p.of(&pod("kube-system", &[], &[])), 0, "priority_namespaces replaced too");
    }

    #[test]
    fn a_bad_rule_is_refused_naming_its_field() {
        let err = |rule: &str| {
            crate::config::Config::from_toml(&format!("[[cri_server.priority]]\n{rule}")).unwrap_err().to_string()
        };
        let e = err("priority = 5");
        assert!(e.contains("cri_server.priority[0]") && e.contains("at least one of namespace"), "{e}");
        let e = err("label = \"tier\"\npriority = 5");
        assert!(e.contains("cri_server.priority[0].label") && e.contains("key=value"), "{e}");
        let e = err("annotation = \"=x\"\npriority = 5");
        assert!(e.contains("cri_server.priority[0].annotation"), "{e}");
        let e = err("namespace = \"a b\"\npriority = 5");
        assert!(e.contains("cri_server.priority[0].namespace"), "{e}");
        let e = err("namespace = \"a\"\npriority = 9999999999");
        assert!(e.contains("cri_server.priority[0].priority"), "{e}");
        let e = err("namespace = \"a\"\npriority = 1\nclass = \"x\"");
        assert!(e.contains("class"), "unknown matcher refused: {e}");
    }

    #[test]
    fn a_pull_of_a_name_that_does_not_parse_records_nothing() {
        let records = PullRecords::in_memory(crate::pull_records::VerifyPolicy::default());
        let call = |image: &str| PullCall {
            image: ImageSpec::new(image),
            auth: Some(AuthConfig::basic("", "team", "pw")),
            sandbox: None,
            deadline: None,
            wire: Bytes::new(),
        };
        let kept = FrontRecord::of(&records, &call("registry.example.com/team/app:1")).expect("recorded");
        assert_eq!(kept.image, "registry.example.com/team/app:1");
        assert_eq!(kept.proves, front_proves(Some(&AuthConfig::basic("", "team", "pw"))));
        for odd in ["https://team:pw@registry.example.com/team/app:1", "UPPER/Case:1", "a b"] {
            assert!(FrontRecord::of(&records, &call(odd)).is_none(), "{odd}");
        }
    }

    #[test]
    fn a_front_pull_proves_its_credential_by_hash_only_and_an_anonymous_one_proves_every_pod() {
        use crate::pull_records::{PodCredentials, match_credentials};
        assert_eq!(front_proves(None), ImagePullCredentials::node_accessible());
        let empty = AuthConfig { server_address: "registry.example.com".into(), ..AuthConfig::default() };
        assert_eq!(front_proves(Some(&empty)), ImagePullCredentials::node_accessible(), "no credential in it");
        let basic = front_proves(Some(&AuthConfig::basic("", "team", "pw")));
        let encoded = AuthConfig { auth: crate::domain::Secret::new("dGVhbTpwdw=="), ..AuthConfig::default() };
        assert_eq!(front_proves(Some(&encoded)), basic, "`auth` is the same user and password");
        let token = AuthConfig { registry_token: crate::domain::Secret::new("t"), ..AuthConfig::default() };
        assert!(front_proves(Some(&token)).is_empty(), "a token proves nothing: every pod must pull");
        // What the runtime pulls with, in containerd's order: the user name
        // before `auth`, an identity token before `auth`.
        let both =
            AuthConfig { auth: crate::domain::Secret::new("b3RoZXI6eA=="), ..AuthConfig::basic("", "team", "pw") };
        assert_eq!(front_proves(Some(&both)), basic, "the user name wins over `auth`");
        let identity = AuthConfig { identity_token: crate::domain::Secret::new("t"), ..encoded.clone() };
        assert!(front_proves(Some(&identity)).is_empty(), "the identity token is sent, not `auth`");
        let hash = crate::credentials::Credential::new("team", "pw", "").auth_config_hash();
        let entry = &basic.kubernetes_secrets[0];
        assert_eq!((entry.namespace.as_str(), entry.name.as_str()), ("", ""), "no secret is named");
        assert_eq!(entry.credential_hash, hash);
        let pod = |hash: &str, ns: &str, name: &str| PodCredentials {
            secrets: vec![ImagePullSecret {
                uid: entry.uid.clone(),
                namespace: ns.into(),
                name: name.into(),
                credential_hash: hash.into(),
            }],
            service_account: None,
        };
        assert!(!match_credentials(&basic, &pod(&hash, "shop", "regcred")).must_pull, "the same credential");
        assert!(match_credentials(&basic, &pod("other", "shop", "regcred")).must_pull, "another credential");
        // Coordinates match only when they name a secret: a pod's secret
        // without them is not taken for the front's entry.
        assert!(match_credentials(&basic, &pod("other", "", "")).must_pull, "no coordinates to match");
    }

    #[test]
    fn an_outage_refusal_starts_with_registry_unavailable_once() {
        let e = registry_unavailable("dial tcp 10.0.0.1:443: i/o timeout");
        assert_eq!(e.code(), crate::cri::StatusCode::Unknown);
        assert_eq!(e.message(), "RegistryUnavailable: dial tcp 10.0.0.1:443: i/o timeout");
        assert_eq!(registry_unavailable("RegistryUnavailable: down").message(), "RegistryUnavailable: down");
    }

    #[test]
    fn runtime_errors_keep_their_code_and_imageds_own_get_a_fitting_one() {
        let nf = CriError::from_status(crate::cri::StatusCode::NotFound, "not found: x");
        assert_eq!(pull_error(PullFailure::Cri(vec![nf.clone()])), nf);
        assert_eq!(pull_error(PullFailure::QpsExceeded).kind(), CriErrorKind::ResourceExhausted);
        assert_eq!(
            pull_error(PullFailure::DeadlineExceeded(Duration::from_secs(1))).code(),
            crate::cri::StatusCode::DeadlineExceeded
        );
        assert_eq!(pull_error(PullFailure::Stopped).code(), crate::cri::StatusCode::Unavailable);
    }
}
