//! The whole-node simulator (`imaged simulate`): imaged's real actors, the
//! embedded runtime and the durable store, run from one seed on one thread
//! on paused time, under a seeded workload, fault plan and process events,
//! with invariants checked after every step — FoundationDB's simulation
//! testing, TigerBeetle's VOPR, for an image manager. See
//! `docs/simulation.md`.
//!
//! - [`plan`]: what a seed draws: settings, images, pods, the schedule.
//! - [`world`]: the node that runs it: runtime, imaged processes, kubelet.
//! - [`check`]: the invariants.
//! - [`log`]: what a run saw, in order; the trace.
//!
//! A run is a pure function of its seed (and step count, and the steps it
//! keeps): [`run`] twice gives the same trace, line for line (a test holds
//! it). A failing run names the seed, the step, the invariant and the trace;
//! [`shrink`] drops the events that do not matter.

pub mod check;
pub mod cli;
pub mod log;
pub mod plan;
pub mod plugin;
pub mod world;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use check::{INVARIANTS, Stats, Violation};
pub use plan::{Event, Plan, Shape};

use check::{Checker, Snapshot, StepView};
use plan::{IMAGES, SANDBOX};
use world::{PodState, World};

/// Steps of a run unless told otherwise.
pub const DEFAULT_STEPS: usize = 2_000;

/// The quiet phase after the schedule: no faults, room on disk, the
/// runtime up; this many checks this far apart, then liveness.
const QUIET_CHECKS: usize = 60;
const QUIET_STEP: Duration = Duration::from_secs(30);

/// How a run goes.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Steps of the schedule.
    pub steps: usize,
    /// Keep only these steps' events (the others become `Nothing`); `None`
    /// keeps all.
    pub keep: Option<BTreeSet<usize>>,
    /// Keep every trace line (else the last few hundred and a hash).
    pub full_trace: bool,
    /// The shape the seed's plan is drawn in ([`Shape::CURRENT`] by default).
    pub shape: Shape,
}

impl Options {
    /// `steps` steps, every event, the short trace.
    pub fn steps(steps: usize) -> Self {
        Self { steps, ..Self::default() }
    }
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// The name of the shape its plan was drawn in.
    pub shape: &'static str,
    /// Steps planned.
    pub steps: usize,
    /// The first invariant that broke, if any.
    pub violation: Option<Violation>,
    /// A hash of the whole trace (equal runs, equal hashes).
    pub trace_hash: u64,
    /// A hash of the final state: the runtime's images and the store.
    pub state_hash: u64,
    /// The last lines of the trace.
    pub tail: Vec<String>,
    /// Every line, with [`Options::full_trace`].
    pub trace: Option<Vec<String>>,
    /// Counts.
    pub stats: Stats,
    /// Simulated time the run covered.
    pub simulated: Duration,
    /// The plan's non-empty events kept (for the report).
    pub events: Vec<(usize, String)>,
}

impl Outcome {
    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.violation.is_none()
    }
}

thread_local! {
    static ACTIVE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Records panics on a simulating thread (a panicking task of a
/// current-thread runtime only ends that task: the run must know);
/// elsewhere the previous hook runs.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if ACTIVE.with(std::cell::Cell::get) {
                PANICS.with(|p| p.borrow_mut().push(info.to_string()));
            } else {
                previous(info);
            }
        }));
    });
}

/// A fresh state directory for one run: on tmpfs when there is one (the
/// store syncs every commit).
fn state_dir(seed: u64) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    base.join(format!("imaged-sim-{}-{seed}-{n}", std::process::id()))
}

/// Where a run's credential plugin keeps its files: beside its state.
fn plugin_dir(state: &std::path::Path) -> PathBuf {
    let mut name = state.as_os_str().to_owned();
    name.push("-plugin");
    PathBuf::from(name)
}

/// Runs `seed`'s plan.
pub fn run(seed: u64, opts: &Options) -> Outcome {
    run_plan(Plan::generate_shaped(seed, opts.steps, &opts.shape), opts)
}

