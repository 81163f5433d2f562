//! Resolves the configured runtime endpoint: a CRI socket, or the embedded
//! runtime started in-process, and connects the CRI gateway to it.

use actix::Addr;

use crate::actors::cri_gateway::CriGatewayActor;
use crate::config::{Config, RuntimeEndpoint};
use crate::cri::CriEndpoint;
use crate::domain::RuntimeVersion;
use crate::embedded::{EmbeddedRuntime, demo_catalogue};
use crate::error::AppError;

/// A connected runtime: the gateway, what the runtime said it is, and the
/// embedded runtime when imaged started one (it stops when this is dropped).
pub struct ConnectedRuntime {
    /// The CRI gateway.
    pub gateway: Addr<CriGatewayActor>,
    /// The runtime's `Version` answer.
    pub version: RuntimeVersion,
    /// The endpoint connected to.
    pub endpoint: CriEndpoint,
    /// The in-process embedded runtime, if the endpoint is `embedded`.
    pub embedded: Option<EmbeddedRuntime>,
}

impl std::fmt::Debug for ConnectedRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectedRuntime").field("endpoint", &self.endpoint).field("version", &self.version).finish()
    }
}

/// Starts the embedded runtime if configured (with the demo catalogue) and
/// connects a CRI gateway to the runtime. Must run inside an actix System.
pub async fn runtime(cfg: &Config) -> Result<ConnectedRuntime, AppError> {
    let (endpoint, embedded) = match &cfg.endpoint {
        RuntimeEndpoint::Cri(e) => (e.clone(), None),
        RuntimeEndpoint::Embedded { socket } => {
            let path = socket
                .clone()
                .unwrap_or_else(|| std::env::temp_dir().join(format!("imaged-embedded-{}.sock", std::process::id())));
            let rt = EmbeddedRuntime::start(path)?;
            for img in demo_catalogue() {
                rt.add_remote(img).map_err(|e| AppError::cri("loading the embedded runtime's catalogue", e))?;
            }
            (rt.endpoint(), Some(rt))
        }
    };
    let (gateway, version) = CriGatewayActor::connect(&endpoint, &cfg.cri)
        .await
        .map_err(|e| AppError::cri(format!("connecting to the CRI runtime at {endpoint}"), e))?;
    Ok(ConnectedRuntime { gateway, version, endpoint, embedded })
}

/// The node credentials the configuration asks for (docker config files,
/// credential-provider plugins). Plugin registration failing is fatal, as
/// in the kubelet (`Failed to register CRI auth plugins`, exit code 1).
pub fn node_credentials(cfg: &Config) -> Result<std::sync::Arc<crate::credentials::NodeCredentials>, AppError> {
    crate::credentials::NodeCredentials::from_settings(&cfg.credentials)
        .map(std::sync::Arc::new)
        .map_err(|e| AppError::Other(format!("Failed to register CRI auth plugins: {e}")))
}
