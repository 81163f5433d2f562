//! `EventLog`: an actor that records every `ImageEvent` it is sent, for
//! tests that subscribe it to an `EventSink`.

use actix::prelude::*;

use crate::events::{EventReason, ImageEvent};

/// Records events in arrival order.
#[derive(Debug, Default)]
pub struct EventLog(Vec<ImageEvent>);

impl Actor for EventLog {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(10_000);
    }
}

impl Handler<ImageEvent> for EventLog {
    type Result = ();
    fn handle(&mut self, e: ImageEvent, _: &mut Self::Context) {
        self.0.push(e);
    }
}

/// Takes (and clears) the events recorded so far.
#[derive(Debug, Message)]
#[rtype(result = "Vec<ImageEvent>")]
pub struct TakeEvents;

impl Handler<TakeEvents> for EventLog {
    type Result = MessageResult<TakeEvents>;
    fn handle(&mut self, _: TakeEvents, _: &mut Self::Context) -> Self::Result {
        MessageResult(std::mem::take(&mut self.0))
    }
}

/// The reasons of the events recorded so far (kept).
#[derive(Debug, Message)]
#[rtype(result = "Vec<EventReason>")]
pub struct EventReasons;

impl Handler<EventReasons> for EventLog {
    type Result = MessageResult<EventReasons>;
    fn handle(&mut self, _: EventReasons, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.0.iter().map(|e| e.reason).collect())
    }
}
