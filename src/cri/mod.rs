//! Everything that speaks CRI: generated types, conversions, the endpoint and
//! channel, the typed client and `CriError`. Only the CRI gateway actor (and
//! the embedded runtime, which serves CRI) use this module's wire side.

mod client;
pub(crate) mod convert;
mod endpoint;
mod error;
pub mod proto;
pub mod server;
pub mod transport;
pub mod wire;

pub use client::{CriClient, KUBE_RUNTIME_API_VERSION};
pub use convert::server_address_for_runtime;
pub use endpoint::{CriEndpoint, InvalidEndpoint};
pub use error::{CriError, CriErrorKind, REGISTRY_UNAVAILABLE, Rpc, SIGNATURE_VALIDATION_FAILED, StatusCode};
