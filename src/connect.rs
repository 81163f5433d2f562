//! Resolves the configured runtime endpoint: a CRI socket, or the embedded
//! runtime started in-process, and connects the CRI gateway to it.

use actix::Addr;

use crate::actors::cri_gateway::CriGatewayActor;
use crate::config::{Config, RuntimeEndpoint};
use crate::cri::CriEndpoint;
use crate::domain::RuntimeVersion;
use crate::embedded::{EmbeddedRuntime, demo_catalogue};
use crate::error::AppError;

/// A connected runtime: the gateway, what the runtime said it is, and the
/// embedded runtime when imaged started one (it stops when this is dropped).
pub struct ConnectedRuntime {
    /// The CRI gateway.
    pub gateway: Addr<CriGatewayActor>,
    /// The runtime's `Version` answer.
    pub version: RuntimeVersion,
    /// The endpoint connected to.
    pub endpoint: CriEndpoint,
    /// The in-process embedded runtime, if the endpoint is `embedded`.
    pub embedded: Option<EmbeddedRuntime>,
}

impl std::fmt::Debug for ConnectedRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectedRuntime")
            .field("endpoint", &self.endpoint)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl ConnectedRuntime {
    /// The clock the runtime's download times are on: the system's for a
    /// runtime of its own (containerd stamps its ingests with it), the
    /// embedded runtime's own otherwise.
    pub fn downloads_clock(&self) -> crate::clock::Clock {
        self.embedded.as_ref().map_or_else(crate::clock::Clock::system, EmbeddedRuntime::downloads_clock)
    }
}

/// Starts the embedded runtime if configured (with the demo catalogue, and
/// its state directory when `runtime.embedded_state_dir` names one) and
/// connects a CRI gateway to the runtime. Must run inside an actix System.
pub async fn runtime(cfg: &Config) -> Result<ConnectedRuntime, AppError> {
    let (endpoint, embedded) = match &cfg.endpoint {
        RuntimeEndpoint::Cri(e) => (e.clone(), None),
        RuntimeEndpoint::Embedded { socket } => {
            let path = match socket {
                Some(path) => path.clone(),
                None => {
                    let dir = std::env::temp_dir();
                    let removed = remove_stale_embedded_sockets(&dir);
                    if removed > 0 {
                        tracing::info!(removed, dir = %dir.display(), "removed embedded-runtime sockets of imaged processes that are gone");
                    }
                    dir.join(format!("{EMBEDDED_SOCKET_PREFIX}{}.sock", std::process::id()))
                }
            };
            let rt = match &cfg.embedded_state_dir {
                Some(dir) => EmbeddedRuntime::start_persistent(path, dir)?,
                None => EmbeddedRuntime::start(path)?,
            };
            for img in demo_catalogue() {
                rt.add_remote(img).map_err(|e| AppError::cri("loading the embedded runtime's catalogue", e))?;
            }
            (rt.endpoint(), Some(rt))
        }
    };
    let (gateway, version) = CriGatewayActor::connect(&endpoint, &cfg.cri)
        .await
        .map_err(|e| AppError::cri(format!("connecting to the CRI runtime at {endpoint}"), e))?;
    Ok(ConnectedRuntime { gateway, version, endpoint, embedded })
}

/// The default embedded runtime's socket in the temp dir is this, the
/// process id and `.sock`.
const EMBEDDED_SOCKET_PREFIX: &str = "imaged-embedded-";

/// Removes the default embedded-runtime sockets in `dir` whose imaged is
/// gone (a crash or `kill -9` leaves its socket behind): sockets named
/// `imaged-embedded-<pid>.sock` whose pid is no running process. A live
/// process's socket, or anything that is not a socket, is left alone.
/// Returns how many were removed.
pub fn remove_stale_embedded_sockets(dir: &std::path::Path) -> usize {
    use std::os::unix::fs::FileTypeExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(EMBEDDED_SOCKET_PREFIX))
            .and_then(|n| n.strip_suffix(".sock"))
            .and_then(|p| p.parse::<i32>().ok())
            .filter(|p| *p > 0)
        else {
            continue;
        };
        let is_socket = entry.file_type().is_ok_and(|t| t.is_socket());
        // ESRCH: no such process. EPERM means it runs as someone else.
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) == Err(nix::errno::Errno::ESRCH);
        if is_socket && gone && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The node credentials the configuration asks for (docker config files,
/// credential-provider plugins). Plugin registration failing is fatal, as
/// in the kubelet (`Failed to register CRI auth plugins`), and is a
/// configuration error (exit code 64).
pub fn node_credentials(cfg: &Config) -> Result<std::sync::Arc<crate::credentials::NodeCredentials>, AppError> {
    crate::credentials::NodeCredentials::from_settings(&cfg.credentials)
        .map(std::sync::Arc::new)
        .map_err(|e| crate::config::ConfigError::CredentialProviders(e.to_string()).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sockets_of_processes_that_are_gone_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = |name: &str| {
            let path = dir.path().join(name);
            std::os::unix::net::UnixListener::bind(&path).expect("bind");
            path
        };
        // A pid past the kernel's pid_max (4194304 at most): never running.
        let stale = sock("imaged-embedded-2147483646.sock");
        let live = sock(&format!("imaged-embedded-{}.sock", std::process::id()));
        let other = sock("imaged-embedded-x.sock");
        let not_a_socket = dir.path().join("imaged-embedded-2147483645.sock");
        std::fs::write(&not_a_socket, b"keep").expect("file");
        assert_eq!(remove_stale_embedded_sockets(dir.path()), 1);
        assert!(!stale.exists(), "the gone process's socket is removed");
        assert!(live.exists(), "a running process's socket stays");
        assert!(other.exists() && not_a_socket.exists(), "anything else stays");
    }
}
