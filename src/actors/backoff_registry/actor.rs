//! `BackoffRegistryActor`: a thin actix shell over [`BackoffTable`]. Each
//! handler reads the clock once and forwards to the table; an optional timer
//! runs the table's GC periodically.

use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;
use tracing::{debug, info};

use super::messages::*;
use super::settings::BackoffSettings;
use super::table::{BackoffDelays, BackoffTable, BackoffView};
use crate::metrics::{BackoffResetReason, Metrics};

/// The backoff registry actor. See the module docs and `actors.md`.
pub struct BackoffRegistryActor {
    table: BackoffTable,
    /// Set in `started()`; at least 1.
    mailbox_capacity: usize,
    /// Period of the GC timer; `None` (or zero) = GC only on `RecordSuccess`,
    /// like the kubelet. The timer bounds memory on a node where pulls keep
    /// failing and none ever succeeds.
    gc_interval: Option<Duration>,
    /// Where the table's size is reported after every change.
    metrics: Metrics,
    /// The table's size again, for the pull pipeline (see [`BackoffOccupancy`]).
    occupancy: BackoffOccupancy,
}

impl BackoffRegistryActor {
    /// A registry with periods `cfg` (not started). `mailbox_capacity` 0 is
    /// taken as 1; a zero `gc_interval` turns the GC timer off.
    pub fn new(cfg: BackoffDelays, mailbox_capacity: usize, gc_interval: Option<Duration>) -> Self {
        Self {
            table: BackoffTable::new(cfg),
            mailbox_capacity: mailbox_capacity.max(1),
            gc_interval: gc_interval.filter(|d| !d.is_zero()),
            metrics: Metrics::default(),
            occupancy: BackoffOccupancy::unknown(),
        }
    }

    /// The table's size as the registry publishes it, for
    /// [`BackoffPort::with_occupancy`] (unknown until the registry starts).
    pub fn occupancy(&self) -> BackoffOccupancy {
        self.occupancy.clone()
    }

    /// Starts the registry and returns it with the port a pull pipeline
    /// sends to, its occupancy attached (what `Node` and the testing
    /// helpers do).
    pub fn start_with_port(self) -> (Addr<Self>, BackoffPort) {
        let occupancy = self.occupancy();
        let addr = self.start();
        let port = BackoffPort::from(&addr).with_occupancy(occupancy);
        (addr, port)
    }

    /// A registry with `settings` (`[backoff]`), reporting to their metrics (not started).
    pub fn from_settings(settings: &BackoffSettings) -> Self {
        Self::new(settings.delays, settings.mailbox_capacity, settings.gc_interval)
            .with_metrics(settings.metrics.clone())
    }

    /// The registry reporting `imaged_backoff_entries` to `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    fn report(&self) {
        self.metrics.set_backoff_entries(self.table.len());
        self.occupancy.set(self.table.len());
    }

    fn gc(&mut self, now: Instant, why: &'static str) {
        let removed = self.table.gc(now);
        self.report();
        if removed > 0 {
            debug!(removed, remaining = self.table.len(), trigger = why, "expired back-offs deleted");
        }
    }
}

impl Actor for BackoffRegistryActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
        self.occupancy.set(self.table.len());
        if let Some(every) = self.gc_interval {
            ctx.run_interval(every, |act, _| act.gc(Instant::now(), "timer"));
        }
        let cfg = self.table.config();
        debug!(
            mailbox = self.mailbox_capacity,
            initial_ms = crate::domain::limits::millis(cfg.initial),
            max_ms = crate::domain::limits::millis(cfg.max),
            gc_interval_ms = self.gc_interval.map(crate::domain::limits::millis),
            "backoff registry started"
        );
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.metrics.set_backoff_entries(0);
        self.occupancy.forget();
        debug!(entries = self.table.len(), "backoff registry stopped; back-offs forgotten");
    }
}

// === impl Handler ===

