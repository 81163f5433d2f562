//! Verified access to cached private images (KEP-2535) end to end against
//! the embedded runtime, whose registry demands credentials for a private
//! image: a pod that pulled with its secret, a pod without one, a pod with
//! the same credential in another secret; policies; restarts (the state
//! directory reopened); single-flight; a crash between intent and record
//! (a child process killed with SIGKILL).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use imaged::actors::backoff_registry::BackoffSettings;
use imaged::actors::pull_queue::{Concurrency, PullQueueSettings};
use imaged::credentials::PullSecret;
use imaged::cri::Rpc;
use imaged::domain::ImageErrorKind;
use imaged::domain::pull_policy::PullPolicy;
use imaged::embedded::RemoteImage;
use imaged::ensure::{EnsureError, EnsureImageRequest, EnsureOk, EnsureSettings, ImageManager};
use imaged::metrics::Metrics;
use imaged::pull_records::{PullRecords, VerificationPolicy, VerifyPolicy};
use imaged::store::Store;
use imaged::testing::{Scrape, start_manager};
use support::fixture::{Runtime, runtime};

const PRIVATE: &str = "registry.example.com/team/app:v1";
const REPO: &str = "registry.example.com/team/app";
const USER: &str = "team";
const PASSWORD: &str = "s3cret";

