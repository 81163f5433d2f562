//! Messages the backoff registry receives and the types of its replies.
//!
//! They follow the kubelet's `pullImage` steps (reference §1, 8.2–8.7):
//! [`CheckBackoff`] before a pull, [`BeginAttempt`] when the pull really
//! starts, then [`RecordFailure`] or [`RecordSuccess`] when it ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use actix::{Actor, Addr, Context, Handler, Message, Recipient};

use super::table::{BackoffDelays, BackoffKey, BackoffView, ClearScope};

/// Step 8.2: is this key in back-off now? Read-only.
#[derive(Debug, Clone, Message)]
#[rtype(result = "BackoffCheck")]
pub struct CheckBackoff {
    /// The pod and requested image.
    pub key: BackoffKey,
    /// Beyond the kubelet: the identity of the credentials this pull would
    /// try (`None` = not tracked, the kubelet's behaviour). When the key's
    /// last failure was recorded with other credentials, the cause may have
    /// gone (a secret was added or changed): the key's back-off is deleted
    /// and the pull may go ahead (`BackoffCheck::credentials_changed`).
    pub credentials: Option<String>,
}

/// The answer to [`CheckBackoff`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackoffCheck {
    /// Do not pull now: answer `ImagePullBackOff` with
    /// `Back-off pulling image "<image>"`, plus `": <previous_error>"` when
    /// one is stored.
    pub in_backoff: bool,
    /// The text of the key's last pull error, if still stored (it is deleted
    /// by [`BeginAttempt`]); given whether or not the key is in back-off.
    pub previous_error: Option<String>,
    /// Time left in back-off; `None` when `in_backoff` is false.
    pub retry_in: Option<Duration>,
    /// The current period of an unexpired entry; `None` with no entry or an
    /// expired one (the next failure then starts at the initial period).
    pub backoff: Option<Duration>,
    /// The key's back-off was deleted because the request's credentials
    /// differ from those of its last failure (see [`CheckBackoff::credentials`]).
    pub credentials_changed: bool,
}

/// Step 8.3: a pull of this key is really being attempted; deletes its
/// previous-error text (the period is kept).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct BeginAttempt {
    /// The pod and requested image.
    pub key: BackoffKey,
}

/// Step 8.6: a pull of this key failed. Doubles (or starts) its back-off and
/// stores the error text; replies with the new period.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Duration")]
pub struct RecordFailure {
    /// The pod and requested image.
    pub key: BackoffKey,
    /// The text to repeat in the back-off message, in the kubelet's form
    /// `"<reason>: <message>"` (for example `ErrImagePull: rpc error: …`).
    pub error_text: String,
    /// The identity of the credentials the failed pull tried, kept to
    /// compare with later checks (see [`CheckBackoff::credentials`]); `None`
    /// = not tracked. Never a secret: a hash.
    pub credentials: Option<String>,
    /// The registry a transient failure waits for, kept so that
    /// [`RegistryRecovered`] for it deletes this back-off; `None` = not
    /// tracked (the kubelet), or a permanent failure (it drops any earlier mark).
    pub transient_registry: Option<String>,
}

impl RecordFailure {
    /// A failure of `key` with `error_text`, tracking neither credentials
    /// nor registry (the kubelet's record).
    pub fn new(key: BackoffKey, error_text: impl Into<String>) -> Self {
        Self { key, error_text: error_text.into(), credentials: None, transient_registry: None }
    }
}

/// Beyond the kubelet: a pull from `registry` succeeded, so the registry is
/// reachable again. Deletes the back-offs of keys whose last failure was a
/// transient one from that registry (see [`RecordFailure::transient_registry`]),
/// so their pods retry at once instead of waiting out up to 5 minutes.
/// Replies with the number of back-offs deleted.
#[derive(Debug, Clone, Message)]
#[rtype(result = "usize")]
pub struct RegistryRecovered {
    /// The registry (the normalised image's domain, e.g. `docker.io`).
    pub registry: String,
}

/// Step 8.7: a pull succeeded. Deletes expired entries (the kubelet's
/// `backoff.GC()`); the succeeding key's own entry is left to expire, as in
/// the kubelet.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "()")]
pub struct RecordSuccess;

/// An operator's "retry now": deletes the back-offs in `scope`. Replies with
/// the number of entries deleted.
#[derive(Debug, Clone, Message)]
#[rtype(result = "usize")]
pub struct ClearBackoff {
    /// Which back-offs.
    pub scope: ClearScope,
}

/// Replaces the delays (a configuration reload): failures from now on
/// double from the new initial period up to the new cap; a key still
/// backing off waits, from its last failure, no longer than the new cap and
/// no less than the new initial period (a key whose wait is over stays
/// free); entries already expired under the old delays are dropped (a
/// longer cap does not revive them), and the rest expire after twice the
/// new cap.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct UpdateBackoffDelays(pub BackoffDelays);

/// Every entry, sorted by pod UID then image, for status display.
#[derive(Debug, Clone, Copy, Default, Message)]
#[rtype(result = "Vec<BackoffView>")]
pub struct ListBackoffs;

