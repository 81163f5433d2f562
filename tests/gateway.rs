//! The CRI gateway against the embedded runtime: every RPC, every fault
//! action, recovery after a runtime restart, and real concurrency.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use actix::Addr;
use imaged::actors::cri_gateway::*;
use imaged::actors::cri_gateway::{CriDeadlines, CriSettings};
use imaged::cri::{CriError, CriErrorKind, Rpc};
use imaged::domain::{
    AuthConfig, Container, ContainerFilter, ContainerState, ImageSpec, PodSandbox, PodSandboxFilter, PodSandboxState,
};
use imaged::embedded::{EmbeddedRuntime, RemoteImage};
use imaged::fault::{FaultPlan, FaultRule};
use tokio::time::Instant;

struct Fixture {
    _dir: tempfile::TempDir,
    runtime: EmbeddedRuntime,
    gateway: Addr<CriGatewayActor>,
}

fn cfg(deadline: Option<Duration>) -> CriSettings {
    CriSettings {
        startup_timeout: Duration::from_secs(5),
        deadlines: CriDeadlines::uniform(deadline),
        ..CriSettings::default()
    }
}

async fn fixture_with(cfg: CriSettings) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = EmbeddedRuntime::start_in(dir.path()).expect("embedded runtime starts");
    runtime.add_remote(RemoteImage::new("busybox:1.36", 1_000)).expect("add");
    runtime.add_remote(RemoteImage::new("nginx:1.27", 5_000)).expect("add");
    runtime.add_remote(RemoteImage::new("registry.example.com/team/app:v1", 2_000).private("team", "pw")).expect("add");
    let (gateway, version) = CriGatewayActor::connect(&runtime.endpoint(), &cfg).await.expect("gateway connects");
    assert_eq!(version.runtime_name, imaged::embedded::RUNTIME_NAME);
    assert_eq!(version.runtime_api_version, "v1");
    Fixture { _dir: dir, runtime, gateway }
}

async fn fixture() -> Fixture {
    fixture_with(cfg(Some(Duration::from_secs(10)))).await
}

fn pull(image: &str) -> PullImage {
    PullImage::new(ImageSpec::new(image))
}

fn status(image: &str) -> GetImageStatus {
    GetImageStatus { image: ImageSpec::new(image), verbose: false }
}

#[actix::test]
async fn image_rpcs_behave_like_containerd() {
    let f = fixture().await;
    let g = &f.gateway;

    // Absent image: no image, not an error.
    assert_eq!(g.send(status("busybox:1.36")).await.unwrap().unwrap().image, None);

    // Pull returns the image id, and the image is then found by tag, digest and id.
    let id = g.send(pull("busybox:1.36")).await.unwrap().expect("pull");
    let expected = RemoteImage::new("busybox:1.36", 1_000);
    assert_eq!(id, expected.id);
    let img = g.send(status("docker.io/library/busybox:1.36")).await.unwrap().unwrap().image.expect("present");
    assert_eq!(img.id, id);
    assert_eq!(img.repo_tags, vec!["docker.io/library/busybox:1.36".to_string()]);
    assert_eq!(img.repo_digests, vec![format!("docker.io/library/busybox@{}", expected.digest)]);
    assert_eq!(img.size, 1_000);
    let by_id = g.send(status(&id)).await.unwrap().unwrap().image.expect("by id");
    assert_eq!(by_id.id, id);
    let by_digest = g.send(status(&img.repo_digests[0])).await.unwrap().unwrap().image.expect("by digest");
    assert_eq!(by_digest.id, id);

    g.send(pull("nginx:1.27")).await.unwrap().expect("pull nginx");
    let all = g.send(ListImages::default()).await.unwrap().expect("list");
    assert_eq!(all.len(), 2);
    let filtered = g.send(ListImages { filter: Some(ImageSpec::new("nginx:1.27")) }).await.unwrap().expect("list");
    assert_eq!(filtered.len(), 1);

    let fs = g.send(GetImageFsInfo).await.unwrap().expect("fs info");
    assert_eq!(fs.image_filesystems.len(), 1);
    assert_eq!(fs.image_filesystems[0].used_bytes, Some(6_000));
    assert_eq!(fs.image_filesystems[0].inodes_used, Some(2));
    assert_eq!(fs.image_filesystems[0].mountpoint, imaged::embedded::IMAGE_FS_MOUNTPOINT);
    assert_eq!(fs.container_filesystems.len(), 1);

    // Removing by tag removes the image; removing it again succeeds.
    g.send(RemoveImage { image: ImageSpec::new("busybox:1.36") }).await.unwrap().expect("remove");
    assert_eq!(g.send(status(&id)).await.unwrap().unwrap().image, None);
    g.send(RemoveImage { image: ImageSpec::new("busybox:1.36") }).await.unwrap().expect("remove absent");
    let fs = g.send(GetImageFsInfo).await.unwrap().expect("fs info");
    assert_eq!(fs.image_filesystems[0].used_bytes, Some(5_000));
}