/// Runs `plan`, keeping the steps `opts` keeps.
pub fn run_plan(mut plan: Plan, opts: &Options) -> Outcome {
    if let Some(keep) = &opts.keep {
        for (i, s) in plan.steps.iter_mut().enumerate() {
            if !keep.contains(&i) {
                s.event = Event::Nothing;
            }
        }
    }
    let plan = Rc::new(plan);
    let dir = state_dir(plan.seed);
    install_panic_hook();
    ACTIVE.with(|a| a.set(true));
    PANICS.with(|p| p.borrow_mut().clear());
    crate::blocking::run_inline_on_this_thread(true);
    crate::blocking::answer_inline_after(plan.store_latency_model());
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| simulate(&plan, &dir, opts.full_trace)));
    crate::blocking::answer_inline_after(None);
    crate::blocking::run_inline_on_this_thread(false);
    ACTIVE.with(|a| a.set(false));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(plugin_dir(&dir));
    let events = plan
        .steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.event != Event::Nothing)
        .map(|(i, s)| (i, s.event.describe(&plan)))
        .collect();
    match outcome {
        Ok(mut o) => {
            o.events = events;
            o
        }
        Err(_) => {
            let panics = PANICS.with(|p| p.borrow_mut().drain(..).collect::<Vec<_>>());
            Outcome {
                seed: plan.seed,
                shape: plan.shape,
                steps: plan.steps.len(),
                violation: Some(Violation {
                    invariant: "actors-alive",
                    step: 0,
                    at: Duration::ZERO,
                    message: format!("the simulation itself panicked: {}", panics.join("; ")),
                }),
                trace_hash: 0,
                state_hash: 0,
                tail: Vec::new(),
                trace: None,
                stats: Stats::default(),
                simulated: Duration::ZERO,
                events,
            }
        }
    }
}

/// The run on a fresh paused, single-threaded runtime with an actix System.
fn simulate(plan: &Rc<Plan>, dir: &std::path::Path, full_trace: bool) -> Outcome {
    let failed = |message: String| Outcome {
        seed: plan.seed,
        shape: plan.shape,
        steps: plan.steps.len(),
        violation: Some(Violation { invariant: "actors-alive", step: 0, at: Duration::ZERO, message }),
        trace_hash: 0,
        state_hash: 0,
        tail: Vec::new(),
        trace: None,
        stats: Stats::default(),
        simulated: Duration::ZERO,
        events: Vec::new(),
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build() {
        Ok(rt) => rt,
        Err(e) => return failed(format!("no tokio runtime: {e}")),
    };
    let system = actix::System::with_tokio_rt(move || rt);
    let plan = plan.clone();
    let dir = dir.to_path_buf();
    system.block_on(async move {
        let plugins = plugin_dir(&dir);
        match World::new(plan.clone(), dir, &plugins) {
            Ok(world) => drive(&world, full_trace).await,
            Err(e) => failed(format!("the node could not be set up: {e}")),
        }
    })
}

/// The store as a process starting now finds it.
fn snapshot(dir: &std::path::Path) -> Result<Snapshot, String> {
    let store = crate::store::Store::open(dir).map_err(|e| e.to_string())?;
    let pulls = store.pull_records_state().map_err(|e| e.to_string())?;
    let images = store.image_records().map_err(|e| e.to_string())?;
    Ok(Snapshot {
        intents: pulls.intents.into_iter().collect(),
        records: pulls.records.into_iter().map(|r| (r.image_ref.clone(), r)).collect(),
        images: images.into_iter().map(|r| ((r.key.id.clone(), r.key.runtime_handler.clone()), r)).collect(),
    })
}

/// A shared slot for the first violation, wherever it is seen.
type Slot = Rc<RefCell<Option<Violation>>>;

fn note(slot: &Slot, r: Result<(), Violation>) {
    if let Err(v) = r {
        slot.borrow_mut().get_or_insert(v);
    }
}

/// The runtime's images, by id and the runtime handler they were pulled for.
fn present_ids(world: &World) -> BTreeSet<(String, String)> {
    world
        .rt
        .images()
        .into_iter()
        .map(|i| {
            let handler = i.spec.as_ref().map_or(String::new(), |s| s.runtime_handler.clone());
            (i.id, handler)
        })
        .collect()
}

/// Steps the plan, checking after each; then the quiet phase and liveness.
async fn drive(world: &Rc<World>, full_trace: bool) -> Outcome {
    let plan = world.plan.clone();
    let checker =
        Rc::new(RefCell::new(Checker::new(plan.clone(), &world.cfg.borrow(), world.ids[SANDBOX].clone(), full_trace)));
    let slot: Slot = Rc::default();
    let (c, s, dir) = (checker.clone(), slot.clone(), world.dir.clone());
    let supervisor = tokio::task::spawn_local(world.clone().supervise(move |w, id| {
        let mut c = c.borrow_mut();
        note(&s, c.absorb(w.log.take()));
        if id > 1 {
            let r = snapshot(&dir)
                .map_err(|e| Violation {
                    invariant: "durable",
                    step: c.step(),
                    at: w.now(),
                    message: format!("the store cannot be read at restart: {e}"),
                })
                .and_then(|snap| c.restarted(snap, &present_ids(w)));
            note(&s, r);
        }
    }));
    let kubelet_gc = plan.kubelet_gc.map(|t| tokio::task::spawn_local(world.clone().kubelet_gc(t)));
    for (i, step) in plan.steps.iter().enumerate() {
        if slot.borrow().is_some() {
            break;
        }
        world.step(i, &step.event);
        world.apply(&step.event).await;
        tokio::time::sleep(step.dt).await;
        settle().await;
        let r = check_step(world, &checker).await;
        note(&slot, r);
    }
    if slot.borrow().is_none() {
        world.calm().await;
        for _ in 0..QUIET_CHECKS {
            tokio::time::sleep(QUIET_STEP).await;
            settle().await;
            let r = check_step(world, &checker).await;
            note(&slot, r);
            if slot.borrow().is_some() {
                break;
            }
        }
    }
    if slot.borrow().is_none() {
        let mut c = checker.borrow_mut();
        note(&slot, c.absorb(world.log.take()));
        let started = |i: usize| {
            let live = world.pods[i].state.get() == PodState::Live;
            (live, world.pods[i].containers.borrow().iter().all(Option::is_some))
        };
        note(&slot, c.finish(&started));
    }
    let simulated = world.now();
    world.shut();
    supervisor.abort();
    if let Some(k) = kubelet_gc {
        k.abort();
    }
    settle().await;
    let mut c = checker.borrow_mut();
    let _ = c.absorb(world.log.take());
    let mut state = String::new();
    for i in world.rt.images() {
        let _ = writeln!(state, "{} {:?} {}", i.id, i.repo_tags, i.size);
    }
    let violation = slot.borrow_mut().take();
    Outcome {
        seed: plan.seed,
        shape: plan.shape,
        steps: plan.steps.len(),
        violation,
        trace_hash: c.trace_hash(),
        state_hash: state
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)),
        tail: c.tail(),
        trace: c.full_trace().map(<[String]>::to_vec),
        stats: c.stats,
        simulated,
        events: Vec::new(),
    }
}

