//! `BackoffTable`: the kubelet's image pull back-off (client-go
//! `flowcontrol.Backoff` with the image manager's settings) as a plain
//! struct. No actix, no clock: every method that needs the time takes `now`.
//!
//! Semantics, as in the kubelet (reference §4):
//!
//! - one entry per [`BackoffKey`] (`"<podUID>_<image>"`), holding the current
//!   back-off period and the time of its last update;
//! - [`next`](BackoffTable::next): no entry or an expired one → the initial
//!   period (10 s); otherwise the period doubles, capped at the maximum
//!   (300 s). No jitter: 10, 20, 40, 80, 160, 300, 300…;
//! - a key is in back-off while `now − last_update < period` (strict);
//! - an entry has expired when `now − last_update > 2 × max` (strict; 600 s by
//!   default) and then counts as absent; [`gc`](BackoffTable::gc) deletes it;
//! - next to the entries, the text of each key's previous pull error, which
//!   the back-off message repeats.
//!
//! Beyond the kubelet: [`clear`](BackoffTable::clear) (an operator's "retry
//! now"), [`entries`](BackoffTable::entries) (status display), and `gc` also
//! deletes previous-error texts, so a text never outlives its entry.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

/// The kubelet's initial image back-off period (`imageBackOffPeriod`).
pub const DEFAULT_INITIAL: Duration = Duration::from_secs(10);

/// The kubelet's maximum image back-off period (`MaxImageBackOff`).
pub const DEFAULT_MAX: Duration = Duration::from_secs(300);

// === BackoffKey ===

/// What a back-off is kept for: one pod and one requested image string.
///
/// `image` is the raw image string the pod asked for (`container.image`),
/// not the defaulted or normalised reference, so `nginx` and
/// `nginx:latest` are different keys, as in the kubelet.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackoffKey {
    /// The pod's UID.
    pub pod_uid: String,
    /// The requested image, exactly as written in the pod spec.
    pub image: String,
}

impl BackoffKey {
    /// The key for `image` as requested by pod `pod_uid`.
    pub fn new(pod_uid: impl Into<String>, image: impl Into<String>) -> Self {
        Self { pod_uid: pod_uid.into(), image: image.into() }
    }
}

impl fmt::Display for BackoffKey {
    /// The kubelet's key text: `<podUID>_<image>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}_{}", self.pod_uid, self.image)
    }
}

// === BackoffDelays ===

/// Back-off periods. Build it with [`try_new`](Self::try_new) (or
/// [`Default`]) so that `initial > 0` and `max >= initial` hold; the table
/// does not misbehave when they don't, but the sequence is then meaningless.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffDelays {
    /// The period after a first failure (or one after the entry expired).
    pub initial: Duration,
    /// The cap on the period; an entry idle for more than twice this expires.
    pub max: Duration,
}

impl Default for BackoffDelays {
    /// The kubelet's values: 10 s, capped at 300 s (expiry after 600 s idle).
    fn default() -> Self {
        Self { initial: DEFAULT_INITIAL, max: DEFAULT_MAX }
    }
}

impl BackoffDelays {
    /// Validated periods.
    ///
    /// # Errors
    ///
    /// [`InvalidBackoff`] when `initial` is zero or `max` is shorter than
    /// `initial`; the message names both values.
    pub fn try_new(initial: Duration, max: Duration) -> Result<Self, InvalidBackoff> {
        if initial.is_zero() {
            return Err(InvalidBackoff::ZeroInitial { initial, max });
        }
        if max < initial {
            return Err(InvalidBackoff::MaxBelowInitial { initial, max });
        }
        Ok(Self { initial, max })
    }

    /// How long an entry may stay idle before it expires: `2 × max`.
    pub fn expiry(&self) -> Duration {
        self.max.saturating_mul(2)
    }
}

/// Back-off periods that [`BackoffDelays::try_new`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidBackoff {
    /// The initial period is zero: nothing would ever be in back-off.
    #[error("back-off initial period must be greater than zero (initial {initial:?}, max {max:?})")]
    ZeroInitial {
        /// The initial period given.
        initial: Duration,
        /// The maximum period given.
        max: Duration,
    },
    /// The maximum period is shorter than the initial one.
    #[error("back-off max period {max:?} is shorter than the initial period {initial:?}")]
    MaxBelowInitial {
        /// The initial period given.
        initial: Duration,
        /// The maximum period given.
        max: Duration,
    },
}

// === ClearScope ===

/// Which back-offs [`BackoffTable::clear`] removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClearScope {
    /// Every key.
    All,
    /// Every image of the pod with this UID.
    Pod(String),
    /// This image, for every pod (by name normalised: `nginx` is
    /// `docker.io/library/nginx:latest`).
    Image(String),
    /// One key.
    Key(BackoffKey),
}

