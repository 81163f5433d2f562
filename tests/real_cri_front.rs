//! imaged's CRI front in front of a REAL containerd: the generated CRI
//! client (the one the kubelet uses, not imaged's gateway) talks to the
//! front's socket, the front forwards to containerd 1.6 (CRI plugin), and
//! containerd pulls images built here and pushed to the loopback registries
//! of `.ci/containerd-env.sh` (one open, one htpasswd-protected).
//!
//! The cases follow cri-tools' critest groups "Image Manager", "Image
//! Consistency" and "Image Identifier", plus what only a front can get wrong:
//! single-flight pulls, one pull per credential, pins, errors and unknown
//! fields passed through as containerd gives them, and big answers. Where
//! it matters, containerd is asked the same question directly and the
//! front's answer must equal it.
//!
//! One environment serves the whole file (one `#[test]` running the cases
//! in order, each a named function); it is stopped on drop. Without
//! containerd, docker-registry and htpasswd installed the test is skipped
//! locally; under `CI=true` it fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use imaged::actors::cri_gateway::CriGatewayActor;
use imaged::config::Config;
use imaged::connect::ConnectedRuntime;
use imaged::cri::CriEndpoint;
use imaged::cri::proto as pb;
use imaged::cri::proto::image_service_client::ImageServiceClient;
use imaged::cri::wire::BytesCodec;
use imaged::node::Node;
use prost::Message as _;
use prost::bytes::Bytes;
use support::containerd_env::{ContainerdEnv, with_environment};
use support::oci::{ImageOptions, ManifestFormat, PushedImage, Registry};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// The kubelet's CRI client message limit (16 MiB), for this test's clients.
const MAX_MESSAGE: usize = 16 << 20;

/// Where gRPC's default limit is: a `ListImages` answer above it needs the
/// raised limits on every hop.
const GRPC_DEFAULT_LIMIT: usize = 4 << 20;

#[test]
fn real_cri_front() {
    with_environment("real_cri_front", |env| actix::System::new().block_on(cases(env)));
}

async fn cases(env: ContainerdEnv) {
    let started = Instant::now();
    let c = Ctx::start(env).await;
    let mut timings = Vec::new();
    macro_rules! case {
        ($f:ident) => {{
            let t = Instant::now();
            $f(&c).await;
            timings.push((stringify!($f), t.elapsed()));
        }};
    }
    case!(pull_and_remove_by_tag_without_a_tag_and_by_digest);
    case!(status_by_id_every_tag_and_every_digest_is_one_image);
    case!(uid_and_username_for_every_user_form_as_containerd_answers);
    case!(list_shows_three_images_and_three_tags_of_one_image);
    case!(present_at_once_after_a_pull_and_absent_at_once_after_a_remove);
    case!(five_concurrent_removes_by_id_all_succeed);
    case!(a_pull_with_a_1ms_deadline_fails_and_the_pull_goes_on);
    case!(the_pulls_image_ref_is_the_status_id);
    case!(fifty_concurrent_pulls_of_an_absent_image_are_one_containerd_pull);
    case!(an_authenticated_pull_with_auth_and_containerds_refusal_without);
    case!(two_credentials_in_turn_the_first_wrong_are_two_runtime_pulls);
    case!(pinned_patterns_and_the_sandbox_image_are_reported_pinned);
    case!(not_found_and_registry_down_errors_are_containerds_own);
    case!(unknown_fields_in_forwarded_requests_pass_and_answers_equal_direct);
    case!(a_list_answer_over_4_mib_passes_as_directly);
    for (name, t) in &timings {
        eprintln!("real_cri_front: {name}: {} ms", t.as_millis());
    }
    eprintln!("real_cri_front: all cases in {} ms", started.elapsed().as_millis());
}

/// A CRI client of one socket: the generated client, and its channel for
/// calls sent as raw bytes.
#[derive(Clone)]
struct Cri {
    client: ImageServiceClient<Channel>,
    channel: Channel,
}

impl Cri {
    fn over(socket: PathBuf) -> Self {
        let channel = CriEndpoint::Unix(socket).channel(Duration::from_secs(5)).expect("channel");
        let client = ImageServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        Cri { client, channel }
    }

    async fn pull(&self, image: &str) -> Result<String, Status> {
        self.pull_req(pull(image)).await
    }

