//! The invariants, checked as the log grows (each entry in order) and at
//! the end of every step (against the actors' and the runtime's state),
//! at every restart (against the store as the next process finds it) and
//! at the end of the run (liveness). Each has a name, the first words of
//! its message, and a doc comment saying what it promises; `docs/simulation.md`
//! lists them.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use super::log::{Answer, Entry, FrontOutcome, Life, What, short};
use super::plan::{
    Access, IMAGES, PLUGIN_REGISTRY, PLUGIN_TOKEN, PLUGIN_USER, PRIVATE_PASSWORD, Plan, REGISTRIES, ROBOT_PASSWORD,
    ROBOT_USER, STALE_TOKEN, SecretKind, StallCheck, WRONG_PASSWORD,
};
use super::plugin::STDERR_TOKEN;
use crate::actors::backoff_registry::BackoffView;
use crate::actors::gc_executor::GcReport;
use crate::actors::pull_queue::QueueStatus;
use crate::config::Config;
use crate::cri::Rpc;
use crate::domain::pull_record::PulledRecord;
use crate::embedded::Observed;
use crate::events::EventReason;
use crate::gc::plan::{DeleteReason, GcMode, KeepReason, Verdict};
use crate::gc::record::ImageRecord;
use crate::node::NodeError;
use crate::pull_records::{VerificationPolicy, image_key, image_repo};

/// An invariant that did not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Its name (`single-flight`, `backoff-law`, …).
    pub invariant: &'static str,
    /// The step during which it was seen.
    pub step: usize,
    /// Simulated time since the run began.
    pub at: Duration,
    /// What was seen.
    pub message: String,
}

/// Every invariant, with what it promises (the docs' list).
pub const INVARIANTS: &[(&str, &str)] = &[
    (
        "ensure-answered",
        "every ensure is answered (ok or a kubelet error), within its bound when a pull deadline is set",
    ),
    ("in-use-kept", "no image used by a container, pinned, or the sandbox image is removed"),
    (
        "kep2535",
        "a pod never gets a private image it could not pull itself (with its secret, or the node's plugin credentials), across restarts; the CRI front answers a pull only for a credential that can pull it, its outage fallback as an ensure's",
    ),
    ("single-flight", "at most one runtime PullImage per (image, handler, credential) and kind of request in flight"),
    ("backoff-law", "back-off follows client-go's law: 10 s doubling to the cap, strict, expiry, clear and resets"),
    ("gc-target", "GC frees no more than it must below the low threshold, and down to it when eligible images allow"),
    ("gc-reasons", "an image GC keeps as in use is in use (a container, a recent ensure, a pull in flight)"),
    (
        "durable",
        "the store after a restart holds every acknowledged record (or, for one every pod may use, its intent) and intent and keeps image ages",
    ),
    ("bounded", "pulls in flight, waiting pulls and back-off entries stay within their configured bounds"),
    ("reload-live", "a reload of settings that apply live applies them, and names nothing as needing a restart"),
    ("actors-alive", "no actor stops while its process serves, and nothing panics"),
    ("secrets-hidden", "no password, token or plugin output appears in an event, an answer, a report or the trace"),
    (
        "stall-cancel",
        "imaged cancels a pull for a stall only after its download stalled (or dripped under pull.min_download_rate) for pull.stall_timeout, and cancels a stalled pull alone in the runtime on a clean wire within that time and two checks",
    ),
    (
        "liveness",
        "once faults end, every pod whose images can be pulled with its credentials, within its own pull deadline, starts",
    ),
];

/// The settings the invariants depend on.
#[derive(Debug, Clone)]
struct Facts {
    single_flight: bool,
    /// The most pulls at once, as reloads set it.
    parallel: History<usize>,
    /// Every registry's limit on pulls at once and registries' own in
    /// place of it, as reloads set them.
    registry_limits: History<RegistryLimits>,
    /// The longest a registry's own bucket may make a pull wait for a
    /// token (zero without registries' rates), as reloads set it.
    registry_token: History<Duration>,
    queue_capacity: Option<usize>,
    pull_deadline: Option<Duration>,
    cri: Duration,
    /// The node's throttle rate (0: none), as reloads set it.
    qps: History<f64>,
    /// The minimum age (GC's "recent ensure" window), as reloads set it.
    min_age: History<Duration>,
    pinned: Vec<wildmatch::WildMatch>,
    initial: Duration,
    max: Duration,
    backoff_gc: Duration,
    policy: VerificationPolicy,
    allowlist_private: bool,
    registry_reset: bool,
    sandbox_id: Option<String>,
    /// The back-off cap, as reloads set it (how long an entry may be kept).
    maxes: History<Duration>,
    /// What the runtime sees of the plugin's credentials
    /// ([`AuthConfig::identity`](crate::domain::AuthConfig::identity)):
    /// node-level ones, every pod's.
    node_auths: BTreeSet<String>,
}

/// Every secret a run knows: none may show.
const SECRETS: [&str; 6] = [PRIVATE_PASSWORD, WRONG_PASSWORD, PLUGIN_TOKEN, STALE_TOKEN, ROBOT_PASSWORD, STDERR_TOKEN];

/// The store as a process finds it at start.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Pull intents (image keys).
    pub intents: BTreeSet<String>,
    /// Pulled records by image ref.
    pub records: BTreeMap<String, PulledRecord>,
    /// Image records by image id and runtime handler (an image removed and
    /// pulled again for another handler is another record).
    pub images: BTreeMap<(String, String), ImageRecord>,
}

/// An acknowledged pulled record.
#[derive(Debug, Clone)]
struct Ack {
    repo: String,
    /// The pod's secret.
    secret: SecretKind,
    /// The image's intent key.
    key: String,
    /// The process that answered, while the record may have been written
    /// unsynced (every pod's: no valid secret of the pod's own pulled it, or
    /// the node's credentials may have) and not yet seen on disk; 0 once it
    /// must be there.
    unsynced_of: u32,
}

/// A runtime pull in flight.
#[derive(Debug, Clone)]
struct OpenPull {
    inc: u32,
    /// Its download, when it stalls.
    stall: Option<StalledDownload>,
    /// When the runtime's call began.
    since: Duration,
    image: String,
    key: (String, String, Option<String>),
}

/// One key's back-off as client-go keeps it. With
/// `backoff.reset_on_registry_recovery` a success from the key's registry
/// may or may not have reset it (the reset is fire-and-forget, and only a
/// transient failure is reset): the period is then known between `lo` and
/// `hi`.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    last: Duration,
    lo: Duration,
    hi: Duration,
    maybe_reset: bool,
    /// `hi` before the last reload (a check at the reload's very instant
    /// may have been made before the registry took the new delays).
    was_hi: Duration,
}

/// What the actors said at the end of a step.
#[derive(Debug, Default)]
pub struct StepView {
    /// The incarnation asked (0: none serving).
    pub inc: u32,
    /// The pull queue.
    pub queue: Option<QueueStatus>,
    /// The back-off registry.
    pub backoffs: Option<Vec<BackoffView>>,
    /// The GC executor's last report.
    pub last_gc: Option<std::sync::Arc<GcReport>>,
}

/// Counts for the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Ensures asked.
    pub ensures: u64,
    /// Answered ok.
    pub ensure_ok: u64,
    /// Answered with a kubelet error.
    pub ensure_err: u64,
    /// Lost to a kill or asked of no process.
    pub ensure_lost: u64,
    /// PullImage calls at the runtime.
    pub runtime_pulls: u64,
    /// Images removed.
    pub removals: u64,
    /// Processes started.
    pub starts: u64,
    /// Runs of the credential plugin.
    pub plugin_runs: u64,
    /// Of them, runs that gave no credentials (exit, malformed, cut off).
    pub plugin_failures: u64,
    /// Processes killed.
    pub kills: u64,
    /// GC reports checked.
    pub gc_reports: u64,
    /// Restarts checked against the store.
    pub store_checks: u64,
    /// Acknowledged records written unsynced that a kill lost (their
    /// intents on disk in their place).
    pub unsynced_lost: u64,
    /// Reloads applied to a serving process.
    pub reloads: u64,
    /// Of the ensures, the kubelet's steps through the CRI front.
    pub front: u64,
    /// The kubelet's own GC's removes through the front
    /// ([`Plan::kubelet_gc`](super::plan::Plan::kubelet_gc)).
    pub kubelet_removes: u64,
    /// Of them, those the front refused.
    pub kubelet_refused: u64,
    /// Front pulls answered in a registry outage with the image on the
    /// node ([`Plan::front_fallback`](super::plan::Plan::front_fallback)).
    pub fallback_used: u64,
    /// Front pulls in a registry outage whose fallback the KEP-2535 records
    /// kept from the image on the node
    /// ([`Plan::front_fallback`](super::plan::Plan::front_fallback)).
    pub fallback_refused: u64,
    /// Pulls imaged cancelled for a stall (`pull.stall_timeout`), as their
    /// ensures were answered.
    pub stall_cancels: u64,
}

