//! `[daemon]`: the API socket, shutdown grace, request limit and the
//! metrics address (loopback unless allowed otherwise).

use std::path::PathBuf;
use std::time::Duration;

use super::ConfigError;
use super::raw::{RawCriServer, RawDaemon, RawPriorityRule};
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

/// `group` (a name or number; `None` = none) exists on this host, or the
/// error names `key`. A number is taken as is, as `chown` takes it.
pub(super) fn group_exists(key: &str, group: Option<&str>) -> Result<(), ConfigError> {
    let Some(g) = group else { return Ok(()) };
    if g.parse::<u32>().is_ok() {
        return Ok(());
    }
    match nix::unistd::Group::from_name(g) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(invalid(key, g, "no such group on this host")),
        Err(e) => Err(invalid(key, g, format!("looking up the group: {e}"))),
    }
}

/// The CRI front's settings (`[cri_server]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriServerSettings {
    /// Where the CRI `ImageService` is served (`None` = not served).
    pub socket: Option<PathBuf>,
    /// Group given access to the socket (mode 0660); `None` = owner only (0600).
    pub socket_group: Option<String>,
    /// Namespaces whose pods' pulls go first (priority
    /// [`PRIORITY_NAMESPACE_PULL`]).
    pub priority_namespaces: Vec<String>,
    /// Pull priorities by the pod's namespace, labels and annotations
    /// (`[[cri_server.priority]]`): the highest matching rule wins.
    pub priority: Vec<PriorityRule>,
    /// Report the sandbox image pinned.
    pub pin_sandbox_image: bool,
    /// Refuse `RemoveImage` of a pinned image (`FailedPrecondition`).
    pub refuse_remove_pinned: bool,
    /// Refuse `RemoveImage` of an image ensured (for a pod or a client) within
    /// `gc.image_minimum_gc_age`, or with a pull of it in flight
    /// (`FailedPrecondition`): the kubelet's GC then cannot remove an image
    /// between a pod's check that finds it and its container's creation.
    pub refuse_remove_in_use: bool,
    /// Image patterns whose failed pulls in a registry outage answer with
    /// the image on the node (`AlwaysWithLocalFallback` for the kubelet).
    pub local_fallback_images: Vec<String>,
    /// Namespaces whose pods' failed pulls in a registry outage do so.
    pub local_fallback_namespaces: Vec<String>,
    /// How long an `ImageStatus` or `ListImages` answer is served again
    /// while no image changed through imaged (zero = never).
    pub read_cache_ttl: std::time::Duration,
}

/// The pull priority of pods in [`CriServerSettings::priority_namespaces`].
pub const PRIORITY_NAMESPACE_PULL: i32 = 1000;

/// One pull-priority rule: a pod matches when it matches every matcher the
/// rule has (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityRule {
    /// The pod's namespace, exactly.
    pub namespace: Option<String>,
    /// A label (key, value) the pod carries, exactly.
    pub label: Option<(String, String)>,
    /// An annotation (key, value) the pod carries, exactly.
    pub annotation: Option<(String, String)>,
    /// The pull priority of a matching pod (higher first).
    pub priority: i32,
}

impl PriorityRule {
    /// Whether a pod of this namespace, labels and annotations matches.
    pub fn matches(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
        annotations: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        let has = |m: &std::collections::BTreeMap<String, String>, kv: &Option<(String, String)>| match kv {
            Some((k, v)) => m.get(k) == Some(v),
            None => true,
        };
        self.namespace.as_ref().is_none_or(|n| n == namespace)
            && has(labels, &self.label)
            && has(annotations, &self.annotation)
    }
}

/// `key=value` of a rule's `label` or `annotation`.
fn key_value(key: &str, v: &str) -> Result<(String, String), ConfigError> {
    match v.split_once('=') {
        Some((k, val)) if !k.trim().is_empty() && !k.contains(char::is_whitespace) => {
            Ok((k.to_string(), val.to_string()))
        }
        _ => Err(invalid(key, v, "must be \"key=value\" (a non-empty key without spaces; the value may be empty)")),
    }
}

fn priority_rule(i: usize, r: RawPriorityRule) -> Result<PriorityRule, ConfigError> {
    let key = |field: &str| format!("cri_server.priority[{i}].{field}");
    if r.namespace.is_none() && r.label.is_none() && r.annotation.is_none() {
        return Err(invalid(
            &format!("cri_server.priority[{i}]"),
            &format!("priority = {}", r.priority),
            "a rule needs at least one of namespace, label, annotation (a rule matching every pod is \
             the same as no rule: pods no rule matches get priority 0)",
        ));
    }
    if let Some(n) = &r.namespace
        && (n.trim().is_empty() || n.contains(char::is_whitespace))
    {
        return Err(invalid(&key("namespace"), n, "a namespace name, without spaces"));
    }
    let priority = i32::try_from(r.priority)
        .map_err(|_| invalid(&key("priority"), &r.priority.to_string(), "must fit a 32-bit signed integer"))?;
    Ok(PriorityRule {
        label: r.label.as_deref().map(|l| key_value(&key("label"), l)).transpose()?,
        annotation: r.annotation.as_deref().map(|a| key_value(&key("annotation"), a)).transpose()?,
        namespace: r.namespace,
        priority,
    })
}

pub(super) fn cri_server_from_raw(c: RawCriServer) -> Result<CriServerSettings, ConfigError> {
    for (key, list) in [
        ("cri_server.priority_namespaces", &c.priority_namespaces),
        ("cri_server.local_fallback_namespaces", &c.local_fallback_namespaces),
    ] {
        for n in list {
            if n.trim().is_empty() || n.contains(char::is_whitespace) {
                return Err(invalid(key, n, "a namespace name, without spaces"));
            }
        }
    }
    for p in &c.local_fallback_images {
        if p.trim().is_empty() || p.contains(char::is_whitespace) {
            return Err(invalid(
                "cri_server.local_fallback_images",
                p,
                "an image pattern (as gc.pinned_images), without spaces",
            ));
        }
    }
    Ok(CriServerSettings {
        socket: (!c.socket.trim().is_empty()).then(|| PathBuf::from(c.socket.trim())),
        socket_group: socket_group("cri_server.socket_group", &c.socket_group)?,
        priority_namespaces: c.priority_namespaces,
        priority: c.priority.into_iter().enumerate().map(|(i, r)| priority_rule(i, r)).collect::<Result<_, _>>()?,
        pin_sandbox_image: c.pin_sandbox_image,
        refuse_remove_pinned: c.refuse_remove_pinned,
        refuse_remove_in_use: c.refuse_remove_in_use,
        local_fallback_images: c.local_fallback_images,
        local_fallback_namespaces: c.local_fallback_namespaces,
        read_cache_ttl: duration("cri_server.read_cache_ttl", &c.read_cache_ttl)?,
    })
}
