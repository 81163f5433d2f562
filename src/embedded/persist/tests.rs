use std::os::unix::fs::PermissionsExt as _;

use super::*;
use crate::domain::ContainerState;
use crate::embedded::{EmbeddedRuntime, RemoteImage};

fn private_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix("emb").tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

fn container(id: &str, image_id: &str) -> Container {
    Container {
        id: id.into(),
        pod_sandbox_id: "sb1".into(),
        name: "app".into(),
        image: ImageSpec::new(image_id),
        image_ref: image_id.into(),
        image_id: image_id.into(),
        state: ContainerState::Running,
        created_at: 42,
        ..Container::default()
    }
}

fn refusal(r: Result<EmbeddedRuntime, EmbeddedError>) -> String {
    match r {
        Ok(_) => panic!("the state directory was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn images_pins_containers_and_sandboxes_survive_a_restart_and_the_catalogue_does_not() {
    let dir = private_dir();
    let state = dir.path().join("state");
    let (busybox, app);
    {
        let rt = EmbeddedRuntime::start_persistent(dir.path().join("a.sock"), &state).unwrap();
        busybox = rt.preload(RemoteImage::new("busybox:1.36", 4_000)).unwrap();
        app = rt.preload(RemoteImage::new("example.com/team/app:v1", 9_000).private("u", "p")).unwrap();
        assert!(rt.set_pinned("busybox:1.36", true));
        rt.add_container(container("c1", &app));
        rt.add_sandbox(PodSandbox {
            id: "sb1".into(),
            name: "web".into(),
            uid: "u1".into(),
            namespace: "ns".into(),
            state: PodSandboxState::Ready,
            ..PodSandbox::default()
        });
        assert_eq!(rt.state_dir(), Some(state.as_path()));
    }
    let mode = std::fs::metadata(state.join(STATE_FILE)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the state file is owner-only");
    assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);

    let rt = EmbeddedRuntime::start_persistent(dir.path().join("b.sock"), &state).unwrap();
    let mut images = rt.images();
    images.sort_by_key(|i| i.size);
    assert_eq!(images.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), [busybox.as_str(), app.as_str()]);
    assert_eq!(images[0].repo_tags, ["docker.io/library/busybox:1.36"]);
    assert!(images[0].repo_digests[0].starts_with("docker.io/library/busybox@sha256:"));
    assert!(images[0].pinned && !images[1].pinned);
    assert_eq!(rt.used_bytes(), 13_000);
    let st = rt.shared.state();
    assert_eq!(st.containers, vec![container("c1", &app)]);
    assert_eq!(st.sandboxes.len(), 1);
    assert_eq!((st.sandboxes[0].uid.as_str(), st.sandboxes[0].state), ("u1", PodSandboxState::Ready));
    assert!(st.catalogue.is_empty(), "the catalogue is configuration: set again by whoever starts the runtime");
}

#[test]
fn a_removal_and_a_removed_container_are_kept_too() {
    let dir = private_dir();
    let state = dir.path().join("s");
    {
        let rt = EmbeddedRuntime::start_persistent(dir.path().join("a.sock"), &state).unwrap();
        let id = rt.preload(RemoteImage::new("redis:7", 10)).unwrap();
        rt.preload(RemoteImage::new("nginx:1.27", 20)).unwrap();
        rt.add_container(container("c1", &id));
        rt.remove_container("c1");
        rt.shared.state().remove_image(&ImageSpec::new("redis:7")).unwrap();
        rt.save().unwrap();
    }
    let rt = EmbeddedRuntime::start_persistent(dir.path().join("a.sock"), &state).unwrap();
    let names: Vec<String> = rt.images().into_iter().flat_map(|i| i.repo_tags).collect();
    assert_eq!(names, ["docker.io/library/nginx:1.27"]);
    assert!(rt.shared.state().containers.is_empty());
}

#[test]
fn a_second_runtime_on_the_same_directory_is_refused_until_the_first_is_gone() {
    let dir = private_dir();
    let first = EmbeddedRuntime::start_persistent(dir.path().join("a.sock"), dir.path()).unwrap();
    let e = refusal(EmbeddedRuntime::start_persistent(dir.path().join("b.sock"), dir.path()));
    assert!(e.contains("another embedded runtime uses it") && e.contains(LOCK_FILE), "{e}");
    drop(first);
    EmbeddedRuntime::start_persistent(dir.path().join("b.sock"), dir.path()).unwrap();
}

#[test]
fn unusable_directories_and_files_are_refused_with_the_reason() {
    let dir = private_dir();
    let sock = dir.path().join("x.sock");

    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let e = refusal(EmbeddedRuntime::start_persistent(&sock, &file));
    assert!(e.contains(&file.display().to_string()), "{e}");

    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = refusal(EmbeddedRuntime::start_persistent(&sock, &open));
    assert!(e.contains("has mode 0777") && e.contains("chmod 0700"), "{e}");

    let junk = dir.path().join("junk");
    std::fs::create_dir(&junk).unwrap();
    std::fs::write(junk.join(STATE_FILE), b"{\"version\":1,\"images\":[{\"id\":").unwrap();
    let e = refusal(EmbeddedRuntime::start_persistent(&sock, &junk));
    assert!(e.contains("is not an embedded-runtime state file") && e.contains("move it aside"), "{e}");

    let newer = dir.path().join("newer");
    std::fs::create_dir(&newer).unwrap();
    std::fs::write(newer.join(STATE_FILE), br#"{"version":2,"images":[]}"#).unwrap();
    let e = refusal(EmbeddedRuntime::start_persistent(&sock, &newer));
    assert!(e.contains("format version 2"), "{e}");
    assert!(!sock.exists(), "nothing was served");
}

#[test]
fn a_write_cut_short_by_a_crash_leaves_the_previous_state() {
    let dir = private_dir();
    {
        let rt = EmbeddedRuntime::start_persistent(dir.path().join("a.sock"), dir.path()).unwrap();
        rt.preload(RemoteImage::new("busybox:1.36", 4)).unwrap();
    }
    // A crash between writing the temporary file and renaming it.
    std::fs::write(dir.path().join(format!("{STATE_FILE}.tmp")), b"{\"version\":1,\"ima").unwrap();
    let rt = EmbeddedRuntime::start_persistent(dir.path().join("a.sock"), dir.path()).unwrap();
    assert_eq!(rt.images().len(), 1);
    rt.preload(RemoteImage::new("redis:7", 4)).unwrap();
    drop(rt);
    let rt = EmbeddedRuntime::start_persistent(dir.path().join("a.sock"), dir.path()).unwrap();
    assert_eq!(rt.images().len(), 2, "the next write replaced the leftover");
}

#[test]
fn a_save_with_nothing_new_writes_nothing_and_a_pull_of_a_present_image_changes_nothing() {
    let dir = private_dir();
    let rt = EmbeddedRuntime::start_persistent(dir.path().join("a.sock"), dir.path()).unwrap();
    rt.preload(RemoteImage::new("busybox:1.36", 4)).unwrap();
    let file = dir.path().join(STATE_FILE);
    std::fs::remove_file(&file).unwrap();
    rt.save().unwrap();
    assert!(!file.exists(), "nothing changed since the last write");
    let generation = rt.shared.state().generation;
    rt.preload(RemoteImage::new("busybox:1.36", 4)).unwrap();
    assert_eq!(rt.shared.state().generation, generation, "the same pull again changes nothing");
    rt.set_pinned("busybox:1.36", true);
    assert!(file.exists(), "a pin is a change");
}
