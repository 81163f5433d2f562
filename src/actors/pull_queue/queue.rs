//! `PullQueue`: which pulls wait, which run, and who waits on each — the
//! pull queue's logic, free of actix and I/O.
//!
//! Single-flight: requests with the same [`PullKey`] (image, runtime
//! handler, credential identity) that arrive while a pull for that key is
//! queued or running join it instead of adding a pull; they take no queue
//! slot and no parallel slot. Requests whose credentials differ never share.
//!
//! Order: highest priority first, first come first served within a priority.
//!
//! Capacity: at most `capacity` pulls wait to start (the kubelet's channel of
//! 10 in serial mode). A request that finds the queue full is parked, in
//! arrival order, until a waiting pull starts; it is not yet queued (not
//! ordered, not joinable) while parked. When a parked request is admitted as
//! a new pull, every request parked with the same key joins it at once: they
//! all arrived before that pull starts, so it serves each of them as a pull
//! of its own would (a request that must reach the registry included).
//! Without this a burst through the CRI front (kubelets' `PullImage` of a
//! few images, all parked) pulled each image again for most requests.
//!
//! Per-registry limit (optional, [`PullQueue::with_registry_limit`]): at most
//! that many pulls from one registry run at once. A pull whose registry is at
//! its limit is passed over, keeping its place, for the next pull in order
//! from another registry: one slow registry cannot take every slot. With it,
//! the capacity bounds the waiting pulls of each registry, and parked
//! requests are admitted in arrival order within their registry, so a
//! backlog for one registry does not hold up requests for another either.
//! A registry may have a limit of its own
//! ([`PullQueue::with_registry_limits`], `[[pull.registries]]`
//! `max_parallel`), in place of the node-wide one for it; with only such
//! limits, other registries have none, and the capacity still bounds each
//! registry's waiting pulls.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// What makes two pull requests the same pull.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PullKey {
    /// Normalised image reference.
    pub image: String,
    /// Runtime handler the image is pulled for.
    pub runtime_handler: String,
    /// Identity of the credentials tried (a hash; empty = anonymous). The
    /// pull queue actor appends `;must-pull` for requests that must reach
    /// the registry (no `skip_if_present`), so they never join a pull that
    /// may be skipped.
    pub credentials: String,
}

/// How many pulls may run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Concurrency {
    /// One at a time (the kubelet's serial puller).
    Serial,
    /// Up to this many at once; `None` = no limit.
    Parallel(Option<usize>),
}

impl Concurrency {
    /// Most pulls that may run at once.
    pub fn limit(self) -> usize {
        match self {
            Concurrency::Serial => 1,
            Concurrency::Parallel(Some(n)) => n.max(1),
            Concurrency::Parallel(None) => usize::MAX,
        }
    }
}

impl PullKey {
    /// Suffix of [`credentials`](Self::credentials) for a pull that must
    /// reach the registry.
    pub const MUST_PULL: &'static str = ";must-pull";

    /// The key of a request: `identity` is the credential list's identity
    /// (empty = anonymous); `must_pull` when it may not be skipped.
    pub fn new(image: String, runtime_handler: String, identity: String, must_pull: bool) -> Self {
        let mut credentials = identity;
        if must_pull {
            credentials.push_str(Self::MUST_PULL);
        }
        Self { image, runtime_handler, credentials }
    }

    /// Whether the pull tries credentials (never which ones).
    pub fn with_credentials(&self) -> bool {
        !self.credentials.split([';', '#']).next().unwrap_or_default().is_empty()
    }

    /// Whether the pull must reach the registry (not skipped when present).
    pub fn must_pull(&self) -> bool {
        self.credentials.contains(Self::MUST_PULL)
    }
}

/// Where a pull is in the queue (see [`PullQueue::snapshot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Running: its CRI call has not ended.
    Running,
    /// Waiting to start: 1 = next.
    Queued(usize),
    /// Waiting for room in a full queue: 1 = first admitted.
    Parked(usize),
}

