//! One run's plan, all of it drawn from the seed before the run starts: the
//! node's settings (as `--set` overrides, validated like an operator's),
//! the registries' images, the pods, and the schedule — one event and one
//! stretch of time per step. Nothing the run observes feeds back into the
//! plan, so a step can be dropped (the shrinker does) and the rest still
//! means the same.

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng};

use crate::cri::{CriErrorKind, Rpc};
use crate::domain::pull_policy::PullPolicy;

/// One image the simulated registries serve (or, `exists: false`, do not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimImage {
    /// The reference pods use.
    pub name: &'static str,
    /// Bytes on disk once pulled.
    pub size: u64,
    /// How long a pull takes.
    pub latency_ms: u64,
    /// In the private registry (needs [`PRIVATE_USER`]'s password).
    pub private: bool,
    /// In a registry at all (a pod naming it never starts).
    pub exists: bool,
    /// Another name of the image at this index (the same content).
    pub alias_of: Option<usize>,
}

const MB: u64 = 1_000_000;

const fn image(name: &'static str, size_mb: u64, latency_ms: u64) -> SimImage {
    SimImage { name, size: size_mb * MB, latency_ms, private: false, exists: true, alias_of: None }
}

/// The registries' images. Index 0 is the sandbox image.
pub const IMAGES: [SimImage; 15] = [
    image("registry.k8s.io/pause:3.10", 1, 200),
    image("docker.io/library/busybox:1.36", 4, 500),
    image("docker.io/library/nginx:1.27", 190, 2_000),
    image("docker.io/library/redis:7", 140, 2_000),
    image("docker.io/library/python:3.12", 1_000, 8_000),
    image("docker.io/library/postgres:16", 430, 5_000),
    image("quay.example/shop/web:v1", 300, 3_000),
    image("quay.example/shop/web:v2", 310, 3_000),
    image("quay.example/shop/api:v1", 250, 3_000),
    SimImage { private: true, ..image("private.example/billing/ledger:2", 600, 4_000) },
    SimImage { private: true, ..image("private.example/billing/invoicer:1", 350, 4_000) },
    image("slow.example/analytics/worker:3", 1_500, 40_000),
    image("slow.example/ml/trainer:1", 2_500, 60_000),
    SimImage { alias_of: Some(2), ..image("docker.io/library/nginx:latest", 190, 2_000) },
    SimImage { exists: false, ..image("ghcr.example/missing/app:1", 100, 1_000) },
];

/// The sandbox image's index in [`IMAGES`].
pub const SANDBOX: usize = 0;

/// Registries (image name prefixes) an outage can take down.
pub const REGISTRIES: [&str; 5] = ["docker.io", "quay.example", "private.example", "slow.example", "registry.k8s.io"];

/// The private registry's user.
pub const PRIVATE_USER: &str = "billing";
/// Its password (what a right secret holds).
pub const PRIVATE_PASSWORD: &str = "s3cret-ledger";
/// What a stale secret holds.
pub const WRONG_PASSWORD: &str = "expired-2024";

/// A pod's pull secret, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretKind {
    /// None.
    None,
    /// `billing/regcred`: the right password.
    Right,
    /// `shop/regcred`: the right password under other coordinates.
    RightElsewhere,
    /// `billing/oldcred`: a wrong password.
    Wrong,
}

impl SecretKind {
    /// Whether its credentials pull private images.
    pub fn valid(self) -> bool {
        matches!(self, Self::Right | Self::RightElsewhere)
    }
}

/// One container of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimContainer {
    /// Its name.
    pub name: String,
    /// Index of its image in [`IMAGES`].
    pub image: usize,
    /// Its pull policy.
    pub policy: PullPolicy,
}

/// One pod of the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Pull priority.
    pub priority: i32,
    /// Its pull secret.
    pub secret: SecretKind,
    /// RuntimeClass handler (`""` = default).
    pub runtime_handler: String,
    /// A pull deadline on its ensures.
    pub deadline: Option<Duration>,
    /// Containers, ensured in order.
    pub containers: Vec<SimContainer>,
    /// Seed of its kubelet's retry jitter.
    pub jitter_seed: u64,
}

