//! The node's docker config files (the kubelet's default keyring, §7.2):
//! `config.json` searched in a list of directories, then the legacy
//! `.dockercfg` in another; the first file that reads and decodes wins.
//! Re-read at most once per cache period (the kubelet's 5 minutes).
//!
//! Only `auths` is read (no `credHelpers`, `credsStore`, identity or
//! registry tokens), as in the kubelet. Errors and logs name files and
//! fields, never a value.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::keyring::{Credential, Keyring};
use super::secrets::{DockerConfig, parse_docker_config_json, parse_dockercfg};
use crate::clock::Clock;

/// The kubelet's default `--root-dir`, searched first.
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/kubelet";
/// The kubelet's re-read period of node config files.
pub const DEFAULT_CACHE_PERIOD: Duration = Duration::from_secs(5 * 60);
/// File name of a docker `config.json`.
pub const CONFIG_JSON_FILE: &str = "config.json";
/// File name of a legacy `.dockercfg`.
pub const DOCKERCFG_FILE: &str = ".dockercfg";

/// Where node config files are looked for, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerConfigSearch {
    /// Directories searched for `config.json`, in order.
    pub config_json_dirs: Vec<PathBuf>,
    /// Directories searched for `.dockercfg` when no `config.json` was valid.
    pub dockercfg_dirs: Vec<PathBuf>,
}

impl DockerConfigSearch {
    /// The kubelet's order with `root_dir` first: `config.json` in
    /// [root_dir, cwd, `$HOME/.docker`, `/.docker`], then `.dockercfg` in
    /// [root_dir, cwd, `$HOME`, `/`]. An unknown cwd is left out.
    pub fn kubelet_default(root_dir: &Path) -> Self {
        let cwd = std::env::current_dir().ok();
        let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
        Self::kubelet_order(root_dir, cwd.as_deref(), &home)
    }

    /// The kubelet's order for explicit root, working and home directories.
    pub fn kubelet_order(root_dir: &Path, cwd: Option<&Path>, home: &Path) -> Self {
        let with = |dirs: [Option<PathBuf>; 4]| dirs.into_iter().flatten().collect();
        Self {
            config_json_dirs: with([
                Some(root_dir.to_path_buf()),
                cwd.map(Path::to_path_buf),
                Some(home.join(".docker")),
                Some(PathBuf::from("/.docker")),
            ]),
            dockercfg_dirs: with([
                Some(root_dir.to_path_buf()),
                cwd.map(Path::to_path_buf),
                Some(home.to_path_buf()),
                Some(PathBuf::from("/")),
            ]),
        }
    }

    /// Nothing is searched (node config files off).
    pub fn none() -> Self {
        Self { config_json_dirs: Vec::new(), dockercfg_dirs: Vec::new() }
    }

    /// True when no directory is searched.
    pub fn is_empty(&self) -> bool {
        self.config_json_dirs.is_empty() && self.dockercfg_dirs.is_empty()
    }
}

/// No valid file: the kubelet's message, listing the `.dockercfg`
/// directories as Go prints a `[]string`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("couldn't find valid .dockercfg after checking in [{}]", .0.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" "))]
pub struct NoDockerConfig(pub Vec<PathBuf>);

/// A docker config file that was read, and where from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundDockerConfig {
    /// The file (absolute when the directory was relative).
    pub path: PathBuf,
    /// Its entries.
    pub config: DockerConfig,
}

fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

