//! Each invariant can fail: a short log (or store, or report) that breaks
//! it makes the checker name it, and the same log without the breach
//! passes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::*;
use crate::actors::gc_executor::ReportEntry;
use crate::domain::pull_policy::PullPolicy;
use crate::domain::{ErrorClass, ImageErrorKind};
use crate::ensure::{EnsureError, EnsureOk};
use crate::events::{EventType, ImageEvent, ObjectRef};
use crate::gc::capacity::FsCapacity;
use crate::gc::plan::{DeleteReason, GcMode, KeepReason, Verdict};
use crate::sim::plan::{CacheKey, PLUGIN_TOKEN, PluginBehaviour, PluginMode, PluginPlan, SimContainer, SimPod};

const SANDBOX_ID: &str = "sha256:5a4db0c5a4db0c5a4db0c5a4db0c";
/// `docker.io/library/busybox:1.36`.
const PUBLIC: usize = 1;
/// `private.example/billing/ledger:2`.
const PRIVATE: usize = 9;
/// `ecr.example/team/app:1` (the plugin's registry).
const ECR: usize = 15;

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn pod(image: usize, secret: SecretKind) -> SimPod {
    SimPod {
        namespace: "default".into(),
        name: "pod-0".into(),
        uid: "uid-0000".into(),
        priority: 0,
        secret,
        runtime_handler: String::new(),
        deadline: None,
        containers: vec![SimContainer { name: "c0".into(), image, policy: PullPolicy::IfNotPresent }],
        jitter_seed: 0,
    }
}

/// A checker for one pod under `settings` (over the defaults), with
/// imaged#1 serving.
fn checker(settings: &[&str], pod: SimPod) -> Checker {
    checker_with(settings, pod, None)
}

/// [`checker`] of a node with this credential plugin.
fn checker_with(settings: &[&str], pod: SimPod, plugin: Option<PluginPlan>) -> Checker {
    let mut plan = Plan::generate(0, 0);
    plan.plugin = plugin;
    plan.settings = settings.iter().map(ToString::to_string).collect();
    plan.pods = vec![pod];
    plan.preloaded = vec![0];
    plan.allowlist_private = false;
    let cfg = Config::from_toml(&plan.settings.join("\n")).expect("settings");
    let mut c = Checker::new(Rc::new(plan), &cfg, Some(SANDBOX_ID.into()), false);
    c.absorb(vec![at(0, What::Life { inc: 1, what: Life::Started })]).expect("a start breaks nothing");
    c
}

fn at(secs: u64, what: What) -> Entry {
    Entry { at: s(secs), what }
}

fn broke(r: Result<(), Violation>) -> &'static str {
    match r {
        Err(v) => v.invariant,
        Ok(()) => "nothing",
    }
}

fn started(id: u64) -> What {
    What::EnsureStarted { id, inc: 1, pod: 0, container: 0 }
}

fn ok(id: u64, image_ref: &str) -> What {
    What::EnsureEnded { id, answer: Answer::Ok(EnsureOk { image_ref: image_ref.into(), message: String::new() }) }
}

fn pull(call: u64, image: usize) -> What {
    What::Runtime(Observed::PullStarted {
        call,
        image: IMAGES[image].name.into(),
        runtime_handler: String::new(),
        auth: None,
    })
}

fn event(reason: EventReason, image: usize) -> What {
    What::Event {
        inc: 1,
        event: ImageEvent {
            event_type: EventType::Normal,
            reason,
            message: String::new(),
            object: ObjectRef {
                pod_uid: "uid-0000".into(),
                namespace: "default".into(),
                pod_name: "pod-0".into(),
                container: Some("c0".into()),
            },
            image: IMAGES[image].name.into(),
            class: None,
        },
    }
}

fn report(entries: Vec<(&str, u64, Verdict)>, amount_to_free: u64, at_secs: u64) -> Arc<GcReport> {
    Arc::new(GcReport {
        mode: GcMode::Threshold,
        dry_run: false,
        started: SystemTime::UNIX_EPOCH + super::super::world::SIM_EPOCH + s(at_secs),
        before: FsCapacity { capacity: 1_000, available: 100 },
        measured_by: "test".into(),
        usage_percent: Some(90),
        projected_usage_percent: None,
        amount_to_free,
        entries: entries
            .into_iter()
            .map(|(id, size, verdict)| ReportEntry {
                id: id.into(),
                runtime_handler: String::new(),
                repo_tags: vec![format!("docker.io/library/{id}:1")],
                size,
                verdict,
                used_by: Vec::new(),
            })
            .collect(),
        shortfall: None,
        removed: Vec::new(),
        failed: Vec::new(),
        bytes_expected: 0,
        bytes_freed_measured: None,
        target_missed: None,
        kept_unlisted: Vec::new(),
    })
}

#[test]
fn every_invariant_has_a_test_here() {
    // The names the tests below expect, in the order of INVARIANTS.
    let tested = [
        "ensure-answered",
        "in-use-kept",
        "kep2535",
        "single-flight",
        "backoff-law",
        "gc-target",
        "gc-reasons",
        "durable",
        "bounded",
        "reload-live",
        "actors-alive",
        "secrets-hidden",
        "stall-cancel",
        "liveness",
    ];
    assert_eq!(INVARIANTS.iter().map(|(n, _)| *n).collect::<Vec<_>>(), tested);
}