/// A dockerconfigjson secret for the private registry.
fn secret(namespace: &str, name: &str, uid: &str, password: &str) -> PullSecret {
    let json = format!(r#"{{"auths":{{"registry.example.com":{{"username":"{USER}","password":"{password}"}}}}}}"#);
    PullSecret::new(namespace, name, "kubernetes.io/dockerconfigjson")
        .with_data(".dockerconfigjson", json.into_bytes())
        .with_uid(uid)
}

fn req(uid: &str, policy: PullPolicy, secrets: Vec<PullSecret>) -> EnsureImageRequest {
    let mut r = EnsureImageRequest::new(uid, PRIVATE, policy);
    r.pod.namespace = "default".into();
    r.pod.name = format!("pod-{uid}");
    r.pull_secrets = secrets;
    r
}

fn private_remote() -> RemoteImage {
    RemoteImage::new(PRIVATE, 1_000).private(USER, PASSWORD)
}

/// A manager whose pull records live in `dir` (a "node": reopening the
/// same dir is a restart), with startup recovery of intents.
async fn manager(rt: &Runtime, dir: &Path, policy: VerificationPolicy, concurrency: Concurrency) -> ImageManager {
    counting_manager(rt, dir, policy, concurrency, &Metrics::default()).await
}

/// [`manager`], reporting to `metrics` (as `imaged::node::Node` wires it).
async fn counting_manager(
    rt: &Runtime,
    dir: &Path,
    policy: VerificationPolicy,
    concurrency: Concurrency,
    metrics: &Metrics,
) -> ImageManager {
    let store = Arc::new(Store::open(dir).expect("store opens"));
    let records =
        PullRecords::open(VerifyPolicy::new(policy), Some(store)).expect("records load").with_metrics(metrics.clone());
    imaged::node::recover_intents_from_runtime(&records, &rt.gateway).await.expect("recovery");
    let pull = PullQueueSettings { concurrency, qps: 0.0, metrics: metrics.clone(), ..PullQueueSettings::default() };
    start_manager(&rt.gateway, &pull, &BackoffSettings::default(), EnsureSettings::default())
        .await
        .expect("manager starts")
        .manager
        .with_pull_records(records)
}

/// `imaged_imagemanager_image_mustpull_checks_total{result}` in `metrics`' scrape.
fn mustpull_checks(metrics: &Metrics, result: &str) -> Option<f64> {
    let s = Scrape::parse(&metrics.encode()).expect("the scrape parses");
    s.value("imaged_imagemanager_image_mustpull_checks_total", &[("result", result)])
}

fn pulls(rt: &Runtime) -> u64 {
    rt.runtime.stats().calls(Rpc::PullImage)
}

fn served(r: &Result<EnsureOk, EnsureError>) -> bool {
    r.as_ref().is_ok_and(|ok| {
        ok.message.is_empty()
            || ok.message
                == format!("Container image \"{PRIVATE}\" already present on machine and can be accessed by the pod")
    })
}

fn refused_by_the_registry(r: &Result<EnsureOk, EnsureError>) -> bool {
    r.as_ref().is_err_and(|e| e.kind == ImageErrorKind::ErrImagePull && e.message.contains("401 Unauthorized"))
}

#[actix::test]
async fn a_pod_without_the_secret_is_refused_a_pod_with_the_same_credential_is_served_and_a_restart_changes_nothing() {
    let rt = runtime().await;
    rt.runtime.add_remote(private_remote()).expect("add");
    let state = tempfile::tempdir().expect("tempdir");
    let a = || vec![secret("team-a", "regcred", "uid-a", PASSWORD)];
    // Another secret (other namespace, name and uid) holding the same credential.
    let c = || vec![secret("team-c", "copy", "uid-c", PASSWORD)];

    let metrics = Metrics::default();
    let m = counting_manager(
        &rt,
        state.path(),
        VerificationPolicy::NeverVerifyPreloadedImages,
        Concurrency::Serial,
        &metrics,
    )
    .await;
    // Pod A pulls with its secret.
    let ok = m.ensure_image_exists(&req("a", PullPolicy::IfNotPresent, a())).await.expect("A pulls");
    assert_eq!(ok.message, "");
    assert_eq!(pulls(&rt), 1);
    // The record is written behind the answer.
    m.settled().await;
    let record = m.pull_records().record(&ok.image_ref).expect("pulled record");
    let secrets = &record.credential_mapping[REPO].kubernetes_secrets;
    assert_eq!(secrets.len(), 1);
    assert_eq!(
        (secrets[0].namespace.as_str(), secrets[0].name.as_str(), secrets[0].uid.as_str()),
        ("team-a", "regcred", "uid-a")
    );
    assert_eq!(secrets[0].credential_hash.len(), 64, "a SHA-256 hex, never the password");
    assert!(!serde_json::to_string(&record).unwrap().contains(PASSWORD));

    // Pod B, no secret, image present: it must pull, and the registry refuses it.
    let b = m.ensure_image_exists(&req("b", PullPolicy::IfNotPresent, vec![])).await;
    assert!(refused_by_the_registry(&b), "{b:?}");
    assert_eq!(pulls(&rt), 2, "B's pull reached the registry");
    // With Never it gets the kubelet's "not present" answer.
    let never = m.ensure_image_exists(&req("b2", PullPolicy::Never, vec![])).await.expect_err("Never");
    assert_eq!(never.kind, ImageErrorKind::ErrImageNeverPull);
    assert_eq!(never.message, format!("Container image \"{PRIVATE}\" is not present with pull policy of Never"));
    // Pod C, same credential in another secret: served without a pull.
    let c_ok = m.ensure_image_exists(&req("c", PullPolicy::IfNotPresent, c())).await;
    assert!(served(&c_ok), "{c_ok:?}");
    assert_eq!(pulls(&rt), 2);
    // Pod A again: served without a pull, also under Never.
    assert!(served(&m.ensure_image_exists(&req("a2", PullPolicy::Never, a())).await));
    assert_eq!(pulls(&rt), 2);
    assert_eq!(mustpull_checks(&metrics, "mustAuthenticate"), Some(2.0), "B and B2");
    assert_eq!(mustpull_checks(&metrics, "credentialRecordFound"), Some(2.0), "C and A2");

    // Restart: everything reopened from the state directory.
    drop(m);
    let m = manager(&rt, state.path(), VerificationPolicy::NeverVerifyPreloadedImages, Concurrency::Serial).await;
    let b = m.ensure_image_exists(&req("b3", PullPolicy::IfNotPresent, vec![])).await;
    assert!(refused_by_the_registry(&b), "{b:?}");
    assert_eq!(pulls(&rt), 3);
    assert!(served(&m.ensure_image_exists(&req("c2", PullPolicy::IfNotPresent, c())).await));
    assert!(served(&m.ensure_image_exists(&req("a3", PullPolicy::IfNotPresent, a())).await));
    assert_eq!(pulls(&rt), 3, "A and C are served from the records");
    // A secret with a wrong password is refused too.
    let b_wrong =
        m.ensure_image_exists(&req("b4", PullPolicy::IfNotPresent, vec![secret("x", "y", "z", "guess")])).await;
    assert!(refused_by_the_registry(&b_wrong), "{b_wrong:?}");
}

#[actix::test]
async fn never_verify_serves_a_pod_without_the_secret_and_always_verify_checks_even_preloaded_images() {
    let rt = runtime().await;
    rt.runtime.add_remote(private_remote()).expect("add");
    let state = tempfile::tempdir().expect("tempdir");
    let metrics = Metrics::default();
    let m = counting_manager(&rt, state.path(), VerificationPolicy::NeverVerify, Concurrency::Serial, &metrics).await;
    m.ensure_image_exists(&req("a", PullPolicy::IfNotPresent, vec![secret("ns", "regcred", "uid-a", PASSWORD)]))
        .await
        .expect("A pulls");
    let b = m.ensure_image_exists(&req("b", PullPolicy::IfNotPresent, vec![])).await;
    assert!(served(&b), "{b:?}");
    assert_eq!(pulls(&rt), 1);
    assert_eq!(mustpull_checks(&metrics, "credentialPolicyAllowed"), Some(1.0));
    drop(m);

    // A preloaded private image (never pulled by imaged).
    let rt = runtime().await;
    rt.runtime.preload(private_remote()).expect("preload");
    let state = tempfile::tempdir().expect("tempdir");
    let m = manager(&rt, state.path(), VerificationPolicy::NeverVerifyPreloadedImages, Concurrency::Serial).await;
    assert!(served(&m.ensure_image_exists(&req("b", PullPolicy::IfNotPresent, vec![])).await), "preloaded: exempt");
    drop(m);
    let state = tempfile::tempdir().expect("tempdir");
    let m = manager(&rt, state.path(), VerificationPolicy::AlwaysVerify, Concurrency::Serial).await;
    let b = m.ensure_image_exists(&req("b", PullPolicy::IfNotPresent, vec![])).await;
    assert!(refused_by_the_registry(&b), "{b:?}");
    let a = m.ensure_image_exists(&req("a", PullPolicy::IfNotPresent, vec![secret("ns", "s", "u", PASSWORD)])).await;
    assert!(served(&a), "{a:?}");
}

#[actix::test]
async fn single_flight_never_hands_a_private_image_to_a_pod_without_credentials() {
    for concurrency in [Concurrency::Serial, Concurrency::Parallel(None)] {
        let rt = runtime().await;
        rt.runtime.add_remote(private_remote().latency(Duration::from_millis(50))).expect("add");
        let state = tempfile::tempdir().expect("tempdir");
        let m = manager(&rt, state.path(), VerificationPolicy::NeverVerifyPreloadedImages, concurrency).await;
        let a = req("a", PullPolicy::IfNotPresent, vec![secret("ns", "regcred", "uid-a", PASSWORD)]);
        let b = req("b", PullPolicy::IfNotPresent, vec![]);
        let (ra, rb) = futures_util::join!(m.ensure_image_exists(&a), m.ensure_image_exists(&b));
        assert!(served(&ra), "{concurrency:?}: {ra:?}");
        assert!(refused_by_the_registry(&rb), "{concurrency:?}: {rb:?}");
        drop(m);
    }
}

#[actix::test]
async fn a_pod_that_finds_the_image_while_its_pull_is_being_recorded_waits_for_the_record_instead_of_pulling() {
    let rt = runtime().await;
    rt.runtime.add_remote(private_remote()).expect("add");
    let state = tempfile::tempdir().expect("tempdir");
    let metrics = Metrics::default();
    let m = counting_manager(
        &rt,
        state.path(),
        VerificationPolicy::NeverVerifyPreloadedImages,
        Concurrency::Serial,
        &metrics,
    )
    .await;
    // Another request's pull: the runtime has answered it (the image is
    // present) and its record is not written yet.
    let records = m.pull_records().clone();
    let intent = records.begin_pull(PRIVATE).await.expect("intent");
    let id = rt.runtime.preload(private_remote()).expect("preload");
    let before = pulls(&rt);
    let m2 = m.clone();
    let b = tokio::spawn(async move { m2.ensure_image_exists(&req("b", PullPolicy::IfNotPresent, vec![])).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!b.is_finished(), "waiting for the pull in flight to be recorded");
    // Pulled with the node's credentials: any pod may use it.
    let creds = imaged::domain::pull_record::ImagePullCredentials::node_accessible();
    records.record_image_pulled(PRIVATE, &id, &creds).await.expect("recorded");
    intent.disarm();
    let rb = b.await.expect("task");
    assert!(served(&rb), "the record lets it use the image: {rb:?}");
    assert_eq!(pulls(&rt), before, "no second pull of an image whose pull was ending");
    assert_eq!(mustpull_checks(&metrics, "credentialRecordFound"), Some(1.0), "checked again once the record came");
    assert_eq!(
        mustpull_checks(&metrics, "mustAuthenticate"),
        None,
        "the look before the wait is not counted: one pod's check is one in the metric"
    );
}

// === crash between intent and record ===

const CHILD_DIR_ENV: &str = "IMAGED_KEP_TEST_CHILD_DIR";

/// Not a test on its own: the body of the child process of
/// [`a_crash_between_intent_and_record_is_recovered_at_the_next_start`].
/// Records a pull intent in the state directory, says so, and waits to be
/// killed; returns at once when not run as that child.
#[test]
fn intent_writer_child() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else { return };
    let store = Arc::new(Store::open(Path::new(&dir)).expect("child opens the store"));
    let records = PullRecords::open(VerifyPolicy::default(), Some(store)).expect("child loads");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(records.record_pull_intent(PRIVATE)).expect("intent recorded");
    println!("intent recorded");
    std::thread::sleep(Duration::from_secs(60));
}

#[actix::test]
async fn a_crash_between_intent_and_record_is_recovered_at_the_next_start() {
    let state = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "intent_writer_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, state.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("child starts");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("intent recorded") => break,
            Ok(_) => continue,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the child did not record its intent: {e}");
            }
        }
    }
    // SIGKILL: the pull "ran" but imaged died before recording it.
    child.kill().expect("kill");
    child.wait().expect("reaped");

    // The runtime finished the pull (made with the secret) before the crash.
    let rt = runtime().await;
    rt.runtime.preload(private_remote()).expect("preload");
    let image_id = private_remote().id;
    {
        let store = Arc::new(Store::open(state.path()).expect("reopens after the crash"));
        let records = PullRecords::open(VerifyPolicy::default(), Some(store)).expect("loads");
        assert_eq!(records.stored_intents(), [PRIVATE], "the intent survived the crash");
    }
    let m = manager(&rt, state.path(), VerificationPolicy::NeverVerifyPreloadedImages, Concurrency::Serial).await;
    assert!(m.pull_records().stored_intents().is_empty(), "matched to the present image");
    let record = m.pull_records().record(&image_id).expect("record written by recovery");
    let entries: Vec<_> = record.credential_mapping.iter().map(|(repo, c)| (repo.as_str(), c.is_empty())).collect();
    assert_eq!(entries, [(REPO, true)], "with no credentials, under the name's repository");
    // A pod without credentials must pull, and is refused.
    let b = m.ensure_image_exists(&req("b", PullPolicy::IfNotPresent, vec![])).await;
    assert!(refused_by_the_registry(&b), "{b:?}");
    // A pod with the secret pulls (verifies) and is then on record.
    let a = m.ensure_image_exists(&req("a", PullPolicy::IfNotPresent, vec![secret("ns", "s", "u", PASSWORD)])).await;
    assert!(served(&a), "{a:?}");
    m.settled().await;
    assert_eq!(
        m.pull_records().record(&image_id).expect("record").credential_mapping[REPO].kubernetes_secrets.len(),
        1
    );
    assert_eq!(pulls(&rt), 2);
}