#[actix::test]
async fn pulls_fail_like_containerd() {
    let f = fixture().await;
    let g = &f.gateway;
    let missing = g.send(pull("nope:1")).await.unwrap().expect_err("missing");
    assert_eq!(missing.kind(), CriErrorKind::NotFound);
    assert!(missing.to_string().contains("docker.io/library/nope:1: not found"), "{missing}");

    let no_creds = g.send(pull("registry.example.com/team/app:v1")).await.unwrap().expect_err("no creds");
    assert_eq!(no_creds.kind(), CriErrorKind::Unauthorized, "{no_creds}");
    assert!(no_creds.to_string().contains("401 Unauthorized"), "{no_creds}");

    let wrong = AuthConfig::basic("registry.example.com", "team", "wrong");
    let m = PullImage { auth: Some(wrong), ..pull("registry.example.com/team/app:v1") };
    let e = g.send(m).await.unwrap().expect_err("wrong password");
    assert_eq!(e.kind(), CriErrorKind::Unauthorized);
    assert!(!format!("{e} {e:?}").contains("wrong"), "the password leaked: {e:?}");

    let right = AuthConfig::basic("registry.example.com", "team", "pw");
    let m = PullImage { auth: Some(right), ..pull("registry.example.com/team/app:v1") };
    g.send(m).await.unwrap().expect("right password pulls");

    let bad = g.send(pull("UPPER/Case")).await.unwrap().expect_err("bad reference");
    assert!(bad.to_string().contains("UPPER/Case"), "{bad}");

    f.runtime.set_capacity(f.runtime.used_bytes() + 10);
    let full = g.send(pull("nginx:1.27")).await.unwrap().expect_err("disk full");
    assert!(full.to_string().contains("no space left on device"), "{full}");
}

#[actix::test]
async fn runtime_rpcs_list_what_the_runtime_holds() {
    let f = fixture().await;
    let g = &f.gateway;
    f.runtime.add_sandbox(PodSandbox {
        id: "sb1".into(),
        name: "web".into(),
        uid: "uid-1".into(),
        namespace: "default".into(),
        state: PodSandboxState::Ready,
        ..Default::default()
    });
    for (id, state) in [("c1", ContainerState::Running), ("c2", ContainerState::Exited)] {
        f.runtime.add_container(Container {
            id: id.into(),
            pod_sandbox_id: "sb1".into(),
            name: format!("name-{id}"),
            image: ImageSpec::new("docker.io/library/nginx:1.27"),
            image_ref: "sha256:abc".into(),
            state,
            ..Default::default()
        });
    }
    let all = g.send(ListContainers::default()).await.unwrap().expect("list containers");
    assert_eq!(all.len(), 2);
    let running = ContainerFilter { state: Some(ContainerState::Running), ..Default::default() };
    let running = g.send(ListContainers { filter: running }).await.unwrap().expect("list running");
    assert_eq!(running.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["c1"]);
    assert_eq!(running[0].image.image, "docker.io/library/nginx:1.27");
    assert_eq!(running[0].image_ref, "sha256:abc");

    let sandboxes =
        g.send(ListPodSandboxes { filter: PodSandboxFilter::default() }).await.unwrap().expect("list sandboxes");
    assert_eq!(sandboxes.len(), 1);
    assert_eq!((sandboxes[0].uid.as_str(), sandboxes[0].state), ("uid-1", PodSandboxState::Ready));

    let st = g.send(GetContainerStatus { id: "c2".into(), verbose: false }).await.unwrap().expect("status");
    assert_eq!((st.name.as_str(), st.state), ("name-c2", ContainerState::Exited));
    let missing = g.send(GetContainerStatus { id: "zz".into(), verbose: false }).await.unwrap().expect_err("absent");
    assert_eq!(missing.kind(), CriErrorKind::NotFound);

    let v = g.send(GetVersion).await.unwrap().expect("version");
    assert_eq!(v.runtime_name, imaged::embedded::RUNTIME_NAME);
}

const DEADLINE: Duration = Duration::from_millis(300);
/// Slack for scheduling on a loaded 2-core machine: the point is "about the
/// deadline", not "after a default 2-minute timeout".
const SLACK: Duration = Duration::from_secs(3);