impl Handler<CheckBackoff> for BackoffRegistryActor {
    type Result = MessageResult<CheckBackoff>;
    /// Reports whether the key is in back-off now, with its stored error text.
    /// With credentials that differ from the last failure's, deletes the
    /// key's back-off first (the only check that writes).
    fn handle(&mut self, m: CheckBackoff, _: &mut Self::Context) -> Self::Result {
        let now = Instant::now();
        let credentials_changed = m.credentials.as_deref().is_some_and(|c| self.table.cause_differs(&m.key, c));
        if credentials_changed {
            self.table.remove(&m.key);
            self.report();
            self.metrics.backoff_reset(BackoffResetReason::CredentialsChanged, 1);
            info!(key = %m.key, "credentials changed since the last failed pull; back-off reset");
        }
        let t = &self.table;
        let retry_in = t.retry_in(&m.key, now);
        MessageResult(BackoffCheck {
            in_backoff: retry_in.is_some(),
            previous_error: t.previous_error(&m.key).map(str::to_owned),
            retry_in,
            backoff: t.current(&m.key).filter(|_| !t.is_expired(&m.key, now)),
            credentials_changed,
        })
    }
}

impl Handler<BeginAttempt> for BackoffRegistryActor {
    type Result = ();
    /// Deletes the key's previous-error text.
    fn handle(&mut self, m: BeginAttempt, _: &mut Self::Context) {
        self.table.clear_previous_error(&m.key);
    }
}

impl Handler<RecordFailure> for BackoffRegistryActor {
    type Result = MessageResult<RecordFailure>;
    /// Starts or doubles the key's back-off and stores the error text.
    fn handle(&mut self, m: RecordFailure, _: &mut Self::Context) -> Self::Result {
        let backoff = self.table.next(&m.key, Instant::now());
        debug!(key = %m.key, backoff_ms = crate::domain::limits::millis(backoff), error = %m.error_text, "pull back-off");
        self.table.set_previous_error(&m.key, m.error_text);
        if let Some(c) = m.credentials {
            self.table.set_cause(&m.key, c);
        }
        self.table.set_waiting_on(&m.key, m.transient_registry);
        self.report();
        MessageResult(backoff)
    }
}

impl Handler<RecordSuccess> for BackoffRegistryActor {
    type Result = ();
    /// Deletes expired entries.
    fn handle(&mut self, _: RecordSuccess, _: &mut Self::Context) {
        self.gc(Instant::now(), "success");
    }
}

impl Handler<RegistryRecovered> for BackoffRegistryActor {
    type Result = MessageResult<RegistryRecovered>;
    /// Deletes the back-offs waiting on the registry and counts them.
    fn handle(&mut self, m: RegistryRecovered, _: &mut Self::Context) -> Self::Result {
        let removed = self.table.registry_recovered(&m.registry);
        if removed > 0 {
            self.report();
            self.metrics.backoff_reset(BackoffResetReason::RegistryRecovered, removed);
            info!(registry = %m.registry, removed, "registry reachable again; its transient back-offs reset");
        }
        MessageResult(removed)
    }
}

impl Handler<ClearBackoff> for BackoffRegistryActor {
    type Result = MessageResult<ClearBackoff>;
    /// Deletes the back-offs in the scope and counts them.
    fn handle(&mut self, m: ClearBackoff, _: &mut Self::Context) -> Self::Result {
        let removed = self.table.clear(&m.scope);
        self.report();
        self.metrics.backoff_reset(BackoffResetReason::Cleared, removed);
        info!(scope = %m.scope, removed, "back-offs cleared");
        MessageResult(removed)
    }
}

impl Handler<UpdateBackoffDelays> for BackoffRegistryActor {
    type Result = ();
    /// Replaces the delays; see the message.
    fn handle(&mut self, m: UpdateBackoffDelays, _: &mut Self::Context) {
        let (old, new) = (self.table.config(), m.0);
        let now = Instant::now();
        // Expired under the old delays: gone before the new cap could
        // revive them (and the entries gauge follows).
        self.gc(now, "delays replaced");
        self.table.set_config(new, now);
        info!(
            initial_ms = crate::domain::limits::millis(new.initial),
            max_ms = crate::domain::limits::millis(new.max),
            was_initial_ms = crate::domain::limits::millis(old.initial),
            was_max_ms = crate::domain::limits::millis(old.max),
            "back-off delays replaced"
        );
    }
}

impl Handler<ListBackoffs> for BackoffRegistryActor {
    type Result = MessageResult<ListBackoffs>;
    /// Lists every entry.
    fn handle(&mut self, _: ListBackoffs, _: &mut Self::Context) -> Self::Result {
        let views: Vec<BackoffView> = self.table.entries(Instant::now());
        MessageResult(views)
    }
}