/// A download that stalls, as the embedded runtime writes it: in
/// proportion to its pull time from `since` until `at`, then `drips` bytes
/// a second.
#[derive(Debug, Clone, Copy)]
struct StalledDownload {
    since: Duration,
    at: Duration,
    /// Bytes a second before it stalls.
    rate: f64,
    drips: u64,
}

impl StalledDownload {
    /// Bytes written by `t`.
    #[allow(clippy::cast_precision_loss)]
    fn bytes(&self, t: Duration) -> f64 {
        let moving = t.min(self.at).saturating_sub(self.since).as_secs_f64() * self.rate;
        moving + t.saturating_sub(self.at).as_secs_f64() * self.drips as f64
    }

    /// Whether the stall check may rightly cancel it at `now`: idle for
    /// `timeout`, or (with a floor) under the floor over the last
    /// `timeout`, which a reading that old shows, as the bytes written
    /// only slow down.
    #[allow(clippy::cast_precision_loss)]
    fn cancellable(&self, now: Duration, check: &StallCheck) -> bool {
        let idle = self.drips == 0 && now.saturating_sub(self.at) >= check.timeout;
        let Some(from) = now.checked_sub(check.timeout).filter(|f| *f >= self.since) else { return idle };
        let floor = check.min_rate as f64 * check.timeout.as_secs_f64();
        // A byte's rounding either way.
        idle || (check.min_rate > 0 && self.bytes(now) - self.bytes(from) < floor + 1.0)
    }

    /// It may stall for good: idle, or dripping under a floor.
    fn judged(&self, check: &StallCheck) -> bool {
        self.drips == 0 || check.min_rate > self.drips
    }
}

/// What the pull's error says when imaged cancelled it for a stall.
const STALL_CANCEL: &str = "imaged cancelled the pull (pull.stall_timeout";

/// Time beyond the stall check's own a stalled pull alone in the runtime
/// may run: a retry's delay, a call between the queue and the runtime.
const STALL_SLACK: Duration = Duration::from_secs(10);

/// The checker's state: what it needs of the past.
pub struct Checker {
    plan: Rc<Plan>,
    facts: Facts,
    step: usize,
    now: Duration,
    /// The process serving (0 = none).
    inc: u32,
    /// Processes that are stopping (graceful).
    stopping: BTreeSet<u32>,
    /// Ensures not answered yet: start, process, most ensures outstanding since.
    pending: BTreeMap<u64, (Duration, u32, usize, usize, usize)>,
    open: BTreeMap<u64, OpenPull>,
    /// Calls of a killed process still open (ignored).
    orphans: BTreeSet<u64>,
    /// Since when the wire is clean ([`What::Clean`]; `None`: faulty).
    clean_since: Option<Duration>,
    /// The stalled call alone in the runtime for the serving process on a
    /// clean wire, and since when.
    alone: Option<(u64, Duration)>,
    /// Since the first step end from which the serving process's queue has
    /// run one pull at every step end (a call a fault held on its way to
    /// the runtime runs too, unseen there).
    one_running_since: Option<Duration>,
    /// When a call of each image (key) last ended after its download
    /// stalled for `pull.stall_timeout` or more.
    stalled_out: BTreeMap<String, Duration>,
    /// A third call of one key began: (when, the call, the others open then).
    suspects: Vec<(Duration, u64, Vec<u64>)>,
    /// Image ids some pull finished with (ever).
    pulled_ids: BTreeSet<String>,
    /// Image ids some pull finished with using node-level (plugin)
    /// credentials (ever): every pod on the node can pull them itself.
    node_pulled: BTreeSet<String>,
    backoff_inc: u32,
    /// The last reload: when, and the back-off delays (initial, max) before it.
    reload_at: Option<(Duration, (Duration, Duration))>,
    /// The back-off model as it was just before that reload.
    before_reload: BTreeMap<(String, String), Backoff>,
    backoff: BTreeMap<(String, String), Backoff>,
    /// When an ensure's pull last succeeded, per registry.
    registry_ok: BTreeMap<String, Duration>,
    /// Last clear per key scope: (pod uid or None, image or None) → when.
    clears: Vec<(Option<String>, Option<String>, Duration)>,
    /// Acknowledged pulled records, by image ref.
    acked: BTreeMap<String, Vec<Ack>>,
    /// The process that ended last, and whether it was killed.
    ended: Option<(u32, bool)>,
    /// Image keys of pulls in flight when a process was killed.
    in_flight_at_kill: BTreeSet<String>,
    /// Image ids removed since the last snapshot.
    removed: BTreeSet<String>,
    /// The store at the last restart, with the images present then (by id
    /// and runtime handler).
    last_snapshot: Option<(Snapshot, BTreeSet<(String, String)>)>,
    /// When an ensure last answered with each image id.
    ensured: BTreeMap<String, Duration>,
    /// When a container last ran (or was created) on each image id.
    used: BTreeMap<String, Duration>,
    /// When a pull of each image key (a runtime call, or an ensure that may
    /// be waiting on one) last stopped being in flight: imaged may still
    /// have counted it a moment before (a lost reply leaves imaged waiting
    /// after the runtime is done).
    busy_until: BTreeMap<String, Duration>,
    /// Prefetches in flight per image key.
    prefetching: BTreeMap<String, usize>,
    /// Until when every image counts as in use after a start ("maybe
    /// ensured before imaged started": one minimum-age window from the start).
    restart_grace: Option<Duration>,
    /// Containers (running or exited) on each image id now.
    containers: BTreeMap<String, usize>,
    /// GC reports seen (by start time).
    reports: BTreeSet<SystemTime>,
    /// The trace: a hash of every line, the last lines, every line if asked.
    hash: u64,
    tail: VecDeque<String>,
    full: Option<Vec<String>>,
    /// The uids of pods whose kubelet pulls through the CRI front: the
    /// front keeps no back-off (their kubelet's own is not simulated).
    front_uids: BTreeSet<String>,
    /// The front's outage fallbacks told (its `Warning` `Pulled` event) and
    /// not yet matched with their call's answer: (pod uid, image) → how
    /// many.
    fell_back: BTreeMap<(String, String), u32>,
    /// The kubelet's GC's removes through the front in flight: image id →
    /// the process whose front it was sent to, and when it was sent.
    kubelet_removing: BTreeMap<String, (u32, Duration)>,
    /// The last give of each image id to a pod (an ensure or the kubelet's
    /// steps through the front answered with it): the process that gave
    /// it and when that call began (imaged marks the image at or after).
    given: BTreeMap<String, (u32, Duration)>,
    /// Counts.
    pub stats: Stats,
}

/// In `given`: process `inc` gave `image_id` to a pod in a call that
/// began at `began` (the latest such give of the latest process is kept).
fn gave(given: &mut BTreeMap<String, (u32, Duration)>, image_id: &str, inc: u32, began: Duration) {
    let e = given.entry(image_id.to_string()).or_insert((inc, began));
    if e.0 < inc || (e.0 == inc && e.1 < began) {
        *e = (inc, began);
    }
}

/// `kep2535`'s message for a front pull answered to a pod that cannot pull.
fn front_leak(p: &super::plan::SimPod, image: &str, image_id: &str) -> String {
    format!(
        "the CRI front answered pod {}/{}'s PullImage of the private image {image} ({}) though its credential (secret {:?}) cannot pull it",
        p.namespace,
        p.name,
        short(image_id),
        p.secret
    )
}

/// How long an ensure may still wait when the run ends (the quiet phase
/// is 30 minutes; a pull takes at most a minute, back-off five).
const LIVENESS_WAIT: Duration = Duration::from_secs(600);

/// Lines of trace kept for a failure report.
const TAIL: usize = 300;