#[actix::test]
async fn gateway_faults_give_the_right_kind_within_the_deadline() {
    let f = fixture_with(cfg(Some(DEADLINE))).await;
    let g = &f.gateway;
    let kinds = [
        CriErrorKind::NotFound,
        CriErrorKind::RuntimeUnavailable,
        CriErrorKind::Unauthorized,
        CriErrorKind::ResourceExhausted,
        CriErrorKind::RegistryUnavailable,
        CriErrorKind::SignatureValidationFailed,
        CriErrorKind::InvalidArgument,
        CriErrorKind::Other,
    ];
    for kind in kinds {
        let plan = FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).times(1).fail(CriError::new(kind, "injected")));
        g.send(SetFaultPlan(plan)).await.unwrap();
        let e = g.send(pull("busybox:1.36")).await.unwrap().expect_err("fails");
        assert_eq!(e.kind(), kind);
    }
    // The gateway-level Fail never reached the runtime.
    assert_eq!(f.runtime.stats().calls(Rpc::PullImage), 0);

    // Delay within the deadline: the call succeeds, later.
    let plan = FaultPlan::new(1).rule(FaultRule::on(Rpc::ImageStatus).times(1).delay(Duration::from_millis(100)));
    g.send(SetFaultPlan(plan)).await.unwrap();
    let t = Instant::now();
    g.send(status("busybox:1.36")).await.unwrap().expect("delayed call succeeds");
    assert!(t.elapsed() >= Duration::from_millis(100));

    // Delay past the deadline, hang and a dropped reply: DeadlineExceeded, at about the deadline.
    let cases = [
        FaultRule::on(Rpc::ListImages).delay(Duration::from_secs(60)),
        FaultRule::on(Rpc::ListImages).hang(),
        FaultRule::on(Rpc::ListImages).drop_reply(),
    ];
    for rule in cases {
        g.send(SetFaultPlan(FaultPlan::new(1).rule(rule))).await.unwrap();
        let t = Instant::now();
        let e = g.send(ListImages::default()).await.unwrap().expect_err("deadline");
        let took = t.elapsed();
        assert_eq!(e.kind(), CriErrorKind::DeadlineExceeded);
        assert!(took >= DEADLINE && took < DEADLINE + SLACK, "took {took:?}");
    }

    // A dropped reply still did the work on the runtime.
    let plan = FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).image("*nginx*").drop_reply());
    g.send(SetFaultPlan(plan)).await.unwrap();
    let e = g.send(pull("nginx:1.27")).await.unwrap().expect_err("reply lost");
    assert_eq!(e.kind(), CriErrorKind::DeadlineExceeded);
    assert!(f.runtime.images().iter().any(|i| i.repo_tags.contains(&"docker.io/library/nginx:1.27".to_string())));

    // Clearing the plan restores normal service.
    g.send(SetFaultPlan(FaultPlan::default())).await.unwrap();
    g.send(ListImages::default()).await.unwrap().expect("no faults");
}

#[actix::test]
async fn runtime_level_faults_cross_the_wire_with_their_kind() {
    let f = fixture_with(cfg(Some(DEADLINE))).await;
    let g = &f.gateway;
    for kind in [
        CriErrorKind::NotFound,
        CriErrorKind::Unauthorized,
        CriErrorKind::ResourceExhausted,
        CriErrorKind::RegistryUnavailable,
        CriErrorKind::SignatureValidationFailed,
        CriErrorKind::Other,
    ] {
        let err = CriError::new(kind, "from the runtime");
        f.runtime.set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).fail(err.clone())));
        let e = g.send(pull("busybox:1.36")).await.unwrap().expect_err("fails");
        assert_eq!(e, err, "the status crossed the wire unchanged");
    }
    let rpc_faults = [FaultRule::on(Rpc::ImageFsInfo).hang(), FaultRule::on(Rpc::ImageFsInfo).drop_reply()];
    for rule in rpc_faults {
        f.runtime.set_fault_plan(FaultPlan::new(1).rule(rule));
        let t = Instant::now();
        let e = g.send(GetImageFsInfo).await.unwrap().expect_err("deadline");
        assert_eq!(e.kind(), CriErrorKind::DeadlineExceeded);
        assert!(t.elapsed() < DEADLINE + SLACK);
    }
    f.runtime.set_fault_plan(FaultPlan::default());
    g.send(GetImageFsInfo).await.unwrap().expect("healthy again");
}

