//! Message-level fault injection for CRI calls.
//!
//! A [`FaultPlan`] is a list of [`FaultRule`]s. Before each CRI call the CRI
//! gateway (and, at RPC level, the embedded runtime) asks the plan whether a
//! rule fires for that call; the first rule that fires decides the
//! [`FaultAction`]. Rules match a call kind ([`Rpc`]), optionally an image
//! glob, an occurrence window, and a probability drawn from the plan's seeded
//! generator, so a plan replays the same faults every run.
//!
//! ```
//! use imaged::cri::{CriError, CriErrorKind, Rpc};
//! use imaged::fault::{FaultPlan, FaultRule};
//! use std::time::Duration;
//!
//! let plan = FaultPlan::new(42)
//!     .rule(FaultRule::on(Rpc::PullImage).image("*/nginx:*").times(2)
//!         .fail(CriError::new(CriErrorKind::RegistryUnavailable, "registry down")))
//!     .rule(FaultRule::on(Rpc::ImageStatus).probability(0.1).delay(Duration::from_millis(50)));
//! assert_eq!(plan.rules().len(), 2);
//! ```

mod plan_file;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng};

use crate::cri::{CriError, Rpc};

/// What happens to a call a rule fires for.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// The call fails at once with this error; the runtime is not called.
    Fail(CriError),
    /// The call is held this long, then made. The delay counts against the
    /// call's deadline.
    Delay(Duration),
    /// The call is never made and never answers: the caller sees
    /// `DeadlineExceeded` when the call's deadline passes (a call with no
    /// deadline hangs until its caller gives up).
    Hang,
    /// The call is made (its effect happens on the runtime) but its reply is
    /// lost: the caller sees `DeadlineExceeded` when the deadline passes.
    DropReply,
    /// The CRI gateway panics while making the call: a stand-in for a bug,
    /// to test supervision. Under `imaged run` the process logs the panic
    /// and aborts (see `actors.md`, panic policy); in an embedder's process
    /// the call's task ends and its caller sees the reply lost. The
    /// embedded runtime (wire level) answers `Internal` instead.
    Panic,
}

/// One rule of a [`FaultPlan`]. Build with [`FaultRule::on`] and finish with
/// an action ([`fail`](FaultRule::fail), [`delay`](FaultRule::delay),
/// [`hang`](FaultRule::hang), [`drop_reply`](FaultRule::drop_reply)).
#[derive(Debug)]
pub struct FaultRule {
    rpc: Option<Rpc>,
    image: Option<wildmatch::WildMatch>,
    image_text: Option<String>,
    skip: u64,
    times: Option<u64>,
    probability: Option<f64>,
    action: FaultAction,
    /// Calls that matched kind and image so far (the occurrence count).
    seen: AtomicU64,
    /// Times this rule fired.
    fired: AtomicU64,
}

impl Clone for FaultRule {
    fn clone(&self) -> Self {
        Self {
            rpc: self.rpc,
            image: self.image.clone(),
            image_text: self.image_text.clone(),
            skip: self.skip,
            times: self.times,
            probability: self.probability,
            action: self.action.clone(),
            seen: AtomicU64::new(self.seen.load(Ordering::Relaxed)),
            fired: AtomicU64::new(self.fired.load(Ordering::Relaxed)),
        }
    }
}

impl FaultRule {
    /// A rule for calls of one kind. Until an action is set it fails with
    /// a generic `Unknown` error.
    pub fn on(rpc: Rpc) -> Self {
        Self::new(Some(rpc))
    }

    /// A rule for calls of every kind.
    pub fn any() -> Self {
        Self::new(None)
    }

    fn new(rpc: Option<Rpc>) -> Self {
        Self {
            rpc,
            image: None,
            image_text: None,
            skip: 0,
            times: None,
            probability: None,
            action: FaultAction::Fail(CriError::new(crate::cri::CriErrorKind::Other, "injected fault")),
            seen: AtomicU64::new(0),
            fired: AtomicU64::new(0),
        }
    }

    /// Only calls whose image matches this glob (`*` any run, `?` one
    /// character). Calls that carry no image never match a rule with one.
    #[must_use]
    pub fn image(mut self, glob: &str) -> Self {
        self.image = Some(wildmatch::WildMatch::new(glob));
        self.image_text = Some(glob.to_string());
        self
    }

    /// Let the first `n` matching calls through before the rule applies.
    #[must_use]
    pub fn after(mut self, n: u64) -> Self {
        self.skip = n;
        self
    }

