//! Typed image events (the kubelet's `Pulling`, `Pulled`, `Failed`, `BackOff`,
//! `InspectFailed`, `ErrImageNeverPull`) and their delivery to subscribers
//! and to tracing.

use std::fmt;
use std::sync::{Arc, Mutex};

use actix::{Message, Recipient};

use crate::domain::ErrorClass;

/// Kubernetes event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// `Normal`.
    Normal,
    /// `Warning`.
    Warning,
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        })
    }
}

/// The kubelet's event reasons for images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventReason {
    /// `Pulling`: a pull starts.
    Pulling,
    /// `Pulled`: the image is there (pulled or already present).
    Pulled,
    /// `Failed`: the pull failed.
    Failed,
    /// `BackOff`: back-off is running; no pull was attempted.
    BackOff,
    /// `InspectFailed`: the image could not be inspected, or its name is invalid.
    InspectFailed,
    /// `ErrImageNeverPull`: absent with pull policy `Never`.
    ErrImageNeverPull,
    /// `InvalidDiskCapacity` (node): the image filesystem reports capacity 0.
    InvalidDiskCapacity,
    /// `FreeDiskSpaceFailed` (node): GC could not free enough space.
    FreeDiskSpaceFailed,
    /// `ImageGCFailed` (node): image GC failed several times in a row.
    ImageGcFailed,
}

impl EventReason {
    /// The reason as the kubelet writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            EventReason::Pulling => "Pulling",
            EventReason::Pulled => "Pulled",
            EventReason::Failed => "Failed",
            EventReason::BackOff => "BackOff",
            EventReason::InspectFailed => "InspectFailed",
            EventReason::ErrImageNeverPull => "ErrImageNeverPull",
            EventReason::InvalidDiskCapacity => "InvalidDiskCapacity",
            EventReason::FreeDiskSpaceFailed => "FreeDiskSpaceFailed",
            EventReason::ImageGcFailed => "ImageGCFailed",
        }
    }

    /// The event type the kubelet gives this reason.
    pub fn event_type(self) -> EventType {
        match self {
            EventReason::Pulling | EventReason::Pulled | EventReason::BackOff => EventType::Normal,
            EventReason::Failed
            | EventReason::InspectFailed
            | EventReason::ErrImageNeverPull
            | EventReason::InvalidDiskCapacity
            | EventReason::FreeDiskSpaceFailed
            | EventReason::ImageGcFailed => EventType::Warning,
        }
    }
}

impl fmt::Display for EventReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an event is about (a pod's container; all empty for node events).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectRef {
    /// Pod UID.
    pub pod_uid: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod_name: String,
    /// Container name, when the caller gave one.
    pub container: Option<String>,
}

/// One image event.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct ImageEvent {
    /// `Normal` or `Warning`.
    pub event_type: EventType,
    /// The kubelet reason.
    pub reason: EventReason,
    /// The kubelet's message, exactly.
    pub message: String,
    /// The object the event is attached to.
    pub object: ObjectRef,
    /// The image as the pod asked for it.
    pub image: String,
    /// For failures: whether retrying can help (imaged's addition; the
    /// message stays the kubelet's).
    pub class: Option<ErrorClass>,
}

/// Delivers events to subscribers (`try_send`: a full subscriber loses the
/// event and it is logged, never blocking a pull) and to tracing.
#[derive(Clone, Default)]
pub struct EventSink {
    subscribers: Arc<Mutex<Vec<Recipient<ImageEvent>>>>,
}

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventSink").finish_non_exhaustive()
    }
}

impl EventSink {
    /// Adds a subscriber.
    pub fn subscribe(&self, r: Recipient<ImageEvent>) {
        self.subscribers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(r);
    }

    /// Emits an event (traced at info, or warn for a warning).
    pub fn emit(&self, event: ImageEvent) {
        self.deliver(event, false);
    }

    /// Emits a routine event: delivered to subscribers as any other, but
    /// traced at debug. The kubelet's "already present on machine" comes
    /// with every ensure of a present image; at thousands of pods a log
    /// line each is spam, and the line cost more than the ensure.
    pub fn emit_routine(&self, event: ImageEvent) {
        self.deliver(event, true);
    }

    /// Whether a routine event would reach anyone: a subscriber, or a
    /// trace at debug. An embedder with neither need not build it (a
    /// present-image ensure's event is seven strings copied and dropped).
    pub fn wants_routine(&self) -> bool {
        tracing::enabled!(target: "imaged::events", tracing::Level::DEBUG)
            || !self.subscribers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_empty()
    }

