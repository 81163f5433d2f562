//! The embedded runtime's optional state directory: its local images (ids,
//! tags, digests, sizes, pins, specs), containers and pod sandboxes survive
//! a restart of the process, as a real runtime's do. The catalogue of remote
//! images and the simulated disk's capacity are configuration, not state:
//! whoever starts the runtime sets them again.
//!
//! # Files (in the state directory)
//!
//! - `embedded-runtime.json` ([`STATE_FILE`]): the state, JSON, mode 0600.
//!   Replaced whole on every change: written to `embedded-runtime.json.tmp`,
//!   `fsync`ed, renamed over the old file, and the directory `fsync`ed. A
//!   crash (even `SIGKILL`) leaves the old or the new state, never a mix.
//! - `embedded-runtime.lock` ([`LOCK_FILE`]): held with `flock` while a
//!   runtime uses the directory, so two runtimes never share one.
//!
//! # Guarantees
//!
//! A `PullImage` or `RemoveImage` is answered only after its change is on
//! disk (containerd likewise commits its metadata before it answers).
//! Changes that arrive while a write runs are written together by the next
//! one (group commit): a burst of pulls costs one `fsync` per write, not one
//! per pull. When a write fails, the call that needed it fails with
//! `Internal` naming the file; memory keeps the change and the next write
//! that succeeds stores it.
//!
//! A directory that cannot be used is refused at start, with the reason:
//! not a directory, writable by its group or others (whoever can write there
//! decides which images exist: `chmod 0700` it), not writable, in use by
//! another runtime, or holding a state file this build cannot read.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::domain::{Container, ContainerState, Image, ImageSpec, PodSandbox, PodSandboxState};

use super::EmbeddedError;
use super::state::State;

/// Name of the state file inside the state directory.
pub const STATE_FILE: &str = "embedded-runtime.json";

/// Name of the lock file inside the state directory.
pub const LOCK_FILE: &str = "embedded-runtime.lock";

/// Format version written in the state file; a file with another one is refused.
const FORMAT_VERSION: u32 = 1;

/// Largest state file read (a runtime's images, containers and sandboxes
/// take a few hundred bytes each): a larger file is refused, never read whole.
const MAX_STATE_BYTES: u64 = 256 * 1024 * 1024;

const DIR_MODE: u32 = 0o700;
const FILE_MODE: u32 = 0o600;

/// The state directory in use: its lock, and what is on disk.
#[derive(Debug)]
pub(super) struct StateDir {
    dir: PathBuf,
    file: PathBuf,
    /// Held (flock) as long as the runtime lives.
    _lock: nix::fcntl::Flock<File>,
    /// The state generation on disk; held while writing, so writers queue
    /// here and the first one after a write stores every change before it.
    written: Mutex<u64>,
}

/// Why a write of the state failed.
#[derive(Debug, thiserror::Error)]
#[error("embedded runtime: cannot save its state to {}: {source}", path.display())]
pub struct SaveError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

fn refused(dir: &Path, reason: impl Into<String>) -> EmbeddedError {
    EmbeddedError::StateDir { path: dir.display().to_string(), reason: reason.into() }
}

