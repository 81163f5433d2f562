//! The node workload the demo replays: a few hundred pods arriving over
//! about fifteen seconds, generated from a seed (same seed, same workload).
//!
//! The story: the node boots and its DaemonSets start; the shop's
//! deployments scale out (replicas of one ReplicaSet arrive together, most
//! with the same mesh sidecar); billing runs a private image with its pull
//! secret, and a canary that forgot the secret; a crash-looping pod names an
//! image that does not exist; analytics pulls from a slow registry; batch
//! jobs bring big images that are unused once they complete; an autoscaler
//! adds replicas; three rollouts replace images, leaving the old ones unused.
//! Pods that never start stop retrying at the workload's horizon.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng};

use super::catalogue::*;
use crate::domain::pull_policy::PullPolicy;

/// The seed `imaged demo` uses unless told otherwise.
pub const DEFAULT_SEED: u64 = 20_26;

/// Priority of node-critical pods (the `system-node-critical` class).
pub const NODE_CRITICAL: i32 = 2_000_001_000;

/// One container of a pod, in the order the kubelet ensures images
/// (init containers first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPlan {
    /// Container name.
    pub name: String,
    /// Image as the pod spec names it.
    pub image: String,
    /// Its pull policy.
    pub policy: PullPolicy,
}

/// What kind of workload a pod belongs to (for the display and summary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PodKind {
    /// A DaemonSet's pod.
    DaemonSet,
    /// A Deployment's or StatefulSet's replica.
    Replica,
    /// A Job's pod: runs, then completes.
    Job,
}

/// One pod of the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlan {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID (stable for a seed).
    pub uid: String,
    /// When the pod is bound to the node, from the start of the run.
    pub arrive: Duration,
    /// When the pod is deleted or completes (its containers go away), if it does.
    pub stop: Option<Duration>,
    /// Pull priority (the pod's priority class).
    pub priority: i32,
    /// Whether the pod lists the billing pull secret.
    pub pull_secret: bool,
    /// Its containers.
    pub containers: Vec<ContainerPlan>,
    /// Its kind.
    pub kind: PodKind,
}

/// The whole workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// The seed it was generated from.
    pub seed: u64,
    /// Every pod, by arrival.
    pub pods: Vec<PodPlan>,
    /// Pods that have not started by then stop retrying.
    pub horizon: Duration,
}

