//! imaged in the kubelet's path: a CRI client that is not imaged's gateway
//! (the generated `runtime.v1` client, as the kubelet uses it) talks to the
//! CRI front's socket, in front of the embedded runtime.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::sync::Arc;
use std::time::Duration;

use imaged::api::server::ApiSocket;
use imaged::config::{Config, RuntimeEndpoint};
use imaged::cri::proto as pb;
use imaged::cri::proto::image_service_client::ImageServiceClient;
use imaged::cri::{CriEndpoint, Rpc};
use imaged::cri_front::CriFront;
use imaged::node::Node;
use tonic::Code;
use tonic::transport::Channel;

/// A node on the embedded runtime, its CRI front served on a temp socket,
/// and a client of that socket.
struct Front {
    _dir: tempfile::TempDir,
    node: Arc<Node>,
    client: ImageServiceClient<Channel>,
    channel: Channel,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Front {
    async fn start(toml: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = Config::from_toml(toml).expect("config");
        cfg.endpoint = RuntimeEndpoint::Embedded { socket: Some(dir.path().join("runtime.sock")) };
        let node = Arc::new(Node::start(cfg).await.expect("node starts"));
        let path = dir.path().join("cri.sock");
        let stop = support::front::serve_front(&node, &path).await;
        let channel = CriEndpoint::Unix(path).channel(Duration::from_secs(5)).expect("channel");
        let client = ImageServiceClient::new(channel.clone());
        Front { _dir: dir, node, client, channel, _stop: stop }
    }

    fn runtime_pulls(&self) -> u64 {
        self.embedded().stats().calls(Rpc::PullImage)
    }

    fn embedded(&self) -> &imaged::embedded::EmbeddedRuntime {
        self.node.runtime().embedded.as_ref().expect("embedded")
    }

    /// Adds `image` to the embedded registry, its pull taking `latency_ms`.
    fn add(&self, image: &str, latency_ms: u64) {
        let remote = imaged::embedded::RemoteImage::new(image, 100).latency(Duration::from_millis(latency_ms));
        self.embedded().add_remote(remote).expect("add");
    }

    /// Sends `req` on a task of its own (the pull runs while the test goes on).
    fn spawn_pull(&self, req: pb::PullImageRequest) -> tokio::task::JoinHandle<Result<String, tonic::Status>> {
        let mut c = self.client.clone();
        tokio::spawn(async move { c.pull_image(req).await.map(|r| r.into_inner().image_ref) })
    }

    /// Waits until the queue holds `n` pulls.
    async fn until_queue_holds(&self, n: usize) {
        for _ in 0..200 {
            if self.node.list_pulls().await.expect("pulls").len() == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the queue never held {n} pulls: {:?}", self.node.list_pulls().await);
    }

    async fn status(&self, image: &str) -> Option<pb::Image> {
        let req = pb::ImageStatusRequest { image: Some(spec(image)), verbose: false };
        self.client.clone().image_status(req).await.expect("status").into_inner().image
    }
}

fn spec(image: &str) -> pb::ImageSpec {
    pb::ImageSpec { image: image.into(), ..Default::default() }
}

fn pull(image: &str) -> pb::PullImageRequest {
    pb::PullImageRequest { image: Some(spec(image)), auth: None, sandbox_config: None }
}

/// The pod the kubelet pulls for, as its `PodSandboxConfig` says.
fn pod(namespace: &str, name: &str, annotations: &[(&str, &str)]) -> pb::PodSandboxConfig {
    pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: namespace.into(),
            attempt: 0,
        }),
        annotations: annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Default::default()
    }
}

fn pull_for(image: &str, sandbox: pb::PodSandboxConfig) -> pb::PullImageRequest {
    pb::PullImageRequest { sandbox_config: Some(sandbox), ..pull(image) }
}

#[actix::test]
async fn in_serial_mode_kube_system_and_static_pods_pull_before_earlier_ordinary_pods() {
    let f = Front::start("").await;
    f.add("example.com/slow:1", 300);
    for name in ["low", "static", "system"] {
        f.add(&format!("example.com/{name}:1"), 5);
    }
    let api = [("kubernetes.io/config.source", "api")];
    let mut calls = vec![f.spawn_pull(pull_for("example.com/slow:1", pod("default", "first", &api)))];
    f.until_queue_holds(1).await;
    // While the slow pull runs: an ordinary pod's pull, then a static pod's,
    // then a kube-system pod's, each queued before the next is sent.
    calls.push(f.spawn_pull(pull_for("example.com/low:1", pod("default", "web", &api))));
    f.until_queue_holds(2).await;
    let file = [("kubernetes.io/config.source", "file")];
    calls.push(f.spawn_pull(pull_for("example.com/static:1", pod("default", "etcd-node1", &file))));
    f.until_queue_holds(3).await;
    calls.push(f.spawn_pull(pull_for("example.com/system:1", pod("kube-system", "coredns", &api))));
    f.until_queue_holds(4).await;
    let priorities: Vec<_> =
        f.node.list_pulls().await.expect("pulls").iter().map(|p| (p.image.clone(), p.priority)).collect();
    assert_eq!(
        priorities,
        [
            ("example.com/slow:1".to_string(), 0),
            ("example.com/static:1".to_string(), 1000),
            ("example.com/system:1".to_string(), 1000),
            ("example.com/low:1".to_string(), 0),
        ]
    );
    for c in calls {
        c.await.expect("task").expect("pulled");
    }
    assert_eq!(
        f.embedded().pull_log(),
        ["example.com/slow:1", "example.com/static:1", "example.com/system:1", "example.com/low:1"],
        "the pods that go first pulled before the ordinary pod queued earlier, FIFO among themselves"
    );
}

/// Keeps the image events and pull phases the node tells.
#[derive(Default)]
struct Told {
    events: Vec<imaged::events::ImageEvent>,
    phases: Vec<imaged::actors::pull_queue::PullPhaseChanged>,
}

impl actix::Actor for Told {
    type Context = actix::Context<Self>;
}

impl actix::Handler<imaged::events::ImageEvent> for Told {
    type Result = ();
    fn handle(&mut self, e: imaged::events::ImageEvent, _: &mut Self::Context) {
        self.events.push(e);
    }
}

impl actix::Handler<imaged::actors::pull_queue::PullPhaseChanged> for Told {
    type Result = ();
    fn handle(&mut self, p: imaged::actors::pull_queue::PullPhaseChanged, _: &mut Self::Context) {
        self.phases.push(p);
    }
}

#[derive(actix::Message)]
#[rtype(result = "(Vec<imaged::events::ImageEvent>, Vec<imaged::actors::pull_queue::PullPhaseChanged>)")]
struct TakeTold;

impl actix::Handler<TakeTold> for Told {
    type Result = actix::MessageResult<TakeTold>;
    fn handle(&mut self, _: TakeTold, _: &mut Self::Context) -> Self::Result {
        actix::MessageResult((std::mem::take(&mut self.events), std::mem::take(&mut self.phases)))
    }
}

