//! imaged's CRI front served on a socket for a test: over a running node,
//! until the returned sender is dropped or sent to.

use std::path::Path;
use std::sync::Arc;

use imaged::api::server::ApiSocket;
use imaged::cri_front::CriFront;
use imaged::node::Node;

/// Binds `path` and serves `node`'s CRI front there on the current actix
/// System; dropping the returned sender stops it.
pub async fn serve_front(node: &Arc<Node>, path: &Path) -> tokio::sync::oneshot::Sender<()> {
    let socket = ApiSocket::bind_at("CRI socket", path, None).await.expect("binds");
    let front = CriFront::over(node, &node.config().cri_server).await.expect("front");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    actix::spawn(async move {
        let _ = imaged::cri_front::serve(socket, front, async move {
            let _ = stopped.await;
        })
        .await;
    });
    stop
}
