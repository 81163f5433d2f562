//! What the embedded runtime's simulated registries hold: remote images by
//! name, with digest, size, pull latency and required credentials.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::domain::Secret;

/// An image the embedded runtime can pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteImage {
    /// Reference as pulled, `repo:tag` (normalised on insert: `busybox:1.36`
    /// becomes `docker.io/library/busybox:1.36`).
    pub name: String,
    /// Manifest digest (`sha256:…`): what `repo@digest` pulls.
    pub digest: String,
    /// Image id the runtime reports after pulling (config digest).
    pub id: String,
    /// Size in bytes the pulled image takes.
    pub size: u64,
    /// How long a pull of it takes.
    pub pull_latency: Duration,
    /// Credentials the registry demands, if any.
    pub credentials: Option<(String, Secret)>,
    /// Other credentials it takes as well (a robot account's).
    pub also_accepted: Vec<(String, Secret)>,
    /// Its download stops moving this long into the pull (a stalled
    /// registry), though the pull still ends on time: what the content
    /// service lists (see [`Self::stalling`]).
    pub stalls_after: Option<Duration>,
    /// Bytes a second its download still writes once stalled (a registry
    /// that drips: see [`Self::dripping`]).
    pub drips: u64,
}

fn sha(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    let d = h.finalize();
    let hex = crate::domain::go_text::hex(&d);
    format!("sha256:{hex}")
}

impl RemoteImage {
    /// An image named `name` with `size` bytes, no latency, no credentials;
    /// digest and id are derived from the name (stable across runs).
    pub fn new(name: impl Into<String>, size: u64) -> Self {
        let name = name.into();
        Self {
            digest: sha(&["manifest", &name]),
            id: sha(&["config", &name]),
            name,
            size,
            pull_latency: Duration::ZERO,
            credentials: None,
            also_accepted: Vec::new(),
            stalls_after: None,
            drips: 0,
        }
    }

    /// Its download, as the content service lists it, writes nothing more
    /// once `after` of the pull has passed: a stall for the stall check to
    /// find. The pull itself still takes its latency.
    #[must_use]
    pub fn stalling(mut self, after: Duration) -> Self {
        self.stalls_after = Some(after);
        self
    }

    /// Its download, once `after` of the pull has passed, writes only
    /// `bytes_per_sec`: never idle, but slow (for `pull.min_download_rate`).
    #[must_use]
    pub fn dripping(mut self, after: Duration, bytes_per_sec: u64) -> Self {
        self.stalls_after = Some(after);
        self.drips = bytes_per_sec;
        self
    }

    /// Pulls take `d`.
    #[must_use]
    pub fn latency(mut self, d: Duration) -> Self {
        self.pull_latency = d;
        self
    }

    /// The registry demands these basic-auth credentials.
    #[must_use]
    pub fn private(mut self, username: impl Into<String>, password: impl Into<Secret>) -> Self {
        self.credentials = Some((username.into(), password.into()));
        self
    }

    /// The registry takes these credentials too (with [`private`](Self::private)).
    #[must_use]
    pub fn also_accepts(mut self, username: impl Into<String>, password: impl Into<Secret>) -> Self {
        self.also_accepted.push((username.into(), password.into()));
        self
    }

    /// Use this id (several names may share one image).
    #[must_use]
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }
}

/// A small catalogue of well-known images for demos and the README job.
pub fn demo_catalogue() -> Vec<RemoteImage> {
    let ms = Duration::from_millis;
    vec![
        RemoteImage::new("docker.io/library/busybox:1.36", 4_261_574).latency(ms(120)),
        RemoteImage::new("docker.io/library/busybox:latest", 4_261_574).latency(ms(120)),
        RemoteImage::new("docker.io/library/nginx:1.27", 72_099_410).latency(ms(400)),
        RemoteImage::new("docker.io/library/redis:7", 45_027_630).latency(ms(300)),
        RemoteImage::new("registry.k8s.io/pause:3.10", 320_368).latency(ms(50)),
        RemoteImage::new("registry.example.com/team/app:v1", 18_500_000)
            .latency(ms(200))
            .private("team", "team-password"),
    ]
}
