//! The cache refresher: keeps the node's image list (for node status) fresh
//! by listing images through the CRI gateway every `gc.cache_refresh_period`.
//! It is the list's only writer; readers hold an [`ImageListReader`] and get
//! the latest snapshot without a round trip through the actor.

mod cache;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::watch;
use tracing::{debug, warn};

pub use cache::{ImageList, MAX_NAMES_PER_IMAGE, NodeImage};

use crate::actors::cri_gateway::ListImages;
use crate::cri::{CriError, CriErrorKind};

/// The cache refresher's mailbox capacity unless its settings say otherwise.
pub const DEFAULT_MAILBOX_CAPACITY: usize = 16;

/// The cache refresher's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheRefresherSettings {
    /// Refresh period (`gc.cache_refresh_period`).
    pub period: Duration,
    /// The node-status limit (`gc.node_status_max_images`; `None` = all).
    pub max_images: Option<usize>,
    /// Mailbox capacity, set in `started()` (`gc.refresher_mailbox_capacity`,
    /// [`DEFAULT_MAILBOX_CAPACITY`] by default).
    pub mailbox_capacity: usize,
}

/// A cheap, cloneable read handle on the cached image list.
#[derive(Debug, Clone)]
pub struct ImageListReader {
    rx: watch::Receiver<Arc<ImageList>>,
    max_images: Option<usize>,
}

impl ImageListReader {
    /// The latest list (never blocks, never fails; empty before the first refresh).
    pub fn snapshot(&self) -> Arc<ImageList> {
        self.rx.borrow().clone()
    }

    /// The node-status view with the configured `node_status_max_images`.
    pub fn node_status(&self) -> Vec<NodeImage> {
        self.snapshot().node_status(self.max_images)
    }

    /// Waits until the list changes (for watchers).
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

/// Refreshes the list now (also done by the timer); replies with the number of images.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Result<usize, CriError>")]
pub struct RefreshImageList;

/// An image was removed outside GC (the kubelet's `RemoveImage` through the
/// CRI front): the list drops it at once instead of at the next refresh.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct ImageRemoved {
    /// The removed image's id.
    pub id: String,
}

/// Timer tick.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
struct Tick;

/// The cache refresher actor. See `actors.md`.
pub struct CacheRefresherActor {
    gateway: Recipient<ListImages>,
    period: Duration,
    mailbox_capacity: usize,
    tx: watch::Sender<Arc<ImageList>>,
    in_flight: bool,
    /// Images removed while a refresh was in flight: its list (taken
    /// before) must not bring them back.
    removed_in_flight: Vec<String>,
}

impl CacheRefresherActor {
    /// A refresher listing through `gateway` (the CRI gateway's
    /// `Recipient<ListImages>`) every `cfg.period`, and the reader for its
    /// list.
    pub fn new(gateway: Recipient<ListImages>, cfg: CacheRefresherSettings) -> (Self, ImageListReader) {
        let (tx, rx) = watch::channel(Arc::new(ImageList::default()));
        let CacheRefresherSettings { period, max_images, mailbox_capacity } = cfg;
        (
            Self { gateway, period, mailbox_capacity, tx, in_flight: false, removed_in_flight: Vec::new() },
            ImageListReader { rx, max_images },
        )
    }

    fn refresh(&mut self) -> ResponseActFuture<Self, Result<usize, CriError>> {
        if self.in_flight {
            // A tick while a refresh runs is skipped; an explicit request waits for nothing and says so.
            return Box::pin(actix::fut::ready(Err(CriError::new(
                CriErrorKind::Other,
                "an image list refresh is already running",
            ))));
        }
        self.in_flight = true;
        let gateway = self.gateway.clone();
        Box::pin(
            async move {
                gateway
                    .send(ListImages::default())
                    .await
                    .map_err(|_| CriError::new(CriErrorKind::RuntimeUnavailable, "CRI gateway stopped"))?
            }
            .into_actor(self)
            .map(|res, act, _| {
                act.in_flight = false;
                let removed = std::mem::take(&mut act.removed_in_flight);
                match res {
                    Ok(mut images) => {
                        images.retain(|i| !removed.contains(&i.id));
                        let n = images.len();
                        act.tx.send_replace(Arc::new(ImageList::new(images)));
                        debug!(images = n, "image list refreshed");
                        Ok(n)
                    }
                    Err(e) => {
                        warn!(error = %e, "Failed to update image list");
                        Err(e)
                    }
                }
            }),
        )
    }
}

impl Actor for CacheRefresherActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
        // First refresh at once, then every period.
        ctx.notify(Tick);
        ctx.run_interval(self.period, |_, ctx| ctx.notify(Tick));
    }
}

impl Handler<Tick> for CacheRefresherActor {
    type Result = ();

    /// Refreshes unless a refresh is already running.
    fn handle(&mut self, _: Tick, ctx: &mut Self::Context) {
        if self.in_flight {
            debug!("image list refresh still running; tick skipped");
            return;
        }
        let fut = self.refresh().map(|_, _, _| ());
        ctx.spawn(fut);
    }
}

impl Handler<ImageRemoved> for CacheRefresherActor {
    type Result = ();

    /// Drops the image from the list (and from a refresh in flight).
    fn handle(&mut self, m: ImageRemoved, _: &mut Self::Context) {
        if self.in_flight {
            self.removed_in_flight.push(m.id.clone());
        }
        let list = self.tx.borrow().clone();
        if list.images().iter().any(|i| i.id == m.id) {
            let kept = list.images().iter().filter(|i| i.id != m.id).cloned().collect();
            self.tx.send_replace(Arc::new(ImageList::new(kept)));
        }
    }
}

impl Handler<RefreshImageList> for CacheRefresherActor {
    type Result = ResponseActFuture<Self, Result<usize, CriError>>;

    /// Refreshes now.
    fn handle(&mut self, _: RefreshImageList, _: &mut Self::Context) -> Self::Result {
        self.refresh()
    }
}
