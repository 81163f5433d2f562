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
//! ordered, not joinable) while parked.

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
    /// Its slot was released before it finished.
    released: bool,
}

/// The queue. `R` is the pull request, `W` whatever a waiter is notified
/// through (a channel in the actor, a number in tests).
pub struct PullQueue<R, W> {
    concurrency: Concurrency,
    capacity: Option<usize>,
    single_flight: bool,
    seq: u64,
    /// Waiting pulls by (−priority, arrival): the first entry starts next.
    order: BTreeMap<(i64, u64), PullKey>,
    jobs: HashMap<PullKey, Job<R, W>>,
    /// Jobs not shared (single-flight off) get a unique key suffix.
    running: usize,
    parked: VecDeque<(PullKey, i32, R, W)>,
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
            order: BTreeMap::new(),
            jobs: HashMap::new(),
            running: 0,
            parked: VecDeque::new(),
        }
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

    /// Requests waiting on queued or running pulls (including the first).
    pub fn waiters(&self) -> usize {
        self.jobs.values().map(|j| j.waiters.len()).sum()
    }

    fn full(&self) -> bool {
        self.capacity.is_some_and(|c| self.order.len() >= c)
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
        if self.full() || !self.parked.is_empty() {
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
        self.jobs
            .insert(key, Job { order, request: Some(request), waiters: vec![waiter], running: false, released: false });
    }

    /// Moves parked requests into the queue while there is room, calling
    /// `on_admit` for each admitted waiter; returns what was admitted
    /// (joined or queued), in arrival order.
    pub fn admit_parked(&mut self, mut on_admit: impl FnMut(&PullKey, Submitted, &mut W)) -> Vec<(PullKey, Submitted)> {
        let mut admitted = Vec::new();
        while let Some((key, ..)) = self.parked.front() {
            if self.jobs.contains_key(key) {
                let Some((key, _, _, mut waiter)) = self.parked.pop_front() else { break };
                on_admit(&key, Submitted::Joined, &mut waiter);
                if let Some(job) = self.jobs.get_mut(&key) {
                    job.waiters.push(waiter);
                }
                admitted.push((key, Submitted::Joined));
                continue;
            }
            if self.full() {
                break;
            }
            let Some((key, priority, request, mut waiter)) = self.parked.pop_front() else { break };
            on_admit(&key, Submitted::Queued, &mut waiter);
            self.insert(key.clone(), priority, request, waiter);
            admitted.push((key, Submitted::Queued));
        }
        admitted
    }

    /// The next pull to start, if a slot is free: removed from the waiting
    /// order and marked running. Its request is handed over.
    pub fn start_next(&mut self) -> Option<(PullKey, R)> {
        if self.running >= self.concurrency.limit() {
            return None;
        }
        let (_, key) = self.order.pop_first()?;
        let job = self.jobs.get_mut(&key)?;
        job.running = true;
        self.running += 1;
        let request = job.request.take()?;
        Some((key, request))
    }

    /// The pull's CRI call ended: its slot is free for the next pull, but
    /// the job stays (later requests still join it) until [`finish`](Self::finish).
    pub fn release_slot(&mut self, key: &PullKey) {
        if let Some(job) = self.jobs.get_mut(key)
            && job.running
        {
            job.running = false;
            job.released = true;
            self.running = self.running.saturating_sub(1);
        }
    }

    /// A pull ended: returns everyone who waited on it.
    pub fn finish(&mut self, key: &PullKey) -> Vec<W> {
        match self.jobs.remove(key) {
            Some(job) => {
                if job.running {
                    self.running = self.running.saturating_sub(1);
                } else if !job.released {
                    self.order.remove(&job.order);
                }
                job.waiters
            }
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests;
