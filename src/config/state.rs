//! `[state]`: where imaged keeps its durable records.
//!
//! The kubelet always keeps its pull records on disk; imaged does too
//! unless told otherwise. With no records, an image on the node counts as
//! preloaded, and under the default `NeverVerifyPreloadedImages` any pod may
//! then use it, private or not: forgetting records on a restart would open
//! every private image to every pod. So `dir` unset means a durable default
//! wherever the runtime's images outlive imaged, and only the in-process
//! embedded runtime (whose images vanish with the process) keeps records in
//! memory by default.

use std::path::{Path, PathBuf};

use super::{ConfigError, RuntimeEndpoint, values::invalid};

/// The value of `state.dir` that keeps records in memory only.
pub const MEMORY: &str = "memory";

/// The directory root's records go to when `state.dir` is unset.
pub const SYSTEM_DIR: &str = "/var/lib/imaged";

/// Resolves `state.dir`: a path, `"memory"`, or `""` (the default for
/// `endpoint`). `euid_root` and `env` decide the default for a runtime
/// whose images outlive imaged: [`SYSTEM_DIR`] for root, else
/// `$XDG_STATE_HOME/imaged` or `$HOME/.local/state/imaged`.
pub(super) fn state_dir_from_raw(
    dir: &str,
    endpoint: &RuntimeEndpoint,
    euid_root: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<PathBuf>, ConfigError> {
    match dir {
        MEMORY => Ok(None),
        "" => match endpoint {
            RuntimeEndpoint::Embedded { .. } => Ok(None),
            RuntimeEndpoint::Cri(_) => default_durable_dir(euid_root, env).map(Some),
        },
        path if Path::new(path).is_absolute() => Ok(Some(PathBuf::from(path))),
        other => Err(invalid(
            "state.dir",
            other,
            "must be an absolute path, \"memory\" (records in memory only) or \"\" (the default)",
        )),
    }
}

fn default_durable_dir(euid_root: bool, env: &dyn Fn(&str) -> Option<String>) -> Result<PathBuf, ConfigError> {
    if euid_root {
        return Ok(PathBuf::from(SYSTEM_DIR));
    }
    let absolute = |v: Option<String>| v.filter(|v| Path::new(v).is_absolute()).map(PathBuf::from);
    if let Some(state) = absolute(env("XDG_STATE_HOME")) {
        return Ok(state.join("imaged"));
    }
    if let Some(home) = absolute(env("HOME")) {
        return Ok(home.join(".local/state/imaged"));
    }
    Err(invalid(
        "state.dir",
        "",
        "has no default for a user other than root without $XDG_STATE_HOME or $HOME: set it to a directory \
         imaged can write, or to \"memory\" to keep pull records in memory only",
    ))
}

/// Whether this process runs as root (the default state directory's owner).
pub(super) fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::CriEndpoint;

    fn containerd() -> RuntimeEndpoint {
        RuntimeEndpoint::Cri(CriEndpoint::Unix("/run/containerd/containerd.sock".into()))
    }

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_string())
    }

    #[test]
    fn unset_is_durable_for_a_runtime_whose_images_outlive_imaged() {
        let none = env(&[]);
        assert_eq!(state_dir_from_raw("", &containerd(), true, &none).unwrap(), Some(PathBuf::from("/var/lib/imaged")));
        let xdg = env(&[("XDG_STATE_HOME", "/home/u/.state"), ("HOME", "/home/u")]);
        assert_eq!(
            state_dir_from_raw("", &containerd(), false, &xdg).unwrap(),
            Some(PathBuf::from("/home/u/.state/imaged"))
        );
        let home = env(&[("XDG_STATE_HOME", "relative"), ("HOME", "/home/u")]);
        assert_eq!(
            state_dir_from_raw("", &containerd(), false, &home).unwrap(),
            Some(PathBuf::from("/home/u/.local/state/imaged"))
        );
    }

    #[test]
    fn unset_is_memory_for_the_in_process_embedded_runtime() {
        let embedded = RuntimeEndpoint::Embedded { socket: None };
        assert_eq!(state_dir_from_raw("", &embedded, true, &env(&[])).unwrap(), None);
    }

    #[test]
    fn memory_and_paths_are_taken_as_given() {
        assert_eq!(state_dir_from_raw("memory", &containerd(), true, &env(&[])).unwrap(), None);
        let embedded = RuntimeEndpoint::Embedded { socket: None };
        assert_eq!(
            state_dir_from_raw("/srv/imaged", &embedded, false, &env(&[])).unwrap(),
            Some(PathBuf::from("/srv/imaged"))
        );
    }

    #[test]
    fn a_relative_path_or_no_home_is_refused_naming_the_key() {
        let e = state_dir_from_raw("var/lib/imaged", &containerd(), true, &env(&[])).unwrap_err().to_string();
        assert!(e.contains("state.dir") && e.contains("\"var/lib/imaged\"") && e.contains("absolute path"), "{e}");
        let e = state_dir_from_raw("", &containerd(), false, &env(&[])).unwrap_err().to_string();
        assert!(e.contains("state.dir") && e.contains("\"memory\""), "{e}");
    }
}