    /// Apply to at most `n` matching calls (after any [`after`](Self::after)).
    #[must_use]
    pub fn times(mut self, n: u64) -> Self {
        self.times = Some(n);
        self
    }

    /// Apply only to the `n`th matching call (1-based).
    #[must_use]
    pub fn nth(self, n: u64) -> Self {
        self.after(n.saturating_sub(1)).times(1)
    }

    /// Apply with probability `p` (0..=1, clamped), drawn from the plan's
    /// seeded generator.
    #[must_use]
    pub fn probability(mut self, p: f64) -> Self {
        self.probability = Some(if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) });
        self
    }

    /// Fail the call with this error.
    #[must_use]
    pub fn fail(mut self, err: CriError) -> Self {
        self.action = FaultAction::Fail(err);
        self
    }

    /// Delay the call.
    #[must_use]
    pub fn delay(mut self, d: Duration) -> Self {
        self.action = FaultAction::Delay(d);
        self
    }

    /// Never make the call; the caller's deadline decides.
    #[must_use]
    pub fn hang(mut self) -> Self {
        self.action = FaultAction::Hang;
        self
    }

    /// Make the call but lose the reply.
    #[must_use]
    pub fn drop_reply(mut self) -> Self {
        self.action = FaultAction::DropReply;
        self
    }

    /// Panic while making the call (see [`FaultAction::Panic`]).
    #[must_use]
    pub fn panic(mut self) -> Self {
        self.action = FaultAction::Panic;
        self
    }

    /// How many times this rule has fired.
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::Relaxed)
    }

    /// The action the rule applies.
    pub fn action(&self) -> &FaultAction {
        &self.action
    }

    fn matches(&self, rpc: Rpc, image: Option<&str>) -> bool {
        if self.rpc.is_some_and(|r| r != rpc) {
            return false;
        }
        match (&self.image, image) {
            (None, _) => true,
            (Some(glob), Some(img)) => glob.matches(img),
            (Some(_), None) => false,
        }
    }
}

/// A seeded, shareable list of fault rules. Cloning shares the rules and
/// their counters (clones are views of one plan).
#[derive(Debug, Clone)]
pub struct FaultPlan {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    rules: Vec<FaultRule>,
    seed: u64,
    rng: Mutex<StdRng>,
}

impl Default for FaultPlan {
    fn default() -> Self {
        Self::new(0)
    }
}

impl FaultPlan {
    /// An empty plan whose probabilities are drawn from a generator seeded
    /// with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { inner: Arc::new(Inner { rules: Vec::new(), seed, rng: Mutex::new(StdRng::seed_from_u64(seed)) }) }
    }

    /// The plan with one more rule (rules are tried in the order added).
    /// The random sequence starts again from the seed.
    #[must_use]
    pub fn rule(self, rule: FaultRule) -> Self {
        let mut rules: Vec<FaultRule> = self.inner.rules.clone();
        rules.push(rule);
        let seed = self.inner.seed;
        Self { inner: Arc::new(Inner { rules, seed, rng: Mutex::new(StdRng::seed_from_u64(seed)) }) }
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[FaultRule] {
        &self.inner.rules
    }

    /// True when the plan has no rules (the fast path: nothing to check).
    pub fn is_empty(&self) -> bool {
        self.inner.rules.is_empty()
    }

    /// Decides the fault for one call, counting it against every rule whose
    /// kind and image match. Returns the first firing rule's action.
    pub fn decide(&self, rpc: Rpc, image: Option<&str>) -> Option<FaultAction> {
        let mut chosen = None;
        for rule in &self.inner.rules {
            if !rule.matches(rpc, image) {
                continue;
            }
            let n = rule.seen.fetch_add(1, Ordering::Relaxed);
            if chosen.is_some() || n < rule.skip {
                continue;
            }
            if rule.times.is_some_and(|t| n - rule.skip >= t) {
                continue;
            }
            if let Some(p) = rule.probability {
                let draw: f64 = match self.inner.rng.lock() {
                    Ok(mut g) => g.random(),
                    Err(poisoned) => poisoned.into_inner().random(),
                };
                if draw >= p {
                    continue;
                }
            }
            rule.fired.fetch_add(1, Ordering::Relaxed);
            chosen = Some(rule.action.clone());
        }
        chosen
    }
}

#[cfg(test)]
mod tests;
