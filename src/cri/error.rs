//! `CriError`: what went wrong with a CRI call, classified for callers.
//!
//! This is the only error type that knows about gRPC statuses. Its `Display`
//! is the text the kubelet shows for the same failure, because users and
//! tools match on it: a status with code `Unknown` prints its bare message
//! (the kubelet's remote image client strips the code from those), any other
//! code prints Go's `rpc error: code = <Code> desc = <message>`.

use std::fmt;

/// The CRI calls imaged makes: one per typed gateway message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rpc {
    /// `RuntimeService/Version`.
    Version,
    /// `ImageService/ListImages`.
    ListImages,
    /// `ImageService/ImageStatus`.
    ImageStatus,
    /// `ImageService/PullImage`.
    PullImage,
    /// `ImageService/RemoveImage`.
    RemoveImage,
    /// `ImageService/ImageFsInfo`.
    ImageFsInfo,
    /// `RuntimeService/ListContainers`.
    ListContainers,
    /// `RuntimeService/ListPodSandbox`.
    ListPodSandbox,
    /// `RuntimeService/ContainerStatus`.
    ContainerStatus,
    /// containerd's `Content/ListStatuses` (not CRI: the downloads in
    /// progress, on the same socket; other runtimes answer `Unimplemented`).
    ListStatuses,
}

impl Rpc {
    /// The reads imaged's CRI front answers from what it keeps for
    /// `cri_server.read_cache_ttl` (the kubelet's most frequent calls): the
    /// methods of `imaged_cri_front_cached_answers_total`.
    pub const KEPT_BY_FRONT: [Rpc; 2] = [Rpc::ImageStatus, Rpc::ListImages];

    /// Every RPC, in declaration order.
    pub const ALL: [Rpc; 10] = [
        Rpc::Version,
        Rpc::ListImages,
        Rpc::ImageStatus,
        Rpc::PullImage,
        Rpc::RemoveImage,
        Rpc::ImageFsInfo,
        Rpc::ListContainers,
        Rpc::ListPodSandbox,
        Rpc::ContainerStatus,
        Rpc::ListStatuses,
    ];

    /// The CRI service the RPC belongs to (`ImageService`).
    pub fn service(self) -> &'static str {
        match self {
            Rpc::Version | Rpc::ListContainers | Rpc::ListPodSandbox | Rpc::ContainerStatus => "RuntimeService",
            Rpc::ListImages | Rpc::ImageStatus | Rpc::PullImage | Rpc::RemoveImage | Rpc::ImageFsInfo => "ImageService",
            Rpc::ListStatuses => "Content",
        }
    }

    /// The RPC's CRI method name (`PullImage`).
    pub fn name(self) -> &'static str {
        match self {
            Rpc::Version => "Version",
            Rpc::ListImages => "ListImages",
            Rpc::ImageStatus => "ImageStatus",
            Rpc::PullImage => "PullImage",
            Rpc::RemoveImage => "RemoveImage",
            Rpc::ImageFsInfo => "ImageFsInfo",
            Rpc::ListContainers => "ListContainers",
            Rpc::ListPodSandbox => "ListPodSandbox",
            Rpc::ContainerStatus => "ContainerStatus",
            Rpc::ListStatuses => "ListStatuses",
        }
    }
}

impl Rpc {
    /// The kubelet's `operation_type` label of the RPC in
    /// `kubelet_runtime_operations_*` (`pull_image`, `list_podsandbox`).
    pub fn operation_type(self) -> &'static str {
        match self {
            Rpc::Version => "version",
            Rpc::ListImages => "list_images",
            Rpc::ImageStatus => "image_status",
            Rpc::PullImage => "pull_image",
            Rpc::RemoveImage => "remove_image",
            Rpc::ImageFsInfo => "image_fs_info",
            Rpc::ListContainers => "list_containers",
            Rpc::ListPodSandbox => "list_podsandbox",
            Rpc::ContainerStatus => "container_status",
            Rpc::ListStatuses => "list_content_statuses",
        }
    }
}

impl fmt::Display for Rpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Rpc {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Rpc::ALL.into_iter().find(|r| r.name().eq_ignore_ascii_case(s)).ok_or_else(|| format!("unknown CRI call {s:?}"))
    }
}

