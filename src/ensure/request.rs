//! One `EnsureImageExists` call and its answer: the pod, the request, the
//! image that is there or the error that says why not, and the error class
//! of a CRI failure or a failed pull.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::actors::pull_queue::PullFailure;
use crate::cri::{CriError, CriErrorKind};
use crate::domain::pull_policy::PullPolicy;
use crate::domain::{AuthConfig, ErrorClass, ImageErrorKind, SandboxConfig};

/// The pod an image is for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// Pod UID (back-off is per pod UID and image).
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Pod annotations, passed to the runtime in the image spec.
    pub annotations: BTreeMap<String, String>,
    /// RuntimeClass handler; empty = the runtime's default.
    pub runtime_handler: String,
    /// Pull priority (e.g. from the pod's priority class); higher first.
    pub priority: i32,
    /// The pod's service account (`spec.serviceAccountName`), for credential
    /// plugins in service-account token mode (KEP-4412).
    pub service_account: Option<crate::credentials::PodServiceAccount>,
}

/// One `EnsureImageExists` call.
#[derive(Debug, Clone)]
pub struct EnsureImageRequest {
    /// The pod.
    pub pod: PodInfo,
    /// Container name, for the event's object reference.
    pub container: Option<String>,
    /// The image as the pod spec gives it.
    pub image: String,
    /// The pull policy (see [`crate::domain::pull_policy::default_pull_policy`]
    /// for the API server's defaulting of an empty one).
    pub pull_policy: PullPolicy,
    /// The pod's pull secrets (`kubernetes.io/dockerconfigjson` or
    /// `kubernetes.io/dockercfg`); their credentials matching the image are
    /// tried first, in the kubelet's keyring order.
    pub pull_secrets: Vec<crate::credentials::PullSecret>,
    /// Further credentials tried after the secrets' and the node's ones.
    pub credentials: Vec<AuthConfig>,
    /// The pod sandbox config passed to `PullImage`.
    pub sandbox: Option<SandboxConfig>,
    /// Overall pull deadline for this request (overrides the configured one).
    pub deadline: Option<Duration>,
}

impl EnsureImageRequest {
    /// A request for `image` with `policy` for pod `uid`, anonymous.
    pub fn new(uid: impl Into<String>, image: impl Into<String>, policy: PullPolicy) -> Self {
        Self {
            pod: PodInfo { uid: uid.into(), ..PodInfo::default() },
            container: None,
            image: image.into(),
            pull_policy: policy,
            pull_secrets: Vec::new(),
            credentials: Vec::new(),
            sandbox: None,
            deadline: None,
        }
    }
}

/// The image is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsureOk {
    /// Image reference (image id) to create the container from.
    pub image_ref: String,
    /// The kubelet's message (non-empty when the image was already present).
    pub message: String,
}

/// The image is not there, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct EnsureError {
    /// The kubelet's error kind (the container's waiting reason).
    pub kind: ImageErrorKind,
    /// The kubelet's message (the container's waiting message).
    pub message: String,
    /// Whether retrying can help.
    pub class: ErrorClass,
}

/// Class of a CRI failure.
pub fn class_of_cri(e: &CriError) -> ErrorClass {
    match e.kind() {
        CriErrorKind::NotFound
        | CriErrorKind::Unauthorized
        | CriErrorKind::InvalidArgument
        | CriErrorKind::SignatureValidationFailed => ErrorClass::Permanent,
        _ => ErrorClass::Transient,
    }
}

/// Class of a failed pull: permanent only when every attempt failed permanently.
pub fn class_of_pull(f: &PullFailure) -> ErrorClass {
    match f {
        PullFailure::Cri(errs) if !errs.is_empty() && errs.iter().all(|e| class_of_cri(e) == ErrorClass::Permanent) => {
            ErrorClass::Permanent
        }
        _ => ErrorClass::Transient,
    }
}