    async fn pull_req(&self, req: impl tonic::IntoRequest<pb::PullImageRequest>) -> Result<String, Status> {
        self.client.clone().pull_image(req).await.map(|r| r.into_inner().image_ref)
    }

    async fn status(&self, image: &str) -> Option<pb::Image> {
        let req = pb::ImageStatusRequest { image: Some(spec(image)), verbose: false };
        self.client.clone().image_status(req).await.expect("ImageStatus answers").into_inner().image
    }

    async fn list(&self) -> Vec<pb::Image> {
        self.client
            .clone()
            .list_images(pb::ListImagesRequest::default())
            .await
            .expect("ListImages answers")
            .into_inner()
            .images
    }

    async fn remove(&self, image: &str) -> Result<(), Status> {
        self.client.clone().remove_image(pb::RemoveImageRequest { image: Some(spec(image)) }).await.map(|_| ())
    }

    /// `method` of the ImageService with `body` sent as it is; the answer's bytes.
    async fn raw(&self, method: &str, body: Vec<u8>) -> Result<Bytes, Status> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        grpc.ready().await.expect("ready");
        let path = format!("/runtime.v1.ImageService/{method}").parse().expect("path");
        grpc.unary(tonic::Request::new(Bytes::from(body)), path, BytesCodec).await.map(tonic::Response::into_inner)
    }
}

/// A node connected to containerd, its CRI front served on a temp socket,
/// and a client of that socket.
struct Front {
    cri: Cri,
    _node: Arc<Node>,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Front {
    async fn start(env: &ContainerdEnv, toml: &str) -> Self {
        let cfg = Config::from_toml(toml).expect("config");
        let endpoint = CriEndpoint::Unix(env.socket.clone());
        let (gateway, version) = CriGatewayActor::connect(&endpoint, &cfg.cri).await.expect("gateway connects");
        assert_eq!(version.runtime_name, "containerd");
        let runtime = ConnectedRuntime { gateway, version, endpoint, embedded: None };
        let node = Arc::new(Node::start_on(cfg, runtime).await.expect("node starts on containerd"));
        // Short path: unix socket paths are limited to ~100 bytes.
        let dir = tempfile::Builder::new().prefix("imf").tempdir_in("/tmp").expect("tempdir");
        let path = dir.path().join("cri.sock");
        let stop = support::front::serve_front(&node, &path).await;
        Front { cri: Cri::over(path), _node: node, _dir: dir, _stop: stop }
    }
}

/// What every case uses: the environment, the front (default settings but
/// no pull rate limit, so the cases never wait on a token bucket), and a
/// client of containerd itself to compare with.
struct Ctx {
    env: ContainerdEnv,
    front: Front,
    direct: Cri,
    open: Registry,
    private: Registry,
    containerd_log: PathBuf,
}

impl Ctx {
    async fn start(env: ContainerdEnv) -> Self {
        let front = Front::start(&env, "[pull]\nregistry_pull_qps = 0.0\n").await;
        let direct = Cri::over(env.socket.clone());
        let dir = env.vars.get("CONTAINERD_ENV_DIR").expect("CONTAINERD_ENV_DIR in the env file");
        Ctx {
            open: Registry::open(&env.registry_open),
            private: Registry::with_auth(&env.registry_auth, &env.user, &env.pass),
            containerd_log: PathBuf::from(dir).join("containerd.log"),
            front,
            direct,
            env,
        }
    }

    /// Pushes a one-file image to the open registry; `content` decides the
    /// image id (same content, same id).
    async fn push(&self, repo: &str, tag: &str, content: &str) -> PushedImage {
        self.open.push_image(repo, tag, &[("etc/front.txt", content.as_bytes())]).await.expect("push")
    }

    fn name(&self, repo: &str) -> String {
        format!("{}/{repo}", self.env.registry_open)
    }

