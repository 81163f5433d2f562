//! Pure domain types: what imaged knows about images, containers and the
//! runtime, independent of CRI's wire types. Imports neither actix nor tonic.

mod containers;
pub mod download;
pub mod go_text;
mod image;
mod image_error;
pub mod k8s_names;
pub mod limits;
pub mod pull_policy;
pub mod pull_record;
pub mod reference;
mod secret;

pub use containers::{
    Container, ContainerFilter, ContainerState, ContainerStatus, PodSandbox, PodSandboxFilter, PodSandboxState,
    RuntimeVersion,
};
pub use download::{Download, Stall};
pub use image::{AuthConfig, FilesystemUsage, Image, ImageFsInfo, ImageSpec, ImageStatus, SandboxConfig};
pub use image_error::{ErrorClass, ImageErrorKind, eval_cri_pull_err};
pub use secret::Secret;
