//! The prefetch ticker: keeps the declared images (`[prefetch] images`)
//! pulled. At start and every `prefetch.refresh` it prefetches each in
//! turn through the image manager ([`ImageManager::prefetch`]): a present
//! image costs one presence check; an absent one is queued at
//! [`PRIORITY`] with the node's credentials, and its pull goes on without
//! the ticker (the prefetch's own task records and logs its end). A round
//! that is still being admitted when the next tick comes (a full pull
//! queue) is not doubled: that tick is skipped.
//!
//! The actor is a shell: what to prefetch comes from the configuration,
//! and everything a prefetch does is the manager's. It lives with the
//! node's wiring, above the ensure flow it drives (`tests/layering.rs`).

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tracing::{debug, info, warn};

use crate::ensure::{ImageManager, Prefetch, PrefetchRequest};

/// The declared images' pull priority: below pods' (0), so a pod's pull
/// queued meanwhile goes first.
pub const PRIORITY: i32 = -1;

/// See the module docs.
pub struct PrefetchTickerActor {
    manager: ImageManager,
    images: Arc<[String]>,
    refresh: Option<Duration>,
    /// The refresh timer, replaced when a reload changes the period.
    timer: Option<SpawnHandle>,
    /// A round is being admitted.
    busy: bool,
    /// The list changed while a round was being admitted: a round of the
    /// new list runs when that one ends.
    again: bool,
}

/// Replaces the declared list and its refresh period (a SIGHUP reload of
/// `[prefetch] images`, `refresh`): a round of the new list runs at once
/// when the list changed (an image added is pulled now, not at the next
/// refresh), and the timer restarts when the period changed. A round
/// being admitted finishes with the list it began with, and the new list's
/// round follows it.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct UpdatePrefetchList {
    /// The images, fully qualified.
    pub images: Vec<String>,
    /// The refresh period (`None`: no refresh).
    pub refresh: Option<Duration>,
}

impl PrefetchTickerActor {
    /// A ticker for `images` (fully qualified), every `refresh` (`None`:
    /// once, at start).
    pub fn new(manager: ImageManager, images: Vec<String>, refresh: Option<Duration>) -> Self {
        Self { manager, images: images.into(), refresh, timer: None, busy: false, again: false }
    }

    fn start_timer(&mut self, ctx: &mut Context<Self>) {
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
        self.timer = self.refresh.map(|every| ctx.run_interval(every, Self::round));
    }

    fn round(&mut self, ctx: &mut Context<Self>) {
        if self.busy {
            debug!("prefetch: the last round is still being admitted; this tick is skipped");
            return;
        }
        self.busy = true;
        let (manager, images) = (self.manager.clone(), self.images.clone());
        let round = async move {
            for image in images.iter() {
                prefetch_one(&manager, image).await;
            }
        };
        ctx.spawn(round.into_actor(self).map(|(), actor, ctx| {
            actor.busy = false;
            if std::mem::take(&mut actor.again) {
                actor.round(ctx);
            }
        }));
    }
}

/// Prefetches one declared image, saying what came of it.
async fn prefetch_one(manager: &ImageManager, image: &str) {
    let req = PrefetchRequest { priority: PRIORITY, ..PrefetchRequest::new(image) };
    match manager.prefetch(&req).await {
        Ok(Prefetch::Present { .. }) => debug!(image, "prefetch: declared image present"),
        Ok(Prefetch::Pulling { joined, .. }) => info!(image, joined, "prefetch: pulling a declared image"),
        Err(e) => {
            warn!(image, reason = %e.kind, error = %e.message, "prefetch: declared image not queued; trying again at the next refresh");
        }
    }
}

impl Handler<crate::actors::Stop> for PrefetchTickerActor {
    type Result = ();
    fn handle(&mut self, _: crate::actors::Stop, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Handler<UpdatePrefetchList> for PrefetchTickerActor {
    type Result = ();
    fn handle(&mut self, m: UpdatePrefetchList, ctx: &mut Self::Context) {
        let changed_list = *self.images != *m.images;
        let changed_period = self.refresh != m.refresh;
        info!(images = m.images.len(), refresh = ?m.refresh, "prefetch: declared list replaced");
        self.images = m.images.into();
        self.refresh = m.refresh;
        if changed_period {
            self.start_timer(ctx);
        }
        if changed_list && self.busy {
            debug!("prefetch: a round is being admitted; the new list's round follows it");
            self.again = true;
        } else if changed_list {
            self.round(ctx);
        }
    }
}

impl Actor for PrefetchTickerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.round(ctx);
        self.start_timer(ctx);
    }
}
