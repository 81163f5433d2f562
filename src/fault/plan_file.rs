//! A [`FaultPlan`]'s TOML form, the file `runtime.fault_plan` names.

use super::{FaultPlan, FaultRule};
use crate::cri::{CriError, CriErrorKind, Rpc};

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

impl FaultPlan {
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
    /// delay = "2s"                  # delay: how long (a Go duration)
    /// ```
    ///
    /// Errors name the rule (1-based) and the field.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        let raw: RawPlan = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .and_then(config::Config::try_deserialize)
            .map_err(|e| e.to_string())?;
        let mut plan = FaultPlan::new(raw.seed);
        for (i, r) in raw.rule.into_iter().enumerate() {
            plan = plan.rule(r.into_rule(i + 1)?);
        }
        Ok(plan)
    }
}

impl RawRule {
    /// The rule, or why not: `rule N: FIELD: reason` (`number` is 1-based).
    fn into_rule(self, number: usize) -> Result<FaultRule, String> {
        let at = |field: &str, why: String| format!("rule {number}: {field}: {why}");
        let mut rule = if self.rpc.eq_ignore_ascii_case("any") {
            FaultRule::any()
        } else {
            FaultRule::on(self.rpc.parse::<Rpc>().map_err(|e| at("rpc", e))?)
        };
        if let Some(g) = &self.image {
            rule = rule.image(g);
        }
        if let Some(n) = self.after {
            rule = rule.after(n);
        }
        if let Some(n) = self.times {
            rule = rule.times(n);
        }
        if let Some(p) = self.probability {
            if !(0.0..=1.0).contains(&p) {
                return Err(at("probability", format!("{p} is not between 0 and 1")));
            }
            rule = rule.probability(p);
        }
        self.with_action(rule, at)
    }

    /// `rule` with the action this entry names (and its fields).
    fn with_action(&self, rule: FaultRule, at: impl Fn(&str, String) -> String) -> Result<FaultRule, String> {
        Ok(match self.action.as_str() {
            "fail" => {
                let kind = match &self.kind {
                    None => CriErrorKind::Other,
                    Some(k) => CriErrorKind::ALL
                        .into_iter()
                        .find(|x| format!("{x:?}").eq_ignore_ascii_case(k))
                        .ok_or_else(|| at("kind", format!("unknown error kind {k:?}")))?,
                };
                rule.fail(CriError::new(kind, self.message.clone().unwrap_or_else(|| "fault injected".into())))
            }
            "delay" => {
                let d = self.delay.as_deref().ok_or_else(|| at("delay", "required for action \"delay\"".into()))?;
                // Go's duration grammar, as every duration imaged reads.
                rule.delay(
                    crate::kubelet_config::parse_go_duration(d.trim())
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
        })
    }
}
