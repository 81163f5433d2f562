//! The CRI gateway against a real containerd (CRI plugin) pulling from real
//! OCI registries on loopback: one open, one with htpasswd basic auth.
//!
//! The test starts them itself with `.ci/containerd-env.sh up DIR` (or uses
//! the environment named by `IMAGED_CONTAINERD_ENV`), builds small images and
//! pushes them through the registry HTTP API, and stops only what it started.
//! Without containerd, docker-registry and htpasswd installed it is skipped
//! locally; under `CI=true` it fails instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::time::Duration;

use imaged::actors::cri_gateway::*;
use imaged::actors::cri_gateway::{CriDeadlines, CriSettings};
use imaged::cri::{CriErrorKind, Rpc};
use imaged::domain::{AuthConfig, ImageSpec};
use imaged::fault::{FaultPlan, FaultRule};
use support::containerd_env::{ContainerdEnv, with_environment};
use support::oci::Registry;

fn spec(image: &str) -> ImageSpec {
    ImageSpec::new(image)
}

#[test]
fn real_containerd() {
    with_environment("real_containerd", |env| actix::System::new().block_on(scenario(env)));
}

async fn scenario(env: ContainerdEnv) {
    let endpoint = imaged::cri::CriEndpoint::Unix(env.socket.clone());
    let cfg = CriSettings {
        startup_timeout: Duration::from_secs(20),
        deadlines: CriDeadlines::uniform(Some(Duration::from_secs(60))),
        ..CriSettings::default()
    };
    let (g, version) = CriGatewayActor::connect(&endpoint, &cfg).await.expect("gateway connects to containerd");
    assert_eq!(version.runtime_name, "containerd");
    assert_eq!(version.runtime_api_version, "v1");

    // --- open registry: pull, status, list, fs info, remove ---
    let open = Registry::open(&env.registry_open);
    let pushed = open
        .push_image("imaged/real-open", "v1", &[("etc/imaged.txt", b"pulled by imaged\n")])
        .await
        .expect("push to the open registry");
    let image_ref = g
        .send(PullImage::new(spec(&pushed.reference)))
        .await
        .unwrap()
        .expect("containerd pulls from the open registry");
    assert_eq!(image_ref, pushed.config_digest, "PullImage returns the image id");

    let img = g
        .send(GetImageStatus { image: spec(&pushed.reference), verbose: false })
        .await
        .unwrap()
        .expect("status")
        .image
        .expect("present after the pull");
    assert_eq!(img.id, pushed.config_digest);
    assert!(img.repo_tags.contains(&pushed.reference), "{:?}", img.repo_tags);
    let repo = format!("{}/imaged/real-open", env.registry_open);
    assert!(img.repo_digests.contains(&format!("{repo}@{}", pushed.manifest_digest)), "{:?}", img.repo_digests);
    assert_eq!(img.size, pushed.size);

    let all = g.send(ListImages::default()).await.unwrap().expect("list");
    assert!(all.iter().any(|i| i.id == pushed.config_digest));
    let filtered = g.send(ListImages { filter: Some(spec(&pushed.reference)) }).await.unwrap().expect("list filtered");
    assert_eq!(filtered.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), [pushed.config_digest.as_str()]);

    let fs = g.send(GetImageFsInfo).await.unwrap().expect("image fs info");
    assert!(!fs.image_filesystems.is_empty());
    assert!(!fs.image_filesystems[0].mountpoint.is_empty());

    let containers = g.send(ListContainers::default()).await.unwrap().expect("list containers");
    assert!(containers.is_empty());
    let sandboxes = g.send(ListPodSandboxes::default()).await.unwrap().expect("list sandboxes");
    assert!(sandboxes.is_empty());
    let absent = g.send(GetContainerStatus { id: "no-such-container".into(), verbose: false }).await.unwrap();
    assert_eq!(absent.expect_err("absent container").kind(), CriErrorKind::NotFound);

    g.send(RemoveImage { image: spec(&pushed.reference) }).await.unwrap().expect("remove by tag");
    let gone =
        g.send(GetImageStatus { image: spec(&pushed.config_digest), verbose: false }).await.unwrap().expect("status");
    assert_eq!(gone.image, None, "removing by tag removed the image");
    g.send(RemoveImage { image: spec(&pushed.reference) }).await.unwrap().expect("removing an absent image succeeds");

    // --- a missing image is NotFound ---
    let missing = format!("{}/imaged/does-not-exist:v1", env.registry_open);
    let e = g.send(PullImage::new(spec(&missing))).await.unwrap().expect_err("missing");
    assert_eq!(e.kind(), CriErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("not found"), "{e}");
    assert!(!e.is_retryable());

    // --- auth registry: refused without credentials, pulled with them ---
    let auth_reg = Registry::with_auth(&env.registry_auth, &env.user, &env.pass);
    let private = auth_reg
        .push_image("imaged/real-private", "v1", &[("etc/secret.txt", b"private layer\n")])
        .await
        .expect("push to the auth registry");
    let e = g.send(PullImage::new(spec(&private.reference))).await.unwrap().expect_err("no credentials");
    assert_eq!(e.kind(), CriErrorKind::Unauthorized, "{e}");
    assert!(e.to_string().contains("401 Unauthorized"), "{e}");

    let wrong = AuthConfig::basic(env.registry_auth.clone(), env.user.clone(), "not-the-password");
    let e = g
        .send(PullImage { auth: Some(wrong), ..PullImage::new(spec(&private.reference)) })
        .await
        .unwrap()
        .expect_err("wrong password");
    assert_eq!(e.kind(), CriErrorKind::Unauthorized, "{e}");
    assert!(!format!("{e} {e:?}").contains("not-the-password"));

    // A scheme-less server address (what users write) works: imaged adds one.
    let right = AuthConfig::basic(env.registry_auth.clone(), env.user.clone(), env.pass.clone());
    let id = g
        .send(PullImage { auth: Some(right), ..PullImage::new(spec(&private.reference)) })
        .await
        .unwrap()
        .expect("pull with credentials");
    assert_eq!(id, private.config_digest);
    g.send(RemoveImage { image: spec(&id) }).await.unwrap().expect("remove by id");

    // --- the gateway's fault plan works in front of a real runtime too ---
    let fast = CriSettings { deadlines: CriDeadlines::uniform(Some(Duration::from_millis(300))), ..cfg.clone() };
    let (g2, _) = CriGatewayActor::connect(&endpoint, &fast).await.expect("second gateway");
    g2.send(SetFaultPlan(FaultPlan::new(3).rule(FaultRule::on(Rpc::ImageStatus).times(1).hang()))).await.unwrap();
    let e = g2.send(GetImageStatus { image: spec("busybox"), verbose: false }).await.unwrap().expect_err("hang");
    assert_eq!(e.kind(), CriErrorKind::DeadlineExceeded);
    let st = g2.send(GetImageStatus { image: spec("busybox"), verbose: false }).await.unwrap().expect("then served");
    assert_eq!(st.image, None);

    ensure_flow(&env, g.clone()).await;
    preloaded_name_flow(&env, g.clone()).await;
    node_credentials_flow(&env, g.clone()).await;
    downloads_flow(&env, g.clone()).await;
    gc_flow(&env, g).await;
    daemon_flow(&env).await;
}