/// The kubelet's `ReadDockerConfigFile`: the first `config.json` in
/// `config_json_dirs` that reads and decodes, else the first such
/// `.dockercfg` in `dockercfg_dirs`. Files that are missing or do not
/// decode are skipped (logged at debug level without their content).
pub fn read_docker_config(search: &DockerConfigSearch) -> Result<FoundDockerConfig, NoDockerConfig> {
    type Parser = fn(&[u8]) -> Result<DockerConfig, super::DockerConfigError>;
    let files = search
        .config_json_dirs
        .iter()
        .map(|d| (d.join(CONFIG_JSON_FILE), parse_docker_config_json as Parser))
        .chain(search.dockercfg_dirs.iter().map(|d| (d.join(DOCKERCFG_FILE), parse_dockercfg as Parser)));
    for (path, parse) in files {
        let path = absolute(path);
        let bytes = match crate::files::read(&path, crate::files::CONFIG_FILE_LIMIT) {
            Ok(b) => b,
            Err(e @ (crate::files::InputFileError::NotRegular | crate::files::InputFileError::TooLarge { .. })) => {
                tracing::warn!(path = %path.display(), "docker config file skipped: {e}");
                continue;
            }
            Err(e) => {
                tracing::trace!(path = %path.display(), "while trying to read {}: {e}", path.display());
                continue;
            }
        };
        match parse(&bytes) {
            Ok(config) => {
                tracing::debug!(path = %path.display(), "found docker config file");
                return Ok(FoundDockerConfig { path, config });
            }
            Err(e) => tracing::debug!(path = %path.display(), "while trying to read {}: {e}", path.display()),
        }
    }
    Err(NoDockerConfig(search.dockercfg_dirs.clone()))
}

/// The keyring of a docker config (node credentials: no source). Entries
/// with invalid registry keys are logged and skipped.
pub fn config_keyring(config: &DockerConfig, origin: &str) -> Keyring {
    let mut keyring = Keyring::new();
    for (registry, entry) in &config.entries {
        let cred = Credential::new(entry.username.clone(), entry.password.clone(), entry.email.clone());
        if let Err(e) = keyring.add(registry, cred) {
            tracing::warn!(origin, "{e}");
        }
    }
    keyring
}

/// The node's docker config files as a keyring, re-read at most once per
/// period (the kubelet's `CachingDockerConfigProvider` over its default
/// provider). Thread-safe; share it behind an `Arc`.
#[derive(Debug)]
pub struct NodeConfigFiles {
    search: DockerConfigSearch,
    period: Duration,
    clock: Clock,
    cached: Mutex<Option<(Instant, Arc<Keyring>)>>,
}

impl NodeConfigFiles {
    /// Files searched as `search` says, re-read at most every `period`
    /// (zero: on every lookup).
    pub fn new(search: DockerConfigSearch, period: Duration) -> Self {
        Self { search, period, clock: Clock::new(), cached: Mutex::new(None) }
    }

    /// The same, reading time from `clock`.
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Where files are searched.
    pub fn search(&self) -> &DockerConfigSearch {
        &self.search
    }

    /// The keyring of the first valid file (empty when none), from the
    /// cache when it was read less than a period ago. Files are read on
    /// tokio's blocking pool, never on the caller's task, and no lock is
    /// held while they are read (two callers at expiry may both read).
    pub async fn keyring(&self) -> Arc<Keyring> {
        let now = self.clock.instant();
        {
            let cached = self.cached.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((expires, keyring)) = cached.as_ref()
                && now < *expires
            {
                return keyring.clone();
            }
        }
        let search = self.search.clone();
        // The caller's subscriber follows the read (its logs stay with it).
        let dispatch = tracing::dispatcher::get_default(std::clone::Clone::clone);
        let read = tokio::task::spawn_blocking(move || {
            tracing::dispatcher::with_default(&dispatch, || read_docker_config(&search))
        })
        .await;
        let keyring = Arc::new(match read {
            Ok(Ok(found)) => config_keyring(&found.config, &found.path.display().to_string()),
            Ok(Err(e)) => {
                tracing::debug!("Docker config file not found: {e}");
                Keyring::new()
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the node's docker config files failed");
                Keyring::new()
            }
        });
        *self.cached.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((now + self.period, keyring.clone()));
        keyring
    }
}

#[cfg(test)]
mod tests;
