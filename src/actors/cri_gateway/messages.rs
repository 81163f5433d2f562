//! Messages the CRI gateway receives: one per CRI call, plus `SetFaultPlan`.

use actix::Message;

use crate::cri::CriError;
use crate::domain::{
    AuthConfig, Container, ContainerFilter, ContainerStatus, Download, Image, ImageFsInfo, ImageSpec, ImageStatus,
    PodSandbox, PodSandboxFilter, RuntimeVersion, SandboxConfig,
};
use crate::fault::FaultPlan;

/// `Version`: the runtime's name and versions.
#[derive(Debug, Clone, Default, Message)]
#[rtype(result = "Result<RuntimeVersion, CriError>")]
pub struct GetVersion;

/// `ListImages`: every image, or those matching `filter`.
#[derive(Debug, Clone, Default, Message)]
#[rtype(result = "Result<Vec<Image>, CriError>")]
pub struct ListImages {
    /// Only images matching this spec.
    pub filter: Option<ImageSpec>,
}

/// `ImageStatus`: one image, `None` when absent.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<ImageStatus, CriError>")]
pub struct GetImageStatus {
    /// The image.
    pub image: ImageSpec,
    /// Ask for runtime-specific details.
    pub verbose: bool,
}

/// `PullImage`: pulls and returns the image reference (image id).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<String, CriError>")]
pub struct PullImage {
    /// The image.
    pub image: ImageSpec,
    /// Credentials, if any (never logged).
    pub auth: Option<AuthConfig>,
    /// The pod sandbox the pull is for.
    pub sandbox: Option<SandboxConfig>,
    /// A deadline for this pull, used when it is shorter than the configured
    /// `runtime.deadlines.pull_image` (or when that is off). On expiry the
    /// RPC is cancelled.
    pub deadline: Option<std::time::Duration>,
}

impl PullImage {
    /// A pull of `image`, anonymous, with no sandbox and the configured deadline.
    pub fn new(image: ImageSpec) -> Self {
        Self { image, auth: None, sandbox: None, deadline: None }
    }
}

/// `RemoveImage`: removes an image (by id, tag or digest); absent is success.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), CriError>")]
pub struct RemoveImage {
    /// The image.
    pub image: ImageSpec,
}

/// `ImageFsInfo`: image and container filesystem usage.
#[derive(Debug, Clone, Default, Message)]
#[rtype(result = "Result<ImageFsInfo, CriError>")]
pub struct GetImageFsInfo;

/// `ListContainers`: containers matching the filter (all states by default).
#[derive(Debug, Clone, Default, Message)]
#[rtype(result = "Result<Vec<Container>, CriError>")]
pub struct ListContainers {
    /// Which containers.
    pub filter: ContainerFilter,
}

/// `ListPodSandbox`: sandboxes matching the filter.
#[derive(Debug, Clone, Default, Message)]
#[rtype(result = "Result<Vec<PodSandbox>, CriError>")]
pub struct ListPodSandboxes {
    /// Which sandboxes.
    pub filter: PodSandboxFilter,
}

/// `ContainerStatus`: one container's status.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<ContainerStatus, CriError>")]
pub struct GetContainerStatus {
    /// Container id.
    pub id: String,
    /// Ask for runtime-specific details.
    pub verbose: bool,
}

/// containerd's `Content/ListStatuses`: the downloads in progress on the
/// node (not CRI; a runtime other than containerd answers `Unimplemented`).
/// Bounded by [`DOWNLOADS_DEADLINE`] when no deadline is configured for it.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Result<Vec<Download>, CriError>")]
pub struct ListDownloads;

/// The bound of a [`ListDownloads`] call: a listing of a few ingests that
/// takes longer is no use to a progress view or a stall check.
pub const DOWNLOADS_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Replaces the gateway's fault plan (an empty plan turns faults off).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct SetFaultPlan(pub FaultPlan);

/// Asks for a [`CriReader`](super::CriReader): a handle that runs
/// `ImageStatus` on the caller's task (hot path), sharing the gateway's
/// client, deadlines and fault plan.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "super::CriReader")]
pub struct GetReader;
