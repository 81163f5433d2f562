//! Verified access to cached private images (KEP-2535, the kubelet's
//! `pullmanager`; reference §8).
//!
//! Before a pull imaged records a *pull intent* for the image; after a
//! successful pull it records, in the image's *pulled record* (keyed by
//! image ref), which credentials pulled it, per normalised repository: a
//! pull secret (coordinates and credential hash), a service account, or
//! "every pod on the node" for pulls without credentials or with node
//! credentials. When a pod asks for a present image, [`PullRecords::must_attempt_pull`]
//! decides, by the [`VerificationPolicy`] and the records, whether the pod
//! may use it as is or must pull it with its own credentials (the runtime
//! then checks them with the registry).
//!
//! [`PullRecords`] is a cloneable handle (no actor): the ensure flow calls
//! it on the caller's task. It keeps every record and intent in memory
//! (the hot path — a present image — reads memory only, and with
//! `NeverVerify` touches nothing) and writes through to the [`Store`]
//! (`pull_intents_v1`, `pulled_records_v1`), one transaction per change
//! (the intents waiting together share one: see
//! [`PullRecords::record_pull_intent`]), on the blocking pool. Writes are
//! serialised by an async mutex, so read-merge-write is atomic; the end of
//! a pull, and a record's deletion, is written to its end even if its
//! caller goes away. Without a
//! store the state lives in memory only.
//!
//! # Unsynced
//!
//! Every write is synced before it returns (on disk, a crash keeps it)
//! but one: the record of a pull whose credential proves that every pod
//! may use the image (no credential, or the node's own: the kubelet's
//! `nodePodsAccessible`), which ends the pull's intent in the same write.
//! It is written unsynced ([`Store::apply_pull_records_unsynced`]) and
//! reaches the disk with the next synced write — the next pull's intent,
//! the next detection that records an image, [`PullRecords::sync`] at a
//! graceful stop. A crash before loses it and leaves the intent, which is
//! always synced before the pull starts, and the image's record as it was
//! (or none): the next start recovers the intent (a record without
//! credentials when there was none), so the image counts as pulled by
//! imaged and a pod may use it only as that record allows, otherwise it
//! pulls: the loss can only make pods pull again, never give one an image.
//! In exchange the pull waits for one sync instead of two (the kubelet
//! does not sync its files at all).
//!
//! # Kept intents
//!
//! The kubelet deletes a pull's intent when it writes the pull's record.
//! Here the last pull in flight of a name leaves its intent on disk (its
//! record write no longer deletes it) and memory keeps it apart
//! from open intents: in this process it counts for nothing (the record
//! decides, as in the kubelet), but the name's next pull finds its intent
//! on disk and starts without a synced write. Names are pulled again
//! often: every `Always` pod's start, a pod that must show its
//! credentials, an image GC or an operator removed. A kept intent outlives
//! its image's removal ([`PullRecords::prune_unknown_records`],
//! [`PullRecords::forget_removed_image`] delete the record and leave the
//! intent) while no more than [`KEPT_INTENTS`] intents are on disk; past
//! that, a removal deletes its image's with its record. Every kept
//! intent is deleted at a graceful stop ([`PullRecords::sync`]), so a
//! restart after one finds
//! only the intents of pulls that may still run, as before; memory lets
//! it go before the deletion's commit, so a deletion dropped or failed
//! halfway costs the name's next pull its write, never its intent. A
//! crash leaves kept intents on disk, and the next start cannot tell them
//! from a pull that was running (the skipped write is the point): it
//! recovers them as any. A name whose image is the one imaged pulled
//! changes nothing (its entry is there). Otherwise the change is the one
//! a crash mid-pull always made, now for every name with a kept intent:
//! the image's record gets a hollow entry (no pod shown) under the name's
//! repository, and a name whose image is gone keeps an intent, counting
//! as pulled by imaged until its next pull ends, across restarts (such
//! intents count against [`KEPT_INTENTS`], so crashes do not pile them
//! up). Pods pull more, never less.
//!
//! At start, [`PullRecords::open`] loads the store, and
//! [`PullRecords::recover_intents`] turns intents left by a crash into
//! entries *without credentials* (hollow, under the intent's repository)
//! in the records of images the runtime has (every pod must then pull to
//! use them under that name); intents for absent images stay, so the images
//! still count as pulled by imaged. After each image GC run the GC executor
//! calls [`PullRecords::prune_unknown_records`] with the time the run
//! started, read from [`PullRecords::clock`]: records are stamped with that
//! clock and `GcService` runs detection and GC on it, so the comparison is
//! on one clock.
//!
//! Files: here the handle and the pull path (intents, records, the must-pull
//! check); `housekeeping.rs` recovery and pruning; `decide.rs` the decision
//! table; `policy.rs` the verification policy.

mod decide;
mod housekeeping;
mod policy;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

pub use decide::{Decision, PodCredentials, RecordLookup, Step, decide, decide_without_credentials, match_credentials};
pub use policy::{Allowlist, AllowlistError, UnknownPolicy, VerificationPolicy, VerifyPolicy};

/// How one pull ended, for its KEP-2535 records ([`PullRecords::end_pull`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullEnd {
    /// It pulled the image.
    Pulled {
        /// The pulled image's id.
        image_ref: String,
        /// What the credential it pulled with proves.
        credentials: ImagePullCredentials,
    },
    /// The runtime may have pulled the image or may still (its reply was
    /// lost, its queue stopped): the intent stays.
    Unknown,
    /// It failed, or found the image present: the intent ends.
    Ended,
}

impl PullEnd {
    /// Whether this end's write is the one left unsynced (see "Unsynced"
    /// above): a record that lets every pod use the image. Losing it can
    /// only make pods pull again, so it may be written behind the answer
    /// ([`PullRecords::end_pull_behind`]); every other end is on disk
    /// before an ensure is answered.
    pub fn lets_every_pod(&self) -> bool {
        matches!(self, Self::Pulled { credentials, .. } if credentials.node_pods_accessible)
    }
}