    /// Emits `event` to subscribers now and returns its log line, owed:
    /// written by [`OwedLine::write`], or when it is dropped. For a line
    /// whose writing can wait for something the caller waits for anyway
    /// (the `Pulling` line, until the pull's request is out).
    pub fn emit_owing_line(&self, event: ImageEvent) -> OwedLine {
        self.to_subscribers(&event);
        OwedLine(Some(Box::new(event)))
    }

    fn deliver(&self, event: ImageEvent, routine: bool) {
        trace(&event, routine);
        self.to_subscribers(&event);
    }

    fn to_subscribers(&self, event: &ImageEvent) {
        let mut subs = self.subscribers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        subs.retain(|s| match s.try_send(event.clone()) {
            Ok(()) => true,
            Err(actix::dev::SendError::Full(_)) => {
                tracing::warn!(reason = %event.reason, "an event subscriber's mailbox is full; event dropped for it");
                true
            }
            Err(actix::dev::SendError::Closed(_)) => false,
        });
    }
}

/// An event's log line not yet written (see [`EventSink::emit_owing_line`]).
/// Boxed: it is kept across a pull's wait, which should hold little
/// (actors.md, "Per-waiter memory").
#[derive(Debug)]
#[must_use = "the line is written when this is dropped"]
pub struct OwedLine(Option<Box<ImageEvent>>);

impl OwedLine {
    /// Writes the line now.
    pub fn write(self) {
        drop(self);
    }
}

impl Drop for OwedLine {
    fn drop(&mut self) {
        if let Some(event) = self.0.take() {
            trace(&event, false);
        }
    }
}

/// An event's log line: info (debug when `routine`), warn for a warning.
fn trace(event: &ImageEvent, routine: bool) {
    let o = &event.object;
    match event.event_type {
        EventType::Normal if routine => tracing::debug!(
            target: "imaged::events", reason = %event.reason, pod = %format!("{}/{}", o.namespace, o.pod_name),
            pod_uid = %o.pod_uid, image = %event.image, "{}", event.message
        ),
        EventType::Normal => tracing::info!(
            target: "imaged::events", reason = %event.reason, pod = %format!("{}/{}", o.namespace, o.pod_name),
            pod_uid = %o.pod_uid, image = %event.image, "{}", event.message
        ),
        EventType::Warning => tracing::warn!(
            target: "imaged::events", reason = %event.reason, pod = %format!("{}/{}", o.namespace, o.pod_name),
            pod_uid = %o.pod_uid, image = %event.image, class = event.class.map(tracing::field::display), "{}", event.message
        ),
    }
}

#[cfg(test)]
mod tests {
    use actix::Actor as _;

    use super::*;
    use crate::testing::EventLog;

    #[actix::test]
    async fn a_routine_event_is_wanted_by_a_subscriber_or_a_debug_trace() {
        let sink = EventSink::default();
        let quiet =
            || tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || sink.wants_routine());
        assert!(!quiet(), "no subscriber and no debug trace: nobody would see it");
        let debug = tracing_subscriber::fmt().with_max_level(tracing::Level::DEBUG).with_writer(std::io::sink).finish();
        assert!(tracing::subscriber::with_default(debug, || sink.wants_routine()), "traced at debug");
        sink.subscribe(EventLog::default().start().recipient());
        assert!(quiet(), "a subscriber gets it");
    }

    #[actix::test]
    async fn an_owed_line_is_written_once_when_written_or_dropped_and_subscribers_hear_at_once() {
        let lines = crate::testing::LogLines::default();
        let count = |text: &str| lines.text().matches(text).count();
        let _traced = tracing::subscriber::set_default(
            tracing_subscriber::fmt().with_writer(lines.clone()).with_ansi(false).finish(),
        );
        let sink = EventSink::default();
        let log = EventLog::default().start();
        sink.subscribe(log.clone().recipient());
        let event = |message: &str| ImageEvent {
            event_type: EventType::Normal,
            reason: EventReason::Pulling,
            message: message.to_string(),
            object: ObjectRef::default(),
            image: "a".into(),
            class: None,
        };
        let owed = sink.emit_owing_line(event("Pulling image \"a\""));
        let heard = log.send(crate::testing::TakeEvents).await.unwrap_or_default();
        assert_eq!(heard.iter().map(|e| e.message.as_str()).collect::<Vec<_>>(), ["Pulling image \"a\""]);
        assert_eq!(count("Pulling image"), 0, "the line is owed");
        owed.write();
        assert_eq!(count("Pulling image \"a\""), 1);
        drop(sink.emit_owing_line(event("Pulling image \"b\"")));
        assert_eq!(count("Pulling image \"b\""), 1, "written when dropped");
        assert_eq!(count("Pulling image \"a\""), 1, "each line once");
    }
}
