//! Pure domain types: what imaged knows about images, containers and the
//! runtime, independent of CRI's wire types. Imports neither actix nor tonic.

mod image;
mod runtime;
mod secret;

pub use image::{AuthConfig, Image, ImageFsInfo, ImageSpec, FilesystemUsage, ImageStatus, SandboxConfig};
pub use runtime::{
    Container, ContainerFilter, ContainerState, ContainerStatus, PodSandbox, PodSandboxFilter,
    PodSandboxState, RuntimeVersion,
};
pub use secret::Secret;