/// A checker of a node whose stall check is armed as `check` (`None`: off).
fn stall_checker(check: Option<StallCheck>) -> Checker {
    let mut plan = Plan::generate(0, 0);
    plan.stall_check = check;
    // Parallel pulls: two calls at once break no bound.
    plan.settings = vec!["pull.serialize_image_pulls = false".to_string()];
    plan.settings.extend(check.map(|c| c.lines()).unwrap_or_default());
    plan.pods = vec![pod(PUBLIC, SecretKind::None)];
    plan.preloaded = vec![0];
    let cfg = Config::from_toml(&plan.settings.join("\n")).expect("settings");
    let mut c = Checker::new(Rc::new(plan), &cfg, Some(SANDBOX_ID.into()), false);
    c.absorb(vec![at(0, What::Life { inc: 1, what: Life::Started })]).expect("a start breaks nothing");
    c
}

/// imaged#1's queue runs one pull.
fn one_running() -> StepView {
    StepView { inc: 1, queue: Some(QueueStatus { running: 1, ..QueueStatus::default() }), ..StepView::default() }
}

/// Call `call` of busybox (4 MB in 500 ms, then 240 s more) downloads,
/// stalling after 100 ms (then dripping `drips` bytes a second).
fn stalling(call: u64, drips: u64) -> What {
    What::Runtime(Observed::Downloading {
        call,
        stalls_after: Some(Duration::from_millis(100)),
        drips,
        size: 4_000_000,
        takes: Duration::from_millis(240_500),
    })
}

fn stall_cancelled(id: u64) -> What {
    let message = "RegistryUnavailable: download \"layer-sha256:ab\" wrote no byte for 20s (1 of 4000000 bytes); \
                   imaged cancelled the pull (pull.stall_timeout 20s)";
    let err = EnsureError { kind: ImageErrorKind::ErrImagePull, message: message.into(), class: ErrorClass::Transient };
    What::EnsureEnded { id, answer: Answer::Err(err) }
}

#[test]
fn stall_cancel_fails_on_a_cancel_before_the_stall_timeout_or_with_the_check_off() {
    let check = StallCheck { timeout: s(20), warning: s(60), min_rate: 0 };
    let cancel_at = |end: u64, drips: u64, check: Option<StallCheck>| {
        let mut c = stall_checker(check);
        broke(c.absorb(vec![
            at(1, started(1)),
            at(1, pull(1, PUBLIC)),
            at(1, stalling(1, drips)),
            at(end, What::Runtime(Observed::PullEnded { call: 1, image_id: None })),
            at(end, stall_cancelled(1)),
        ]))
    };
    assert_eq!(cancel_at(22, 0, Some(check)), "nothing", "idle for 20.9 s");
    assert_eq!(cancel_at(20, 0, Some(check)), "stall-cancel", "idle for 18.9 s only");
    assert_eq!(cancel_at(22, 0, None), "stall-cancel", "no stall timeout set");
    // A drip is idle never: only a floor over it may cancel.
    assert_eq!(cancel_at(60, 1_000, Some(check)), "stall-cancel", "no floor");
    let floor = StallCheck { min_rate: 64 * 1024, ..check };
    assert_eq!(cancel_at(22, 1_000, Some(floor)), "nothing", "1 kB/s under 64 KiB/s over the last 20 s");
    assert_eq!(cancel_at(20, 1_000, Some(floor)), "stall-cancel", "no reading 20 s old since it began");
    assert_eq!(cancel_at(22, 100_000, Some(floor)), "stall-cancel", "100 kB/s is over the floor");
    // A call of the image that stalled long enough but ended before the
    // ensure began is not this ensure's.
    let mut c = stall_checker(Some(check));
    let r = c.absorb(vec![
        at(1, pull(1, PUBLIC)),
        at(1, stalling(1, 0)),
        at(30, What::Runtime(Observed::PullEnded { call: 1, image_id: None })),
        at(31, started(1)),
        at(32, stall_cancelled(1)),
    ]);
    assert_eq!(broke(r), "stall-cancel");
}

#[test]
fn stall_cancel_fails_when_a_stalled_pull_alone_on_a_clean_wire_runs_past_the_check() {
    // Bound: the timeout, two checks (a quarter of 20 s each), 10 s.
    let check = StallCheck { timeout: s(20), warning: s(60), min_rate: 0 };
    let run = |extra: Vec<Entry>, end: u64| {
        let mut c = stall_checker(Some(check));
        c.absorb(vec![at(1, pull(1, PUBLIC)), at(1, stalling(1, 0))]).expect("nothing breaks");
        c.step_end(s(1), &one_running()).expect("nothing breaks at the first step");
        c.absorb(extra).expect("nothing breaks on the way");
        broke(c.step_end(s(end), &one_running()))
    };
    assert_eq!(run(Vec::new(), 40), "nothing", "within 20 s + 2 × 5 s + 10 s of the stall");
    assert_eq!(run(Vec::new(), 42), "stall-cancel");
    // The queue runs another pull (its call held on its way): not alone.
    let mut c = stall_checker(Some(check));
    c.absorb(vec![at(1, pull(1, PUBLIC)), at(1, stalling(1, 0))]).expect("nothing breaks");
    let two = StepView { queue: Some(QueueStatus { running: 2, ..QueueStatus::default() }), ..one_running() };
    c.step_end(s(1), &two).expect("nothing breaks");
    assert_eq!(broke(c.step_end(s(42), &two)), "nothing");
    c.step_end(s(50), &one_running()).expect("one from 50 on");
    assert_eq!(broke(c.step_end(s(89), &one_running())), "nothing", "within the bound from 50");
    assert_eq!(broke(c.step_end(s(91), &one_running())), "stall-cancel");
    // Another call in the runtime: the check cannot tell whose download stalled.
    assert_eq!(run(vec![at(2, pull(2, PRIVATE))], 42), "nothing");
    // Faults on the wire until 30 s: the bound runs from then.
    assert_eq!(run(vec![at(2, What::Clean(false)), at(30, What::Clean(true))], 42), "nothing");
    assert_eq!(run(vec![at(2, What::Clean(false)), at(30, What::Clean(true))], 71), "stall-cancel");
    // A drip with no floor is never judged.
    let mut c = stall_checker(Some(check));
    c.absorb(vec![at(1, pull(1, PUBLIC)), at(1, stalling(1, 1_000))]).expect("nothing breaks");
    assert_eq!(broke(c.step_end(s(600), &StepView::default())), "nothing");
    // Nor anything with the check off.
    let mut c = stall_checker(None);
    c.absorb(vec![at(1, pull(1, PUBLIC)), at(1, stalling(1, 0))]).expect("nothing breaks");
    assert_eq!(broke(c.step_end(s(600), &StepView::default())), "nothing");
}