/// How many entries the registry's table holds, as the registry last
/// published it (after every change, before its handler returns). A
/// [`CheckBackoff`] of any key while it is 0 has one answer: not in
/// back-off, no stored error, nothing to reset. So a pull pipeline that
/// sees it at 0 need not ask (the registry's mailbox round trip is the
/// largest of the steps before a pull). Unknown (always ask) until the
/// registry has started and once it has stopped.
#[derive(Debug, Clone)]
pub struct BackoffOccupancy(Arc<AtomicUsize>);

impl BackoffOccupancy {
    /// Not known: a check must be asked.
    const UNKNOWN: usize = usize::MAX;

    /// One not known yet.
    pub(super) fn unknown() -> Self {
        Self(Arc::new(AtomicUsize::new(Self::UNKNOWN)))
    }

    /// Whether the table is known to be empty now.
    pub fn is_empty(&self) -> bool {
        self.0.load(Ordering::Acquire) == 0
    }

    /// The table holds `entries`.
    pub(super) fn set(&self, entries: usize) {
        self.0.store(entries.min(Self::UNKNOWN - 1), Ordering::Release);
    }

    /// The registry stopped: not known any more.
    pub(super) fn forget(&self) {
        self.0.store(Self::UNKNOWN, Ordering::Release);
    }
}

/// What a pull pipeline sends the backoff registry, one recipient per
/// message: the ensure flow depends on these messages, not on the actor.
/// Built from the registry's address with `BackoffPort::from(&addr)` (or
/// from any actor handling the five, e.g. a test's fake), then, for the
/// registry itself, [`BackoffPort::with_occupancy`].
#[derive(Debug, Clone)]
pub struct BackoffPort {
    /// [`CheckBackoff`], before a pull.
    pub check: Recipient<CheckBackoff>,
    /// [`BeginAttempt`], when a pull really starts.
    pub begin: Recipient<BeginAttempt>,
    /// [`RecordFailure`], when it failed.
    pub failure: Recipient<RecordFailure>,
    /// [`RecordSuccess`], when it succeeded (with `try_send`).
    pub success: Recipient<RecordSuccess>,
    /// [`RegistryRecovered`], when a pull from a registry succeeded (with `try_send`).
    pub recovered: Recipient<RegistryRecovered>,
    /// The registry's [`BackoffOccupancy`]: while it is 0 the pipeline
    /// skips [`CheckBackoff`] and [`RecordSuccess`]. `None` (a port built
    /// from an address): every one is sent, as an actor of an embedder's
    /// or a test's that answers them expects.
    pub occupancy: Option<BackoffOccupancy>,
}

impl BackoffPort {
    /// The same port, skipping [`CheckBackoff`] while `occupancy` (the
    /// registry's own, [`super::BackoffRegistryActor::occupancy`]) is 0.
    #[must_use]
    pub fn with_occupancy(mut self, occupancy: BackoffOccupancy) -> Self {
        self.occupancy = Some(occupancy);
        self
    }

    /// Whether a [`CheckBackoff`] now is known to answer "not in back-off,
    /// no stored error" without being sent (and a [`RecordSuccess`] to
    /// collect nothing).
    pub fn known_clear(&self) -> bool {
        self.occupancy.as_ref().is_some_and(BackoffOccupancy::is_empty)
    }
}

impl<A> From<&Addr<A>> for BackoffPort
where
    A: Actor<Context = Context<A>>
        + Handler<CheckBackoff>
        + Handler<BeginAttempt>
        + Handler<RecordFailure>
        + Handler<RecordSuccess>
        + Handler<RegistryRecovered>,
{
    fn from(addr: &Addr<A>) -> Self {
        Self {
            check: addr.clone().recipient(),
            begin: addr.clone().recipient(),
            failure: addr.clone().recipient(),
            success: addr.clone().recipient(),
            recovered: addr.clone().recipient(),
            occupancy: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use actix::Actor as _;

    use super::*;
    use crate::actors::backoff_registry::{BackoffRegistryActor, BackoffSettings};

    #[actix::test]
    async fn a_port_built_from_the_address_reaches_the_registry_with_each_message() {
        let registry = BackoffRegistryActor::from_settings(&BackoffSettings::default()).start();
        let port = BackoffPort::from(&registry);
        let key = BackoffKey::new("u1", "example.com/a:1");
        let failed = RecordFailure::new(key.clone(), "ErrImagePull: denied");
        assert_eq!(port.failure.send(failed).await.expect("registry"), Duration::from_secs(10));
        let check = port.check.send(CheckBackoff { key: key.clone(), credentials: None }).await.expect("registry");
        assert!(check.in_backoff);
        assert_eq!(check.previous_error.as_deref(), Some("ErrImagePull: denied"));
        port.begin.send(BeginAttempt { key: key.clone() }).await.expect("registry");
        let check = port.check.send(CheckBackoff { key, credentials: None }).await.expect("registry");
        assert_eq!((check.in_backoff, check.previous_error), (true, None), "the text goes, the period stays");
        port.success.send(RecordSuccess).await.expect("registry");
        let recovered = RegistryRecovered { registry: "example.com".into() };
        assert_eq!(port.recovered.send(recovered).await.expect("registry"), 0, "no transient mark was recorded");
    }
}
