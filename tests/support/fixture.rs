//! An embedded runtime and a CRI gateway connected to it, for flow tests.

use std::time::Duration;

use actix::Addr;
use imaged::actors::cri_gateway::CriGatewayActor;
use imaged::actors::cri_gateway::{CriDeadlines, CriSettings};
use imaged::embedded::EmbeddedRuntime;

/// A runtime, its socket's temp dir and a gateway to it.
pub struct Runtime {
    pub _dir: tempfile::TempDir,
    pub runtime: EmbeddedRuntime,
    pub gateway: Addr<CriGatewayActor>,
}

/// Starts an embedded runtime and connects a gateway (10 s deadlines, none for pulls).
pub async fn runtime() -> Runtime {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = EmbeddedRuntime::start_in(dir.path()).expect("embedded runtime starts");
    let cfg = CriSettings {
        startup_timeout: Duration::from_secs(5),
        deadlines: CriDeadlines::uniform(Some(Duration::from_secs(10))).with(imaged::cri::Rpc::PullImage, None),
        ..CriSettings::default()
    };
    let (gateway, _) = CriGatewayActor::connect(&runtime.endpoint(), &cfg).await.expect("gateway connects");
    Runtime { _dir: dir, runtime, gateway }
}