use crate::clock::Clock;
use crate::domain::pull_record::{ImagePullCredentials, MustPullResult, PulledRecord, merge_pulled};
use crate::domain::reference::parse_normalized_named;
use crate::metrics::Metrics;
use crate::store::{PullRecordsWrite, Store, StoreError};

/// What is in memory (a mirror of the store).
#[derive(Debug, Default)]
struct State {
    /// Pulled records by image ref.
    records: HashMap<String, Arc<PulledRecord>>,
    /// Image refs whose stored record does not decode.
    unreadable: HashSet<String>,
    /// Pulls in flight in this process, by image key.
    in_flight: HashMap<String, u32>,
    /// Images with an intent in the store (this process's, or left by a crash).
    stored_intents: HashSet<String>,
    /// Intents left on disk after their pulls ended with a record (image
    /// key → the image ref recorded): see "Kept intents" above. Not in
    /// `stored_intents`: they grant and refuse nothing in this process.
    kept: HashMap<String, String>,
    /// How many kept intents may outlive their images (tests set it; by
    /// default [`KEPT_INTENTS`]).
    kept_bound: Option<usize>,
    /// Images a pull of which ended with its outcome unknown (the runtime
    /// may have finished it, or may still): their intents stay on disk
    /// for the rest of this process, as a crash would leave them.
    unknown: HashSet<String>,
    /// Image refs whose record is being written (committed, or about to
    /// be, and not yet in `records`): [`PullRecords::image_refs`] counts
    /// them, or a GC run that began meanwhile would not know the record,
    /// leave its image out of what it keeps, and prune the record it
    /// stamped before the run began (found by the simulator with a disk
    /// that takes its time, seed 5570 of the current shape).
    writing: HashSet<String>,
    /// Image refs owed a record by pulls that have ended and whose record
    /// is being written ([`PullRecords::end_pull`]), with how many: a
    /// must-pull check of the image, by any name, waits for them
    /// ([`OWED_RECORD_WAIT`]).
    owed: HashMap<String, u32>,
}

impl State {
    /// Whether imaged pulled the image `image_ref` under this name
    /// (`image_key`, normalised repository `repo`): a pull of the name is in
    /// flight, left an intent or ended with its outcome unknown, or the
    /// image's record is unreadable, has no mapping at all (written before
    /// recovered intents named their repository: which names is not
    /// known), or has one for this
    /// repository (a hollow one too: recovered, or a pull that proved
    /// nothing).
    ///
    /// The kubelet (1.35, 1.36) asks only whether *a* record exists for the
    /// image id, so a pull of the same image under another repository (the
    /// same content digest) takes the preloaded standing from a name imaged
    /// never pulled (kubernetes/kubernetes#138175): a pod that used the
    /// preloaded name with `Never` and no secret is then refused. Here a
    /// name keeps its standing until imaged pulls that name itself. The
    /// runtime resolved the name to this image, so the name is on the node;
    /// and it is in no record or intent, so it was put there outside imaged.
    fn pulled_by_kubelet(&self, image_ref: &str, image_key: &str, repo: Option<&str>) -> bool {
        if self.unreadable.contains(image_ref)
            || self.in_flight.get(image_key).is_some_and(|n| *n > 0)
            || self.stored_intents.contains(image_key)
            || self.unknown.contains(image_key)
        {
            return true;
        }
        self.records.get(image_ref).is_some_and(|r| {
            r.credential_mapping.is_empty() || repo.is_none_or(|repo| r.credential_mapping.contains_key(repo))
        })
    }
}

struct Inner {
    policy: VerifyPolicy,
    store: Option<Arc<Store>>,
    /// Stamps records' `last_updated_time`; shared with GC (see [`PullRecords::clock`]).
    clock: Clock,
    state: Mutex<State>,
    /// Serialises writers: read-merge-write and the store write are one step.
    writes: tokio::sync::Mutex<()>,
    /// Image → (repository, intent key): pods name the same images over and
    /// over and parsing is the costliest step of a present-image check.
    /// Bounded; cleared when full.
    names: Mutex<HashMap<String, Arc<ImageNames>>>,
    /// Told when a pull in flight ends (its record written, or its intent
    /// ended): see [`PullRecords::pulls_ended`].
    pull_ended: tokio::sync::Notify,
    /// Keys of intents waiting for the write lock, one entry per request
    /// (the group commit of [`PullRecords::record_pull_intent`]).
    waiting_intents: Mutex<Vec<String>>,
    /// Pull ends being written behind their answers
    /// ([`PullRecords::end_pull_behind`]).
    behind: Arc<crate::settle::Pending>,
}

/// Up to how many intents on disk kept intents outlive their images'
/// removal (see "Kept intents"): while no more than this many intents are
/// on disk (kept ones, present images' included, and open ones), a
/// removal (the kubelet's, through the CRI front, or a GC run's prune)
/// deletes the image's record and leaves the intents of its names, so a
/// name pulled again after its image was removed starts without a synced
/// write (~0.4 ms of a ~7 ms pull through the front on the CI machine).
/// Past it, a removal deletes the kept intents of its image (a prune:
/// of every absent image) with the records. About 200 bytes each in
/// memory.
pub const KEPT_INTENTS: usize = 1024;

/// How long a graceful stop's [`PullRecords::sync`] waits for the pull ends
/// still being written behind their answers (each is one store write).
const BEHIND_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a must-pull check of an image waits for the records owed to it
/// by pulls that have ended ([`PullRecords::end_pull`], written before an
/// ensure's answer or behind it, [`PullRecords::end_pull_behind`]; one
/// store write each). Intents and in-flight counts are keyed by name, so
/// without the wait a pod asking meanwhile for the image by another name of
/// its repository (another tag, its digest) found no record of that
/// repository and, under `NeverVerifyPreloadedImages`, took an image pulled
/// with a secret as preloaded (under `AlwaysVerify`, pulled it again). What
/// is left is the kubelet's own window: from the runtime showing the image
/// to its `PullImage` returning. After the wait (a stalled disk) the check
/// decides as it did.
const OWED_RECORD_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// One record owed to an image ref ([`State::owed`]) until dropped:
/// written, or its write given up.
struct OwedRecord {
    inner: Arc<Inner>,
    image_ref: String,
}

