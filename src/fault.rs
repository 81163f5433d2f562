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

    /// A plan from its TOML form (`runtime.fault_plan` names such a file):
    ///
    /// ```toml
    /// seed = 7                      # for probabilities; default 0
    /// [[rule]]
    /// rpc = "PullImage"             # a CRI call name, or "any"
    /// image = "*/nginx:*"           # optional glob on the image
    /// after = 0                     # optional: skip this many matching calls
    /// times = 2                     # optional: fire at most this many times
    /// probability = 0.5             # optional
    /// action = "fail"               # fail | delay | hang | drop-reply | panic
    /// kind = "RegistryUnavailable"  # fail: the error kind (default Other)
    /// message = "registry down"     # fail: the error text
    /// delay = "2s"                  # delay: how long
    /// ```
    ///
    /// Errors name the rule (1-based) and the field.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct RawPlan {
            #[serde(default)]
            seed: u64,
            #[serde(default)]
            rule: Vec<RawRule>,
        }
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct RawRule {
            rpc: String,
            image: Option<String>,
            after: Option<u64>,
            times: Option<u64>,
            probability: Option<f64>,
            action: String,
            kind: Option<String>,
            message: Option<String>,
            delay: Option<String>,
        }
        let raw: RawPlan = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .and_then(config::Config::try_deserialize)
            .map_err(|e| e.to_string())?;
        let mut plan = FaultPlan::new(raw.seed);
        for (i, r) in raw.rule.into_iter().enumerate() {
            let at = |field: &str, why: String| format!("rule {}: {field}: {why}", i + 1);
            let mut rule = if r.rpc.eq_ignore_ascii_case("any") {
                FaultRule::any()
            } else {
                FaultRule::on(r.rpc.parse::<Rpc>().map_err(|e| at("rpc", e))?)
            };
            if let Some(g) = &r.image {
                rule = rule.image(g);
            }
            if let Some(n) = r.after {
                rule = rule.after(n);
            }
            if let Some(n) = r.times {
                rule = rule.times(n);
            }
            if let Some(p) = r.probability {
                if !(0.0..=1.0).contains(&p) {
                    return Err(at("probability", format!("{p} is not between 0 and 1")));
                }
                rule = rule.probability(p);
            }
            rule = match r.action.as_str() {
                "fail" => {
                    let kind = match &r.kind {
                        None => crate::cri::CriErrorKind::Other,
                        Some(k) => crate::cri::CriErrorKind::ALL
                            .into_iter()
                            .find(|x| format!("{x:?}").eq_ignore_ascii_case(k))
                            .ok_or_else(|| at("kind", format!("unknown error kind {k:?}")))?,
                    };
                    rule.fail(CriError::new(kind, r.message.clone().unwrap_or_else(|| "fault injected".into())))
                }
                "delay" => {
                    let d = r.delay.as_deref().ok_or_else(|| at("delay", "required for action \"delay\"".into()))?;
                    rule.delay(
                        humantime::parse_duration(d)
                            .map_err(|e| e.to_string())
                            .and_then(|v| {
                                crate::domain::limits::check_duration(v, || d.to_string()).map_err(|e| e.reason())
                            })
                            .map_err(|e| at("delay", format!("{d:?}: {e}")))?,
                    )
                }
                "hang" => rule.hang(),
                "drop-reply" => rule.drop_reply(),
                "panic" => rule.panic(),
                other => {
                    return Err(at(
                        "action",
                        format!("unknown action {other:?}: one of fail, delay, hang, drop-reply, panic"),
                    ));
                }
            };
            plan = plan.rule(rule);
        }
        Ok(plan)
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
mod tests {
    use super::*;
    use crate::cri::CriErrorKind;

    fn not_found() -> CriError {
        CriError::new(CriErrorKind::NotFound, "nope")
    }

    #[test]
    fn rules_match_kind_and_image_glob() {
        let plan = FaultPlan::new(1).rule(FaultRule::on(Rpc::PullImage).image("*/nginx:*").fail(not_found()));
        assert_eq!(
            plan.decide(Rpc::PullImage, Some("docker.io/library/nginx:1.25")),
            Some(FaultAction::Fail(not_found()))
        );
        assert_eq!(plan.decide(Rpc::PullImage, Some("docker.io/library/busybox:1")), None);
        assert_eq!(plan.decide(Rpc::ImageStatus, Some("docker.io/library/nginx:1.25")), None);
        assert_eq!(plan.decide(Rpc::PullImage, None), None);
    }

