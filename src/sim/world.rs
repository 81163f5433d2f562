//! The simulated node: the embedded runtime served in-process, imaged's
//! processes one after another (each a `Node` with every actor, in a
//! `LocalSet` of its own that a kill drops mid-await), the state directory
//! that outlives them, a service manager that starts them again, and a
//! kubelet whose pod workers ensure images (through the API, or with the
//! kubelet's own calls to the CRI front each process serves on an
//! in-memory socket) and create containers.
//!
//! Everything runs on one thread, on a paused tokio clock: the outer
//! `LocalSet` (the actix System's) holds the simulation's own tasks — the
//! driver, the service manager, the kubelet — and each imaged process is a
//! nested `LocalSet` polled by one task there. `tokio::spawn`ed work (tonic's
//! connections, the runtime's server) runs on the same thread.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::{Rc, Weak as RcWeak};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use actix::prelude::*;
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, LocalSet};
use tokio::time::Instant;

use super::log::{Answer, FrontOutcome, Life, Log, What};
use super::plan::{
    Access, ClearWhat, DRIP, Event, FaultKind, FaultSpec, IMAGES, PLUGIN_TOKEN, PLUGIN_USER, PRIVATE_PASSWORD,
    PRIVATE_USER, Plan, REGISTRIES, ROBOT_PASSWORD, ROBOT_USER, STALL_HANG, SecretKind, WRONG_PASSWORD, stalls_after,
};
use super::plugin::SimPlugin;
use crate::actors::backoff_registry::{BackoffKey, ClearScope};
use crate::actors::cri_gateway::{CriGatewayActor, SetFaultPlan};
use crate::clock::Clock;
use crate::config::Config;
use crate::connect::ConnectedRuntime;
use crate::credentials::PullSecret;
use crate::cri::proto as pb;
use crate::cri::{CriEndpoint, CriError, CriErrorKind, Rpc};
use crate::domain::{Container, ContainerState, ImageSpec, PodSandbox, PodSandboxState};
use crate::embedded::{EmbeddedRuntime, IN_PROCESS_ENDPOINT, InProcessRuntime, InProcessSocket, Observer, RemoteImage};
use crate::ensure::{EnsureImageRequest, Prefetch, PrefetchRequest};
use crate::events::ImageEvent;
use crate::fault::{FaultPlan, FaultRule};
use crate::node::Node;
use crate::store::Store;

/// The wall-clock time a run starts at (2026-01-01T00:00:00Z): every
/// process's clock goes on from it, across restarts.
pub const SIM_EPOCH: Duration = Duration::from_secs(1_767_225_600);

/// How long a graceful stop lets pulls finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The service manager's `RestartSec`.
const RESTART_SEC: Duration = Duration::from_secs(1);

/// The kubelet's `runtimeRequestTimeout` on its `ImageStatus` calls (it
/// sets none on `PullImage`).
const KUBELET_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The kubelet's `ImageGCPeriod`.
const KUBELET_GC_PERIOD: Duration = Duration::from_secs(300);

/// The time the kubelet's GC takes before each `RemoveImage` (the
/// listing's `GetPods`, the previous removal): a pod may be given an image
/// it chose meanwhile.
const KUBELET_REMOVE_GAP: Duration = Duration::from_secs(2);

/// How often the kubelet's eviction manager looks at the disk.
const KUBELET_EVICTION_PERIOD: Duration = Duration::from_secs(10);

/// The kubelet's default `imageMinimumGCAge`.
const KUBELET_MIN_AGE: Duration = Duration::from_secs(120);

/// What the kubelet's image GC knows of an image: when it first saw it
/// and when it last saw it used (run-relative).
#[derive(Debug, Clone, Copy)]
struct KubeletSeen {
    first: Duration,
    last_used: Duration,
}

/// A pod's state as the kubelet knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    /// Not bound yet.
    Absent,
    /// Bound: its worker ensures images and starts containers.
    Live,
    /// Its containers exited (they still hold their images).
    Completed,
    /// Deleted.
    Deleted,
}

/// One pod's run.
pub struct PodRun {
    /// Its state.
    pub state: Cell<PodState>,
    /// The containers created so far (by container index).
    pub containers: RefCell<Vec<Option<Container>>>,
    /// Wakes its worker when it completes or is deleted.
    wake: Notify,
}

/// One imaged process.
pub struct Incarnation {
    /// Its number (1, 2, …).
    pub id: u32,
    local: Rc<LocalSet>,
    runner: JoinHandle<()>,
    /// The node once started.
    pub node: RefCell<Option<Rc<Node>>>,
    /// Its store, from the moment it is opened (a kill fences it, even
    /// while the process starts).
    store: RefCell<Option<Weak<Store>>>,
    /// A graceful stop began (new work is refused).
    pub stopping: Cell<bool>,
    /// Killed or exited.
    pub dead: Cell<bool>,
    ended: Notify,
}

impl Incarnation {
    /// The node if it is up and not stopping.
    pub fn serving(&self) -> Option<Rc<Node>> {
        if self.dead.get() || self.stopping.get() {
            return None;
        }
        self.node.borrow().clone()
    }

    /// Runs `fut` as a task of this process: it dies with it.
    fn spawn<F: Future + 'static>(&self, fut: F) -> JoinHandle<F::Output> {
        self.local.spawn_local(fut)
    }
}

/// Faults in force at the runtime: random rules, registry outages and
/// stalls; and whether the serving process has gateway fault rules.
#[derive(Default)]
struct Faults {
    random: Vec<FaultSpec>,
    registries_down: Vec<usize>,
    changes: u64,
    /// Registries whose downloads stall.
    stalling: Vec<usize>,
    /// The serving process has gateway fault rules.
    gateway: bool,
    /// The wire was last said to be faulty ([`What::Clean`]).
    faulty: bool,
}

