//! What a run saw, in the order it happened: the plan's events as they are
//! applied, the runtime's side of every pull and removal, imaged's events,
//! every ensure's start and answer, the kubelet's containers, GC reports,
//! process lifecycles. The invariants read it; the trace is it, one line per
//! entry.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::actors::gc_executor::GcReport;
use crate::embedded::Observed;
use crate::ensure::{EnsureError, EnsureOk};
use crate::events::ImageEvent;
use crate::node::NodeError;

/// An ensure's answer as the kubelet got it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The image is there.
    Ok(EnsureOk),
    /// The kubelet's error.
    Err(EnsureError),
    /// The node refused or an actor was gone.
    Node(NodeError),
    /// imaged died before answering (the kubelet sees its connection drop).
    Lost,
    /// No imaged was running to ask.
    NoNode,
}

/// How the kubelet's own image steps for a container ended, through
/// imaged's CRI front (a pod of [`Plan::front_pods`](super::plan::Plan::front_pods)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontOutcome {
    /// `ImageStatus` found the image (this id): no pull.
    Present(String),
    /// `PullImage` answered with this id (then `ImageStatus` for the size).
    Pulled(String),
    /// `Never`, and `ImageStatus` found nothing.
    NeverPull,
    /// A call failed with this gRPC code and message.
    Failed(i32, String),
}

/// What happened to one imaged process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Life {
    /// It started and serves.
    Started,
    /// It could not start (the service manager retries).
    StartFailed(String),
    /// A graceful stop began.
    Stopping,
    /// It exited after a graceful stop.
    Exited,
    /// It was killed.
    Killed,
}

/// How one run of the credential plugin ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginOutcome {
    /// It answered with credentials (`stale`: an expired token).
    Credentials {
        /// The token was expired.
        stale: bool,
    },
    /// It exited with this code.
    Exited(i32),
    /// It answered with something the provider refuses.
    Malformed(super::plan::Malformed),
    /// It never answered: the provider's timeout (or a kill) ended it.
    CutOff,
}

/// One thing that happened.
#[derive(Debug, Clone)]
pub enum What {
    /// A reload reached the serving process (`inc`): the configuration it
    /// made and what `Node::reload` said of it, or why its settings did not
    /// load.
    Reloaded {
        /// The incarnation reloaded.
        inc: u32,
        /// The new configuration and the node's answer, or the error.
        outcome: Result<(Box<crate::config::Config>, crate::node::Reloaded), String>,
    },
    /// A step's event is applied.
    Step {
        /// The step.
        index: usize,
        /// The event, described.
        event: String,
    },
    /// The runtime's side of a call.
    Runtime(Observed),
    /// imaged emitted an event.
    Event {
        /// The incarnation that emitted it.
        inc: u32,
        /// The event.
        event: ImageEvent,
    },
    /// The kubelet asks for a container's image.
    EnsureStarted {
        /// Numbers the ensure.
        id: u64,
        /// The incarnation asked.
        inc: u32,
        /// The pod (plan index).
        pod: usize,
        /// The container (index in the pod).
        container: usize,
    },
    /// The kubelet's steps for it through the CRI front ended (it began
    /// with an [`EnsureStarted`](What::EnsureStarted)).
    FrontEnded {
        /// The ensure.
        id: u64,
        /// The pod (plan index).
        pod: usize,
        /// The container (index in the pod).
        container: usize,
        /// How.
        outcome: FrontOutcome,
    },
    /// The kubelet's own image GC sends a `RemoveImage` of this image
    /// through the CRI front ([`Plan::kubelet_gc`](super::plan::Plan::kubelet_gc)).
    KubeletRemoving {
        /// The image's id.
        id: String,
        /// The incarnation whose front it is sent to (0: none serves).
        inc: u32,
    },
    /// It was answered: `Err` with the gRPC code and message.
    KubeletRemoved {
        /// The image's id.
        id: String,
        /// The answer.
        result: Result<(), (i32, String)>,
    },
    /// It got its answer.
    EnsureEnded {
        /// The ensure.
        id: u64,
        /// The answer.
        answer: Answer,
    },
    /// The kubelet created a container on an ensured image.
    Created {
        /// The pod.
        pod: usize,
        /// The container.
        container: usize,
        /// The image id it runs.
        image_id: String,
    },
    /// A pod's containers were deleted (`exited`: they exited and stay).
    ContainersGone {
        /// The pod.
        pod: usize,
        /// The image ids they ran on.
        image_ids: Vec<String>,
        /// They exited (and still count as using their images).
        exited: bool,
    },
    /// Creating it failed: its image was gone again.
    CreateFailed {
        /// The pod.
        pod: usize,
        /// The container.
        container: usize,
        /// The image ref the ensure gave.
        image_ref: String,
    },
    /// A prefetch was asked of the serving process.
    PrefetchStarted {
        /// The image (plan index).
        image: usize,
    },
    /// A prefetch ended.
    PrefetchEnded {
        /// The image (plan index).
        image: usize,
        /// Its image ref, or why not.
        result: Result<String, String>,
    },
    /// A GC run's report (a requested run's, or the periodic run's latest).
    Gc {
        /// Whether the simulation asked for it (else it was found as the last report).
        requested: bool,
        /// The report, or the error.
        result: Result<Arc<GcReport>, String>,
    },
    /// A registry's downloads stall from now on (`Some(drips)`), or flow
    /// again (`None`): pulls begun meanwhile stall
    /// ([`Event::RegistryStalls`](super::plan::Event::RegistryStalls)).
    Stall {
        /// Index in [`REGISTRIES`](super::plan::REGISTRIES).
        registry: usize,
        /// Stalled (dripping or not), or flowing.
        drips: Option<bool>,
    },
    /// Whether the wire is clean from now on: no runtime or gateway fault
    /// rules in force and the runtime serving (said when it changes).
    Clean(bool),
    /// Back-offs were cleared.
    BackoffCleared {
        /// Which pod's (`None` = every pod's); with `image`, which image's.
        pod_uid: Option<String>,
        /// Which image's.
        image: Option<String>,
    },
    /// imaged ran the credential plugin.
    PluginRun {
        /// Numbers the run.
        run: u64,
        /// The image it was asked about.
        image: String,
    },
    /// The run ended.
    PluginEnded {
        /// The run.
        run: u64,
        /// How.
        outcome: PluginOutcome,
    },
    /// An imaged process changed.
    Life {
        /// Its number.
        inc: u32,
        /// What happened.
        what: Life,
    },
}