/// One pull (or parked request) as [`PullQueue::snapshot`] shows it.
#[derive(Debug)]
pub struct JobView<'a, W> {
    /// Its key.
    pub key: &'a PullKey,
    /// Its priority (the first request's).
    pub priority: i32,
    /// Where it is.
    pub place: Place,
    /// Who waits on it (a parked request: itself).
    pub waiters: &'a [W],
}

/// What happened to a submitted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    /// A pull for the same key is queued or running; the request waits on it.
    Joined,
    /// A new pull was queued.
    Queued,
    /// The queue is full; the request is parked until a slot frees.
    Parked,
}

struct Job<R, W> {
    order: (i64, u64),
    request: Option<R>,
    waiters: Vec<W>,
    running: bool,
    /// When it started, counted in starts (0 = not yet).
    start: u64,
}

/// The queue. `R` is the pull request, `W` whatever a waiter is notified
/// through (a channel in the actor, a number in tests).
pub struct PullQueue<R, W> {
    concurrency: Concurrency,
    capacity: Option<usize>,
    single_flight: bool,
    seq: u64,
    /// Pulls started so far.
    starts: u64,
    /// Waiting pulls by (−priority, arrival): the first entry starts next.
    order: BTreeMap<(i64, u64), PullKey>,
    /// By key: a `BTreeMap`, as its order shows when the queue is dropped
    /// (waiters are told in it) and must be the same in every process.
    jobs: BTreeMap<PullKey, Job<R, W>>,
    /// Jobs not shared (single-flight off) get a unique key suffix.
    running: usize,
    parked: VecDeque<(PullKey, i32, R, W)>,
    /// How many requests of each key are parked (a key is absent at 0).
    parked_keys: HashMap<PullKey, usize>,
    /// Most pulls running at once per registry (`None` = no such limit).
    registry_limit: Option<usize>,
    /// Registries' own limits, in place of `registry_limit` for them.
    registry_limits: HashMap<String, usize>,
    /// Count and bound waiting pulls per registry even without a limit
    /// (registries' own rates: a registry out of tokens must not fill the
    /// queue for the others).
    per_registry: bool,
    /// Pulls running per registry (kept only with a registry limit).
    running_by_registry: HashMap<String, usize>,
    /// Pulls waiting to start per registry (kept only with a registry limit).
    waiting_by_registry: HashMap<String, usize>,
}

fn add(counts: &mut HashMap<String, usize>, registry: &str) {
    match counts.get_mut(registry) {
        Some(n) => *n += 1,
        None => {
            counts.insert(registry.to_string(), 1);
        }
    }
}

fn sub(counts: &mut HashMap<String, usize>, registry: &str) {
    if let Some(n) = counts.get_mut(registry) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(registry);
        }
    }
}

fn view<'a, R, W>(key: &'a PullKey, job: &'a Job<R, W>, place: Place) -> JobView<'a, W> {
    JobView { key, priority: priority_of(job.order), place, waiters: &job.waiters }
}

/// A job's priority, from its place in the order.
fn priority_of(order: (i64, u64)) -> i32 {
    i32::try_from(-order.0).unwrap_or(i32::MAX)
}

/// The registry (domain) of a queue key's image: the part before the first
/// `/` of the normalised reference (`docker.io` for `busybox`). A name that
/// did not parse is keyed as written, so it is its own registry at worst.
pub fn registry_of(image: &str) -> &str {
    image.split_once('/').map_or(image, |(domain, _)| domain)
}

impl<R, W> PullQueue<R, W> {
    /// An empty queue. `capacity` bounds the pulls waiting to start
    /// (`None` = unbounded).
    pub fn new(concurrency: Concurrency, capacity: Option<usize>, single_flight: bool) -> Self {
        Self {
            concurrency,
            capacity,
            single_flight,
            seq: 0,
            starts: 0,
            order: BTreeMap::new(),
            jobs: BTreeMap::new(),
            running: 0,
            parked: VecDeque::new(),
            parked_keys: HashMap::new(),
            registry_limit: None,
            registry_limits: HashMap::new(),
            per_registry: false,
            running_by_registry: HashMap::new(),
            waiting_by_registry: HashMap::new(),
        }
    }

