//! A reload of the configuration into a running node (the daemon's SIGHUP,
//! an embedder's own, the simulator's): what may change live is applied,
//! what needs a restart is named. The comparison is with the settings in
//! force ([`Node::settings_in_force`]), so the node keeps the only copy of
//! what runs.

use super::Node;
use crate::config::Config;

/// What a [`Node::reload`] did with a new configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// The live parts it applied (settings named for an operator's log).
    pub applied: Vec<&'static str>,
    /// The changed parts that take effect only after a restart.
    pub needs_restart: Vec<&'static str>,
}

/// What [`Reloaded::needs_restart`] names when a prefetch list is added to
/// a node that started without one.
const PREFETCH_NEEDS_RESTART: &str = "prefetch (images, refresh: imaged started with no list)";

/// The keys of `config/default.toml` that [`Node::reload`] applies live
/// (`prefetch.images` and `.refresh` only on a node started with a list),
/// and `log.filter`, which the daemon applies. A changed key not here keeps
/// its value until a restart.
pub const LIVE_KEYS: &[&str] = &[
    "gc.image_gc_high_threshold_percent",
    "gc.image_gc_low_threshold_percent",
    "gc.image_minimum_gc_age",
    "gc.image_maximum_gc_age",
    "gc.pinned_images",
    "gc.keep_newest_tags_per_repo",
    "pull.registry_pull_qps",
    "pull.registry_burst",
    "pull.throttle_mode",
    "pull.registries",
    "pull.max_parallel_pulls_per_registry",
    "pull.serialize_image_pulls",
    "pull.max_parallel_image_pulls",
    "pull.pull_deadline",
    "pull.transient_retries",
    "pull.transient_retry_delay",
    "pull.slow_pull_warning",
    "pull.stall_warning",
    "pull.stall_timeout",
    "pull.min_download_rate",
    "backoff.initial",
    "backoff.max",
    // Its images are pinned through gc.pinned_images, live.
    "prefetch.keep",
    "prefetch.images",
    "prefetch.refresh",
    "log.filter",
];

impl Reloaded {
    /// Of the configuration keys that changed (dotted, as
    /// [`crate::config::changed_keys`] gives them), those that keep their
    /// old value until a restart, for an operator's log: every key but the
    /// [`LIVE_KEYS`] this reload applied.
    pub fn restart_keys(&self, changed: &[String]) -> Vec<String> {
        let prefetch_live = !self.needs_restart.contains(&PREFETCH_NEEDS_RESTART);
        changed
            .iter()
            .filter(|k| {
                let live = LIVE_KEYS.contains(&k.as_str());
                let list = matches!(k.as_str(), "prefetch.images" | "prefetch.refresh");
                !live || (list && !prefetch_live)
            })
            .cloned()
            .collect()
    }
}