#[test]
fn ensure_answered_fails_on_an_ensure_past_its_bound_or_an_error_without_a_message() {
    let mut c = checker(&["pull.pull_deadline = \"3m\""], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(1, started(1))]).unwrap();
    assert_eq!(broke(c.step_end(s(60), &StepView::default())), "nothing", "within its bound");
    assert_eq!(broke(c.step_end(s(3_600), &StepView::default())), "ensure-answered");

    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    let err = EnsureError { kind: ImageErrorKind::ErrImagePull, message: String::new(), class: ErrorClass::Transient };
    let r = c.absorb(vec![at(1, started(1)), at(2, What::EnsureEnded { id: 1, answer: Answer::Err(err) })]);
    assert_eq!(broke(r), "ensure-answered");
}

#[test]
fn in_use_kept_fails_when_the_sandbox_a_used_or_a_pinned_image_is_removed() {
    let removing = |id: &str, name: &str, pinned: bool, used_by: Vec<String>| {
        What::Runtime(Observed::Removing { id: id.into(), names: vec![name.into()], pinned, used_by })
    };
    let mut c = checker(&["gc.pinned_images = [\"docker.io/library/redis:*\"]"], pod(PUBLIC, SecretKind::None));
    assert_eq!(
        broke(c.absorb(vec![at(1, removing("sha256:aa", "docker.io/library/nginx:1.27", false, vec![]))])),
        "nothing"
    );
    for what in [
        removing(SANDBOX_ID, IMAGES[0].name, false, vec![]),
        removing("sha256:bb", "docker.io/library/nginx:1.27", false, vec!["ctr-1".into()]),
        removing("sha256:cc", "docker.io/library/nginx:1.27", true, vec![]),
        removing("sha256:dd", "docker.io/library/redis:7", false, vec![]),
    ] {
        assert_eq!(broke(c.absorb(vec![at(2, what)])), "in-use-kept");
    }
}

#[test]
fn kep2535_fails_when_a_pod_without_a_valid_secret_gets_a_private_image() {
    let verify = ["credential_verification.policy = \"AlwaysVerify\""];
    let mut c = checker(&verify, pod(PRIVATE, SecretKind::Right));
    assert_eq!(broke(c.absorb(vec![at(1, started(1)), at(2, ok(1, "sha256:11"))])), "nothing");
    for secret in [SecretKind::None, SecretKind::Wrong] {
        let mut c = checker(&verify, pod(PRIVATE, secret));
        assert_eq!(broke(c.absorb(vec![at(1, started(1)), at(2, ok(1, "sha256:11"))])), "kep2535");
    }
}

#[test]
fn through_the_cri_front_kep2535_checks_pulls_only_and_back_off_is_the_kubelets() {
    let front = |secret: SecretKind| {
        let mut c = checker(&[], pod(PRIVATE, secret));
        let mut plan = (*c.plan).clone();
        plan.front_pods = vec![0];
        let cfg = Config::from_toml("").expect("defaults");
        c = Checker::new(Rc::new(plan), &cfg, Some(SANDBOX_ID.into()), false);
        c.absorb(vec![at(0, What::Life { inc: 1, what: Life::Started })]).expect("a start");
        c
    };
    let pulled = |id| What::FrontEnded { id, pod: 0, container: 0, outcome: FrontOutcome::Pulled("sha256:11".into()) };
    let present =
        |id| What::FrontEnded { id, pod: 0, container: 0, outcome: FrontOutcome::Present("sha256:11".into()) };
    assert_eq!(broke(front(SecretKind::Right).absorb(vec![at(1, started(1)), at(2, pulled(1))])), "nothing");
    assert_eq!(broke(front(SecretKind::Wrong).absorb(vec![at(1, started(1)), at(2, pulled(1))])), "kep2535");
    // Also when its process was killed as it answered (the call no longer counts).
    let killed = at(2, What::Life { inc: 1, what: Life::Killed });
    assert_eq!(broke(front(SecretKind::Wrong).absorb(vec![at(1, started(1)), killed, at(3, pulled(1))])), "kep2535");
    // Found present: this kubelet verifies nothing of its own; not imaged's.
    assert_eq!(broke(front(SecretKind::Wrong).absorb(vec![at(1, started(1)), at(2, present(1))])), "nothing");
    let failed = |message: &str| What::FrontEnded {
        id: 1,
        pod: 0,
        container: 0,
        outcome: FrontOutcome::Failed(2, message.into()),
    };
    assert_eq!(broke(front(SecretKind::Right).absorb(vec![at(1, started(1)), at(2, failed(""))])), "ensure-answered");
    // Pulling again within what would be a back-off period is the
    // kubelet's own choice through the front.
    let events = vec![at(1, event(EventReason::Failed, PRIVATE)), at(2, event(EventReason::Pulling, PRIVATE))];
    assert_eq!(broke(front(SecretKind::Right).absorb(events.clone())), "nothing");
    assert_eq!(broke(checker(&[], pod(PRIVATE, SecretKind::Right)).absorb(events)), "backoff-law");
}

