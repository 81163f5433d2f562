//! The event hub actor: subscribed to the node's image events and pull
//! phases, it fans them out to every `WatchEvents` stream through a
//! broadcast channel. A slow watcher loses the oldest events (and is told
//! how many), never slowing a pull.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use tokio::sync::broadcast;

use super::{convert, proto};
use crate::actors::pull_queue::PullPhaseChanged;
use crate::events::ImageEvent;

/// Events kept for a watcher that is behind.
pub const HUB_BUFFER: usize = 1024;

/// Events kept for `WatchEvents { recent: true }`.
pub const RECENT_EVENTS: usize = 256;

/// The last [`RECENT_EVENTS`] events, oldest first.
pub type Recent = Arc<Mutex<VecDeque<proto::Event>>>;

/// Forwards events to the broadcast channel. Mailbox: actix default (16),
/// but senders use `try_send` (the event sink and the pull queue's phase
/// publisher), so a full mailbox drops an event, never blocks.
#[derive(Debug)]
pub struct EventHub {
    tx: broadcast::Sender<proto::Event>,
    recent: Recent,
}

impl EventHub {
    /// A hub, its sender (watchers call `subscribe()` on it) and the recent
    /// events it keeps.
    pub fn new() -> (Self, broadcast::Sender<proto::Event>, Recent) {
        let (tx, _) = broadcast::channel(HUB_BUFFER);
        let recent = Recent::default();
        (Self { tx: tx.clone(), recent: recent.clone() }, tx, recent)
    }

    fn publish(&self, e: proto::Event) {
        {
            let mut r = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            if r.len() == RECENT_EVENTS {
                r.pop_front();
            }
            r.push_back(e.clone());
        }
        // No watcher is not an error.
        let _ = self.tx.send(e);
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
        self.publish(convert::image_event(&e));
    }
}

impl Handler<PullPhaseChanged> for EventHub {
    type Result = ();
    fn handle(&mut self, p: PullPhaseChanged, _: &mut Self::Context) {
        self.publish(convert::phase_event(&p));
    }
}