impl OwedRecord {
    fn new(inner: &Arc<Inner>, image_ref: &str) -> Self {
        let mut st = inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *st.owed.entry(image_ref.to_string()).or_default() += 1;
        drop(st);
        Self { inner: inner.clone(), image_ref: image_ref.to_string() }
    }
}

impl Drop for OwedRecord {
    fn drop(&mut self) {
        {
            let mut st = self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(n) = st.owed.get_mut(&self.image_ref) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    st.owed.remove(&self.image_ref);
                }
            }
        }
        self.inner.pull_ended.notify_waiters();
    }
}

/// Runs `work` — the end of a pull (`ends`: its image key), or a
/// deletion — to its end even when its caller stops waiting (an ensure
/// dropped while its pull's end is written). Dropped halfway, the commit
/// would still land (the blocking pool runs it to its end) while memory
/// kept the intent as stored, and the image's next intent would not be
/// written: a pull with no intent on disk. So a caller that has begun
/// ending a pull may disarm its `IntentGuard` before it waits. `None` if
/// `work` panicked (in a build that unwinds: tests, an embedder's; the
/// daemon aborts on any panic): the pull it ends then ends as one whose
/// outcome is unknown, in the same task, or every must-pull check of the
/// image would wait for it in vain (`PULL_END_WAIT`); its intent is
/// written again, as the panic may have come after a commit that
/// deleted it. Under the simulator too (writes inline), as `work`
/// may first wait for the write lock; a process the simulator kills
/// meanwhile has its store fenced first, so what `work` writes after is
/// refused.
async fn to_the_end<T: Send + 'static>(
    records: &PullRecords,
    ends: Option<String>,
    work: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    use futures_util::FutureExt as _;
    let this = records.clone();
    let task = async move {
        match std::panic::AssertUnwindSafe(work).catch_unwind().await {
            Ok(done) => Some(done),
            Err(_) => {
                if let Some(key) = ends {
                    let _w = this.inner.writes.lock().await;
                    this.rewrite_intent(&key).await;
                    this.ended_keeping_intent(&key);
                }
                None
            }
        }
    };
    tokio::spawn(task).await.ok().flatten()
}

/// Locks `m`, poisoned or not (what it guards stays consistent: every
/// change under it is a single step).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A request's intent in [`Inner::waiting_intents`] while it waits for the
/// write lock; taken out when it gets the lock or gives up waiting (then
/// no later commit writes an intent for a pull that never starts), unless
/// a commit already took it.
struct WaitingIntent<'a> {
    inner: &'a Inner,
    key: &'a str,
}

impl<'a> WaitingIntent<'a> {
    fn new(inner: &'a Inner, key: &'a str) -> Self {
        lock(&inner.waiting_intents).push(key.to_string());
        Self { inner, key }
    }
}

impl Drop for WaitingIntent<'_> {
    fn drop(&mut self) {
        let mut waiting = lock(&self.inner.waiting_intents);
        if let Some(i) = waiting.iter().position(|k| k == self.key) {
            waiting.swap_remove(i);
        }
    }
}

/// An image ref in [`State::writing`] while its record's write runs;
/// taken out when the write ends, whichever way.
struct Writing<'a> {
    records: &'a PullRecords,
    image_ref: &'a str,
}

impl<'a> Writing<'a> {
    fn new(records: &'a PullRecords, image_ref: &'a str) -> Self {
        records.state().writing.insert(image_ref.to_string());
        Self { records, image_ref }
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.records.state().writing.remove(self.image_ref);
    }
}

/// A must-pull check's answer, not yet counted (see
/// [`PullRecords::must_attempt_pull_uncounted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MustPullCheck {
    /// The pod must pull the image (show its credentials to the registry).
    pub must_pull: bool,
    /// The metric's result label; `None`: not counted (no image ref).
    pub result: Option<MustPullResult>,
}

/// What [`PullRecords::write_pulled`] writes.
#[derive(Debug)]
struct PulledWrite {
    image_ref: String,
    /// The normalised repository the credentials are recorded under.
    repo: String,
    creds: ImagePullCredentials,
    /// The image key of the pull this ends, if it ends one.
    intent: Option<String>,
    /// When the record's time becomes now though the merge changed nothing.
    refresh: Refresh,
}

/// When [`PullRecords::write_pulled`] refreshes a record the merge left
/// unchanged.
#[derive(Debug, Clone, Copy)]
enum Refresh {
    /// Never (a must-pull check's secret, not a pull).
    No,
    /// Always: a pull (see [`PullRecords::record_image_pulled`]).
    Always,
    /// Unless it was refreshed at or after this time (the pull's start).
    UnlessSince(std::time::SystemTime),
}

/// An image's normalised repository (`None` if it does not parse) and its
/// intent key.
#[derive(Debug)]
struct ImageNames {
    repo: Option<String>,
    key: String,
}

/// Most remembered [`ImageNames`].
const NAMES_CACHE: usize = 4096;

/// The pull records handle. Cheap to clone. See the module docs.
#[derive(Clone)]
pub struct PullRecords {
    inner: Arc<Inner>,
    /// Where must-pull check results are counted.
    metrics: Metrics,
}

impl std::fmt::Debug for PullRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullRecords")
            .field("policy", &self.inner.policy.policy)
            .field("persistent", &self.inner.store.is_some())
            .finish_non_exhaustive()
    }
}

/// The key of an image in intents: its normalised reference
/// (`busybox` → `docker.io/library/busybox:latest`), or the text as given
/// when it does not parse.
pub fn image_key(image: &str) -> String {
    parse_normalized_named(image).map_or_else(|_| image.to_string(), |n| n.docker_ref())
}

/// The key of an image's credentials in a record: its normalised
/// repository (`docker.io/library/busybox`), `None` when it does not parse.
pub fn image_repo(image: &str) -> Option<String> {
    parse_normalized_named(image).ok().map(|n| n.name())
}