/// A fault rule as the plan draws it (turned into a `FaultRule` at run time).
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    /// The call kind.
    pub rpc: Rpc,
    /// Only images matching this glob.
    pub image: Option<String>,
    /// Chance per matching call.
    pub probability: f64,
    /// What happens.
    pub action: FaultKind,
}

/// What a fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The call fails at once with this kind of error.
    Fail(CriErrorKind),
    /// The call waits this long first.
    Delay(Duration),
    /// The call never answers (its deadline ends it).
    Hang,
    /// The call's effect happens but its answer is lost.
    DropReply,
}

/// Which back-offs an operator clears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClearWhat {
    /// Every one.
    All,
    /// One pod's.
    Pod(usize),
    /// One image's.
    Image(usize),
}

/// One step's event.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Only time passes.
    Nothing,
    /// A pod is bound to the node: its kubelet worker starts.
    PodArrives(usize),
    /// A pod's containers exit (they keep their images in use).
    PodCompletes(usize),
    /// A pod is deleted: its containers and sandbox go.
    PodDeleted(usize),
    /// A prefetch of an image, no pod.
    Prefetch {
        /// Index in [`IMAGES`].
        image: usize,
        /// Its priority.
        priority: i32,
    },
    /// `imagectl gc`.
    RunGc,
    /// `imagectl gc --delete-unused` (the eviction path).
    DeleteUnused,
    /// `imagectl backoff clear`.
    ClearBackoff(ClearWhat),
    /// The runtime's own (wire-level) fault rules from now on.
    RuntimeFaults(Vec<FaultSpec>),
    /// The gateway's fault rules of the running imaged (lost on restart).
    GatewayFaults(Vec<FaultSpec>),
    /// No more random faults (outages stay).
    ClearFaults,
    /// The runtime is killed (connections drop, calls fail).
    RuntimeDown,
    /// The runtime serves again.
    RuntimeUp,
    /// The image filesystem's capacity becomes this many bytes.
    Disk(u64),
    /// A registry stops answering pulls.
    RegistryDown(usize),
    /// It answers again.
    RegistryUp(usize),
    /// The runtime pins (or unpins) an image it has.
    Pin(usize, bool),
    /// imaged is stopped gracefully and started again.
    Restart,
    /// imaged is killed (`kill -9`) and started again.
    Crash,
}

/// One step: the event, then this much time.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// What happens at the start of the step.
    pub event: Event,
    /// Time that passes after it.
    pub dt: Duration,
}

/// Everything one run does, drawn from its seed.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The seed.
    pub seed: u64,
    /// The node's settings, TOML lines (`section.key = value`) over the defaults.
    pub settings: Vec<String>,
    /// The verification policy's allowlist includes the private registry.
    pub allowlist_private: bool,
    /// Image filesystem capacity at the start.
    pub disk: u64,
    /// Images preloaded at the start (indices; the sandbox image always).
    pub preloaded: Vec<usize>,
    /// The runtime's pinned flag at the start (indices of preloaded images).
    pub pinned: Vec<usize>,
    /// Every pod (indices as events name them).
    pub pods: Vec<SimPod>,
    /// The schedule.
    pub steps: Vec<Step>,
}

/// Most pods alive at once.
const MAX_PODS: usize = 24;

