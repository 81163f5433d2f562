//! Containers, pod sandboxes and the runtime's version, as GC needs them.

use std::collections::BTreeMap;

use super::ImageSpec;

/// The runtime's answer to `Version`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// Version of the kubelet runtime API (`0.1.0`).
    pub version: String,
    /// Runtime name (`containerd`, `imaged-embedded`).
    pub runtime_name: String,
    /// Runtime version (`1.6.20~ds1`).
    pub runtime_version: String,
    /// API version of the runtime (`v1`).
    pub runtime_api_version: String,
}

/// State of a container.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ContainerState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// Unknown.
    #[default]
    Unknown,
}

/// State of a pod sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum PodSandboxState {
    /// Ready.
    Ready,
    /// Not ready.
    #[default]
    NotReady,
}

/// A container the runtime knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Container {
    /// Container id.
    pub id: String,
    /// Sandbox the container belongs to.
    pub pod_sandbox_id: String,
    /// Container name from its metadata.
    pub name: String,
    /// Attempt number from its metadata.
    pub attempt: u32,
    /// Image spec the container was created from.
    pub image: ImageSpec,
    /// Image reference (for containerd, the image id).
    pub image_ref: String,
    /// Image id (CRI field `image_id`, newer runtimes).
    pub image_id: String,
    /// State.
    pub state: ContainerState,
    /// Creation time, nanoseconds since the epoch.
    pub created_at: i64,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
}

/// Which containers `ListContainers` returns (all set fields must match).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerFilter {
    /// Only this container.
    pub id: Option<String>,
    /// Only containers in this state.
    pub state: Option<ContainerState>,
    /// Only containers of this sandbox.
    pub pod_sandbox_id: Option<String>,
    /// Only containers carrying all these labels.
    pub label_selector: BTreeMap<String, String>,
}

/// A container's status (`ContainerStatus`), the parts imaged reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerStatus {
    /// Container id.
    pub id: String,
    /// Container name.
    pub name: String,
    /// State.
    pub state: ContainerState,
    /// Created, nanoseconds since the epoch.
    pub created_at: i64,
    /// Started, nanoseconds since the epoch.
    pub started_at: i64,
    /// Finished, nanoseconds since the epoch.
    pub finished_at: i64,
    /// Exit code.
    pub exit_code: i32,
    /// Image spec.
    pub image: ImageSpec,
    /// Image reference.
    pub image_ref: String,
    /// Image id.
    pub image_id: String,
    /// Short reason for the state.
    pub reason: String,
    /// Human-readable message for the state.
    pub message: String,
}

/// A pod sandbox the runtime knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSandbox {
    /// Sandbox id.
    pub id: String,
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// Pod namespace.
    pub namespace: String,
    /// Attempt number.
    pub attempt: u32,
    /// State.
    pub state: PodSandboxState,
    /// Creation time, nanoseconds since the epoch.
    pub created_at: i64,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Runtime handler.
    pub runtime_handler: String,
}

/// Which sandboxes `ListPodSandbox` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSandboxFilter {
    /// Only this sandbox.
    pub id: Option<String>,
    /// Only sandboxes in this state.
    pub state: Option<PodSandboxState>,
    /// Only sandboxes carrying all these labels.
    pub label_selector: BTreeMap<String, String>,
}