#[actix::test]
async fn the_kubelets_pulls_show_their_pods_in_list_pulls_events_and_phases_but_never_credentials() {
    use actix::Actor;
    use imaged::actors::pull_queue::{PullPhase, PullPod};
    use imaged::events::EventReason;
    let f = Front::start("").await;
    let told = Told::default().start();
    f.node.subscribe_events(told.clone().recipient());
    f.node.subscribe_phases(told.clone().recipient()).await.expect("subscribed");
    let image = "registry.example.com/team/slow:1";
    let remote =
        imaged::embedded::RemoteImage::new(image, 100).latency(Duration::from_millis(300)).private("team", "s3cret-pw");
    f.embedded().add_remote(remote).expect("add");
    let with_auth = |name: &str| pb::PullImageRequest {
        auth: Some(pb::AuthConfig { username: "team".into(), password: "s3cret-pw".into(), ..Default::default() }),
        ..pull_for(image, pod("shop", name, &[]))
    };
    let web = f.spawn_pull(with_auth("web-0"));
    f.until_queue_holds(1).await;
    let worker = f.spawn_pull(with_auth("worker-0"));
    let pod_of = |name: &str| PullPod { namespace: "shop".into(), name: name.into(), uid: format!("uid-{name}") };
    let mut pods = Vec::new();
    for _ in 0..200 {
        pods = f.node.list_pulls().await.expect("pulls").first().map(|p| p.pods.clone()).unwrap_or_default();
        if pods.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(pods, [pod_of("web-0"), pod_of("worker-0")], "the shared pull lists both pods, in arrival order");
    web.await.expect("task").expect("pulled");
    worker.await.expect("task").expect("pulled");
    // The Pulled events wait for the size (its client asks for none here:
    // imaged looks it up once the wait for an offer ends).
    let (mut events, mut phases) = (Vec::new(), Vec::new());
    for _ in 0..100 {
        let (e, p) = told.send(TakeTold).await.expect("told");
        events.extend(e);
        phases.extend(p);
        if events.iter().filter(|e| e.reason == EventReason::Pulled).count() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let of = |name: &str, reason: EventReason| {
        events
            .iter()
            .find(|e| e.reason == reason && e.object.pod_name == name)
            .unwrap_or_else(|| panic!("no {reason} event for {name}: {events:#?}"))
    };
    for name in ["web-0", "worker-0"] {
        let pulling = of(name, EventReason::Pulling);
        assert_eq!(
            (pulling.object.namespace.as_str(), pulling.object.pod_uid.as_str(), pulling.image.as_str()),
            ("shop", format!("uid-{name}").as_str(), image)
        );
        let pulled = of(name, EventReason::Pulled);
        assert!(pulled.message.starts_with("Successfully pulled image"), "{}", pulled.message);
    }
    let phase_pod = |phase: PullPhase| phases.iter().find(|p| p.phase == phase).and_then(|p| p.pod.clone());
    assert_eq!(phase_pod(PullPhase::Queued), Some(pod_of("web-0")));
    assert_eq!(phase_pod(PullPhase::WaitingOnSharedPull), Some(pod_of("worker-0")));
    assert_eq!(phase_pod(PullPhase::Pulling), Some(pod_of("web-0")), "the pull's phases name the pod that started it");
    assert_eq!(phase_pod(PullPhase::Done), Some(pod_of("web-0")));
    let everything = format!("{events:?}{phases:?}{:?}", f.node.list_pulls().await);
    assert!(!everything.contains("s3cret-pw"), "credentials never appear: {everything}");
}

#[actix::test]
async fn a_pull_is_listed_and_statused_at_once_and_gone_at_once_after_a_remove() {
    let f = Front::start("").await;
    let mut c = f.client.clone();
    let image_ref = c.pull_image(pull("docker.io/library/busybox:1.36")).await.expect("pulled").into_inner().image_ref;
    let img = f.status("docker.io/library/busybox:1.36").await.expect("present after the pull");
    assert_eq!(img.id, image_ref, "PullImageResponse.image_ref is the image's id");
    assert!(img.size > 0, "the size is kept (the kubelet takes 0 as an inspect error)");
    let list = c.list_images(pb::ListImagesRequest::default()).await.expect("list").into_inner().images;
    assert!(list.iter().any(|i| i.id == image_ref), "{list:?}");
    c.remove_image(pb::RemoveImageRequest { image: Some(spec(&image_ref)) }).await.expect("removed");
    assert_eq!(f.status("docker.io/library/busybox:1.36").await, None, "absent at once after the remove");
    let fs = c.image_fs_info(pb::ImageFsInfoRequest {}).await.expect("fs info").into_inner();
    assert!(!fs.image_filesystems.is_empty());
}

#[actix::test]
async fn fifty_identical_pulls_are_one_runtime_pull() {
    let f = Front::start("").await;
    let calls: Vec<_> = (0..50)
        .map(|_| {
            let mut c = f.client.clone();
            tokio::spawn(async move {
                c.pull_image(pull("docker.io/library/nginx:1.27")).await.map(tonic::Response::into_inner)
            })
        })
        .collect();
    let mut refs = Vec::new();
    for c in calls {
        refs.push(c.await.expect("task").expect("pulled").image_ref);
    }
    refs.dedup();
    assert_eq!(refs.len(), 1, "{refs:?}");
    assert_eq!(f.runtime_pulls(), 1, "50 identical PullImage calls share one runtime pull");
}

#[actix::test]
async fn each_credential_is_its_own_pull_and_a_wrong_one_fails_only_its_call() {
    let f = Front::start("").await;
    let image = "registry.example.com/team/app:v1";
    let with = |password: &str| pb::PullImageRequest {
        auth: Some(pb::AuthConfig { username: "team".into(), password: password.into(), ..Default::default() }),
        ..pull(image)
    };
    let (mut a, mut b) = (f.client.clone(), f.client.clone());
    let (wrong, right) = tokio::join!(a.pull_image(with("nope")), b.pull_image(with("team-password")));
    let wrong = wrong.expect_err("the wrong password fails");
    assert_ne!(wrong.code(), Code::Ok);
    assert!(!wrong.message().contains("nope"), "the credential is never shown: {}", wrong.message());
    right.expect("the right password pulls");
    assert_eq!(f.runtime_pulls(), 2, "different credentials never share a pull");
}

#[actix::test]
async fn the_runtimes_error_reaches_the_client_with_its_code() {
    let f = Front::start("").await;
    let through = f.client.clone().pull_image(pull("docker.io/library/nope:1")).await.expect_err("not in the registry");
    let rt = f.node.runtime().embedded.as_ref().expect("embedded").endpoint();
    let direct = ImageServiceClient::new(rt.channel(Duration::from_secs(5)).expect("channel"))
        .pull_image(pull("docker.io/library/nope:1"))
        .await
        .expect_err("not in the registry");
    assert_eq!((through.code(), through.message()), (direct.code(), direct.message()));
}

#[actix::test]
async fn the_sandbox_image_and_pinned_patterns_are_reported_pinned() {
    let f = Front::start("[gc]\npinned_images = [\"docker.io/library/redis:*\"]").await;
    let mut c = f.client.clone();
    for image in ["registry.k8s.io/pause:3.10", "docker.io/library/redis:7", "docker.io/library/busybox:1.36"] {
        c.pull_image(pull(image)).await.expect("pulled");
    }
    let list = c.list_images(pb::ListImagesRequest::default()).await.expect("list").into_inner().images;
    let pinned = |tag: &str| list.iter().find(|i| i.repo_tags.iter().any(|t| t == tag)).map(|i| i.pinned);
    assert_eq!(pinned("registry.k8s.io/pause:3.10"), Some(true));
    assert_eq!(pinned("docker.io/library/redis:7"), Some(true));
    assert_eq!(pinned("docker.io/library/busybox:1.36"), Some(false));
    assert_eq!(f.status("registry.k8s.io/pause:3.10").await.map(|i| i.pinned), Some(true));

    let off = Front::start("[cri_server]\npin_sandbox_image = false").await;
    off.client.clone().pull_image(pull("registry.k8s.io/pause:3.10")).await.expect("pulled");
    assert_eq!(off.status("registry.k8s.io/pause:3.10").await.map(|i| i.pinned), Some(false));
}

#[actix::test]
async fn pinned_images_changed_by_a_reload_reach_the_next_calls() {
    let f = Front::start("[gc]\npinned_images = [\"docker.io/library/redis:*\"]").await;
    let mut c = f.client.clone();
    for image in ["docker.io/library/redis:7", "docker.io/library/busybox:1.36"] {
        c.pull_image(pull(image)).await.expect("pulled");
    }
    let pinned = |f: &Front| {
        let mut c = f.client.clone();
        async move {
            let list = c.list_images(pb::ListImagesRequest::default()).await.expect("list").into_inner().images;
            let of = |tag: &str| list.iter().find(|i| i.repo_tags.iter().any(|t| t == tag)).map(|i| i.pinned);
            (of("docker.io/library/redis:7"), of("docker.io/library/busybox:1.36"))
        }
    };
    assert_eq!(pinned(&f).await, (Some(true), Some(false)));
    assert_eq!(f.status("docker.io/library/busybox:1.36").await.map(|i| i.pinned), Some(false));

    // What a SIGHUP reload applies.
    let reloaded = imaged::config::GcSettings {
        pinned_images: vec!["docker.io/library/busybox:*".into()],
        ..f.node.gc_settings()
    };
    assert!(f.node.update_gc_policy(&reloaded));
    let mut now = pinned(&f).await;
    for _ in 0..100 {
        if now == (Some(false), Some(true)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        now = pinned(&f).await;
    }
    assert_eq!(now, (Some(false), Some(true)), "the reloaded pins, not the start's");
    assert_eq!(f.status("docker.io/library/busybox:1.36").await.map(|i| i.pinned), Some(true), "ImageStatus too");
}

#[actix::test]
async fn a_callers_deadline_ends_its_wait_but_not_the_shared_pull() {
    let f = Front::start("").await;
    // The deadline as it travels (grpc-timeout). imaged answers a little
    // before it (DEADLINE_MARGIN), so the caller gets DeadlineExceeded,
    // not tonic's server-side Cancelled "Timeout expired".
    let mut req = tonic::Request::new(pull("docker.io/library/nginx:1.27"));
    req.metadata_mut().insert("grpc-timeout", "100m".parse().expect("header"));
    let started = std::time::Instant::now();
    let err = f.client.clone().pull_image(req).await.expect_err("nginx takes 400 ms");
    // On a loaded machine imaged's answer can be woken after tonic's own
    // timer, which ends the call as Cancelled "Timeout expired": either
    // way the deadline ended it (a grpc client sees its own deadline).
    let by_imaged = err.code() == Code::DeadlineExceeded && err.message().contains("deadline");
    let by_tonic = err.code() == Code::Cancelled && err.message() == "Timeout expired";
    assert!(by_imaged || by_tonic, "{err:?}");
    assert!(started.elapsed() < Duration::from_millis(300), "ends at the caller's deadline: {:?}", started.elapsed());
    // The pull went on: a later call finds it done (or joins it), and the
    // runtime pulled once.
    f.client.clone().pull_image(pull("docker.io/library/nginx:1.27")).await.expect("pulled");
    assert_eq!(f.runtime_pulls(), 1);
}

#[actix::test]
async fn methods_imaged_does_not_serve_answer_unimplemented() {
    let f = Front::start("").await;
    // StreamImages is served (see tests/stream_images.rs); a method CRI may add later is not.
    for path in ["/runtime.v1.ImageService/StreamImageFsInfo", "/runtime.v1.RuntimeService/Version"] {
        let mut grpc = tonic::client::Grpc::new(f.channel.clone());
        grpc.ready().await.expect("ready");
        let err = grpc
            .unary(
                tonic::Request::new(prost::bytes::Bytes::new()),
                path.parse().expect("path"),
                imaged::cri::wire::BytesCodec,
            )
            .await
            .expect_err("not served");
        assert_eq!(err.code(), Code::Unimplemented, "{path}: {err:?}");
    }
}

#[actix::test]
async fn an_empty_image_is_refused_with_invalid_argument() {
    let f = Front::start("").await;
    let err = f.client.clone().pull_image(pull("")).await.expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(f.runtime_pulls(), 0);
}

#[actix::test]
async fn an_image_name_over_4096_bytes_is_refused_before_any_event_or_pull() {
    let f = Front::start("").await;
    use actix::Actor as _;
    let events = imaged::testing::EventLog::default().start();
    f.node.manager().events().subscribe(events.clone().recipient());
    let long = format!("docker.io/library/{}:1", "a".repeat(5000));
    let err = f.client.clone().pull_image(pull(&long)).await.expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(err.message(), "PullImageRequest.image.image is longer than 4096 bytes");
    let err = f.client.clone().remove_image(remove(&long)).await.expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(err.message(), "RemoveImageRequest.image.image is longer than 4096 bytes");
    assert_eq!(f.runtime_pulls(), 0);
    let told = events.send(imaged::testing::TakeEvents).await.expect("log");
    assert!(told.is_empty(), "no event carries the name: {} events", told.len());
    // A name at the limit is a name like any other (this one is not in the registry).
    let at_limit = format!("docker.io/library/{}:1", "a".repeat(4096 - "docker.io/library/:1".len()));
    assert_eq!(at_limit.len(), 4096);
    let err = f.client.clone().pull_image(pull(&at_limit)).await.expect_err("not found");
    assert_ne!(err.code(), Code::InvalidArgument, "{err:?}");
}

#[actix::test]
async fn a_pull_request_that_does_not_decode_is_refused_naming_its_message() {
    let f = Front::start("").await;
    let mut grpc = tonic::client::Grpc::new(f.channel.clone());
    grpc.ready().await.expect("ready");
    // Field 1 (image) as a length-delimited value that runs past the end.
    let err = grpc
        .unary(
            tonic::Request::new(prost::bytes::Bytes::from_static(&[0x0a, 0x7f, 0x01])),
            "/runtime.v1.ImageService/PullImage".parse().expect("path"),
            imaged::cri::wire::BytesCodec,
        )
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("PullImageRequest: "), "{err:?}");
    assert!(err.message().len() > "PullImageRequest: ".len(), "prost's reason follows: {err:?}");
    assert_eq!(f.runtime_pulls(), 0);
}

#[actix::test]
async fn the_first_fs_info_waits_for_a_runtime_not_answering_yet_and_later_ones_do_not() {
    use imaged::actors::cri_gateway::{CriGatewayActor, CriSettings};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut runtime = imaged::embedded::EmbeddedRuntime::start_in(dir.path()).expect("runtime");
    let (gateway, version) = CriGatewayActor::connect(&runtime.endpoint(), &CriSettings::default()).await.expect("gw");
    let connected =
        imaged::connect::ConnectedRuntime { gateway, version, endpoint: runtime.endpoint(), embedded: None };
    let node = Node::start_on(Config::defaults().expect("config"), connected).await.expect("node");
    let path = dir.path().join("front.sock");
    let socket = ApiSocket::bind_at("CRI socket", &path, None).await.expect("binds");
    let front = CriFront::over(&node, &node.config().cri_server).await.expect("front");
    actix::spawn(imaged::cri_front::serve(socket, front, std::future::pending()));
    let client = ImageServiceClient::new(CriEndpoint::Unix(path).channel(Duration::from_secs(5)).expect("channel"));

    runtime.stop();
    let mut first = client.clone();
    let call = tokio::spawn(async move { first.image_fs_info(pb::ImageFsInfoRequest {}).await });
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!call.is_finished(), "the kubelet's first ImageFsInfo waits for the runtime");
    runtime.resume().expect("resumes");
    let fs = call.await.expect("task").expect("answered once the runtime is back").into_inner();
    assert!(!fs.image_filesystems.is_empty());

    runtime.stop();
    let err = client.clone().image_fs_info(pb::ImageFsInfoRequest {}).await.expect_err("runtime down");
    assert_eq!(err.code(), Code::Unavailable, "later calls fail at once: {err:?}");
}

#[actix::test]
async fn a_pull_once_the_node_stops_accepting_is_refused_unavailable_and_reads_still_answer() {
    let f = Front::start("").await;
    let mut client = f.client.clone();
    client.pull_image(pull("docker.io/library/busybox:1.36")).await.expect("pulls while accepting");

    f.node.stop_accepting();
    let err = client.pull_image(pull("docker.io/library/nginx:1.25")).await.expect_err("refused while draining");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(err.message(), "imaged is shutting down");
    assert_eq!(f.runtime_pulls(), 1, "the refused pull never reached the runtime");
    assert_eq!(f.status("docker.io/library/nginx:1.25").await, None, "reads are still forwarded");
    assert!(f.status("docker.io/library/busybox:1.36").await.is_some());
}

fn remove(image: &str) -> pb::RemoveImageRequest {
    pb::RemoveImageRequest { image: Some(spec(image)) }
}

#[actix::test]
async fn five_concurrent_removes_of_one_image_all_succeed() {
    let f = Front::start("").await;
    let image_ref = f
        .client
        .clone()
        .pull_image(pull("docker.io/library/busybox:1.36"))
        .await
        .expect("pulled")
        .into_inner()
        .image_ref;
    let calls: Vec<_> = (0..5)
        .map(|i| {
            let mut c = f.client.clone();
            // By tag and by id, as the kubelet's GC and an operator would.
            let target = if i % 2 == 0 { image_ref.clone() } else { "docker.io/library/busybox:1.36".to_string() };
            tokio::spawn(async move { c.remove_image(remove(&target)).await })
        })
        .collect();
    for c in calls {
        c.await.expect("task").expect("every remove succeeds (absent is success)");
    }
    assert_eq!(f.status("docker.io/library/busybox:1.36").await, None);
}

#[actix::test]
async fn with_refuse_remove_pinned_a_pinned_image_is_refused_naming_it_and_others_go() {
    let toml = "[gc]\npinned_images = [\"docker.io/library/redis:*\"]\n[cri_server]\nrefuse_remove_pinned = true";
    let f = Front::start(toml).await;
    let mut c = f.client.clone();
    let mut ids = std::collections::HashMap::new();
    for image in ["registry.k8s.io/pause:3.10", "docker.io/library/redis:7", "docker.io/library/busybox:1.36"] {
        ids.insert(image, c.pull_image(pull(image)).await.expect("pulled").into_inner().image_ref);
    }
    // By tag (a pattern pin) and by id (the sandbox image): RemoveImage
    // names no tags, so the front resolves them first.
    for (target, named) in [
        ("docker.io/library/redis:7".to_string(), "docker.io/library/redis:7"),
        (ids["registry.k8s.io/pause:3.10"].clone(), "registry.k8s.io/pause:3.10"),
    ] {
        let err = c.remove_image(remove(&target)).await.expect_err("pinned: refused");
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(err.message().contains(&target) && err.message().contains(named), "names the image: {}", err.message());
        assert!(err.message().contains("refuse_remove_pinned"), "says why: {}", err.message());
        assert!(f.status(named).await.is_some(), "{named} is kept");
    }
    c.remove_image(remove("docker.io/library/busybox:1.36")).await.expect("not pinned: removed");
    assert_eq!(f.status("docker.io/library/busybox:1.36").await, None);
    c.remove_image(remove("docker.io/library/nope:1")).await.expect("absent: success, as the runtime says");

    // Off (the default): forwarded, as containerd removes pinned images too.
    let off = Front::start("[gc]\npinned_images = [\"docker.io/library/redis:*\"]").await;
    let mut c = off.client.clone();
    c.pull_image(pull("docker.io/library/redis:7")).await.expect("pulled");
    c.remove_image(remove("docker.io/library/redis:7")).await.expect("removed");
    assert_eq!(off.status("docker.io/library/redis:7").await, None);
}

#[actix::test]
async fn a_forwarded_remove_takes_the_image_out_of_imageds_records_and_image_list() {
    use imaged::actors::cache_refresher::RefreshImageList;
    let f = Front::start("").await;
    let image = "docker.io/library/busybox:1.36";
    let image_ref = f.client.clone().pull_image(pull(image)).await.expect("pulled").into_inner().image_ref;
    let records = f.node.manager().pull_records();
    let creds = imaged::domain::pull_record::ImagePullCredentials::node_accessible();
    records.record_image_pulled(image, &image_ref, &creds).await.expect("recorded");
    f.node.gc().refresher.send(RefreshImageList).await.expect("refresher").expect("listed");
    let listed = |f: &Front| f.node.image_list().snapshot().images().iter().any(|i| i.id == image_ref);
    assert!(records.record(&image_ref).is_some() && listed(&f));
    tokio::time::sleep(Duration::from_millis(5)).await;

    f.client.clone().remove_image(remove(image)).await.expect("removed");
    assert!(records.record(&image_ref).is_none(), "the pulled record follows the remove");
    for _ in 0..100 {
        if !listed(&f) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!listed(&f), "the node's image list drops it without waiting for a refresh");
}

#[actix::test]
async fn a_name_pulled_again_after_the_kubelet_removed_its_image_starts_without_a_synced_write() {
    // The kubelet's GC removes an image through the front, and a pod asks
    // for it again: its name's intent stayed on disk past the removal
    // (credentials.md, "Kept intents"), so the pull does not wait for one.
    let state = tempfile::tempdir().expect("tempdir");
    let f = Front::start(&format!("[state]\ndir = \"{}\"", state.path().display())).await;
    let image = "docker.io/library/busybox:1.36";
    let records = f.node.manager().pull_records();
    let writes = || {
        let text = f.node.config().pull.metrics.encode();
        let name = "imaged_store_write_duration_seconds_count{table=\"pull_records\"}";
        text.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or(0.0)
    };
    let mut c = f.client.clone();
    let first = writes();
    let image_ref = c.pull_image(pull(image)).await.expect("pulled").into_inner().image_ref;
    assert_eq!(writes() - first, 1.0, "the name's first pull writes its intent, synced");
    records.written().await;
    assert!(records.record(&image_ref).is_some());
    c.remove_image(remove(image)).await.expect("removed");
    assert!(records.record(&image_ref).is_none(), "the record follows the remove");
    assert_eq!(records.kept_intents().len(), 1, "the name's intent stays");
    let before = writes();
    c.pull_image(pull(image)).await.expect("pulled again");
    assert_eq!(writes(), before, "no synced write for the pull of a name whose intent is on disk");
    records.written().await;
    assert!(records.record(&image_ref).is_some(), "its record is written again");
}

#[actix::test]
async fn a_full_serial_queue_parks_the_kubelets_pulls_and_never_refuses_them() {
    // The queue holds 10 waiting pulls (the kubelet's channel); more park
    // in arrival order with no bound, as the kubelet's own serial queue
    // blocks its callers. So the front never answers ResourceExhausted for
    // a full queue: the kubelet would only retry later with back-off.
    let f = Front::start("[pull]\nregistry_pull_qps = 0").await;
    f.add("example.com/slow:1", 300);
    for i in 0..12 {
        f.add(&format!("example.com/q{i}:1"), 5);
    }
    let mut calls = vec![f.spawn_pull(pull("example.com/slow:1"))];
    f.until_queue_holds(1).await;
    for i in 0..12 {
        calls.push(f.spawn_pull(pull(&format!("example.com/q{i}:1"))));
        f.until_queue_holds(i + 2).await;
    }
    let status = f.node.queue().send(imaged::actors::pull_queue::GetQueueStatus).await.expect("status");
    assert_eq!((status.running, status.queued, status.parked), (1, 10, 2), "{status:?}");
    for c in calls {
        c.await.expect("task").expect("every parked call is answered once room frees");
    }
    assert_eq!(f.runtime_pulls(), 13);
}

#[actix::test]
async fn a_transient_failure_is_retried_inside_the_kubelets_pull() {
    use imaged::cri::{CriError, StatusCode};
    use imaged::fault::{FaultPlan, FaultRule};
    let f = Front::start("[pull]\ntransient_retries = 2\ntransient_retry_delay = \"20ms\"").await;
    let reset = CriError::from_status(StatusCode::Unknown, "failed to pull and unpack image: connection reset by peer");
    f.embedded().set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).times(1).fail(reset)));
    let mut c = f.client.clone();
    let got = c.pull_image(pull("docker.io/library/busybox:1.36")).await.expect("the retry pulled it");
    assert!(got.into_inner().image_ref.starts_with("sha256:"));
    assert_eq!(f.runtime_pulls(), 2, "one failed call, one retry");
    // A permanent failure reaches the kubelet at once.
    let missing = CriError::from_status(StatusCode::NotFound, "docker.io/library/nope:1: not found");
    f.embedded().set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).fail(missing)));
    let err = c.pull_image(pull("docker.io/library/redis:7")).await.expect_err("not found");
    assert!(err.message().contains("not found"), "{err:?}");
    assert_eq!(f.runtime_pulls(), 3, "not retried");
}