/// The simulated node.
pub struct World {
    /// The plan.
    pub plan: Rc<Plan>,
    /// imaged's configuration (every process starts with it; a reload
    /// changes it, as the operator's edit of its file would).
    pub cfg: RefCell<Config>,
    /// The settings lines it was made from: the plan's, with each reload's
    /// lines in place of the same keys'.
    settings: RefCell<Vec<String>>,
    /// The runtime.
    pub runtime: InProcessRuntime,
    /// A handle on its state.
    pub rt: EmbeddedRuntime,
    /// imaged's state directory.
    pub dir: PathBuf,
    /// When the run began.
    pub start: Instant,
    /// What happened.
    pub log: Log,
    /// The imaged process now, if any.
    pub current: RefCell<Option<Rc<Incarnation>>>,
    /// The store of the last process, until it is released.
    last_store: RefCell<Option<Weak<Store>>>,
    next_inc: Cell<u32>,
    next_ensure: Cell<u64>,
    /// Every pod's run, by plan index.
    pub pods: Vec<PodRun>,
    faults: RefCell<Faults>,
    /// The secrets pods may carry.
    secrets: [PullSecret; 3],
    /// Image ids by plan index (`None`: in no registry).
    pub ids: Vec<Option<String>>,
    /// Set when the run should end early (a violation, or the end).
    pub done: Cell<bool>,
    /// The start of the last GC report logged.
    pub last_gc: Cell<Option<SystemTime>>,
    /// The node's credential plugin, if it has one.
    plugin: Option<Arc<SimPlugin>>,
    /// imaged's CRI socket: each process serves its front there while it
    /// lives (when the plan sends pods through it).
    front: InProcessSocket,
    /// The kubelet's CRI client of that socket (`imageServiceEndpoint`).
    kubelet: pb::image_service_client::ImageServiceClient<tonic::transport::Channel>,
    /// The kubelet's image GC's records, by image id ([`Plan::kubelet_gc`]).
    kubelet_seen: RefCell<std::collections::HashMap<String, KubeletSeen>>,
}

