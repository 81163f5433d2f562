//! imaged's API served on a socket for a test: over a running node, until
//! the returned sender is dropped or sent to.

use std::path::Path;
use std::sync::Arc;

use imaged::api::ImagedService;
use imaged::api::server::ApiSocket;
use imaged::node::Node;

/// Binds `path` and serves `node`'s API there on the current actix System.
pub async fn serve_api(node: &Arc<Node>, path: &Path) -> tokio::sync::oneshot::Sender<()> {
    let socket = ApiSocket::bind_at("API socket", path, None).await.expect("binds");
    let (_stopping_tx, stopping) = tokio::sync::watch::channel(false);
    let service = ImagedService::start(node.clone(), stopping).await.expect("service");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    actix::spawn(async move {
        let _keep = _stopping_tx;
        let _ = socket
            .serve(service, 4 << 20, async move {
                let _ = stopped.await;
            })
            .await;
    });
    stop
}
