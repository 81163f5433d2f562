//! `[gc]`: the kubelet's image GC fields and imaged's own, validated with
//! the kubelet's rules and texts.

use std::time::Duration;

use super::ConfigError;
use super::raw::RawGc;
use super::values::{duration, invalid, mailbox_capacity, zero_is_off};
use crate::gc::eviction::AvailableThreshold;
use crate::metrics::Metrics;

/// Image garbage collection settings (validated with the kubelet's rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcSettings {
    /// `image_gc_high_threshold_percent` (0-100).
    pub high_threshold_percent: i64,
    /// `image_gc_low_threshold_percent` (0-100, below high).
    pub low_threshold_percent: i64,
    /// `image_minimum_gc_age`.
    pub min_age: Duration,
    /// `image_maximum_gc_age` (zero = off).
    pub max_age: Duration,
    /// With durable records, the max-age pass counts from the GC loop's
    /// first start on the state (kept in it), not from this start (false:
    /// the kubelet, which waits max age again after every restart).
    pub max_age_survives_restarts: bool,
    /// Detector period.
    pub detect_period: Duration,
    /// GC period.
    pub gc_period: Duration,
    /// How often the image filesystem is measured between runs, a run
    /// starting when it is at or above the high threshold (`None`: off).
    pub pressure_check_period: Option<Duration>,
    /// The kubelet's eviction thresholds for the image filesystem
    /// (`gc.eviction_available`): the pressure check's run starts before
    /// the first of them (see [`crate::gc::eviction`]).
    pub eviction_available: Vec<AvailableThreshold>,
    /// Node-status image list refresh period.
    pub cache_refresh_period: Duration,
    /// Images in node status (`None` = all).
    pub node_status_max_images: Option<usize>,
    /// The sandbox image (protected by its resolved id); empty = none.
    pub sandbox_image: String,
    /// Patterns of images GC never removes.
    pub pinned_images: Vec<String>,
    /// Keep at most this many unused tags per repository (`None` = off).
    pub keep_newest_tags_per_repo: Option<usize>,
    /// The image filesystem's size in bytes when the runtime's mountpoint is
    /// not on this host (`gc.image_fs_capacity`; `None` = unknown: GC then
    /// fails naming the key). A mountpoint on this host is always measured.
    pub image_fs_capacity: Option<u64>,
    /// The detector's mailbox capacity.
    pub detector_mailbox_capacity: usize,
    /// The GC executor's mailbox capacity.
    pub executor_mailbox_capacity: usize,
    /// The cache refresher's mailbox capacity.
    pub refresher_mailbox_capacity: usize,
    /// Where the GC executor reports removals, bytes freed and runs.
    pub metrics: Metrics,
}

impl GcSettings {
    /// These settings with `other`'s live-changeable part (thresholds, min
    /// and max age, pinned images, retention rule): what a SIGHUP applies.
    pub fn with_policy_of(&self, other: &GcSettings) -> GcSettings {
        GcSettings {
            high_threshold_percent: other.high_threshold_percent,
            low_threshold_percent: other.low_threshold_percent,
            min_age: other.min_age,
            max_age: other.max_age,
            pinned_images: other.pinned_images.clone(),
            keep_newest_tags_per_repo: other.keep_newest_tags_per_repo,
            ..self.clone()
        }
    }

    /// GC is off entirely (the kubelet: high threshold 100 and no max age).
    pub fn disabled(&self) -> bool {
        self.policy().is_disabled()
    }

    /// The thresholds and ages as a GC policy.
    pub fn policy(&self) -> crate::gc::policy::GcPolicy {
        crate::gc::policy::GcPolicy {
            high_threshold_percent: self.high_threshold_percent,
            low_threshold_percent: self.low_threshold_percent,
            min_age: self.min_age,
            max_age: self.max_age,
        }
    }

    /// The protection rules (the sandbox image id is resolved at each detection).
    pub fn rules(&self) -> crate::gc::policy::ProtectionRules {
        crate::gc::policy::ProtectionRules {
            pinned_images: self.pinned_images.clone(),
            sandbox_image_id: None,
            keep_newest_tags_per_repo: self.keep_newest_tags_per_repo,
        }
    }
}