impl ClearScope {
    /// Whether `key` is in this scope.
    pub fn matches(&self, key: &BackoffKey) -> bool {
        match self {
            Self::All => true,
            Self::Pod(uid) => key.pod_uid == *uid,
            // As an operator names it: `nginx` clears `docker.io/library/nginx:latest`.
            Self::Image(image) => crate::domain::reference::same_image(&key.image, image),
            Self::Key(k) => k.pod_uid == key.pod_uid && crate::domain::reference::same_image(&key.image, &k.image),
        }
    }
}

impl fmt::Display for ClearScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::All => f.write_str("all"),
            Self::Pod(uid) => write!(f, "pod {uid}"),
            Self::Image(image) => write!(f, "image {image}"),
            Self::Key(k) => write!(f, "key {k}"),
        }
    }
}

// === BackoffView ===

/// One entry as status displays show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackoffView {
    /// The key.
    pub key: BackoffKey,
    /// The current back-off period.
    pub backoff: Duration,
    /// Time left in back-off; `None` when the key may be pulled now.
    pub retry_in: Option<Duration>,
    /// Idle for more than `2 × max`: the next failure starts again at the
    /// initial period, and the next GC deletes the entry.
    pub expired: bool,
    /// The text of the last pull error, until the next pull attempt.
    pub previous_error: Option<String>,
}

// === BackoffTable ===

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The current period.
    backoff: Duration,
    /// When `next` last ran for the key; the back-off runs from here.
    last_update: Instant,
}

/// Per-key back-off periods and previous-error texts. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct BackoffTable {
    cfg: BackoffDelays,
    entries: HashMap<BackoffKey, Entry>,
    /// Kept apart from `entries`, as in the kubelet: the text is deleted when
    /// a pull is attempted, while the period stays (and keeps doubling).
    previous_errors: HashMap<BackoffKey, String>,
    /// Beyond the kubelet: the identity of the credentials each key's last
    /// failure tried, when the caller tracks it.
    causes: HashMap<BackoffKey, String>,
    /// Beyond the kubelet: the registry each key's last (transient) failure
    /// waits for, when the caller tracks it.
    waiting_on: HashMap<BackoffKey, String>,
}

impl BackoffTable {
    /// An empty table with these periods.
    pub fn new(cfg: BackoffDelays) -> Self {
        Self {
            cfg,
            entries: HashMap::new(),
            previous_errors: HashMap::new(),
            causes: HashMap::new(),
            waiting_on: HashMap::new(),
        }
    }

    /// The periods.
    pub fn config(&self) -> BackoffDelays {
        self.cfg
    }

    /// Replaces the periods at `now` (see
    /// [`UpdateBackoffDelays`](super::UpdateBackoffDelays)); the caller
    /// collects entries expired under the old periods first (a longer cap
    /// must not revive them). Each stored period is capped at the new
    /// maximum; a key still backing off at `now` is lifted to at least the
    /// new initial period (a key whose wait is over stays free). The next
    /// failure doubles from there, never below the initial period.
    pub fn set_config(&mut self, cfg: BackoffDelays, now: Instant) {
        self.cfg = cfg;
        for e in self.entries.values_mut() {
            let backing_off = now.saturating_duration_since(e.last_update) < e.backoff;
            if backing_off {
                e.backoff = e.backoff.max(cfg.initial);
            }
            e.backoff = e.backoff.min(cfg.max);
        }
    }

