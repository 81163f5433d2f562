//! The kubelet's eviction lines for the image filesystem, and the line
//! imaged's pressure check runs GC at so that it frees images before the
//! kubelet's eviction manager evicts pods (`gc.eviction_available`).
//!
//! The kubelet evicts when a filesystem's available space falls below a
//! threshold (`evictionHard` or `evictionSoft`, `imagefs.available` and
//! `nodefs.available`: `"15%"` or a quantity such as `"2Gi"`). Its image GC
//! runs at a usage percent (`imageGCHighThresholdPercent`) that nothing
//! ties to those thresholds: with `imagefs.available<20%` and the default
//! 85 %, the eviction manager acts first, between 80 and 85 %, and evicts
//! pods whose images a GC run would have freed (kubernetes/kubernetes#41032,
//! #129616).

use std::fmt;

use super::policy::GcPolicy;

/// Points of usage between the kubelet's eviction line and the line the
/// pressure check starts a run at: a run started there is under way before
/// the eviction manager (every 10 s) sees the line crossed.
pub const PRESSURE_MARGIN_PERCENT: i64 = 1;

/// An available-space threshold below which the kubelet evicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AvailableThreshold {
    /// A percent of the filesystem's capacity, in hundredths (`15%`: 1500).
    Percent(u32),
    /// Bytes (`2Gi`).
    Bytes(u64),
}

impl AvailableThreshold {
    /// Parses the kubelet's form: a percent (`15%`, `7.5%`) or a resource
    /// quantity (`2Gi`, `500M`, `1073741824`). `Ok(None)`: zero, which the
    /// kubelet reads as no threshold.
    ///
    /// # Errors
    ///
    /// The reason, naming the text.
    pub fn parse(text: &str) -> Result<Option<Self>, String> {
        let t = text.trim();
        if let Some(number) = t.strip_suffix('%') {
            let p: f64 = number
                .parse()
                .ok()
                .filter(|p: &f64| p.is_finite())
                .ok_or_else(|| format!("{text:?} is not a percent (like \"15%\")"))?;
            if !(0.0..=100.0).contains(&p) {
                return Err(format!("{text:?} must be between 0% and 100%"));
            }
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let hundredths = (p * 100.0).round() as u32;
            return Ok((hundredths > 0).then_some(Self::Percent(hundredths)));
        }
        let bytes = quantity_bytes(t)
            .ok_or_else(|| format!("{text:?} is neither a percent (\"15%\") nor a quantity (\"2Gi\", \"500M\")"))?;
        Ok((bytes > 0).then_some(Self::Bytes(bytes)))
    }

    /// The threshold in bytes on a filesystem of `capacity` bytes.
    pub fn bytes(self, capacity: u64) -> u64 {
        match self {
            Self::Percent(h) => {
                let bytes = (u128::from(capacity) * u128::from(h)).div_ceil(10_000);
                u64::try_from(bytes).unwrap_or(u64::MAX)
            }
            Self::Bytes(b) => b,
        }
    }
}

impl fmt::Display for AvailableThreshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Percent(h) if h % 100 == 0 => write!(f, "{}%", h / 100),
            Self::Percent(h) => write!(f, "{}%", f64::from(*h) / 100.0),
            Self::Bytes(b) => write!(f, "{b}"),
        }
    }
}

/// A resource quantity in bytes: digits with an optional fraction, then an
/// optional binary (`Ki` … `Ei`) or decimal (`k` … `E`) suffix. `None` for
/// anything else (negative, an exponent, milli-units, overflow).
fn quantity_bytes(t: &str) -> Option<u64> {
    const SUFFIXES: [(&str, u128); 12] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    let (number, scale) = SUFFIXES.iter().find_map(|(s, m)| t.strip_suffix(s).map(|n| (n, *m))).unwrap_or((t, 1));
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if frac.len() > 18 {
        return None;
    }
    let whole: u128 = whole.parse().ok()?;
    let frac_value: u128 = if frac.is_empty() { 0 } else { frac.parse().ok()? };
    let frac_scale = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
    // Rounded up, as the kubelet's quantities are.
    let bytes = whole.checked_mul(scale)? + (frac_value.checked_mul(scale)?).div_ceil(frac_scale);
    u64::try_from(bytes).ok()
}

/// The usage percent (whole, as GC's) past which the first of `lines` is
/// crossed on a filesystem of `capacity` bytes: the kubelet evicts when
/// available < threshold, that is usage above `100 − threshold %`. `None`
/// without lines or capacity.
pub fn eviction_usage_percent(lines: &[AvailableThreshold], capacity: u64) -> Option<i64> {
    if capacity == 0 {
        return None;
    }
    lines
        .iter()
        .map(|t| {
            #[allow(clippy::cast_precision_loss)]
            let pct = t.bytes(capacity).min(capacity) as f64 * 100.0 / capacity as f64;
            #[allow(clippy::cast_possible_truncation)]
            let line = (100.0 - pct).floor() as i64;
            line
        })
        .min()
}