/// The kubelet's image GC validation (its texts), plus imaged's own keys.
pub(super) fn gc_from_raw(g: RawGc) -> Result<GcSettings, ConfigError> {
    let (high, low) = (g.image_gc_high_threshold_percent, g.image_gc_low_threshold_percent);
    let min_age = duration("gc.image_minimum_gc_age", &g.image_minimum_gc_age)?;
    let max_age = duration("gc.image_maximum_gc_age", &g.image_maximum_gc_age)?;
    // The kubelet's texts live in `GcPolicy::validate`; name the key here.
    let policy =
        crate::gc::policy::GcPolicy { high_threshold_percent: high, low_threshold_percent: low, min_age, max_age };
    if let Err(errors) = policy.validate() {
        let first = errors.into_iter().next().unwrap_or_default();
        // A rule between two keys names the other one too: either may be
        // the one the operator set (`high = 50` breaks the default low 80).
        let (key, value, reason) = if first.contains("imageMaximumGCAge") {
            let other = format!("{first} (gc.image_minimum_gc_age is {:?})", g.image_minimum_gc_age);
            ("gc.image_maximum_gc_age", g.image_maximum_gc_age.clone(), other)
        } else if first.contains("must be less than imageGCHighThresholdPercent") {
            let other = format!("{first} (gc.image_gc_high_threshold_percent is {high})");
            ("gc.image_gc_low_threshold_percent", low.to_string(), other)
        } else if first.starts_with("invalid configuration: imageGCLowThresholdPercent") {
            ("gc.image_gc_low_threshold_percent", low.to_string(), first)
        } else {
            ("gc.image_gc_high_threshold_percent", high.to_string(), first)
        };
        return Err(invalid(key, &value, reason));
    }
    let period = |key: &str, v: &str| -> Result<Duration, ConfigError> {
        let d = duration(key, v)?;
        if d.is_zero() {
            return Err(invalid(key, v, "must be more than 0s"));
        }
        Ok(d)
    };
    let node_status_max_images = match g.node_status_max_images {
        -1 => None,
        n if n < -1 => {
            return Err(invalid(
                "gc.node_status_max_images",
                &n.to_string(),
                format!(
                    "invalid configuration: nodeStatusMaxImages (--node-status-max-images) {n} must be -1 or greater"
                ),
            ));
        }
        n => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let mut eviction_available = Vec::new();
    for t in &g.eviction_available {
        match AvailableThreshold::parse(t) {
            Ok(Some(t)) => eviction_available.push(t),
            Ok(None) => {}
            Err(reason) => return Err(invalid("gc.eviction_available", t, &reason)),
        }
    }
    for p in &g.pinned_images {
        if p.trim().is_empty() || p.contains(char::is_whitespace) {
            return Err(invalid(
                "gc.pinned_images",
                p,
                "a pattern is a reference, \"repo:*\" or \"prefix/*\", without spaces",
            ));
        }
    }
    let keep = zero_is_off("gc.keep_newest_tags_per_repo", g.keep_newest_tags_per_repo, "off")?;
    let image_fs_capacity = match u64::try_from(g.image_fs_capacity) {
        Ok(0) => None,
        Ok(n) => Some(n),
        Err(_) => {
            return Err(invalid(
                "gc.image_fs_capacity",
                &g.image_fs_capacity.to_string(),
                "must be 0 (unknown) or a size in bytes",
            ));
        }
    };
    Ok(GcSettings {
        high_threshold_percent: high,
        low_threshold_percent: low,
        min_age,
        max_age,
        max_age_survives_restarts: g.max_age_survives_restarts,
        detect_period: period("gc.detect_period", &g.detect_period)?,
        gc_period: period("gc.gc_period", &g.gc_period)?,
        pressure_check_period: {
            let every = duration("gc.pressure_check_period", &g.pressure_check_period)?;
            (!every.is_zero()).then_some(every)
        },
        eviction_available,
        cache_refresh_period: period("gc.cache_refresh_period", &g.cache_refresh_period)?,
        node_status_max_images,
        sandbox_image: g.sandbox_image,
        pinned_images: g.pinned_images,
        keep_newest_tags_per_repo: keep,
        image_fs_capacity,
        detector_mailbox_capacity: mailbox_capacity("gc.detector_mailbox_capacity", g.detector_mailbox_capacity)?,
        executor_mailbox_capacity: mailbox_capacity("gc.executor_mailbox_capacity", g.executor_mailbox_capacity)?,
        refresher_mailbox_capacity: mailbox_capacity("gc.refresher_mailbox_capacity", g.refresher_mailbox_capacity)?,
        metrics: Metrics::default(),
    })
}