/// One entry: when, and what.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Simulated time since the run began.
    pub at: Duration,
    /// What.
    pub what: What,
}

/// The log, shared with the runtime's observer (another thread could call
/// it in principle, hence the mutex; in a run everything is one thread).
#[derive(Debug, Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Entry>>>);

impl Log {
    /// Appends `what` at `at`.
    pub fn push(&self, at: Duration, what: What) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(Entry { at, what });
    }

    /// Takes every entry appended since the last take.
    pub fn take(&self) -> Vec<Entry> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Shortens an image id for a trace line (`sha256:0123456789ab`).
pub fn short(id: &str) -> &str {
    id.get(..19).unwrap_or(id)
}

impl Entry {
    /// The trace line, without the time.
    pub fn line(&self, plan: &super::plan::Plan) -> String {
        let pod =
            |i: &usize| plan.pods.get(*i).map_or_else(|| format!("#{i}"), |p| format!("{}/{}", p.namespace, p.name));
        match &self.what {
            What::Step { index, event } => format!("step {index}: {event}"),
            What::Runtime(Observed::PullStarted { call, image, runtime_handler, auth }) => format!(
                "  runtime: PullImage #{call} {image}{}{}",
                if runtime_handler.is_empty() { String::new() } else { format!(" handler {runtime_handler}") },
                auth.as_ref().map_or(String::new(), |a| format!(" auth {}", a.get(..8).unwrap_or(a)))
            ),
            What::Runtime(Observed::Downloading { call, stalls_after, drips, .. }) => match stalls_after {
                Some(after) => format!(
                    "  runtime: PullImage #{call} downloads, stalling after {}{}",
                    crate::domain::go_text::duration(*after),
                    if *drips > 0 { format!(", then {drips} bytes/s") } else { String::new() }
                ),
                None => format!("  runtime: PullImage #{call} downloads"),
            },
            What::Runtime(Observed::PullEnded { call, image_id }) => match image_id {
                Some(id) => format!("  runtime: PullImage #{call} done: {}", short(id)),
                None => format!("  runtime: PullImage #{call} ended without an image"),
            },
            What::Runtime(Observed::Removing { id, names, .. }) => {
                format!("  runtime: RemoveImage {} ({})", short(id), names.first().map_or("", String::as_str))
            }
            What::Event { inc, event } => format!(
                "  imaged#{inc} event {} {} {}: {}",
                event.reason.as_str(),
                event.object.pod_uid,
                event.image,
                event.message
            ),
            What::EnsureStarted { id, inc, pod: p, container } => {
                let c = &plan.pods[*p].containers[*container];
                format!(
                    "  kubelet: ensure #{id} {} {} {} {} (imaged#{inc})",
                    pod(p),
                    c.name,
                    super::plan::IMAGES[c.image].name,
                    c.policy.as_str()
                )
            }
            What::EnsureEnded { id, answer } => format!("  kubelet: ensure #{id} -> {}", describe(answer)),
            What::FrontEnded { id, outcome, .. } => {
                let how = match outcome {
                    FrontOutcome::Present(i) => format!("present {}", short(i)),
                    FrontOutcome::Pulled(i) => format!("pulled {}", short(i)),
                    FrontOutcome::NeverPull => "ErrImageNeverPull".into(),
                    FrontOutcome::Failed(code, message) => format!("code {code}: {message}"),
                };
                format!("  kubelet: ensure #{id} through the CRI front -> {how}")
            }
            What::KubeletRemoving { id, inc } => {
                format!("  kubelet: GC removes {} through the front of imaged#{inc}", short(id))
            }
            What::KubeletRemoved { id, result } => match result {
                Ok(()) => format!("  kubelet: GC removed {}", short(id)),
                Err((code, message)) => format!("  kubelet: GC's remove of {} -> code {code}: {message}", short(id)),
            },
            What::Created { pod: p, container, image_id } => {
                format!("  kubelet: {} container c{container} created on {}", pod(p), short(image_id))
            }
            What::ContainersGone { pod: p, image_ids, exited } => format!(
                "  kubelet: {} containers {} ({})",
                pod(p),
                if *exited { "exited" } else { "deleted" },
                image_ids.iter().map(|i| short(i)).collect::<Vec<_>>().join(", ")
            ),
            What::CreateFailed { pod: p, container, image_ref } => {
                format!("  kubelet: {} container c{container}: image {} is gone", pod(p), short(image_ref))
            }
            What::PrefetchStarted { image } => format!("  prefetch {} asked", super::plan::IMAGES[*image].name),
            What::PrefetchEnded { image, result } => {
                format!("  prefetch {}: {:?}", super::plan::IMAGES[*image].name, result.as_ref().map(|r| short(r)))
            }
            What::Gc { requested, result } => match result {
                Ok(r) => format!(
                    "  gc{}: usage {:?}% to free {} removed {} ({} bytes){}",
                    if *requested { " (asked)" } else { "" },
                    r.usage_percent,
                    r.amount_to_free,
                    r.removed.len(),
                    r.bytes_expected,
                    r.target_missed.as_ref().map_or(String::new(), |m| format!(": {m}"))
                ),
                Err(e) => format!("  gc{}: {e}", if *requested { " (asked)" } else { "" }),
            },
            What::Stall { registry, drips } => format!(
                "  downloads of {} {}",
                super::plan::REGISTRIES[*registry],
                match drips {
                    Some(true) => "stall (dripping)",
                    Some(false) => "stall",
                    None => "flow",
                }
            ),
            What::Clean(clean) => format!("  wire {}", if *clean { "clean" } else { "faulty" }),
            What::BackoffCleared { pod_uid, image } => format!("  back-off cleared: pod {pod_uid:?} image {image:?}"),
            What::PluginRun { run, image } => format!("  plugin: run #{run} for {image}"),
            What::PluginEnded { run, outcome } => match outcome {
                PluginOutcome::Credentials { stale: false } => {
                    format!("  plugin: run #{run} answered with credentials")
                }
                PluginOutcome::Credentials { stale: true } => {
                    format!("  plugin: run #{run} answered with an expired token")
                }
                PluginOutcome::Exited(code) => format!("  plugin: run #{run} exited {code}"),
                PluginOutcome::Malformed(m) => format!("  plugin: run #{run} answered malformed ({m:?})"),
                PluginOutcome::CutOff => format!("  plugin: run #{run} cut off"),
            },
            What::Life { inc, what } => format!("imaged#{inc}: {what:?}"),
            What::Reloaded { inc, outcome: Ok((_, r)) } => {
                format!("imaged#{inc}: reloaded; applied {:?}, needs a restart {:?}", r.applied, r.needs_restart)
            }
            What::Reloaded { inc, outcome: Err(e) } => format!("imaged#{inc}: not reloaded: {e}"),
        }
    }
}

fn describe(a: &Answer) -> String {
    match a {
        Answer::Ok(ok) if ok.message.is_empty() => format!("pulled {}", short(&ok.image_ref)),
        Answer::Ok(ok) => format!("present {}", short(&ok.image_ref)),
        Answer::Err(e) => format!("{}: {}", e.kind, e.message),
        Answer::Node(e) => format!("node: {e}"),
        Answer::Lost => "lost (imaged died)".into(),
        Answer::NoNode => "no imaged running".into(),
    }
}