impl Plan {
    /// The plan of `seed` with `steps` steps.
    pub fn generate(seed: u64, steps: usize) -> Self {
        let mut g = StdRng::seed_from_u64(seed ^ 0x05EE_D0F1_A6ED);
        let settings = settings(&mut g);
        // Without a pull deadline a hung pull hangs for good (the kubelet's
        // behaviour, by design): no such faults then.
        let pull_hangs = !settings.iter().any(|s| s == "pull.pull_deadline = \"0s\"");
        let disk = g.random_range(3_500..7_000) * MB;
        let mut preloaded = vec![SANDBOX];
        for i in [1, 2, 9] {
            if g.random_bool(0.5) {
                preloaded.push(i);
            }
        }
        let pinned = preloaded.iter().copied().filter(|i| *i != SANDBOX && g.random_bool(0.3)).collect();
        let allowlist_private = g.random_bool(0.5);
        let mut s =
            Schedule { g, pods: Vec::new(), steps: Vec::with_capacity(steps), later: Vec::new(), alive: 0, pull_hangs };
        for i in 0..steps {
            s.step(i);
        }
        Plan { seed, settings, allowlist_private, disk, preloaded, pinned, pods: s.pods, steps: s.steps }
    }

    /// A setting's value as planned, as TOML (`None` if the plan leaves
    /// the default).
    pub fn setting(&self, key: &str) -> Option<&str> {
        self.settings.iter().find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix(" = ")))
    }
}

fn pick<'a, T>(g: &mut StdRng, items: &'a [T]) -> &'a T {
    &items[g.random_range(0..items.len())]
}

