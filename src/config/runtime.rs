//! `[runtime]` (where the CRI runtime is, the gateway's timeouts, deadlines
//! and mailbox) and `[log]`.

use std::path::PathBuf;
use std::time::Duration;

use super::ConfigError;
use super::raw::{RawLog, RawRuntime};
use super::values::{duration, invalid, mailbox_capacity};
use crate::actors::cri_gateway::{CriDeadlines, CriSettings};
use crate::cri::{CriEndpoint, Rpc};
use crate::metrics::Metrics;

/// Where the CRI runtime is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeEndpoint {
    /// Start the embedded runtime in-process, on this socket (or a fresh one).
    Embedded {
        /// Socket path; `None` = a fresh path in the temp dir.
        socket: Option<PathBuf>,
    },
    /// A runtime listening at this endpoint.
    Cri(CriEndpoint),
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// Output format.
    pub format: LogFormat,
    /// tracing filter directives (`RUST_LOG` wins when set).
    pub filter: String,
}

pub(super) fn endpoint_from_raw(r: &RawRuntime) -> Result<RuntimeEndpoint, ConfigError> {
    if r.endpoint == "embedded" {
        return Ok(RuntimeEndpoint::Embedded {
            socket: if r.embedded_socket.is_empty() { None } else { Some(PathBuf::from(&r.embedded_socket)) },
        });
    }
    let endpoint = r.endpoint.parse().map_err(|e: crate::cri::InvalidEndpoint| {
        invalid("runtime.endpoint", &r.endpoint, format!("{}; or \"embedded\"", e.reason))
    })?;
    Ok(RuntimeEndpoint::Cri(endpoint))
}

/// `runtime.embedded_state_dir`: `None` when empty. What exists there and
/// is not a directory is refused now; the rest (mode, lock, state file) is
/// checked when the runtime starts.
pub(super) fn embedded_state_dir_from_raw(dir: &str) -> Result<Option<PathBuf>, ConfigError> {
    if dir.is_empty() {
        return Ok(None);
    }
    let path = PathBuf::from(dir);
    if std::fs::metadata(&path).is_ok_and(|m| !m.is_dir()) {
        return Err(invalid("runtime.embedded_state_dir", dir, "exists and is not a directory"));
    }
    Ok(Some(path))
}

/// `runtime.fault_plan`: read and parsed now, so a plan that `run` could
/// not use is refused with the configuration.
pub(super) fn fault_plan_from_raw(file: &str) -> Result<Option<PathBuf>, ConfigError> {
    if file.is_empty() {
        return Ok(None);
    }
    let path = PathBuf::from(file);
    super::load_fault_plan(&path).map_err(|reason| invalid("runtime.fault_plan", file, reason))?;
    Ok(Some(path))
}

/// The CRI gateway's settings: timeouts, per-RPC deadlines, mailbox.
pub(super) fn cri_from_raw(r: RawRuntime) -> Result<CriSettings, ConfigError> {
    let mailbox_capacity = mailbox_capacity("runtime.mailbox_capacity", r.mailbox_capacity)?;
    let d = r.deadlines;
    let deadline = |key: &str, v: &str| -> Result<Option<Duration>, ConfigError> {
        let dur = duration(&format!("runtime.deadlines.{key}"), v)?;
        Ok(if dur.is_zero() { None } else { Some(dur) })
    };
    let deadlines = CriDeadlines::uniform(None)
        .with(Rpc::Version, deadline("version", &d.version)?)
        .with(Rpc::ListImages, deadline("list_images", &d.list_images)?)
        .with(Rpc::ImageStatus, deadline("image_status", &d.image_status)?)
        .with(Rpc::PullImage, deadline("pull_image", &d.pull_image)?)
        .with(Rpc::RemoveImage, deadline("remove_image", &d.remove_image)?)
        .with(Rpc::ImageFsInfo, deadline("image_fs_info", &d.image_fs_info)?)
        .with(Rpc::ListContainers, deadline("list_containers", &d.list_containers)?)
        .with(Rpc::ListPodSandbox, deadline("list_pod_sandbox", &d.list_pod_sandbox)?)
        .with(Rpc::ContainerStatus, deadline("container_status", &d.container_status)?)
        // Not CRI, not configured: a listing for progress and stall checks.
        .with(Rpc::ListStatuses, Some(crate::actors::cri_gateway::DOWNLOADS_DEADLINE));
    let connect_timeout = duration("runtime.connect_timeout", &r.connect_timeout)?;
    if connect_timeout.is_zero() {
        return Err(invalid("runtime.connect_timeout", &r.connect_timeout, "must be more than 0s"));
    }
    Ok(CriSettings {
        connect_timeout,
        startup_timeout: duration("runtime.startup_timeout", &r.startup_timeout)?,
        mailbox_capacity,
        deadlines,
        metrics: Metrics::default(),
    })
}

pub(super) fn log_from_raw(l: RawLog) -> Result<LogSettings, ConfigError> {
    let format = match l.format.as_str() {
        "text" => LogFormat::Text,
        "json" => LogFormat::Json,
        other => return Err(invalid("log.format", other, "must be \"text\" or \"json\"")),
    };
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&l.filter) {
        return Err(invalid("log.filter", &l.filter, e.to_string()));
    }
    Ok(LogSettings { format, filter: l.filter })
}