fn secret(ns: &str, name: &str, password: &str) -> PullSecret {
    let json = format!(r#"{{"auths":{{"private.example":{{"username":"{PRIVATE_USER}","password":"{password}"}}}}}}"#);
    PullSecret::new(ns, name, "kubernetes.io/dockerconfigjson")
        .with_uid(format!("uid-{ns}-{name}"))
        .with_data(".dockerconfigjson", json.into_bytes())
}

/// The runtime's catalogue entry of an image.
fn remote(i: usize) -> Option<RemoteImage> {
    let img = IMAGES[i];
    if !img.exists {
        return None;
    }
    let mut r = RemoteImage::new(img.name, img.size).latency(Duration::from_millis(img.latency_ms));
    r = match img.access {
        Access::Public => r,
        Access::Secret => r.private(PRIVATE_USER, PRIVATE_PASSWORD).also_accepts(ROBOT_USER, ROBOT_PASSWORD),
        Access::Plugin => r.private(PLUGIN_USER, PLUGIN_TOKEN),
    };
    if let Some(of) = img.alias_of {
        r = r.with_id(RemoteImage::new(IMAGES[of].name, 0).id);
    }
    Some(r)
}

/// The catalogue entry of an image whose registry stalls: its download
/// stops moving (or drips) early and its pull hangs on for [`STALL_HANG`].
fn stalled(i: usize, drips: bool) -> Option<RemoteImage> {
    let r = remote(i)?;
    let hang = r.pull_latency + STALL_HANG;
    let r = r.latency(hang);
    Some(if drips { r.dripping(stalls_after(i), DRIP) } else { r.stalling(stalls_after(i)) })
}

/// Indices in [`IMAGES`] of a registry's images.
fn images_of(registry: usize) -> impl Iterator<Item = usize> {
    (0..IMAGES.len()).filter(move |i| super::check::registry_of(IMAGES[*i].name) == REGISTRIES[registry])
}

impl World {
    /// Sets up the node for `plan` with its state in `dir` (created by the
    /// store) and its credential plugin's files in `plugin_dir` (both
    /// removed by the caller). Must run on the simulation's runtime.
    pub fn new(plan: Rc<Plan>, dir: PathBuf, plugin_dir: &std::path::Path) -> Result<Rc<Self>, String> {
        let mut cfg = Config::from_toml(&plan.settings.join("\n")).map_err(|e| format!("the plan's settings: {e}"))?;
        cfg.state_dir = Some(dir.clone());
        cfg.fault_plan = None;
        cfg.credentials.search =
            crate::credentials::DockerConfigSearch { config_json_dirs: Vec::new(), dockercfg_dirs: Vec::new() };
        if plan.allowlist_private {
            cfg.verification.allowlist =
                crate::pull_records::Allowlist::new(&["private.example/*", "docker.io/library/busybox"])
                    .map_err(|e| e.to_string())?;
        } else {
            cfg.verification.allowlist =
                crate::pull_records::Allowlist::new(&["docker.io/library/busybox"]).map_err(|e| e.to_string())?;
        }
        let start = Instant::now();
        let log = Log::default();
        let plugin = plan.plugin.map(|p| SimPlugin::new(p, log.clone(), start));
        if let (Some(plugin), Some(p)) = (&plugin, &plan.plugin) {
            let (config, bin) = plugin.install(plugin_dir).map_err(|e| format!("writing the plugin's files: {e}"))?;
            cfg.credentials.provider_config = Some(config);
            cfg.credentials.provider_bin_dir = Some(bin);
            cfg.credentials.provider_timeout = p.timeout;
            cfg = cfg.with_plugin_runner(plugin.clone());
        }
        let runtime = InProcessRuntime::start_at(SystemTime::UNIX_EPOCH + SIM_EPOCH);
        let rt = runtime.handle();
        let ids = (0..IMAGES.len()).map(|i| remote(i).map(|r| r.id)).collect();
        for i in 0..IMAGES.len() {
            if let Some(r) = remote(i) {
                rt.add_remote(r).map_err(|e| e.to_string())?;
            }
        }
        for &i in &plan.preloaded {
            if let Some(r) = remote(i) {
                rt.preload(r).map_err(|e| e.to_string())?;
            }
        }
        for &i in &plan.pinned {
            rt.set_pinned(IMAGES[i].name, true);
        }
        rt.set_capacity(plan.disk);
        let observed = log.clone();
        runtime.set_observer(Some(Observer::new(move |o| observed.push(start.elapsed(), What::Runtime(o.clone())))));
        let pods = plan
            .pods
            .iter()
            .map(|p| PodRun {
                state: Cell::new(PodState::Absent),
                containers: RefCell::new(vec![None; p.containers.len()]),
                wake: Notify::new(),
            })
            .collect();
        let front = InProcessSocket::default();
        Ok(Rc::new(Self {
            settings: RefCell::new(plan.settings.clone()),
            plan,
            cfg: RefCell::new(cfg),
            runtime,
            rt,
            dir,
            start,
            log,
            current: RefCell::default(),
            last_store: RefCell::default(),
            next_inc: Cell::new(1),
            next_ensure: Cell::new(1),
            pods,
            faults: RefCell::default(),
            secrets: [
                secret("billing", "regcred", PRIVATE_PASSWORD),
                secret("shop", "regcred", PRIVATE_PASSWORD),
                secret("billing", "oldcred", WRONG_PASSWORD),
            ],
            ids,
            done: Cell::new(false),
            last_gc: Cell::new(None),
            plugin,
            kubelet: pb::image_service_client::ImageServiceClient::new(front.channel(Duration::from_secs(5))),
            front,
            kubelet_seen: RefCell::default(),
        }))
    }

    /// Time since the run began.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn record(&self, what: What) {
        self.log.push(self.now(), what);
    }

    /// The imaged process now, if it serves.
    pub fn node(&self) -> Option<(Rc<Incarnation>, Rc<Node>)> {
        let inc = self.current.borrow().clone()?;
        let node = inc.serving()?;
        Some((inc, node))
    }

    // === The service manager ===

    /// Starts imaged, and starts it again whenever it ends (after
    /// [`RESTART_SEC`]), until the run is done.
    pub async fn supervise(self: Rc<Self>, before_start: impl Fn(&Rc<Self>, u32)) {
        while !self.done.get() {
            self.wait_for_last_store().await;
            let id = self.next_inc.get();
            self.next_inc.set(id + 1);
            before_start(&self, id);
            let inc = Self::spawn_incarnation(id);
            *self.current.borrow_mut() = Some(inc.clone());
            match self.start_node(&inc).await {
                Ok(node) => {
                    *inc.node.borrow_mut() = Some(node);
                    self.record(What::Life { inc: id, what: Life::Started });
                    if !inc.dead.get() {
                        inc.ended.notified().await;
                    }
                }
                // Killed while starting: recorded as such already.
                Err(_) if inc.dead.get() => {}
                Err(e) => {
                    self.record(What::Life { inc: id, what: Life::StartFailed(e) });
                    self.kill(&inc, Life::Killed);
                }
            }
            tokio::time::sleep(RESTART_SEC).await;
        }
    }

    /// Waits until the last process's store is closed (everything it left
    /// running has ended), as the kernel closes a killed process's files.
    async fn wait_for_last_store(&self) {
        for _ in 0..1_000 {
            let held = self.last_store.borrow().as_ref().is_some_and(|w| w.strong_count() > 0);
            if !held {
                *self.last_store.borrow_mut() = None;
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn spawn_incarnation(id: u32) -> Rc<Incarnation> {
        let local = Rc::new(LocalSet::new());
        let polled = local.clone();
        let runner = tokio::task::spawn_local(async move { polled.run_until(std::future::pending::<()>()).await });
        Rc::new(Incarnation {
            id,
            local,
            runner,
            node: RefCell::default(),
            store: RefCell::default(),
            stopping: Cell::new(false),
            dead: Cell::new(false),
            ended: Notify::new(),
        })
    }

    /// Starts a `Node` in `inc`, as `imaged run` does.
    async fn start_node(&self, inc: &Incarnation) -> Result<Rc<Node>, String> {
        let cfg = self.cfg.borrow().clone();
        let client = self.runtime.client(cfg.cri.connect_timeout);
        let handle = self.runtime.handle();
        let clock = Clock::starting_at(SystemTime::UNIX_EPOCH + SIM_EPOCH + self.now());
        let (log, start, id) = (self.log.clone(), self.start, inc.id);
        let front = (!self.plan.front_pods.is_empty()).then(|| self.front.clone());
        // Opened here, as the node would open it, so that a kill from now
        // on fences it and the next process waits for it to close.
        let store = match &cfg.state_dir {
            Some(dir) => {
                let store = crate::node::open_store(dir, &cfg.pull.metrics).map_err(|e| e.to_string())?;
                *inc.store.borrow_mut() = Some(Arc::downgrade(&store));
                *self.last_store.borrow_mut() = Some(Arc::downgrade(&store));
                Some(store)
            }
            None => None,
        };
        let started = inc.spawn(async move {
            let (gateway, version) =
                CriGatewayActor::connect_client(client, &cfg.cri).await.map_err(|e| format!("connecting: {e}"))?;
            let runtime = ConnectedRuntime {
                gateway,
                version,
                endpoint: CriEndpoint::Unix(IN_PROCESS_ENDPOINT.into()),
                embedded: Some(handle),
            };
            let node = match store {
                Some(store) => Node::start_on_store(cfg, runtime, clock, store).await,
                None => Node::start_on_clock(cfg, runtime, clock).await,
            }
            .map_err(|e| e.to_string())?;
            node.subscribe_events(EventRecorder { inc: id, log, start }.start().recipient());
            // The CRI front on imaged's socket, as `imaged run` serves it.
            if let Some(socket) = front {
                let settings = node.config().cri_server.clone();
                let f = crate::cri_front::CriFront::over(&node, &settings).await.map_err(|e| e.to_string())?;
                let service = crate::cri::server::ImageServiceServer::new(Arc::new(f));
                socket.bind(crate::cri::transport::server().add_service(service));
            }
            Ok(Rc::new(node))
        });
        // A kill while starting stops polling the process's tasks without
        // dropping them: `started` would never end.
        tokio::select! {
            biased;
            r = started => r.unwrap_or_else(|_| Err("killed while starting".into())),
            () = inc.ended.notified() => Err("killed while starting".into()),
        }
    }

    /// Kills `inc` (`how`: `Killed` for `kill -9`, `Exited` after a graceful
    /// stop): its store refuses writes from now on, its tasks are never
    /// polled again and are dropped.
    pub fn kill(&self, inc: &Incarnation, how: Life) {
        if inc.dead.replace(true) {
            return;
        }
        // Fenced while the node still holds it: were the node's the last
        // handle, dropping it first would close the store and keep the
        // unsynced writes a kill loses.
        if let Some(store) = inc.store.borrow_mut().take().and_then(|w| w.upgrade()) {
            // Killed: its unsynced writes are lost; exited: its store closes.
            if matches!(how, Life::Killed) { store.fence_as_killed() } else { store.fence() }
        }
        // Its socket goes with it: the kubelet's calls in flight fail.
        self.front.close();
        drop(inc.node.borrow_mut().take());
        inc.runner.abort();
        self.record(What::Life { inc: inc.id, what: how });
        let mut current = self.current.borrow_mut();
        if current.as_ref().is_some_and(|c| c.id == inc.id) {
            *current = None;
        }
        drop(current);
        inc.ended.notify_one();
    }

    /// `kill -9` of the process now (starting, serving or stopping).
    pub fn crash(&self) {
        let inc = self.current.borrow().clone();
        if let Some(inc) = inc {
            self.kill(&inc, Life::Killed);
        }
    }

    /// A graceful stop of the process now (SIGTERM): it refuses new work,
    /// drains for [`SHUTDOWN_GRACE`], exits.
    pub fn restart(self: &Rc<Self>) {
        let Some((inc, node)) = self.node() else { return };
        inc.stopping.set(true);
        self.record(What::Life { inc: inc.id, what: Life::Stopping });
        let world = Rc::downgrade(self);
        let dying = Rc::downgrade(&inc);
        let stop = inc.spawn(async move {
            node.shutdown(SHUTDOWN_GRACE).await;
        });
        drop(inc);
        tokio::task::spawn_local(async move {
            // Killed meanwhile: nothing more to do.
            if stop.await.is_ok()
                && let (Some(w), Some(inc)) = (RcWeak::upgrade(&world), RcWeak::upgrade(&dying))
            {
                w.kill(&inc, Life::Exited);
            }
        });
    }

    // === The kubelet ===

    fn request(&self, pod: usize, container: usize) -> EnsureImageRequest {
        let p = &self.plan.pods[pod];
        let c = &p.containers[container];
        let mut req = EnsureImageRequest::new(p.uid.clone(), IMAGES[c.image].name, c.policy);
        req.pod.namespace.clone_from(&p.namespace);
        req.pod.name.clone_from(&p.name);
        req.pod.priority = p.priority;
        req.pod.runtime_handler.clone_from(&p.runtime_handler);
        req.container = Some(c.name.clone());
        req.deadline = p.deadline;
        req.pull_secrets = match p.secret {
            SecretKind::None => Vec::new(),
            SecretKind::Right => vec![self.secrets[0].clone()],
            SecretKind::RightElsewhere => vec![self.secrets[1].clone()],
            SecretKind::Wrong => vec![self.secrets[2].clone()],
        };
        req
    }

    /// The kubelet's `EnsureImageExists` call for one container.
    async fn ensure(&self, pod: usize, container: usize) -> Answer {
        let id = self.next_ensure.get();
        self.next_ensure.set(id + 1);
        let Some((inc, node)) = self.node() else {
            self.record(What::EnsureStarted { id, inc: 0, pod, container });
            self.record(What::EnsureEnded { id, answer: Answer::NoNode });
            return Answer::NoNode;
        };
        self.record(What::EnsureStarted { id, inc: inc.id, pod, container });
        let req = self.request(pod, container);
        let call = inc.spawn(async move { node.ensure_image_exists(&req).await });
        // Holding the process across the wait would keep a killed one's
        // tasks (and this call) from ever being dropped.
        drop(inc);
        let answer = match call.await {
            Ok(Ok(Ok(ok))) => Answer::Ok(ok),
            Ok(Ok(Err(e))) => Answer::Err(e),
            Ok(Err(e)) => Answer::Node(e),
            Err(_) => Answer::Lost,
        };
        self.record(What::EnsureEnded { id, answer: answer.clone() });
        answer
    }

    /// The kubelet's own image steps for one container, through imaged's
    /// CRI front: `ImageStatus` unless the policy always pulls; then
    /// `PullImage` with the pod's one credential for the image's registry
    /// (and its own deadline, if it has one) and `ImageStatus` of what it
    /// brought (for the size). This kubelet keeps no pull records of its
    /// own and no back-off: it retries at its sync period.
    async fn front_ensure(&self, pod: usize, container: usize) -> Option<String> {
        let id = self.next_ensure.get();
        self.next_ensure.set(id + 1);
        // The process whose socket it is, even while it stops (the socket
        // serves until it exits).
        let inc = self.current.borrow().as_ref().filter(|i| !i.dead.get()).map_or(0, |i| i.id);
        self.record(What::EnsureStarted { id, inc, pod, container });
        let outcome = self.kubelet_steps(pod, container).await;
        self.record(What::FrontEnded { id, pod, container, outcome: outcome.clone() });
        match outcome {
            FrontOutcome::Present(r) | FrontOutcome::Pulled(r) => Some(r),
            FrontOutcome::NeverPull | FrontOutcome::Failed(..) => None,
        }
    }

    async fn kubelet_steps(&self, pod: usize, container: usize) -> FrontOutcome {
        use crate::domain::pull_policy::PullPolicy;
        let p = &self.plan.pods[pod];
        let c = &p.containers[container];
        let image = IMAGES[c.image].name;
        let spec = |image: &str| pb::ImageSpec {
            image: image.to_string(),
            runtime_handler: p.runtime_handler.clone(),
            ..pb::ImageSpec::default()
        };
        let failed = |s: tonic::Status| FrontOutcome::Failed(s.code() as i32, s.message().to_string());
        let status = |image: &str| {
            let mut client = self.kubelet.clone();
            let mut req = tonic::Request::new(pb::ImageStatusRequest { image: Some(spec(image)), verbose: false });
            req.set_timeout(KUBELET_REQUEST_TIMEOUT);
            async move { client.image_status(req).await.map(|r| r.into_inner().image) }
        };
        if matches!(c.policy, PullPolicy::IfNotPresent | PullPolicy::Never) {
            match status(image).await {
                Ok(Some(found)) => return FrontOutcome::Present(found.id),
                Ok(None) if c.policy == PullPolicy::Never => return FrontOutcome::NeverPull,
                Ok(None) => {}
                Err(s) => return failed(s),
            }
        }
        // The pod's secret, for its registry's images only (the keyring's lookup).
        let password = match p.secret {
            SecretKind::None => None,
            SecretKind::Right | SecretKind::RightElsewhere => Some(PRIVATE_PASSWORD),
            SecretKind::Wrong => Some(WRONG_PASSWORD),
        };
        let auth = password.filter(|_| image.starts_with("private.example/")).map(|password| pb::AuthConfig {
            username: PRIVATE_USER.into(),
            password: password.into(),
            ..pb::AuthConfig::default()
        });
        let sandbox = pb::PodSandboxConfig {
            metadata: Some(pb::PodSandboxMetadata {
                name: p.name.clone(),
                uid: p.uid.clone(),
                namespace: p.namespace.clone(),
                attempt: 0,
            }),
            ..pb::PodSandboxConfig::default()
        };
        let mut req =
            tonic::Request::new(pb::PullImageRequest { image: Some(spec(image)), auth, sandbox_config: Some(sandbox) });
        if let Some(d) = p.deadline {
            req.set_timeout(d);
        }
        let pulled = match self.kubelet.clone().pull_image(req).await {
            Ok(r) => r.into_inner().image_ref,
            Err(s) => return failed(s),
        };
        // The size, for its event: a failure only leaves it 0.
        let _ = status(&pulled).await;
        FrontOutcome::Pulled(pulled)
    }

    /// The kubelet's image GC ([`Plan::kubelet_gc`]) with `thresholds`
    /// (high, low percent): a run every [`KUBELET_GC_PERIOD`], and its
    /// eviction manager's `DeleteUnusedImages` every
    /// [`KUBELET_EVICTION_PERIOD`] while the disk is above the high
    /// threshold, until the run is done.
    pub async fn kubelet_gc(self: Rc<Self>, thresholds: (u64, u64)) {
        let mut next_gc = KUBELET_GC_PERIOD;
        while !self.done.get() {
            tokio::time::sleep(KUBELET_EVICTION_PERIOD).await;
            let periodic = self.now() >= next_gc;
            if periodic {
                next_gc = self.now() + KUBELET_GC_PERIOD;
            }
            self.kubelet_gc_run(thresholds, !periodic).await;
        }
    }

    /// One run of the kubelet's image GC, as its `realImageGCManager` makes
    /// it through imaged's front: `ImageFsInfo` for the usage (the capacity
    /// is cadvisor's: the disk's); above the high threshold, `ListImages`
    /// and the runtime's containers of every state (its `GetPods(true)`,
    /// not through imaged) for what is in use; then `RemoveImage` of
    /// unused images it does not see pinned and first saw
    /// [`KUBELET_MIN_AGE`] ago or more, least recently used first, until
    /// what it freed brings the usage to the low threshold (`all`: every
    /// one, the eviction manager's `DeleteUnusedImages`). A remove that
    /// fails is passed over.
    async fn kubelet_gc_run(&self, (high, low): (u64, u64), all: bool) {
        let mut c = self.kubelet.clone();
        let Ok(fs) = c.image_fs_info(pb::ImageFsInfoRequest {}).await else { return };
        let used: u64 =
            fs.into_inner().image_filesystems.iter().filter_map(|f| f.used_bytes.as_ref()).map(|u| u.value).sum();
        let capacity = self.rt.capacity_bytes();
        if capacity == 0 || used.saturating_mul(100) < capacity.saturating_mul(high) {
            return;
        }
        let to_free = if all { u64::MAX } else { used.saturating_sub(capacity / 100 * low) };
        let Ok(list) = c.list_images(pb::ListImagesRequest::default()).await else { return };
        let images = list.into_inner().images;
        let in_use: std::collections::HashSet<String> = self.rt.containers().into_iter().map(|c| c.image_ref).collect();
        let now = self.now();
        let mut candidates = Vec::new();
        {
            let mut seen = self.kubelet_seen.borrow_mut();
            seen.retain(|id, _| images.iter().any(|i| &i.id == id));
            for i in &images {
                let s = seen.entry(i.id.clone()).or_insert(KubeletSeen { first: now, last_used: now });
                if in_use.contains(&i.id) {
                    s.last_used = now;
                } else if !i.pinned && now.saturating_sub(s.first) >= KUBELET_MIN_AGE {
                    candidates.push((s.last_used, i.id.clone(), i.size));
                }
            }
        }
        candidates.sort();
        let mut freed = 0;
        for (_, id, size) in candidates {
            if freed >= to_free || self.done.get() {
                break;
            }
            tokio::time::sleep(KUBELET_REMOVE_GAP).await;
            let inc = self.current.borrow().as_ref().filter(|i| !i.dead.get()).map_or(0, |i| i.id);
            self.record(What::KubeletRemoving { id: id.clone(), inc });
            let spec = pb::ImageSpec { image: id.clone(), ..pb::ImageSpec::default() };
            let result = c.remove_image(pb::RemoveImageRequest { image: Some(spec) }).await;
            let result = result.map(|_| ()).map_err(|s| (s.code() as i32, s.message().to_string()));
            if result.is_ok() {
                freed += size;
            }
            self.record(What::KubeletRemoved { id, result });
        }
    }

    /// Creates a container on `image_ref`, as the kubelet's CreateContainer
    /// (which fails when the image is gone again).
    fn create(&self, pod: usize, container: usize, image_ref: &str) -> bool {
        let present = self.rt.images().iter().any(|i| i.id == image_ref);
        if !present {
            self.record(What::CreateFailed { pod, container, image_ref: image_ref.to_string() });
            return false;
        }
        let p = &self.plan.pods[pod];
        let c = Container {
            id: format!("{}-c{container}", p.uid),
            pod_sandbox_id: format!("sb-{}", p.uid),
            name: p.containers[container].name.clone(),
            image: ImageSpec::new(IMAGES[p.containers[container].image].name),
            image_ref: image_ref.to_string(),
            image_id: image_ref.to_string(),
            state: ContainerState::Running,
            ..Container::default()
        };
        self.rt.add_container(c.clone());
        self.pods[pod].containers.borrow_mut()[container] = Some(c);
        self.record(What::Created { pod, container, image_id: image_ref.to_string() });
        true
    }

    /// A pod's worker: ensures its images container by container, creates
    /// each container once its image is there, retries after a jittered
    /// sync period, until the pod completes or is deleted.
    pub async fn pod_worker(self: Rc<Self>, pod: usize) {
        let p = &self.plan.pods[pod];
        self.rt.add_sandbox(PodSandbox {
            id: format!("sb-{}", p.uid),
            name: p.name.clone(),
            uid: p.uid.clone(),
            namespace: p.namespace.clone(),
            state: PodSandboxState::Ready,
            runtime_handler: p.runtime_handler.clone(),
            ..PodSandbox::default()
        });
        let mut rng = StdRng::seed_from_u64(p.jitter_seed);
        let live = |w: &Self| w.pods[pod].state.get() == PodState::Live;
        while live(&self) {
            for container in 0..p.containers.len() {
                if self.pods[pod].containers.borrow()[container].is_some() {
                    continue;
                }
                let image_ref = if self.plan.via_front(pod) {
                    self.front_ensure(pod, container).await
                } else {
                    match self.ensure(pod, container).await {
                        Answer::Ok(ok) => Some(ok.image_ref),
                        _ => None,
                    }
                };
                if !live(&self) {
                    return;
                }
                let created = image_ref.is_some_and(|r| self.create(pod, container, &r));
                if !created {
                    break;
                }
            }
            let all = self.pods[pod].containers.borrow().iter().all(Option::is_some);
            if all {
                self.pods[pod].wake.notified().await;
                return;
            }
            let wait = Duration::from_millis(rng.random_range(self.plan.retry_ms.clone()));
            tokio::select! {
                biased;
                () = self.pods[pod].wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    fn complete(&self, pod: usize) {
        if self.pods[pod].state.get() != PodState::Live {
            return;
        }
        self.pods[pod].state.set(PodState::Completed);
        let mut image_ids = Vec::new();
        for c in self.pods[pod].containers.borrow_mut().iter_mut().flatten() {
            self.rt.remove_container(&c.id);
            c.state = ContainerState::Exited;
            self.rt.add_container(c.clone());
            image_ids.push(c.image_ref.clone());
        }
        self.record(What::ContainersGone { pod, image_ids, exited: true });
        self.pods[pod].wake.notify_one();
    }

    fn delete(&self, pod: usize) {
        if matches!(self.pods[pod].state.get(), PodState::Absent | PodState::Deleted) {
            return;
        }
        self.pods[pod].state.set(PodState::Deleted);
        let mut image_ids = Vec::new();
        for c in self.pods[pod].containers.borrow_mut().iter_mut() {
            if let Some(c) = c.take() {
                self.rt.remove_container(&c.id);
                image_ids.push(c.image_ref);
            }
        }
        self.record(What::ContainersGone { pod, image_ids, exited: false });
        self.rt.remove_sandbox(&format!("sb-{}", self.plan.pods[pod].uid));
        self.pods[pod].wake.notify_one();
    }

    // === Events ===

    /// Applies one step's event.
    pub async fn apply(self: &Rc<Self>, event: &Event) {
        match event {
            Event::Nothing => {}
            Event::PodArrives(i) => {
                if self.pods[*i].state.get() == PodState::Absent {
                    self.pods[*i].state.set(PodState::Live);
                    tokio::task::spawn_local(self.clone().pod_worker(*i));
                }
            }
            Event::PodCompletes(i) => self.complete(*i),
            Event::PodDeleted(i) => self.delete(*i),
            Event::Prefetch { image, priority } => self.prefetch(*image, *priority),
            Event::RunGc => self.gc(false),
            Event::DeleteUnused => self.gc(true),
            Event::ClearBackoff(what) => self.clear_backoff(*what).await,
            Event::RuntimeFaults(rules) => {
                self.faults.borrow_mut().random.clone_from(rules);
                self.apply_faults();
            }
            Event::ClearFaults => {
                self.faults.borrow_mut().random.clear();
                self.apply_faults();
            }
            Event::GatewayFaults(rules) => {
                if let Some((_, node)) = self.node() {
                    let plan = fault_plan(self.plan.seed, rules, &[]);
                    let _ = node.gateway().send(SetFaultPlan(plan)).await;
                }
            }
            Event::RuntimeDown => self.runtime.stop(),
            Event::RuntimeUp => self.runtime.resume(),
            Event::Disk(bytes) => self.rt.set_capacity(*bytes),
            Event::RegistryDown(r) => {
                let mut f = self.faults.borrow_mut();
                if !f.registries_down.contains(r) {
                    f.registries_down.push(*r);
                }
                drop(f);
                self.apply_faults();
            }
            Event::RegistryUp(r) => {
                self.faults.borrow_mut().registries_down.retain(|x| x != r);
                self.apply_faults();
            }
            Event::Pin(i, on) => {
                self.rt.set_pinned(IMAGES[*i].name, *on);
            }
            Event::Restart => self.restart(),
            Event::Crash => self.crash(),
            Event::Plugin(b) => {
                if let Some(p) = &self.plugin {
                    p.set(*b);
                }
            }
            Event::Reload(lines) => self.reload(lines),
            Event::RegistryStalls { registry, drips } => self.stall(*registry, Some(*drips)),
            Event::RegistryFlows(r) => self.stall(*r, None),
        }
        if matches!(event, Event::Restart | Event::Crash) {
            self.faults.borrow_mut().gateway = false;
        }
        if let Event::GatewayFaults(rules) = event {
            self.faults.borrow_mut().gateway = !rules.is_empty() && self.node().is_some();
        }
        self.note_clean();
    }

    /// A registry's downloads stall (`Some(drips)`) or flow again (`None`)
    /// for pulls begun from now on.
    fn stall(&self, registry: usize, drips: Option<bool>) {
        let mut f = self.faults.borrow_mut();
        f.stalling.retain(|r| *r != registry);
        if drips.is_some() {
            f.stalling.push(registry);
        }
        drop(f);
        for i in images_of(registry) {
            let entry = match drips {
                Some(d) => stalled(i, d),
                None => remote(i),
            };
            if let Some(r) = entry {
                // A name the catalogue took before takes it again.
                let _ = self.rt.add_remote(r);
            }
        }
        self.record(What::Stall { registry, drips });
    }

    /// Says whether the wire is clean when that changes.
    fn note_clean(&self) {
        let mut f = self.faults.borrow_mut();
        let faulty = !f.random.is_empty() || f.gateway || !self.runtime.is_serving();
        if faulty != f.faulty {
            f.faulty = faulty;
            drop(f);
            self.record(What::Clean(!faulty));
        }
    }

    /// The operator's edit of the settings and SIGHUP to the serving
    /// process, through `Node::reload` as the daemon's. With no process
    /// serving there is none to signal: nothing changes.
    fn reload(&self, lines: &[String]) {
        let Some((inc, node)) = self.node() else { return };
        let mut settings = super::plan::merged_settings(&self.settings.borrow(), lines);
        // The operator of set-up A keeps imaged's own GC off whatever else
        // the edit changes (the other lines of set-up A need a restart).
        if self.plan.kubelet_gc.is_some() {
            settings = super::plan::merged_settings(&settings, &[super::plan::SETUP_A[0].to_string()]);
        }
        let parsed = match Config::from_toml(&settings.join("\n")) {
            Ok(c) => c,
            Err(e) => {
                self.record(What::Reloaded { inc: inc.id, outcome: Err(format!("the reload's settings: {e}")) });
                return;
            }
        };
        // The world's own settings (state, plugin, allowlist) stay; the
        // live parts come from the edited lines.
        let mut next = self.cfg.borrow().clone();
        (next.pull.qps, next.pull.burst, next.pull.throttle_mode) =
            (parsed.pull.qps, parsed.pull.burst, parsed.pull.throttle_mode);
        next.pull.registry_rates = parsed.pull.registry_rates;
        (next.pull.registry_limit, next.pull.registry_limits) =
            (parsed.pull.registry_limit, parsed.pull.registry_limits);
        (next.pull.pull_deadline, next.pull.retries) = (parsed.pull.pull_deadline, parsed.pull.retries);
        next.pull.concurrency = parsed.pull.concurrency;
        next.backoff.delays = parsed.backoff.delays;
        next.gc = next.gc.with_policy_of(&parsed.gc);
        let reloaded = node.reload(&next);
        // What the node says is in force must be what it was given.
        let in_force = node.settings_in_force();
        let live = |c: &Config| {
            (
                c.pull.qps.to_bits(),
                c.pull.burst,
                c.pull.throttle_mode,
                c.pull.registry_rates.clone(),
                c.pull.registry_limit,
                c.pull.registry_limits.clone(),
                c.pull.pull_deadline,
                c.pull.retries,
                c.pull.concurrency,
                c.backoff.delays,
            )
        };
        if live(&in_force) != live(&next) || in_force.gc != next.gc {
            // Every live setting, the pull limit and registry limits too.
            let e = format!(
                "after the reload the node has {:?}, gc {:?}; it was given {:?}, gc {:?}",
                live(&in_force),
                in_force.gc,
                live(&next),
                next.gc
            );
            self.record(What::Reloaded { inc: inc.id, outcome: Err(e) });
        }
        *self.settings.borrow_mut() = settings;
        *self.cfg.borrow_mut() = next.clone();
        self.record(What::Reloaded { inc: inc.id, outcome: Ok((Box::new(next), reloaded)) });
    }

    /// The runtime's fault plan from the faults in force.
    fn apply_faults(&self) {
        let mut f = self.faults.borrow_mut();
        f.changes += 1;
        let plan = fault_plan(self.plan.seed ^ f.changes, &f.random, &f.registries_down);
        self.rt.set_fault_plan(plan);
    }

    /// Ends every fault and outage, brings the runtime back and gives the
    /// disk room: the quiet phase at the end of a run.
    pub async fn calm(&self) {
        if let Some((_, node)) = self.node() {
            let _ = node.gateway().send(SetFaultPlan(FaultPlan::default())).await;
        }
        let stalling = std::mem::take(&mut self.faults.borrow_mut().stalling);
        for r in stalling {
            self.stall(r, None);
        }
        let faulty = self.faults.borrow().faulty;
        *self.faults.borrow_mut() = Faults { faulty, ..Faults::default() };
        self.rt.set_fault_plan(FaultPlan::default());
        self.runtime.resume();
        self.note_clean();
        self.rt.set_capacity(20_000 * 1_000_000);
        if let Some(p) = &self.plugin {
            p.heal();
        }
    }

    fn prefetch(self: &Rc<Self>, image: usize, priority: i32) {
        let Some((inc, node)) = self.node() else { return };
        let mut req = PrefetchRequest::new(IMAGES[image].name);
        req.priority = priority;
        self.record(What::PrefetchStarted { image });
        let call = inc.spawn(async move {
            match node.prefetch(&req).await {
                Ok(Ok(Prefetch::Present { image_ref })) => Ok(image_ref),
                Ok(Ok(Prefetch::Pulling { done, .. })) => done.await,
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        });
        let world = self.clone();
        tokio::task::spawn_local(async move {
            let result = call.await.unwrap_or_else(|_| Err("imaged died".into()));
            world.record(What::PrefetchEnded { image, result });
        });
    }

    fn gc(self: &Rc<Self>, unused: bool) {
        let Some((inc, node)) = self.node() else { return };
        let call = inc.spawn(async move {
            if unused { node.delete_unused_images(false).await } else { node.garbage_collect(false).await }
        });
        let world = self.clone();
        tokio::task::spawn_local(async move {
            let result = match call.await {
                Ok(Ok(report)) => Ok(report),
                Ok(Err(crate::node::NodeError::Gc(e))) => match e.report() {
                    Some(r) => Ok(r.clone()),
                    None => Err(e.to_string()),
                },
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err("imaged died".into()),
            };
            world.record(What::Gc { requested: true, result });
        });
    }

    async fn clear_backoff(&self, what: ClearWhat) {
        let Some((_, node)) = self.node() else { return };
        let (scope, pod_uid, image) = match what {
            ClearWhat::All => (ClearScope::All, None, None),
            ClearWhat::Pod(i) => {
                let uid = self.plan.pods[i].uid.clone();
                (ClearScope::Pod(uid.clone()), Some(uid), None)
            }
            ClearWhat::Image(i) => {
                (ClearScope::Image(IMAGES[i].name.to_string()), None, Some(IMAGES[i].name.to_string()))
            }
        };
        if node.clear_backoff(scope).await.is_ok() {
            self.record(What::BackoffCleared { pod_uid, image });
        }
    }

    /// The key a back-off is kept under for a pod's container.
    pub fn backoff_key(&self, pod: usize, container: usize) -> BackoffKey {
        let p = &self.plan.pods[pod];
        BackoffKey { pod_uid: p.uid.clone(), image: IMAGES[p.containers[container].image].name.to_string() }
    }

    /// Records a step's event in the log.
    pub fn step(&self, index: usize, event: &Event) {
        self.record(What::Step { index, event: event.describe(&self.plan) });
    }

    /// Ends the run: kills imaged, stops the runtime.
    pub fn shut(&self) {
        self.done.set(true);
        self.crash();
        self.runtime.stop();
        self.runtime.set_observer(None);
    }
}

/// A fault plan from the plan's rules, registries down first.
fn fault_plan(seed: u64, rules: &[FaultSpec], down: &[usize]) -> FaultPlan {
    let mut plan = FaultPlan::new(seed);
    for r in down {
        let host = REGISTRIES[*r];
        plan = plan.rule(FaultRule::on(Rpc::PullImage).image(&format!("{host}/*")).fail(CriError::new(
            CriErrorKind::RegistryUnavailable,
            format!("failed to resolve reference: dial tcp {host}:443: connect: connection refused"),
        )));
    }
    for spec in rules {
        let mut rule = FaultRule::on(spec.rpc).probability(spec.probability);
        if let Some(glob) = &spec.image {
            rule = rule.image(glob);
        }
        rule = match spec.action {
            FaultKind::Fail(kind) => rule.fail(CriError::new(kind, format!("simulated {kind:?} fault"))),
            FaultKind::Delay(d) => rule.delay(d),
            FaultKind::Hang => rule.hang(),
            FaultKind::DropReply => rule.drop_reply(),
        };
        plan = plan.rule(rule);
    }
    plan
}

/// Writes a process's events to the log, as a subscriber of its node.
struct EventRecorder {
    inc: u32,
    log: Log,
    start: Instant,
}

impl Actor for EventRecorder {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        // Events come with try_send: a full mailbox would lose them.
        ctx.set_mailbox_capacity(1 << 20);
    }
}

impl Handler<ImageEvent> for EventRecorder {
    type Result = ();
    fn handle(&mut self, event: ImageEvent, _: &mut Self::Context) {
        self.log.push(self.start.elapsed(), What::Event { inc: self.inc, event });
    }
}
