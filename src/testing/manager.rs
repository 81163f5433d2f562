//! An ensure flow over its own pull queue and backoff registry, started the
//! way `node::Node` wires them, for tests and benches that want the
//! manager without a whole node.

use actix::{Actor as _, Addr, MailboxError};

use crate::actors::backoff_registry::{BackoffRegistryActor, BackoffSettings};
use crate::actors::cri_gateway::{CriGatewayActor, GetReader};
use crate::actors::pull_queue::{PullQueueActor, PullQueueSettings};
use crate::ensure::{EnsureSettings, ImageManager};

/// A started manager and the actors it sends to.
#[derive(Debug, Clone)]
pub struct StartedManager {
    /// The manager; it reports to `pull.metrics`.
    pub manager: ImageManager,
    /// Its pull queue (`ListPulls`, `GetQueueStatus`, `SubscribePhases`).
    pub queue: Addr<PullQueueActor>,
    /// Its backoff registry (`ClearBackoff`, `ListBackoffs`).
    pub backoff: Addr<BackoffRegistryActor>,
}

/// Starts a pull queue with `pull` and a backoff registry with `backoff` on
/// the current actix arbiter, and a manager over them and `gateway` (as
/// `node::Node` does). Fails only if the gateway has stopped.
pub async fn start_manager(
    gateway: &Addr<CriGatewayActor>,
    pull: &PullQueueSettings,
    backoff: &BackoffSettings,
    cfg: EnsureSettings,
) -> Result<StartedManager, MailboxError> {
    let reader = gateway.send(GetReader).await?;
    let queue = PullQueueActor::new(pull.clone(), reader.clone()).start();
    let (backoff, port) = BackoffRegistryActor::from_settings(backoff).start_with_port();
    let manager = ImageManager::new(reader, queue.clone().recipient(), port, cfg)
        .with_metrics(pull.metrics.clone())
        .with_records_due(pull.records_due.clone());
    Ok(StartedManager { manager, queue, backoff })
}