/// Lets every task ready at this instant run.
async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

/// The end-of-step checks: the log so far, then what the actors say.
async fn check_step(world: &Rc<World>, checker: &Rc<RefCell<Checker>>) -> Result<(), Violation> {
    let mut view = StepView::default();
    let mut stopped = None;
    if let Some((inc, node)) = world.node() {
        let (id, inc) = (inc.id, Rc::downgrade(&inc));
        match node.status().await {
            Ok(s) => {
                view.inc = id;
                view.queue = Some(s.queue);
                view.backoffs = Some(s.backoffs);
                view.last_gc = s.last_gc;
            }
            Err(e) if inc.upgrade().is_some_and(|i| i.serving().is_some()) => stopped = Some((id, e)),
            Err(_) => {}
        }
    }
    if let Some(report) = &view.last_gc
        && world.last_gc.replace(Some(report.started)) != Some(report.started)
    {
        world.log.push(world.now(), log::What::Gc { requested: false, result: Ok(report.clone()) });
    }
    let mut c = checker.borrow_mut();
    c.absorb(world.log.take())?;
    if let Some((inc, e)) = stopped {
        return Err(Violation {
            invariant: "actors-alive",
            step: c.step(),
            at: world.now(),
            message: format!("imaged#{inc} serves, but {e}"),
        });
    }
    let panics = PANICS.with(|p| p.borrow_mut().drain(..).collect::<Vec<_>>());
    if let Some(p) = panics.first() {
        return Err(Violation {
            invariant: "actors-alive",
            step: c.step(),
            at: world.now(),
            message: format!("a task panicked: {p}"),
        });
    }
    c.step_end(world.now(), &view)
}