    /// At most `limit` pulls from one registry run at once (`None`, the
    /// default, = only the overall limit applies). A limit of 0 is taken as 1.
    pub fn with_registry_limit(mut self, limit: Option<usize>) -> Self {
        self.registry_limit = limit.map(|n| n.max(1));
        self
    }

    /// Registries' own limits on pulls at once, in place of
    /// [`with_registry_limit`](Self::with_registry_limit)'s for them (a
    /// limit of 0 is taken as 1).
    pub fn with_registry_limits(mut self, limits: HashMap<String, usize>) -> Self {
        self.registry_limits = limits.into_iter().map(|(r, n)| (r, n.max(1))).collect();
        self
    }

    /// Replaces the per-registry limits (a reload): pulls running keep
    /// running; from now on a registry's pulls start while fewer than its
    /// new limit run. The counts per registry are kept whatever the limits,
    /// so limits may come and go.
    pub fn set_registry_limits(&mut self, limit: Option<usize>, limits: HashMap<String, usize>) {
        self.registry_limit = limit.map(|n| n.max(1));
        self.registry_limits = limits.into_iter().map(|(r, n)| (r, n.max(1))).collect();
    }

    /// Replaces how many pulls run at once (a reload): pulls running keep
    /// running; from now on pulls start while fewer than the new limit run.
    pub fn set_concurrency(&mut self, concurrency: Concurrency) {
        self.concurrency = concurrency;
    }

    /// Counts and bounds waiting pulls per registry even when no registry
    /// has a limit.
    pub fn with_per_registry_capacity(mut self, on: bool) -> Self {
        self.per_registry = on;
        self
    }

    /// The same, on a running queue (a reload of the registries' rates):
    /// pulls already admitted stay; admission follows the new counting.
    pub fn set_per_registry_capacity(&mut self, on: bool) {
        self.per_registry = on;
    }

    /// Whether pulls are counted per registry: any registry has a limit,
    /// or [`with_per_registry_capacity`](Self::with_per_registry_capacity).
    fn by_registry(&self) -> bool {
        self.per_registry || self.registry_limit.is_some() || !self.registry_limits.is_empty()
    }

    /// The most pulls from `registry` at once.
    fn limit_of(&self, registry: &str) -> usize {
        self.registry_limits.get(registry).copied().or(self.registry_limit).unwrap_or(usize::MAX)
    }

    /// Pulls running now from `registry`.
    pub fn running_from(&self, registry: &str) -> usize {
        self.running_by_registry.get(registry).copied().unwrap_or(0)
    }

    /// Pulls waiting to start.
    pub fn queued(&self) -> usize {
        self.order.len()
    }

    /// Pulls running.
    pub fn running(&self) -> usize {
        self.running
    }

    /// Requests parked because the queue was full.
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Who waits on the pull of `key` (none when there is no such pull).
    pub fn waiters_of(&self, key: &PullKey) -> &[W] {
        self.jobs.get(key).map_or(&[], |j| j.waiters.as_slice())
    }

    /// Requests waiting on queued or running pulls (including the first).
    pub fn waiters(&self) -> usize {
        self.jobs.values().map(|j| j.waiters.len()).sum()
    }

