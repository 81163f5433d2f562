//! The event hub actor: subscribed to the node's image events and pull
//! phases, it fans them out to every `WatchEvents` stream through a
//! broadcast channel. A slow watcher loses the oldest events (and is told
//! how many), never slowing a pull.

use actix::prelude::*;
use tokio::sync::broadcast;

use super::{convert, proto};
use crate::actors::pull_queue::PullPhaseChanged;
use crate::ensure::ImageEvent;

/// Events kept for a watcher that is behind.
pub const HUB_BUFFER: usize = 1024;

/// Forwards events to the broadcast channel. Mailbox: actix default (16),
/// but senders use `try_send` (the event sink and the pull queue's phase
/// publisher), so a full mailbox drops an event, never blocks.
#[derive(Debug)]
pub struct EventHub {
    tx: broadcast::Sender<proto::Event>,
}

impl EventHub {
    /// A hub and its sender (watchers call `subscribe()` on it).
    pub fn new() -> (Self, broadcast::Sender<proto::Event>) {
        let (tx, _) = broadcast::channel(HUB_BUFFER);
        (Self { tx: tx.clone() }, tx)
    }
}

impl Actor for EventHub {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(HUB_BUFFER);
    }
}

impl Handler<ImageEvent> for EventHub {
    type Result = ();
    fn handle(&mut self, e: ImageEvent, _: &mut Self::Context) {
        // No watcher is not an error.
        let _ = self.tx.send(convert::image_event(&e));
    }
}

impl Handler<PullPhaseChanged> for EventHub {
    type Result = ();
    fn handle(&mut self, p: PullPhaseChanged, _: &mut Self::Context) {
        let _ = self.tx.send(convert::phase_event(&p));
    }
}