#[actix::test]
async fn gc_prunes_the_records_of_the_images_it_removes_and_keeps_the_others() {
    use imaged::actors::gc_executor::DeleteUnusedImages;
    use imaged::node::{GcParts, GcService};

    let rt = runtime().await;
    rt.runtime.add_remote(private_remote()).expect("add");
    rt.runtime.add_remote(RemoteImage::new("example.com/public:1", 100)).expect("add");
    let state = tempfile::tempdir().expect("tempdir");
    let m = manager(&rt, state.path(), VerificationPolicy::NeverVerifyPreloadedImages, Concurrency::Serial).await;
    let private = m
        .ensure_image_exists(&req("a", PullPolicy::IfNotPresent, vec![secret("ns", "s", "u", PASSWORD)]))
        .await
        .expect("pulled");
    let public = m
        .ensure_image_exists(&EnsureImageRequest::new("p", "example.com/public:1", PullPolicy::IfNotPresent))
        .await
        .expect("pulled");
    // The private image stays in use by a container.
    rt.runtime.add_container(imaged::domain::Container {
        id: "c1".into(),
        name: "app".into(),
        image: imaged::domain::ImageSpec::new(PRIVATE),
        image_ref: private.image_ref.clone(),
        state: imaged::domain::ContainerState::Running,
        ..Default::default()
    });
    // Both records written (behind the pulls' answers) before GC runs.
    m.settled().await;
    let settings = imaged::config::Config::from_toml("[gc]\nimage_minimum_gc_age = \"0s\"\nsandbox_image = \"\"")
        .expect("config")
        .gc;
    let svc = GcService::start(
        &rt.gateway,
        &settings,
        rt.runtime.capacity_source(),
        GcParts { pull_records: Some(m.pull_records().clone()), ..GcParts::default() },
    );
    let report = svc.executor.send(DeleteUnusedImages { dry_run: false }).await.expect("executor").expect("gc");
    assert_eq!(report.removed.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), [public.image_ref.as_str()]);
    assert!(m.pull_records().record(&public.image_ref).is_none(), "the removed image's record is pruned");
    assert!(m.pull_records().record(&private.image_ref).is_some(), "the in-use image keeps its record");
}

