//! `[daemon]`: the API socket, shutdown grace, request limit and the
//! metrics address (loopback unless allowed otherwise).

use std::path::PathBuf;
use std::time::Duration;

use super::ConfigError;
use super::raw::{RawCriServer, RawDaemon};
use super::values::{duration, invalid, mailbox_capacity};

/// The daemon's settings (`[daemon]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSettings {
    /// The API's unix socket.
    pub socket: PathBuf,
    /// Group given access to the socket (mode 0660); `None` = owner only (0600).
    pub socket_group: Option<String>,
    /// How long in-flight pulls may go on after SIGTERM/SIGINT.
    pub shutdown_grace: Duration,
    /// Largest API request accepted, in bytes.
    pub max_request_bytes: usize,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (`None` = not
    /// served). A loopback address unless `metrics_allow_non_loopback`.
    pub metrics_address: Option<std::net::SocketAddr>,
    /// Events each `WatchEvents` stream may fall behind by before it is
    /// told it lost some, and the event hub's mailbox.
    pub event_buffer: usize,
}

pub(super) fn daemon_from_raw(d: RawDaemon) -> Result<DaemonSettings, ConfigError> {
    let metrics_address = metrics_address(&d)?;
    if d.socket.is_empty() {
        return Err(invalid("daemon.socket", &d.socket, "must be a path"));
    }
    let group = socket_group("daemon.socket_group", &d.socket_group)?;
    let max_request_bytes =
        usize::try_from(d.max_request_bytes).ok().filter(|n| (1024..=256 << 20).contains(n)).ok_or_else(|| {
            invalid("daemon.max_request_bytes", &d.max_request_bytes.to_string(), "must be from 1024 to 268435456")
        })?;
    Ok(DaemonSettings {
        socket: PathBuf::from(d.socket),
        socket_group: group,
        shutdown_grace: duration("daemon.shutdown_grace", &d.shutdown_grace)?,
        max_request_bytes,
        metrics_address,
        event_buffer: mailbox_capacity("daemon.event_buffer", d.event_buffer)?,
    })
}

fn metrics_address(d: &RawDaemon) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    let key = "daemon.metrics_address";
    let text = d.metrics_address.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let addr: std::net::SocketAddr = text.parse().map_err(|_| {
        invalid(key, text, "not an IP address and port; write e.g. \"127.0.0.1:9464\" or \"[::1]:9464\" (\"\" = off)")
    })?;
    if !addr.ip().is_loopback() && !d.metrics_allow_non_loopback {
        return Err(invalid(
            key,
            text,
            "not a loopback address: /metrics, /healthz and /readyz would be reachable from the network; \
             use 127.0.0.1 or ::1, or set daemon.metrics_allow_non_loopback = true",
        ));
    }
    Ok(Some(addr))
}

/// A socket's group: a name or number, `None` when empty.
fn socket_group(key: &str, v: &str) -> Result<Option<String>, ConfigError> {
    let group = v.trim();
    if group.contains(char::is_whitespace) || group.contains(':') {
        return Err(invalid(key, v, "must be a group name or number"));
    }
    Ok(if group.is_empty() { None } else { Some(group.to_string()) })
}

/// The CRI front's settings (`[cri_server]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriServerSettings {
    /// Where the CRI `ImageService` is served (`None` = not served).
    pub socket: Option<PathBuf>,
    /// Group given access to the socket (mode 0660); `None` = owner only (0600).
    pub socket_group: Option<String>,
    /// Namespaces whose pods' pulls go first.
    pub priority_namespaces: Vec<String>,
    /// Report the sandbox image pinned.
    pub pin_sandbox_image: bool,
}

pub(super) fn cri_server_from_raw(c: RawCriServer) -> Result<CriServerSettings, ConfigError> {
    for n in &c.priority_namespaces {
        if n.trim().is_empty() || n.contains(char::is_whitespace) {
            return Err(invalid("cri_server.priority_namespaces", n, "a namespace name, without spaces"));
        }
    }
    Ok(CriServerSettings {
        socket: (!c.socket.trim().is_empty()).then(|| PathBuf::from(c.socket.trim())),
        socket_group: socket_group("cri_server.socket_group", &c.socket_group)?,
        priority_namespaces: c.priority_namespaces,
        pin_sandbox_image: c.pin_sandbox_image,
    })
}