#[actix::test]
async fn in_a_registry_outage_a_configured_pull_falls_back_to_the_local_image_or_says_registry_unavailable() {
    use actix::Actor;
    use imaged::cri::{CriError, CriErrorKind};
    use imaged::events::{EventReason, EventType};
    use imaged::fault::{FaultPlan, FaultRule};
    let toml = "[cri_server]\nlocal_fallback_images = [\"docker.io/library/busybox:*\"]\nlocal_fallback_namespaces = [\"edge\"]";
    let f = Front::start(toml).await;
    let told = Told::default().start();
    f.node.subscribe_events(told.clone().recipient());
    let mut c = f.client.clone();
    let busybox = c.pull_image(pull("docker.io/library/busybox:1.36")).await.expect("pulled").into_inner().image_ref;
    c.pull_image(pull("docker.io/library/redis:7")).await.expect("pulled");
    let outage = CriError::new(CriErrorKind::RegistryUnavailable, "dial tcp 10.0.0.1:443: i/o timeout");
    f.embedded().set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).fail(outage)));

    // A pattern's image on the node: its id, and a Warning event.
    let got = c
        .pull_image(pull_for("docker.io/library/busybox:1.36", pod("shop", "web-0", &[])))
        .await
        .expect("falls back")
        .into_inner()
        .image_ref;
    assert_eq!(got, busybox);
    // A configured namespace's pod, no local image: RegistryUnavailable, code Unknown.
    let err = c
        .pull_image(pull_for("docker.io/library/nginx:1.27", pod("edge", "cam-0", &[])))
        .await
        .expect_err("nothing to fall back to");
    assert_eq!(err.code(), Code::Unknown, "{err:?}");
    assert!(err.message().starts_with("RegistryUnavailable"), "{}", err.message());
    // Not configured: the runtime's error, although the image is on the node.
    let err = c
        .pull_image(pull_for("docker.io/library/redis:7", pod("shop", "cache-0", &[])))
        .await
        .expect_err("no fallback for this pull");
    assert!(err.message().contains("i/o timeout"), "{err:?}");

    tokio::time::sleep(Duration::from_millis(50)).await;
    let (events, _) = told.send(TakeTold).await.expect("told");
    let fell_back = events
        .iter()
        .find(|e| e.object.pod_name == "web-0" && e.reason == EventReason::Pulled)
        .expect("an event for the fallback");
    assert_eq!(fell_back.event_type, EventType::Warning);
    assert!(fell_back.message.contains("the local image is used"), "{}", fell_back.message);
    assert!(
        events.iter().any(|e| e.object.pod_name == "cam-0" && e.reason == EventReason::Failed),
        "the refusal is told: {events:#?}"
    );
}