impl PullRecords {
    /// Records kept in memory only (lost on restart), under `policy`.
    pub fn in_memory(policy: VerifyPolicy) -> Self {
        Self::with_state(policy, None, State::default())
    }

    /// Loads the records and intents from `store` (or starts empty in
    /// memory when `None`). Blocks on disk I/O: call it at start-up or from
    /// `spawn_blocking`.
    pub fn open(policy: VerifyPolicy, store: Option<Arc<Store>>) -> Result<Self, StoreError> {
        let mut state = State::default();
        if let Some(store) = &store {
            let loaded = store.pull_records_state()?;
            state.records = loaded.records.into_iter().map(|r| (r.image_ref.clone(), Arc::new(r))).collect();
            state.unreadable = loaded.unreadable.into_iter().collect();
            state.stored_intents = loaded.intents.into_iter().collect();
        }
        Ok(Self::with_state(policy, store, state))
    }

    fn with_state(policy: VerifyPolicy, store: Option<Arc<Store>>, state: State) -> Self {
        Self {
            metrics: Metrics::default(),
            inner: Arc::new(Inner {
                policy,
                store,
                clock: Clock::new(),
                state: Mutex::new(state),
                writes: tokio::sync::Mutex::new(()),
                names: Mutex::default(),
                pull_ended: tokio::sync::Notify::new(),
                behind: Arc::default(),
                waiting_intents: Mutex::default(),
            }),
        }
    }