#[test]
fn through_the_cri_front_only_a_told_outage_fallback_gives_an_exempt_private_image_to_a_pod_without_the_secret() {
    let front = |policy: &str| {
        let settings = [format!("credential_verification.policy = \"{policy}\"")];
        let mut c = checker(&[settings[0].as_str()], pod(PRIVATE, SecretKind::Wrong));
        let mut plan = (*c.plan).clone();
        plan.front_pods = vec![0];
        let cfg = Config::from_toml(&settings[0]).expect("settings");
        c = Checker::new(Rc::new(plan), &cfg, Some(SANDBOX_ID.into()), false);
        c.absorb(vec![at(0, What::Life { inc: 1, what: Life::Started })]).expect("a start");
        c
    };
    let pulled = What::FrontEnded { id: 1, pod: 0, container: 0, outcome: FrontOutcome::Pulled("sha256:11".into()) };
    let fell_back = |image: usize| {
        let What::Event { inc, mut event } = event(EventReason::Pulled, image) else { unreachable!() };
        event.event_type = EventType::Warning;
        event.message = crate::ensure::using_local_image(IMAGES[image].name, "RegistryUnavailable: down");
        What::Event { inc, event }
    };
    // Under NeverVerify every pod may use a present image: the fallback's
    // answer is no leak, and is counted.
    let mut c = front("NeverVerify");
    let told = vec![at(1, started(1)), at(2, fell_back(PRIVATE)), at(3, pulled.clone())];
    assert_eq!(broke(c.absorb(told)), "nothing");
    assert_eq!(c.stats.fallback_used, 1);
    // A pull the front answered without falling back went to the registry
    // with this pod's wrong password: whatever the policy, a leak.
    assert_eq!(broke(front("NeverVerify").absorb(vec![at(1, started(1)), at(2, pulled.clone())])), "kep2535");
    // The event of another image's fallback does not count for this one.
    let other = vec![at(1, started(1)), at(2, fell_back(PUBLIC)), at(3, pulled.clone())];
    assert_eq!(broke(front("NeverVerify").absorb(other)), "kep2535");
    // A fallback the policy does not exempt: a leak.
    let told = vec![at(1, started(1)), at(2, fell_back(PRIVATE)), at(3, pulled)];
    assert_eq!(broke(front("AlwaysVerify").absorb(told)), "kep2535");
}

fn plugin(covers_private: bool) -> PluginPlan {
    PluginPlan {
        covers_private,
        default_cache: s(60),
        timeout: s(60),
        healthy: PluginBehaviour {
            mode: PluginMode::Healthy { key: CacheKey::Registry, duration: None },
            latency: Duration::from_millis(100),
        },
    }
}

/// A runtime pull of `image` with these credentials (as the runtime gets
/// them), and its end with `id`.
fn pulled_with(call: u64, image: usize, registry: &str, user: &str, password: &str, id: &str) -> [What; 2] {
    let server = crate::cri::server_address_for_runtime(registry);
    let auth = crate::domain::AuthConfig::basic(server, user, password).identity();
    [
        What::Runtime(Observed::PullStarted {
            call,
            image: IMAGES[image].name.into(),
            runtime_handler: String::new(),
            auth: Some(auth),
        }),
        What::Runtime(Observed::PullEnded { call, image_id: Some(id.into()) }),
    ]
}

#[test]
fn kep2535_takes_an_image_the_plugins_node_credentials_pulled_as_every_pods() {
    use crate::sim::plan::{PLUGIN_REGISTRY, PLUGIN_USER, ROBOT_PASSWORD, ROBOT_USER};
    let verify = ["credential_verification.policy = \"AlwaysVerify\""];
    // The plugin's registry: no pod secret covers it.
    let mut c = checker_with(&verify, pod(ECR, SecretKind::Right), Some(plugin(false)));
    assert_eq!(broke(c.absorb(vec![at(1, started(1)), at(2, ok(1, "sha256:ec"))])), "kep2535", "never pulled");
    let mut c = checker_with(&verify, pod(ECR, SecretKind::None), Some(plugin(false)));
    let [a, b] = pulled_with(1, ECR, PLUGIN_REGISTRY, PLUGIN_USER, PLUGIN_TOKEN, "sha256:ec");
    c.absorb(vec![at(1, a), at(2, b)]).unwrap();
    assert_eq!(broke(c.absorb(vec![at(3, started(1)), at(4, ok(1, "sha256:ec"))])), "nothing", "pulled by the node");
    // The private registry: a pull with a pod's secret is no node's pull;
    // one with the robot account is, when the plugin hands it out.
    for (covers, user, password, want) in [
        (true, ROBOT_USER, ROBOT_PASSWORD, "nothing"),
        (true, crate::sim::plan::PRIVATE_USER, crate::sim::plan::PRIVATE_PASSWORD, "kep2535"),
        (false, ROBOT_USER, ROBOT_PASSWORD, "kep2535"),
    ] {
        let mut c = checker_with(&verify, pod(PRIVATE, SecretKind::Wrong), Some(plugin(covers)));
        let [a, b] = pulled_with(1, PRIVATE, "private.example", user, password, "sha256:11");
        c.absorb(vec![at(1, a), at(2, b)]).unwrap();
        assert_eq!(broke(c.absorb(vec![at(3, started(1)), at(4, ok(1, "sha256:11"))])), want, "{covers} {user}");
    }
}

