//! The event hub actor: subscribed to the node's image events and pull
//! phases, it fans them out to every watcher (the API's `WatchEvents`
//! streams) through a broadcast channel, and keeps the last few for a
//! watcher that asks for recent ones. A slow watcher loses the oldest
//! events (and is told how many), never slowing a pull.
//!
//! The hub publishes whatever item type its owner converts events into
//! (the API's `proto::Event`), once per event, not once per watcher.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use tokio::sync::broadcast;

use crate::actors::pull_queue::PullPhaseChanged;
use crate::events::ImageEvent;

/// Events kept for `WatchEvents { recent: true }`.
pub const RECENT_EVENTS: usize = 256;

/// The last [`RECENT_EVENTS`] items, oldest first.
pub type Recent<T> = Arc<Mutex<VecDeque<T>>>;

/// What a watcher needs: the broadcast sender to `subscribe()` to and the
/// recent items.
#[derive(Debug, Clone)]
pub struct HubFeed<T> {
    /// Watchers call `subscribe()` on it.
    pub sender: broadcast::Sender<T>,
    /// The last [`RECENT_EVENTS`] items.
    pub recent: Recent<T>,
}

impl<T: Clone> HubFeed<T> {
    /// Keeps `item` among the recent ones (dropping the oldest past
    /// [`RECENT_EVENTS`]) and sends it to every watcher; none is not an error.
    pub fn publish(&self, item: T) {
        {
            let mut r = self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if r.len() == RECENT_EVENTS {
                r.pop_front();
            }
            r.push_back(item.clone());
        }
        let _ = self.sender.send(item);
    }
}

/// The hub: a shell over a [`HubFeed`]. Mailbox: `capacity` (the daemon's
/// `daemon.event_buffer`), and
/// each watcher's broadcast buffer the same; publishers use `try_send`, so
/// a full mailbox drops an event, never blocks.
pub struct EventHub<T> {
    feed: HubFeed<T>,
    capacity: usize,
    of_event: fn(&ImageEvent) -> T,
    of_phase: fn(&PullPhaseChanged) -> T,
}

impl<T> std::fmt::Debug for EventHub<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventHub").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

impl<T: Clone + Send + 'static> EventHub<T> {
    /// A hub holding up to `capacity` items per watcher (and in its
    /// mailbox), converting events and phases with `of_event` and
    /// `of_phase`; and the feed watchers read.
    pub fn new(
        capacity: usize,
        of_event: fn(&ImageEvent) -> T,
        of_phase: fn(&PullPhaseChanged) -> T,
    ) -> (Self, HubFeed<T>) {
        let capacity = capacity.max(1);
        let (sender, _) = broadcast::channel(capacity);
        let feed = HubFeed { sender, recent: Recent::default() };
        (Self { feed: feed.clone(), capacity, of_event, of_phase }, feed)
    }
}

impl<T: Clone + Send + Unpin + 'static> Actor for EventHub<T> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.capacity);
    }
}

impl<T: Clone + Send + Unpin + 'static> Handler<ImageEvent> for EventHub<T> {
    type Result = ();
    fn handle(&mut self, e: ImageEvent, _: &mut Self::Context) {
        self.feed.publish((self.of_event)(&e));
    }
}

impl<T: Clone + Send + Unpin + 'static> Handler<PullPhaseChanged> for EventHub<T> {
    type Result = ();
    fn handle(&mut self, p: PullPhaseChanged, _: &mut Self::Context) {
        self.feed.publish((self.of_phase)(&p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_feed_keeps_the_recent_window_and_a_slow_watcher_lags_without_blocking() {
        let (_, feed) = EventHub::<usize>::new(4, |_| 0, |_| 0);
        let mut rx = feed.sender.subscribe();
        feed.publish(0); // before the window fills
        for i in 1..(RECENT_EVENTS + 3) {
            feed.publish(i);
        }
        let recent: Vec<usize> = feed.recent.lock().unwrap().iter().copied().collect();
        assert_eq!(recent.len(), RECENT_EVENTS);
        assert_eq!((recent[0], recent[RECENT_EVENTS - 1]), (3, RECENT_EVENTS + 2), "oldest dropped first");
        assert!(matches!(rx.recv().await, Err(broadcast::error::RecvError::Lagged(_))), "told it lost some");
        assert_eq!(rx.recv().await.unwrap(), RECENT_EVENTS - 1, "then reads the oldest of the 4 it kept");
    }

    #[test]
    fn publishing_without_watchers_is_not_an_error() {
        let (_, feed) = EventHub::<u8>::new(1, |_| 0, |_| 0);
        feed.publish(1);
        assert_eq!(feed.recent.lock().unwrap().len(), 1);
    }

    #[actix::test]
    async fn publishes_to_watchers_and_keeps_only_the_recent_window() {
        let (hub, feed) = EventHub::<String>::new(4, |e| e.message.clone(), |_| "phase".to_string());
        let mut rx = feed.sender.subscribe();
        let hub = hub.start();
        for i in 0..(RECENT_EVENTS + 3) {
            let reason = crate::events::EventReason::Pulling;
            let e = ImageEvent {
                event_type: reason.event_type(),
                reason,
                message: format!("e{i}"),
                object: crate::events::ObjectRef::default(),
                image: String::new(),
                class: None,
            };
            hub.send(e).await.unwrap();
        }
        let recent = feed.recent.lock().unwrap().clone();
        assert_eq!(recent.len(), RECENT_EVENTS);
        assert_eq!(recent.front().map(String::as_str), Some("e3"));
        // The watcher's buffer holds 4: it lagged, then reads the newest.
        assert!(matches!(rx.recv().await, Err(broadcast::error::RecvError::Lagged(_))));
        assert_eq!(rx.recv().await.unwrap(), format!("e{}", RECENT_EVENTS - 1));
    }
}