impl Node {
    /// Applies what may change live in `new` — the GC policy, the registry
    /// pull throttle (the node's and each registry's rate), the limits on
    /// pulls at once (serial or parallel, the overall limit, per registry),
    /// the pull deadline and transient retries
    /// (for pulls that start from then on), the slow-pull and stall checks
    /// (their times and floor), the prefetch
    /// list (when the node started with one), `prefetch.keep` (its pins are
    /// in `gc.pinned_images`) and the back-off delays — and
    /// names the other changed sections, which keep their values until a
    /// restart. The log filter is the caller's (it belongs to the process,
    /// not the node). `imaged_config_info` follows whatever was applied.
    ///
    /// Handles compare by identity: an embedder that started the node with
    /// [`Config::with_token_source`] or a plugin runner of its own gives
    /// `new` the same ones, or `credentials` is named as changed.
    pub fn reload(&self, new: &Config) -> Reloaded {
        let mut r = Reloaded::default();
        let was = self.settings_in_force();
        if self.update_gc_policy(&new.gc) {
            r.applied.push("gc (thresholds, ages, pinned_images, keep_newest_tags_per_repo)");
        }
        let throttle = |c: &Config| (c.pull.qps.to_bits(), c.pull.burst, c.pull.throttle_mode);
        if throttle(new) != throttle(&was) || new.pull.registry_rates != was.pull.registry_rates {
            self.update_pull_throttle(
                new.pull.qps,
                new.pull.burst,
                new.pull.throttle_mode,
                new.pull.registry_rates.clone(),
            );
            r.applied.push("pull (registry_pull_qps, registry_burst, throttle_mode, registries' qps and burst)");
        }
        let limits = |c: &Config| (c.pull.registry_limit, c.pull.registry_limits.clone());
        if limits(new) != limits(&was) {
            self.update_registry_limits(new.pull.registry_limit, new.pull.registry_limits.clone());
            r.applied.push("pull (max_parallel_pulls_per_registry, registries' max_parallel)");
        }
        if new.pull.concurrency != was.pull.concurrency {
            self.update_concurrency(new.pull.concurrency);
            r.applied.push("pull (serialize_image_pulls, max_parallel_image_pulls)");
        }
        let times = |c: &Config| (c.pull.pull_deadline, c.pull.retries);
        if times(new) != times(&was) {
            self.update_pull_limits(new.pull.pull_deadline, new.pull.retries);
            r.applied.push("pull (pull_deadline, transient_retries, transient_retry_delay)");
        }
        let watch = |c: &Config| crate::actors::pull_queue::UpdatePullWatch {
            slow_pull_warning: c.pull.slow_pull_warning,
            stall_warning: c.pull.stall_warning,
            stall_timeout: c.pull.stall_timeout,
            min_download_rate: c.pull.min_download_rate,
        };
        if watch(new) != watch(&was) {
            self.update_pull_watch(watch(new));
            r.applied.push("pull (slow_pull_warning, stall_warning, stall_timeout, min_download_rate)");
        }
        let prefetch = |c: &Config| (c.prefetch.images.clone(), c.prefetch.refresh);
        if prefetch(new) != prefetch(&was)
            && self.update_prefetch_list(new.prefetch.images.clone(), new.prefetch.refresh)
        {
            r.applied.push("prefetch (images, refresh)");
        }
        if new.prefetch.keep != was.prefetch.keep {
            // It acts through gc.pinned_images, applied above.
            self.in_force().prefetch.keep = new.prefetch.keep;
            r.applied.push("prefetch (keep)");
        }
        if new.backoff.delays != was.backoff.delays {
            self.update_backoff_delays(new.backoff.delays);
            r.applied.push("backoff (initial, max)");
        }
        // What runs now: anything still different needs a restart.
        let now = self.settings_in_force();
        if new.gc.with_policy_of(&now.gc) != now.gc {
            r.needs_restart.push("gc (periods, sandbox_image, node_status_max_images, eviction_available)");
        }
        for (name, changed) in [
            (
                "runtime",
                new.endpoint != now.endpoint || new.cri != now.cri || new.embedded_state_dir != now.embedded_state_dir,
            ),
            ("pull", new.pull != now.pull || new.ensure != now.ensure),
            ("backoff (gc_interval, mailbox_capacity)", new.backoff != now.backoff),
            ("state", new.state_dir != now.state_dir),
            ("credentials", new.credentials != now.credentials),
            ("credential_verification", new.verification != now.verification),
            ("runtime.fault_plan", new.fault_plan != now.fault_plan),
            ("daemon", new.daemon != now.daemon),
            ("cri_server", new.cri_server != now.cri_server),
            ("log.format", new.log.format != now.log.format),
            // The list's pins are in gc.pinned_images (applied above); the
            // list itself, above, when the node started with one.
            (PREFETCH_NEEDS_RESTART, prefetch(new) != prefetch(&now)),
        ] {
            if changed {
                r.needs_restart.push(name);
            }
        }
        if !r.applied.is_empty() {
            // imaged_config_info shows the settings in force, as GetStatus does.
            self.cfg.pull.metrics.set_config_info(&self.info_labels());
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(k: &[&str]) -> Vec<String> {
        k.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_restart_keys_are_the_changed_ones_a_reload_does_not_apply() {
        let changed = keys(&["gc.gc_period", "gc.image_gc_high_threshold_percent", "log.filter", "prefetch.images"]);
        let applied = Reloaded {
            applied: vec!["gc (thresholds, ages, pinned_images, keep_newest_tags_per_repo)"],
            needs_restart: vec!["gc"],
        };
        assert_eq!(applied.restart_keys(&changed), ["gc.gc_period"]);
        // A list added to a node started without one waits for a restart.
        let no_list = Reloaded { applied: Vec::new(), needs_restart: vec![PREFETCH_NEEDS_RESTART] };
        assert_eq!(no_list.restart_keys(&changed), ["gc.gc_period", "prefetch.images"]);
        assert_eq!(no_list.restart_keys(&keys(&["prefetch.keep"])), Vec::<String>::new(), "its pins are live");
        assert_eq!(applied.restart_keys(&[]), Vec::<String>::new());
    }
}