/// gRPC status codes, with Go's names (which appear in error texts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum StatusCode {
    Ok,
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl StatusCode {
    /// Go's name for the code, as in `rpc error: code = NotFound`.
    pub fn go_name(self) -> &'static str {
        match self {
            StatusCode::Ok => "OK",
            StatusCode::Canceled => "Canceled",
            StatusCode::Unknown => "Unknown",
            StatusCode::InvalidArgument => "InvalidArgument",
            StatusCode::DeadlineExceeded => "DeadlineExceeded",
            StatusCode::NotFound => "NotFound",
            StatusCode::AlreadyExists => "AlreadyExists",
            StatusCode::PermissionDenied => "PermissionDenied",
            StatusCode::ResourceExhausted => "ResourceExhausted",
            StatusCode::FailedPrecondition => "FailedPrecondition",
            StatusCode::Aborted => "Aborted",
            StatusCode::OutOfRange => "OutOfRange",
            StatusCode::Unimplemented => "Unimplemented",
            StatusCode::Internal => "Internal",
            StatusCode::Unavailable => "Unavailable",
            StatusCode::DataLoss => "DataLoss",
            StatusCode::Unauthenticated => "Unauthenticated",
        }
    }
}

/// What kind of failure a [`CriError`] is; callers branch on this.
///
/// `RegistryUnavailable` and `SignatureValidationFailed` are recognised by
/// message prefix, as the kubelet does, because runtimes report them as
/// `Unknown` statuses whose text starts with the CRI error name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CriErrorKind {
    /// The image (or container) does not exist.
    NotFound,
    /// The runtime cannot be reached or is not serving (connection refused,
    /// socket missing, `Unavailable`).
    RuntimeUnavailable,
    /// The call's deadline passed before an answer came.
    DeadlineExceeded,
    /// The registry or runtime refused the credentials
    /// (`Unauthenticated`, `PermissionDenied`, a registry's 401/403).
    Unauthorized,
    /// The runtime is out of some resource (disk, quota, concurrency).
    ResourceExhausted,
    /// The registry could not be reached (`RegistryUnavailable…` message).
    RegistryUnavailable,
    /// The image's signature did not validate (`SignatureValidationFailed…`).
    SignatureValidationFailed,
    /// The runtime rejected the request as malformed.
    InvalidArgument,
    /// The runtime answered with something imaged cannot use.
    InvalidResponse,
    /// Anything else.
    Other,
}

impl CriErrorKind {
    /// Every kind.
    pub const ALL: [CriErrorKind; 10] = [
        CriErrorKind::NotFound,
        CriErrorKind::RuntimeUnavailable,
        CriErrorKind::DeadlineExceeded,
        CriErrorKind::Unauthorized,
        CriErrorKind::ResourceExhausted,
        CriErrorKind::RegistryUnavailable,
        CriErrorKind::SignatureValidationFailed,
        CriErrorKind::InvalidArgument,
        CriErrorKind::InvalidResponse,
        CriErrorKind::Other,
    ];

    /// The code a runtime would send for this kind of failure.
    pub fn default_code(self) -> StatusCode {
        match self {
            CriErrorKind::NotFound => StatusCode::NotFound,
            CriErrorKind::RuntimeUnavailable => StatusCode::Unavailable,
            CriErrorKind::DeadlineExceeded => StatusCode::DeadlineExceeded,
            CriErrorKind::Unauthorized => StatusCode::Unauthenticated,
            CriErrorKind::ResourceExhausted => StatusCode::ResourceExhausted,
            CriErrorKind::InvalidArgument => StatusCode::InvalidArgument,
            CriErrorKind::InvalidResponse => StatusCode::Internal,
            CriErrorKind::RegistryUnavailable | CriErrorKind::SignatureValidationFailed | CriErrorKind::Other => {
                StatusCode::Unknown
            }
        }
    }
}

/// Prefix of a `RegistryUnavailable` error message (cri-api `ErrRegistryUnavailable`).
pub const REGISTRY_UNAVAILABLE: &str = "RegistryUnavailable";
/// Prefix of a `SignatureValidationFailed` error message.
pub const SIGNATURE_VALIDATION_FAILED: &str = "SignatureValidationFailed";

