//! Conversions between CRI wire types and domain types: the one place proto
//! types are unpacked. Both directions exist because imaged is a CRI client
//! (the gateway) and a CRI server (the embedded runtime).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::proto as pb;
use crate::domain::{
    AuthConfig, Container, ContainerFilter, ContainerState, ContainerStatus, Download, FilesystemUsage, Image,
    ImageFsInfo, ImageSpec, PodSandbox, PodSandboxFilter, PodSandboxState, RuntimeVersion, SandboxConfig, Secret,
};

fn btree(m: HashMap<String, String>) -> BTreeMap<String, String> {
    m.into_iter().collect()
}

fn hash(m: BTreeMap<String, String>) -> HashMap<String, String> {
    m.into_iter().collect()
}

fn non_empty(s: String) -> Option<String> {
    if s.is_empty() { None } else { Some(s) }
}

// === ImageSpec, Image ===

impl From<pb::ImageSpec> for ImageSpec {
    fn from(s: pb::ImageSpec) -> Self {
        ImageSpec {
            image: s.image,
            annotations: btree(s.annotations),
            user_specified_image: s.user_specified_image,
            runtime_handler: s.runtime_handler,
            image_ref: s.image_ref,
        }
    }
}

impl From<ImageSpec> for pb::ImageSpec {
    fn from(s: ImageSpec) -> Self {
        pb::ImageSpec {
            image: s.image,
            annotations: hash(s.annotations),
            user_specified_image: s.user_specified_image,
            runtime_handler: s.runtime_handler,
            image_ref: s.image_ref,
        }
    }
}

impl From<pb::Image> for Image {
    fn from(i: pb::Image) -> Self {
        Image {
            id: i.id,
            repo_tags: i.repo_tags,
            repo_digests: i.repo_digests,
            size: i.size,
            uid: i.uid.map(|u| u.value),
            username: i.username,
            spec: i.spec.map(ImageSpec::from),
            pinned: i.pinned,
        }
    }
}

impl From<Image> for pb::Image {
    fn from(i: Image) -> Self {
        pb::Image {
            id: i.id,
            repo_tags: i.repo_tags,
            repo_digests: i.repo_digests,
            size: i.size,
            uid: i.uid.map(|value| pb::Int64Value { value }),
            username: i.username,
            spec: i.spec.map(pb::ImageSpec::from),
            pinned: i.pinned,
        }
    }
}

// === AuthConfig, SandboxConfig ===

/// containerd 1.6 parses `server_address` as a URL and rejects a bare host
/// with no scheme; a registry host is sent as `https://host` unless it
/// already names a scheme (containerd only compares the host part).
pub fn server_address_for_runtime(addr: &str) -> String {
    if addr.is_empty() || addr.contains("://") { addr.to_string() } else { format!("https://{addr}") }
}

impl From<AuthConfig> for pb::AuthConfig {
    fn from(a: AuthConfig) -> Self {
        pb::AuthConfig {
            username: a.username,
            password: a.password.expose().to_string(),
            auth: a.auth.expose().to_string(),
            server_address: server_address_for_runtime(&a.server_address),
            identity_token: a.identity_token.expose().to_string(),
            registry_token: a.registry_token.expose().to_string(),
        }
    }
}

impl From<pb::AuthConfig> for AuthConfig {
    fn from(a: pb::AuthConfig) -> Self {
        AuthConfig {
            username: a.username,
            password: Secret::new(a.password),
            auth: Secret::new(a.auth),
            server_address: a.server_address,
            identity_token: Secret::new(a.identity_token),
            registry_token: Secret::new(a.registry_token),
        }
    }
}

impl From<SandboxConfig> for pb::PodSandboxConfig {
    fn from(s: SandboxConfig) -> Self {
        pb::PodSandboxConfig {
            metadata: Some(pb::PodSandboxMetadata {
                name: s.name,
                uid: s.uid,
                namespace: s.namespace,
                attempt: s.attempt,
            }),
            labels: hash(s.labels),
            annotations: hash(s.annotations),
            ..Default::default()
        }
    }
}

impl From<pb::PodSandboxConfig> for SandboxConfig {
    fn from(s: pb::PodSandboxConfig) -> Self {
        let m = s.metadata.unwrap_or_default();
        SandboxConfig {
            name: m.name,
            uid: m.uid,
            namespace: m.namespace,
            attempt: m.attempt,
            labels: btree(s.labels),
            annotations: btree(s.annotations),
        }
    }
}

// === filesystems ===

fn system_time_from_nanos(n: i64) -> SystemTime {
    u64::try_from(n).map_or(UNIX_EPOCH, |n| UNIX_EPOCH + Duration::from_nanos(n))
}