/// A front with `image` to pull, and what its node's events tell.
async fn front_telling(image: &str) -> (Front, actix::Addr<Told>) {
    use actix::Actor;
    let f = Front::start("").await;
    let told = Told::default().start();
    f.node.subscribe_events(told.clone().recipient());
    f.add(image, 0);
    (f, told)
}

/// The message of the first `Pulled` event `told` gets within 5 s.
async fn pulled_message(told: &actix::Addr<Told>) -> Option<String> {
    for _ in 0..250 {
        let (events, _) = told.send(TakeTold).await.expect("told");
        if let Some(e) = events.into_iter().find(|e| e.reason == imaged::events::EventReason::Pulled) {
            return Some(e.message);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[actix::test]
async fn a_pull_is_answered_before_imageds_size_lookup_ends_and_its_event_waits_for_the_size() {
    use imaged::fault::{FaultPlan, FaultRule};
    let image = "example.com/team/app:1";
    let (f, told) = front_telling(image).await;
    // imaged's size lookup asks by the image's id; the caller's name-based
    // calls are not held back.
    let lookup = Duration::from_secs(2);
    f.embedded()
        .set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::ImageStatus).image("sha256:*").delay(lookup)));
    let pulled_at = tokio::time::Instant::now();
    f.client.clone().pull_image(pull_for(image, pod("shop", "web-0", &[]))).await.expect("pulled");
    let (events, _) = told.send(TakeTold).await.expect("told");
    assert!(
        !events.iter().any(|e| e.reason == imaged::events::EventReason::Pulled),
        "answered while the size lookup runs: {events:#?}"
    );
    assert!(pulled_at.elapsed() < lookup, "the answer did not wait for the lookup");
    let message = pulled_message(&told).await.expect("the Pulled event follows the lookup");
    assert!(message.starts_with(&format!("Successfully pulled image \"{image}\" in ")), "{message}");
    assert!(message.ends_with("Image size: 100 bytes."), "the event carries the size looked up: {message}");
    assert!(pulled_at.elapsed() >= lookup, "the event waited for the lookup");
}

