//! The API's unix socket: created with its final mode before anyone can
//! connect (bound under a temporary name, chmod/chown'ed, then renamed into
//! place), served until shutdown, removed on exit. Or a socket the service
//! manager passed (systemd socket activation), served as it is and left in
//! place: connections made while imaged restarts wait in its backlog.

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use super::{ImagedServer, ImagedService};
use crate::config::DaemonSettings;
use crate::error::AppError;

/// The `FileDescriptorName=` of a socket-activated CRI socket
/// (`deploy/kubelet-path/imaged-cri.socket`).
pub const CRI_FD_NAME: &str = "imaged-cri";

/// The sockets the service manager passed, with their names, once
/// [`take_passed_sockets`] has run.
static PASSED: std::sync::Mutex<Option<(listenfd::ListenFd, String)>> = std::sync::Mutex::new(None);

/// Takes the listening sockets the service manager passed to this process
/// (`LISTEN_FDS`; the variables are cleared, so children do not see them)
/// for [`ApiSocket::inherited`]. Call it first thing in `main`, before any
/// thread starts: it changes the environment. Without it no passed socket
/// is used (a library embedding imaged never takes its host's sockets).
pub fn take_passed_sockets() {
    let names = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
    let fds = listenfd::ListenFd::from_env();
    *PASSED.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((fds, names));
}

/// A bound socket the daemon serves (its API, the CRI front); the file is
/// removed when this is dropped, unless the service manager owns it.
#[derive(Debug)]
pub struct ApiSocket {
    path: PathBuf,
    name: &'static str,
    listener: Option<UnixListener>,
    /// Bound here (removed on drop), not passed by the service manager.
    owned: bool,
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
        Ok(Self { path, name, listener: Some(listener), owned: true })
    }

    /// The listening socket the service manager passed under `fd_name`
    /// (systemd socket activation: `LISTEN_PID`, `LISTEN_FDS`,
    /// `LISTEN_FDNAMES`), if it passed one; named `name` in errors. Its mode
    /// and owner are the manager's (`SocketMode=`, `SocketGroup=`), and the
    /// file stays when imaged exits. `configured` is the path the
    /// configuration names; a passed socket elsewhere is served with a
    /// warning.
    pub fn inherited(name: &'static str, fd_name: &str, configured: &Path) -> Result<Option<Self>, AppError> {
        let mut passed = PASSED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some((fds, names)) = passed.as_mut() else { return Ok(None) };
        let Some(index) = passed_index(names, fds.len(), fd_name) else { return Ok(None) };
        let failed = |e: std::io::Error| {
            AppError::Other(format!("{name}: the socket passed by the service manager (fd {}): {e}", 3 + index))
        };
        let Some(std_listener) = fds.take_unix_listener(index).map_err(failed)? else { return Ok(None) };
        std_listener.set_nonblocking(true).map_err(failed)?;
        let listener = UnixListener::from_std(std_listener).map_err(failed)?;
        let path = listener
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(Path::to_path_buf))
            .unwrap_or_else(|| configured.to_path_buf());
        if path != configured {
            tracing::warn!(passed = %path.display(), configured = %configured.display(),
                "{name}: the service manager passed a socket at another path than the configuration names; serving it");
        }
        Ok(Some(Self { path, name, listener: Some(listener), owned: false }))
    }

    /// Whether the service manager passed this socket.
    pub fn is_inherited(&self) -> bool {
        !self.owned
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
        // `EnsureImage` in front of the generated server: a waiting call
        // holds a third of what tonic's would (api::unary).
        let ensure = super::unary::EnsureRouteLayer::new(service.node(), max_request_bytes);
        // Bounded streams and window: a burst cannot close a connection.
        crate::cri::transport::server()
            .layer(ensure)
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
    pub fn incoming(&mut self) -> Result<Incoming, AppError> {
        let listener = self.listener.take().ok_or_else(|| AppError::Other(format!("{} already served", self.name)))?;
        Ok(Incoming::new(listener, self.name.to_string()))
    }
}