#[actix::test]
async fn gateway_recovers_when_the_runtime_restarts() {
    let mut f = fixture_with(cfg(Some(Duration::from_secs(2)))).await;
    f.gateway.send(pull("busybox:1.36")).await.unwrap().expect("pull before restart");

    f.runtime.stop();
    let e = f.gateway.send(ListImages::default()).await.unwrap().expect_err("runtime is down");
    assert_eq!(e.kind(), CriErrorKind::RuntimeUnavailable, "{e}");
    assert!(e.is_retryable());

    f.runtime.resume().expect("runtime restarts");
    // The same gateway, not restarted, serves again (bounded wait for the reconnect).
    let mut last = None;
    for _ in 0..50 {
        match f.gateway.send(ListImages::default()).await.unwrap() {
            Ok(images) => {
                assert_eq!(images.len(), 1);
                last = None;
                break;
            }
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(last.is_none(), "gateway did not recover: {last:?}");
}

#[actix::test]
async fn concurrent_pulls_are_concurrent_rpcs() {
    let f = fixture().await;
    for i in 0..100 {
        f.runtime
            .add_remote(RemoteImage::new(format!("example.com/load/img{i}:v1"), 10).latency(Duration::from_millis(200)))
            .expect("add");
    }
    let sends = (0..100).map(|i| f.gateway.send(pull(&format!("example.com/load/img{i}:v1"))));
    let results = futures_util::future::join_all(sends).await;
    for r in results {
        r.expect("mailbox").expect("pull");
    }
    let stats = f.runtime.stats();
    assert_eq!(stats.calls(Rpc::PullImage), 100);
    assert_eq!(stats.pulls_completed, 100);
    assert_eq!(stats.max_pulls_in_flight, 100, "every pull was in flight at once");
}

#[actix::test]
async fn connect_fails_clearly_when_no_runtime_listens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let endpoint = imaged::cri::CriEndpoint::Unix(dir.path().join("absent.sock"));
    let cfg = CriSettings { startup_timeout: Duration::from_millis(500), ..cfg(Some(Duration::from_secs(1))) };
    let t = Instant::now();
    let e = CriGatewayActor::connect(&endpoint, &cfg).await.expect_err("nobody listens");
    assert_eq!(e.kind(), CriErrorKind::RuntimeUnavailable, "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[actix::test]
async fn a_forwarded_call_carries_the_callers_bytes_and_the_runtimes_answer() {
    use imaged::cri::proto as pb;
    use prost::Message as _;
    let f = fixture().await;
    let reader = f.gateway.send(GetReader).await.expect("reader");
    // A pull, forwarded: the request's bytes with a field imaged's proto
    // does not know (number 99) still decode at the runtime.
    let mut req = pb::PullImageRequest {
        image: Some(pb::ImageSpec { image: "busybox:1.36".into(), ..Default::default() }),
        ..Default::default()
    }
    .encode_to_vec();
    req.extend_from_slice(&[0x9a, 0x06, 2, b'h', b'i']);
    let answer = reader.forward(Rpc::PullImage, Some("busybox:1.36"), req.into(), None).await.expect("pulled");
    let image_ref = pb::PullImageResponse::decode(answer).expect("decodes").image_ref;
    assert!(image_ref.starts_with("sha256:"), "{image_ref}");

    // ImageStatus and ListImages forwarded answer as the typed calls do.
    let req = pb::ImageStatusRequest {
        image: Some(pb::ImageSpec { image: "busybox:1.36".into(), ..Default::default() }),
        verbose: false,
    };
    let answer = reader.forward(Rpc::ImageStatus, None, req.encode_to_vec().into(), None).await.expect("status");
    let image = pb::ImageStatusResponse::decode(answer).expect("decodes").image.expect("present");
    assert_eq!(image.id, image_ref);
    let answer = reader.forward(Rpc::ListImages, None, Vec::new().into(), None).await.expect("list");
    assert_eq!(pb::ListImagesResponse::decode(answer).expect("decodes").images.len(), 1);

    // The runtime's error keeps its code and message.
    let req = pb::PullImageRequest {
        image: Some(pb::ImageSpec { image: "docker.io/library/missing:1".into(), ..Default::default() }),
        ..Default::default()
    };
    let e = reader.forward(Rpc::PullImage, None, req.encode_to_vec().into(), None).await.expect_err("missing");
    let typed = f.gateway.send(pull("docker.io/library/missing:1")).await.expect("mailbox").expect_err("missing");
    assert_eq!((e.code(), e.message()), (typed.code(), typed.message()));
    // Bytes that are no message are the runtime's InvalidArgument/Internal, not a panic.
    let e = reader.forward(Rpc::ImageStatus, None, vec![0xff, 0xff].into(), None).await.expect_err("garbage");
    assert_ne!(e.kind(), CriErrorKind::RuntimeUnavailable, "{e:?}");
}