#[actix::test]
async fn the_kubelets_own_size_lookup_gives_imageds_event_its_size_with_no_call_of_imageds() {
    let image = "example.com/team/app:1";
    let (f, told) = front_telling(image).await;
    let statuses = || f.embedded().stats().calls(Rpc::ImageStatus);
    // The node's own start-up calls settle first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = statuses();
    // As the kubelet pulls: PullImage, then ImageStatus of the id for the size.
    let mut c = f.client.clone();
    let id = c.pull_image(pull_for(image, pod("shop", "web-0", &[]))).await.expect("pulled").into_inner().image_ref;
    let size = f.status(&id).await.expect("present").size;
    let message = pulled_message(&told).await.expect("a Pulled event");
    assert!(message.ends_with(&format!("Image size: {size} bytes.")), "{message}");
    // Past the wait for an offer: imaged never looked the size up itself.
    tokio::time::sleep(imaged::actors::pull_queue::OFFER_WAIT + Duration::from_millis(200)).await;
    assert_eq!(statuses() - before, 1, "the runtime answered only the client's own ImageStatus");
}

/// A runtime that records the bytes it gets and answers with a field
/// imaged's proto does not know (number 77): what a newer runtime would do.
#[derive(Default)]
struct RecordingRuntime {
    got: std::sync::Mutex<Vec<(Rpc, prost::bytes::Bytes)>>,
}

/// Field 77, a string: "rt".
const RUNTIME_EXTRA: [u8; 5] = [0xea, 0x04, 2, b'r', b't'];
/// Field 99, a string: "new".
const CLIENT_EXTRA: [u8; 6] = [0x9a, 0x06, 3, b'n', b'e', b'w'];

impl imaged::cri::server::ImageFront for RecordingRuntime {
    fn forward(
        &self,
        rpc: Rpc,
        body: prost::bytes::Bytes,
        _: Option<Duration>,
    ) -> imaged::cri::server::FrontFuture<prost::bytes::Bytes> {
        use prost::Message as _;
        self.got.lock().unwrap().push((rpc, body));
        let mut answer = match rpc {
            Rpc::ImageStatus => pb::ImageStatusResponse {
                image: Some(pb::Image { id: "sha256:abc".into(), size: 7, ..Default::default() }),
                info: Default::default(),
            }
            .encode_to_vec(),
            _ => Vec::new(),
        };
        answer.extend_from_slice(&RUNTIME_EXTRA);
        Box::pin(async move { Ok(answer.into()) })
    }

    fn pull(&self, call: imaged::cri::server::PullCall) -> imaged::cri::server::FrontFuture<prost::bytes::Bytes> {
        use prost::Message as _;
        self.got.lock().unwrap().push((Rpc::PullImage, call.wire));
        let mut answer = pb::PullImageResponse { image_ref: "sha256:abc".into() }.encode_to_vec();
        answer.extend_from_slice(&RUNTIME_EXTRA);
        Box::pin(async move { Ok(answer.into()) })
    }

    fn pins(&self, _: &str, _: &[String], _: &[String]) -> bool {
        false
    }
}

/// imaged's front (gateway with `faults`, queue, front) on `<dir>/cri.sock`
/// over a [`RecordingRuntime`] on a socket of its own; the runtime and the
/// front's socket path.
async fn front_over_recorder(
    dir: &std::path::Path,
    faults: imaged::fault::FaultPlan,
) -> (Arc<RecordingRuntime>, std::path::PathBuf) {
    use imaged::actors::cri_gateway::{CriGatewayActor, CriSettings, GetReader};
    use imaged::actors::pull_queue::PullQueueActor;
    let runtime = Arc::new(RecordingRuntime::default());
    let rt_path = dir.join("runtime.sock");
    let listener = tokio::net::UnixListener::bind(&rt_path).expect("bind");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(imaged::cri::server::ImageServiceServer::new(runtime.clone()))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let client = imaged::cri::CriClient::new(&CriEndpoint::Unix(rt_path), Duration::from_secs(5)).expect("client");
    let gateway = actix::Actor::start(CriGatewayActor::new(client, &CriSettings::default()).with_faults(faults));
    let reader = gateway.send(GetReader).await.expect("reader");
    let cfg = Config::defaults().expect("config");
    let queue = actix::Actor::start(PullQueueActor::new(cfg.pull.clone(), reader.clone()));
    let front = CriFront::new(reader, queue.recipient(), imaged::cri_front::Pins::default(), &cfg.cri_server);
    let path = dir.join("cri.sock");
    let socket = ApiSocket::bind_at("CRI socket", &path, None).await.expect("binds");
    actix::spawn(imaged::cri_front::serve(socket, front, std::future::pending()));
    (runtime, path)
}

#[actix::test]
async fn fields_imaged_does_not_know_pass_both_ways_on_every_call_pull_included() {
    use prost::Message as _;
    let dir = tempfile::tempdir().expect("tempdir");
    // The runtime: a recorder on its own socket; imaged: gateway, queue, front.
    let (runtime, path) = front_over_recorder(dir.path(), imaged::fault::FaultPlan::default()).await;
    let channel = CriEndpoint::Unix(path).channel(Duration::from_secs(5)).expect("channel");

    let call = |rpc: &'static str, body: Vec<u8>| {
        let channel = channel.clone();
        async move {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.expect("ready");
            let path = format!("/runtime.v1.ImageService/{rpc}").parse().expect("path");
            let req = tonic::Request::new(prost::bytes::Bytes::from(body));
            grpc.unary(req, path, imaged::cri::wire::BytesCodec).await.expect(rpc).into_inner()
        }
    };
    let auth = pb::AuthConfig {
        username: "u".into(),
        password: "p".into(),
        server_address: "127.0.0.1:5000".into(),
        ..Default::default()
    };
    let spec = pb::ImageSpec { image: "127.0.0.1:5000/app:1".into(), ..Default::default() };
    let mut pull =
        pb::PullImageRequest { image: Some(spec.clone()), auth: Some(auth), sandbox_config: None }.encode_to_vec();
    pull.extend_from_slice(&CLIENT_EXTRA);
    let answer = call("PullImage", pull).await;
    assert!(answer.ends_with(&RUNTIME_EXTRA), "the runtime's field reaches the client: {answer:?}");
    assert_eq!(pb::PullImageResponse::decode(answer).expect("decodes").image_ref, "sha256:abc");

    let mut status = pb::ImageStatusRequest { image: Some(spec), verbose: false }.encode_to_vec();
    status.extend_from_slice(&CLIENT_EXTRA);
    let answer = call("ImageStatus", status).await;
    assert!(answer.ends_with(&RUNTIME_EXTRA), "{answer:?}");

    let got = runtime.got.lock().unwrap().clone();
    let (_, pulled) = got.iter().find(|(rpc, _)| *rpc == Rpc::PullImage).expect("the runtime pulled");
    assert!(pulled.windows(CLIENT_EXTRA.len()).any(|w| w == CLIENT_EXTRA), "the client's field reaches the runtime");
    let read = pb::PullImageRequest::decode(pulled.clone()).expect("decodes");
    let server = read.auth.map(|a| a.server_address);
    assert_eq!(
        server.as_deref(),
        Some("https://127.0.0.1:5000"),
        "a bare server address gets the scheme containerd needs"
    );
    let statuses: Vec<_> = got.iter().filter(|(rpc, _)| *rpc == Rpc::ImageStatus).collect();
    assert!(
        statuses.iter().any(|(_, b)| b.ends_with(&CLIENT_EXTRA)),
        "the client's ImageStatus reaches the runtime as sent"
    );
}