    /// These records stamped with `clock` instead of one starting at the
    /// system time now: the simulator's, whose wall-clock time goes on
    /// across a simulated restart. Call it before cloning the handle (the
    /// clones made before keep their clock).
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.clock = clock,
            None => tracing::warn!("pull records already shared: the new clock is ignored"),
        }
        self
    }

    /// The verification policy.
    pub fn policy(&self) -> &VerifyPolicy {
        &self.inner.policy
    }

    /// The clock records are stamped with (`last_updated_time`). A GC that
    /// prunes these records must read the start of its run from this clock
    /// (`GcService::start` runs its actors on it).
    pub fn clock(&self) -> Clock {
        self.inner.clock.clone()
    }

    /// This handle (and the clones made from it from now on) counting each
    /// must-pull check in `metrics`
    /// (`imaged_imagemanager_image_mustpull_checks_total{result}`); by
    /// default a private registry nobody scrapes.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The record of `image_ref`, if any.
    pub fn record(&self, image_ref: &str) -> Option<PulledRecord> {
        self.state().records.get(image_ref).map(|r| (**r).clone())
    }

    /// Every record, in no particular order.
    pub fn records(&self) -> Vec<PulledRecord> {
        self.state().records.values().map(|r| (**r).clone()).collect()
    }

    /// The image refs of every record, readable or not: what
    /// [`PullRecords::prune_unknown_records`] may delete.
    pub fn image_refs(&self) -> HashSet<String> {
        let st = self.state();
        st.records.keys().chain(&st.unreadable).chain(&st.writing).cloned().collect()
    }

    /// Images (keys, see [`image_key`]) with a pull intent in the store.
    pub fn stored_intents(&self) -> Vec<String> {
        let mut v: Vec<String> = self.state().stored_intents.iter().cloned().collect();
        v.sort();
        v
    }

    /// Images (keys) whose intents stay on disk after their pulls ended
    /// with a record (see "Kept intents" in the module's documentation).
    pub fn kept_intents(&self) -> Vec<String> {
        let mut v: Vec<String> = self.state().kept.keys().cloned().collect();
        v.sort();
        v
    }

    /// Whether more intents are on disk than may outlive their images
    /// ([`KEPT_INTENTS`]): then a removal deletes its image's kept intents
    /// with its record. Counted: every kept intent (present images' too)
    /// and every open one, among them those a crash left for names whose
    /// images are gone, which stay until their names' next pulls: so
    /// crashes cannot pile up kept intents of removed images past the
    /// bound.
    fn kept_past_bound(&self) -> bool {
        let st = self.state();
        st.kept.len() + st.stored_intents.len() > st.kept_bound.unwrap_or(KEPT_INTENTS)
    }

    /// At most `bound` kept intents outlive their images (tests).
    #[cfg(test)]
    fn bound_kept_intents(&self, bound: usize) {
        self.state().kept_bound = Some(bound);
    }

    /// Takes out of memory the kept intents whose image refs `doomed`
    /// names, for a commit that deletes them. Before the commit: one
    /// dropped or failed after it wrote costs their names' next pulls a
    /// write, never their intents (memory would otherwise claim intents
    /// the disk no longer has). Under the write lock.
    fn take_kept(&self, doomed: impl Fn(&str) -> bool) -> Vec<String> {
        let mut st = self.state();
        let keys: Vec<String> = st.kept.iter().filter(|(_, r)| doomed(r)).map(|(k, _)| k.clone()).collect();
        for k in &keys {
            st.kept.remove(k);
        }
        keys
    }

    /// Keys of intents waiting for the write lock (tests).
    #[cfg(test)]
    fn pull_records_waiting(&self) -> Vec<String> {
        lock(&self.inner.waiting_intents).clone()
    }

    fn names(&self, image: &str) -> Arc<ImageNames> {
        let mut cache = self.inner.names.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = cache.get(image) {
            return n.clone();
        }
        let names = Arc::new(match parse_normalized_named(image) {
            Ok(n) => ImageNames { repo: Some(n.name()), key: n.docker_ref() },
            Err(_) => ImageNames { repo: None, key: image.to_string() },
        });
        if cache.len() >= NAMES_CACHE {
            cache.clear();
        }
        cache.insert(image.to_string(), names.clone());
        names
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The kubelet's `MustAttemptImagePull` for a pod asking for `image`
    /// (as the pod names it, tag defaulted), present as `image_ref`.
    /// `pod_credentials` is called only when the record names secrets or
    /// service accounts. An error from it is returned (the pod must pull).
    ///
    /// With `NeverVerify` this reads nothing. Otherwise it reads memory, and
    /// writes only when the pod's secret matched under new coordinates or
    /// with a new hash (the kubelet's "write while matching").
    pub async fn must_attempt_pull<E>(
        &self,
        image: &str,
        image_ref: &str,
        pod_credentials: impl FnOnce() -> Result<PodCredentials, E>,
    ) -> Result<bool, E> {
        self.must_attempt_pull_with(image, image_ref, || std::future::ready(pod_credentials())).await
    }

    /// [`PullRecords::must_attempt_pull`] with credentials that take a
    /// lookup to know (a token plugin may have to run): awaited only when
    /// the record names secrets or service accounts.
    pub async fn must_attempt_pull_with<E, F, Fut>(
        &self,
        image: &str,
        image_ref: &str,
        pod_credentials: F,
    ) -> Result<bool, E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<PodCredentials, E>>,
    {
        let check = self.must_attempt_pull_uncounted(image, image_ref, pod_credentials).await?;
        self.count(check);
        Ok(check.must_pull)
    }

    /// [`PullRecords::must_attempt_pull_with`] without counting the check in
    /// `imaged_imagemanager_image_mustpull_checks_total` (an error is
    /// counted: it is the check's end): a caller that may look again (a
    /// record a commit away) counts only the answer it acts on, with
    /// [`PullRecords::count`], so one pod's check is one in the metric.
    pub async fn must_attempt_pull_uncounted<E, F, Fut>(
        &self,
        image: &str,
        image_ref: &str,
        pod_credentials: F,
    ) -> Result<MustPullCheck, E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<PodCredentials, E>>,
    {
        // As the kubelet: no image ref means the image must be pulled, under
        // every policy, and this return is not counted in the metric.
        if image_ref.is_empty() {
            return Ok(MustPullCheck { must_pull: true, result: None });
        }
        if self.inner.policy.policy == VerificationPolicy::NeverVerify {
            return Ok(MustPullCheck { must_pull: false, result: Some(MustPullResult::CredentialPolicyAllowed) });
        }
        let names = self.names(image);
        let repo = &names.repo;
        let look = || {
            let st = self.state();
            let record = st.records.get(image_ref).cloned();
            let pulled_by_kubelet = st.pulled_by_kubelet(image_ref, &names.key, repo.as_deref());
            (record, st.unreadable.contains(image_ref), pulled_by_kubelet, st.owed.contains_key(image_ref))
        };
        let (mut record, mut unreadable, mut pulled_by_kubelet, owed) = look();
        if owed {
            // A pull of the image just ended: its record (maybe the first
            // under this name's repository) decides once written.
            let owed = || self.state().owed.contains_key(image_ref);
            crate::settle::settled(&self.inner.pull_ended, OWED_RECORD_WAIT, owed).await;
            (record, unreadable, pulled_by_kubelet, _) = look();
        }
        let lookup = match (&record, unreadable) {
            (Some(r), _) => RecordLookup::Found(r),
            (None, true) => RecordLookup::Unreadable,
            (None, false) => RecordLookup::Absent,
        };
        let decision = match decide_without_credentials(&self.inner.policy, repo.as_deref(), lookup, pulled_by_kubelet)
        {
            Step::Done(d) => d,
            Step::Match(cached) => match pod_credentials().await {
                Ok(pod) => match_credentials(cached, &pod),
                Err(e) => {
                    self.metrics.mustpull_check(MustPullResult::Error);
                    return Err(e);
                }
            },
        };
        if let (Some(repo), false) = (repo, decision.record_secrets.is_empty()) {
            let creds = ImagePullCredentials { kubernetes_secrets: decision.record_secrets, ..Default::default() };
            let w = PulledWrite {
                image_ref: image_ref.to_string(),
                repo: repo.clone(),
                creds,
                intent: None,
                refresh: Refresh::No,
            };
            if let Err(e) = self.write_pulled(w).await {
                tracing::warn!(image, image_ref, error = %e, "failed to record a matching pull secret");
            }
        }
        Ok(MustPullCheck { must_pull: decision.must_pull, result: Some(decision.result) })
    }

    /// Counts `check` in `imaged_imagemanager_image_mustpull_checks_total`
    /// (nothing for one the kubelet does not count).
    pub fn count(&self, check: MustPullCheck) {
        if let Some(result) = check.result {
            self.metrics.mustpull_check(result);
        }
    }

    /// The kubelet's `RecordPullIntent`: a pull of `image` is about to start.
    /// The intent is on disk when this returns `Ok`.
    ///
    /// Group commit: intents wait for the write lock in
    /// [`Inner::waiting_intents`], and whoever takes the lock to write one
    /// writes every intent waiting then, in one synced commit; the others
    /// find theirs stored when their turn comes. A burst of pulls then
    /// pays a sync or two, not one each in turn (the kubelet writes a file
    /// per intent). Each request still counts its own pull in flight under
    /// the lock, after checking that its intent is stored: one deleted
    /// meanwhile (another pull of the image ended as the last) is written
    /// again.
    pub async fn record_pull_intent(&self, image: &str) -> Result<(), StoreError> {
        // Parsed once per name (`names`): this runs before every pull.
        let key = self.names(image).key.clone();
        {
            // Kept on disk by an earlier pull of the name, with none in
            // flight: opened again under the state lock alone. Whatever
            // deletes a kept intent takes it out of `kept` under this lock
            // before its commit (`take_kept`), so one found here is on disk.
            // And no pull's end runs for it (each end follows its own
            // `begin_pull`, which took it out of `kept`): none can undo the
            // count taken here.
            let mut st = self.state();
            if st.kept.remove(&key).is_some() {
                st.stored_intents.insert(key.clone());
                *st.in_flight.entry(key).or_default() += 1;
                return Ok(());
            }
        }
        let waiting = WaitingIntent::new(&self.inner, &key);
        let _w = self.inner.writes.lock().await;
        drop(waiting);
        let stored = {
            let mut st = self.state();
            // Kept meanwhile (a pull of the name ended while this waited):
            // open again.
            if st.kept.remove(&key).is_some() {
                st.stored_intents.insert(key.clone());
            }
            st.stored_intents.contains(&key)
        };
        if !stored {
            let mut keys: Vec<String> = {
                let waiting = std::mem::take(&mut *lock(&self.inner.waiting_intents));
                let st = self.state();
                let on_disk = |k: &String| st.stored_intents.contains(k) || st.kept.contains_key(k);
                waiting.into_iter().filter(|k| *k != key && !on_disk(k)).collect()
            };
            keys.sort_unstable();
            keys.dedup();
            keys.push(key.clone());
            self.commit(PullRecordsWrite { put_intents: keys.clone(), ..Default::default() }).await?;
            self.state().stored_intents.extend(keys);
        }
        *self.state().in_flight.entry(key).or_default() += 1;
        Ok(())
    }

    /// [`PullRecords::record_pull_intent`], returning a guard that ends the
    /// pull (as one whose outcome is unknown, see
    /// [`PullRecords::record_image_pull_unknown`]) if it is dropped before
    /// [`IntentGuard::disarm`]: an ensure whose caller gave up mid-pull does
    /// not stay counted as in flight, and its intent stays on disk.
    pub async fn begin_pull(&self, image: &str) -> Result<IntentGuard, StoreError> {
        self.record_pull_intent(image).await?;
        Ok(IntentGuard { records: Some(self.clone()), image: image.to_string() })
    }

    /// The kubelet's `RecordImagePulled`: the pull of `image` (as the pod
    /// names it) produced `image_ref` using `creds`. Merges the credentials
    /// into the record and ends the intent, in one transaction. When the
    /// write fails the intent is kept (the image stays "pulled by imaged").
    ///
    /// Unlike the kubelet, which updates `last_updated_time` only when the
    /// merge changed the record, every successful pull refreshes it (and
    /// writes the record): an image removed while its record stayed and
    /// pulled again (same id, same credentials) during a GC run would
    /// otherwise keep its old time and be pruned by that run, leaving the
    /// image with neither record nor intent, so every pod could use it.
    pub async fn record_image_pulled(
        &self,
        image: &str,
        image_ref: &str,
        creds: &ImagePullCredentials,
    ) -> Result<(), StoreError> {
        let key = image_key(image);
        let Some(repo) = image_repo(image) else {
            // Cannot happen for an image that was pulled; end the intent.
            self.record_image_pull_failed(image).await;
            return Ok(());
        };
        let w = PulledWrite {
            image_ref: image_ref.into(),
            repo,
            creds: creds.clone(),
            intent: Some(key),
            refresh: Refresh::Always,
        };
        self.write_pulled(w).await
    }

    /// [`PullRecords::record_image_pulled`] for a request of a pull that
    /// began at `began` (on [`PullRecords::clock`]): when the merge changes
    /// nothing and the record was refreshed since `began` (by another
    /// request of the same shared pull), it is not written again; only the
    /// intent ends. A burst of pods sharing one pull then costs one durable
    /// write, not one each, and the record the others wait for comes sooner.
    pub async fn record_image_pulled_since(
        &self,
        image: &str,
        image_ref: &str,
        creds: &ImagePullCredentials,
        began: std::time::SystemTime,
    ) -> Result<(), StoreError> {
        let names = self.names(image);
        let Some(repo) = names.repo.clone() else {
            self.record_image_pull_failed(image).await;
            return Ok(());
        };
        let key = names.key.clone();
        let refresh = Refresh::UnlessSince(began);
        let w = PulledWrite { image_ref: image_ref.into(), repo, creds: creds.clone(), intent: Some(key), refresh };
        self.write_pulled(w).await
    }

    /// A pull of `image` that began at `began` (on [`PullRecords::clock`])
    /// ended as `end`: the pulled record
    /// ([`PullRecords::record_image_pulled_since`]; a failed write is
    /// logged), or the intent kept ([`PullRecords::record_image_pull_unknown`])
    /// or ended ([`PullRecords::record_image_pull_failed`]). What an
    /// ensure's pull and a CRI front's pull both do once they end.
    /// Until it is written, the pulled image's ref is owed a record: a
    /// must-pull check of the image by any name waits for it
    /// ([`OWED_RECORD_WAIT`]).
    pub async fn end_pull(&self, image: &str, end: PullEnd, began: std::time::SystemTime) {
        let owed = self.owe(&end);
        self.write_end(image, end, began).await;
        drop(owed);
    }

    /// The pulled image's ref owed a record until the guard drops (nothing
    /// for another end).
    fn owe(&self, end: &PullEnd) -> Option<OwedRecord> {
        match end {
            PullEnd::Pulled { image_ref, .. } => Some(OwedRecord::new(&self.inner, image_ref)),
            PullEnd::Unknown | PullEnd::Ended => None,
        }
    }

    /// [`PullRecords::end_pull`]'s writes.
    async fn write_end(&self, image: &str, end: PullEnd, began: std::time::SystemTime) {
        match end {
            PullEnd::Pulled { image_ref, credentials } => {
                if let Err(e) = self.record_image_pulled_since(image, &image_ref, &credentials, began).await {
                    tracing::warn!(image, error = %e, "failed to record an image pulled record");
                }
            }
            PullEnd::Unknown => self.record_image_pull_unknown(image).await,
            PullEnd::Ended => self.record_image_pull_failed(image).await,
        }
    }

    /// [`PullRecords::end_pull`] on a task of its own, so whoever asked for
    /// the pull is answered without waiting for the store: an ensure, the
    /// CRI front. Until the write ends the pull counts as in flight (a
    /// check of the image waits for it: [`PullRecords::pulls_ended`]);
    /// `due`, what else holds the record due, is dropped once it is
    /// written. The handle is for a caller that must wait for it;
    /// [`PullRecords::written`] waits for them all.
    pub fn end_pull_behind<D: Send + 'static>(
        &self,
        image: String,
        end: PullEnd,
        began: std::time::SystemTime,
        due: D,
    ) -> tokio::task::JoinHandle<()> {
        let counted = self.inner.behind.begin();
        // Owed from before the answer: a check of the image, by any name,
        // waits for it (`OWED_RECORD_WAIT`).
        let owed = self.owe(&end);
        let records = self.clone();
        tokio::spawn(async move {
            records.write_end(&image, end, began).await;
            drop(owed);
            drop(due);
            drop(counted);
        })
    }

    /// Waits until every pull end written behind its answer
    /// ([`PullRecords::end_pull_behind`]) is written: what a caller that
    /// reads the records right after an ensure, or stops, waits for.
    pub async fn written(&self) {
        self.inner.behind.settled(std::time::Duration::MAX).await;
    }

    /// One pull of `image` ended and imaged does not know how: its reply
    /// was lost (a deadline, a dropped connection), its queue stopped, or
    /// its caller gave up, while the runtime may have pulled the image or
    /// may still. The pull no longer counts as in flight, but its intent
    /// stays on disk for the rest of this process (later pulls of the image
    /// do not end it), so the image keeps counting as pulled by imaged —
    /// never as preloaded — until the next start recovers the intent into a
    /// record. The kubelet deletes the intent here (`RecordImagePullFailed`),
    /// which turns an image pulled for one pod into a preloaded image every
    /// pod may use (found by the simulator, seed 3).
    pub async fn record_image_pull_unknown(&self, image: &str) {
        let (this, image) = (self.clone(), image.to_string());
        to_the_end(self, Some(image_key(&image)), async move { this.end_unknown_pull(&image).await }).await;
    }

    /// [`PullRecords::record_image_pull_unknown`], cancellable (see [`to_the_end`]).
    async fn end_unknown_pull(&self, image: &str) {
        let key = image_key(image);
        let _w = self.inner.writes.lock().await;
        self.ended_keeping_intent(&key);
    }

    /// Writes `key`'s intent again after a write that may or may not have
    /// deleted it (a panic after its commit, a commit that failed after
    /// reaching the disk). Stored, memory says so; not stored either, memory
    /// drops its claim, so the next pull of the image writes it again
    /// rather than take it for on disk. Called under the write lock.
    async fn rewrite_intent(&self, key: &str) {
        let again = PullRecordsWrite { put_intents: vec![key.to_string()], ..Default::default() };
        let stored = self.commit(again).await.is_ok();
        let mut st = self.state();
        if stored {
            st.stored_intents.insert(key.to_string());
        } else {
            st.stored_intents.remove(key);
        }
    }

    /// One pull of `key` ended and its intent stays on disk for the rest of
    /// this process (see [`PullRecords::record_image_pull_unknown`]): its
    /// outcome is unknown, or the write that was to end it failed. Called
    /// under the write lock.
    fn ended_keeping_intent(&self, key: &str) {
        let mut st = self.state();
        st.unknown.insert(key.to_string());
        if let Some(n) = st.in_flight.get_mut(key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                st.in_flight.remove(key);
            }
        }
        drop(st);
        self.inner.pull_ended.notify_waiters();
    }

    /// The kubelet's `RecordImagePullFailed` (also used when a pull turned
    /// out not to be needed): one pull of `image` ended without a record;
    /// the intent is deleted when it was the last one in flight (and no
    /// pull of it ended unknown, see [`PullRecords::record_image_pull_unknown`]).
    pub async fn record_image_pull_failed(&self, image: &str) {
        let (this, image) = (self.clone(), image.to_string());
        to_the_end(self, Some(image_key(&image)), async move { this.end_failed_pull(&image).await }).await;
    }

    /// [`PullRecords::record_image_pull_failed`], cancellable (see [`to_the_end`]).
    async fn end_failed_pull(&self, image: &str) {
        let key = image_key(image);
        let _w = self.inner.writes.lock().await;
        let last = self.state().in_flight.get(&key).is_none_or(|n| *n <= 1);
        if !last || self.state().unknown.contains(&key) {
            let mut st = self.state();
            if let Some(n) = st.in_flight.get_mut(&key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    st.in_flight.remove(&key);
                }
            }
            drop(st);
            self.inner.pull_ended.notify_waiters();
            return;
        }
        if let Err(e) = self.commit(PullRecordsWrite { delete_intents: vec![key.clone()], ..Default::default() }).await
        {
            tracing::warn!(image, error = %e, "failed to remove an image pull intent");
            // A commit can fail after reaching the disk: whether the intent
            // is still there is not known, so it is written again, and the
            // pull ends as one whose outcome is unknown (a check waiting for
            // it goes on).
            self.rewrite_intent(&key).await;
            self.ended_keeping_intent(&key);
            return;
        }
        let mut st = self.state();
        st.stored_intents.remove(&key);
        st.kept.remove(&key);
        st.in_flight.remove(&key);
        drop(st);
        self.inner.pull_ended.notify_waiters();
    }

    /// Merges `w.creds` into the record of `w.image_ref` for `w.repo` and,
    /// when `w.intent` is given, ends one pull of that image key, in one
    /// transaction.
    async fn write_pulled(&self, w: PulledWrite) -> Result<(), StoreError> {
        let this = self.clone();
        match to_the_end(self, w.intent.clone(), async move { this.write_pulled_now(&w).await }).await {
            Some(r) => r,
            None => Err(StoreError::Blocking("the record's write ended before completing".into())),
        }
    }

    /// [`PullRecords::write_pulled`], cancellable (see [`to_the_end`]).
    async fn write_pulled_now(&self, w: &PulledWrite) -> Result<(), StoreError> {
        let (image_ref, repo, creds, refresh) = (w.image_ref.as_str(), w.repo.as_str(), &w.creds, w.refresh);
        let intent = w.intent.as_deref();
        let _w = self.inner.writes.lock().await;
        let (existing, last_intent) = {
            let st = self.state();
            let last = intent.map(|k| st.in_flight.get(k).is_none_or(|n| *n <= 1) && !st.unknown.contains(k));
            (st.records.get(image_ref).cloned(), last)
        };
        let now = self.inner.clock.now();
        let (mut record, mut changed) = merge_pulled(existing.as_deref(), image_ref, repo, creds, now);
        let refresh = match refresh {
            Refresh::No => false,
            Refresh::Always => true,
            Refresh::UnlessSince(began) => existing.as_deref().is_none_or(|r| r.last_updated_time < began),
        };
        if refresh && !changed {
            record.last_updated_time = now;
            changed = true;
        }
        let mut w = PullRecordsWrite::default();
        if changed {
            w.upsert_records.push(record.clone());
        }
        // The last pull in flight leaves its intent on disk ("Kept intents").
        // See "Unsynced" above: losing this write leaves the intent (or
        // nothing, when another pull of the image still runs), never a
        // record granting more than the one before.
        let _writing = changed.then(|| Writing::new(self, image_ref));
        let written = if creds.node_pods_accessible && intent.is_some() {
            self.commit_unsynced(w).await
        } else {
            self.commit(w).await
        };
        if let Err(e) = written {
            // The pull ended all the same, its intent kept (a check waiting
            // for its record goes on); its record is not written.
            if let Some(key) = intent {
                self.ended_keeping_intent(key);
            }
            return Err(e);
        }
        let mut st = self.state();
        if changed {
            st.unreadable.remove(image_ref);
            st.records.insert(image_ref.to_string(), Arc::new(record));
            // In `records` now, before `writing` lets it go.
            st.writing.remove(image_ref);
        }
        if let Some(key) = intent {
            if last_intent == Some(true) {
                st.in_flight.remove(key);
                // Kept only if on disk: a record written without its
                // pull's intent (no `begin_pull`) keeps nothing, nor do
                // records in memory (no write to spare).
                if st.stored_intents.remove(key) && self.inner.store.is_some() {
                    st.kept.insert(key.to_string(), image_ref.to_string());
                }
            } else if let Some(n) = st.in_flight.get_mut(key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    st.in_flight.remove(key);
                }
            }
            drop(st);
            self.inner.pull_ended.notify_waiters();
        }
        Ok(())
    }

    /// Waits, for at most `within`, until no pull of `image` is in flight in
    /// this process (each has written its record or ended its intent).
    /// True when some were: a must-pull check made before ("pulled by
    /// imaged, no record yet") is worth making again, whether they all
    /// ended or the wait ran out (a record may have come meanwhile).
    /// The queue answers a pull's requests when the runtime's `PullImage`
    /// does, and the request that started it writes the record after that,
    /// so a pod that finds the image present in between would otherwise
    /// pull it again.
    pub async fn pulls_ended(&self, image: &str, within: std::time::Duration) -> bool {
        let key = image_key(image);
        let in_flight = || self.state().in_flight.get(&key).is_some_and(|n| *n > 0);
        crate::settle::settled(&self.inner.pull_ended, within, in_flight).await
    }

    /// Writes `w` to the store on the blocking pool, or inline under the
    /// simulator (`crate::blocking`); nothing without a store.
    async fn commit(&self, w: PullRecordsWrite) -> Result<(), StoreError> {
        self.commit_as(w, true).await
    }

    /// [`PullRecords::commit`], unsynced (see "Unsynced" above).
    async fn commit_unsynced(&self, w: PullRecordsWrite) -> Result<(), StoreError> {
        self.commit_as(w, false).await
    }

    async fn commit_as(&self, w: PullRecordsWrite, synced: bool) -> Result<(), StoreError> {
        let Some(store) = self.inner.store.clone() else { return Ok(()) };
        if w.is_empty() {
            return Ok(());
        }
        let write = move || if synced { store.apply_pull_records(&w) } else { store.apply_pull_records_unsynced(&w) };
        match crate::blocking::unblock(write).await {
            Ok(r) => r,
            Err(e) => Err(StoreError::Blocking(e.to_string())),
        }
    }

    /// Puts the unsynced writes on disk (see "Unsynced" above) and deletes
    /// the kept intents (see "Kept intents" above), so the next start
    /// finds only the intents of pulls that may still be running; a
    /// graceful stop calls it last, after the pull ends written behind
    /// their answers (for at most 5 s). Nothing to do without a store.
    pub async fn sync(&self) -> Result<(), StoreError> {
        let Some(store) = self.inner.store.clone() else { return Ok(()) };
        self.inner.behind.settled(BEHIND_WAIT).await;
        let _w = self.inner.writes.lock().await;
        // See `take_kept`: an intent on disk that memory does not know is
        // only one the next start recovers.
        let kept = self.take_kept(|_| true);
        let mut deleted = Ok(());
        if !kept.is_empty() {
            // Synced: it puts the unsynced writes before it on disk too.
            match self.commit(PullRecordsWrite { delete_intents: kept, ..Default::default() }).await {
                Ok(()) => return Ok(()),
                // The kept intents stay on disk (the next start recovers
                // them, on the strict side); the unsynced records must
                // still go on disk.
                Err(e) => deleted = Err(e),
            }
        }
        let synced = match crate::blocking::unblock(move || store.sync()).await {
            Ok(r) => r.map(|_| ()),
            Err(e) => Err(StoreError::Blocking(e.to_string())),
        };
        deleted.and(synced)
    }
}

/// An intent recorded by [`PullRecords::begin_pull`]; see there.
#[derive(Debug)]
pub struct IntentGuard {
    records: Option<PullRecords>,
    image: String,
}

impl IntentGuard {
    /// The pull's end was recorded (pulled or failed): nothing to do on drop.
    pub fn disarm(mut self) {
        self.records = None;
    }
}

impl Drop for IntentGuard {
    fn drop(&mut self) {
        let Some(records) = self.records.take() else { return };
        let image = std::mem::take(&mut self.image);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                // Its caller gave up: the pull may go on, its outcome unknown.
                handle.spawn(async move { records.end_unknown_pull(&image).await });
            }
            Err(_) => tracing::warn!(image, "pull intent left in place: no runtime to end it on"),
        }
    }
}