#[actix::test]
async fn the_local_fallback_serves_only_pods_that_may_use_the_image() {
    use imaged::cri::{CriError, CriErrorKind};
    use imaged::fault::{FaultPlan, FaultRule};
    let rt = runtime().await;
    rt.runtime.add_remote(private_remote()).expect("add");
    let state = tempfile::tempdir().expect("tempdir");
    let m = manager(&rt, state.path(), VerificationPolicy::NeverVerifyPreloadedImages, Concurrency::Serial).await;
    let a = || vec![secret("ns", "regcred", "uid-a", PASSWORD)];
    m.ensure_image_exists(&req("a", PullPolicy::IfNotPresent, a())).await.expect("A pulls");
    // The registry goes away.
    let unreachable = CriError::new(CriErrorKind::RegistryUnavailable, "dial tcp: connection refused");
    rt.runtime.set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).fail(unreachable)));
    let b = m.ensure_image_exists(&req("b", PullPolicy::AlwaysWithLocalFallback, vec![])).await;
    let e = b.expect_err("a pod without the secret gets no local copy");
    assert_eq!(e.kind, ImageErrorKind::RegistryUnavailable);
    let a2 = m.ensure_image_exists(&req("a2", PullPolicy::AlwaysWithLocalFallback, a())).await.expect("A falls back");
    assert!(a2.message.contains("the registry is unreachable"), "{}", a2.message);
}