#[actix::test]
async fn a_fault_plan_image_rule_matches_the_reads_the_front_forwards() {
    use imaged::cri::{CriError, CriErrorKind};
    use imaged::fault::{FaultPlan, FaultRule};
    use prost::Message as _;
    let dir = tempfile::tempdir().expect("tempdir");
    // Rules naming an image, for each read the front forwards.
    let injected = |what: &str| CriError::new(CriErrorKind::NotFound, format!("injected {what}"));
    let plan = FaultPlan::new(1)
        .rule(FaultRule::on(Rpc::ImageStatus).image("*/app:bad").fail(injected("status")))
        .rule(FaultRule::on(Rpc::ListImages).image("*/app:bad").fail(injected("list")));
    let (runtime, path) = front_over_recorder(dir.path(), plan).await;
    let mut c = ImageServiceClient::new(CriEndpoint::Unix(path).channel(Duration::from_secs(5)).expect("channel"));
    let spec = |image: &str| Some(pb::ImageSpec { image: image.into(), ..Default::default() });

    let err = c
        .image_status(pb::ImageStatusRequest { image: spec("127.0.0.1:5000/app:bad"), verbose: false })
        .await
        .expect_err("the rule's image");
    assert_eq!((err.code(), err.message()), (Code::NotFound, "injected status"), "{err:?}");
    let err = c
        .list_images(pb::ListImagesRequest { filter: Some(pb::ImageFilter { image: spec("127.0.0.1:5000/app:bad") }) })
        .await
        .expect_err("the rule's image");
    assert_eq!((err.code(), err.message()), (Code::NotFound, "injected list"), "{err:?}");
    assert!(runtime.got.lock().unwrap().is_empty(), "a call a rule answers does not reach the runtime");

    // Another image, or a list with no filter, passes to the runtime.
    let found = c
        .image_status(pb::ImageStatusRequest { image: spec("127.0.0.1:5000/app:good"), verbose: false })
        .await
        .expect("another image passes")
        .into_inner();
    assert_eq!(found.image.map(|i| i.id).as_deref(), Some("sha256:abc"));
    c.list_images(pb::ListImagesRequest { filter: None }).await.expect("no image named: no image rule matches");
    let got: Vec<_> = runtime.got.lock().unwrap().iter().map(|(rpc, _)| *rpc).collect();
    assert_eq!(got, [Rpc::ImageStatus, Rpc::ListImages]);
    let (_, asked) = runtime.got.lock().unwrap()[0].clone();
    let asked = pb::ImageStatusRequest::decode(asked).expect("decodes");
    assert_eq!(asked.image.map(|s| s.image).as_deref(), Some("127.0.0.1:5000/app:good"));
}

/// No periodic work of imaged's own: every runtime call a test counts is its own.
const QUIET: &str =
    "[gc]\ndetect_period = \"1h\"\ngc_period = \"1h\"\ncache_refresh_period = \"1h\"\nsandbox_image = \"\"\n";

impl Front {
    /// Waits (bounded) until the start's own runtime calls are over.
    async fn settled(&self) {
        let total = || self.embedded().stats().calls.iter().map(|(_, n)| n).sum::<u64>();
        let mut last = total();
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = total();
            if now == last {
                return;
            }
            last = now;
        }
        panic!("the runtime never went quiet");
    }
}

#[actix::test]
async fn image_status_and_list_answers_are_served_again_until_a_change_or_their_ttl() {
    let f = Front::start(&format!("{QUIET}[cri_server]\nread_cache_ttl = \"300ms\"")).await;
    f.settled().await;
    let calls = |rpc| f.embedded().stats().calls(rpc);
    f.add("example.com/x:1", 5);
    let list = || {
        let mut c = f.client.clone();
        async move { c.list_images(pb::ListImagesRequest::default()).await.expect("list").into_inner().images }
    };

    // The same question twice: the runtime answers once.
    let before = calls(Rpc::ImageStatus);
    assert!(f.status("example.com/x:1").await.is_none());
    assert!(f.status("example.com/x:1").await.is_none());
    assert_eq!(calls(Rpc::ImageStatus) - before, 1, "the second answer was the first's");
    let listed = calls(Rpc::ListImages);
    let n = list().await.len();
    assert_eq!(list().await.len(), n);
    assert_eq!(calls(Rpc::ListImages) - listed, 1);

    // A pull through imaged ends every kept answer at once: present, listed.
    f.client.clone().pull_image(pull("example.com/x:1")).await.expect("pull");
    assert!(f.status("example.com/x:1").await.is_some(), "statused at once after the pull");
    assert_eq!(list().await.len(), n + 1, "listed at once after the pull");
    // And a remove: gone at once.
    let req = pb::RemoveImageRequest { image: Some(spec("example.com/x:1")) };
    f.client.clone().remove_image(req).await.expect("remove");
    assert!(f.status("example.com/x:1").await.is_none(), "gone at once after the remove");
    assert_eq!(list().await.len(), n);

    // A change behind imaged's back shows once the ttl has passed.
    assert!(f.status("example.com/y:1").await.is_none());
    f.embedded().preload(imaged::embedded::RemoteImage::new("example.com/y:1", 100)).expect("preload");
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(f.status("example.com/y:1").await.is_some(), "seen within the ttl");
}

#[actix::test]
async fn without_a_ttl_or_with_a_fault_plan_every_read_reaches_the_runtime() {
    let f = Front::start(&format!("{QUIET}[cri_server]\nread_cache_ttl = \"0s\"")).await;
    f.settled().await;
    let before = f.embedded().stats().calls(Rpc::ImageStatus);
    for _ in 0..3 {
        f.status("example.com/none:1").await;
    }
    assert_eq!(f.embedded().stats().calls(Rpc::ImageStatus) - before, 3);

    let f = Front::start(QUIET).await;
    f.settled().await;
    let plan = imaged::fault::FaultPlan::from_toml(
        "[[rule]]\nrpc = \"ImageStatus\"\naction = \"fail\"\nkind = \"RuntimeUnavailable\"\ntimes = 1\n",
    )
    .expect("plan");
    f.node.gateway().send(imaged::actors::cri_gateway::SetFaultPlan(plan)).await.expect("plan set");
    let req = || pb::ImageStatusRequest { image: Some(spec("example.com/flaky:1")), verbose: false };
    let first = f.client.clone().image_status(req()).await;
    assert_eq!(first.expect_err("the plan's fault").code(), Code::Unavailable);
    assert!(f.client.clone().image_status(req()).await.is_ok(), "the rule is spent; the runtime answers");
}

/// A node whose GC runs only when asked, with `min_age` its minimum age
/// (also the window an ensure counts as in use), and `old` on its runtime,
/// put there outside imaged and never used.
async fn front_over_gc(old: &str, min_age: &str) -> (Front, String) {
    let f = Front::start(&format!("{QUIET}image_minimum_gc_age = \"{min_age}\"\n")).await;
    let id = f.embedded().preload(imaged::embedded::RemoteImage::new(old, 100)).expect("preload");
    f.settled().await;
    (f, id)
}

impl Front {
    /// What the next detection says uses the image `id`, if anything.
    async fn used_by(&self, id: &str) -> Option<String> {
        let d = self.node.gc().detector.send(imaged::actors::detector::DetectImages).await;
        d.expect("detector").expect("detection").in_use.get(id).map(|w| w.join(","))
    }