fn one(g: &mut StdRng, items: &[&'static str]) -> &'static str {
    items[g.random_range(0..items.len())]
}

/// The node's settings for this seed, as TOML lines (`section.key = value`)
/// layered over the defaults: the knobs FoundationDB's simulator would turn
/// ("buggify") — concurrency, single-flight, throttling, deadlines, GC
/// thresholds and periods, the verification policy.
fn settings(g: &mut StdRng) -> Vec<String> {
    let mut s = Vec::new();
    let mut set = |k: &str, v: &str| s.push(format!("{k} = {v}"));
    let quoted = |v: &str| format!("{v:?}");
    if g.random_bool(0.2) {
        set("pull.serialize_image_pulls", "true");
    } else {
        set("pull.serialize_image_pulls", "false");
        if let Some(n) = *pick(g, &[None, Some(2), Some(4)]) {
            set("pull.max_parallel_image_pulls", &n.to_string());
        }
        set("pull.max_parallel_pulls_per_registry", one(g, &["0", "0", "2"]));
    }
    set("pull.single_flight", &(!g.random_bool(0.1)).to_string());
    set("pull.queue_capacity", one(g, &["10", "3", "0"]));
    if g.random_bool(0.3) {
        set("pull.registry_pull_qps", "2.0");
        set("pull.registry_burst", "4");
        set("pull.throttle_mode", &quoted(one(g, &["wait", "fail"])));
    } else {
        set("pull.registry_pull_qps", "0.0");
    }
    set("pull.pull_deadline", &quoted(one(g, &["3m", "5m", "10m", "0s"])));
    let cri = quoted(one(g, &["10s", "30s", "2m"]));
    for rpc in [
        "version",
        "list_images",
        "image_status",
        "remove_image",
        "image_fs_info",
        "list_containers",
        "list_pod_sandbox",
    ] {
        set(&format!("runtime.deadlines.{rpc}"), &cri);
    }
    set("backoff.reset_on_registry_recovery", &g.random_bool(0.3).to_string());
    let high = g.random_range(75..95);
    let low = g.random_range(50..high);
    set("gc.image_gc_high_threshold_percent", &high.to_string());
    set("gc.image_gc_low_threshold_percent", &low.to_string());
    set("gc.image_minimum_gc_age", &quoted(one(g, &["0s", "30s", "2m"])));
    set("gc.detect_period", &quoted(one(g, &["10s", "30s", "1m"])));
    set("gc.gc_period", &quoted(one(g, &["20s", "1m", "5m"])));
    if g.random_bool(0.3) {
        set("gc.pinned_images", "[\"docker.io/library/redis:*\"]");
    }
    let policy = one(g, &["NeverVerify", "NeverVerifyPreloadedImages", "NeverVerifyAllowlistedImages", "AlwaysVerify"]);
    set("credential_verification.policy", &quoted(policy));
    s
}

/// The schedule as it is drawn: pods arrive and leave, faults come and go.
struct Schedule {
    g: StdRng,
    pods: Vec<SimPod>,
    steps: Vec<Step>,
    /// Events due at a later step (step index, event), for ends of windows.
    later: Vec<(usize, Event)>,
    alive: usize,
    /// PullImage may hang or lose its reply (a pull deadline ends it).
    pull_hangs: bool,
}

impl Schedule {
    fn step(&mut self, i: usize) {
        let event = match self.later.iter().position(|(at, _)| *at <= i) {
            Some(p) => self.later.remove(p).1,
            None => self.fresh(i),
        };
        if matches!(event, Event::PodDeleted(_)) {
            self.alive -= 1;
        }
        let dt = self.dt();
        self.steps.push(Step { event, dt });
    }

    /// Time after a step: mostly short, sometimes minutes.
    fn dt(&mut self) -> Duration {
        let r: f64 = self.g.random();
        let ms = if r < 0.7 {
            self.g.random_range(0..2_000)
        } else if r < 0.95 {
            self.g.random_range(2_000..30_000)
        } else {
            self.g.random_range(30_000..300_000)
        };
        Duration::from_millis(ms)
    }

    fn later(&mut self, i: usize, within: std::ops::Range<usize>, e: Event) {
        let at = i + self.g.random_range(within);
        self.later.push((at, e));
    }

    fn fresh(&mut self, i: usize) -> Event {
        let r = self.g.random_range(0..1000);
        match r {
            // 0..350, and 350..560 with the node full: nothing (below).
            350..560 if self.alive < MAX_PODS => self.arrive(i),
            560..600 => {
                let image = self.g.random_range(1..IMAGES.len());
                Event::Prefetch { image, priority: *pick(&mut self.g, &[0, -5, 1000]) }
            }
            600..625 => Event::RunGc,
            625..635 => Event::DeleteUnused,
            635..650 => {
                let what = match self.g.random_range(0..3) {
                    0 => ClearWhat::All,
                    1 if !self.pods.is_empty() => ClearWhat::Pod(self.g.random_range(0..self.pods.len())),
                    _ => ClearWhat::Image(self.g.random_range(1..IMAGES.len())),
                };
                Event::ClearBackoff(what)
            }
            650..730 => {
                let rules = self.fault_rules(true);
                self.later(i, 5..120, Event::ClearFaults);
                Event::RuntimeFaults(rules)
            }
            730..770 => Event::GatewayFaults(self.fault_rules(false)),
            770..785 => {
                self.later(i, 1..10, Event::RuntimeUp);
                Event::RuntimeDown
            }
            785..815 => {
                let full = self.g.random_range(1_500..4_000) * MB;
                let back = self.g.random_range(3_500..8_000) * MB;
                self.later(i, 20..200, Event::Disk(back));
                Event::Disk(full)
            }
            815..845 => {
                let r = self.g.random_range(0..REGISTRIES.len());
                self.later(i, 3..60, Event::RegistryUp(r));
                Event::RegistryDown(r)
            }
            845..860 => Event::Pin(*pick(&mut self.g, &[1, 2, 3, 5]), self.g.random_bool(0.5)),
            860..868 => Event::Restart,
            868..876 => Event::Crash,
            _ => Event::Nothing,
        }
    }

    fn arrive(&mut self, i: usize) -> Event {
        let n = self.pods.len();
        let pod = self.pod(n);
        self.pods.push(pod);
        self.alive += 1;
        let end = if self.g.random_bool(0.3) { Event::PodCompletes(n) } else { Event::PodDeleted(n) };
        self.later(i, 10..400, end.clone());
        if matches!(end, Event::PodCompletes(_)) {
            self.later(i, 400..600, Event::PodDeleted(n));
        }
        Event::PodArrives(n)
    }

    fn pod(&mut self, n: usize) -> SimPod {
        let g = &mut self.g;
        let count = *pick(g, &[1, 1, 2, 2, 3]);
        let mut images: Vec<usize> = Vec::new();
        while images.len() < count {
            let i = g.random_range(1..IMAGES.len());
            if !images.contains(&i) {
                images.push(i);
            }
        }
        let private = images.iter().any(|i| IMAGES[*i].private);
        let secret = if private {
            *pick(
                g,
                &[
                    SecretKind::Right,
                    SecretKind::Right,
                    SecretKind::RightElsewhere,
                    SecretKind::Wrong,
                    SecretKind::None,
                ],
            )
        } else {
            *pick(g, &[SecretKind::None, SecretKind::None, SecretKind::None, SecretKind::Right])
        };
        let namespace = match secret {
            SecretKind::Right | SecretKind::Wrong => "billing",
            _ => *pick(g, &["shop", "default", "kube-system"]),
        };
        let containers = images
            .into_iter()
            .enumerate()
            .map(|(c, image)| SimContainer {
                name: format!("c{c}"),
                image,
                policy: *pick(
                    g,
                    &[
                        PullPolicy::IfNotPresent,
                        PullPolicy::IfNotPresent,
                        PullPolicy::IfNotPresent,
                        PullPolicy::Always,
                        PullPolicy::Never,
                        PullPolicy::AlwaysWithLocalFallback,
                    ],
                ),
            })
            .collect();
        SimPod {
            namespace: namespace.to_string(),
            name: format!("pod-{n}"),
            uid: format!("uid-{n:04}"),
            priority: *pick(g, &[0, 0, 0, 1000, 2_000_001_000]),
            secret,
            runtime_handler: if g.random_bool(0.1) { "kata".into() } else { String::new() },
            deadline: if g.random_bool(0.2) { Some(Duration::from_secs(g.random_range(30..300))) } else { None },
            containers,
            jitter_seed: g.random(),
        }
    }

    /// Random fault rules; `wire`: at the runtime (else at the gateway).
    fn fault_rules(&mut self, wire: bool) -> Vec<FaultSpec> {
        let g = &mut self.g;
        let n = g.random_range(1..4);
        (0..n)
            .map(|_| {
                let rpc = *pick(
                    g,
                    &[
                        Rpc::PullImage,
                        Rpc::PullImage,
                        Rpc::ImageStatus,
                        Rpc::ListImages,
                        Rpc::RemoveImage,
                        Rpc::ImageFsInfo,
                        Rpc::ListContainers,
                    ],
                );
                let image =
                    (rpc == Rpc::PullImage && g.random_bool(0.5)).then(|| format!("{}/*", pick(g, &REGISTRIES)));
                let action = match g.random_range(0..10) {
                    0..4 => FaultKind::Fail(*pick(
                        g,
                        &[
                            CriErrorKind::RuntimeUnavailable,
                            CriErrorKind::DeadlineExceeded,
                            CriErrorKind::Other,
                            CriErrorKind::ResourceExhausted,
                            CriErrorKind::RegistryUnavailable,
                        ],
                    )),
                    4..7 => FaultKind::Delay(Duration::from_millis(g.random_range(100..20_000))),
                    7..9 => FaultKind::Hang,
                    _ if wire || rpc != Rpc::RemoveImage => FaultKind::DropReply,
                    _ => FaultKind::Hang,
                };
                let action = match action {
                    FaultKind::Hang | FaultKind::DropReply if rpc == Rpc::PullImage && !self.pull_hangs => {
                        FaultKind::Delay(Duration::from_secs(30))
                    }
                    a => a,
                };
                FaultSpec { rpc, image, probability: *pick(g, &[0.05, 0.2, 0.5, 1.0]), action }
            })
            .collect()
    }
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.rpc.name(), self.action)?;
        if let Some(i) = &self.image {
            write!(f, " on {i}")?;
        }
        write!(f, " p={}", self.probability)
    }
}

