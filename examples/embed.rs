//! An actix node agent embedding imaged as a library.
//!
//! `cargo run --example embed` — starts every imaged actor on this agent's
//! actix System (on the embedded runtime, so it runs anywhere; set
//! `IMAGED_RUNTIME__ENDPOINT=unix:///run/containerd/containerd.sock` to use
//! containerd), subscribes the agent's own actor to image events and pull
//! phases, ensures images for two pods, shows the back-off of a missing
//! image, plans a GC, and shuts down gracefully.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use actix::prelude::*;
use imaged::actors::pull_queue::PullPhaseChanged;
use imaged::config::{Config, Sources};
use imaged::domain::pull_policy::PullPolicy;
use imaged::ensure::EnsureImageRequest;
use imaged::events::ImageEvent;
use imaged::node::Node;

/// The agent's actor: here it just prints what imaged reports.
struct Agent;

impl Actor for Agent {
    type Context = Context<Self>;
}

impl Handler<ImageEvent> for Agent {
    type Result = ();
    fn handle(&mut self, e: ImageEvent, _: &mut Self::Context) {
        println!("agent: event {} {} for {}: {}", e.event_type, e.reason, e.object.pod_name, e.message);
    }
}

impl Handler<PullPhaseChanged> for Agent {
    type Result = ();
    fn handle(&mut self, p: PullPhaseChanged, _: &mut Self::Context) {
        println!("agent: phase {:?} {}", p.phase, p.image);
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Defaults, then IMAGED_<SECTION>__<KEY> from the environment.
    let cfg = Config::load(&Sources { env: Some(std::env::vars().collect()), ..Sources::default() })?;
    actix::System::new().block_on(async move {
        let node = Node::start(cfg).await?;
        let agent = Agent.start();
        node.subscribe_events(agent.clone().recipient());
        node.subscribe_phases(agent.recipient()).await?;

        for (pod, image) in [("web-1", "nginx:1.27"), ("web-2", "nginx:1.27"), ("job-1", "docker.io/library/gone:1")] {
            let mut req = EnsureImageRequest::new(format!("uid-{pod}"), image, PullPolicy::IfNotPresent);
            req.pod.namespace = "default".into();
            req.pod.name = pod.into();
            match node.ensure_image_exists(&req).await? {
                Ok(ok) => println!("agent: {pod} can start from {}", ok.image_ref),
                Err(e) => println!("agent: {pod} waits: {}: {}", e.kind, e.message),
            }
        }
        let plan = node.garbage_collect(true).await?;
        for e in &plan.entries {
            println!("agent: gc plan {} {}", e.repo_tags.join(","), e.explain());
        }
        let status = node.status().await?;
        println!("agent: {} back-off key(s); queue {:?}", status.backoffs.len(), status.queue);
        let report = node.shutdown(Duration::from_secs(10)).await;
        println!("agent: imaged stopped ({} pull(s) abandoned)", report.abandoned_pulls);
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
