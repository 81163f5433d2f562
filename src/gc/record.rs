//! `ImageRecord`: what imaged remembers about each image for garbage
//! collection. Durable (see `crate::store`), so ages survive restarts.

use std::time::SystemTime;

/// Key of a record: the image id, plus the runtime handler when the image
/// was pulled for a non-default one (the kubelet's `id,handler` key).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct RecordKey {
    /// Image id (`sha256:…`).
    pub id: String,
    /// Runtime handler; empty = default.
    pub runtime_handler: String,
}

impl RecordKey {
    /// Key for an image id under the default handler.
    pub fn id(id: impl Into<String>) -> Self {
        Self { id: id.into(), runtime_handler: String::new() }
    }
}

/// One image's record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageRecord {
    /// The key.
    pub key: RecordKey,
    /// When imaged first saw the image (wall clock; survives restarts).
    pub first_detected: SystemTime,
    /// When a container last used it (`None` = never seen in use).
    pub last_used: Option<SystemTime>,
    /// Size in bytes, as the runtime last reported it.
    pub size: u64,
    /// Pinned by the runtime (`Image.pinned`).
    pub pinned: bool,
    /// Tags, for explanations and retention rules.
    pub repo_tags: Vec<String>,
    /// Digests, for explanations.
    pub repo_digests: Vec<String>,
}