#[test]
fn secrets_hidden_fails_when_a_token_shows_in_what_imaged_says() {
    let message = |m: &str| {
        let What::Event { inc, mut event } = event(EventReason::Failed, ECR) else { unreachable!() };
        event.message = m.into();
        What::Event { inc, event }
    };
    let mut c = checker_with(&[], pod(ECR, SecretKind::None), Some(plugin(false)));
    let fine = message("Failed to pull image: 401 Unauthorized");
    assert_eq!(broke(c.absorb(vec![at(1, fine)])), "nothing");
    let leak = message(&format!("Failed to pull image: bad password {PLUGIN_TOKEN}"));
    let v = c.absorb(vec![at(2, leak)]).expect_err("a token shows");
    assert_eq!(v.invariant, "secrets-hidden");
    assert!(!v.message.contains(PLUGIN_TOKEN) && v.message.contains("<the secret>"), "{}", v.message);
    assert!(c.tail().iter().all(|l| !l.contains(PLUGIN_TOKEN)), "nor in the trace");
}

#[test]
fn single_flight_fails_on_a_third_pull_of_one_key_in_flight() {
    let mut c =
        checker(&["pull.single_flight = true", "pull.serialize_image_pulls = false"], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(1, pull(1, PUBLIC)), at(1, pull(2, PUBLIC))]).unwrap();
    assert_eq!(broke(c.step_end(s(1), &StepView::default())), "nothing", "two kinds of request may share a key");
    c.absorb(vec![at(2, pull(3, PUBLIC))]).unwrap();
    assert_eq!(broke(c.step_end(s(2), &StepView::default())), "single-flight");
}

/// A reload of the serving process to `settings` (over the defaults), with
/// `needs_restart` as `Node::reload` answered.
fn reloaded(settings: &[&str], needs_restart: Vec<&'static str>) -> What {
    let cfg = Config::from_toml(&settings.join("\n")).expect("settings");
    let answer = crate::node::Reloaded { applied: Vec::new(), needs_restart };
    What::Reloaded { inc: 1, outcome: Ok((Box::new(cfg), answer)) }
}

#[test]
fn reload_live_fails_when_a_reload_needs_a_restart_or_its_settings_do_not_load() {
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    assert_eq!(broke(c.absorb(vec![at(1, reloaded(&["backoff.max = \"1m\""], Vec::new()))])), "nothing");
    assert_eq!(broke(c.absorb(vec![at(2, reloaded(&[], vec!["pull"]))])), "reload-live");
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    let unloadable = What::Reloaded { inc: 1, outcome: Err("the reload's settings: bad".into()) };
    assert_eq!(broke(c.absorb(vec![at(1, unloadable)])), "reload-live");
}

#[test]
fn backoff_law_follows_a_reload_of_the_delays() {
    let failed = |t| at(t, event(EventReason::Failed, PUBLIC));
    let pulling = |t| at(t, event(EventReason::Pulling, PUBLIC));
    // Periods 10, 20, 40 s; the cap cut to 20 s cuts the running one.
    let cut = || {
        let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
        let r = c.absorb(vec![failed(0), failed(10), failed(30), at(35, reloaded(&["backoff.max = \"20s\""], vec![]))]);
        assert_eq!(broke(r), "nothing");
        c
    };
    assert_eq!(broke(cut().absorb(vec![pulling(55)])), "nothing", "25 s after, past the cut period");
    assert_eq!(broke(cut().absorb(vec![pulling(45)])), "backoff-law", "15 s after, inside it");
    let backoff = |t| at(t, event(EventReason::BackOff, PUBLIC));
    assert_eq!(broke(cut().absorb(vec![backoff(45)])), "nothing");
    assert_eq!(broke(cut().absorb(vec![backoff(55)])), "backoff-law", "the old 40 s period is over");
    // A period still running rises to a longer initial one.
    let raised = || {
        let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
        let r = c.absorb(vec![failed(0), at(5, reloaded(&["backoff.initial = \"30s\""], vec![]))]);
        assert_eq!(broke(r), "nothing");
        c
    };
    assert_eq!(broke(raised().absorb(vec![at(20, event(EventReason::BackOff, PUBLIC))])), "nothing");
    assert_eq!(broke(raised().absorb(vec![at(31, event(EventReason::BackOff, PUBLIC))])), "backoff-law");
    assert_eq!(broke(raised().absorb(vec![pulling(20)])), "backoff-law", "inside the raised period");
    // A failure at the reload's very instant: the registry may take either
    // first, so the period is 30 s (failure first: 20 s, raised) to 60 s
    // (reload first: 30 s, doubled).
    let both = || {
        let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
        let r = c.absorb(vec![failed(0), at(5, reloaded(&["backoff.initial = \"30s\""], vec![])), failed(5)]);
        assert_eq!(broke(r), "nothing");
        c
    };
    assert_eq!(broke(both().absorb(vec![pulling(40)])), "nothing", "35 s after");
    assert_eq!(broke(both().absorb(vec![pulling(30)])), "backoff-law", "25 s after");
    assert_eq!(broke(both().absorb(vec![backoff(55)])), "nothing", "50 s after: may still back off");
    assert_eq!(broke(both().absorb(vec![backoff(66)])), "backoff-law", "61 s after");
    // An entry expired under the old cap is gone: a longer cap does not
    // revive it, so the next failure starts again at the initial period.
    let revived = || {
        let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
        let r = c.absorb(vec![
            failed(0),
            failed(10),
            failed(30),
            at(700, reloaded(&["backoff.max = \"10m\""], vec![])),
            failed(710),
        ]);
        assert_eq!(broke(r), "nothing");
        c
    };
    assert_eq!(broke(revived().absorb(vec![pulling(725)])), "nothing", "15 s after a first failure");
    assert_eq!(broke(revived().absorb(vec![pulling(715)])), "backoff-law", "5 s after it");
}