    /// Waits (bounded) until the runtime has been asked for `n` calls of `rpc`.
    async fn until_runtime_calls(&self, rpc: Rpc, n: u64) {
        for _ in 0..400 {
            if self.embedded().stats().calls(rpc) >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the runtime never got {n} {rpc:?} calls");
    }
}

#[actix::test]
async fn an_image_the_kubelet_finds_through_the_front_counts_as_in_use_for_gc_kept_answers_too() {
    let image = "example.com/team/app:1";
    let (f, id) = front_over_gc(image, "2m").await;
    assert_eq!(f.used_by(&id).await, None, "put there outside imaged and never asked for");
    let (hints, clock) = (f.node.manager().hints(), f.node.manager().pull_records().clock());

    let before = clock.now();
    assert_eq!(f.status(image).await.map(|i| i.id).as_deref(), Some(id.as_str()));
    assert_eq!(hints.ensured_since(before), std::slice::from_ref(&id), "the runtime's answer marks the image");
    // The same call again is served the kept answer (read_cache_ttl 1 s):
    // it marks the image all the same.
    let statuses = f.embedded().stats().calls(Rpc::ImageStatus);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let again = clock.now();
    assert!(f.status(image).await.is_some());
    assert_eq!(f.embedded().stats().calls(Rpc::ImageStatus), statuses, "a kept answer");
    assert_eq!(hints.ensured_since(again), std::slice::from_ref(&id), "a kept answer marks the image too");
    // An absent image marks nothing.
    let absent = clock.now();
    assert!(f.status("example.com/team/none:1").await.is_none());
    assert!(hints.ensured_since(absent).is_empty());

    assert_eq!(f.used_by(&id).await.as_deref(), Some("ensured recently"), "as an API ensure's image");
}

#[actix::test]
async fn an_image_status_during_a_gc_removal_of_its_image_waits_for_it_and_answers_absent() {
    use imaged::fault::{FaultPlan, FaultRule};
    let image = "example.com/team/app:1";
    let (f, _id) = front_over_gc(image, "0s").await;
    let removal = Duration::from_millis(800);
    f.embedded().set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::RemoveImage).delay(removal)));
    let node = f.node.clone();
    let gc = tokio::spawn(async move { node.delete_unused_images(false).await.map(|r| r.removed.len()) });
    f.until_runtime_calls(Rpc::RemoveImage, 1).await;
    let asked = tokio::time::Instant::now();

    let found = f.status(image).await;
    assert!(found.is_none(), "the kubelet is not told of an image being removed: {found:?}");
    assert!(asked.elapsed() >= removal / 2, "answered after the removal ended, not before");
    assert_eq!(gc.await.expect("task").expect("GC run"), 1, "the removal went on");
}

/// A front over a node with `cri_server.refuse_remove_in_use` and a
/// minimum age of 2 minutes, `images` put on the node outside imaged.
async fn front_keeping_in_use(images: &[&str]) -> (Front, Vec<String>) {
    let toml = format!("{QUIET}image_minimum_gc_age = \"2m\"\n[cri_server]\nrefuse_remove_in_use = true\n");
    let f = Front::start(&toml).await;
    let ids = images
        .iter()
        .map(|i| f.embedded().preload(imaged::embedded::RemoteImage::new(*i, 100)).expect("preload"))
        .collect();
    f.settled().await;
    (f, ids)
}

impl Front {
    /// A `RemoveImage` of `id` through the front that the runtime takes
    /// 800 ms to carry out, sent on a task of its own; returns once the
    /// runtime has it, with the task and the removal's time.
    async fn remove_slowly(
        &self,
        id: &str,
    ) -> (tokio::task::JoinHandle<Result<tonic::Response<pb::RemoveImageResponse>, tonic::Status>>, Duration) {
        use imaged::fault::{FaultPlan, FaultRule};
        let removal = Duration::from_millis(800);
        self.embedded().set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::RemoveImage).delay(removal)));
        let (mut c, id) = (self.client.clone(), id.to_string());
        let removing = tokio::spawn(async move { c.remove_image(remove(&id)).await });
        self.until_runtime_calls(Rpc::RemoveImage, 1).await;
        (removing, removal)
    }
}

#[actix::test]
async fn with_refuse_remove_in_use_a_remove_of_an_image_a_pod_was_just_given_or_is_being_pulled_is_refused() {
    use imaged::domain::pull_policy::PullPolicy;
    use imaged::ensure::EnsureImageRequest;
    let (old, given, ensured, pulled) =
        ("example.com/team/old:1", "example.com/team/app:1", "example.com/team/api:1", "example.com/team/re:1");
    let (f, ids) = front_keeping_in_use(&[old, given, ensured, pulled]).await;
    let mut c = f.client.clone();
    // The kubelet's check finds one for a pod; imaged's API gives another.
    assert!(f.status(given).await.is_some());
    let req = EnsureImageRequest::new("uid-api", ensured, PullPolicy::IfNotPresent);
    f.node.ensure_image_exists(&req).await.expect("node").expect("present");
    for (target, named) in [(ids[1].clone(), given), (ensured.to_string(), ensured)] {
        let err = c.remove_image(remove(&target)).await.expect_err("given to a pod just now: refused");
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        let m = err.message();
        assert!(m.starts_with(&format!("imaged refuses to remove image {target:?} (")), "names the call's image: {m}");
        assert!(m.contains(named), "and its tag: {m}");
        assert!(m.contains(": it was ensured ") && m.contains("gc.image_minimum_gc_age (2m0s)"), "says why: {m}");
        assert!(m.ends_with("cri_server.refuse_remove_in_use is set"), "and which setting: {m}");
    }
    assert_eq!(f.embedded().stats().calls(Rpc::RemoveImage), 0, "nothing reached the runtime");
    // One no pod asked for goes, as the kubelet's GC wants.
    c.remove_image(remove(old)).await.expect("unused: removed");
    assert!(f.embedded().images().iter().all(|i| i.id != ids[0]), "gone");
    // One being pulled again (policy Always) is kept while the pull runs.
    f.add(pulled, 800);
    let pulling = f.spawn_pull(pull(pulled));
    f.until_queue_holds(1).await;
    let err = c.remove_image(remove(&ids[3])).await.expect_err("being pulled: refused");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains(": a pull of it is in flight, and"), "{}", err.message());
    assert_eq!(pulling.await.expect("task").expect("pulled"), ids[3]);
    let text = f.node.config().pull.metrics.encode();
    for (reason, n) in [("in_use", 2), ("pulling", 1), ("pinned", 0)] {
        let line = format!("imaged_cri_front_removes_refused_total{{reason=\"{reason}\"}} {n}");
        assert!(text.contains(&line), "{line} in the metrics:\n{text}");
    }
    for id in &ids[1..] {
        assert!(f.embedded().images().iter().any(|i| &i.id == id), "{id} is kept");
    }
    // A reload of the minimum age reaches the front: at 0 s, an image given
    // before now is no longer kept.
    let mut cfg = f.node.config().clone();
    cfg.gc.min_age = Duration::ZERO;
    f.node.reload(&cfg);
    tokio::time::sleep(Duration::from_millis(20)).await;
    c.remove_image(remove(given)).await.expect("the window is over: removed");
    assert!(f.embedded().images().iter().all(|i| i.id != ids[1]), "gone");
}

#[actix::test]
async fn with_refuse_remove_in_use_an_image_status_during_the_kubelets_remove_waits_and_answers_absent() {
    let image = "example.com/team/app:1";
    let (f, ids) = front_keeping_in_use(&[image]).await;
    // The kubelet's GC removes the image no pod was given ...
    let (removing, removal) = f.remove_slowly(&ids[0]).await;
    let asked = tokio::time::Instant::now();
    // ... while a pod's check of it comes: it waits for the removal.
    let found = f.status(image).await;
    assert!(found.is_none(), "the pod is not told of an image being removed: {found:?}");
    assert!(asked.elapsed() >= removal / 2, "answered after the removal ended, not before");
    removing.await.expect("task").expect("the removal went on");
}

#[actix::test]
async fn a_pull_that_brings_an_image_being_removed_waits_for_the_remove_and_says_pull_again() {
    let image = "example.com/team/app:1";
    let (f, ids) = front_keeping_in_use(&[image]).await;
    let (removing, removal) = f.remove_slowly(&ids[0]).await;
    // The kubelet pulls it again (policy Always) while the remove runs: the
    // runtime has it, but not for long.
    let asked = tokio::time::Instant::now();
    let err = f.spawn_pull(pull(image)).await.expect("task").expect_err("the image went: not answered with it");
    assert!(asked.elapsed() >= removal / 2, "answered after the removal ended, not before");
    assert!(err.message().contains("removed through imaged while it was pulled; pull it again"), "{err:?}");
    removing.await.expect("task").expect("the removal went on");
    // The kubelet's next try pulls it.
    f.add(image, 0);
    let again = f.spawn_pull(pull(image)).await.expect("task").expect("pulled again");
    assert_eq!(again, ids[0]);
    assert!(f.status(image).await.is_some());
}

