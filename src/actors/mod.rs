//! The actors. Each one's contract (mailbox, messages, timers, failure and
//! shutdown policy) is written down in `actors.md` at the repository root.

pub mod backoff_registry;
pub mod cache_refresher;
pub mod cri_gateway;
pub mod detector;
pub mod event_hub;
pub mod gc_executor;
pub mod pull_queue;

/// Asks an actor with timers to stop (its timers keep it alive otherwise).
/// Sent by [`crate::node::Node::shutdown`]; each actor's reaction is in
/// `actors.md`.
#[derive(Debug, Clone, Copy, actix::Message)]
#[rtype(result = "()")]
pub struct Stop;

/// Implements [`Stop`] for an actor: `ctx.stop()`.
macro_rules! impl_stop {
    ($($actor:ty),+ $(,)?) => {$(
        impl actix::Handler<$crate::actors::Stop> for $actor {
            type Result = ();
            fn handle(&mut self, _: $crate::actors::Stop, ctx: &mut Self::Context) {
                actix::ActorContext::stop(ctx);
            }
        }
    )+};
}

impl_stop!(
    backoff_registry::BackoffRegistryActor,
    cache_refresher::CacheRefresherActor,
    detector::DetectorActor,
    gc_executor::GcExecutorActor,
    pull_queue::PullQueueActor,
);