    /// Every pull and parked request: running pulls first,
    /// in start order, then the queued ones in the order they will start
    /// (without a registry's limit or rate; with one, a pull may be passed
    /// over), then parked requests in arrival order.
    pub fn snapshot(&self) -> Vec<JobView<'_, W>> {
        let mut active: Vec<(&PullKey, &Job<R, W>)> = self.jobs.iter().filter(|(_, j)| j.running).collect();
        active.sort_by_key(|(_, j)| j.start);
        let mut out: Vec<JobView<'_, W>> =
            active.into_iter().map(|(key, job)| view(key, job, Place::Running)).collect();
        for (i, key) in self.order.values().enumerate() {
            if let Some(job) = self.jobs.get(key) {
                out.push(view(key, job, Place::Queued(i + 1)));
            }
        }
        for (i, (key, priority, _, waiter)) in self.parked.iter().enumerate() {
            out.push(JobView {
                key,
                priority: *priority,
                place: Place::Parked(i + 1),
                waiters: std::slice::from_ref(waiter),
            });
        }
        out
    }

    /// Whether a new pull for `key` must park: the queue (with a registry
    /// limit: its registry's share) is full, or requests parked before it
    /// (with a registry limit: for its registry) are still waiting.
    fn must_park(&self, key: &PullKey) -> bool {
        if self.by_registry() {
            let registry = registry_of(&key.image);
            self.full(self.waiting_by_registry.get(registry).copied().unwrap_or(0))
                || self.parked.iter().any(|(k, ..)| registry_of(&k.image) == registry)
        } else {
            self.full(self.order.len()) || !self.parked.is_empty()
        }
    }

    fn full(&self, waiting: usize) -> bool {
        self.capacity.is_some_and(|c| waiting >= c)
    }

    fn unique(&mut self, mut key: PullKey) -> PullKey {
        if !self.single_flight {
            // Every request is its own pull: make its key unique.
            key.credentials = format!("{}#{}", key.credentials, self.seq);
        }
        key
    }

    /// Submits a request with its waiter.
    pub fn submit(&mut self, key: PullKey, priority: i32, request: R, waiter: W) -> Submitted {
        let key = self.unique(key);
        if let Some(job) = self.jobs.get_mut(&key) {
            job.waiters.push(waiter);
            return Submitted::Joined;
        }
        if self.must_park(&key) {
            *self.parked_keys.entry(key.clone()).or_default() += 1;
            self.parked.push_back((key, priority, request, waiter));
            return Submitted::Parked;
        }
        self.insert(key, priority, request, waiter);
        Submitted::Queued
    }

    fn insert(&mut self, key: PullKey, priority: i32, request: R, waiter: W) {
        self.seq += 1;
        let order = (-i64::from(priority), self.seq);
        self.order.insert(order, key.clone());
        add(&mut self.waiting_by_registry, registry_of(&key.image));
        self.jobs.insert(key, Job { order, request: Some(request), waiters: vec![waiter], running: false, start: 0 });
    }

    /// Moves parked requests into the queue while there is room, calling
    /// `on_admit` for each admitted waiter; returns what was admitted
    /// (joined or queued), in arrival order.
    pub fn admit_parked(&mut self, mut on_admit: impl FnMut(&PullKey, Submitted, &mut W)) -> Vec<(PullKey, Submitted)> {
        let mut admitted = Vec::new();
        // Registries whose earliest parked request stays parked: the later
        // ones of that registry stay behind it (without a registry limit,
        // the first request that stays parked stops the pass).
        let mut held: Vec<String> = Vec::new();
        // Requests passed over (registry limit only), kept in order ahead of
        // the rest. Without a registry limit the queue is worked in place:
        // a burst parks thousands, and copying them all for each admission
        // cost time and, for a moment, their memory twice over.
        let mut kept = VecDeque::new();
        while let Some((key, ..)) = self.parked.front() {
            let joins = self.jobs.contains_key(key);
            let by_registry = self.by_registry();
            let room = joins
                || if by_registry {
                    let registry = registry_of(&key.image);
                    !held.iter().any(|h| *h == registry)
                        && !self.full(self.waiting_by_registry.get(registry).copied().unwrap_or(0))
                } else {
                    !self.full(self.order.len())
                };
            if !room && !by_registry {
                break;
            }
            let Some((key, priority, request, mut waiter)) = self.parked.pop_front() else { break };
            let more_parked = self.unpark(&key);
            if !room {
                *self.parked_keys.entry(key.clone()).or_default() += 1;
                held.push(registry_of(&key.image).to_string());
                kept.push_back((key, priority, request, waiter));
                continue;
            }
            if joins {
                on_admit(&key, Submitted::Joined, &mut waiter);
                if let Some(job) = self.jobs.get_mut(&key) {
                    job.waiters.push(waiter);
                }
                admitted.push((key, Submitted::Joined));
                continue;
            }
            on_admit(&key, Submitted::Queued, &mut waiter);
            self.insert(key.clone(), priority, request, waiter);
            admitted.push((key.clone(), Submitted::Queued));
            if more_parked {
                self.join_parked(&key, &mut on_admit, &mut admitted);
            }
        }
        if !kept.is_empty() {
            kept.append(&mut self.parked);
            self.parked = kept;
        }
        admitted
    }

    /// One parked request of `key` left the parked queue; whether others
    /// of that key are still parked.
    fn unpark(&mut self, key: &PullKey) -> bool {
        match self.parked_keys.get_mut(key) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            _ => {
                self.parked_keys.remove(key);
                false
            }
        }
    }

    /// Every request parked with `key` joins its job, just queued (one pass
    /// over the parked requests, made only when some share the key).
    fn join_parked(
        &mut self,
        key: &PullKey,
        on_admit: &mut impl FnMut(&PullKey, Submitted, &mut W),
        admitted: &mut Vec<(PullKey, Submitted)>,
    ) {
        self.parked_keys.remove(key);
        let mut rest = VecDeque::with_capacity(self.parked.len());
        while let Some(entry) = self.parked.pop_front() {
            if entry.0 != *key {
                rest.push_back(entry);
                continue;
            }
            let (key, _, _, mut waiter) = entry;
            on_admit(&key, Submitted::Joined, &mut waiter);
            if let Some(job) = self.jobs.get_mut(&key) {
                job.waiters.push(waiter);
            }
            admitted.push((key, Submitted::Joined));
        }
        self.parked = rest;
    }

    /// The next pull to start, if a slot is free: removed from the waiting
    /// order and marked running. Its request is handed over.
    /// With a registry limit, the first in order whose registry has room.
    pub fn start_next(&mut self) -> Option<(PullKey, R)> {
        self.start_next_where(None)
    }

    /// [`start_next`](Self::start_next), passing over pulls whose registry
    /// `ready` refuses (asked only of the pull that would start, in order:
    /// it may take that registry's throttle token). `None`: every registry
    /// is ready.
    pub fn start_next_where(&mut self, mut ready: Option<&mut dyn FnMut(&str) -> bool>) -> Option<(PullKey, R)> {
        if self.running >= self.concurrency.limit() {
            return None;
        }
        let mut ready = |registry: &str| ready.as_mut().is_none_or(|r| r(registry));
        let key = if self.by_registry() {
            let order = *self
                .order
                .iter()
                .find(|(_, k)| {
                    let registry = registry_of(&k.image);
                    self.running_from(registry) < self.limit_of(registry) && ready(registry)
                })?
                .0;
            let key = self.order.remove(&order)?;
            let registry = registry_of(&key.image);
            sub(&mut self.waiting_by_registry, registry);
            add(&mut self.running_by_registry, registry);
            key
        } else if let Some(order) = self.order.iter().find(|(_, k)| ready(registry_of(&k.image))).map(|(o, _)| *o) {
            self.order.remove(&order)?
        } else {
            return None;
        };
        if !self.by_registry() {
            let registry = registry_of(&key.image);
            sub(&mut self.waiting_by_registry, registry);
            add(&mut self.running_by_registry, registry);
        }
        let job = self.jobs.get_mut(&key)?;
        job.running = true;
        self.starts += 1;
        job.start = self.starts;
        self.running += 1;
        let request = job.request.take()?;
        Some((key, request))
    }

    /// A running pull stopped running (it finished).
    fn stopped_running(&mut self, key: &PullKey) {
        self.running = self.running.saturating_sub(1);
        sub(&mut self.running_by_registry, registry_of(&key.image));
    }

    /// A pull ended (its CRI call succeeded, or it failed, or found its
    /// image present): returns everyone who waited on it, and its slot is
    /// free. A later request for the same key is a new pull.
    pub fn finish(&mut self, key: &PullKey) -> Vec<W> {
        match self.jobs.remove(key) {
            Some(job) => {
                if job.running {
                    self.stopped_running(key);
                } else {
                    self.order.remove(&job.order);
                    sub(&mut self.waiting_by_registry, registry_of(&key.image));
                }
                job.waiters
            }
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests;