/// Shrinks a failing run: the fewest events (by delta debugging over the
/// steps that have one) with which the same invariant still breaks, within
/// `budget` runs. Returns the steps kept and the failing outcome with them.
pub fn shrink(seed: u64, steps: usize, shape: &Shape, failed: &Outcome, budget: usize) -> (BTreeSet<usize>, Outcome) {
    let steps = failed.violation.as_ref().map_or(steps, |v| steps.min(v.step + 1));
    shrink_plan(&Plan::generate_shaped(seed, steps, shape), failed, budget)
}

/// [`shrink`] of a given plan (one a test changed, say): its steps after
/// the failing one are dropped first.
pub fn shrink_plan(plan: &Plan, failed: &Outcome, budget: usize) -> (BTreeSet<usize>, Outcome) {
    let Some(v) = &failed.violation else { return (BTreeSet::new(), failed.clone()) };
    let invariant = v.invariant;
    let mut plan = plan.clone();
    plan.steps.truncate(v.step + 1);
    let steps = plan.steps.len();
    let mut kept: Vec<usize> =
        plan.steps.iter().enumerate().filter(|(_, s)| s.event != Event::Nothing).map(|(i, _)| i).collect();
    let mut best = failed.clone();
    let mut runs = 0;
    let fails = |keep: &[usize], runs: &mut usize| -> Option<Outcome> {
        *runs += 1;
        let opts = Options { steps, keep: Some(keep.iter().copied().collect()), ..Options::default() };
        let o = run_plan(plan.clone(), &opts);
        o.violation.as_ref().is_some_and(|x| x.invariant == invariant).then_some(o)
    };
    // The truncated plan first: it must still fail.
    match fails(&kept, &mut runs) {
        Some(o) => best = o,
        None => return (kept.into_iter().collect(), best),
    }
    let mut chunk = kept.len().div_ceil(2).max(1);
    while runs < budget && !kept.is_empty() {
        let mut removed_any = false;
        let mut start = 0;
        while start < kept.len() && runs < budget {
            let end = (start + chunk).min(kept.len());
            let candidate: Vec<usize> = kept[..start].iter().chain(&kept[end..]).copied().collect();
            if let Some(o) = fails(&candidate, &mut runs) {
                kept = candidate;
                best = o;
                removed_any = true;
            } else {
                start = end;
            }
        }
        if chunk == 1 && !removed_any {
            break;
        }
        if !removed_any {
            chunk = chunk.div_ceil(2).max(1);
        }
    }
    (kept.into_iter().collect(), best)
}

/// A failing outcome as a report: the seed, the step, the invariant, the
/// events kept and the last lines of the trace, and how to replay it.
pub fn report(o: &Outcome, keep: Option<&BTreeSet<usize>>) -> String {
    let mut s = String::new();
    let Some(v) = &o.violation else {
        let _ = writeln!(s, "seed {}: every invariant held over {} steps", o.seed, o.steps);
        return s;
    };
    let _ = writeln!(
        s,
        "seed {}: invariant `{}` broken at step {} (t={}.{:03}s):\n  {}",
        o.seed,
        v.invariant,
        v.step,
        v.at.as_secs(),
        v.at.subsec_millis(),
        v.message
    );
    let mut replay = format!("imaged simulate --seed {} --steps {}", o.seed, o.steps);
    if o.shape != Shape::CURRENT.name {
        let _ = write!(replay, " --shape {}", o.shape);
    }
    if let Some(k) = keep {
        let list: Vec<String> = k.iter().map(ToString::to_string).collect();
        let _ = write!(replay, " --keep {}", list.join(","));
    }
    let _ = writeln!(s, "replay: {replay}");
    let _ = writeln!(s, "events ({}):", o.events.len());
    for (i, e) in o.events.iter().take(200) {
        let _ = writeln!(s, "  step {i}: {e}");
    }
    if o.events.len() > 200 {
        let _ = writeln!(s, "  … {} more", o.events.len() - 200);
    }
    let _ = writeln!(s, "trace (last {} lines):", o.tail.len().min(80));
    for l in o.tail.iter().rev().take(80).rev() {
        let _ = writeln!(s, "  {l}");
    }
    s
}

/// The images a plan names (for docs and reports).
pub fn image_names() -> Vec<&'static str> {
    IMAGES.iter().map(|i| i.name).collect()
}