/// A failed CRI call.
///
/// Retry semantics: [`CriError::is_retryable`] is true when the same call may
/// succeed later with nothing changed on our side (runtime or registry down,
/// deadline, exhaustion, unclassified failures); false when it cannot
/// (not found, unauthorized, invalid, bad signature, unusable answer).
#[derive(Clone, PartialEq, Eq)]
pub struct CriError {
    kind: CriErrorKind,
    code: StatusCode,
    message: String,
}

impl CriError {
    /// An error of `kind` with the runtime's usual code for it. For
    /// `RegistryUnavailable` and `SignatureValidationFailed` the message gets
    /// the CRI prefix (`RegistryUnavailable: <message>`) unless it has it.
    pub fn new(kind: CriErrorKind, message: impl Into<String>) -> Self {
        let mut message = message.into();
        let prefix = match kind {
            CriErrorKind::RegistryUnavailable => Some(REGISTRY_UNAVAILABLE),
            CriErrorKind::SignatureValidationFailed => Some(SIGNATURE_VALIDATION_FAILED),
            _ => None,
        };
        if let Some(p) = prefix
            && !message.starts_with(p)
        {
            message = if message.is_empty() { p.to_string() } else { format!("{p}: {message}") };
        }
        Self { kind, code: kind.default_code(), message }
    }

    /// Classifies a status as a runtime sent it (code and message).
    pub fn from_status(code: StatusCode, message: impl Into<String>) -> Self {
        let message = message.into();
        let kind = classify(code, &message);
        Self { kind, code, message }
    }

    /// The deadline of a call passed (`context deadline exceeded`, as Go says).
    pub fn deadline_exceeded() -> Self {
        Self::new(CriErrorKind::DeadlineExceeded, "context deadline exceeded")
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> CriErrorKind {
        self.kind
    }

    /// The gRPC status code.
    pub fn code(&self) -> StatusCode {
        self.code
    }

    /// The status message (without the `rpc error:` wrapping).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the same call may succeed later unchanged (see the type docs).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            CriErrorKind::RuntimeUnavailable
                | CriErrorKind::DeadlineExceeded
                | CriErrorKind::ResourceExhausted
                | CriErrorKind::RegistryUnavailable
                | CriErrorKind::Other
        )
    }
}

/// Kind from code and message. Message prefixes win (the kubelet matches on
/// them); containerd reports registry 401/403 as `Unknown`, so those texts
/// are recognised too.
fn classify(code: StatusCode, message: &str) -> CriErrorKind {
    if message.starts_with(REGISTRY_UNAVAILABLE) {
        return CriErrorKind::RegistryUnavailable;
    }
    if message.starts_with(SIGNATURE_VALIDATION_FAILED) {
        return CriErrorKind::SignatureValidationFailed;
    }
    match code {
        StatusCode::NotFound => CriErrorKind::NotFound,
        StatusCode::Unavailable => CriErrorKind::RuntimeUnavailable,
        StatusCode::DeadlineExceeded => CriErrorKind::DeadlineExceeded,
        StatusCode::Unauthenticated | StatusCode::PermissionDenied => CriErrorKind::Unauthorized,
        StatusCode::ResourceExhausted => CriErrorKind::ResourceExhausted,
        StatusCode::InvalidArgument => CriErrorKind::InvalidArgument,
        _ if message.contains("401 Unauthorized") || message.contains("403 Forbidden") => CriErrorKind::Unauthorized,
        _ => CriErrorKind::Other,
    }
}

impl fmt::Display for CriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.code == StatusCode::Unknown {
            f.write_str(&self.message)
        } else {
            write!(f, "rpc error: code = {} desc = {}", self.code.go_name(), self.message)
        }
    }
}

impl fmt::Debug for CriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CriError")
            .field("kind", &self.kind)
            .field("code", &self.code)
            .field("message", &self.message)
            .finish()
    }
}

impl std::error::Error for CriError {}

// === tonic conversions (the only place that sees tonic::Status) ===

