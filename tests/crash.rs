//! Crash consistency: `kill -9` of `imaged run` at seeded random moments of
//! a workload (pull bursts, GC runs, record writes), then a restart, and
//! checks of what survived:
//!
//! - the state database opens, undamaged;
//! - every pull answered OK before the kill has its KEP-2535 pulled record
//!   (an anonymous pull's, written unsynced, or else its intent),
//!   naming the credentials that pulled it (when no GC could have removed
//!   the image since), and no image imaged pulled is left without a record
//!   or an intent (which would make it count as preloaded: open to every pod);
//! - after the restart, a pod without the pull secret still does not get
//!   the private image (IfNotPresent or Never), and a pod with it does;
//! - no image in use (by a container, as the sandbox image, pinned by the
//!   runtime or by a rule) was removed.
//!
//! Against the in-process embedded runtime with its state directory (its
//! images die and come back with the daemon) and against real containerd
//! (tests/support/containerd_env.rs; skipped locally without it, required
//! under `CI=true`). One simulated node per test: trials follow each other
//! on the same state, as restarts do on a node.
//!
//! Trials: 10 per test by default; `IMAGED_CRASH_TRIALS=N` for more (by
//! hand: `IMAGED_CRASH_TRIALS=100 cargo test --release --test crash -- --nocapture`).
//! The base seed is random and printed; `IMAGED_CRASH_SEED=S` replays one.
//! Base seeds that once found a bug run first, every time ([`REGRESSIONS`]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use imaged::api::proto;
use imaged::domain::pull_record::PulledRecord;
use imaged::store::PullRecordsState;
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng};
use support::daemon::Daemon;

/// Base seeds (and how many trials) that once found a bug, per node:
/// replayed first.
const REGRESSIONS: &[(&str, u64, usize)] = &[
    // Trial 5: an image ensured 1.2 s before the kill was removed by the
    // first GC after the restart: the "ensured recently" hints died with
    // the process, and durable first-detected times no longer made it too
    // young. Fixed by the detector's restart grace (ENSURED_BEFORE_RESTART).
    ("embedded", 1_719_362_431, 5),
    // Trial 4 (about one run in five, at other seeds too): an image pulled
    // and ensured just before the kill, before any detection recorded it,
    // was removed by the max-age pass of the first GC after the restart
    // ("unused for longer than the maximum age": never used, and the loop's
    // durable start long past): the restart grace covered only the images
    // of loaded records. It covers every image now. Timing-dependent: a
    // replay does not always reach the window.
    ("embedded", 1_968_560_079, 4),
];

/// How long a trial's workload is scheduled over.
const WINDOW: Duration = Duration::from_millis(1200);