#[test]
fn backoff_law_fails_on_a_pull_inside_the_period_or_a_backoff_without_a_failure() {
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    let r = c.absorb(vec![
        at(0, event(EventReason::Failed, PUBLIC)),
        at(5, event(EventReason::BackOff, PUBLIC)),
        at(10, event(EventReason::Pulling, PUBLIC)),
        at(10, event(EventReason::Failed, PUBLIC)),
    ]);
    assert_eq!(broke(r), "nothing", "10 s, then a second failure");
    // The period doubled to 20 s: a pull 15 s later is too early.
    assert_eq!(broke(c.absorb(vec![at(25, event(EventReason::Pulling, PUBLIC))])), "backoff-law");

    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    assert_eq!(broke(c.absorb(vec![at(1, event(EventReason::BackOff, PUBLIC))])), "backoff-law");
}

#[test]
fn gc_target_fails_when_gc_frees_more_than_needed_or_stops_short() {
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    let space = Verdict::Delete(DeleteReason::Space);
    let enough = report(vec![("a", 60, space.clone()), ("b", 60, space.clone())], 100, 10);
    assert_eq!(broke(c.gc_report(&enough)), "nothing");
    let too_much = report(vec![("a", 200, space.clone()), ("b", 200, space.clone())], 100, 20);
    assert_eq!(broke(c.gc_report(&too_much)), "gc-target");
    let short = report(vec![("a", 50, space), ("b", 500, Verdict::Keep(KeepReason::NotNeeded))], 100, 30);
    assert_eq!(broke(c.gc_report(&short)), "gc-target");
}

#[test]
fn gc_reasons_fails_when_gc_keeps_an_unused_image_as_in_use() {
    // A short minimum age: the restart grace after the start (every image,
    // one window) is over by the first report.
    let mut c = checker(&["gc.image_minimum_gc_age = \"1s\""], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(1, What::Created { pod: 0, container: 0, image_id: "sha256:used".into() })]).unwrap();
    let in_use = Verdict::Keep(KeepReason::InUse);
    assert_eq!(broke(c.gc_report(&report(vec![("sha256:used", 10, in_use.clone())], 0, 5))), "nothing");
    assert_eq!(broke(c.gc_report(&report(vec![("sha256:idle", 10, in_use.clone())], 0, 6))), "gc-reasons");
    // An ensure (waiting on a pull whose reply was lost) that ended just
    // after the run began: imaged still counted its pull in flight.
    c.absorb(vec![at(10, started(1))]).unwrap();
    let err = EnsureError { kind: ImageErrorKind::ErrImagePull, message: "late".into(), class: ErrorClass::Transient };
    c.absorb(vec![at(21, What::EnsureEnded { id: 1, answer: Answer::Err(err) })]).unwrap();
    let mut r = (*report(vec![("sha256:pulled", 10, in_use)], 0, 20)).clone();
    r.entries[0].repo_tags = vec![IMAGES[PUBLIC].name.into()];
    assert_eq!(broke(c.gc_report(&Arc::new(r.clone()))), "nothing");
    r.started += s(100);
    assert_eq!(broke(c.gc_report(&Arc::new(r.clone()))), "gc-reasons", "long after the pull");
    // A prefetch of it in flight (its reply lost) keeps it in use.
    c.absorb(vec![at(200, What::PrefetchStarted { image: PUBLIC })]).unwrap();
    r.started += s(200);
    assert_eq!(broke(c.gc_report(&Arc::new(r))), "nothing", "a prefetch in flight");
}

