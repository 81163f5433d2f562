//! `[pull]` and `[backoff]`: the kubelet's pull fields (validation and
//! defaulting, its texts) and imaged's own, for the pull queue, the ensure
//! flow and the backoff registry.

use super::ConfigError;
use std::collections::HashMap;

use super::raw::{RawBackoff, RawPull, RawRegistryRule};
use super::values::{duration, invalid, mailbox_capacity, zero_is_off};
use crate::actors::backoff_registry::{BackoffDelays, BackoffSettings};
use crate::actors::pull_queue::{Concurrency, PullQueueSettings, RegistryRate, Retries, SizeOffers, ThrottleMode};
use crate::ensure::EnsureSettings;
use crate::metrics::Metrics;

/// The kubelet's validation and defaulting of the image pull fields.
pub(super) fn pull_from_raw(p: RawPull) -> Result<(PullQueueSettings, EnsureSettings), ConfigError> {
    let serialize = kubelet_pull_mode(&p)?;
    let registry_limit = zero_is_off(
        "pull.max_parallel_pulls_per_registry",
        p.max_parallel_pulls_per_registry,
        "no per-registry limit",
    )?;
    if let Some(n) = registry_limit
        && serialize
        && n > 1
    {
        return Err(invalid(
            "pull.max_parallel_pulls_per_registry",
            &n.to_string(),
            "cannot be larger than 1 while pulls are serial (pull.serialize_image_pulls)",
        ));
    }
    let presence_check_concurrency =
        zero_is_off("pull.presence_check_concurrency", p.presence_check_concurrency, "no limit")?;
    let presence_check_window = zero_is_off("pull.presence_check_window", p.presence_check_window, "no window")?;
    let concurrency = if serialize {
        Concurrency::Serial
    } else {
        Concurrency::Parallel(p.max_parallel_image_pulls.and_then(|n| usize::try_from(n).ok()))
    };
    let capacity = zero_is_off("pull.queue_capacity", p.queue_capacity, "unbounded")?;
    let throttle_mode = match p.throttle_mode.as_str() {
        "fail" => ThrottleMode::Fail,
        "wait" => ThrottleMode::Wait,
        other => return Err(invalid("pull.throttle_mode", other, "must be \"fail\" or \"wait\"")),
    };
    let burst = u32::try_from(p.registry_burst)
        .map_err(|_| invalid("pull.registry_burst", &p.registry_burst.to_string(), "must be at most 4294967295"))?;
    let (registry_rates, registry_limits) = registry_rules(&p.registries, serialize)?;
    let times = u32::try_from(p.transient_retries).ok().filter(|n| *n <= MAX_TRANSIENT_RETRIES).ok_or_else(|| {
        invalid(
            "pull.transient_retries",
            &p.transient_retries.to_string(),
            format!("must be between 0 and {MAX_TRANSIENT_RETRIES}"),
        )
    })?;
    let retries = Retries { times, delay: duration("pull.transient_retry_delay", &p.transient_retry_delay)? };
    if retries.times > 0 && retries.delay.is_zero() {
        return Err(invalid(
            "pull.transient_retry_delay",
            &p.transient_retry_delay,
            "must be more than 0s while pull.transient_retries is set (retries at once would hammer the registry)",
        ));
    }
    let deadline = duration("pull.pull_deadline", &p.pull_deadline)?;
    let slow = duration("pull.slow_pull_warning", &p.slow_pull_warning)?;
    let stall = duration("pull.stall_warning", &p.stall_warning)?;
    let stall_timeout = duration("pull.stall_timeout", &p.stall_timeout)?;
    let min_download_rate = download_rate(&p.min_download_rate, stall.is_zero() && stall_timeout.is_zero())?;
    Ok((
        PullQueueSettings {
            concurrency,
            registry_limit,
            capacity,
            single_flight: p.single_flight,
            qps: p.registry_pull_qps,
            // The kubelet's v1beta1 defaulting turns a zero burst into 10.
            burst: if burst == 0 { 10 } else { burst },
            throttle_mode,
            registry_rates,
            registry_limits,
            retries,
            pull_deadline: if deadline.is_zero() { None } else { Some(deadline) },
            slow_pull_warning: if slow.is_zero() { None } else { Some(slow) },
            stall_warning: if stall.is_zero() { None } else { Some(stall) },
            stall_timeout: if stall_timeout.is_zero() { None } else { Some(stall_timeout) },
            min_download_rate,
            metrics: Metrics::default(),
            size_offers: SizeOffers::default(),
            records_due: crate::actors::pull_queue::RecordsDue::default(),
        },
        EnsureSettings {
            annotate_error_class: p.annotate_error_class,
            presence_check_concurrency,
            presence_check_window,
            ..EnsureSettings::default()
        },
    ))
}

/// `pull.min_download_rate`: a quantity of bytes (a second), such as
/// `"100Ki"`; it needs a stall time to be measured over.
fn download_rate(v: &str, no_stall_time: bool) -> Result<u64, ConfigError> {
    let key = "pull.min_download_rate";
    let rate = crate::gc::eviction::quantity_bytes(v.trim()).ok_or_else(|| {
        invalid(key, v, "must be a quantity of bytes a second, such as \"100Ki\" or \"1M\" (\"0\" = no floor)")
    })?;
    if rate > 0 && no_stall_time {
        return Err(invalid(
            key,
            v,
            "is measured over pull.stall_warning and pull.stall_timeout, and both are \"0s\" (set one, or the rate to \"0\")",
        ));
    }
    Ok(rate)
}