    /// Number of entries (expired ones included until GC).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn expired(&self, e: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(e.last_update) > self.cfg.expiry()
    }

    /// The kubelet's `Next`: records a failure at `now` and returns the new
    /// period: the initial one for a new or expired key, else twice the
    /// current one, capped at the maximum.
    pub fn next(&mut self, key: &BackoffKey, now: Instant) -> Duration {
        let backoff = match self.entries.get(key) {
            // Never below the initial period: a reload may have raised it
            // over a free key's stored one.
            Some(e) if !self.expired(e, now) => e.backoff.saturating_mul(2).min(self.cfg.max).max(self.cfg.initial),
            _ => self.cfg.initial,
        };
        self.entries.insert(key.clone(), Entry { backoff, last_update: now });
        backoff
    }

    /// The kubelet's `IsInBackOffSinceUpdate`: false with no entry or an
    /// expired one, else `now − last_update < period`.
    pub fn is_in_backoff_since_update(&self, key: &BackoffKey, now: Instant) -> bool {
        self.retry_in(key, now).is_some()
    }

    /// Time left in back-off at `now`; `None` when not in back-off.
    pub fn retry_in(&self, key: &BackoffKey, now: Instant) -> Option<Duration> {
        let e = self.entries.get(key).filter(|e| !self.expired(e, now))?;
        let elapsed = now.saturating_duration_since(e.last_update);
        e.backoff.checked_sub(elapsed).filter(|left| !left.is_zero())
    }

    /// The stored period, expired or not; `None` with no entry.
    pub fn current(&self, key: &BackoffKey) -> Option<Duration> {
        self.entries.get(key).map(|e| e.backoff)
    }

    /// Whether the key has an entry that has expired at `now` (false with no entry).
    pub fn is_expired(&self, key: &BackoffKey, now: Instant) -> bool {
        self.entries.get(key).is_some_and(|e| self.expired(e, now))
    }

    /// The kubelet's `GC`: deletes entries expired at `now`, with their
    /// previous-error texts (and any text whose key has no entry). Returns
    /// the number of entries deleted.
    pub fn gc(&mut self, now: Instant) -> usize {
        let before = self.entries.len();
        let expiry = self.cfg.expiry();
        self.entries.retain(|_, e| now.saturating_duration_since(e.last_update) <= expiry);
        let entries = &self.entries;
        self.previous_errors.retain(|k, _| entries.contains_key(k));
        self.causes.retain(|k, _| entries.contains_key(k));
        self.waiting_on.retain(|k, _| entries.contains_key(k));
        before - self.entries.len()
    }

    /// Stores the text of the key's last pull error (replacing any).
    pub fn set_previous_error(&mut self, key: &BackoffKey, text: impl Into<String>) {
        self.previous_errors.insert(key.clone(), text.into());
    }

    /// The text of the key's last pull error, if stored.
    pub fn previous_error(&self, key: &BackoffKey) -> Option<&str> {
        self.previous_errors.get(key).map(String::as_str)
    }

    /// Deletes the key's previous-error text (the kubelet does this when a
    /// pull is really attempted). The period is kept.
    pub fn clear_previous_error(&mut self, key: &BackoffKey) {
        self.previous_errors.remove(key);
    }

    /// Deletes the entries (and previous-error texts) in `scope`, so their
    /// next failure starts at the initial period. Returns the number of
    /// entries deleted.
    pub fn clear(&mut self, scope: &ClearScope) -> usize {
        let before = self.entries.len();
        self.entries.retain(|k, _| !scope.matches(k));
        self.previous_errors.retain(|k, _| !scope.matches(k));
        self.causes.retain(|k, _| !scope.matches(k));
        self.waiting_on.retain(|k, _| !scope.matches(k));
        before - self.entries.len()
    }

    /// Marks the key's last failure as a transient one from `registry`
    /// (`None`: not such a failure; any earlier mark goes).
    pub fn set_waiting_on(&mut self, key: &BackoffKey, registry: Option<String>) {
        match registry {
            Some(r) => self.waiting_on.insert(key.clone(), r),
            None => self.waiting_on.remove(key),
        };
    }

    /// Deletes the entries (and texts) of the keys whose last failure was a
    /// transient one from `registry`. Returns the number deleted.
    pub fn registry_recovered(&mut self, registry: &str) -> usize {
        let keys: Vec<BackoffKey> =
            self.waiting_on.iter().filter(|(_, r)| r.as_str() == registry).map(|(k, _)| k.clone()).collect();
        keys.iter().filter(|k| self.remove(k)).count()
    }

    /// Deletes one key's entry and everything kept with it; whether it had an entry.
    pub fn remove(&mut self, key: &BackoffKey) -> bool {
        self.previous_errors.remove(key);
        self.causes.remove(key);
        self.waiting_on.remove(key);
        self.entries.remove(key).is_some()
    }

    /// Stores the identity of the credentials the key's last failure tried.
    pub fn set_cause(&mut self, key: &BackoffKey, credentials: impl Into<String>) {
        self.causes.insert(key.clone(), credentials.into());
    }

    /// Whether the key's last failure was recorded with credentials other
    /// than `credentials` (false when none were recorded for it).
    pub fn cause_differs(&self, key: &BackoffKey, credentials: &str) -> bool {
        self.causes.get(key).is_some_and(|c| c != credentials)
    }

    /// Every entry at `now`, sorted by pod UID then image.
    pub fn entries(&self, now: Instant) -> Vec<BackoffView> {
        let mut views: Vec<BackoffView> = self
            .entries
            .iter()
            .map(|(key, e)| BackoffView {
                key: key.clone(),
                backoff: e.backoff,
                retry_in: self.retry_in(key, now),
                expired: self.expired(e, now),
                previous_error: self.previous_errors.get(key).cloned(),
            })
            .collect();
        views.sort_by(|a, b| a.key.cmp(&b.key));
        views
    }
}