fn fnv(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

fn secs(d: Duration) -> String {
    format!("{}.{:03}s", d.as_secs(), d.subsec_millis())
}

/// Simulated time of a wall-clock stamp.
fn sim_time(t: SystemTime) -> Option<Duration> {
    t.duration_since(SystemTime::UNIX_EPOCH + super::world::SIM_EPOCH).ok()
}

pub(super) fn registry_of(image: &str) -> &str {
    image.split('/').next().unwrap_or(image)
}

/// The longest a registry's own bucket may make a pull wait for a token
/// under `cfg`.
fn registry_token(cfg: &Config) -> Duration {
    cfg.pull
        .registry_rates
        .iter()
        .filter(|r| r.qps > 0.0)
        .map(|r| Duration::from_secs_f64(1.0 / r.qps))
        .max()
        .unwrap_or(Duration::ZERO)
}

/// The limits on pulls at once per registry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct RegistryLimits {
    every: Option<usize>,
    own: std::collections::HashMap<String, usize>,
}

impl RegistryLimits {
    fn of(cfg: &Config) -> Self {
        Self { every: cfg.pull.registry_limit, own: cfg.pull.registry_limits.clone() }
    }

    /// `registry`'s limit (`None`: none but the overall one).
    fn of_registry(&self, registry: &str) -> Option<usize> {
        self.own.get(registry).copied().or(self.every)
    }

    fn any(&self) -> bool {
        self.every.is_some() || !self.own.is_empty()
    }
}

/// A setting's values over the run, each from the time a reload set it
/// (the first from the start), oldest first: a check of something that
/// spanned a reload allows what any value in force meanwhile allowed, and
/// only meanwhile.
#[derive(Debug, Clone)]
struct History<T>(Vec<(Duration, T)>);

impl<T: Clone + Default> History<T> {
    fn new(value: T) -> Self {
        Self(vec![(Duration::ZERO, value)])
    }

    fn set(&mut self, at: Duration, value: T) {
        self.0.push((at, value));
    }

    /// The value in force now.
    fn now(&self) -> T {
        self.0.last().map(|(_, v)| v.clone()).unwrap_or_default()
    }

    /// Each value in force at some time within `from..=to`, with the time
    /// it stopped being in force (`Duration::MAX`: it still is).
    fn during(&self, from: Duration, to: Duration) -> impl Iterator<Item = (T, Duration)> + '_ {
        self.0.iter().enumerate().filter_map(move |(i, (since, v))| {
            let until = self.0.get(i + 1).map_or(Duration::MAX, |n| n.0);
            (*since <= to && until >= from).then(|| (v.clone(), until))
        })
    }
}

impl History<Duration> {
    /// The longest value in force within `from..=to`.
    fn longest(&self, from: Duration, to: Duration) -> Duration {
        self.during(from, to).map(|(v, _)| v).max().unwrap_or_else(|| self.now())
    }

    /// The shortest value in force within `from..=to`.
    fn shortest(&self, from: Duration, to: Duration) -> Duration {
        self.during(from, to).map(|(v, _)| v).min().unwrap_or_else(|| self.now())
    }
}

impl Checker {
    /// A checker of `plan` run with `cfg`.
    pub fn new(plan: Rc<Plan>, cfg: &Config, sandbox_id: Option<String>, full_trace: bool) -> Self {
        let facts = Facts {
            single_flight: cfg.pull.single_flight,
            parallel: History::new(cfg.pull.concurrency.limit()),
            registry_limits: History::new(RegistryLimits::of(cfg)),
            registry_token: History::new(registry_token(cfg)),
            queue_capacity: cfg.pull.capacity,
            pull_deadline: cfg.pull.pull_deadline,
            cri: cfg.cri.deadlines.get(Rpc::ImageStatus).unwrap_or(Duration::from_secs(120)),
            qps: History::new(cfg.pull.qps),
            min_age: History::new(cfg.gc.min_age),
            pinned: cfg.gc.pinned_images.iter().map(|p| wildmatch::WildMatch::new(p)).collect(),
            initial: cfg.backoff.delays.initial,
            max: cfg.backoff.delays.max,
            maxes: History::new(cfg.backoff.delays.max),
            backoff_gc: cfg.backoff.gc_interval.unwrap_or(Duration::ZERO),
            policy: cfg.verification.policy,
            allowlist_private: plan.allowlist_private,
            registry_reset: cfg.ensure.reset_backoff_on_registry_recovery,
            sandbox_id,
            node_auths: plan
                .plugin
                .map(|p| {
                    // As the runtime gets them: for the registry of the image
                    // (the keyring's), its address as sent on the wire.
                    let auth = |registry: &str, user: &str, password: &str| {
                        let server = crate::cri::server_address_for_runtime(registry);
                        crate::domain::AuthConfig::basic(server, user, password).identity()
                    };
                    let mut auths = vec![auth(PLUGIN_REGISTRY, PLUGIN_USER, PLUGIN_TOKEN)];
                    if p.covers_private {
                        auths.push(auth("private.example", ROBOT_USER, ROBOT_PASSWORD));
                    }
                    auths.into_iter().collect()
                })
                .unwrap_or_default(),
        };
        let front_uids = plan.front_pods.iter().map(|&i| plan.pods[i].uid.clone()).collect();
        Self {
            plan,
            facts,
            step: 0,
            now: Duration::ZERO,
            inc: 0,
            stopping: BTreeSet::new(),
            pending: BTreeMap::new(),
            open: BTreeMap::new(),
            orphans: BTreeSet::new(),
            clean_since: Some(Duration::ZERO),
            alone: None,
            one_running_since: None,
            stalled_out: BTreeMap::new(),
            suspects: Vec::new(),
            pulled_ids: BTreeSet::new(),
            node_pulled: BTreeSet::new(),
            backoff_inc: 0,
            reload_at: None,
            before_reload: BTreeMap::new(),
            backoff: BTreeMap::new(),
            registry_ok: BTreeMap::new(),
            clears: Vec::new(),
            acked: BTreeMap::new(),
            ended: None,
            in_flight_at_kill: BTreeSet::new(),
            removed: BTreeSet::new(),
            last_snapshot: None,
            ensured: BTreeMap::new(),
            used: BTreeMap::new(),
            busy_until: BTreeMap::new(),
            prefetching: BTreeMap::new(),
            restart_grace: None,
            containers: BTreeMap::new(),
            reports: BTreeSet::new(),
            hash: 0xcbf2_9ce4_8422_2325,
            tail: VecDeque::with_capacity(TAIL),
            full: full_trace.then(Vec::new),
            front_uids,
            fell_back: BTreeMap::new(),
            kubelet_removing: BTreeMap::new(),
            given: BTreeMap::new(),
            stats: Stats::default(),
        }
    }

    /// The step being run.
    pub fn step(&self) -> usize {
        self.step
    }

    /// A hash of the whole trace so far.
    pub fn trace_hash(&self) -> u64 {
        self.hash
    }