fn trials() -> usize {
    std::env::var("IMAGED_CRASH_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(10)
}

fn base_seed() -> u64 {
    match std::env::var("IMAGED_CRASH_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(s) => s,
        None => {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
            t.as_secs() ^ u64::from(t.subsec_nanos()) ^ u64::from(std::process::id())
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A protected image: GC must never remove it.
#[derive(Debug, Clone)]
struct Protected {
    id: String,
    why: &'static str,
}

/// One simulated node: where its state lives, what its pods pull.
struct Node {
    name: &'static str,
    dir: PathBuf,
    /// `--runtime-endpoint …` for containerd; nothing for the embedded runtime.
    endpoint_args: Vec<String>,
    /// The embedded runtime's state directory (read directly after a kill).
    runtime_state: Option<PathBuf>,
    public: Vec<String>,
    private: String,
    secret: Vec<u8>,
    /// (namespace, name, uid) of `secret`.
    secret_coordinates: (String, String, String),
    missing: String,
    sandbox_image: String,
    pinned_rule: String,
    protected: Vec<Protected>,
    /// Image ids present without imaged having pulled them (no record expected).
    preloaded: BTreeSet<String>,
    /// Only images whose names contain this are this test's.
    ours: String,
}

impl Node {
    fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// The daemon's configuration for one start: GC removing unused images
    /// every 250 ms (gc_on) after 1 s unused, or never; images ensured
    /// within `min_age` count as in use.
    fn write_config(&self, gc_on: bool, min_age: Duration) -> PathBuf {
        let file = self.dir.join("imaged.toml");
        let embedded = match &self.runtime_state {
            Some(d) => format!("embedded_state_dir = {:?}\n", d.display().to_string()),
            None => String::new(),
        };
        let (period, max_age) =
            if gc_on { ("250ms", format!("{}ms", min_age.as_millis() + 1000)) } else { ("1h", "0s".into()) };
        let min_age = format!("{}ms", min_age.as_millis());
        let toml = format!(
            "[runtime]\nstartup_timeout = \"20s\"\n{embedded}\
             [backoff]\ninitial = \"50ms\"\nmax = \"200ms\"\n\
             [gc]\nimage_gc_high_threshold_percent = 100\nimage_minimum_gc_age = \"{min_age}\"\n\
             image_maximum_gc_age = \"{max_age}\"\ngc_period = \"{period}\"\ndetect_period = \"100ms\"\n\
             sandbox_image = {sandbox:?}\npinned_images = [{rule:?}]\n",
            sandbox = self.sandbox_image,
            rule = self.pinned_rule,
        );
        std::fs::write(&file, toml).unwrap();
        file
    }

    fn start(&self, gc_on: bool, min_age: Duration) -> Daemon {
        let config = self.write_config(gc_on, min_age).display().to_string();
        // The node's own state directory, kept across its restarts (the
        // helper gives each start a fresh one; a later `--set` wins).
        let state = format!("state.dir={}", self.state_dir().display());
        let mut args: Vec<&str> = vec!["--config", &config, "--set", &state];
        args.extend(self.endpoint_args.iter().map(String::as_str));
        Daemon::start(&args)
    }

    fn repo_of_private(&self) -> String {
        imaged::pull_records::image_repo(&self.private).unwrap()
    }
}

#[derive(Debug, Clone)]
enum Op {
    Ensure { image: String, policy: &'static str, secret: bool },
    DeleteUnused,
    ThresholdGc,
    ListImages,
}

#[derive(Debug, Clone, Copy)]
enum KillAt {
    /// This long after the workload starts.
    Uniform(Duration),
    /// This long after op `i` is sent (a GC run).
    AfterOp(usize, Duration),
    /// This long after the `k`-th OK answer (record writes of other pulls).
    AfterAcks(usize, Duration),
}

#[derive(Debug)]
struct Plan {
    gc_on: bool,
    /// `gc.image_minimum_gc_age`: images ensured within it count as in use.
    min_age: Duration,
    ops: Vec<(Duration, Op)>,
    kill: KillAt,
}

fn plan(rng: &mut StdRng, node: &Node) -> Plan {
    let gc_on = rng.random_bool(0.6);
    let min_age = if rng.random_bool(0.5) { Duration::ZERO } else { Duration::from_secs(5) };
    let window = WINDOW.as_millis() as u64;
    let mut ops = Vec::new();
    for _ in 0..rng.random_range(10..40) {
        let at = Duration::from_millis(rng.random_range(0..window));
        let roll = rng.random_range(0..100);
        let op = if roll < 45 {
            let image = node.public[rng.random_range(0..node.public.len())].clone();
            let policy = if rng.random_bool(0.5) { "Always" } else { "IfNotPresent" };
            Op::Ensure { image, policy, secret: false }
        } else if roll < 75 {
            let secret = rng.random_bool(0.75);
            let policy = match (secret, rng.random_range(0..3)) {
                (true, 0) => "Always",
                (false, 0) => "Never",
                _ => "IfNotPresent",
            };
            Op::Ensure { image: node.private.clone(), policy, secret }
        } else if roll < 85 {
            Op::Ensure { image: node.missing.clone(), policy: "IfNotPresent", secret: false }
        } else {
            Op::ListImages
        };
        ops.push((at, op));
    }
    if gc_on {
        for _ in 0..rng.random_range(1..4) {
            ops.push((Duration::from_millis(rng.random_range(0..window)), Op::DeleteUnused));
        }
        for _ in 0..rng.random_range(0..2) {
            ops.push((Duration::from_millis(rng.random_range(0..window)), Op::ThresholdGc));
        }
    }
    ops.sort_by_key(|(at, _)| *at);
    let gcs: Vec<usize> =
        ops.iter().enumerate().filter(|(_, (_, o))| matches!(o, Op::DeleteUnused)).map(|(i, _)| i).collect();
    let kill = match rng.random_range(0..3) {
        1 if !gcs.is_empty() => {
            KillAt::AfterOp(gcs[rng.random_range(0..gcs.len())], Duration::from_micros(rng.random_range(0..15_000)))
        }
        2 => KillAt::AfterAcks(rng.random_range(1..6), Duration::from_micros(rng.random_range(0..3_000))),
        _ => KillAt::Uniform(Duration::from_millis(rng.random_range(30..window + 200))),
    };
    Plan { gc_on, min_age, ops, kill }
}

/// An ensure the daemon answered OK.
#[derive(Debug, Clone)]
struct Ack {
    uid: String,
    image: String,
    secret: bool,
    image_ref: String,
    /// It pulled (empty message), rather than finding the image present.
    pulled: bool,
    /// When the answer came.
    at: std::time::Instant,
}

fn ensure_request(node: &Node, uid: &str, image: &str, policy: &str, secret: bool) -> proto::EnsureImageRequest {
    proto::EnsureImageRequest {
        pod: Some(proto::Pod { uid: uid.into(), namespace: "ns".into(), name: uid.into(), ..Default::default() }),
        container: "c".into(),
        image: image.into(),
        pull_policy: policy.into(),
        pull_secrets: if secret { vec![node.secret.clone()] } else { vec![] },
        ..Default::default()
    }
}

type Client = imaged::api::ImagedClient<tonic::transport::Channel>;

/// Runs the plan against the daemon and kills it (SIGKILL) at the plan's
/// moment. Returns the OK answers and any answer that broke a rule at once.
async fn run_plan(socket: &Path, node: &Arc<Node>, plan: &Plan, pid: i32, trial: &str) -> (Vec<Ack>, Vec<String>) {
    let client = imaged::api::client(socket).unwrap();
    let acks: Arc<Mutex<Vec<Ack>>> = Arc::default();
    let broken: Arc<Mutex<Vec<String>>> = Arc::default();
    let ok_count = Arc::new(AtomicUsize::new(0));
    let acked = Arc::new(tokio::sync::Notify::new());
    let start = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (at, op)) in plan.ops.iter().cloned().enumerate() {
        let (mut c, node, acks, broken, ok_count, acked) =
            (client.clone(), node.clone(), acks.clone(), broken.clone(), ok_count.clone(), acked.clone());
        let uid = format!("{trial}-p{i}");
        tasks.spawn(async move {
            tokio::time::sleep_until(start + at).await;
            let call = async {
                match op {
                    Op::Ensure { image, policy, secret } => {
                        let req = ensure_request(&node, &uid, &image, policy, secret);
                        let Ok(r) = c.ensure_image(req).await else { return };
                        if let Some(proto::ensure_image_response::Result::Ok(ok)) = r.into_inner().result {
                            if image == node.private && !secret {
                                broken.lock().unwrap().push(format!(
                                    "pod {uid} without the secret got private {image} ({policy}): {ok:?}"
                                ));
                            }
                            acks.lock().unwrap().push(Ack {
                                uid,
                                image,
                                secret,
                                pulled: ok.message.is_empty(),
                                image_ref: ok.image_ref,
                                at: std::time::Instant::now(),
                            });
                            ok_count.fetch_add(1, Ordering::SeqCst);
                            acked.notify_waiters();
                        }
                    }
                    Op::DeleteUnused => {
                        let _ = c.delete_unused_images(proto::DeleteUnusedImagesRequest { dry_run: false }).await;
                    }
                    Op::ThresholdGc => {
                        let _ = c.garbage_collect(proto::GarbageCollectRequest { dry_run: false }).await;
                    }
                    Op::ListImages => {
                        let _ = c.list_images(proto::ListImagesRequest {}).await;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(20), call).await;
        });
    }
    let last_chance = start + WINDOW + Duration::from_millis(400);
    match plan.kill {
        KillAt::Uniform(d) => tokio::time::sleep_until(start + d).await,
        KillAt::AfterOp(i, d) => tokio::time::sleep_until(start + plan.ops[i].0 + d).await,
        KillAt::AfterAcks(k, d) => {
            while ok_count.load(Ordering::SeqCst) < k && tokio::time::Instant::now() < last_chance {
                let _ = tokio::time::timeout_at(last_chance, acked.notified()).await;
            }
            tokio::time::sleep(d).await;
        }
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    // Calls in flight fail once the connection is gone.
    let drained =
        tokio::time::timeout(Duration::from_secs(30), async { while tasks.join_next().await.is_some() {} }).await;
    assert!(drained.is_ok(), "{trial}: calls still waiting 30 s after the kill");
    let acks = acks.lock().unwrap().clone();
    let broken = broken.lock().unwrap().clone();
    (acks, broken)
}

fn record<'a>(state: &'a PullRecordsState, image_ref: &str) -> Option<&'a PulledRecord> {
    state.records.iter().find(|r| r.image_ref == image_ref)
}

/// What the store must hold after the kill (read with the daemon down).
fn check_records(
    node: &Node,
    plan: &Plan,
    acks: &[Ack],
    state: &PullRecordsState,
    present: &[proto::Image],
    trial: &str,
) {
    let protected: BTreeSet<&str> = node.protected.iter().map(|p| p.id.as_str()).collect();
    for a in acks {
        // With no GC, for an image GC never removes, or within the window
        // where an ensured image counts as in use (the whole trial),
        // nothing may have removed the image, or pruned its record, since
        // the answer.
        if plan.gc_on && plan.min_age.is_zero() && !protected.contains(a.image_ref.as_str()) {
            continue;
        }
        assert!(
            present.iter().any(|i| i.id == a.image_ref),
            "{trial}: {} ({}) was answered OK to {} but the runtime lost it",
            a.image,
            a.image_ref,
            a.uid
        );
        if !a.pulled {
            continue;
        }
        let repo = imaged::pull_records::image_repo(&a.image).unwrap();
        // An anonymous pull's record is written unsynced (it lets every pod
        // use the image): a kill may lose it, leaving the pull's intent.
        let every_pods = record(state, &a.image_ref)
            .and_then(|r| r.credential_mapping.get(&repo))
            .is_some_and(|c| c.node_pods_accessible);
        if !a.secret && !every_pods {
            let key = imaged::pull_records::image_key(&a.image);
            assert!(
                state.intents.contains(&key),
                "{trial}: anonymous pull of {} answered OK, its record lost and no intent left: {state:?}",
                a.image
            );
            continue;
        }
        let Some(r) = record(state, &a.image_ref) else {
            panic!("{trial}: pull of {} by {} was answered OK but has no pulled record: {state:?}", a.image, a.uid)
        };
        let creds = r
            .credential_mapping
            .get(&repo)
            .unwrap_or_else(|| panic!("{trial}: the record of {} has nothing for {repo}: {r:?}", a.image));
        if a.secret {
            let (ns, name, uid) = &node.secret_coordinates;
            assert!(
                creds.kubernetes_secrets.iter().any(|s| (&s.namespace, &s.name, &s.uid) == (ns, name, uid)),
                "{trial}: the record of {} does not name the secret that pulled it: {r:?}",
                a.image
            );
        } else {
            assert!(creds.node_pods_accessible, "{trial}: anonymous pull of {} not recorded as such: {r:?}", a.image);
        }
    }
    // Every image imaged pulled (all but the preloaded ones) has a record,
    // an unreadable one, or a pull intent: none counts as preloaded.
    for img in present.iter().filter(|i| !node.preloaded.contains(&i.id)) {
        if !img.repo_tags.iter().chain(&img.repo_digests).any(|n| n.contains(&node.ours)) {
            continue;
        }
        let has_record = record(state, &img.id).is_some() || state.unreadable.contains(&img.id);
        let has_intent = img.repo_tags.iter().any(|t| state.intents.contains(t));
        assert!(
            has_record || has_intent,
            "{trial}: {} ({:?}) is present but has neither record nor intent: it would count as preloaded. {state:?}",
            img.id,
            img.repo_tags
        );
    }
}

fn check_protected(node: &Node, present: &[proto::Image], trial: &str, when: &str) {
    for p in &node.protected {
        assert!(
            present.iter().any(|i| i.id == p.id),
            "{trial}: {when}: {} ({}) is gone though GC must keep it",
            p.id,
            p.why
        );
    }
}

async fn list(c: &mut Client) -> Vec<proto::Image> {
    c.list_images(proto::ListImagesRequest {}).await.unwrap().into_inner().images
}

async fn ensure(c: &mut Client, req: proto::EnsureImageRequest) -> proto::ensure_image_response::Result {
    c.ensure_image(req).await.unwrap().into_inner().result.unwrap()
}

/// After the restart, images ensured within the min-age window before the
/// kill still count as in use: a GC that removes every unused image keeps
/// them (a container may be about to start from each; the kubelet was told
/// the image is there).
async fn check_ensured_stay_in_use(socket: &Path, plan: &Plan, acks: &[Ack], trial: &str, log: &dyn Fn() -> String) {
    let mut c = imaged::api::client(socket).unwrap();
    let before: Vec<String> = list(&mut c).await.into_iter().map(|i| i.id).collect();
    let gc_at = std::time::Instant::now();
    let mut report = None;
    // The periodic GC may be running: try again, for a bounded time.
    for _ in 0..100 {
        match c.delete_unused_images(proto::DeleteUnusedImagesRequest { dry_run: false }).await {
            Ok(r) => {
                report = Some(r.into_inner());
                break;
            }
            Err(e) if e.code() == tonic::Code::Aborted => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => panic!("{trial}: DeleteUnusedImages after the restart: {e}"),
        }
    }
    let report = report.unwrap_or_else(|| panic!("{trial}: a GC ran for a whole second"));
    let present = list(&mut c).await;
    // A margin for the time the GC took to start.
    let window = plan.min_age.saturating_sub(Duration::from_secs(1));
    for a in acks.iter().filter(|a| gc_at.duration_since(a.at) < window) {
        assert!(
            present.iter().any(|i| i.id == a.image_ref),
            "{trial}: {} ({}) was ensured for {} {:?} before a GC after the restart, within the {:?} it counts \
             as in use, and that GC removed it: {:?}; present before that GC: {}; the restarted daemon's log:\n{}",
            a.image,
            a.image_ref,
            a.uid,
            gc_at.duration_since(a.at),
            plan.min_age,
            report.removed,
            before.contains(&a.image_ref),
            log()
        );
    }
}

/// After the restart: KEP-2535 holds and the protected images are there.
async fn check_after_restart(node: &Node, socket: &Path, acks: &[Ack], trial: &str) {
    use proto::ensure_image_response::Result as R;
    let mut c = imaged::api::client(socket).unwrap();
    check_protected(node, &list(&mut c).await, trial, "after the restart");
    for (n, policy) in ["IfNotPresent", "Never"].into_iter().enumerate() {
        let r =
            ensure(&mut c, ensure_request(node, &format!("{trial}-nosecret{n}"), &node.private, policy, false)).await;
        assert!(matches!(r, R::Failure(_)), "{trial}: a pod without the secret got {} ({policy}): {r:?}", node.private);
    }
    let r = ensure(&mut c, ensure_request(node, &format!("{trial}-secret"), &node.private, "IfNotPresent", true)).await;
    assert!(matches!(r, R::Ok(_)), "{trial}: a pod with the secret did not get {}: {r:?}", node.private);
    let r =
        ensure(&mut c, ensure_request(node, &format!("{trial}-nosecret2"), &node.private, "IfNotPresent", false)).await;
    assert!(matches!(r, R::Failure(_)), "{trial}: after a pull with the secret, a pod without it got it: {r:?}");
    // Each public image a pod got before the kill, a new pod gets after it.
    let public: BTreeSet<&str> =
        acks.iter().filter(|a| !a.secret && a.image != node.private).map(|a| a.image.as_str()).collect();
    for (n, image) in public.into_iter().enumerate() {
        let r = ensure(&mut c, ensure_request(node, &format!("{trial}-again{n}"), image, "IfNotPresent", false)).await;
        assert!(matches!(r, R::Ok(_)), "{trial}: {image} answered OK before the kill, refused after: {r:?}");
    }
}

/// The images present, read the way the runtime keeps them: the embedded
/// runtime's state directory loaded directly, or containerd through CRI.
fn present_after_kill(node: &Node, rt: &tokio::runtime::Runtime) -> Vec<proto::Image> {
    match &node.runtime_state {
        Some(dir) => {
            let rt = imaged::embedded::EmbeddedRuntime::start_persistent(node.dir.join("check.sock"), dir)
                .expect("the embedded runtime's state loads after the kill");
            rt.images()
                .into_iter()
                .map(|i| proto::Image {
                    id: i.id,
                    repo_tags: i.repo_tags,
                    repo_digests: i.repo_digests,
                    ..Default::default()
                })
                .collect()
        }
        None => rt.block_on(async {
            let endpoint: imaged::cri::CriEndpoint = node.endpoint_args[1].parse().unwrap();
            let channel = endpoint.channel(Duration::from_secs(5)).unwrap();
            let mut c = imaged::cri::proto::image_service_client::ImageServiceClient::new(channel);
            let images = c.list_images(imaged::cri::proto::ListImagesRequest { filter: None }).await.unwrap();
            images
                .into_inner()
                .images
                .into_iter()
                .map(|i| proto::Image {
                    id: i.id,
                    repo_tags: i.repo_tags,
                    repo_digests: i.repo_digests,
                    ..Default::default()
                })
                .collect()
        }),
    }
}

/// One trial: start, run the plan, kill, check the state, restart, check
/// the behaviour, stop.
fn trial(node: &Arc<Node>, rt: &tokio::runtime::Runtime, seed: u64, label: &str) {
    let mut rng = StdRng::seed_from_u64(seed);
    let plan = plan(&mut rng, node);
    let trial = format!("{} trial {label} (seed {seed})", node.name);
    let mut d = node.start(plan.gc_on, plan.min_age);
    let pid = d.child.id() as i32;
    let socket = d.socket.clone();
    let (acks, broken) = rt.block_on(run_plan(&socket, node, &plan, pid, &trial));
    let status = d.wait_status(Duration::from_secs(10));
    assert!(!status.success(), "{trial}: the daemon was not killed: {status}");
    assert!(broken.is_empty(), "{trial}: {broken:#?}\n{}", d.log());

    // The store opens, undamaged, and holds what was answered.
    let store = imaged::store::Store::open(&node.state_dir())
        .unwrap_or_else(|e| panic!("{trial}: the store does not open: {e}"));
    assert!(store.recovery().is_none(), "{trial}: kill -9 damaged the store: {:?}", store.recovery());
    let state = store.pull_records_state().unwrap();
    let (_, skipped) = store.image_records_with_skipped().unwrap();
    assert_eq!(skipped, 0, "{trial}: GC image records that no longer decode after the kill");
    assert!(state.unreadable.is_empty(), "{trial}: pulled records that no longer decode: {:?}", state.unreadable);
    drop(store);
    let present = present_after_kill(node, rt);
    check_protected(node, &present, &trial, "after the kill");
    check_records(node, &plan, &acks, &state, &present, &trial);

    let again = node.start(plan.gc_on, plan.min_age);
    if !plan.min_age.is_zero() {
        rt.block_on(check_ensured_stay_in_use(&again.socket, &plan, &acks, &trial, &|| again.log()));
    }
    assert!(!again.log().contains("damaged"), "{trial}: {}", again.log());
    rt.block_on(check_after_restart(node, &again.socket, &acks, &trial));
    let pulled = acks.iter().filter(|a| a.pulled).count();
    eprintln!(
        "{trial}: gc {}, min age {:?}, {} ops, kill {:?}, {} answered OK ({pulled} pulled): consistent",
        if plan.gc_on { "on" } else { "off" },
        plan.min_age,
        plan.ops.len(),
        plan.kill,
        acks.len()
    );
    drop(again);
}

fn run_trials(node: &Arc<Node>, rt: &tokio::runtime::Runtime) {
    for &(_, seed, n) in REGRESSIONS.iter().filter(|(name, _, _)| *name == node.name) {
        for i in 0..n {
            trial(node, rt, seed.wrapping_add(i as u64), &format!("regression {seed}+{i}"));
        }
    }
    let base = base_seed();
    let n = trials();
    eprintln!("{}: {n} trials from base seed {base} (IMAGED_CRASH_SEED={base} replays them)", node.name);
    for i in 0..n {
        trial(node, rt, base.wrapping_add(i as u64), &format!("{}/{n}", i + 1));
    }
}

fn secret_manifest(registry: &str, user: &str, password: &str) -> Vec<u8> {
    let config = serde_json::json!({"auths": {registry: {"username": user, "password": password}}});
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "regcred", "namespace": "ns", "uid": "uid-regcred"},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": config.to_string()},
    })
    .to_string()
    .into_bytes()
}

fn coordinates() -> (String, String, String) {
    ("ns".into(), "regcred".into(), "uid-regcred".into())
}

#[test]
fn kill_9_on_the_embedded_runtime_with_its_state_dir_loses_nothing_answered() {
    use imaged::domain::{Container, ContainerState, ImageSpec, PodSandbox, PodSandboxState};
    use imaged::embedded::{EmbeddedRuntime, demo_catalogue};
    let tmp = tempfile::Builder::new().prefix("imcr").tempdir_in("/tmp").unwrap();
    let runtime_state = tmp.path().join("runtime");
    // The node before imaged's first start: images a container, the
    // sandbox and pins keep, put there without imaged.
    let remote = |name: &str| demo_catalogue().into_iter().find(|r| r.name == name).unwrap();
    let (nginx, pause, busybox, redis);
    {
        let rt = EmbeddedRuntime::start_persistent(tmp.path().join("seed.sock"), &runtime_state).unwrap();
        nginx = rt.preload(remote("docker.io/library/nginx:1.27")).unwrap();
        pause = rt.preload(remote("registry.k8s.io/pause:3.10")).unwrap();
        busybox = rt.preload(remote("docker.io/library/busybox:1.36")).unwrap();
        redis = rt.preload(remote("docker.io/library/redis:7")).unwrap();
        assert!(rt.set_pinned(&busybox, true));
        rt.add_sandbox(PodSandbox {
            id: "sb-web".into(),
            name: "web".into(),
            uid: "uid-web".into(),
            namespace: "ns".into(),
            state: PodSandboxState::Ready,
            ..PodSandbox::default()
        });
        rt.add_container(Container {
            id: "c-web".into(),
            pod_sandbox_id: "sb-web".into(),
            name: "nginx".into(),
            image: ImageSpec::new(nginx.clone()),
            image_ref: nginx.clone(),
            image_id: nginx.clone(),
            state: ContainerState::Running,
            ..Container::default()
        });
    }
    let protected = vec![
        Protected { id: nginx, why: "used by container c-web" },
        Protected { id: pause, why: "the sandbox image" },
        Protected { id: busybox, why: "pinned by the runtime" },
        Protected { id: redis, why: "pinned by gc.pinned_images" },
    ];
    let node = Arc::new(Node {
        name: "embedded",
        dir: tmp.path().to_path_buf(),
        endpoint_args: vec![],
        runtime_state: Some(runtime_state),
        public: ["busybox:1.36", "busybox:latest", "nginx:1.27", "redis:7", "registry.k8s.io/pause:3.10"]
            .map(String::from)
            .to_vec(),
        private: "registry.example.com/team/app:v1".into(),
        secret: secret_manifest("registry.example.com", "team", "team-password"),
        secret_coordinates: coordinates(),
        missing: "docker.io/library/not-in-any-registry:1".into(),
        sandbox_image: "registry.k8s.io/pause:3.10".into(),
        pinned_rule: "docker.io/library/redis:*".into(),
        preloaded: protected.iter().map(|p| p.id.clone()).collect(),
        protected,
        ours: String::new(),
    });
    run_trials(&node, &runtime());
}

#[test]
fn kill_9_on_containerd_loses_nothing_answered() {
    support::containerd_env::with_environment("crash: kill -9 on containerd", |env| {
        use support::oci::Registry;
        let rt = runtime();
        let open = Registry::open(&env.registry_open);
        let auth = Registry::with_auth(&env.registry_auth, &env.user, &env.pass);
        let (public, private) = rt.block_on(async {
            let mut public = Vec::new();
            for name in ["crash-sandbox", "crash-pinned", "crash-a", "crash-b", "crash-c"] {
                let p =
                    open.push_image(&format!("imaged/{name}"), "v1", &[("etc/name", name.as_bytes())]).await.unwrap();
                public.push(p);
            }
            let private = auth.push_image("imaged/crash-private", "v1", &[("etc/p", b"private")]).await.unwrap();
            (public, private)
        });
        let endpoint = env.endpoint();
        // Another run on a shared containerd may have left them.
        for p in public.iter().chain([&private]) {
            let o = support::daemon::imagectl(
                Path::new("/nonexistent"),
                &["--runtime-endpoint", &endpoint, "cri", "rmi", &p.reference],
            );
            let err = support::daemon::stderr(&o);
            assert!(o.status.success() || err.contains("no such image"), "{err}");
        }
        let tmp = tempfile::Builder::new().prefix("imcc").tempdir_in("/tmp").unwrap();
        let node = Arc::new(Node {
            name: "containerd",
            dir: tmp.path().to_path_buf(),
            endpoint_args: vec!["--runtime-endpoint".into(), endpoint],
            runtime_state: None,
            public: public.iter().map(|p| p.reference.clone()).collect(),
            private: private.reference.clone(),
            secret: secret_manifest(&env.registry_auth, &env.user, &env.pass),
            secret_coordinates: coordinates(),
            missing: format!("{}/imaged/crash-missing:v1", env.registry_open),
            sandbox_image: public[0].reference.clone(),
            pinned_rule: format!("{}/imaged/crash-pinned:*", env.registry_open),
            protected: vec![
                Protected { id: public[0].config_digest.clone(), why: "the sandbox image" },
                Protected { id: public[1].config_digest.clone(), why: "pinned by gc.pinned_images" },
            ],
            preloaded: BTreeSet::new(),
            ours: "imaged/crash-".into(),
        });
        // The node's protected images, pulled once through imaged.
        {
            let d = node.start(false, Duration::ZERO);
            rt.block_on(async {
                let mut c = imaged::api::client(&d.socket).unwrap();
                for p in &public[..2] {
                    let r = ensure(&mut c, ensure_request(&node, "setup", &p.reference, "IfNotPresent", false)).await;
                    assert!(matches!(r, proto::ensure_image_response::Result::Ok(_)), "{r:?}");
                }
            });
        }
        run_trials(&node, &rt);
        assert_eq!(node.repo_of_private(), format!("{}/imaged/crash-private", env.registry_auth));
    });
}

/// `imaged embedded-runtime --state-dir`: what was pulled survives a
/// A served runtime killed when its test ends, failed or not (a failed
/// assertion must not leave it serving).
struct Served(std::process::Child);

impl Served {
    /// `kill -9`, and the exit collected.
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `kill -9`, and a second runtime on the same directory is refused.
#[test]
fn a_separately_served_embedded_runtime_keeps_its_images_across_kill_9() {
    use std::process::{Command, Stdio};
    let tmp = tempfile::Builder::new().prefix("imse").tempdir_in("/tmp").unwrap();
    let state = tmp.path().join("state");
    let socket = tmp.path().join("rt.sock");
    let endpoint = format!("unix://{}", socket.display());
    let serve = |sock: &Path| {
        Command::new(env!("CARGO_BIN_EXE_imaged"))
            .args(["embedded-runtime", "--socket"])
            .arg(sock)
            .arg("--state-dir")
            .arg(&state)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let wait_serving = |sock: &Path| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(sock).is_err() {
            assert!(std::time::Instant::now() < deadline, "the embedded runtime did not serve");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let cri = |args: &[&str]| {
        let mut all = vec!["--runtime-endpoint", endpoint.as_str(), "cri"];
        all.extend_from_slice(args);
        support::daemon::imagectl(Path::new("/nonexistent"), &all)
    };
    let mut first = Served(serve(&socket));
    wait_serving(&socket);
    let o = cri(&["pull", "busybox:1.36"]);
    assert!(o.status.success(), "{}", support::daemon::stderr(&o));

    let second = serve(&tmp.path().join("other.sock")).wait_with_output().unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("another embedded runtime uses it"), "{err}");

    first.kill();
    let _again = Served(serve(&socket));
    wait_serving(&socket);
    let o = cri(&["images"]);
    let listed = support::daemon::stdout(&o);
    assert!(listed.lines().any(|l| l.split_whitespace().take(2).eq(["docker.io/library/busybox", "1.36"])), "{listed}");
}
