//! Finds the throw-away containerd + registries started by `.ci/containerd-env.sh up DIR`.
//!
//! The script writes `DIR/env` (`KEY=VALUE` lines). Tests get its path from the environment
//! variable [`ENV_VAR`] (`IMAGED_CONTAINERD_ENV=DIR/env`). When that variable is unset the
//! environment is absent: [`ContainerdEnv::load`] returns `None` and the test should skip —
//! except in CI (`CI=true`), where [`ContainerdEnv::for_test`] panics so a missing setup can
//! never turn into a silently skipped test.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Environment variable holding the path of the `env` file written by `containerd-env.sh up`.
pub const ENV_VAR: &str = "IMAGED_CONTAINERD_ENV";

/// The running test environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerdEnv {
    /// containerd's gRPC (and CRI) unix socket path (`CONTAINERD_SOCK`).
    pub socket: PathBuf,
    /// `127.0.0.1:PORT` of the registry without auth (`REGISTRY_OPEN`).
    pub registry_open: String,
    /// `127.0.0.1:PORT` of the registry with htpasswd Basic auth (`REGISTRY_AUTH`).
    pub registry_auth: String,
    /// User for `registry_auth` (`REGISTRY_USER`).
    pub user: String,
    /// Password for `registry_auth` (`REGISTRY_PASS`).
    pub pass: String,
    /// All `KEY=VALUE` pairs of the file, including pid files and `CONTAINERD_ENV_DIR`.
    pub vars: HashMap<String, String>,
}

impl ContainerdEnv {
    /// `unix:///path/containerd.sock`, the form CRI clients (crictl, kubelet) take.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Parses an `env` file.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {} ({ENV_VAR}): {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the `KEY=VALUE` text (blank lines and `#` comments ignored, no quoting).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut vars = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) =
                line.split_once('=').ok_or_else(|| format!("line {}: expected KEY=VALUE, got {line:?}", n + 1))?;
            vars.insert(k.trim().to_string(), v.trim().to_string());
        }
        let get = |k: &str| -> Result<String, String> {
            match vars.get(k) {
                Some(v) if !v.is_empty() => Ok(v.clone()),
                _ => Err(format!("missing {k}")),
            }
        };
        Ok(ContainerdEnv {
            socket: PathBuf::from(get("CONTAINERD_SOCK")?),
            registry_open: get("REGISTRY_OPEN")?,
            registry_auth: get("REGISTRY_AUTH")?,
            user: get("REGISTRY_USER")?,
            pass: get("REGISTRY_PASS")?,
            vars,
        })
    }

    /// `Ok(None)` when [`ENV_VAR`] is unset or empty; the parsed file otherwise.
    pub fn try_load() -> Result<Option<Self>, String> {
        match std::env::var_os(ENV_VAR) {
            None => Ok(None),
            Some(p) if p.is_empty() => Ok(None),
            Some(p) => Self::from_file(Path::new(&p)).map(Some),
        }
    }

    /// `None` when [`ENV_VAR`] is unset. Panics when it is set but the file is unusable
    /// (a broken setup must fail the test, not skip it).
    pub fn load() -> Option<Self> {
        match Self::try_load() {
            Ok(env) => env,
            Err(e) => panic!("{ENV_VAR} is set but unusable: {e}"),
        }
    }

    /// For a test: the environment, or `None` after printing a skip note when it is absent
    /// locally. Panics when absent under `CI=true` (CI always runs `containerd-env.sh up`).
    pub fn for_test(test: &str) -> Option<Self> {
        let env = Self::load();
        if env.is_none() {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(!ci, "{test}: {ENV_VAR} is not set under CI=true; .ci/run must start .ci/containerd-env.sh up");
            eprintln!("{test}: skipped, {ENV_VAR} not set (run .ci/containerd-env.sh up DIR and set it to DIR/env)");
        }
        env
    }
}

/// `.ci/containerd-env.sh` of this checkout.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".ci/containerd-env.sh")
}

/// An environment a test started: stopped (`containerd-env.sh down`) and its
/// directory removed on drop, also when the test panics.
pub struct Started {
    pub dir: PathBuf,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(script()).arg("down").arg(&self.dir).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether `bin` is on the `PATH`.
pub fn have(bin: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {bin}")).output().is_ok_and(|o| o.status.success())
}

/// The environment for `test`: the one named by [`ENV_VAR`], or one started
/// here under `/tmp/imaged-ctrd-PID` (stopped when the [`Started`] drops).
/// `None` after a skip line when the tools are missing locally; a panic
/// when they are missing under `CI=true`.
pub fn environment(test: &str) -> Option<(ContainerdEnv, Option<Started>)> {
    if std::env::var_os(ENV_VAR).is_some() {
        return ContainerdEnv::for_test(test).map(|e| (e, None));
    }
    let tools = ["containerd", "ctr", "docker-registry", "htpasswd"];
    let missing: Vec<&str> = tools.into_iter().filter(|b| !have(b)).collect();
    if !missing.is_empty() {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        assert!(!ci, "{test}: {missing:?} not installed under CI=true (.ci/run installs them)");
        eprintln!(
            "{test}: skipped, {missing:?} not installed (apt-get install containerd docker-registry apache2-utils)"
        );
        return None;
    }
    // Short path: unix socket paths are limited to ~100 bytes.
    let dir = PathBuf::from(format!("/tmp/imaged-ctrd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create env dir");
    let started = Started { dir: dir.clone() };
    let status = Command::new("bash").arg(script()).arg("up").arg(&dir).status().expect("run containerd-env.sh");
    assert!(status.success(), "containerd-env.sh up failed; logs in {}", dir.display());
    let env = ContainerdEnv::from_file(&dir.join("env")).expect("env file");
    Some((env, Some(started)))
}

/// Runs `body` in the environment for `test` (skipping as [`environment`]
/// says); when it panics, the last log lines of what this test started are
/// printed, the environment is stopped, and the panic goes on.
pub fn with_environment(test: &str, body: impl FnOnce(ContainerdEnv) + std::panic::UnwindSafe) {
    let Some((env, started)) = environment(test) else { return };
    let result = std::panic::catch_unwind(move || body(env));
    if result.is_err()
        && let Some(s) = &started
    {
        dump_logs(&s.dir);
    }
    drop(started);
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

/// Prints the last 30 lines of each log of the environment in `dir`.
pub fn dump_logs(dir: &Path) {
    for log in ["containerd.log", "registry-open.log", "registry-auth.log"] {
        if let Ok(text) = std::fs::read_to_string(dir.join(log)) {
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            eprintln!("--- {log} (last lines) ---");
            for l in tail.into_iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}