fn nanos_from_system_time(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

impl From<pb::FilesystemUsage> for FilesystemUsage {
    fn from(f: pb::FilesystemUsage) -> Self {
        FilesystemUsage {
            timestamp: system_time_from_nanos(f.timestamp),
            mountpoint: f.fs_id.map(|id| id.mountpoint).unwrap_or_default(),
            used_bytes: f.used_bytes.map(|v| v.value),
            inodes_used: f.inodes_used.map(|v| v.value),
        }
    }
}

impl From<FilesystemUsage> for pb::FilesystemUsage {
    fn from(f: FilesystemUsage) -> Self {
        pb::FilesystemUsage {
            timestamp: nanos_from_system_time(f.timestamp),
            fs_id: Some(pb::FilesystemIdentifier { mountpoint: f.mountpoint }),
            used_bytes: f.used_bytes.map(|value| pb::UInt64Value { value }),
            inodes_used: f.inodes_used.map(|value| pb::UInt64Value { value }),
        }
    }
}

impl From<pb::ImageFsInfoResponse> for ImageFsInfo {
    fn from(r: pb::ImageFsInfoResponse) -> Self {
        ImageFsInfo {
            image_filesystems: r.image_filesystems.into_iter().map(Into::into).collect(),
            container_filesystems: r.container_filesystems.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<ImageFsInfo> for pb::ImageFsInfoResponse {
    fn from(r: ImageFsInfo) -> Self {
        pb::ImageFsInfoResponse {
            image_filesystems: r.image_filesystems.into_iter().map(Into::into).collect(),
            container_filesystems: r.container_filesystems.into_iter().map(Into::into).collect(),
        }
    }
}

// === runtime: version, containers, sandboxes ===

impl From<pb::VersionResponse> for RuntimeVersion {
    fn from(v: pb::VersionResponse) -> Self {
        RuntimeVersion {
            version: v.version,
            runtime_name: v.runtime_name,
            runtime_version: v.runtime_version,
            runtime_api_version: v.runtime_api_version,
        }
    }
}

impl From<RuntimeVersion> for pb::VersionResponse {
    fn from(v: RuntimeVersion) -> Self {
        pb::VersionResponse {
            version: v.version,
            runtime_name: v.runtime_name,
            runtime_version: v.runtime_version,
            runtime_api_version: v.runtime_api_version,
        }
    }
}

/// Domain state from the wire enum value (unknown values → `Unknown`).
pub fn container_state_from_i32(v: i32) -> ContainerState {
    match pb::ContainerState::try_from(v) {
        Ok(pb::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(pb::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(pb::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

/// Wire enum value of a domain state.
pub fn container_state_to_i32(s: ContainerState) -> i32 {
    (match s {
        ContainerState::Created => pb::ContainerState::ContainerCreated,
        ContainerState::Running => pb::ContainerState::ContainerRunning,
        ContainerState::Exited => pb::ContainerState::ContainerExited,
        ContainerState::Unknown => pb::ContainerState::ContainerUnknown,
    }) as i32
}

/// Domain state from the wire enum value (unknown values → `NotReady`).
pub fn sandbox_state_from_i32(v: i32) -> PodSandboxState {
    match pb::PodSandboxState::try_from(v) {
        Ok(pb::PodSandboxState::SandboxReady) => PodSandboxState::Ready,
        _ => PodSandboxState::NotReady,
    }
}

/// Wire enum value of a domain state.
pub fn sandbox_state_to_i32(s: PodSandboxState) -> i32 {
    (match s {
        PodSandboxState::Ready => pb::PodSandboxState::SandboxReady,
        PodSandboxState::NotReady => pb::PodSandboxState::SandboxNotready,
    }) as i32
}

impl From<pb::Container> for Container {
    fn from(c: pb::Container) -> Self {
        let m = c.metadata.unwrap_or_default();
        Container {
            id: c.id,
            pod_sandbox_id: c.pod_sandbox_id,
            name: m.name,
            attempt: m.attempt,
            image: c.image.map(Into::into).unwrap_or_default(),
            image_ref: c.image_ref,
            image_id: c.image_id,
            state: container_state_from_i32(c.state),
            created_at: c.created_at,
            labels: btree(c.labels),
            annotations: btree(c.annotations),
        }
    }
}

impl From<Container> for pb::Container {
    fn from(c: Container) -> Self {
        pb::Container {
            id: c.id,
            pod_sandbox_id: c.pod_sandbox_id,
            metadata: Some(pb::ContainerMetadata { name: c.name, attempt: c.attempt }),
            image: Some(c.image.into()),
            image_ref: c.image_ref,
            state: container_state_to_i32(c.state),
            created_at: c.created_at,
            labels: hash(c.labels),
            annotations: hash(c.annotations),
            image_id: c.image_id,
        }
    }
}

impl From<pb::ContainerStatus> for ContainerStatus {
    fn from(c: pb::ContainerStatus) -> Self {
        ContainerStatus {
            id: c.id,
            name: c.metadata.map(|m| m.name).unwrap_or_default(),
            state: container_state_from_i32(c.state),
            created_at: c.created_at,
            started_at: c.started_at,
            finished_at: c.finished_at,
            exit_code: c.exit_code,
            image: c.image.map(Into::into).unwrap_or_default(),
            image_ref: c.image_ref,
            image_id: c.image_id,
            reason: c.reason,
            message: c.message,
        }
    }
}

impl From<ContainerStatus> for pb::ContainerStatus {
    fn from(c: ContainerStatus) -> Self {
        pb::ContainerStatus {
            id: c.id,
            metadata: Some(pb::ContainerMetadata { name: c.name, attempt: 0 }),
            state: container_state_to_i32(c.state),
            created_at: c.created_at,
            started_at: c.started_at,
            finished_at: c.finished_at,
            exit_code: c.exit_code,
            image: Some(c.image.into()),
            image_ref: c.image_ref,
            image_id: c.image_id,
            reason: c.reason,
            message: c.message,
            ..Default::default()
        }
    }
}

impl From<ContainerFilter> for pb::ContainerFilter {
    fn from(f: ContainerFilter) -> Self {
        pb::ContainerFilter {
            id: f.id.unwrap_or_default(),
            state: f.state.map(|s| pb::ContainerStateValue { state: container_state_to_i32(s) }),
            pod_sandbox_id: f.pod_sandbox_id.unwrap_or_default(),
            label_selector: hash(f.label_selector),
        }
    }
}

impl From<pb::ContainerFilter> for ContainerFilter {
    fn from(f: pb::ContainerFilter) -> Self {
        ContainerFilter {
            id: non_empty(f.id),
            state: f.state.map(|s| container_state_from_i32(s.state)),
            pod_sandbox_id: non_empty(f.pod_sandbox_id),
            label_selector: btree(f.label_selector),
        }
    }
}

impl From<pb::PodSandbox> for PodSandbox {
    fn from(s: pb::PodSandbox) -> Self {
        let m = s.metadata.unwrap_or_default();
        PodSandbox {
            id: s.id,
            name: m.name,
            uid: m.uid,
            namespace: m.namespace,
            attempt: m.attempt,
            state: sandbox_state_from_i32(s.state),
            created_at: s.created_at,
            labels: btree(s.labels),
            annotations: btree(s.annotations),
            runtime_handler: s.runtime_handler,
        }
    }
}

impl From<PodSandbox> for pb::PodSandbox {
    fn from(s: PodSandbox) -> Self {
        pb::PodSandbox {
            id: s.id,
            metadata: Some(pb::PodSandboxMetadata {
                name: s.name,
                uid: s.uid,
                namespace: s.namespace,
                attempt: s.attempt,
            }),
            state: sandbox_state_to_i32(s.state),
            created_at: s.created_at,
            labels: hash(s.labels),
            annotations: hash(s.annotations),
            runtime_handler: s.runtime_handler,
        }
    }
}

impl From<PodSandboxFilter> for pb::PodSandboxFilter {
    fn from(f: PodSandboxFilter) -> Self {
        pb::PodSandboxFilter {
            id: f.id.unwrap_or_default(),
            state: f.state.map(|s| pb::PodSandboxStateValue { state: sandbox_state_to_i32(s) }),
            label_selector: hash(f.label_selector),
        }
    }
}

impl From<pb::PodSandboxFilter> for PodSandboxFilter {
    fn from(f: pb::PodSandboxFilter) -> Self {
        PodSandboxFilter {
            id: non_empty(f.id),
            state: f.state.map(|s| sandbox_state_from_i32(s.state)),
            label_selector: btree(f.label_selector),
        }
    }
}

// === Downloads (containerd's ingests) ===

/// A wire timestamp as a time; one before the epoch (Go's zero time, which
/// containerd sends for a time it never set) as the epoch.
fn time_of(t: Option<pb::content::Timestamp>) -> SystemTime {
    let Some(t) = t else { return UNIX_EPOCH };
    let (Ok(secs), Ok(nanos)) = (u64::try_from(t.seconds), u32::try_from(t.nanos)) else { return UNIX_EPOCH };
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos.min(999_999_999))).unwrap_or(UNIX_EPOCH)
}

/// The digest in a pull's ingest key (`layer-sha256:…`: containerd's
/// `<kind>-<digest>`), for a runtime that leaves `expected` empty, as
/// containerd 1.6 does in its listing.
fn digest_in_key(key: &str) -> String {
    key.split_once('-')
        .map(|(_, d)| d)
        .filter(|d| d.starts_with("sha256:") || d.starts_with("sha512:"))
        .map_or_else(String::new, str::to_string)
}

/// The times and sizes as they came; negative sizes as 0; the digest from
/// the key when the runtime does not say it.
impl From<pb::content::Status> for Download {
    fn from(s: pb::content::Status) -> Self {
        let digest = if s.expected.is_empty() { digest_in_key(&s.r#ref) } else { s.expected };
        Self {
            reference: s.r#ref,
            digest,
            offset: u64::try_from(s.offset).unwrap_or(0),
            total: u64::try_from(s.total).unwrap_or(0),
            started: time_of(s.started_at),
            updated: time_of(s.updated_at),
        }
    }
}

/// What a runtime serving the content service (the embedded one) sends.
impl From<Download> for pb::content::Status {
    fn from(d: Download) -> Self {
        let wire = |t: SystemTime| {
            let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            pb::content::Timestamp {
                seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(since.subsec_nanos()).unwrap_or(0),
            }
        };
        Self {
            started_at: Some(wire(d.started)),
            updated_at: Some(wire(d.updated)),
            r#ref: d.reference,
            offset: i64::try_from(d.offset).unwrap_or(i64::MAX),
            total: i64::try_from(d.total).unwrap_or(i64::MAX),
            expected: d.digest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_address_gets_a_scheme_containerd_accepts() {
        assert_eq!(server_address_for_runtime("127.0.0.1:5000"), "https://127.0.0.1:5000");
        assert_eq!(server_address_for_runtime("http://127.0.0.1:5000"), "http://127.0.0.1:5000");
        assert_eq!(server_address_for_runtime(""), "");
    }

    #[test]
    fn image_round_trips_through_the_wire_type() {
        let img = Image {
            id: "sha256:abc".into(),
            repo_tags: vec!["docker.io/library/busybox:latest".into()],
            repo_digests: vec!["docker.io/library/busybox@sha256:def".into()],
            size: 42,
            uid: Some(0),
            username: String::new(),
            spec: Some(ImageSpec::new("busybox").with_runtime_handler("kata")),
            pinned: true,
        };
        assert_eq!(Image::from(pb::Image::from(img.clone())), img);
    }

    #[test]
    fn filters_keep_unset_fields_unset() {
        let f = ContainerFilter { state: Some(ContainerState::Running), ..Default::default() };
        assert_eq!(ContainerFilter::from(pb::ContainerFilter::from(f.clone())), f);
        let s = PodSandboxFilter { id: Some("x".into()), ..Default::default() };
        assert_eq!(PodSandboxFilter::from(pb::PodSandboxFilter::from(s.clone())), s);
    }

    #[test]
    fn a_download_crosses_the_wire_and_back_and_odd_values_read_as_nothing() {
        let d = Download {
            reference: "layer-sha256:ab".into(),
            digest: "sha256:ab".into(),
            offset: 7,
            total: 9,
            started: UNIX_EPOCH + Duration::new(1_700_000_000, 5),
            updated: UNIX_EPOCH + Duration::new(1_700_000_001, 999_999_999),
        };
        assert_eq!(Download::from(pb::content::Status::from(d.clone())), d);
        // Go's zero time (year 1), a negative size, a missing time.
        let odd = pb::content::Status {
            started_at: Some(pb::content::Timestamp { seconds: -62_135_596_800, nanos: 0 }),
            updated_at: None,
            r#ref: "x".into(),
            offset: -1,
            total: -5,
            expected: String::new(),
        };
        let d = Download::from(odd);
        assert_eq!((d.offset, d.total, d.started, d.updated), (0, 0, UNIX_EPOCH, UNIX_EPOCH));
        assert_eq!(d.digest, "", "no digest in the key");
        // containerd 1.6 sends no `expected`: the digest is the key's.
        let key = |r: &str| Download::from(pb::content::Status { r#ref: r.into(), ..Default::default() }).digest;
        assert_eq!(key("layer-sha256:ab12"), "sha256:ab12");
        assert_eq!(key("manifest-sha512:cd"), "sha512:cd");
        assert_eq!(key("push-x-y"), "");
        assert_eq!(key("layer-"), "");
    }
}
