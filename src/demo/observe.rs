//! What the demo learns from the node, into the shared [`Tally`](super::summary::Tally):
//! [`Counter`], an actor subscribed to the node's image events and pull
//! phases, and [`Watch`], the periodic poll of the queue, the runtime's
//! counters and images, and the last GC report.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;

use super::{Shared, tally};
use crate::actors::gc_executor::{GcReport, GetLastGcReport};
use crate::actors::pull_queue::{GetQueueStatus, PullPhase, PullPhaseChanged};
use crate::cri::Rpc;
use crate::events::{EventReason, ImageEvent};
use crate::node::Node;

/// Counts events and pull phases into the tally.
pub(super) struct Counter {
    tally: Shared,
    /// Images with a pull that has already been counted as throttled.
    throttled: HashMap<String, bool>,
}

impl Counter {
    /// A counter adding to `tally`.
    pub(super) fn new(tally: Shared) -> Self {
        Self { tally, throttled: HashMap::new() }
    }
}

impl Actor for Counter {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        // Publishers use try_send: a roomy mailbox so no count is lost.
        ctx.set_mailbox_capacity(1 << 16);
    }
}

impl Handler<ImageEvent> for Counter {
    type Result = ();
    fn handle(&mut self, e: ImageEvent, _: &mut Self::Context) {
        let mut t = tally(&self.tally);
        match e.reason {
            EventReason::Pulling => t.pull_requests += 1,
            EventReason::Failed => {
                t.failed_events += 1;
                if e.class == Some(crate::domain::ErrorClass::Permanent) {
                    t.failed_permanent += 1;
                }
            }
            EventReason::FreeDiskSpaceFailed => t.gc_runs_short += 1,
            _ => {}
        }
    }
}

impl Handler<PullPhaseChanged> for Counter {
    type Result = ();
    fn handle(&mut self, p: PullPhaseChanged, _: &mut Self::Context) {
        let mut t = tally(&self.tally);
        match p.phase {
            PullPhase::WaitingOnSharedPull => t.joins += 1,
            PullPhase::AlreadyPresent => t.present_at_turn += 1,
            // A pull may wait for several tokens in a row: count it once.
            PullPhase::Throttled => {
                let seen = self.throttled.entry(p.image).or_insert(false);
                if !*seen {
                    *seen = true;
                    t.throttled_pulls += 1;
                }
            }
            PullPhase::Pulling => {
                self.throttled.remove(&p.image);
            }
            _ => {}
        }
    }
}

/// What the periodic poll remembers between ticks.
#[derive(Default)]
pub(super) struct Watch {
    last_gc: Option<Arc<GcReport>>,
    images: HashMap<String, u64>,
}

impl Watch {
    /// Reads the queue, the runtime's counters and image set, and the last GC report.
    pub(super) async fn poll(&mut self, node: &Node, shared: &Shared) {
        let queue = node.queue().send(GetQueueStatus).await.ok();
        let last = node.gc().executor.send(GetLastGcReport).await.ok().flatten();
        let Some(rt) = node.runtime().embedded.as_ref() else { return };
        let stats = rt.stats();
        let now: HashMap<String, u64> = rt.images().into_iter().map(|i| (i.id, i.size)).collect();
        // Only GC removes images in the demo: what went is what GC freed.
        let gone: Vec<u64> = self.images.iter().filter(|(id, _)| !now.contains_key(*id)).map(|(_, s)| *s).collect();
        self.images = now;
        let mut t = tally(shared);
        if let Some(q) = queue {
            t.running = q.running;
            t.queued = q.queued;
            t.parked = q.parked;
        }
        t.cri_pulls = stats.calls(Rpc::PullImage);
        t.max_parallel_pulls = stats.max_pulls_in_flight;
        t.disk_capacity = rt.capacity_bytes();
        t.disk_used = rt.used_bytes();
        t.disk_peak = t.disk_peak.max(t.disk_used);
        t.gc_images_removed += gone.len() as u64;
        t.gc_bytes_freed += gone.iter().sum::<u64>();
        if let Some(r) = last
            && !self.last_gc.as_ref().is_some_and(|l| Arc::ptr_eq(l, &r))
        {
            t.gc_runs += 1;
            self.last_gc = Some(r);
        }
    }
}