    /// How many `PullImage` calls for `image` containerd has received, from
    /// its own log: its CRI plugin logs `PullImage "<image>"` (level info)
    /// when each call starts, and `PullImage "<image>" returns …` /
    /// `… failed` when it ends.
    fn runtime_pulls(&self, image: &str) -> usize {
        let log = std::fs::read_to_string(&self.containerd_log).expect("containerd.log");
        let start = format!(r#"msg="PullImage \"{image}\"""#);
        log.lines().filter(|l| l.contains(&start)).count()
    }
}

fn spec(image: &str) -> pb::ImageSpec {
    pb::ImageSpec { image: image.into(), ..Default::default() }
}

fn pull(image: &str) -> pb::PullImageRequest {
    pb::PullImageRequest { image: Some(spec(image)), auth: None, sandbox_config: None }
}

/// `img` with tags and digests sorted (containerd keeps them in a set).
fn norm(mut img: pb::Image) -> pb::Image {
    img.repo_tags.sort();
    img.repo_digests.sort();
    img
}

/// A list, each image normalised, sorted by id.
fn norm_list(list: Vec<pb::Image>) -> Vec<pb::Image> {
    let mut list: Vec<_> = list.into_iter().map(norm).collect();
    list.sort_by(|a, b| a.id.cmp(&b.id));
    list
}

/// `msg` encoded, with a field a newer client might send (number 99, a string).
fn with_unknown(msg: &impl prost::Message) -> Vec<u8> {
    const EXTRA: &[u8] = b"from-a-newer-kubelet";
    let mut b = msg.encode_to_vec();
    b.extend_from_slice(&[0x9a, 0x06, EXTRA.len() as u8]); // field 99, length-delimited
    b.extend_from_slice(EXTRA);
    b
}

/// critest "Image Manager": public image with tag / without tag / with
/// digest should be pulled and removed.
async fn pull_and_remove_by_tag_without_a_tag_and_by_digest(c: &Ctx) {
    let f = &c.front.cri;
    let p = c.push("imaged/front-bytag", "v1", "by tag").await;
    let id = f.pull(&p.reference).await.expect("1: a pull by tag through the front");
    assert_eq!(id, p.config_digest, "1: PullImage by tag answers the image id");
    assert!(f.status(&p.reference).await.is_some(), "1: the image pulled by tag is not present");
    f.remove(&p.reference).await.expect("1: RemoveImage by tag");
    assert_eq!(f.status(&p.reference).await, None, "1: the tag is still there after RemoveImage by tag");
    assert_eq!(f.status(&id).await, None, "1: the image is still there after RemoveImage of its only tag");

    c.push("imaged/front-untagged", "latest", "no tag").await;
    let name = c.name("imaged/front-untagged");
    let id = f.pull(&name).await.expect("1: a pull without a tag through the front");
    let img = f.status(&name).await.expect("1: the image pulled without a tag is not present");
    assert_eq!(img.repo_tags, [format!("{name}:latest")], "1: an image pulled without a tag is not tagged :latest");
    f.remove(&name).await.expect("1: RemoveImage without a tag");
    assert_eq!(f.status(&id).await, None, "1: the image is still there after RemoveImage without a tag");

    let p = c.push("imaged/front-bydigest", "v1", "by digest").await;
    let by_digest = format!("{}@{}", c.name("imaged/front-bydigest"), p.manifest_digest);
    let id = f.pull(&by_digest).await.expect("1: a pull by digest through the front");
    assert_eq!(id, p.config_digest, "1: PullImage by digest answers the image id");
    let img = f.status(&by_digest).await.expect("1: the image pulled by digest is not present");
    assert_eq!(img.repo_digests, std::slice::from_ref(&by_digest), "1: the repo digest of an image pulled by digest");
    assert!(img.repo_tags.is_empty(), "1: an image pulled by digest got tags: {:?}", img.repo_tags);
    f.remove(&by_digest).await.expect("1: RemoveImage by digest");
    assert_eq!(f.status(&by_digest).await, None, "1: the digest is still there after RemoveImage by digest");
    assert_eq!(f.status(&id).await, None, "1: the image is still there after RemoveImage by digest");
}

/// critest "Image Identifier": ImageStatus by id, by each tag and by each
/// digest is the same image (two repositories, three tags, two digests).
async fn status_by_id_every_tag_and_every_digest_is_one_image(c: &Ctx) {
    let f = &c.front.cri;
    let mut pushed = Vec::new();
    for (repo, tag) in [("imaged/front-ident", "a"), ("imaged/front-ident", "b"), ("imaged/front-ident2", "a")] {
        let p = c.push(repo, tag, "identifier").await;
        f.pull(&p.reference).await.expect("2: a pull through the front");
        pushed.push(p);
    }
    let id = pushed[0].config_digest.clone();
    let img = norm(f.status(&id).await.expect("2: no image by id"));
    let mut tags: Vec<String> = pushed.iter().map(|p| p.reference.clone()).collect();
    tags.sort();
    assert_eq!(img.repo_tags, tags, "2: the tags of one image in two repositories");
    let mut digests = vec![
        format!("{}@{}", c.name("imaged/front-ident"), pushed[0].manifest_digest),
        format!("{}@{}", c.name("imaged/front-ident2"), pushed[0].manifest_digest),
    ];
    digests.sort();
    assert_eq!(img.repo_digests, digests, "2: one repo digest per repository");
    for name in img.repo_tags.iter().chain(&img.repo_digests) {
        let by_name = f.status(name).await.map(norm);
        assert_eq!(by_name.as_ref(), Some(&img), "2: ImageStatus by {name} is not the image ImageStatus by id gives");
    }
    let direct = c.direct.status(&id).await.map(norm);
    assert_eq!(direct.as_ref(), Some(&img), "2: containerd's own ImageStatus by id differs from the front's");
    f.remove(&id).await.expect("2: RemoveImage by id");
}

/// critest "Image Consistency": the image config's `User` as `uid` and
/// `username`, for each form. containerd 1.6 takes the part before `:`: a
/// number is the uid (username ""), anything else the username (no uid).
/// The front must answer exactly what containerd answers directly.
async fn uid_and_username_for_every_user_form_as_containerd_answers(c: &Ctx) {
    let forms = [
        ("1002", Some(1002), ""),
        ("www-data", None, "www-data"),
        ("1003:1004", Some(1003), ""),
        ("www-data:staff", None, "www-data"),
    ];
    for (i, (user, uid, username)) in forms.into_iter().enumerate() {
        let repo = format!("imaged/front-user-{i}");
        let options = ImageOptions { user: Some(user.into()) };
        let p = c
            .open
            .push_image_with(&repo, "v1", &[("etc/user", user.as_bytes())], ManifestFormat::Oci, &options)
            .await
            .expect("push");
        c.front.cri.pull(&p.reference).await.expect("3: a pull through the front");
        let through = c.front.cri.status(&p.reference).await.expect("3: the image is present");
        let direct = c.direct.status(&p.reference).await.expect("3: containerd has the image");
        assert_eq!(
            (&through.uid, &through.username),
            (&direct.uid, &direct.username),
            "3: USER {user:?}: the front's uid/username are not containerd's own"
        );
        assert_eq!(through.uid.map(|u| u.value), uid, "3: USER {user:?}: uid");
        assert_eq!(through.username, username, "3: USER {user:?}: username");
        c.front.cri.remove(&p.config_digest).await.expect("3: RemoveImage");
    }
}

/// critest "Image Manager": listed images, and all tags of one image.
async fn list_shows_three_images_and_three_tags_of_one_image(c: &Ctx) {
    let f = &c.front.cri;
    let mut ids = Vec::new();
    for i in 1..=3 {
        let p = c.push(&format!("imaged/front-list-{i}"), "v1", &format!("list {i}")).await;
        ids.push(f.pull(&p.reference).await.expect("4: a pull through the front"));
    }
    let list = f.list().await;
    for id in &ids {
        assert_eq!(list.iter().filter(|i| &i.id == id).count(), 1, "4: {id} is not listed once: {list:?}");
    }
    let mut tags = Vec::new();
    for tag in ["t1", "t2", "t3"] {
        let p = c.push("imaged/front-tags", tag, "three tags").await;
        f.pull(&p.reference).await.expect("4: a pull through the front");
        tags.push(p.reference);
    }
    let list = f.list().await;
    let direct = c.direct.list().await;
    assert_eq!(norm_list(list.clone()), norm_list(direct), "4: the front's list is not containerd's own");
    let tagged: Vec<_> = list.into_iter().filter(|i| i.repo_tags.contains(&tags[0])).map(norm).collect();
    assert_eq!(tagged.len(), 1, "4: three tags of one image are not one image: {tagged:?}");
    assert_eq!(tagged[0].repo_tags, tags, "4: the three tags of one image");
    for id in ids.iter().chain([&tagged[0].id]) {
        f.remove(id).await.expect("4: RemoveImage");
    }
}

/// critest "Image Consistency": no cache between the client and the runtime.
async fn present_at_once_after_a_pull_and_absent_at_once_after_a_remove(c: &Ctx) {
    let f = &c.front.cri;
    let p = c.push("imaged/front-at-once", "v1", "at once").await;
    assert_eq!(f.status(&p.reference).await, None, "5: present before the pull");
    let id = f.pull(&p.reference).await.expect("5: a pull through the front");
    assert!(f.status(&p.reference).await.is_some(), "5: not present by tag right after the pull");
    assert!(f.list().await.iter().any(|i| i.id == id), "5: not listed right after the pull");
    f.remove(&p.reference).await.expect("5: RemoveImage");
    assert_eq!(f.status(&p.reference).await, None, "5: still present by tag right after RemoveImage");
    assert_eq!(f.status(&id).await, None, "5: still present by id right after RemoveImage");
    assert!(!f.list().await.iter().any(|i| i.id == id), "5: still listed right after RemoveImage");
}

/// Five clients removing one image by id at once: every call succeeds.
async fn five_concurrent_removes_by_id_all_succeed(c: &Ctx) {
    let p = c.push("imaged/front-remove5", "v1", "remove five times").await;
    let id = c.front.cri.pull(&p.reference).await.expect("6: a pull through the front");
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let (f, id) = (c.front.cri.clone(), id.clone());
            tokio::spawn(async move { f.remove(&id).await })
        })
        .collect();
    for (n, call) in calls.into_iter().enumerate() {
        call.await.expect("task").unwrap_or_else(|e| panic!("6: concurrent RemoveImage #{n} by id failed: {e:?}"));
    }
    assert_eq!(c.front.cri.status(&id).await, None, "6: present after five RemoveImage calls");
}