/// `imaged run` on containerd, and every `imagectl` subcommand against it.
async fn daemon_flow(env: &ContainerdEnv) {
    use support::daemon::{Daemon, stderr, stdout};
    let open = Registry::open(&env.registry_open);
    let pushed = open
        .push_image("imaged/real-daemon", "v1", &[("etc/daemon.txt", b"pulled through imaged run\n")])
        .await
        .expect("push for the daemon");
    let endpoint = env.endpoint();
    let d = Daemon::start(&["--runtime-endpoint", &endpoint, "--set", "runtime.startup_timeout=20s"]);

    let o = d.imagectl(&["ensure", &pushed.reference, "--pod", "ns/daemon-pod", "--pod-uid", "d1"]);
    assert_eq!(o.status.code(), Some(0), "{} {}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains(&pushed.config_digest), "{}", stdout(&o));
    assert!(stderr(&o).contains("Successfully pulled image"), "{}", stderr(&o));

    let missing = format!("{}/imaged/not-there:v1", env.registry_open);
    let o = d.imagectl(&["ensure", &missing, "--pod-uid", "d2"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stdout(&o).starts_with("ErrImagePull: "), "{}", stdout(&o));

    // Prefetch through containerd: pulled in the background, then a pod
    // finds it present; nothing is left in the queue.
    let pre = open
        .push_image("imaged/real-prefetch", "v1", &[("etc/prefetch.txt", b"prefetched\n")])
        .await
        .expect("push for the prefetch");
    let o = d.imagectl(&["prefetch", "--wait", &pre.reference]);
    assert_eq!(o.status.code(), Some(0), "{} {}", stdout(&o), stderr(&o));
    assert_eq!(stdout(&o).trim(), format!("{}: pulled ({})", pre.reference, pre.config_digest));
    let o = d.imagectl(&["ensure", &pre.reference, "--pod-uid", "d3"]);
    assert!(stdout(&o).contains("already present on machine"), "{}", stdout(&o));
    let o = d.imagectl(&["prefetch", "--wait", &missing]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(
        stdout(&o).contains(": failed: Failed to pull image ") && stdout(&o).contains("NotFound"),
        "{}",
        stdout(&o)
    );
    let o = d.imagectl(&["pulls"]);
    assert!(stdout(&o).contains("(no pulls running or waiting)"), "{}", stdout(&o));

    let o = d.imagectl(&["images"]);
    assert!(stdout(&o).contains(&pushed.reference), "{}", stdout(&o));
    let o = d.imagectl(&["-o", "json", "images"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(v["images"].as_array().is_some_and(|a| a.iter().any(|i| i["id"] == pushed.config_digest.as_str())), "{v}");

    let o = d.imagectl(&["gc", "--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("keep: in use by ensured recently"), "{}", stdout(&o));

    let o = d.imagectl(&["events"]);
    assert!(stdout(&o).contains("ns/daemon-pod") && stdout(&o).contains("Pulled"), "{}", stdout(&o));

    let o = d.imagectl(&["backoff", "list"]);
    assert!(stdout(&o).contains("not-there"), "{}", stdout(&o));
    let o = d.imagectl(&["backoff", "clear", "--pod-uid", "d2"]);
    assert_eq!(stdout(&o).trim(), "cleared back-off for 1 key(s)");

    let o = d.imagectl(&["status"]);
    assert!(stdout(&o).contains("runtime: containerd"), "{}", stdout(&o));

    let o = d.imagectl(&["--runtime-endpoint", &endpoint, "cri", "images"]);
    // crictl's columns: IMAGE, TAG, IMAGE ID, SIZE.
    let (repo, tag) = pushed.reference.rsplit_once(':').expect("a tag");
    assert!(stdout(&o).lines().any(|l| l.split_whitespace().take(2).eq([repo, tag])), "{}", stdout(&o));
    let o = d.imagectl(&["--runtime-endpoint", &endpoint, "cri", "rmi", &pushed.reference]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = d.imagectl(&["gc", "--dry-run"]);
    assert!(!stdout(&o).contains(&pushed.reference), "removed behind the daemon's back: {}", stdout(&o));

    d.signal(nix::sys::signal::Signal::SIGTERM);
    let mut d = d;
    assert_eq!(d.wait_exit(Duration::from_secs(20)), Some(0), "{}", d.log());
}

/// Image GC against containerd: unused images are removed through CRI, a
/// pinned-by-rule image and the sandbox image are kept, and the filesystem
/// is measured with statvfs on the mountpoint containerd reports.
async fn gc_flow(env: &ContainerdEnv, gateway: actix::Addr<CriGatewayActor>) {
    use imaged::actors::gc_executor::DeleteUnusedImages;
    use imaged::gc::capacity::CapacitySource;
    use imaged::gc::plan::{KeepReason, Verdict};
    use imaged::node::{GcParts, GcService};

    let open = Registry::open(&env.registry_open);
    let mut pushed = Vec::new();
    for name in ["gc-unused", "gc-pinned", "gc-pause"] {
        let p = open.push_image(&format!("imaged/{name}"), "v1", &[("etc/name", name.as_bytes())]).await.expect("push");
        gateway.send(PullImage::new(spec(&p.reference))).await.unwrap().expect("pull");
        pushed.push(p);
    }
    let toml = format!(
        "[gc]\nimage_minimum_gc_age = \"0s\"\nsandbox_image = \"{}\"\npinned_images = [\"{}/imaged/gc-pinned:*\"]",
        pushed[2].reference, env.registry_open
    );
    let settings = imaged::config::Config::from_toml(&toml).expect("config").gc;
    let svc =
        GcService::start(&gateway, &settings, CapacitySource::Statvfs { remote_capacity: None }, GcParts::default());
    let plan = svc.executor.send(DeleteUnusedImages { dry_run: true }).await.unwrap().expect("plan");
    assert!(plan.before.capacity > 0, "statvfs measured the containerd mountpoint");
    let verdict = |id: &str| plan.entries.iter().find(|e| e.id == id).map(|e| e.verdict.clone());
    assert!(matches!(verdict(&pushed[1].config_digest), Some(Verdict::Keep(KeepReason::PinnedByRule(_)))));
    assert_eq!(verdict(&pushed[2].config_digest), Some(Verdict::Keep(KeepReason::SandboxImage)));
    let report = svc.executor.send(DeleteUnusedImages { dry_run: false }).await.unwrap().expect("reclaim");
    assert!(report.removed.iter().any(|r| r.id == pushed[0].config_digest), "{:?}", report.removed);
    for (p, present) in [(&pushed[0], false), (&pushed[1], true), (&pushed[2], true)] {
        let st = gateway
            .send(GetImageStatus { image: spec(&p.config_digest), verbose: false })
            .await
            .unwrap()
            .expect("status");
        assert_eq!(st.image.is_some(), present, "{}", p.reference);
    }
}

/// `EnsureImageExists` once against containerd: pull, present, missing,
/// private with credentials.
/// kubernetes/kubernetes#138175's four steps on containerd: one image (same
/// content, so the same id) in an open repository X and a private one Y.
async fn preloaded_name_flow(env: &ContainerdEnv, gateway: actix::Addr<CriGatewayActor>) {
    use imaged::actors::pull_queue::PullQueueSettings;
    use imaged::credentials::PullSecret;
    use imaged::domain::ImageErrorKind;
    use imaged::domain::pull_policy::PullPolicy;
    use imaged::ensure::{EnsureImageRequest, EnsureSettings};

    let files: &[(&str, &[u8])] = &[("etc/shared.txt", b"one image, two repositories\n")];
    let x = Registry::open(&env.registry_open).push_image("imaged/preloaded-x", "v1", files).await.expect("push X");
    let auth_reg = Registry::with_auth(&env.registry_auth, &env.user, &env.pass);
    let y = auth_reg.push_image("imaged/private-y", "v1", files).await.expect("push Y");
    assert_eq!(x.config_digest, y.config_digest, "the same image");
    // 1. Preloaded behind imaged's back (a pull straight to containerd).
    gateway.send(PullImage::new(spec(&x.reference))).await.unwrap().expect("preload X");
    let manager = imaged::testing::start_manager(
        &gateway,
        &PullQueueSettings::default(),
        &imaged::actors::backoff_registry::BackoffSettings::default(),
        EnsureSettings::default(),
    )
    .await
    .expect("manager starts")
    .manager;
    let pod_a = || EnsureImageRequest::new("pod-a", x.reference.clone(), PullPolicy::Never);
    // 2. Pod A: X with Never, no secret.
    assert_eq!(manager.ensure_image_exists(&pod_a()).await.expect("preloaded").image_ref, x.config_digest);
    // 3. Pod B: Y with its secret (default policy for a tag: IfNotPresent).
    let json =
        format!(r#"{{"auths":{{"{}":{{"username":"{}","password":"{}"}}}}}}"#, env.registry_auth, env.user, env.pass);
    let secret = PullSecret::new("team", "regcred", "kubernetes.io/dockerconfigjson")
        .with_data(".dockerconfigjson", json.into_bytes())
        .with_uid("uid-b");
    let mut pod_b = EnsureImageRequest::new("pod-b", y.reference.clone(), PullPolicy::IfNotPresent);
    pod_b.pull_secrets = vec![secret];
    assert_eq!(manager.ensure_image_exists(&pod_b).await.expect("pulled with the secret").image_ref, y.config_digest);
    // 4. Pod A again: X is still preloaded.
    assert_eq!(manager.ensure_image_exists(&pod_a()).await.expect("still preloaded").image_ref, x.config_digest);
    // Y is not: a pod without the secret may not use it.
    let c = manager
        .ensure_image_exists(&EnsureImageRequest::new("pod-c", y.reference.clone(), PullPolicy::Never))
        .await
        .expect_err("Y needs the secret");
    assert_eq!(c.kind, ImageErrorKind::ErrImageNeverPull);
    gateway.send(RemoveImage { image: spec(&x.config_digest) }).await.unwrap().expect("clean up");
}

async fn ensure_flow(env: &ContainerdEnv, gateway: actix::Addr<CriGatewayActor>) {
    use imaged::actors::pull_queue::PullQueueSettings;
    use imaged::domain::ImageErrorKind;
    use imaged::domain::pull_policy::PullPolicy;
    use imaged::ensure::{EnsureImageRequest, EnsureSettings};

    let manager = imaged::testing::start_manager(
        &gateway,
        &PullQueueSettings::default(),
        &imaged::actors::backoff_registry::BackoffSettings::default(),
        EnsureSettings::default(),
    )
    .await
    .expect("manager starts")
    .manager;
    let open = Registry::open(&env.registry_open);
    let pushed = open.push_image("imaged/ensure", "v1", &[("etc/ensure.txt", b"ensured\n")]).await.expect("push");

    let ok = manager
        .ensure_image_exists(&EnsureImageRequest::new("pod-a", pushed.reference.clone(), PullPolicy::IfNotPresent))
        .await
        .expect("pulled by EnsureImageExists");
    assert_eq!(ok.image_ref, pushed.config_digest);
    assert_eq!(ok.message, "");
    let again = manager
        .ensure_image_exists(&EnsureImageRequest::new("pod-b", pushed.reference.clone(), PullPolicy::IfNotPresent))
        .await
        .expect("present");
    assert_eq!(
        again.message,
        format!("Container image \"{}\" already present on machine and can be accessed by the pod", pushed.reference)
    );

    let missing = format!("{}/imaged/ensure-missing:v1", env.registry_open);
    let err = manager
        .ensure_image_exists(&EnsureImageRequest::new("pod-a", missing.clone(), PullPolicy::IfNotPresent))
        .await
        .expect_err("missing");
    assert_eq!(err.kind, ImageErrorKind::ErrImagePull);
    assert!(
        err.message.starts_with("rpc error: code = NotFound desc = failed to pull and unpack image"),
        "{}",
        err.message
    );
    let backoff = manager
        .ensure_image_exists(&EnsureImageRequest::new("pod-a", missing.clone(), PullPolicy::IfNotPresent))
        .await
        .expect_err("back-off");
    assert_eq!(backoff.kind, ImageErrorKind::ImagePullBackOff);
    assert_eq!(backoff.message, format!("Back-off pulling image \"{missing}\": ErrImagePull: {}", err.message));

    let auth_reg = Registry::with_auth(&env.registry_auth, &env.user, &env.pass);
    let private = auth_reg.push_image("imaged/ensure-private", "v1", &[("etc/p.txt", b"p\n")]).await.expect("push");
    let mut req = EnsureImageRequest::new("pod-c", private.reference.clone(), PullPolicy::Always);
    req.credentials = vec![
        AuthConfig::basic(env.registry_auth.clone(), env.user.clone(), "wrong-first"),
        AuthConfig::basic(env.registry_auth.clone(), env.user.clone(), env.pass.clone()),
    ];
    let ok = manager.ensure_image_exists(&req).await.expect("second credential works");
    assert_eq!(ok.image_ref, private.config_digest);

    // A dockerconfigjson pull secret supplies the credentials.
    let other = auth_reg.push_image("imaged/ensure-secret", "v1", &[("etc/s.txt", b"s\n")]).await.expect("push");
    let json = format!(
        r#"{{"auths":{{"{}":{{"auth":"{}"}}}}}}"#,
        env.registry_auth,
        base64_encode(&format!("{}:{}", env.user, env.pass))
    );
    let mut req = EnsureImageRequest::new("pod-d", other.reference.clone(), PullPolicy::IfNotPresent);
    req.pull_secrets = vec![
        imaged::credentials::PullSecret::new("default", "regcred", "kubernetes.io/dockerconfigjson")
            .with_data(".dockerconfigjson", json.into_bytes()),
    ];
    let ok = manager.ensure_image_exists(&req).await.expect("pulled with the secret");
    assert_eq!(ok.image_ref, other.config_digest);

    // KEP-2535: a pod without the secret does not get the cached private
    // image: it must pull, and containerd's registry says no.
    let no_secret = EnsureImageRequest::new("pod-e", other.reference.clone(), PullPolicy::IfNotPresent);
    let e = manager.ensure_image_exists(&no_secret).await.expect_err("refused without the secret");
    assert_eq!(e.kind, ImageErrorKind::ErrImagePull);
    assert!(e.message.contains("401 Unauthorized"), "{}", e.message);
    assert!(!e.message.contains(&env.pass), "{}", e.message);
    // The same credential in another secret: served from the node, no pull.
    let mut copy = req.clone();
    copy.pod.uid = "pod-f".into();
    copy.pull_secrets = vec![
        imaged::credentials::PullSecret::new("other-ns", "copy", "kubernetes.io/dockerconfigjson")
            .with_data(".dockerconfigjson", req.pull_secrets[0].data[".dockerconfigjson"].clone())
            .with_uid("uid-copy"),
    ];
    let ok = manager.ensure_image_exists(&copy).await.expect("same credential");
    assert_eq!(
        ok.message,
        format!("Container image \"{}\" already present on machine and can be accessed by the pod", other.reference)
    );
}

fn base64_encode(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Node credentials against containerd and the htpasswd registry: the
/// node's `config.json` alone, then a credential-provider plugin alone,
/// supplies the password; a plugin's wrong password gives `ErrImagePull`
/// with containerd's reason and without the password.
async fn node_credentials_flow(env: &ContainerdEnv, gateway: actix::Addr<CriGatewayActor>) {
    use std::os::unix::fs::PermissionsExt as _;
    use std::sync::Arc;

    use imaged::actors::pull_queue::PullQueueSettings;
    use imaged::credentials::{CredentialProviders, DockerConfigSearch, NodeConfigFiles, NodeCredentials};
    use imaged::domain::ImageErrorKind;
    use imaged::domain::pull_policy::PullPolicy;
    use imaged::ensure::{EnsureImageRequest, EnsureSettings};

    let auth_reg = Registry::with_auth(&env.registry_auth, &env.user, &env.pass);
    let by_file = auth_reg.push_image("imaged/node-file", "v1", &[("etc/f.txt", b"f\n")]).await.expect("push");
    let by_plugin = auth_reg.push_image("imaged/node-plugin", "v1", &[("etc/p.txt", b"p\n")]).await.expect("push");
    let refused = auth_reg.push_image("imaged/node-refused", "v1", &[("etc/r.txt", b"r\n")]).await.expect("push");

    let dir = tempfile::tempdir().expect("tempdir");
    let reg = &env.registry_auth;
    let config = format!(
        r#"{{"auths":{{"{reg}/imaged/node-file":{{"auth":"{}"}}}}}}"#,
        base64_encode(&format!("{}:{}", env.user, env.pass))
    );
    std::fs::write(dir.path().join("config.json"), config).expect("write");
    let files = NodeConfigFiles::new(
        DockerConfigSearch { config_json_dirs: vec![dir.path().to_path_buf()], dockercfg_dirs: vec![] },
        Duration::from_secs(300),
    );
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let script = format!(
        "#!/bin/sh\ncat >/dev/null\ncat <<EOF\n{{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"Image\",\"auth\":{{\"{reg}/imaged/node-plugin\":{{\"username\":\"{u}\",\"password\":\"{p}\"}},\"{reg}/imaged/node-refused\":{{\"username\":\"{u}\",\"password\":\"plugin-wrong-pw\"}}}}}}\nEOF\n",
        u = env.user,
        p = env.pass
    );
    std::fs::write(bin.join("registry-login"), script).expect("write");
    std::fs::set_permissions(bin.join("registry-login"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let conf = dir.path().join("providers.yaml");
    std::fs::write(
        &conf,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: registry-login\n    matchImages: [\"{reg}\"]\n    defaultCacheDuration: 1m\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n"
        ),
    )
    .expect("write");
    let plugins = CredentialProviders::register(
        &conf,
        &bin,
        Duration::from_secs(60),
        imaged::clock::Clock::new(),
        &imaged::metrics::Metrics::default(),
    )
    .expect("registers");
    let manager = imaged::testing::start_manager(
        &gateway,
        &PullQueueSettings::default(),
        &imaged::actors::backoff_registry::BackoffSettings::default(),
        EnsureSettings::default(),
    )
    .await
    .expect("manager starts")
    .manager
    .with_node_credentials(Arc::new(NodeCredentials::new(Some(files), plugins)));

    let ok = manager
        .ensure_image_exists(&EnsureImageRequest::new("pod-n1", by_file.reference.clone(), PullPolicy::Always))
        .await
        .expect("the node's config.json supplies the credentials");
    assert_eq!(ok.image_ref, by_file.config_digest);
    let ok = manager
        .ensure_image_exists(&EnsureImageRequest::new("pod-n2", by_plugin.reference.clone(), PullPolicy::Always))
        .await
        .expect("the plugin supplies the credentials");
    assert_eq!(ok.image_ref, by_plugin.config_digest);
    let err = manager
        .ensure_image_exists(&EnsureImageRequest::new("pod-n3", refused.reference.clone(), PullPolicy::Always))
        .await
        .expect_err("the plugin's password is wrong");
    assert_eq!(err.kind, ImageErrorKind::ErrImagePull);
    assert!(err.message.contains("401 Unauthorized") && !err.message.contains("plugin-wrong-pw"), "{}", err.message);
}

/// Bytes that do not compress (so a layer's size is its data's), one
/// sequence per seed.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A loopback TCP forwarder to `upstream` whose answers flow at about
/// 1.6 MB/s (16 KiB every 10 ms), and not at all while `paused`: a slow
/// registry, and a stalled one. Returns its `127.0.0.1:PORT`.
async fn throttled_proxy(upstream: String, paused: std::sync::Arc<std::sync::atomic::AtomicBool>) -> String {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
    let addr = listener.local_addr().expect("proxy address").to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(up) = tokio::net::TcpStream::connect(&upstream).await else { continue };
            let paused = paused.clone();
            tokio::spawn(async move {
                let (mut client_read, mut client_write) = client.into_split();
                let (mut up_read, mut up_write) = up.into_split();
                let requests = tokio::io::copy(&mut client_read, &mut up_write);
                let answers = async {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = up_read.read(&mut buf).await?;
                        if n == 0 {
                            return Ok::<_, std::io::Error>(());
                        }
                        while paused.load(Ordering::Acquire) {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        client_write.write_all(&buf[..n]).await?;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                };
                let _ = tokio::join!(requests, answers);
            });
        }
    });
    addr
}

/// A pull queue and ensure flow over `gateway` with `settings`.
async fn manager_with(
    gateway: &actix::Addr<CriGatewayActor>,
    settings: &imaged::actors::pull_queue::PullQueueSettings,
) -> imaged::ensure::ImageManager {
    imaged::testing::start_manager(
        gateway,
        settings,
        &imaged::actors::backoff_registry::BackoffSettings::default(),
        imaged::ensure::EnsureSettings::default(),
    )
    .await
    .expect("manager starts")
    .manager
}

/// The first layer download containerd lists part-written (within 30 s).
async fn layer_download(gateway: &actix::Addr<CriGatewayActor>) -> imaged::domain::Download {
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let listed = gateway.send(ListDownloads).await.unwrap().expect("containerd lists its downloads");
        if let Some(d) = listed.into_iter().find(|d| d.reference.starts_with("layer-") && d.offset > 0) {
            return d;
        }
        assert!(std::time::Instant::now() < give_up, "no layer download seen in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// containerd's downloads (its content service's ingests) through the
/// gateway, and the pull queue's stall warning, on a pull from a registry
/// behind a throttled proxy that is then paused.
async fn downloads_flow(env: &ContainerdEnv, gateway: actix::Addr<CriGatewayActor>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use imaged::actors::pull_queue::PullQueueSettings;
    use imaged::domain::pull_policy::PullPolicy;
    use imaged::ensure::EnsureImageRequest;

    let Some(dir) =
        env.vars.get("CONTAINERD_ENV_DIR").map(std::path::PathBuf::from).filter(|d| d.join("certs.d").is_dir())
    else {
        eprintln!(
            "downloads_flow: skipped (this containerd reads no hosts.toml: CONTAINERD_ENV_REGISTRY_CONFIG=mirrors)"
        );
        return;
    };
    const SIZE: usize = 6 << 20;
    let pushed = Registry::open(&env.registry_open)
        .push_image("imaged/slow", "v1", &[("slow.bin", &noise(SIZE, 1))])
        .await
        .expect("push");
    let paused = Arc::new(AtomicBool::new(false));
    let proxy = throttled_proxy(env.registry_open.clone(), paused.clone()).await;
    // containerd reads hosts.toml at each pull: plain HTTP to the proxy.
    let hosts = dir.join("certs.d").join(&proxy);
    std::fs::create_dir_all(&hosts).expect("hosts dir");
    let toml =
        format!("server = \"http://{proxy}\"\n\n[host.\"http://{proxy}\"]\n  capabilities = [\"pull\", \"resolve\"]\n");
    std::fs::write(hosts.join("hosts.toml"), toml).expect("hosts.toml");
    let image = pushed.reference.replacen(&env.registry_open, &proxy, 1);

    let metrics = imaged::metrics::Metrics::new();
    let settings = PullQueueSettings {
        stall_warning: Some(Duration::from_secs(1)),
        metrics: metrics.clone(),
        ..Default::default()
    };
    let manager = manager_with(&gateway, &settings).await;
    let stalls = move || {
        let s = imaged::testing::Scrape::parse(&metrics.encode()).expect("the scrape parses");
        s.value("imaged_pull_stalled_downloads_total", &[]).expect("the counter is exported")
    };
    let wanted = image.clone();
    let pull = actix::spawn(async move {
        manager.ensure_image_exists(&EnsureImageRequest::new("pod-slow", wanted, PullPolicy::IfNotPresent)).await
    });

    // containerd lists the layer's download, part written.
    let layer = layer_download(&gateway).await;
    assert_eq!(layer.reference, format!("layer-{}", layer.digest), "{layer:?}");
    assert!(layer.total >= SIZE as u64 && layer.offset < layer.total, "{layer:?}");
    assert!(layer.updated >= layer.started, "{layer:?}");
    assert_eq!(stalls(), 0.0, "a slow but moving download is no stall");

    // The registry stops answering: the download stops, and the queue
    // warns of it once.
    paused.store(true, Ordering::Release);
    let give_up = std::time::Instant::now() + Duration::from_secs(20);
    while stalls() < 1.0 {
        assert!(std::time::Instant::now() < give_up, "no stall warned of in 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listed = gateway.send(ListDownloads).await.unwrap().expect("listed");
    let held = listed.iter().find(|d| d.reference == layer.reference).expect("the stalled download is still listed");
    assert!(held.idle(std::time::SystemTime::now()) >= Duration::from_secs(1), "{held:?}");
    assert!(held.offset >= layer.offset && held.offset < held.total, "{held:?}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(stalls(), 1.0, "warned once per stall");

    // It moves again: the pull ends well and its download is gone.
    paused.store(false, Ordering::Release);
    let ok = pull.await.expect("the pull's task").expect("the pull ends once the registry answers again");
    assert_eq!(ok.image_ref, pushed.config_digest);
    let listed = gateway.send(ListDownloads).await.unwrap().expect("listed");
    assert!(listed.iter().all(|d| d.reference != layer.reference), "{listed:?}");
    gateway.send(RemoveImage { image: spec(&image) }).await.unwrap().expect("remove");

    // pull.stall_timeout: the same stall ends the pull's call, which
    // containerd cancels; the pull fails as the registry unavailable.
    let other = Registry::open(&env.registry_open)
        .push_image("imaged/stuck", "v1", &[("stuck.bin", &noise(SIZE, 2))])
        .await
        .expect("push");
    let image = other.reference.replacen(&env.registry_open, &proxy, 1);
    paused.store(false, Ordering::Release);
    let settings =
        PullQueueSettings { stall_warning: None, stall_timeout: Some(Duration::from_secs(1)), ..Default::default() };
    let manager = manager_with(&gateway, &settings).await;
    let wanted = image.clone();
    let pull = actix::spawn(async move {
        manager.ensure_image_exists(&EnsureImageRequest::new("pod-stuck", wanted, PullPolicy::IfNotPresent)).await
    });
    layer_download(&gateway).await;
    paused.store(true, Ordering::Release);
    let failed = tokio::time::timeout(Duration::from_secs(20), pull)
        .await
        .expect("the stalled pull ends within 20 s")
        .expect("the pull's task")
        .expect_err("a stalled pull fails");
    let text = failed.to_string();
    assert!(text.contains("RegistryUnavailable") && text.contains("pull.stall_timeout 1s"), "{text}");
    let status = gateway.send(GetImageStatus { image: spec(&image), verbose: false }).await.unwrap().expect("status");
    assert_eq!(status.image, None, "containerd did not finish the cancelled pull");
    paused.store(false, Ordering::Release);

    // pull.min_download_rate: the proxy's 1.6 MB/s never stops, but it is
    // under a 4 MiB/s floor, so the moving download counts as stalled and
    // the pull ends well before its 4 s.
    let dripping = Registry::open(&env.registry_open)
        .push_image("imaged/drip", "v1", &[("drip.bin", &noise(SIZE, 3))])
        .await
        .expect("push");
    let image = dripping.reference.replacen(&env.registry_open, &proxy, 1);
    let settings = PullQueueSettings {
        stall_warning: None,
        stall_timeout: Some(Duration::from_secs(1)),
        min_download_rate: 4 << 20,
        ..Default::default()
    };
    let manager = manager_with(&gateway, &settings).await;
    let wanted = image.clone();
    let failed = tokio::time::timeout(
        Duration::from_secs(20),
        manager.ensure_image_exists(&EnsureImageRequest::new("pod-drip", wanted, PullPolicy::IfNotPresent)),
    )
    .await
    .expect("the dripping pull ends within 20 s")
    .expect_err("a pull under the floor fails");
    let text = failed.to_string();
    assert!(
        text.contains("RegistryUnavailable")
            && text.contains("under pull.min_download_rate (4194304 bytes/s)")
            && text.contains("pull.stall_timeout 1s"),
        "{text}"
    );
    let status = gateway.send(GetImageStatus { image: spec(&image), verbose: false }).await.unwrap().expect("status");
    assert_eq!(status.image, None, "containerd did not finish the cancelled pull");
}