impl Workload {
    /// The workload for `seed`.
    pub fn generate(seed: u64) -> Self {
        let mut g = Gen { rng: StdRng::seed_from_u64(seed), pods: Vec::new(), seq: 0 };
        let mesh = |img: &str| vec![(img.to_string(), false), (ISTIO_PROXY.to_string(), false)];
        let plain = |img: &str| vec![(img.to_string(), false)];
        let with_init = |img: &str| vec![(BUSYBOX.to_string(), true), (img.to_string(), false)];

        // Node boot: DaemonSets, node-critical.
        for (ns, name, img) in [
            ("kube-system", "kube-proxy", KUBE_PROXY),
            ("monitoring", "node-exporter", NODE_EXPORTER),
            ("logging", "fluent-bit", FLUENT_BIT),
        ] {
            g.group(Group::new(ns, name, plain(img), 1, 0).kind(PodKind::DaemonSet).priority(NODE_CRITICAL));
        }
        // The shop scales out: replicas of a ReplicaSet arrive together.
        g.group(Group::new("ingress", "nginx", plain(NGINX), 3, 200));
        g.group(Group::new("shop", "redis", plain(REDIS), 3, 300).spread(300));
        g.group(Group::new("shop", "postgres", with_init(POSTGRES), 1, 300));
        g.group(Group::new("shop", "web-7f9c", mesh(WEB_V1), 30, 400).stop_at(11_500));
        g.group(Group::new("shop", "api-5d4b", mesh(API_V1), 24, 600).stop_at(13_500));
        g.group(Group::new("shop", "cart", mesh(CART), 16, 900));
        g.group(Group::new("shop", "checkout", mesh(CHECKOUT), 10, 1_100));
        g.group(Group::new("shop", "search-66d1", mesh(SEARCH_V1), 6, 1_500).stop_at(15_000));
        g.group(Group::new("ml", "recommender", plain(RECOMMENDER), 4, 2_000).stop_at(14_000));
        g.group(Group::new("shop", "queue-worker", plain(PYTHON), 12, 2_200));
        // A crash-looping pod whose image does not exist.
        g.group(Group::new("reports", "legacy-reporter", plain(MISSING), 1, 1_200));
        // The private registry: with the pull secret, and a canary without it.
        let billing = vec![(LEDGER.to_string(), false), (INVOICER.to_string(), false)];
        g.group(Group::new("billing", "ledger", billing.clone(), 8, 2_500).secret().policy(PullPolicy::Always));
        g.group(Group::new("billing", "ledger-canary", billing, 2, 3_000).policy(PullPolicy::Always));
        // The slow registry.
        g.group(Group::new("analytics", "report-ui", plain(REPORT_UI), 6, 3_500));
        g.group(Group::new("analytics", "worker", with_init(ANALYTICS_WORKER), 4, 3_800));
        // Batch: jobs run, complete, and leave their (big) images unused.
        let job = |ns: &str, name: &str, c: Vec<(String, bool)>, n, at: u64, runs: u64| {
            Group::new(ns, name, c, n, at).kind(PodKind::Job).stop_at(at + runs)
        };
        g.group(job("batch", "etl-28871", with_init(ETL), 1, 4_000, 3_000));
        g.group(job("batch", "train-28871", plain(ML_TRAIN), 1, 5_000, 3_500));
        g.group(job("batch", "spark-pi", plain(SPARK), 4, 6_500, 2_500));
        g.group(job("shop", "db-migrate", plain(DB_MIGRATE), 1, 8_000, 800));
        g.group(job("batch", "report-28872", plain(REPORT_BATCH), 1, 9_000, 2_500));
        g.group(job("batch", "train-28873", plain(ML_TRAIN), 1, 12_000, 2_500));
        g.group(job("batch", "etl-28873", with_init(ETL), 1, 13_000, 2_000));
        for (i, at) in (4_000..16_000).step_by(2_000).enumerate() {
            g.group(job("ops", &format!("cleanup-{}", 28_870 + i), plain(KUBECTL), 1, at, 500));
        }
        for (i, at) in [7_000, 11_000, 15_000].into_iter().enumerate() {
            g.group(job("ops", &format!("backup-{}", 28_870 + i), vec![(ALPINE.to_string(), false)], 1, at, 700));
        }
        // The autoscaler adds replicas (images present by now).
        g.group(Group::new("shop", "web-7f9c-hpa", mesh(WEB_V1), 20, 6_000).spread(1_000).stop_at(11_500));
        g.group(Group::new("shop", "cart-hpa", mesh(CART), 8, 6_500).spread(800));
        // Rollouts: new ReplicaSets in surges; the old pods go once the new are up.
        for surge in 0..5 {
            g.group(Group::new("shop", &format!("web-8a1e-s{surge}"), mesh(WEB_V2), 10, 9_000 + surge * 400));
        }
        for surge in 0..4 {
            g.group(Group::new("shop", &format!("api-9c02-s{surge}"), mesh(API_V2), 6, 11_000 + surge * 400));
        }
        g.group(Group::new("shop", "search-7b3f", mesh(SEARCH_V2), 6, 13_000));
        g.pods.sort_by(|a, b| a.arrive.cmp(&b.arrive).then_with(|| a.name.cmp(&b.name)));
        Workload { seed, pods: g.pods, horizon: Duration::from_secs(17) }
    }