impl From<tonic::Code> for StatusCode {
    fn from(c: tonic::Code) -> Self {
        use tonic::Code as C;
        match c {
            C::Ok => StatusCode::Ok,
            C::Cancelled => StatusCode::Canceled,
            C::Unknown => StatusCode::Unknown,
            C::InvalidArgument => StatusCode::InvalidArgument,
            C::DeadlineExceeded => StatusCode::DeadlineExceeded,
            C::NotFound => StatusCode::NotFound,
            C::AlreadyExists => StatusCode::AlreadyExists,
            C::PermissionDenied => StatusCode::PermissionDenied,
            C::ResourceExhausted => StatusCode::ResourceExhausted,
            C::FailedPrecondition => StatusCode::FailedPrecondition,
            C::Aborted => StatusCode::Aborted,
            C::OutOfRange => StatusCode::OutOfRange,
            C::Unimplemented => StatusCode::Unimplemented,
            C::Internal => StatusCode::Internal,
            C::Unavailable => StatusCode::Unavailable,
            C::DataLoss => StatusCode::DataLoss,
            C::Unauthenticated => StatusCode::Unauthenticated,
        }
    }
}

impl From<StatusCode> for tonic::Code {
    fn from(c: StatusCode) -> Self {
        use tonic::Code as C;
        match c {
            StatusCode::Ok => C::Ok,
            StatusCode::Canceled => C::Cancelled,
            StatusCode::Unknown => C::Unknown,
            StatusCode::InvalidArgument => C::InvalidArgument,
            StatusCode::DeadlineExceeded => C::DeadlineExceeded,
            StatusCode::NotFound => C::NotFound,
            StatusCode::AlreadyExists => C::AlreadyExists,
            StatusCode::PermissionDenied => C::PermissionDenied,
            StatusCode::ResourceExhausted => C::ResourceExhausted,
            StatusCode::FailedPrecondition => C::FailedPrecondition,
            StatusCode::Aborted => C::Aborted,
            StatusCode::OutOfRange => C::OutOfRange,
            StatusCode::Unimplemented => C::Unimplemented,
            StatusCode::Internal => C::Internal,
            StatusCode::Unavailable => C::Unavailable,
            StatusCode::DataLoss => C::DataLoss,
            StatusCode::Unauthenticated => C::Unauthenticated,
        }
    }
}

impl From<tonic::Status> for CriError {
    fn from(s: tonic::Status) -> Self {
        // A transport failure (socket gone, connection refused or reset)
        // reaches us as an Unknown/Unavailable status whose source is the
        // transport error; report it as the runtime being unavailable, with
        // the text grpc-go would show.
        let code = StatusCode::from(s.code());
        // A tonic server answers an expired grpc-timeout with this status
        // where grpc-go says DeadlineExceeded; it is the same event.
        if code == StatusCode::Canceled && s.message() == "Timeout expired" {
            return CriError::deadline_exceeded();
        }
        if matches!(code, StatusCode::Unknown | StatusCode::Unavailable) && is_transport(&s) {
            let detail = transport_detail(&s);
            return CriError {
                kind: CriErrorKind::RuntimeUnavailable,
                code: StatusCode::Unavailable,
                message: format!("connection error: desc = \"transport: {detail}\""),
            };
        }
        CriError::from_status(code, s.message())
    }
}

impl From<&CriError> for tonic::Status {
    fn from(e: &CriError) -> Self {
        tonic::Status::new(e.code.into(), e.message.clone())
    }
}

fn is_transport(s: &tonic::Status) -> bool {
    use std::error::Error as _;
    let mut src = s.source();
    while let Some(e) = src {
        if e.is::<tonic::transport::Error>() || e.is::<std::io::Error>() {
            return true;
        }
        src = e.source();
    }
    false
}

fn transport_detail(s: &tonic::Status) -> String {
    use std::error::Error as _;
    // The innermost cause is the most specific (e.g. "No such file or directory").
    let mut last = s.message().to_string();
    let mut src = s.source();
    while let Some(e) = src {
        last = e.to_string();
        src = e.source();
    }
    last
}

#[cfg(test)]
mod tests;