#[test]
fn gc_reasons_lets_a_restarted_process_keep_every_image_for_one_window() {
    let epoch = SystemTime::UNIX_EPOCH + super::super::world::SIM_EPOCH;
    let mut c = checker(&["gc.image_minimum_gc_age = \"2m\""], pod(PUBLIC, SecretKind::None));
    let mut snap = Snapshot::default();
    let record = ImageRecord {
        key: crate::gc::record::RecordKey::id("sha256:known"),
        first_detected: epoch,
        last_used: None,
        size: 1,
        pinned: false,
        repo_tags: Vec::new(),
        repo_digests: Vec::new(),
    };
    snap.images.insert(("sha256:known".into(), String::new()), record);
    c.absorb(vec![at(100, What::Life { inc: 1, what: Life::Killed })]).unwrap();
    c.restarted(snap, &BTreeSet::new()).unwrap();
    c.absorb(vec![at(101, What::Life { inc: 2, what: Life::Started })]).unwrap();
    let in_use = Verdict::Keep(KeepReason::InUse);
    let grace = crate::gc::in_use::ENSURED_BEFORE_RESTART;
    // The report as GC gives it: each entry's reasons.
    let said = |r: Arc<GcReport>, who: &[&str]| {
        let mut r = Arc::unwrap_or_clone(r);
        for e in &mut r.entries {
            e.used_by = who.iter().map(ToString::to_string).collect();
        }
        Arc::new(r)
    };
    let kept = |id: &'static str, at: u64, who: &[&str]| said(report(vec![(id, 10, in_use.clone())], 0, at), who);
    assert_eq!(broke(c.gc_report(&kept("sha256:known", 150, &[grace]))), "nothing");
    // One its records did not know too: pulled and ensured just before the
    // kill, before a detection recorded it.
    assert_eq!(broke(c.gc_report(&kept("sha256:other", 160, &[grace]))), "nothing");
    // Within the window, a reason besides the grace must still hold, and
    // an in-use verdict must give a reason.
    assert_eq!(broke(c.gc_report(&kept("sha256:other", 170, &[grace, "default/p/c"]))), "gc-reasons");
    assert_eq!(broke(c.gc_report(&kept("sha256:other", 180, &[]))), "gc-reasons", "no reason given");
    assert_eq!(broke(c.gc_report(&kept("sha256:known", 300, &[grace]))), "gc-reasons", "after the window");
}

#[test]
fn durable_fails_when_an_acknowledged_record_or_a_killed_pulls_intent_is_not_on_disk() {
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(1, started(1)), at(2, ok(1, "sha256:11"))]).unwrap();
    assert_eq!(broke(c.restarted(Snapshot::default(), &BTreeSet::new())), "durable");
    // Every pod's record (written unsynced) may be lost to a kill of the
    // process that wrote it, its intent left in its place; then it is no
    // promise any more.
    let killed = || at(3, What::Life { inc: 1, what: Life::Killed });
    let exited = || at(3, What::Life { inc: 1, what: Life::Exited });
    let mut left = Snapshot::default();
    left.intents.insert(image_key(IMAGES[PUBLIC].name));
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(1, started(1)), at(2, ok(1, "sha256:11")), killed()]).unwrap();
    assert_eq!(broke(c.restarted(left.clone(), &BTreeSet::new())), "nothing");
    assert_eq!(broke(c.restarted(Snapshot::default(), &BTreeSet::new())), "nothing");
    // Not after a graceful stop (which syncs).
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(1, started(1)), at(2, ok(1, "sha256:11")), exited()]).unwrap();
    assert_eq!(broke(c.restarted(left.clone(), &BTreeSet::new())), "durable");
    // Nor once seen on disk.
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(1, started(1)), at(2, ok(1, "sha256:11")), exited()]).unwrap();
    let mut on_disk = left.clone();
    let every_pod = [(
        image_repo(IMAGES[PUBLIC].name).unwrap(),
        crate::domain::pull_record::ImagePullCredentials::node_accessible(),
    )];
    let record = PulledRecord {
        last_updated_time: SystemTime::UNIX_EPOCH,
        image_ref: "sha256:11".into(),
        credential_mapping: every_pod.into(),
    };
    on_disk.records.insert("sha256:11".into(), record);
    c.restarted(on_disk, &BTreeSet::new()).unwrap();
    c.absorb(vec![at(4, started(2)), at(5, What::Life { inc: 2, what: Life::Killed })]).unwrap();
    assert_eq!(broke(c.restarted(left.clone(), &BTreeSet::new())), "durable");
    // A pod's own secret's record is synced: never lost, intent or not.
    let mut c = checker(&[], pod(PRIVATE, SecretKind::Right));
    c.absorb(vec![at(1, started(1)), at(2, ok(1, "sha256:19")), killed()]).unwrap();
    let mut left = Snapshot::default();
    left.intents.insert(image_key(IMAGES[PRIVATE].name));
    assert_eq!(broke(c.restarted(left, &BTreeSet::new())), "durable");

    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(1, pull(1, PUBLIC)), at(2, What::Life { inc: 1, what: Life::Killed })]).unwrap();
    let mut snap = Snapshot::default();
    assert_eq!(broke(c.restarted(snap.clone(), &BTreeSet::new())), "durable");
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(1, pull(1, PUBLIC)), at(2, What::Life { inc: 1, what: Life::Killed })]).unwrap();
    snap.intents.insert(image_key(IMAGES[PUBLIC].name));
    assert_eq!(broke(c.restarted(snap, &BTreeSet::new())), "nothing");
}