    /// Every image request the workload makes at least once.
    pub fn images(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.pods.iter().flat_map(|p| p.containers.iter().map(|c| c.image.as_str())).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// Replicas of one controller.
struct Group {
    namespace: String,
    name: String,
    /// (image, is init container)
    containers: Vec<(String, bool)>,
    replicas: usize,
    at_ms: u64,
    /// Arrivals spread over this many ms (random within).
    spread_ms: u64,
    stop_ms: Option<u64>,
    priority: i32,
    secret: bool,
    policy: PullPolicy,
    kind: PodKind,
}

impl Group {
    fn new(ns: &str, name: &str, containers: Vec<(String, bool)>, replicas: usize, at_ms: u64) -> Self {
        Self {
            namespace: ns.into(),
            name: name.into(),
            containers,
            replicas,
            at_ms,
            spread_ms: 250,
            stop_ms: None,
            priority: 0,
            secret: false,
            policy: PullPolicy::IfNotPresent,
            kind: PodKind::Replica,
        }
    }
    fn spread(mut self, ms: u64) -> Self {
        self.spread_ms = ms;
        self
    }
    fn stop_at(mut self, ms: u64) -> Self {
        self.stop_ms = Some(ms);
        self
    }
    fn priority(mut self, p: i32) -> Self {
        self.priority = p;
        self
    }
    fn secret(mut self) -> Self {
        self.secret = true;
        self
    }
    fn policy(mut self, p: PullPolicy) -> Self {
        self.policy = p;
        self
    }
    fn kind(mut self, k: PodKind) -> Self {
        self.kind = k;
        self
    }
}

struct Gen {
    rng: StdRng,
    pods: Vec<PodPlan>,
    seq: u64,
}

const SUFFIX: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

impl Gen {
    fn suffix(&mut self) -> String {
        (0..5).map(|_| char::from(SUFFIX[self.rng.random_range(0..SUFFIX.len())])).collect()
    }

    /// Adds the group's pods.
    fn group(&mut self, g: Group) {
        for _ in 0..g.replicas {
            let jitter = if g.spread_ms == 0 { 0 } else { self.rng.random_range(0..g.spread_ms) };
            let arrive = Duration::from_millis(g.at_ms + jitter);
            // A pod stopped by a rollout or a completed job goes a little
            // apart from its siblings.
            let stop = g.stop_ms.map(|s| Duration::from_millis(s + self.rng.random_range(0..300)));
            let name = format!("{}-{}", g.name, self.suffix());
            self.seq += 1;
            let uid = format!(
                "{:08x}-demo-{:04}-{:012x}",
                self.rng.random::<u32>(),
                self.seq,
                self.rng.random::<u64>() >> 16
            );
            let containers = g
                .containers
                .iter()
                .enumerate()
                .map(|(i, (image, init))| ContainerPlan {
                    name: if *init { format!("init-{i}") } else { container_name(image) },
                    image: image.clone(),
                    policy: g.policy,
                })
                .collect();
            self.pods.push(PodPlan {
                namespace: g.namespace.clone(),
                name,
                uid,
                arrive,
                stop: stop.filter(|s| *s > arrive),
                priority: g.priority,
                pull_secret: g.secret,
                containers,
                kind: g.kind,
            });
        }
    }
}

/// `ghcr.io/acme/shop-web:v1.4.0` → `shop-web`.
fn container_name(image: &str) -> String {
    let last = image.rsplit('/').next().unwrap_or(image);
    last.split(':').next().unwrap_or(last).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_workload_and_another_seed_another() {
        let a = Workload::generate(7);
        assert_eq!(a, Workload::generate(7));
        let b = Workload::generate(8);
        assert_ne!(a.pods, b.pods);
        // Only the random parts differ: the same pods of the same groups.
        assert_eq!(a.pods.len(), b.pods.len());
    }

    #[test]
    fn a_few_hundred_pods_over_a_few_dozen_images_with_every_scenario() {
        let w = Workload::generate(DEFAULT_SEED);
        assert!((200..=400).contains(&w.pods.len()), "{} pods", w.pods.len());
        let images = w.images();
        assert!(images.len() >= 24, "{} images", images.len());
        let uses = |img: &str| w.pods.iter().filter(|p| p.containers.iter().any(|c| c.image == img)).count();
        assert!(uses(ISTIO_PROXY) > 100, "the sidecar is shared by most pods");
        assert_eq!(uses(MISSING), 1);
        let private: Vec<&PodPlan> = w.pods.iter().filter(|p| p.containers.iter().any(|c| c.image == LEDGER)).collect();
        assert!(private.iter().any(|p| p.pull_secret) && private.iter().any(|p| !p.pull_secret));
        assert!(uses(REPORT_UI) > 0 && uses(ML_TRAIN) == 2);
        // Every image the workload uses but the missing one is in the registries.
        for img in images {
            assert!(img == MISSING || size_of(img).is_some(), "{img} is not in the catalogue");
        }
        // Jobs complete; rollouts stop the old replicas after the new arrive.
        assert!(w.pods.iter().filter(|p| p.kind == PodKind::Job).all(|p| p.stop.is_some()));
        let first_v2 = w.pods.iter().filter(|p| p.containers.iter().any(|c| c.image == WEB_V2)).map(|p| p.arrive).min();
        let v1_stops = w.pods.iter().filter(|p| p.containers.iter().any(|c| c.image == WEB_V1)).filter_map(|p| p.stop);
        assert!(v1_stops.clone().count() > 0);
        assert!(v1_stops.into_iter().all(|s| Some(s) > first_v2));
        // Arrivals are ordered and within the horizon; uids are unique.
        assert!(w.pods.windows(2).all(|p| p[0].arrive <= p[1].arrive));
        assert!(w.pods.iter().all(|p| p.arrive < w.horizon));
        let mut uids: Vec<&str> = w.pods.iter().map(|p| p.uid.as_str()).collect();
        uids.sort_unstable();
        uids.dedup();
        assert_eq!(uids.len(), w.pods.len());
    }

    #[test]
    fn replicas_of_one_group_arrive_together() {
        let w = Workload::generate(DEFAULT_SEED);
        let web: Vec<Duration> = w
            .pods
            .iter()
            .filter(|p| p.name.starts_with("web-7f9c-") && !p.name.contains("hpa"))
            .map(|p| p.arrive)
            .collect();
        assert_eq!(web.len(), 30);
        let (min, max) = (web.iter().min().copied(), web.iter().max().copied());
        assert!(
            max.zip(min).is_some_and(|(a, b)| a.checked_sub(b).unwrap() < Duration::from_millis(300)),
            "{min:?}..{max:?}"
        );
    }

    #[test]
    fn container_names_come_from_the_image() {
        assert_eq!(container_name("ghcr.io/acme/shop-web:v1.4.0"), "shop-web");
        assert_eq!(container_name("busybox"), "busybox");
    }
}