/// A pull whose caller allows 1 ms ends at once with an error; the image
/// can be pulled afterwards.
async fn a_pull_with_a_1ms_deadline_fails_and_the_pull_goes_on(c: &Ctx) {
    let p = c.push("imaged/front-deadline", "v1", "deadline").await;
    let mut req = tonic::Request::new(pull(&p.reference));
    req.set_timeout(Duration::from_millis(1));
    let through = c.front.cri.pull_req(req).await.expect_err("7: a pull with a 1 ms deadline succeeded");
    // At 1 ms two timers race: this tonic client's own (the deadline also
    // travels as `grpc-timeout: 1000u`), which ends the call with
    // `Cancelled "Timeout expired"`, and the front's, which answers
    // DeadlineExceeded a little before the deadline (DEADLINE_MARGIN). A Go
    // client (the kubelet) reports DeadlineExceeded from its own context
    // either way. Asked directly, containerd's call ends at this client's
    // timer.
    let timed_out = |e: &Status| {
        e.code() == Code::DeadlineExceeded || (e.code(), e.message()) == (Code::Cancelled, "Timeout expired")
    };
    assert!(timed_out(&through), "7: a pull past its 1 ms deadline: {through:?}");
    let mut req = tonic::Request::new(pull(&p.reference));
    req.set_timeout(Duration::from_millis(1));
    let direct = c.direct.pull_req(req).await.expect_err("7: containerd pulled within 1 ms");
    assert!(timed_out(&direct), "7: direct: {direct:?}");

    // A registry that takes connections and never answers: containerd's pull
    // hangs. The caller's deadline, sent only as `grpc-timeout` (no timer of
    // the client's own), is answered by imaged: DeadlineExceeded.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a silent registry");
    let hanging = format!("{}/imaged/silent:v1", silent.local_addr().expect("addr"));
    let mut req = tonic::Request::new(pull(&hanging));
    req.metadata_mut().insert("grpc-timeout", "300m".parse().expect("header"));
    let started = std::time::Instant::now();
    let err = c.front.cri.pull_req(req).await.expect_err("7: a pull from a silent registry succeeded");
    assert_eq!(err.code(), Code::DeadlineExceeded, "7: imaged answers the caller's deadline: {err:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "7: at the deadline: {:?}", started.elapsed());
    // Closing the listener resets containerd's connection: that pull ends
    // and the serial queue moves on.
    drop(silent);
    let id = c.front.cri.pull(&p.reference).await.expect("7: the pull without a deadline afterwards");
    assert_eq!(id, p.config_digest);
    c.front.cri.remove(&id).await.expect("7: RemoveImage");
}

/// critest: `PullImageResponse.image_ref` is the id ImageStatus gives, and
/// what containerd answers directly.
async fn the_pulls_image_ref_is_the_status_id(c: &Ctx) {
    let p = c.push("imaged/front-ref", "v1", "image ref").await;
    let image_ref = c.front.cri.pull(&p.reference).await.expect("8: a pull through the front");
    let img = c.front.cri.status(&p.reference).await.expect("8: present after the pull");
    assert_eq!(image_ref, img.id, "8: PullImageResponse.image_ref is not ImageStatus.image.id");
    let direct = c.direct.pull(&p.reference).await.expect("8: containerd pulls directly");
    assert_eq!(image_ref, direct, "8: the front's image_ref is not containerd's");
    c.front.cri.remove(&image_ref).await.expect("8: RemoveImage");
}

/// The front's reason to be: 50 kubelet calls for one absent image are one
/// `PullImage` at containerd (counted in containerd's own log).
async fn fifty_concurrent_pulls_of_an_absent_image_are_one_containerd_pull(c: &Ctx) {
    let p = c.push("imaged/front-fifty", "v1", "fifty").await;
    assert_eq!(c.runtime_pulls(&p.reference), 0);
    let calls: Vec<_> = (0..50)
        .map(|_| {
            let (f, image) = (c.front.cri.clone(), p.reference.clone());
            tokio::spawn(async move { f.pull(&image).await })
        })
        .collect();
    for (n, call) in calls.into_iter().enumerate() {
        let id = call.await.expect("task").unwrap_or_else(|e| panic!("9: concurrent PullImage #{n} failed: {e:?}"));
        assert_eq!(id, p.config_digest, "9: concurrent PullImage #{n} answered another image");
    }
    assert_eq!(c.runtime_pulls(&p.reference), 1, "9: 50 concurrent PullImage calls are not one pull at containerd");
    c.front.cri.remove(&p.config_digest).await.expect("9: RemoveImage");
}

fn auth(c: &Ctx, password: &str) -> pb::AuthConfig {
    // As the kubelet sends it: the registry host from the credential's key.
    // containerd 1.6 itself refuses this bare host:port ("parse server
    // address: ... first path segment in URL cannot contain colon"); imaged
    // sends it as https://host (src/cri/convert.rs), which containerd
    // compares by host only, so through the front the credential is used.
    pb::AuthConfig {
        username: c.env.user.clone(),
        password: password.into(),
        server_address: c.env.registry_auth.clone(),
        ..Default::default()
    }
}

/// critest-style private image pull: `auth` in the request pulls; without
/// it containerd's own refusal reaches the client unchanged.
async fn an_authenticated_pull_with_auth_and_containerds_refusal_without(c: &Ctx) {
    let p = c.private.push_image("imaged/front-private", "v1", &[("etc/p", b"private")]).await.expect("push");
    let through = c.front.cri.pull(&p.reference).await.expect_err("10: an anonymous pull of a private image");
    let direct = c.direct.pull(&p.reference).await.expect_err("10: containerd pulled a private image anonymously");
    assert_eq!(
        (through.code(), through.message()),
        (direct.code(), direct.message()),
        "10: the refusal without auth is not containerd's own"
    );
    eprintln!("real_cri_front: without auth: containerd answers {:?} {:?}", direct.code(), direct.message());
    assert!(direct.message().contains("401 Unauthorized"), "10: {direct:?}");
    let req = pb::PullImageRequest { auth: Some(auth(c, &c.env.pass)), ..pull(&p.reference) };
    let id = c.front.cri.pull_req(req).await.expect("10: the pull with auth through the front");
    assert_eq!(id, p.config_digest, "10: the pull with auth answered another image");
    c.front.cri.remove(&id).await.expect("10: RemoveImage");
}

/// The kubelet tries each credential in its own call: the wrong one fails
/// its call only, the right one is a pull of its own at containerd.
async fn two_credentials_in_turn_the_first_wrong_are_two_runtime_pulls(c: &Ctx) {
    let p = c.private.push_image("imaged/front-two-creds", "v1", &[("etc/p", b"two creds")]).await.expect("push");
    let wrong = pb::PullImageRequest { auth: Some(auth(c, "not-the-password")), ..pull(&p.reference) };
    let err = c.front.cri.pull_req(wrong.clone()).await.expect_err("11: the wrong password pulled");
    assert!(err.message().contains("401 Unauthorized"), "11: the wrong password's error: {err:?}");
    assert!(!err.message().contains("not-the-password"), "11: the password is shown: {err:?}");
    let right = pb::PullImageRequest { auth: Some(auth(c, &c.env.pass)), ..pull(&p.reference) };
    let id = c.front.cri.pull_req(right).await.expect("11: the second credential did not pull");
    assert_eq!(id, p.config_digest);
    assert_eq!(c.runtime_pulls(&p.reference), 2, "11: two credentials are not two pulls at containerd");
    c.front.cri.remove(&id).await.expect("11: RemoveImage");
}

/// `pinned` for an image matching `gc.pinned_images` and for the sandbox
/// image (here a loopback name), through a front configured so; containerd
/// itself pins neither.
async fn pinned_patterns_and_the_sandbox_image_are_reported_pinned(c: &Ctx) {
    let reg = &c.env.registry_open;
    let toml = format!(
        "[pull]\nregistry_pull_qps = 0.0\n[gc]\nsandbox_image = \"{reg}/imaged/front-pause:3.10\"\n\
         pinned_images = [\"{reg}/imaged/front-pinned:*\"]\n[cri_server]\npin_sandbox_image = true\n"
    );
    let pinning = Front::start(&c.env, &toml).await;
    let f = &pinning.cri;
    let mut images = Vec::new();
    for (repo, tag, pinned) in [
        ("imaged/front-pause", "3.10", true),
        ("imaged/front-pinned", "v7", true),
        ("imaged/front-unpinned", "v1", false),
    ] {
        let p = c.push(repo, tag, repo).await;
        f.pull(&p.reference).await.expect("12: a pull through the pinning front");
        images.push((p, pinned));
    }
    let list = f.list().await;
    for (p, pinned) in &images {
        let listed = list.iter().find(|i| i.id == p.config_digest).map(|i| i.pinned);
        assert_eq!(listed, Some(*pinned), "12: ListImages: {} pinned", p.reference);
        let status = f.status(&p.reference).await.map(|i| i.pinned);
        assert_eq!(status, Some(*pinned), "12: ImageStatus: {} pinned", p.reference);
        let direct = c.direct.status(&p.reference).await.map(|i| i.pinned);
        assert_eq!(direct, Some(false), "12: containerd itself pins {}", p.reference);
        let unpinning = c.front.cri.status(&p.reference).await.map(|i| i.pinned);
        assert_eq!(unpinning, Some(false), "12: the front without these pins pins {}", p.reference);
    }
    for (p, _) in &images {
        f.remove(&p.config_digest).await.expect("12: RemoveImage");
    }
}

/// A missing tag and a registry nobody listens on: the front answers with
/// containerd's own code and message for the same request.
async fn not_found_and_registry_down_errors_are_containerds_own(c: &Ctx) {
    let missing = c.name("imaged/front-missing:v1");
    for (what, image) in [("not found", missing.as_str()), ("registry down", "127.0.0.1:1/imaged/front-down:v1")] {
        let through = c.front.cri.pull(image).await.expect_err("13: a pull that cannot succeed succeeded");
        let direct = c.direct.pull(image).await.expect_err("13: containerd pulled");
        eprintln!("real_cri_front: {what}: containerd answers {:?} {:?}", direct.code(), direct.message());
        assert_eq!(
            (through.code(), through.message()),
            (direct.code(), direct.message()),
            "13: {what}: the front's error is not containerd's own"
        );
    }
    let direct = c.direct.pull(&missing).await.expect_err("13");
    assert_eq!(direct.code(), Code::NotFound, "13: containerd's code for a missing tag: {direct:?}");
}

/// A request with a field imaged's proto does not know (a newer kubelet's)
/// is forwarded as the client's bytes: the call succeeds and answers what
/// containerd answers to the same bytes directly.
async fn unknown_fields_in_forwarded_requests_pass_and_answers_equal_direct(c: &Ctx) {
    let p = c.push("imaged/front-unknown", "v1", "unknown field").await;
    c.front.cri.pull(&p.reference).await.expect("14: a pull through the front");

    let status = with_unknown(&pb::ImageStatusRequest { image: Some(spec(&p.reference)), verbose: false });
    let through = c.front.cri.raw("ImageStatus", status.clone()).await.expect("14: ImageStatus with an unknown field");
    let direct = c.direct.raw("ImageStatus", status).await.expect("14: containerd: ImageStatus with an unknown field");
    // One tag and one digest: containerd's answer has one encoding, so the
    // front's bytes must be containerd's bytes.
    assert_eq!(through, direct, "14: the ImageStatus answer's bytes are not containerd's");
    let img = pb::ImageStatusResponse::decode(through).expect("decodes").image;
    assert_eq!(img.map(|i| i.id), Some(p.config_digest.clone()), "14: ImageStatus with an unknown field");

    let filter = pb::ImageFilter { image: Some(spec(&p.reference)) };
    for req in [pb::ListImagesRequest { filter: Some(filter) }, pb::ListImagesRequest::default()] {
        let body = with_unknown(&req);
        let through = c.front.cri.raw("ListImages", body.clone()).await.expect("14: ListImages with an unknown field");
        let direct = c.direct.raw("ListImages", body).await.expect("14: containerd: ListImages with an unknown field");
        assert_eq!(through.len(), direct.len(), "14: the ListImages answer is not containerd's size");
        let through = norm_list(pb::ListImagesResponse::decode(through).expect("decodes").images);
        let direct = norm_list(pb::ListImagesResponse::decode(direct).expect("decodes").images);
        assert_eq!(through, direct, "14: ListImages ({req:?}) with an unknown field: not containerd's answer");
        assert!(through.iter().any(|i| i.id == p.config_digest), "14: the image is not listed");
    }

    let remove = with_unknown(&pb::RemoveImageRequest { image: Some(spec(&p.config_digest)) });
    c.front.cri.raw("RemoveImage", remove).await.expect("14: RemoveImage with an unknown field");
    assert_eq!(c.front.cri.status(&p.config_digest).await, None, "14: RemoveImage with an unknown field kept it");
}

/// A busy node's `ListImages` answer passes gRPC's 4 MiB default: the front
/// (client side to containerd and server side to the kubelet) must carry
/// it as containerd does directly. containerd holds five images whose
/// config `User` is a ~1 MiB name, which CRI reports as each image's
/// `username`: > 5 MiB in five pulls (the same size from many tags would take
/// some 11,000 image records, as a tag or digest name is at most ~380 bytes).
async fn a_list_answer_over_4_mib_passes_as_directly(c: &Ctx) {
    const USER_BYTES: usize = 1 << 20;
    let mut ids = Vec::new();
    for i in 0..5 {
        let user = format!("user{i}-{}", "x".repeat(USER_BYTES));
        let options = ImageOptions { user: Some(user) };
        let repo = format!("imaged/front-big-{i}");
        let files: &[(&str, &[u8])] = &[("etc/big", repo.as_bytes())];
        let p = c.open.push_image_with(&repo, "v1", files, ManifestFormat::Oci, &options).await.expect("push");
        ids.push(c.front.cri.pull(&p.reference).await.expect("15: a pull through the front"));
    }
    let body = pb::ListImagesRequest::default().encode_to_vec();
    let through = c.front.cri.raw("ListImages", body.clone()).await.expect("15: ListImages through the front");
    let direct = c.direct.raw("ListImages", body).await.expect("15: ListImages from containerd");
    eprintln!(
        "real_cri_front: ListImages answer: {} bytes through the front, {} directly",
        through.len(),
        direct.len()
    );
    assert!(direct.len() > GRPC_DEFAULT_LIMIT, "15: containerd's answer is only {} bytes", direct.len());
    assert_eq!(through.len(), direct.len(), "15: the front's big ListImages answer is not containerd's size");
    let through = norm_list(pb::ListImagesResponse::decode(through).expect("decodes").images);
    let direct = norm_list(pb::ListImagesResponse::decode(direct).expect("decodes").images);
    assert_eq!(through, direct, "15: the front's big ListImages answer is not containerd's");
    let listed = c.front.cri.list().await;
    assert!(ids.iter().all(|id| listed.iter().any(|i| &i.id == id)), "15: the generated client's list lacks an image");
    for id in &ids {
        c.front.cri.remove(id).await.expect("15: RemoveImage");
    }
}