/// The thresholds a pressure check's run uses on a filesystem of
/// `capacity` bytes: `policy`'s, or, when the kubelet's first eviction line
/// comes at or below the high threshold, both thresholds moved down so the
/// high one sits [`PRESSURE_MARGIN_PERCENT`] below that line (the run then
/// frees as far below it as the policy's band). `None`: the policy's own.
pub fn pressure_policy(policy: &GcPolicy, lines: &[AvailableThreshold], capacity: u64) -> Option<GcPolicy> {
    let line = eviction_usage_percent(lines, capacity)?;
    let high = (line - PRESSURE_MARGIN_PERCENT).max(0);
    if high >= policy.high_threshold_percent {
        return None;
    }
    let down = policy.high_threshold_percent - high;
    Some(GcPolicy {
        high_threshold_percent: high,
        low_threshold_percent: (policy.low_threshold_percent - down).max(0),
        ..policy.clone()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn thresholds_parse_as_the_kubelet_writes_them_and_zero_is_none() {
        let p = |t| AvailableThreshold::parse(t);
        assert_eq!(p("15%"), Ok(Some(AvailableThreshold::Percent(1500))));
        assert_eq!(p(" 7.5% "), Ok(Some(AvailableThreshold::Percent(750))));
        assert_eq!(p("2Gi"), Ok(Some(AvailableThreshold::Bytes(2 * GIB))));
        assert_eq!(p("1.5Gi"), Ok(Some(AvailableThreshold::Bytes(3 * GIB / 2))));
        assert_eq!(p("500M"), Ok(Some(AvailableThreshold::Bytes(500_000_000))));
        assert_eq!(p("100k"), Ok(Some(AvailableThreshold::Bytes(100_000))));
        assert_eq!(p("1073741824"), Ok(Some(AvailableThreshold::Bytes(GIB))));
        assert_eq!(p("0%"), Ok(None));
        assert_eq!(p("15%").unwrap().unwrap().to_string(), "15%");
        assert_eq!(p("7.5%").unwrap().unwrap().to_string(), "7.5%");
        assert_eq!(p("0"), Ok(None));
        for bad in ["", "%", "-5%", "150%", "abc", "2GB", "-1Gi", "1e3", "100m", "1.2.3", "99999999999999Ei"] {
            let err = p(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }

    #[test]
    fn the_eviction_line_is_the_first_threshold_crossed_at_this_capacity() {
        let lines = [AvailableThreshold::Percent(1500), AvailableThreshold::Percent(1000)];
        assert_eq!(eviction_usage_percent(&lines, 100 * GIB), Some(85));
        // 20 GiB available of 100: the quantity comes first.
        let lines = [AvailableThreshold::Percent(1500), AvailableThreshold::Bytes(20 * GIB)];
        assert_eq!(eviction_usage_percent(&lines, 100 * GIB), Some(80));
        // On a disk ten times larger the percent does.
        assert_eq!(eviction_usage_percent(&lines, 1000 * GIB), Some(85));
        assert_eq!(eviction_usage_percent(&lines, 0), None);
        assert_eq!(eviction_usage_percent(&[], 100 * GIB), None);
        // A threshold larger than the disk: every usage is past it.
        assert_eq!(eviction_usage_percent(&[AvailableThreshold::Bytes(200 * GIB)], 100 * GIB), Some(0));
    }

    #[test]
    fn a_pressure_run_starts_a_point_before_the_eviction_line_keeping_the_policys_band() {
        let policy = GcPolicy { high_threshold_percent: 85, low_threshold_percent: 80, ..GcPolicy::default() };
        // The kubelet's default (imagefs.available<15%): the line is the
        // high threshold, so the run starts a point before it.
        let run = pressure_policy(&policy, &[AvailableThreshold::Percent(1500)], 100 * GIB).unwrap();
        assert_eq!((run.high_threshold_percent, run.low_threshold_percent), (84, 79));
        assert_eq!(run.min_age, policy.min_age, "only the thresholds move");
        let run = pressure_policy(&policy, &[AvailableThreshold::Percent(2000)], 100 * GIB).unwrap();
        assert_eq!((run.high_threshold_percent, run.low_threshold_percent), (79, 74));
        // An eviction line well above the high threshold: the policy's own.
        assert_eq!(pressure_policy(&policy, &[AvailableThreshold::Percent(1000)], 100 * GIB), None);
        assert_eq!(pressure_policy(&policy, &[], 100 * GIB), None);
        // Never below zero.
        let run = pressure_policy(&policy, &[AvailableThreshold::Percent(10000)], 100 * GIB).unwrap();
        assert_eq!((run.high_threshold_percent, run.low_threshold_percent), (0, 0));
    }
}
