//! The CRI gateway: the only actor that speaks CRI. Every other actor sends
//! it typed messages carrying domain types and gets domain types or a
//! [`CriError`](crate::cri::CriError) back.
//!
//! Calls are never serialised: each message starts its RPC on its own task
//! and the actor is free for the next message at once, so 100 concurrent
//! `PullImage` messages are 100 concurrent RPCs. A [`FaultPlan`](crate::fault::FaultPlan)
//! set on the gateway is applied before each RPC.

mod actor;
mod messages;
mod settings;
mod streaming;
#[cfg(test)]
mod tests;

pub use actor::{CriGatewayActor, CriReader};
pub use messages::{
    DOWNLOADS_DEADLINE, GetContainerStatus, GetImageFsInfo, GetImageStatus, GetReader, GetVersion, ListContainers,
    ListDownloads, ListImages, ListPodSandboxes, PullImage, RemoveImage, SetFaultPlan,
};
pub use settings::{CriDeadlines, CriSettings};