/// The most `pull.transient_retries`: with the delay doubling, ten from
/// one second already wait 17 minutes in all.
const MAX_TRANSIENT_RETRIES: u32 = 10;

/// `[[pull.registries]]`: each registry's own rate (those with one) and
/// its own limit on pulls at once (those with one).
fn registry_rules(
    rules: &[RawRegistryRule],
    serialize: bool,
) -> Result<(Vec<RegistryRate>, HashMap<String, usize>), ConfigError> {
    let mut rates = Vec::new();
    let mut limits = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    for (i, r) in rules.iter().enumerate() {
        let key = |field: &str| format!("pull.registries[{i}].{field}");
        let registry = r.registry.trim();
        if registry.contains('@') {
            // user:token@host: not shown.
            return Err(invalid(
                &key("registry"),
                "…",
                "must be a registry host without credentials (they belong in [credentials])",
            ));
        }
        if registry.is_empty() || registry.contains(char::is_whitespace) || registry.contains('/') {
            return Err(invalid(
                &key("registry"),
                &r.registry,
                "must be a registry host as an image names it (\"docker.io\", \"registry.example.com:5000\"), \
                 without a scheme or path",
            ));
        }
        if matches!(registry, "index.docker.io" | "registry-1.docker.io") {
            return Err(invalid(&key("registry"), registry, "imaged names Docker Hub \"docker.io\": write that"));
        }
        if !seen.insert(registry.to_string()) {
            return Err(invalid(&key("registry"), registry, "is named by an earlier rule: one rule per registry"));
        }
        if !r.qps.is_finite() || r.qps < 0.0 {
            return Err(invalid(&key("qps"), &r.qps.to_string(), "must be a finite number, 0 or more"));
        }
        let burst = u32::try_from(r.burst)
            .map_err(|_| invalid(&key("burst"), &r.burst.to_string(), "must be between 0 and 4294967295"))?;
        let max_parallel = usize::try_from(r.max_parallel)
            .map_err(|_| invalid(&key("max_parallel"), &r.max_parallel.to_string(), "must be 0 or more"))?;
        if serialize && max_parallel > 1 {
            return Err(invalid(
                &key("max_parallel"),
                &max_parallel.to_string(),
                "cannot be larger than 1 while pulls are serial (pull.serialize_image_pulls)",
            ));
        }
        if r.qps > 0.0 {
            rates.push(RegistryRate { registry: registry.to_string(), qps: r.qps, burst: burst.max(1) });
        }
        if max_parallel > 0 {
            limits.insert(registry.to_string(), max_parallel);
        }
    }
    Ok((rates, limits))
}

pub(super) fn backoff_from_raw(b: RawBackoff) -> Result<BackoffSettings, ConfigError> {
    let initial = duration("backoff.initial", &b.initial)?;
    let max = duration("backoff.max", &b.max)?;
    let delays = BackoffDelays::try_new(initial, max)
        .map_err(|e| invalid("backoff.initial/backoff.max", &format!("{}/{}", b.initial, b.max), e.to_string()))?;
    let gc = duration("backoff.gc_interval", &b.gc_interval)?;
    let mailbox_capacity = mailbox_capacity("backoff.mailbox_capacity", b.mailbox_capacity)?;
    Ok(BackoffSettings {
        delays,
        gc_interval: if gc.is_zero() { None } else { Some(gc) },
        mailbox_capacity,
        metrics: Metrics::default(),
    })
}

/// The kubelet's checks of `registryPullQPS`, `registryBurst`,
/// `maxParallelImagePulls` and `serializeImagePulls` (its texts), and its
/// defaulting: whether pulls are serial.
fn kubelet_pull_mode(p: &RawPull) -> Result<bool, ConfigError> {
    if !p.registry_pull_qps.is_finite() {
        // NaN and infinities are neither negative nor a rate: the kubelet's
        // "must not be a negative number" would mislead.
        let v = p.registry_pull_qps.to_string();
        return Err(invalid(
            "pull.registry_pull_qps",
            &v,
            format!("invalid configuration: registryPullQPS (--registry-qps) {v} must be a finite number"),
        ));
    }
    if p.registry_pull_qps < 0.0 {
        let v = p.registry_pull_qps.to_string();
        return Err(invalid(
            "pull.registry_pull_qps",
            &v,
            format!("invalid configuration: registryPullQPS (--registry-qps) {v} must not be a negative number"),
        ));
    }
    if p.registry_burst < 0 {
        let v = p.registry_burst.to_string();
        return Err(invalid(
            "pull.registry_burst",
            &v,
            format!("invalid configuration: registryBurst (--registry-burst) {v} must not be a negative number"),
        ));
    }
    if let Some(n) = p.max_parallel_image_pulls
        && n < 1
    {
        return Err(invalid(
            "pull.max_parallel_image_pulls",
            &n.to_string(),
            format!("invalid configuration: maxParallelImagePulls {n} must be a positive number"),
        ));
    }
    // Defaulting: serial unless at least two parallel pulls are asked for.
    let serialize = p.serialize_image_pulls.unwrap_or(p.max_parallel_image_pulls.is_none_or(|n| n < 2));
    if serialize && p.max_parallel_image_pulls.is_some_and(|n| n > 1) {
        let n = p.max_parallel_image_pulls.unwrap_or_default().to_string();
        return Err(invalid(
            "pull.max_parallel_image_pulls",
            &n,
            "invalid configuration: maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls (--serialize-image-pulls) is set to false",
        ));
    }
    Ok(serialize)
}