impl Event {
    /// The event as a trace line names it, with the plan's names.
    pub fn describe(&self, plan: &Plan) -> String {
        let pod = |i: &usize| {
            plan.pods.get(*i).map_or_else(|| format!("pod #{i}"), |p| format!("{}/{}", p.namespace, p.name))
        };
        let list = |rules: &[FaultSpec]| rules.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
        match self {
            Event::Nothing => "-".into(),
            Event::PodArrives(i) => {
                let p = &plan.pods[*i];
                let cs: Vec<String> =
                    p.containers.iter().map(|c| format!("{} {}", IMAGES[c.image].name, c.policy.as_str())).collect();
                format!(
                    "pod {} arrives (uid {}, priority {}, secret {:?}{}{}): {}",
                    pod(i),
                    p.uid,
                    p.priority,
                    p.secret,
                    if p.runtime_handler.is_empty() {
                        String::new()
                    } else {
                        format!(", handler {}", p.runtime_handler)
                    },
                    p.deadline.map_or_else(String::new, |d| format!(", deadline {}", humantime::format_duration(d))),
                    cs.join(", ")
                )
            }
            Event::PodCompletes(i) => format!("pod {} completes", pod(i)),
            Event::PodDeleted(i) => format!("pod {} is deleted", pod(i)),
            Event::Prefetch { image, priority } => format!("prefetch {} (priority {priority})", IMAGES[*image].name),
            Event::RunGc => "imagectl gc".into(),
            Event::DeleteUnused => "imagectl gc --delete-unused".into(),
            Event::ClearBackoff(ClearWhat::All) => "imagectl backoff clear --all".into(),
            Event::ClearBackoff(ClearWhat::Pod(i)) => format!("imagectl backoff clear --pod {}", pod(i)),
            Event::ClearBackoff(ClearWhat::Image(i)) => format!("imagectl backoff clear --image {}", IMAGES[*i].name),
            Event::RuntimeFaults(r) => format!("runtime faults: {}", list(r)),
            Event::GatewayFaults(r) => format!("gateway faults: {}", list(r)),
            Event::ClearFaults => "faults cleared".into(),
            Event::RuntimeDown => "the runtime is killed".into(),
            Event::RuntimeUp => "the runtime serves again".into(),
            Event::Disk(b) => format!("image filesystem capacity {} MB", b / MB),
            Event::RegistryDown(r) => format!("registry {} goes down", REGISTRIES[*r]),
            Event::RegistryUp(r) => format!("registry {} is back", REGISTRIES[*r]),
            Event::Pin(i, on) => format!("runtime {} {}", if *on { "pins" } else { "unpins" }, IMAGES[*i].name),
            Event::Restart => "imaged restarts gracefully".into(),
            Event::Crash => "imaged is killed (kill -9) and started again".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_always_draws_the_same_plan_and_seeds_differ() {
        assert_eq!(Plan::generate(7, 500), Plan::generate(7, 500));
        assert_ne!(Plan::generate(7, 500).steps, Plan::generate(8, 500).steps);
    }

    #[test]
    fn pods_arrive_before_they_leave_and_not_too_many_live_at_once() {
        for seed in 0..20 {
            let plan = Plan::generate(seed, 2_000);
            let mut alive = std::collections::BTreeSet::new();
            for s in &plan.steps {
                match s.event {
                    Event::PodArrives(i) => assert!(alive.insert(i), "seed {seed}: pod {i} arrives twice"),
                    Event::PodCompletes(i) => assert!(alive.contains(&i), "seed {seed}: pod {i} completes first"),
                    Event::PodDeleted(i) => assert!(alive.remove(&i), "seed {seed}: pod {i} deleted first"),
                    _ => {}
                }
                assert!(alive.len() <= MAX_PODS);
            }
        }
    }

    #[test]
    fn the_settings_are_a_valid_configuration() {
        for seed in 0..50 {
            let plan = Plan::generate(seed, 10);
            crate::config::Config::from_toml(&plan.settings.join("\n")).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
    }
}