#[actix::test]
async fn a_pull_through_the_front_keeps_the_image_it_replaces_and_marks_what_it_brings() {
    let image = "example.com/team/app:1";
    let (f, id) = front_over_gc(image, "0s").await;
    let (hints, clock) = (f.node.manager().hints(), f.node.manager().pull_records().clock());
    // The kubelet pulls the present image again (policy Always), slowly.
    f.add(image, 800);
    let pulling = f.spawn_pull(pull(image));
    f.until_queue_holds(1).await;
    let started = clock.now();
    let report = f.node.delete_unused_images(false).await.expect("GC run");
    assert!(report.removed.is_empty(), "a pull of its name is in flight: {report:#?}");
    assert!(hints.ensured_since(started).is_empty(), "not marked before the pull ends");
    let pulled = pulling.await.expect("task").expect("pulled");
    assert_eq!(pulled, id, "the same content");
    assert_eq!(hints.ensured_since(started), [id], "the pull marks what it brings");
}

#[actix::test]
async fn the_kubelets_pulls_keep_kep2535_records_so_imageds_ensures_verify_who_may_use_them() {
    use imaged::domain::pull_policy::PullPolicy;
    use imaged::ensure::EnsureImageRequest;
    let f = Front::start("").await;
    let (private, public) = ("registry.example.com/team/secret:1", "registry.example.com/team/open:1");
    f.embedded()
        .add_remote(
            imaged::embedded::RemoteImage::new(private, 100)
                .private("team", "team-password")
                .latency(Duration::from_millis(300)),
        )
        .expect("add");
    f.add(public, 0);
    let with_auth = pb::PullImageRequest {
        auth: Some(pb::AuthConfig { username: "team".into(), password: "team-password".into(), ..Default::default() }),
        ..pull(private)
    };
    // The intent is on disk while the kubelet's pull runs.
    let pulling = f.spawn_pull(with_auth);
    f.until_queue_holds(1).await;
    let records = f.node.manager().pull_records();
    assert_eq!(records.stored_intents().len(), 1, "the intent before the pull: {:?}", records.stored_intents());
    let id = pulling.await.expect("task").expect("the kubelet's pull with the pod's secret");
    f.client.clone().pull_image(pull(public)).await.expect("an anonymous pull");
    let pulls = f.runtime_pulls();

    // A pod without the credential may not use the private image: it must
    // pull, and cannot.
    let bare = EnsureImageRequest::new("no-secret", private, PullPolicy::IfNotPresent);
    let got = f.node.ensure_image_exists(&bare).await.expect("node");
    assert!(got.is_err(), "a pod without the secret was given the private image: {got:?}");
    // A pod whose secret holds the same credential may, without a pull.
    let json = r#"{"auths":{"registry.example.com":{"username":"team","password":"team-password"}}}"#;
    let secret = imaged::credentials::PullSecret::new("shop", "regcred", "kubernetes.io/dockerconfigjson")
        .with_uid("uid-regcred")
        .with_data(".dockerconfigjson", json.as_bytes().to_vec());
    let mut same = EnsureImageRequest::new("same-secret", private, PullPolicy::IfNotPresent);
    same.pod.namespace = "shop".into();
    same.pull_secrets = vec![secret];
    let ok = f.node.ensure_image_exists(&same).await.expect("node").expect("the same credential");
    assert_eq!(ok.image_ref, id);
    // The anonymous pull's image is every pod's.
    let anyone = EnsureImageRequest::new("anyone", public, PullPolicy::IfNotPresent);
    f.node.ensure_image_exists(&anyone).await.expect("node").expect("a public image");
    assert_eq!(f.runtime_pulls(), pulls + 1, "only the pod without the secret tried to pull");
    assert!(records.stored_intents().is_empty(), "every intent ended: {:?}", records.stored_intents());
    let record = records.record(&id).expect("the private image's record");
    let shown = format!("{record:?}");
    assert!(!shown.contains("team-password"), "the credential is never stored: {shown}");
}

#[actix::test]
async fn in_a_registry_outage_the_fallback_answers_only_a_credential_imageds_records_show_may_use_the_image() {
    use imaged::cri::{CriError, CriErrorKind};
    use imaged::fault::{FaultPlan, FaultRule};
    let f = Front::start("[cri_server]\nlocal_fallback_namespaces = [\"edge\"]").await;
    let private = "registry.example.com/team/secret:1";
    f.embedded()
        .add_remote(imaged::embedded::RemoteImage::new(private, 100).private("team", "team-password"))
        .expect("add");
    let as_pod = |auth: Option<(&str, &str)>| pb::PullImageRequest {
        auth: auth.map(|(u, p)| pb::AuthConfig { username: u.into(), password: p.into(), ..Default::default() }),
        ..pull_for(private, pod("edge", "cam-0", &[]))
    };
    let mut c = f.client.clone();
    let id = c.pull_image(as_pod(Some(("team", "team-password")))).await.expect("pulled").into_inner().image_ref;
    let outage = CriError::new(CriErrorKind::RegistryUnavailable, "dial tcp 10.0.0.1:443: i/o timeout");
    f.embedded().set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).fail(outage)));

    // The kubelet verifying a pod without the credential, or with another:
    // the image is on the node, but the registry would have had to say.
    for (auth, named) in
        [(None, "a pull without a credential"), (Some(("team", "guess")), "the credential of this pull")]
    {
        let err = c.pull_image(as_pod(auth)).await.expect_err("no verdict without the registry");
        assert_eq!(err.code(), Code::Unknown, "{err:?}");
        assert!(err.message().starts_with("RegistryUnavailable"), "{}", err.message());
        assert!(err.message().contains("i/o timeout"), "the registry's error first: {}", err.message());
        assert!(err.message().contains("was not used") && err.message().contains("KEP-2535"), "{}", err.message());
        assert!(err.message().contains(&format!("do not show that {named} may use it")), "{}", err.message());
        assert!(!err.message().contains("guess"), "never a credential: {}", err.message());
    }
    // The credential the image was pulled with: the image on the node.
    let got = c.pull_image(as_pod(Some(("team", "team-password")))).await.expect("falls back").into_inner();
    assert_eq!(got.image_ref, id);
    assert_eq!(f.runtime_pulls(), 4, "each call tried the registry");
}

#[actix::test]
async fn in_a_registry_outage_a_preloaded_image_falls_back_for_any_credential_unless_the_policy_verifies_it() {
    use imaged::cri::{CriError, CriErrorKind};
    use imaged::fault::{FaultPlan, FaultRule};
    let private = "registry.example.com/team/edge:1";
    for (policy, falls_back) in [("NeverVerifyPreloadedImages", true), ("AlwaysVerify", false)] {
        // Durable records: their writes take the disk's time.
        let state = tempfile::tempdir().expect("tempdir");
        let toml = format!(
            "[cri_server]\nlocal_fallback_namespaces = [\"edge\"]\n[credential_verification]\npolicy = \"{policy}\"\n\
             [state]\ndir = \"{}\"",
            state.path().display()
        );
        let f = Front::start(&toml).await;
        // A disk that takes its time to answer (the store's work inline on
        // this thread, answered 50 ms later): the pull's intent ends well
        // after its failure.
        imaged::blocking::run_inline_on_this_thread(true);
        imaged::blocking::answer_inline_after(Some(Box::new(|| Duration::from_millis(50))));
        let id = f
            .embedded()
            .preload(imaged::embedded::RemoteImage::new(private, 100).private("team", "team-password"))
            .expect("preload");
        let outage = CriError::new(CriErrorKind::RegistryUnavailable, "dial tcp 10.0.0.1:443: i/o timeout");
        f.embedded().set_fault_plan(FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).fail(outage)));
        // No credential (a `:latest` image's `Always`, or the kubelet verifying).
        let got = f.client.clone().pull_image(pull_for(private, pod("edge", "cam-0", &[]))).await;
        if falls_back {
            assert_eq!(got.expect("the preloaded image, as for an ensure").into_inner().image_ref, id, "{policy}");
        } else {
            let err = got.expect_err("the policy verifies preloaded images too");
            assert!(err.message().starts_with("RegistryUnavailable") && err.message().contains("KEP-2535"), "{err:?}");
        }
        // The same again: the first call's intent ended, nothing changed.
        let again = f.client.clone().pull_image(pull_for(private, pod("edge", "cam-1", &[]))).await;
        assert_eq!(again.is_ok(), falls_back, "{policy}: {again:?}");
        assert!(f.node.manager().pull_records().stored_intents().is_empty(), "{policy}: every intent ended");
        imaged::blocking::answer_inline_after(None);
        imaged::blocking::run_inline_on_this_thread(false);
    }
}
