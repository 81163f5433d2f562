//! The Python example client (`examples/python/imaged_client.py`, grpcio)
//! against a running daemon: the API socket, the CRI socket in the
//! kubelet's path and the embedded runtime's socket. Runs where Python has
//! `grpcio` and `grpcio-tools` (`examples/python/requirements.txt`; `.ci/run`
//! installs them and names its Python in `IMAGED_PYTHON`); required in CI.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

mod support;

use std::process::{Command, Output};

use support::daemon::{Daemon, stderr, stdout};

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/python/imaged_client.py");

/// The Python to run, if it has grpcio and grpcio-tools.
fn python() -> Option<String> {
    let python = std::env::var("IMAGED_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python).args(["-c", "import grpc, grpc_tools"]).output().is_ok_and(|o| o.status.success());
    if ok {
        return Some(python);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{python} lacks grpcio/grpcio-tools: .ci/run installs examples/python/requirements.txt"
    );
    eprintln!("skipped: {python} has no grpcio and grpcio-tools (pip install -r examples/python/requirements.txt)");
    None
}

fn client(python: &str, args: &[&str]) -> Output {
    Command::new(python).arg(CLIENT).args(args).output().expect("run the Python client")
}

fn json(o: &Output) -> serde_json::Value {
    assert_eq!(o.status.code(), Some(0), "stdout: {}\nstderr: {}", stdout(o), stderr(o));
    serde_json::from_str(stdout(o).trim()).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// What grpcio reports for a call h2 refused over its :authority.
fn assert_refused_for_its_authority(o: &Output) {
    assert_eq!(o.status.code(), Some(1), "stdout: {}\nstderr: {}", stdout(o), stderr(o));
    assert!(
        stderr(o).contains("INTERNAL") && stderr(o).contains("RST_STREAM") && stderr(o).contains("error code 1"),
        "{}",
        stderr(o)
    );
}

#[test]
fn a_python_grpcio_client_talks_to_every_socket_with_the_authority_fix() {
    let Some(python) = python() else { return };
    let probe = tempfile::Builder::new().prefix("imp").tempdir_in("/tmp").expect("tempdir");
    let front = probe.path().join("front.sock");
    let d = Daemon::start(&["--set", &format!("cri_server.socket={}", front.display())]);
    let api = d.socket.to_str().expect("utf-8").to_string();
    let embedded = d.dir.path().join("cri.sock").to_str().expect("utf-8").to_string();
    let front = front.to_str().expect("utf-8").to_string();

    // The API socket.
    let status = json(&client(&python, &["--socket", &api, "status"]));
    assert_eq!(status["runtime_name"], "imaged-embedded", "{status}");
    let ensured = client(&python, &["--socket", &api, "ensure", "busybox:1.36", "--pod", "default/py-1"]);
    let ensured = json(&ensured);
    let image_ref = ensured["ok"]["image_ref"].as_str().unwrap_or_else(|| panic!("{ensured}")).to_string();
    assert!(image_ref.starts_with("sha256:"), "{ensured}");
    let images = json(&client(&python, &["--socket", &api, "images"]));
    assert!(images["images"].as_array().expect("images").iter().any(|i| i["id"] == image_ref.as_str()), "{images}");
    // An image that cannot be pulled is a result (exit 2), not an RPC error.
    let missing = client(&python, &["--socket", &api, "ensure", "registry.invalid/none:1", "--pull-policy", "Never"]);
    assert_eq!(missing.status.code(), Some(2), "{}", stderr(&missing));
    assert_eq!(json_any(&missing)["failure"]["kind"], "ErrImageNeverPull");

    // The CRI socket in the kubelet's path, and the embedded runtime's.
    for cri in [&front, &embedded] {
        let listed = json(&client(&python, &["--cri-socket", cri, "cri-images"]));
        assert!(
            listed["images"].as_array().expect("images").iter().any(|i| i["id"] == image_ref.as_str()),
            "{cri}: {listed}"
        );
    }

    // Without the fix, grpcio's default options: every socket refuses every
    // call (hyperium/h2 PR 487). Should h2 ever accept a path authority,
    // this fails: then README's "Python, Java and grpcurl" note can go.
    assert_refused_for_its_authority(&client(&python, &["--no-authority-fix", "--socket", &api, "status"]));
    for cri in [&front, &embedded] {
        assert_refused_for_its_authority(&client(&python, &["--no-authority-fix", "--cri-socket", cri, "cri-images"]));
    }
}

fn json_any(o: &Output) -> serde_json::Value {
    serde_json::from_str(stdout(o).trim()).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}
