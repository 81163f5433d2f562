//! The API's unix socket: created with its final mode before anyone can
//! connect (bound under a temporary name, chmod/chown'ed, then renamed into
//! place), served until shutdown, removed on exit.

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use super::{ImagedServer, ImagedService};
use crate::config::DaemonSettings;
use crate::error::AppError;

/// A bound socket the daemon serves (its API, the CRI front); the file is
/// removed when this is dropped.
#[derive(Debug)]
pub struct ApiSocket {
    path: PathBuf,
    name: &'static str,
    listener: Option<UnixListener>,
}

impl ApiSocket {
    /// Binds `settings.socket` for the API (see [`bind_at`](Self::bind_at)).
    pub async fn bind(settings: &DaemonSettings) -> Result<Self, AppError> {
        Self::bind_at("API socket", &settings.socket, settings.socket_group.as_deref()).await
    }

    /// Binds `path` with mode 0600 (0660 and the group when `group` is
    /// set), named `name` in errors. A stale socket left by a crashed daemon
    /// is replaced; a live one (something answers on it) is an error.
    pub async fn bind_at(name: &'static str, path: &Path, group: Option<&str>) -> Result<Self, AppError> {
        let path = path.to_path_buf();
        let at = |what: &str, e: std::io::Error| AppError::Other(format!("{name} {}: {what}: {e}", path.display()));
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| at("creating its directory", e))?;
        }
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_socket() => {
                if tokio::net::UnixStream::connect(&path).await.is_ok() {
                    return Err(AppError::Other(format!(
                        "{name} {}: another process is serving on it (is imaged already running?)",
                        path.display()
                    )));
                }
                std::fs::remove_file(&path).map_err(|e| at("removing the stale socket", e))?;
            }
            Ok(_) => {
                return Err(AppError::Other(format!(
                    "{name} {}: the path exists and is not a socket; refusing to replace it",
                    path.display()
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(at("checking the path", e)),
        }
        let tmp = tmp_path(&path);
        let _ = std::fs::remove_file(&tmp);
        let listener = UnixListener::bind(&tmp).map_err(|e| at("binding", e))?;
        let ready = set_access(&tmp, group)
            .and_then(|()| std::fs::rename(&tmp, &path).map_err(|e| format!("moving it into place: {e}")));
        if let Err(reason) = ready {
            let _ = std::fs::remove_file(&tmp);
            return Err(AppError::Other(format!("{name} {}: {reason}", path.display())));
        }
        Ok(Self { path, name, listener: Some(listener) })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves `service` until `shutdown` resolves; in-flight calls finish
    /// first (event streams end when the service's `stopping` turns true).
    /// Requests larger than `max_request_bytes` are refused. The socket
    /// file is removed when serving ends.
    pub async fn serve(
        mut self,
        service: ImagedService,
        max_request_bytes: usize,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), AppError> {
        let incoming = self.incoming()?;
        tonic::transport::Server::builder()
            .add_service(
                ImagedServer::new(service)
                    .max_decoding_message_size(max_request_bytes)
                    .max_encoding_message_size(64 << 20),
            )
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(|e| AppError::Other(format!("API server on {}: {e}", self.path.display())))
    }

    /// The connections to serve (once).
    pub fn incoming(&mut self) -> Result<tokio_stream::wrappers::UnixListenerStream, AppError> {
        let listener = self.listener.take().ok_or_else(|| AppError::Other(format!("{} already served", self.name)))?;
        Ok(tokio_stream::wrappers::UnixListenerStream::new(listener))
    }
}

impl Drop for ApiSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
}

fn set_access(path: &Path, group: Option<&str>) -> Result<(), String> {
    let mode = if group.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| format!("chmod: {e}"))?;
    if let Some(g) = group {
        let gid = match g.parse::<u32>() {
            Ok(n) => nix::unistd::Gid::from_raw(n),
            Err(_) => {
                nix::unistd::Group::from_name(g)
                    .map_err(|e| format!("looking up group {g:?}: {e}"))?
                    .ok_or_else(|| format!("group {g:?} does not exist"))?
                    .gid
            }
        };
        nix::unistd::chown(path, None, Some(gid)).map_err(|e| format!("chown to group {g:?}: {e}"))?;
    }
    Ok(())
}