#[test]
fn durable_fails_when_a_kept_images_first_detection_moves_but_not_for_a_record_of_an_absent_image() {
    let epoch = SystemTime::UNIX_EPOCH + super::super::world::SIM_EPOCH;
    let snap_for = |first: u64, handler: &str| {
        let mut sn = Snapshot::default();
        let record = ImageRecord {
            key: crate::gc::record::RecordKey { id: "sha256:kept".into(), runtime_handler: handler.into() },
            first_detected: epoch + s(first),
            last_used: None,
            size: 1,
            pinned: false,
            repo_tags: Vec::new(),
            repo_digests: Vec::new(),
        };
        sn.images.insert(("sha256:kept".into(), handler.into()), record);
        sn
    };
    let snap = |first: u64| snap_for(first, "");
    let present: BTreeSet<(String, String)> = [("sha256:kept".to_string(), String::new())].into();
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(100, What::Step { index: 1, event: String::new() })]).unwrap();
    c.restarted(snap(0), &present).unwrap();
    assert_eq!(broke(c.restarted(snap(0), &present)), "nothing");
    assert_eq!(broke(c.restarted(snap(50), &present)), "durable");
    // Removed before the first restart (its record outlived a kill): the
    // image pulled again is detected anew.
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(100, What::Step { index: 1, event: String::new() })]).unwrap();
    c.restarted(snap(0), &BTreeSet::new()).unwrap();
    assert_eq!(broke(c.restarted(snap(50), &present)), "nothing");
    // Removed and pulled again for another runtime handler before the first
    // restart (seed 174 of Shape::V1): the record under the old handler was
    // no promise; the new one is detected anew.
    let kata: BTreeSet<(String, String)> = [("sha256:kept".to_string(), "kata".to_string())].into();
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(100, What::Step { index: 1, event: String::new() })]).unwrap();
    c.restarted(snap(0), &kata).unwrap();
    assert_eq!(broke(c.restarted(snap_for(50, "kata"), &kata)), "nothing");
    assert_eq!(broke(c.restarted(snap_for(60, "kata"), &kata)), "durable", "that one is a promise");
}

#[test]
fn bounded_fails_on_more_pulls_in_flight_than_allowed() {
    let mut c = checker(&["pull.serialize_image_pulls = true"], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(1, pull(1, PUBLIC))]).unwrap();
    assert_eq!(broke(c.step_end(s(1), &StepView::default())), "nothing");
    c.absorb(vec![at(2, pull(2, 2))]).unwrap();
    assert_eq!(broke(c.step_end(s(2), &StepView::default())), "bounded");
}

#[test]
fn actors_alive_fails_when_a_serving_process_answers_that_an_actor_stopped() {
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    let stopped = What::EnsureEnded { id: 1, answer: Answer::Node(NodeError::Stopped("the pull queue")) };
    assert_eq!(broke(c.absorb(vec![at(1, started(1)), at(2, stopped.clone())])), "actors-alive");
    // While it stops gracefully, that is expected.
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    let r = c.absorb(vec![at(1, started(1)), at(2, What::Life { inc: 1, what: Life::Stopping }), at(3, stopped)]);
    assert_eq!(broke(r), "nothing");
}

#[test]
fn liveness_fails_when_a_pod_that_can_start_never_does_or_an_ensure_waits() {
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    assert_eq!(broke(c.finish(&|_| (true, true))), "nothing");
    assert_eq!(broke(c.finish(&|_| (true, false))), "liveness");
    // A pod whose private image it cannot pull is not expected to start.
    let mut c = checker(&[], pod(PRIVATE, SecretKind::Wrong));
    assert_eq!(broke(c.finish(&|_| (true, false))), "nothing");
    // Nor one whose own pull deadline is shorter than its image's pull.
    let slow = IMAGES.iter().position(|i| i.latency_ms >= 60_000).unwrap();
    let mut c = checker(&[], SimPod { deadline: Some(s(30)), ..pod(slow, SecretKind::None) });
    assert_eq!(broke(c.finish(&|_| (true, false))), "nothing");
    let mut c = checker(&[], SimPod { deadline: Some(s(300)), ..pod(slow, SecretKind::None) });
    assert_eq!(broke(c.finish(&|_| (true, false))), "liveness");
    // With the plugin, its registry's images and (when it covers it) the
    // private registry's can be pulled by any pod.
    let mut c = checker(&[], pod(ECR, SecretKind::None));
    assert_eq!(broke(c.finish(&|_| (true, false))), "nothing", "no plugin");
    let mut c = checker_with(&[], pod(ECR, SecretKind::None), Some(plugin(false)));
    assert_eq!(broke(c.finish(&|_| (true, false))), "liveness");
    let mut c = checker_with(&[], pod(PRIVATE, SecretKind::Wrong), Some(plugin(false)));
    assert_eq!(broke(c.finish(&|_| (true, false))), "nothing");
    let mut c = checker_with(&[], pod(PRIVATE, SecretKind::Wrong), Some(plugin(true)));
    assert_eq!(broke(c.finish(&|_| (true, false))), "liveness");
    let mut c = checker(&[], pod(PUBLIC, SecretKind::None));
    c.absorb(vec![at(1, started(1)), at(60, What::Step { index: 1, event: String::new() })]).unwrap();
    assert_eq!(broke(c.finish(&|_| (true, true))), "nothing", "asked a minute before the end");
    c.absorb(vec![at(3_600, What::Step { index: 2, event: String::new() })]).unwrap();
    assert_eq!(broke(c.finish(&|_| (true, true))), "liveness", "waiting for an hour");
}