/// The connections a unix listener accepts, as tonic serves them, resting
/// [`crate::http::ACCEPT_ERROR_PAUSE`] after a failed accept. tonic skips a
/// failed accept and asks at once for the next: out of descriptors
/// (`EMFILE`), the listener stays readable and the server would spin on
/// the error, taking a core, until a descriptor is freed.
pub struct Incoming {
    listener: UnixListener,
    name: String,
    pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    failing: crate::http::Warned,
}

impl Incoming {
    /// Connections of `listener`, named `name` in the one warning per
    /// episode of failed accepts.
    pub fn new(listener: UnixListener, name: String) -> Self {
        Self { listener, name, pause: None, failing: crate::http::Warned::default() }
    }
}

impl tokio_stream::Stream for Incoming {
    type Item = std::io::Result<tokio::net::UnixStream>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = self.get_mut();
        if let Some(pause) = &mut this.pause {
            if pause.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.pause = None;
        }
        match this.listener.poll_accept(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok((stream, _))) => {
                this.failing = crate::http::Warned::default();
                Poll::Ready(Some(Ok(stream)))
            }
            Poll::Ready(Err(e)) => {
                if this.failing.first() {
                    tracing::warn!(socket = %this.name, error = %e, "accept failed; retrying");
                }
                this.pause = Some(Box::pin(tokio::time::sleep(crate::http::ACCEPT_ERROR_PAUSE)));
                Poll::Ready(Some(Err(e)))
            }
        }
    }
}

impl Drop for ApiSocket {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Which of the `count` passed descriptors is named `fd_name` in
/// `LISTEN_FDNAMES` (colon-separated, one name per descriptor). A single
/// unnamed descriptor is taken as the one asked for.
fn passed_index(names: &str, count: usize, fd_name: &str) -> Option<usize> {
    if count == 0 {
        return None;
    }
    if names.is_empty() {
        return (count == 1).then_some(0);
    }
    names.split(':').take(count).position(|n| n == fd_name)
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(std::ffi::OsStr::to_os_string).unwrap_or_default();
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

#[cfg(test)]
#[allow(clippy::pedantic)] // test code: pedantic lints are for what ships
mod tests {
    use super::{ApiSocket, passed_index};

    #[tokio::test]
    async fn a_socket_with_a_group_is_0660_and_owned_by_it_and_an_unknown_group_is_named() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cri.sock");
        let gid = nix::unistd::getegid().as_raw();
        let socket = ApiSocket::bind_at("CRI socket", &path, Some(&gid.to_string())).await.unwrap();
        let meta = std::fs::metadata(socket.path()).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o660, "group read/write");
        assert_eq!(meta.gid(), gid, "owned by the group");
        drop(socket);
        assert!(!path.exists(), "removed when dropped");
        let owner_only = ApiSocket::bind_at("CRI socket", &path, None).await.unwrap();
        assert_eq!(std::fs::metadata(owner_only.path()).unwrap().permissions().mode() & 0o777, 0o600);
        drop(owner_only);
        let err = ApiSocket::bind_at("CRI socket", &path, Some("no-such-group-imaged")).await.unwrap_err();
        assert!(err.to_string().contains("no-such-group-imaged"), "{err}");
        assert!(!path.exists(), "nothing left behind by a refused bind");
    }

    #[test]
    fn the_passed_socket_is_found_by_its_name() {
        assert_eq!(passed_index("", 0, "imaged-cri"), None, "nothing passed");
        assert_eq!(passed_index("", 1, "imaged-cri"), Some(0), "one unnamed socket is ours");
        assert_eq!(passed_index("", 2, "imaged-cri"), None, "two unnamed ones are ambiguous");
        assert_eq!(passed_index("imaged-cri", 1, "imaged-cri"), Some(0));
        assert_eq!(passed_index("other:imaged-cri", 2, "imaged-cri"), Some(1));
        assert_eq!(passed_index("other", 1, "imaged-cri"), None, "a socket for something else");
        assert_eq!(passed_index("a:b:imaged-cri", 2, "imaged-cri"), None, "a name past the count");
    }
}
