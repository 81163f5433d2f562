//! Images, image specs, credentials and image filesystem usage.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::Secret;

/// Which image an operation is about, as CRI's `ImageSpec` carries it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageSpec {
    /// Image reference (`busybox:latest`, `repo@sha256:…`) or image id.
    pub image: String,
    /// Unstructured key-value data (the kubelet passes every pod annotation).
    pub annotations: BTreeMap<String, String>,
    /// The image exactly as the user wrote it in the pod spec.
    pub user_specified_image: String,
    /// Runtime handler (RuntimeClass) the image is for; empty = default.
    pub runtime_handler: String,
    /// Image id or digest the runtime resolved (set by the kubelet for volumes).
    pub image_ref: String,
}

impl ImageSpec {
    /// A spec naming just an image.
    pub fn new(image: impl Into<String>) -> Self {
        Self { image: image.into(), ..Self::default() }
    }

    /// The same spec for a given runtime handler.
    #[must_use]
    pub fn with_runtime_handler(mut self, handler: impl Into<String>) -> Self {
        self.runtime_handler = handler.into();
        self
    }
}

/// An image the runtime holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Image {
    /// Image id (for containerd, the config digest `sha256:…`).
    pub id: String,
    /// Tags naming this image (`docker.io/library/busybox:latest`).
    pub repo_tags: Vec<String>,
    /// Digests naming this image (`docker.io/library/busybox@sha256:…`).
    pub repo_digests: Vec<String>,
    /// Size in bytes as the runtime reports it.
    pub size: u64,
    /// Numeric user the image runs as, when it names one.
    pub uid: Option<i64>,
    /// User name the image runs as, when it names one that is not numeric.
    pub username: String,
    /// Spec of the image (annotations, runtime handler), when the runtime keeps it.
    pub spec: Option<ImageSpec>,
    /// Pinned images are never garbage-collected.
    pub pinned: bool,
}

/// `ImageStatus` result: the image if present, plus verbose info when asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageStatus {
    /// The image; `None` when the runtime does not have it (not an error).
    pub image: Option<Image>,
    /// Runtime-specific details returned for verbose requests.
    pub info: BTreeMap<String, String>,
}

/// Registry credentials for one pull. Secret fields never print.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthConfig {
    /// User name for basic auth.
    pub username: String,
    /// Password for basic auth.
    pub password: Secret,
    /// base64 `user:password`; used by containerd when neither `username`
    /// nor `identity_token` is set.
    pub auth: Secret,
    /// Registry the credentials are for. containerd 1.6 wants a scheme-less
    /// host or a full URL; see `cri::convert`.
    pub server_address: String,
    /// Identity token (OAuth2 refresh token) for the registry.
    pub identity_token: Secret,
    /// Bearer token sent to the registry as is.
    pub registry_token: Secret,
}

impl AuthConfig {
    /// Basic-auth credentials for a registry.
    pub fn basic(server_address: impl Into<String>, username: impl Into<String>, password: impl Into<Secret>) -> Self {
        Self {
            username: username.into(),
            password: password.into(),
            server_address: server_address.into(),
            ..Self::default()
        }
    }

    /// The basic-auth user name and password the runtime pulls with, in
    /// containerd's order (`ParseAuth`): `username` and `password` when a
    /// user name is set; else none when an identity token is (the runtime
    /// sends the token); else `auth` decoded (base64 `user:password`).
    /// `None` also when `auth` does not decode or nothing is set.
    pub fn basic_credentials(&self) -> Option<(String, Secret)> {
        if !self.username.is_empty() {
            return Some((self.username.clone(), self.password.clone()));
        }
        if !self.identity_token.is_empty() || self.auth.is_empty() {
            return None;
        }
        use base64::Engine as _;
        let trimmed = self.auth.expose().trim().trim_end_matches('=');
        let decoded = base64::engine::general_purpose::STANDARD_NO_PAD.decode(trimmed).ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (user, password) = text.split_once(':')?;
        Some((user.to_string(), Secret::new(password)))
    }

    /// A stable, non-reversible identity for these credentials (SHA-256 of all
    /// fields), for telling credential sets apart without keeping them.
    pub fn identity(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for part in [
            self.username.as_str(),
            self.password.expose(),
            self.auth.expose(),
            self.server_address.as_str(),
            self.identity_token.expose(),
            self.registry_token.expose(),
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        let digest = h.finalize();
        super::go_text::hex(&digest)
    }

    /// The identity of credentials tried in order (the order matters): their
    /// identities joined by commas; empty for none (anonymous).
    pub fn list_identity(creds: &[AuthConfig]) -> String {
        creds.iter().map(AuthConfig::identity).collect::<Vec<_>>().join(",")
    }
}

/// The pod sandbox a pull is for (CRI `PodSandboxConfig`, the parts imaged uses).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// Pod namespace.
    pub namespace: String,
    /// Sandbox attempt number.
    pub attempt: u32,
    /// Pod labels.
    pub labels: BTreeMap<String, String>,
    /// Pod annotations.
    pub annotations: BTreeMap<String, String>,
}

/// Usage of one filesystem, as `ImageFsInfo` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesystemUsage {
    /// When the figures were taken.
    pub timestamp: SystemTime,
    /// Mountpoint of the filesystem (empty when the runtime does not say).
    pub mountpoint: String,
    /// Bytes used by images or container layers on it.
    pub used_bytes: Option<u64>,
    /// Inodes used by images or container layers on it.
    pub inodes_used: Option<u64>,
}

/// `ImageFsInfo` result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageFsInfo {
    /// Filesystems holding images.
    pub image_filesystems: Vec<FilesystemUsage>,
    /// Filesystems holding container writable layers (may be the same).
    pub container_filesystems: Vec<FilesystemUsage>,
}