impl StateDir {
    /// Opens `dir` (creating it, mode 0700, when missing), locks it and
    /// loads the state it holds (an empty state when it holds none).
    pub(super) fn open(dir: &Path) -> Result<(Self, Loaded), EmbeddedError> {
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir)
            .map_err(|e| refused(dir, format!("cannot create it: {e}")))?;
        let meta = std::fs::metadata(dir).map_err(|e| refused(dir, format!("cannot read it: {e}")))?;
        if !meta.is_dir() {
            return Err(refused(dir, "is not a directory"));
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Err(refused(
                dir,
                format!(
                    "has mode {mode:04o}: its group or others can write it (and decide which images the runtime \
                     has); `chmod 0700` it"
                ),
            ));
        }
        let lock_path = dir.join(LOCK_FILE);
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(FILE_MODE)
            .open(&lock_path)
            .map_err(|e| refused(dir, format!("cannot write in it ({}): {e}", lock_path.display())))?;
        let lock =
            nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
                refused(
                    dir,
                    format!(
                        "another embedded runtime uses it ({} is locked: {e}); give each runtime its own directory",
                        lock_path.display()
                    ),
                )
            })?;
        let file = dir.join(STATE_FILE);
        let loaded = load(&file).map_err(|reason| refused(dir, reason))?;
        let state_dir = Self { dir: dir.to_path_buf(), file, _lock: lock, written: Mutex::new(0) };
        Ok((state_dir, loaded))
    }

    /// The directory.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes the state as it is now durable. Returns at once when a write
    /// that already included the current generation finished; otherwise
    /// writes (blocking on disk I/O, an `fsync` or two).
    pub(super) fn save(&self, state: &Mutex<State>) -> Result<(), SaveError> {
        let mut written = self.written.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (generation, snapshot) = {
            let st = state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if st.generation == *written {
                return Ok(());
            }
            (st.generation, Snapshot::of(&st))
        };
        self.write(&snapshot).map_err(|source| SaveError { path: self.file.clone(), source })?;
        *written = generation;
        Ok(())
    }

    fn write(&self, snapshot: &Snapshot) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(snapshot).map_err(std::io::Error::other)?;
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
        let mut f = OpenOptions::new().create(true).truncate(true).write(true).mode(FILE_MODE).open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &self.file)?;
        // The rename is durable once the directory is.
        File::open(&self.dir)?.sync_all()
    }
}

/// What a state directory held.
#[derive(Debug, Default)]
pub(super) struct Loaded {
    pub(super) images: Vec<Image>,
    pub(super) containers: Vec<Container>,
    pub(super) sandboxes: Vec<PodSandbox>,
}

fn load(file: &Path) -> Result<Loaded, String> {
    let f = match File::open(file) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Loaded::default()),
        Err(e) => return Err(format!("cannot read {}: {e}", file.display())),
    };
    let len = f.metadata().map_err(|e| format!("cannot read {}: {e}", file.display()))?.len();
    if len > MAX_STATE_BYTES {
        return Err(format!(
            "{} is {len} bytes, more than the {MAX_STATE_BYTES} an embedded runtime's state takes; move it aside \
             to start empty",
            file.display()
        ));
    }
    let snapshot: Snapshot = serde_json::from_reader(std::io::BufReader::new(f)).map_err(|e| {
        format!("{} is not an embedded-runtime state file ({e}); move it aside to start empty", file.display())
    })?;
    if snapshot.version != FORMAT_VERSION {
        return Err(format!(
            "{} has format version {}; this imaged reads version {FORMAT_VERSION} only",
            file.display(),
            snapshot.version
        ));
    }
    Ok(Loaded {
        images: snapshot.images.into_iter().map(Into::into).collect(),
        containers: snapshot.containers.into_iter().map(Into::into).collect(),
        sandboxes: snapshot.sandboxes.into_iter().map(Into::into).collect(),
    })
}

// === The file's format: its own types, so the domain types can change
// without changing what is on disk. ===

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Snapshot {
    version: u32,
    images: Vec<SavedImage>,
    #[serde(default)]
    containers: Vec<SavedContainer>,
    #[serde(default)]
    sandboxes: Vec<SavedSandbox>,
}