    #[test]
    fn occurrence_windows_count_matching_calls_only() {
        let plan = FaultPlan::new(1).rule(FaultRule::on(Rpc::RemoveImage).after(1).times(2).hang());
        let got: Vec<bool> = (0..5).map(|_| plan.decide(Rpc::RemoveImage, Some("x")).is_some()).collect();
        assert_eq!(got, [false, true, true, false, false]);
        let nth = FaultPlan::new(1).rule(FaultRule::any().nth(3).drop_reply());
        let got: Vec<bool> = (0..4).map(|_| nth.decide(Rpc::ListImages, None).is_some()).collect();
        assert_eq!(got, [false, false, true, false]);
        assert_eq!(nth.rules()[0].fired(), 1);
    }

    #[test]
    fn probability_is_reproducible_with_a_seed() {
        let run = |seed| {
            let plan = FaultPlan::new(seed).rule(FaultRule::any().probability(0.3).hang());
            (0..1000).map(|_| plan.decide(Rpc::Version, None).is_some()).collect::<Vec<_>>()
        };
        let a = run(7);
        assert_eq!(a, run(7));
        let fired = a.iter().filter(|x| **x).count();
        assert!((220..380).contains(&fired), "fired {fired} of 1000 at p=0.3");
        assert_ne!(a, run(8));
    }

    #[test]
    fn first_firing_rule_wins_but_later_rules_still_count() {
        let plan = FaultPlan::new(1)
            .rule(FaultRule::on(Rpc::PullImage).times(1).delay(Duration::from_millis(5)))
            .rule(FaultRule::on(Rpc::PullImage).nth(1).hang());
        assert_eq!(plan.decide(Rpc::PullImage, None), Some(FaultAction::Delay(Duration::from_millis(5))));
        // The second rule saw call 1 too, so its window has passed.
        assert_eq!(plan.decide(Rpc::PullImage, None), None);
    }

    #[test]
    fn plans_load_from_toml_and_bad_rules_are_named() {
        let plan = FaultPlan::from_toml(
            r#"
            seed = 3
            [[rule]]
            rpc = "PullImage"
            image = "*/nginx:*"
            times = 1
            action = "fail"
            kind = "registryunavailable"
            message = "registry down"
            [[rule]]
            rpc = "any"
            action = "delay"
            delay = "25ms"
            [[rule]]
            rpc = "imagestatus"
            probability = 0.5
            action = "panic"
            "#,
        )
        .expect("valid plan");
        assert_eq!(plan.rules().len(), 3);
        assert_eq!(
            plan.decide(Rpc::PullImage, Some("docker.io/library/nginx:1")),
            Some(FaultAction::Fail(CriError::new(CriErrorKind::RegistryUnavailable, "registry down")))
        );
        assert_eq!(
            plan.decide(Rpc::PullImage, Some("docker.io/library/nginx:1")),
            Some(FaultAction::Delay(Duration::from_millis(25)))
        );
        assert_eq!(plan.rules()[2].action(), &FaultAction::Panic);
        assert!(FaultPlan::from_toml("").expect("empty plan").is_empty());

        let err = |text: &str| FaultPlan::from_toml(text).expect_err("rejected");
        assert_eq!(err("[[rule]]\nrpc = \"Pull\"\naction = \"hang\""), "rule 1: rpc: unknown CRI call \"Pull\"");
        assert!(
            err("[[rule]]\nrpc = \"any\"\naction = \"explode\"")
                .starts_with("rule 1: action: unknown action \"explode\"")
        );
        assert_eq!(
            err("[[rule]]\nrpc = \"any\"\naction = \"hang\"\n[[rule]]\nrpc = \"any\"\naction = \"delay\""),
            "rule 2: delay: required for action \"delay\""
        );
        assert!(
            err("[[rule]]\nrpc = \"any\"\naction = \"fail\"\nkind = \"Oops\"")
                .contains("rule 1: kind: unknown error kind")
        );
        assert!(
            err("[[rule]]\nrpc = \"any\"\naction = \"hang\"\nprobability = 2.0")
                .contains("rule 1: probability: 2 is not between 0 and 1")
        );
        assert!(
            err("[[rule]]\nrpc = \"any\"\naction = \"hang\"\ncolour = 1").contains("colour"),
            "unknown fields are refused"
        );
    }
}