/// kubernetes/kubernetes#138175, its four steps: an image preloaded under a
/// public name X keeps X's preloaded standing after the same image (same
/// id) is pulled, with a secret, under a private name Y.
#[actix::test]
async fn a_preloaded_name_stays_preloaded_when_the_same_image_is_pulled_under_another_name() {
    const X: &str = "public.example.org/tools/app:v1";
    const ID: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    let rt = runtime().await;
    // 1. Preloaded from repository X behind imaged's back.
    rt.runtime.preload(RemoteImage::new(X, 1_000).with_id(ID)).expect("preload");
    rt.runtime.add_remote(private_remote().with_id(ID)).expect("add");
    let state = tempfile::tempdir().expect("tempdir");
    let m = manager(&rt, state.path(), VerificationPolicy::NeverVerifyPreloadedImages, Concurrency::Serial).await;
    let pod_a = || {
        let mut r = EnsureImageRequest::new("pod-a", X, PullPolicy::Never);
        r.pod.namespace = "default".into();
        r
    };
    // 2. Pod A uses X with Never and no secret.
    let first = m.ensure_image_exists(&pod_a()).await.expect("a preloaded image");
    assert_eq!(first.image_ref, ID);
    // 3. Pod B pulls the same image as Y, with its secret.
    let b = m
        .ensure_image_exists(&req(
            "pod-b",
            PullPolicy::IfNotPresent,
            vec![secret("team", "regcred", "uid-b", PASSWORD)],
        ))
        .await;
    assert!(served(&b), "{b:?}");
    assert_eq!(b.expect("pulled").image_ref, ID, "one image, two names");
    assert_eq!(pulls(&rt), 1);
    // 4. Pod A again: X is still preloaded (the kubelet 1.35/1.36 refuses it here).
    let again = m.ensure_image_exists(&pod_a()).await;
    assert_eq!(again.map(|ok| ok.image_ref), Ok(ID.to_string()));
    // Y keeps its own standing: a pod without the secret may not use it.
    let c = m.ensure_image_exists(&req("pod-c", PullPolicy::Never, vec![])).await;
    assert_eq!(c.map_err(|e| e.kind), Err(ImageErrorKind::ErrImageNeverPull));
    // Across a restart (records reopened from the state dir) too.
    drop(m);
    let m = manager(&rt, state.path(), VerificationPolicy::NeverVerifyPreloadedImages, Concurrency::Serial).await;
    assert_eq!(m.ensure_image_exists(&pod_a()).await.map(|ok| ok.image_ref), Ok(ID.to_string()));
    // Under AlwaysVerify nothing is exempt: X was pulled by nobody imaged knows.
    let strict = manager(
        &rt,
        tempfile::tempdir().expect("tempdir").path(),
        VerificationPolicy::AlwaysVerify,
        Concurrency::Serial,
    )
    .await;
    assert_eq!(strict.ensure_image_exists(&pod_a()).await.map_err(|e| e.kind), Err(ImageErrorKind::ErrImageNeverPull));
}