impl Snapshot {
    fn of(st: &State) -> Self {
        Self {
            version: FORMAT_VERSION,
            images: st.images.values().map(SavedImage::from).collect(),
            containers: st.containers.iter().map(SavedContainer::from).collect(),
            sandboxes: st.sandboxes.iter().map(SavedSandbox::from).collect(),
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct SavedSpec {
    image: String,
    annotations: std::collections::BTreeMap<String, String>,
    user_specified_image: String,
    runtime_handler: String,
    image_ref: String,
}

impl From<&ImageSpec> for SavedSpec {
    fn from(s: &ImageSpec) -> Self {
        Self {
            image: s.image.clone(),
            annotations: s.annotations.clone(),
            user_specified_image: s.user_specified_image.clone(),
            runtime_handler: s.runtime_handler.clone(),
            image_ref: s.image_ref.clone(),
        }
    }
}

impl From<SavedSpec> for ImageSpec {
    fn from(s: SavedSpec) -> Self {
        Self {
            image: s.image,
            annotations: s.annotations,
            user_specified_image: s.user_specified_image,
            runtime_handler: s.runtime_handler,
            image_ref: s.image_ref,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedImage {
    id: String,
    #[serde(default)]
    repo_tags: Vec<String>,
    #[serde(default)]
    repo_digests: Vec<String>,
    size: u64,
    #[serde(default)]
    uid: Option<i64>,
    #[serde(default)]
    username: String,
    #[serde(default)]
    spec: Option<SavedSpec>,
    #[serde(default)]
    pinned: bool,
}

impl From<&Image> for SavedImage {
    fn from(i: &Image) -> Self {
        Self {
            id: i.id.clone(),
            repo_tags: i.repo_tags.clone(),
            repo_digests: i.repo_digests.clone(),
            size: i.size,
            uid: i.uid,
            username: i.username.clone(),
            spec: i.spec.as_ref().map(SavedSpec::from),
            pinned: i.pinned,
        }
    }
}

impl From<SavedImage> for Image {
    fn from(i: SavedImage) -> Self {
        Self {
            id: i.id,
            repo_tags: i.repo_tags,
            repo_digests: i.repo_digests,
            size: i.size,
            uid: i.uid,
            username: i.username,
            spec: i.spec.map(Into::into),
            pinned: i.pinned,
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct SavedContainer {
    id: String,
    pod_sandbox_id: String,
    name: String,
    attempt: u32,
    image: SavedSpec,
    image_ref: String,
    image_id: String,
    /// `created`, `running`, `exited` or `unknown`.
    state: String,
    created_at: i64,
    labels: std::collections::BTreeMap<String, String>,
    annotations: std::collections::BTreeMap<String, String>,
}

impl From<&Container> for SavedContainer {
    fn from(c: &Container) -> Self {
        let state = match c.state {
            ContainerState::Created => "created",
            ContainerState::Running => "running",
            ContainerState::Exited => "exited",
            ContainerState::Unknown => "unknown",
        };
        Self {
            id: c.id.clone(),
            pod_sandbox_id: c.pod_sandbox_id.clone(),
            name: c.name.clone(),
            attempt: c.attempt,
            image: SavedSpec::from(&c.image),
            image_ref: c.image_ref.clone(),
            image_id: c.image_id.clone(),
            state: state.to_string(),
            created_at: c.created_at,
            labels: c.labels.clone(),
            annotations: c.annotations.clone(),
        }
    }
}

impl From<SavedContainer> for Container {
    fn from(c: SavedContainer) -> Self {
        let state = match c.state.as_str() {
            "created" => ContainerState::Created,
            "running" => ContainerState::Running,
            "exited" => ContainerState::Exited,
            _ => ContainerState::Unknown,
        };
        Self {
            id: c.id,
            pod_sandbox_id: c.pod_sandbox_id,
            name: c.name,
            attempt: c.attempt,
            image: c.image.into(),
            image_ref: c.image_ref,
            image_id: c.image_id,
            state,
            created_at: c.created_at,
            labels: c.labels,
            annotations: c.annotations,
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct SavedSandbox {
    id: String,
    name: String,
    uid: String,
    namespace: String,
    attempt: u32,
    /// `ready` or `notready`.
    state: String,
    created_at: i64,
    labels: std::collections::BTreeMap<String, String>,
    annotations: std::collections::BTreeMap<String, String>,
    runtime_handler: String,
}

impl From<&PodSandbox> for SavedSandbox {
    fn from(s: &PodSandbox) -> Self {
        Self {
            id: s.id.clone(),
            name: s.name.clone(),
            uid: s.uid.clone(),
            namespace: s.namespace.clone(),
            attempt: s.attempt,
            state: match s.state {
                PodSandboxState::Ready => "ready",
                PodSandboxState::NotReady => "notready",
            }
            .to_string(),
            created_at: s.created_at,
            labels: s.labels.clone(),
            annotations: s.annotations.clone(),
            runtime_handler: s.runtime_handler.clone(),
        }
    }
}

impl From<SavedSandbox> for PodSandbox {
    fn from(s: SavedSandbox) -> Self {
        Self {
            id: s.id,
            name: s.name,
            uid: s.uid,
            namespace: s.namespace,
            attempt: s.attempt,
            state: if s.state == "ready" { PodSandboxState::Ready } else { PodSandboxState::NotReady },
            created_at: s.created_at,
            labels: s.labels,
            annotations: s.annotations,
            runtime_handler: s.runtime_handler,
        }
    }
}

#[cfg(test)]
mod tests;