    /// The last lines of the trace.
    pub fn tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }

    /// Every line of the trace, when kept.
    pub fn full_trace(&self) -> Option<&[String]> {
        self.full.as_deref()
    }

    fn fail(&self, invariant: &'static str, message: String) -> Violation {
        Violation { invariant, step: self.step, at: self.now, message }
    }

    fn trace(&mut self, line: String) {
        self.hash = fnv(self.hash, line.as_bytes());
        self.hash = fnv(self.hash, b"\n");
        if self.tail.len() == TAIL {
            self.tail.pop_front();
        }
        if let Some(full) = &mut self.full {
            full.push(line.clone());
        }
        self.tail.push_back(line);
    }

    /// Reads entries in order, checking what each promises.
    pub fn absorb(&mut self, entries: Vec<Entry>) -> Result<(), Violation> {
        for e in entries {
            let line = format!("[{:>12}] {}", secs(e.at), e.line(&self.plan));
            self.now = e.at;
            if let Some(secret) = SECRETS.iter().find(|s| line.contains(*s)) {
                let shown = line.replace(secret, "<the secret>");
                self.trace(shown.clone());
                return Err(self.fail("secrets-hidden", format!("a secret shows in: {shown}")));
            }
            self.trace(line);
            self.entry(e.what)?;
            self.watch_alone();
        }
        Ok(())
    }

    fn entry(&mut self, what: What) -> Result<(), Violation> {
        match what {
            What::Step { index, .. } => self.step = index,
            What::Life { inc, what } => self.life(inc, &what),
            What::Reloaded { outcome: Err(e), .. } => return Err(self.fail("reload-live", e)),
            What::Reloaded { outcome: Ok((cfg, r)), .. } => {
                if !r.needs_restart.is_empty() {
                    return Err(self.fail(
                        "reload-live",
                        format!("a reload of live settings left {:?} needing a restart", r.needs_restart),
                    ));
                }
                self.stats.reloads += 1;
                self.reloaded(&cfg);
            }
            What::Runtime(o) => self.runtime(o)?,
            What::Clean(clean) => self.clean_since = if clean { self.clean_since.or(Some(self.now)) } else { None },
            // The front keeps no back-off: its pods' pulls are the kubelet's.
            What::Event { event, .. } if self.front_uids.contains(&event.object.pod_uid) => {
                if event.reason == EventReason::Pulled && event.message.contains("so the local image is used") {
                    *self.fell_back.entry((event.object.pod_uid.clone(), event.image.clone())).or_default() += 1;
                }
            }
            What::Event { inc, event } => {
                if event.reason == EventReason::Pulled && event.message.starts_with("Successfully pulled") {
                    self.registry_recovered(&event.image);
                }
                self.event(inc, event.reason, &event.object.pod_uid, &event.image)?;
            }
            What::EnsureStarted { id, inc, pod, container } => {
                self.stats.ensures += 1;
                if inc != 0 {
                    let n = self.pending.len() + 1;
                    for p in self.pending.values_mut() {
                        p.4 = p.4.max(n);
                    }
                    self.pending.insert(id, (self.now, inc, pod, container, n));
                }
            }
            What::EnsureEnded { id, answer } => self.answered(id, &answer)?,
            What::FrontEnded { id, pod, container, outcome } => self.front_answered(id, pod, container, &outcome)?,
            What::Created { image_id, .. } => {
                self.used.insert(image_id.clone(), self.now);
                *self.containers.entry(image_id).or_default() += 1;
            }
            What::ContainersGone { image_ids, exited, .. } => {
                for id in image_ids {
                    self.used.insert(id.clone(), self.now);
                    if !exited && let Some(n) = self.containers.get_mut(&id) {
                        *n -= 1;
                        if *n == 0 {
                            self.containers.remove(&id);
                        }
                    }
                }
            }
            What::PrefetchStarted { image } => *self.prefetching.entry(image_key(IMAGES[image].name)).or_default() += 1,
            What::PrefetchEnded { image, result } => {
                let key = image_key(IMAGES[image].name);
                if let Some(n) = self.prefetching.get_mut(&key) {
                    *n -= 1;
                    if *n == 0 {
                        self.prefetching.remove(&key);
                    }
                }
                self.busy_until.insert(key, self.now);
                // A prefetch marks its image ensured, as an ensure does.
                if let Ok(id) = result {
                    self.ensured.insert(id, self.now);
                }
            }
            What::CreateFailed { .. } | What::Stall { .. } => {}
            What::KubeletRemoving { id, inc } => {
                self.stats.kubelet_removes += 1;
                self.kubelet_removing.insert(id, (inc, self.now));
            }
            What::KubeletRemoved { id, result } => {
                self.kubelet_removing.remove(&id);
                if result.is_err() {
                    self.stats.kubelet_refused += 1;
                }
            }
            What::Gc { result, .. } => {
                if let Ok(report) = result {
                    self.gc_report(&report)?;
                }
            }
            What::PluginRun { .. } => self.stats.plugin_runs += 1,
            What::PluginEnded { outcome, .. } => {
                if !matches!(outcome, super::log::PluginOutcome::Credentials { .. }) {
                    self.stats.plugin_failures += 1;
                }
            }
            What::BackoffCleared { pod_uid, image } => {
                self.backoff.retain(|(uid, img), _| {
                    !(pod_uid.as_ref().is_none_or(|u| u == uid) && image.as_ref().is_none_or(|i| i == img))
                });
                self.clears.push((pod_uid, image, self.now));
            }
        }
        Ok(())
    }

    fn life(&mut self, inc: u32, what: &Life) {
        match what {
            Life::Started => {
                self.inc = inc;
                self.stats.starts += 1;
                self.restart_grace = Some(self.now + self.facts.min_age.now());
            }
            Life::Stopping => {
                self.stopping.insert(inc);
            }
            Life::Killed | Life::Exited | Life::StartFailed(_) => {
                if matches!(what, Life::Killed) {
                    self.stats.kills += 1;
                }
                self.ended = Some((inc, !matches!(what, Life::Exited)));
                if self.inc == inc {
                    self.inc = 0;
                }
                let calls: Vec<u64> = self.open.iter().filter(|(_, p)| p.inc == inc).map(|(c, _)| *c).collect();
                for c in calls {
                    if let Some(p) = self.open.remove(&c) {
                        self.in_flight_at_kill.insert(image_key(&p.image));
                        self.busy_until.insert(image_key(&p.image), self.now);
                    }
                    self.orphans.insert(c);
                }
                let gone: Vec<u64> = self.pending.iter().filter(|(_, p)| p.1 == inc).map(|(id, _)| *id).collect();
                for id in gone {
                    if let Some((_, _, pod, c, _)) = self.pending.remove(&id) {
                        self.ensure_ended(pod, c);
                    }
                }
            }
        }
    }

    /// The runtime's side: single-flight, and what a removal may remove.
    fn runtime(&mut self, o: Observed) -> Result<(), Violation> {
        match o {
            Observed::PullStarted { call, image, runtime_handler, auth } => {
                self.stats.runtime_pulls += 1;
                let key = (image.clone(), runtime_handler, auth);
                let same: Vec<u64> = self.open.iter().filter(|(_, p)| p.key == key).map(|(c, _)| *c).collect();
                // One request that may skip a present image and one that
                // must reach the registry may pull the same key at once.
                if self.facts.single_flight && same.len() >= 2 {
                    self.suspects.push((self.now, call, same));
                }
                self.open.insert(call, OpenPull { inc: self.inc, stall: None, since: self.now, image, key });
            }
            Observed::Downloading { call, stalls_after, drips, size, takes } => {
                if let (Some(p), Some(after)) = (self.open.get_mut(&call), stalls_after) {
                    #[allow(clippy::cast_precision_loss)]
                    let rate = size as f64 / takes.as_secs_f64().max(f64::MIN_POSITIVE);
                    p.stall = Some(StalledDownload { since: self.now, at: self.now + after, rate, drips });
                }
            }
            Observed::PullEnded { call, image_id } => {
                if let Some(p) = self.open.remove(&call) {
                    if let (Some(d), Some(check)) = (p.stall, self.plan.stall_check)
                        && d.cancellable(self.now, &check)
                    {
                        self.stalled_out.insert(image_key(&p.image), self.now);
                    }
                    self.busy_until.insert(image_key(&p.image), self.now);
                    if let Some(id) = image_id {
                        if p.key.2.as_ref().is_some_and(|a| self.facts.node_auths.contains(a)) {
                            self.node_pulled.insert(id.clone());
                        }
                        self.pulled_ids.insert(id);
                    }
                    // A call that ends at the instant another began was
                    // cancelled as it began: not two in flight.
                    let now = self.now;
                    self.suspects.retain(|(at, _, others)| !(*at == now && others.contains(&call)));
                }
                self.orphans.remove(&call);
            }
            Observed::Removing { id, names, pinned, used_by } => {
                self.stats.removals += 1;
                let name = names.first().cloned().unwrap_or_default();
                if !used_by.is_empty()
                    && let Some(&(inc, sent)) = self.kubelet_removing.get(&id)
                {
                    // The kubelet's GC saw the image unused, then a pod was
                    // given it: its own race, unless imaged's front must
                    // refuse (cri_server.refuse_remove_in_use) — a give by
                    // the front's process within the minimum age (the
                    // shortest in force since the remove was sent: the
                    // front follows a reload a moment later).
                    let min_age = self.facts.min_age.shortest(sent, self.now);
                    if let Some((_, at)) =
                        self.given.get(&id).filter(|(by, at)| *by == inc && inc != 0 && *at + min_age >= self.now)
                    {
                        return Err(self.fail(
                            "in-use-kept",
                            format!(
                                "the kubelet's RemoveImage through the front of imaged#{inc} removed image {name} ({}), which container(s) {} use, though imaged gave it to a pod at {:.3}s, within gc.image_minimum_gc_age ({}): cri_server.refuse_remove_in_use keeps it",
                                short(&id),
                                used_by.join(", "),
                                at.as_secs_f64(),
                                crate::domain::go_text::duration(min_age),
                            ),
                        ));
                    }
                } else if !used_by.is_empty() {
                    return Err(self.fail(
                        "in-use-kept",
                        format!(
                            "image {name} ({}) removed while container(s) {} use it",
                            short(&id),
                            used_by.join(", ")
                        ),
                    ));
                }
                if pinned {
                    return Err(self.fail(
                        "in-use-kept",
                        format!("image {name} ({}) removed though the runtime pins it", short(&id)),
                    ));
                }
                if self.facts.sandbox_id.as_deref() == Some(id.as_str()) {
                    return Err(
                        self.fail("in-use-kept", format!("the sandbox image {name} ({}) was removed", short(&id)))
                    );
                }
                if let Some(n) = names.iter().find(|n| self.facts.pinned.iter().any(|p| p.matches(n))) {
                    return Err(self.fail(
                        "in-use-kept",
                        format!("image {n} ({}) removed though gc.pinned_images matches it", short(&id)),
                    ));
                }
                self.acked.remove(&id);
                self.removed.insert(id);
            }
        }
        Ok(())
    }

    /// The back-off model: client-go's `Backoff` per (pod UID, image),
    /// reset when a new process starts (it is in memory only).
    fn event(&mut self, inc: u32, reason: EventReason, uid: &str, image: &str) -> Result<(), Violation> {
        if inc != self.backoff_inc {
            self.backoff_inc = inc;
            self.backoff.clear();
        }
        let key = (uid.to_string(), image.to_string());
        let now = self.now;
        let entry = self.backoff.get(&key).copied();
        match reason {
            EventReason::Failed => {
                // A recovery at this very instant may be handled after this failure.
                let maybe_reset = self.registry_ok.get(registry_of(image)) == Some(&now);
                let next = |entry: Option<Backoff>, (initial, max): (Duration, Duration)| match entry {
                    // Never below the initial period: a reload may have raised it.
                    Some(b) if now.saturating_sub(b.last) <= 2 * max => Backoff {
                        last: now,
                        lo: if b.maybe_reset { initial } else { (b.lo * 2).min(max).max(initial) },
                        hi: (b.hi * 2).min(max).max(initial),
                        maybe_reset,
                        was_hi: (b.hi * 2).min(max).max(initial),
                    },
                    _ => Backoff { last: now, lo: initial, hi: initial, maybe_reset, was_hi: initial },
                };
                let (initial, max) = (self.facts.initial, self.facts.max);
                let mut b = next(entry, (initial, max));
                // A reload at this very instant may be handled after this
                // failure: then the old delays made its period from the
                // entry as it was, and the reload then raised the period
                // (just begun, so running) and cut it (see `reloaded`).
                if let Some((at, old)) = self.reload_at
                    && at == now
                {
                    let o = next(self.before_reload.get(&key).copied(), old);
                    b.lo = b.lo.min(o.lo.max(initial).min(max));
                    b.hi = b.hi.max(o.hi.max(initial).min(max));
                    b.was_hi = b.hi;
                }
                self.backoff.insert(key, b);
            }
            // At a reload's very instant the registry may have answered
            // before it took the new delays.
            EventReason::BackOff
                if entry.is_none_or(|b| {
                    let hi = if self.reload_at.is_some_and(|(at, _)| at == now) { b.hi.max(b.was_hi) } else { b.hi };
                    now.saturating_sub(b.last) >= hi
                }) =>
            {
                let why = match entry {
                    None => "no failure is on record".to_string(),
                    Some(b) => format!(
                        "the last failure was {} ago, the period is {}",
                        secs(now.saturating_sub(b.last)),
                        secs(b.hi)
                    ),
                };
                return Err(self.fail("backoff-law", format!("pod {uid} got BackOff for {image} though {why}")));
            }
            EventReason::Pulling => {
                if let Some(b) = entry
                    && !b.maybe_reset
                    && now.saturating_sub(b.last) < b.lo
                {
                    return Err(self.fail(
                        "backoff-law",
                        format!(
                            "pod {uid} pulled {image} {} after a failure, inside its back-off period of {}",
                            secs(now.saturating_sub(b.last)),
                            secs(b.lo)
                        ),
                    ));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A reload applied `cfg` to the serving process now. Bounds on waits
    /// keep the slowest rates seen (a pull may still wait on the old
    /// bucket when the reload lands), the minimum age the longest (a GC run
    /// may have begun under the old one); the back-off model follows the
    /// registry's `UpdateBackoffDelays`: entries expired under the old cap
    /// are gone, a period still running is raised to the new initial one,
    /// and every period is cut to the new cap. The model keeps ranges, so
    /// each bound moves the safe way (`lo` only down, `hi` only up).
    /// Unchanged delays change nothing (the node sends none).
    fn reloaded(&mut self, cfg: &Config) {
        let now = self.now;
        let old = (self.facts.initial, self.facts.max);
        let f = &mut self.facts;
        f.qps.set(now, cfg.pull.qps);
        f.parallel.set(now, cfg.pull.concurrency.limit());
        f.registry_token.set(now, registry_token(cfg));
        f.registry_limits.set(now, RegistryLimits::of(cfg));
        f.min_age.set(now, cfg.gc.min_age);
        (f.initial, f.max) = (cfg.backoff.delays.initial, cfg.backoff.delays.max);
        f.maxes.set(now, f.max);
        let (initial, max) = (f.initial, f.max);
        if (initial, max) == old {
            // Unchanged delays are not sent to the registry.
            return;
        }
        self.before_reload = self.backoff.clone();
        self.backoff.retain(|_, b| now.saturating_sub(b.last) <= 2 * old.1);
        for b in self.backoff.values_mut() {
            // The registry raises a period still running to the initial
            // one, then cuts every period to the cap; the model knows the
            // period within lo..=hi, so whether it still runs may be known.
            let since = now.saturating_sub(b.last);
            b.was_hi = b.hi;
            if since < b.lo {
                (b.lo, b.hi) = (b.lo.max(initial).min(max), b.hi.max(initial).min(max));
            } else if since >= b.hi {
                (b.lo, b.hi) = (b.lo.min(max), b.hi.min(max));
            } else {
                (b.lo, b.hi) = (b.lo.min(max), b.hi.max(initial).min(max));
            }
        }
        self.reload_at = Some((now, old));
    }

    /// A pull of `image` succeeded for an ensure (which then sends
    /// `RegistryRecovered`, fire and forget, at this instant): back-offs
    /// from its registry may be reset from now on, in either order with a
    /// failure recorded at the same instant.
    fn registry_recovered(&mut self, image: &str) {
        if !self.facts.registry_reset {
            return;
        }
        let registry = registry_of(image).to_string();
        for ((_, i), b) in &mut self.backoff {
            if registry_of(i) == registry {
                b.maybe_reset = true;
            }
        }
        self.registry_ok.insert(registry, self.now);
    }

    /// An ensure's answer: kinds of answers, KEP-2535, what it acknowledges.
    fn answered(&mut self, id: u64, answer: &Answer) -> Result<(), Violation> {
        let Some((began, inc, pod, container, _)) = self.pending.remove(&id) else {
            match answer {
                Answer::Lost | Answer::NoNode => self.stats.ensure_lost += 1,
                _ => {}
            }
            return Ok(());
        };
        self.ensure_ended(pod, container);
        let p = &self.plan.pods[pod];
        let image = IMAGES[p.containers[container].image];
        match answer {
            Answer::Ok(ok) => {
                self.stats.ensure_ok += 1;
                self.ensured.insert(ok.image_ref.clone(), self.now);
                gave(&mut self.given, &ok.image_ref, inc, began);
                let own = image.access == Access::Secret && p.secret.valid();
                if image.private()
                    && !own
                    && !self.node_pulled.contains(&ok.image_ref)
                    && !self.exempt(pod, container, &ok.image_ref)
                {
                    return Err(self.fail(
                        "kep2535",
                        format!(
                            "pod {}/{} (secret {:?}) was given the private image {} ({}) it cannot pull itself and the node's credentials never pulled, under {}",
                            p.namespace,
                            p.name,
                            p.secret,
                            image.name,
                            short(&ok.image_ref),
                            self.facts.policy
                        ),
                    ));
                }
                if ok.message.is_empty()
                    && let Some(repo) = image_repo(image.name)
                {
                    let secret = if image.access == Access::Secret { p.secret } else { SecretKind::None };
                    let every_pods = !secret.valid() || self.node_pulled.contains(&ok.image_ref);
                    let ack =
                        Ack { repo, secret, key: image_key(image.name), unsynced_of: if every_pods { inc } else { 0 } };
                    self.acked.entry(ok.image_ref.clone()).or_default().push(ack);
                }
            }
            Answer::Err(e) => {
                self.stats.ensure_err += 1;
                if e.kind == crate::domain::ImageErrorKind::ErrImagePull {
                    self.stall_cancel(id, image.name, began, &e.message)?;
                }
                if e.message.is_empty() {
                    return Err(
                        self.fail("ensure-answered", format!("ensure #{id} failed with {} and no message", e.kind))
                    );
                }
            }
            Answer::Node(NodeError::ShuttingDown) => self.stats.ensure_err += 1,
            Answer::Node(e) => {
                if !self.stopping.contains(&inc) {
                    return Err(self.fail("actors-alive", format!("ensure #{id} of imaged#{inc}, which serves: {e}")));
                }
            }
            Answer::Lost | Answer::NoNode => self.stats.ensure_lost += 1,
        }
        Ok(())
    }

    /// The kubelet's steps through the CRI front for a container ended: a
    /// pull answered is KEP-2535's to check (the front pulls with the
    /// call's one credential, never the node's: the registry must have
    /// taken it); an image found present is the kubelet's own business
    /// (this kubelet verifies nothing), but counts as ensured for GC, as
    /// the front tells its hints. A pull is checked whether or not its
    /// call still counts (its process may have been killed as it answered:
    /// the rest is then the lost call's, as for an ensure).
    fn front_answered(
        &mut self,
        id: u64,
        pod: usize,
        container: usize,
        outcome: &FrontOutcome,
    ) -> Result<(), Violation> {
        self.stats.front += 1;
        let pending = self.pending.remove(&id);
        let inc = pending.map_or(0, |p| p.1);
        if pending.is_some() {
            self.ensure_ended(pod, container);
        } else {
            self.stats.ensure_lost += 1;
        }
        let p = &self.plan.pods[pod];
        let image = IMAGES[p.containers[container].image];
        // The front pulls with the call's credential only: the registry
        // must have taken it. Its outage fallback (told by its event before
        // it answers) gives the image on the node as an ensure's does: to
        // a pod that cannot pull it only when the node's credentials
        // pulled it or the policy exempts it.
        let key = (p.uid.clone(), image.name.to_string());
        let fell_back = match self.fell_back.get_mut(&key) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => self.fell_back.remove(&key).is_some(),
            None => false,
        };
        if fell_back && matches!(outcome, FrontOutcome::Pulled(_)) {
            self.stats.fallback_used += 1;
        }
        let own = image.access == Access::Secret && p.secret.valid();
        let leak = |c: &Self, image_id: &str| {
            image.private()
                && !own
                && !(fell_back && (c.node_pulled.contains(image_id) || c.exempt(pod, container, image_id)))
        };
        if pending.is_none() {
            if let FrontOutcome::Pulled(image_id) = outcome
                && leak(self, image_id)
            {
                return Err(self.fail("kep2535", front_leak(p, image.name, image_id)));
            }
            return Ok(());
        }
        let began = pending.map_or(self.now, |p| p.0);
        match outcome {
            FrontOutcome::Present(image_id) => {
                self.stats.ensure_ok += 1;
                self.ensured.insert(image_id.clone(), self.now);
                gave(&mut self.given, image_id, inc, began);
            }
            FrontOutcome::Pulled(image_id) => {
                self.stats.ensure_ok += 1;
                self.ensured.insert(image_id.clone(), self.now);
                gave(&mut self.given, image_id, inc, began);
                if leak(self, image_id) {
                    return Err(self.fail("kep2535", front_leak(p, image.name, image_id)));
                }
            }
            FrontOutcome::NeverPull => self.stats.ensure_err += 1,
            FrontOutcome::Failed(_, message) => {
                self.stats.ensure_err += 1;
                self.stall_cancel(id, image.name, began, message)?;
                if message.contains("the image on the node was not used") {
                    self.stats.fallback_refused += 1;
                }
                if message.is_empty() {
                    return Err(self.fail(
                        "ensure-answered",
                        format!("ensure #{id} through the CRI front failed with no message"),
                    ));
                }
                if message.contains("pull queue has stopped") && !self.stopping.contains(&inc) {
                    return Err(self.fail(
                        "actors-alive",
                        format!("ensure #{id} through the front of imaged#{inc}, which serves: {message}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// An ensure of `image` begun at `began` failed with `message`: if imaged
    /// cancelled its pull for a stall, a call of the image must have ended
    /// since, its download stalled for `pull.stall_timeout` or more.
    fn stall_cancel(&mut self, id: u64, image: &str, began: Duration, message: &str) -> Result<(), Violation> {
        if !message.contains(STALL_CANCEL) {
            return Ok(());
        }
        self.stats.stall_cancels += 1;
        let Some(check) = self.plan.stall_check else {
            return Err(self.fail(
                "stall-cancel",
                format!("ensure #{id} of {image} failed with a stall cancel, but pull.stall_timeout is off: {message}"),
            ));
        };
        if self.stalled_out.get(&image_key(image)).is_some_and(|at| *at >= began) {
            return Ok(());
        }
        Err(self.fail(
            "stall-cancel",
            format!(
                "ensure #{id} of {image} (begun at {}) failed with a stall cancel, but no PullImage of it ended since with its download idle{} for pull.stall_timeout ({}): {message}",
                secs(began),
                if check.min_rate > 0 { " or under pull.min_download_rate" } else { "" },
                crate::domain::go_text::duration(check.timeout)
            ),
        ))
    }

    /// Follows the one stalled call alone in the runtime for the serving
    /// process on a clean wire (one the check must cancel).
    fn watch_alone(&mut self) {
        let Some(check) = self.plan.stall_check else { return };
        let serving = self.inc != 0 && !self.stopping.contains(&self.inc);
        let mut mine = self.open.iter().filter(|(_, p)| serving && p.inc == self.inc);
        let one = match (mine.next(), mine.next()) {
            (Some((call, p)), None) if self.clean_since.is_some() && p.stall.is_some_and(|d| d.judged(&check)) => {
                Some(*call)
            }
            _ => None,
        };
        self.alone = match (one, self.alone) {
            (Some(c), Some((a, since))) if a == c => Some((a, since)),
            (Some(c), _) => Some((c, self.now)),
            (None, _) => None,
        };
    }

    /// A stalled call alone in the runtime on a clean wire ends within the
    /// stall timeout and two checks of its stall (and a little slack).
    fn stall_bound(&self) -> Result<(), Violation> {
        let (Some(check), Some((call, alone)), Some(one_running)) =
            (self.plan.stall_check, self.alone, self.one_running_since)
        else {
            return Ok(());
        };
        let Some(p) = self.open.get(&call) else { return Ok(()) };
        let Some(StalledDownload { at: stalled, drips, .. }) = p.stall else { return Ok(()) };
        let alone = alone.max(one_running);
        let from = alone.max(stalled).max(self.clean_since.unwrap_or(alone));
        let bound = check.timeout + 2 * check.period() + STALL_SLACK;
        if self.now <= from + bound {
            return Ok(());
        }
        Err(self.fail(
            "stall-cancel",
            format!(
                "PullImage #{call} of {}, its download {} since {}, alone in the runtime on a clean wire since {}, still runs at {} (pull.stall_timeout {}, checked every {}, bound {})",
                p.image,
                if drips > 0 { "dripping" } else { "stalled" },
                secs(stalled),
                secs(alone.max(self.clean_since.unwrap_or(alone))),
                secs(self.now),
                crate::domain::go_text::duration(check.timeout),
                crate::domain::go_text::duration(check.period()),
                secs(bound)
            ),
        ))
    }

    /// An ensure of `pod`'s `container` stopped being in flight.
    fn ensure_ended(&mut self, pod: usize, container: usize) {
        let image = IMAGES[self.plan.pods[pod].containers[container].image].name;
        self.busy_until.insert(image_key(image), self.now);
    }

    /// Whether the policy lets any pod use this present image: a preloaded
    /// image imaged never pulled, under a policy that exempts it.
    fn exempt(&self, pod: usize, container: usize, image_ref: &str) -> bool {
        let i = self.plan.pods[pod].containers[container].image;
        let preloaded = self.plan.preloaded.contains(&i) && !self.pulled_ids.contains(image_ref);
        match self.facts.policy {
            VerificationPolicy::NeverVerify => true,
            VerificationPolicy::NeverVerifyPreloadedImages => preloaded,
            VerificationPolicy::NeverVerifyAllowlistedImages => {
                preloaded && self.facts.allowlist_private && IMAGES[i].access == Access::Secret
            }
            VerificationPolicy::AlwaysVerify => false,
        }
    }

    /// A GC report: the target arithmetic and the reasons it keeps images.
    fn gc_report(&mut self, r: &GcReport) -> Result<(), Violation> {
        if r.dry_run || !self.reports.insert(r.started) {
            return Ok(());
        }
        self.stats.gc_reports += 1;
        if r.mode == GcMode::Threshold && r.amount_to_free > 0 {
            let space: Vec<u64> = r
                .entries
                .iter()
                .filter(|e| e.verdict == Verdict::Delete(DeleteReason::Space))
                .map(|e| e.size)
                .collect();
            let before_last: u64 = space.iter().rev().skip(1).sum();
            if !space.is_empty() && before_last >= r.amount_to_free {
                return Err(self.fail(
                    "gc-target",
                    format!(
                        "GC planned {} removals for space though the first {} already free {before_last} of the {} bytes needed",
                        space.len(),
                        space.len() - 1,
                        r.amount_to_free
                    ),
                ));
            }
            let planned: u64 = space.iter().sum();
            if planned < r.amount_to_free
                && let Some(kept) = r.entries.iter().find(|e| e.verdict == Verdict::Keep(KeepReason::NotNeeded))
            {
                return Err(self.fail(
                    "gc-target",
                    format!(
                        "GC kept {} as not needed though its removals free only {planned} of the {} bytes needed",
                        kept.repo_tags.first().map_or(kept.id.as_str(), String::as_str),
                        r.amount_to_free
                    ),
                ));
            }
        }
        let started = sim_time(r.started).unwrap_or(Duration::ZERO);
        for e in &r.entries {
            if e.verdict != Verdict::Keep(KeepReason::InUse) || self.in_use_since(&e.id, &e.repo_tags, started) {
                continue;
            }
            // Kept by the restart grace alone: then that must be all GC
            // says (a container or ensure it names must be real).
            let grace_only = e.used_by.iter().all(|u| u == crate::gc::in_use::ENSURED_BEFORE_RESTART);
            if grace_only && !e.used_by.is_empty() && self.in_restart_grace(started) {
                continue;
            }
            return Err(self.fail(
                "gc-reasons",
                format!(
                    "GC (run at {}) kept {} ({}) as in use by {:?}, but no container, recent ensure or pull uses it",
                    secs(started),
                    e.repo_tags.first().map_or("", String::as_str),
                    short(&e.id),
                    e.used_by
                ),
            ));
        }
        Ok(())
    }

    /// Whether a GC run that began at `started` is within one minimum-age
    /// window of a start, when every image may have been ensured just
    /// before the restart, recorded or not.
    fn in_restart_grace(&self, started: Duration) -> bool {
        self.restart_grace.is_some_and(|until| started <= until + Duration::from_secs(1))
    }

    /// Whether something used image `id` around a GC run that began at
    /// `started`: a container on it since shortly before, an ensure of it
    /// within the minimum age, or a pull of one of its names in flight
    /// (now, or until shortly before: the report is checked after the run).
    fn in_use_since(&self, id: &str, tags: &[String], started: Duration) -> bool {
        let slack = Duration::from_secs(1);
        // The detector's window is the minimum age in force at its last
        // detection, which may be a while before the run (any value in
        // force over the longest GC period, 5 m, drawn, before it) or
        // during it, after a reload (the run's own detection comes after
        // it measured the disk, which may take a while: seeds 6123 and
        // 6362, found with the store's latency): up to now, when the report
        // is checked.
        let min_age =
            self.facts.min_age.longest(started.saturating_sub(Duration::from_secs(600)), self.now.max(started));
        let window = started.saturating_sub(min_age + slack);
        if self.containers.contains_key(id)
            || self.used.get(id).is_some_and(|t| *t + slack >= started)
            || self.ensured.get(id).is_some_and(|t| *t >= window)
        {
            return true;
        }
        let pulling = |image: &str| tags.iter().any(|t| image_key(t) == image_key(image));
        if tags.iter().any(|t| {
            let key = image_key(t);
            self.prefetching.contains_key(&key) || self.busy_until.get(&key).is_some_and(|t| *t + slack >= started)
        }) {
            return true;
        }
        self.open.values().any(|p| pulling(&p.image))
            || self
                .pending
                .values()
                .any(|(_, _, pod, c, _)| pulling(IMAGES[self.plan.pods[*pod].containers[*c].image].name))
    }

    /// Checks at the end of a step, with what the actors say.
    pub fn step_end(&mut self, now: Duration, view: &StepView) -> Result<(), Violation> {
        self.now = now;
        if let Some((at, call, others)) = self.suspects.first() {
            let p = self.open.get(call).or_else(|| others.iter().find_map(|c| self.open.get(c)));
            let image = p.map_or("?", |p| p.image.as_str());
            return Err(self.fail(
                "single-flight",
                format!("three PullImage calls of {image} with the same credentials in flight at {}: #{call} and {others:?}", secs(*at)),
            ));
        }
        self.ensure_bounds()?;
        self.watch_alone();
        let one = view.inc == self.inc && self.inc != 0 && view.queue.is_some_and(|q| q.running == 1);
        self.one_running_since = if one { self.one_running_since.or(Some(now)) } else { None };
        self.stall_bound()?;
        self.pull_bounds(view)?;
        if let Some(r) = &view.last_gc {
            self.gc_report(r)?;
        }
        Ok(())
    }

    /// The longest an ensure may take, when a pull deadline bounds pulls:
    /// presence check, then (twice: a present image a pod may not use is
    /// pulled again) a wait behind every pull outstanding meanwhile and its
    /// own, each a re-check, a throttle token and the pull, then the size.
    /// `since`: when the ensure began (the rates in force since count).
    fn ensure_bound(&self, outstanding: usize, since: Duration) -> Option<Duration> {
        let pull = self.facts.pull_deadline?;
        // The registry's token, then the node's (one after the other), at
        // the slowest rates in force since the ensure began.
        let node_token = self
            .facts
            .qps
            .during(since, self.now)
            .filter(|(qps, _)| *qps > 0.0)
            .map(|(qps, _)| Duration::from_secs_f64(1.0 / qps))
            .max()
            .unwrap_or(Duration::ZERO);
        let token = node_token + self.facts.registry_token.longest(since, self.now);
        let slot = self.facts.cri + token + pull;
        let n = u32::try_from(outstanding + 1).unwrap_or(u32::MAX);
        Some(3 * self.facts.cri + 2 * slot.saturating_mul(n) + Duration::from_secs(1))
    }

    fn ensure_bounds(&self) -> Result<(), Violation> {
        for (id, (at, inc, pod, c, n)) in &self.pending {
            let Some(bound) = self.ensure_bound(*n, *at) else { continue };
            let waited = self.now.saturating_sub(*at);
            if waited > bound {
                let p = &self.plan.pods[*pod];
                return Err(self.fail(
                    "ensure-answered",
                    format!(
                        "ensure #{id} of {} for {}/{} (imaged#{inc}) unanswered after {} (bound {} with {n} outstanding)",
                        IMAGES[p.containers[*c].image].name,
                        p.namespace,
                        p.name,
                        secs(waited),
                        secs(bound)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Pulls in flight at the runtime from the serving process within the
    /// parallel and per-registry limits; waiting pulls within the queue's
    /// capacity; back-off entries within what failed recently.
    fn pull_bounds(&self, view: &StepView) -> Result<(), Violation> {
        let mine: Vec<&OpenPull> = self.open.values().filter(|p| p.inc == self.inc && self.inc != 0).collect();
        // Pulls begun under a higher limit (before a reload lowered it)
        // keep running: the highest limit in force since the earliest began.
        if let Some(first) = mine.iter().map(|p| p.since).min() {
            let allowed = self.facts.parallel.during(first, self.now).map(|(l, _)| l).max().unwrap_or(usize::MAX);
            if mine.len() > allowed {
                return Err(self.fail(
                    "bounded",
                    format!("{} PullImage calls in flight, more than the {allowed} allowed", mine.len()),
                ));
            }
        }
        for r in REGISTRIES {
            let from_r: Vec<&&OpenPull> = mine.iter().filter(|p| registry_of(&p.image) == r).collect();
            let Some(first) = from_r.iter().map(|p| p.since).min() else { continue };
            // Pulls that began under a higher limit (before a reload lowered
            // it) keep running: the highest limit in force since the
            // earliest of them began.
            let limits: Vec<Option<usize>> =
                self.facts.registry_limits.during(first, self.now).map(|(l, _)| l.of_registry(r)).collect();
            if let Some(limit) =
                limits.iter().copied().collect::<Option<Vec<usize>>>().and_then(|l| l.into_iter().max())
            {
                let n = from_r.len();
                if n > limit {
                    return Err(
                        self.fail("bounded", format!("{n} pulls from {r} in flight, more than its limit of {limit}"))
                    );
                }
            }
        }
        if view.inc == 0 || view.inc != self.inc {
            return Ok(());
        }
        if let (Some(q), Some(cap)) = (&view.queue, self.facts.queue_capacity) {
            // Registries' own rates or limits bound each registry's waiting pulls.
            // Limits may come and go with reloads: pulls admitted under a
            // registry's share of the queue stay when the shares go.
            let by_registry = self.facts.registry_limits.during(Duration::ZERO, self.now).any(|(l, _)| l.any())
                || self.facts.registry_token.during(Duration::ZERO, self.now).any(|(t, _)| !t.is_zero());
            let per = if by_registry { REGISTRIES.len() } else { 1 };
            if q.queued > cap * per {
                return Err(self.fail(
                    "bounded",
                    format!("{} pulls wait in the queue, more than its capacity of {cap}", q.queued),
                ));
            }
        }
        if let Some(b) = &view.backoffs {
            // An entry stays while it has not expired under the cap in force
            // (twice it) and until the next periodic GC: the longest such
            // window of any cap in force within it.
            let keep = |max: Duration| 2 * max + self.facts.backoff_gc + Duration::from_secs(1);
            let window = self
                .facts
                .maxes
                .during(Duration::ZERO, self.now)
                .filter(|(max, until)| *until == Duration::MAX || self.now.saturating_sub(*until) <= keep(*max))
                .map(|(max, _)| keep(max))
                .max()
                .unwrap_or_else(|| keep(self.facts.max));
            let recent = self.backoff.values().filter(|e| self.now.saturating_sub(e.last) <= window).count();
            if b.len() > recent {
                return Err(self.fail(
                    "bounded",
                    format!(
                        "{} back-off entries kept, but only {recent} keys failed in the last {}",
                        b.len(),
                        secs(window)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The store as the next process finds it, after `inc` ended.
    /// `present`: the runtime's images then, by id and runtime handler.
    pub fn restarted(&mut self, snapshot: Snapshot, present: &BTreeSet<(String, String)>) -> Result<(), Violation> {
        self.stats.store_checks += 1;
        for key in std::mem::take(&mut self.in_flight_at_kill) {
            if !snapshot.intents.contains(&key) {
                return Err(self.fail(
                    "durable",
                    format!("a pull of {key} was in flight at the runtime, but no intent for it is on disk"),
                ));
            }
        }
        // A record that lets every pod use the image is written unsynced
        // (pull_records, "Unsynced"): a kill of the process that wrote it
        // may lose it before anything synced it, and then the pull's
        // intent must be on disk (so the next start makes pods pull it
        // again), and it is no promise from then on. Seen on disk once, or
        // after a graceful stop, it must stay.
        let killed = match self.ended {
            Some((inc, true)) => inc,
            _ => 0,
        };
        let mut unguarded = None;
        let dropped = &mut self.stats.unsynced_lost;
        for (image_ref, acks) in &mut self.acked {
            let record = snapshot.records.get(image_ref.as_str());
            let mut lost = None;
            acks.retain_mut(|a| {
                if a.unsynced_of == 0 {
                    return true;
                }
                let kept = record
                    .and_then(|r| r.credential_mapping.get(&a.repo))
                    .is_some_and(|c| c.node_pods_accessible || (a.secret.valid() && !c.kubernetes_secrets.is_empty()));
                if kept || a.unsynced_of != killed {
                    a.unsynced_of = 0;
                    return true;
                }
                if !snapshot.intents.contains(&a.key) {
                    lost.get_or_insert_with(|| a.key.clone());
                }
                *dropped += 1;
                false
            });
            if let Some(key) = lost {
                unguarded.get_or_insert((image_ref.clone(), key));
            }
        }
        if let Some((image_ref, key)) = unguarded {
            return Err(self.fail(
                "durable",
                format!(
                    "the pulled record of {} (every pod's, acknowledged) was lost, and no intent for {key} is on disk",
                    short(&image_ref)
                ),
            ));
        }
        self.acked.retain(|_, acks| !acks.is_empty());
        for (image_ref, acks) in &self.acked {
            let Some(record) = snapshot.records.get(image_ref) else {
                return Err(self.fail(
                    "durable",
                    format!("the pulled record of {} (acknowledged) is not on disk", short(image_ref)),
                ));
            };
            for Ack { repo, secret, .. } in acks {
                let Some(creds) = record.credential_mapping.get(repo) else {
                    return Err(self.fail(
                        "durable",
                        format!(
                            "the pulled record of {} has no credentials for {repo}, acknowledged before",
                            short(image_ref)
                        ),
                    ));
                };
                let covered = match secret {
                    SecretKind::None => creds.node_pods_accessible,
                    _ => creds.node_pods_accessible || !creds.kubernetes_secrets.is_empty(),
                };
                if !covered {
                    return Err(self.fail(
                        "durable",
                        format!(
                            "the pulled record of {} for {repo} lost the credentials acknowledged ({secret:?})",
                            short(image_ref)
                        ),
                    ));
                }
            }
        }
        let now = SystemTime::UNIX_EPOCH + super::world::SIM_EPOCH + self.now;
        for r in snapshot.images.values() {
            let from = SystemTime::UNIX_EPOCH + super::world::SIM_EPOCH;
            if r.first_detected < from || r.first_detected > now || r.last_used.is_some_and(|u| u > now) {
                return Err(self.fail(
                    "durable",
                    format!("the image record of {} has first detected {:?}, last used {:?}: not between the run's start and now", short(&r.key.id), r.first_detected, r.last_used),
                ));
            }
        }
        if let Some((before, then)) = &self.last_snapshot {
            for (key, r) in &before.images {
                // A record of an image removed (since, or before with the
                // process killed before a detection forgot it, or pulled
                // again for another runtime handler) is no promise.
                let id = &key.0;
                if self.removed.contains(id) || !present.contains(key) || !then.contains(key) {
                    continue;
                }
                match snapshot.images.get(key) {
                    Some(now) if now.first_detected == r.first_detected => {}
                    Some(now) => {
                        return Err(self.fail(
                            "durable",
                            format!(
                                "image {} kept on the node, but its first detection moved from {:?} to {:?}",
                                short(id),
                                r.first_detected,
                                now.first_detected
                            ),
                        ));
                    }
                    None => {
                        return Err(self
                            .fail("durable", format!("image {} kept on the node, but its record is gone", short(id))));
                    }
                }
            }
        }
        self.removed.clear();
        self.last_snapshot = Some((snapshot, present.clone()));
        Ok(())
    }

    /// Liveness at the end of the quiet phase: every pod that is live and
    /// can start has started, and no ensure waits.
    pub fn finish(&mut self, started: &dyn Fn(usize) -> (bool, bool)) -> Result<(), Violation> {
        // The kubelet keeps retrying pods that cannot start: an ensure asked
        // shortly before the end may be waiting on its pull.
        let now = self.now;
        if let Some((id, (at, inc, ..))) = self.pending.iter().find(|(_, p)| now.saturating_sub(p.0) > LIVENESS_WAIT) {
            return Err(self.fail(
                "liveness",
                format!(
                    "ensure #{id} (imaged#{inc}, since {}) unanswered after {}",
                    secs(*at),
                    secs(now.saturating_sub(*at))
                ),
            ));
        }
        if self.inc == 0 {
            return Err(self.fail("liveness", "no imaged serves at the end of the quiet phase".into()));
        }
        for (i, p) in self.plan.pods.iter().enumerate() {
            let (live, all_started) = started(i);
            if !live || all_started {
                continue;
            }
            // A pod's own pull deadline shorter than its image's pull time
            // (with room for a wait in the queue) fails every pull it makes.
            let in_time = |latency_ms: u64| p.deadline.is_none_or(|d| d >= 2 * Duration::from_millis(latency_ms));
            let front = self.plan.via_front(i);
            let can = p.containers.iter().all(|c| {
                c.policy != crate::domain::pull_policy::PullPolicy::Never
                    && if front {
                        self.plan.front_can_pull(c.image, p.secret)
                    } else {
                        self.plan.can_pull(c.image, p.secret)
                    }
                    && in_time(IMAGES[c.image].latency_ms)
            });
            if can {
                return Err(self.fail(
                    "liveness",
                    format!("pod {}/{} never started, though all its images can be pulled", p.namespace, p.name),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
