//! The kubelet's eviction lines for the image filesystem, and the line
//! imaged's pressure check runs GC at so that it frees images before the
//! kubelet's eviction manager evicts pods (`gc.eviction_available`).
//!
//! The kubelet evicts when a filesystem's available space falls below a
//! threshold (`evictionHard` or `evictionSoft`, `imagefs.available` and
//! `nodefs.available`: `"15%"` or a quantity such as `"2Gi"`). Its image GC
//! runs at a usage percent (`imageGCHighThresholdPercent`) that nothing
//! ties to those thresholds: with `imagefs.available<20%` and the default
//! 85 %, the eviction manager acts first, from 81 % on, and evicts
//! pods whose images a GC run would have freed (kubernetes/kubernetes#41032,
//! #129616).

use std::fmt;

use super::policy::GcPolicy;

/// Points of usage between the first usage at which the kubelet may evict
/// and the high threshold of a pressure check's run: the last usage before
/// it, where the kubelet's own defaults put its GC (85 against 15 % free).
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
    /// quantity (`2Gi`, `500M`, `1e9`, `1073741824`). `Ok(None)`: `0%` or
    /// `100%`, which the kubelet ignores.
    ///
    /// # Errors
    ///
    /// The reason, naming the text: not a percent or quantity, a percent
    /// outside 0–100, a quantity that is not positive (the kubelet's
    /// "must be positive") or does not fit in 64 bits.
    pub fn parse(text: &str) -> Result<Option<Self>, String> {
        let t = text.trim();
        if let Some(number) = t.strip_suffix('%') {
            if number == "0" || number == "100" {
                return Ok(None);
            }
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
            // Only the two texts above are ignored: the kubelet keeps
            // `100.0%` (always under the line: no room for GC's band, see
            // `pressure_policy`) and `0.0%` (never) as written.
            return Ok(Some(Self::Percent(hundredths)));
        }
        if t.starts_with('-') {
            return Err(format!("{text:?} must be positive"));
        }
        let bytes = quantity_bytes(t.strip_prefix('+').unwrap_or(t)).ok_or_else(|| {
            format!("{text:?} is neither a percent (\"15%\") nor a quantity (\"2Gi\", \"500M\", \"1e9\")")
        })?;
        if bytes == 0 {
            return Err(format!("{text:?} must be positive"));
        }
        Ok(Some(Self::Bytes(bytes)))
    }

    /// The threshold in bytes on a filesystem of `capacity` bytes.
    pub fn bytes(self, capacity: u64) -> u64 {
        match self {
            // The kubelet's `capacity × percent`, truncated.
            Self::Percent(h) => u64::try_from(u128::from(capacity) * u128::from(h) / 10_000).unwrap_or(u64::MAX),
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
/// optional binary (`Ki` … `Ei`), decimal (`m`, `k` … `E`) or exponent
/// (`e9`, `E9`, `e-3`) suffix; rounded up to a whole byte, as the kubelet's
/// `Value()`. `None` for anything else or past 64 bits.
pub(crate) fn quantity_bytes(t: &str) -> Option<u64> {
    // (suffix, numerator, denominator)
    const SUFFIXES: [(&str, u128, u128); 13] = [
        ("Ki", 1 << 10, 1),
        ("Mi", 1 << 20, 1),
        ("Gi", 1 << 30, 1),
        ("Ti", 1 << 40, 1),
        ("Pi", 1 << 50, 1),
        ("Ei", 1 << 60, 1),
        ("m", 1, 1_000),
        ("k", 1_000, 1),
        ("M", 1_000_000, 1),
        ("G", 1_000_000_000, 1),
        ("T", 1_000_000_000_000, 1),
        ("P", 1_000_000_000_000_000, 1),
        ("E", 1_000_000_000_000_000_000, 1),
    ];
    let exponent = t.find(['e', 'E']).and_then(|at| {
        let (number, exp) = (&t[..at], &t[at + 1..]);
        // `1e-3` is a thousandth of a byte, rounded up to one.
        let (negative, exp) = match exp.strip_prefix('-') {
            Some(e) => (true, e),
            None => (false, exp.strip_prefix('+').unwrap_or(exp)),
        };
        let exp: u32 = exp.parse().ok()?;
        if negative {
            // A divisor past u128 (10^39 and up) is larger than any amount
            // written here: the result rounds up to one byte (the
            // kubelet's `Value()` of `1e-19`), and 0 stays 0.
            return Some((number, 1, 10u128.checked_pow(exp).unwrap_or(u128::MAX)));
        }
        Some((number, 10u128.checked_pow(exp).filter(|_| exp <= 18)?, 1))
    });
    let (number, num, den) = exponent
        .or_else(|| SUFFIXES.iter().find_map(|(s, n, d)| t.strip_suffix(s).map(|rest| (rest, *n, *d))))
        .unwrap_or((t, 1, 1));
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(frac) || whole.len() > 20 || frac.len() > 18 {
        return None;
    }
    let whole: u128 = whole.parse().ok()?;
    let frac_value: u128 = if frac.is_empty() { 0 } else { frac.parse().ok()? };
    let frac_scale = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
    // (whole + frac / frac_scale) × num / den, rounded up.
    let numerator = whole.checked_mul(frac_scale)?.checked_add(frac_value)?.checked_mul(num)?;
    let bytes = match frac_scale.checked_mul(den) {
        Some(d) => numerator.div_ceil(d),
        // A divisor past u128: the amount is below a byte.
        None => u128::from(numerator > 0),
    };
    u64::try_from(bytes).ok()
}

/// The lowest usage percent, as GC measures it
/// ([`crate::gc::plan::usage_percent`]: `100 − ⌊available × 100 ÷
/// capacity⌋`), at which the first of `lines` may be crossed on a
/// filesystem of `capacity` bytes: the kubelet evicts when available <
/// threshold. With `imagefs.available<15%` that is 86: the kubelet's
/// default high threshold, 85, is the last usage before it. `None` without
/// lines or capacity.
pub fn eviction_usage_percent(lines: &[AvailableThreshold], capacity: u64) -> Option<i64> {
    if capacity == 0 {
        return None;
    }
    lines
        .iter()
        .map(|t| {
            // Available below the threshold ⇔ ⌊available × 100 ÷ capacity⌋
            // below ⌈threshold × 100 ÷ capacity⌉.
            let pct = (u128::from(t.bytes(capacity)) * 100).div_ceil(u128::from(capacity));
            101 - i64::try_from(pct).unwrap_or(i64::MAX).min(101)
        })
        .min()
}

/// The thresholds a pressure check's run uses on a filesystem of
/// `capacity` bytes: `policy`'s, or, when the kubelet's first eviction line
/// comes at or below the high threshold, both moved down so the high one is
/// the last usage before that line (as the kubelet's defaults stand, 85
/// against 15 % free) and the run frees as far below it as the policy's
/// band. `None`: the policy's own — also when usage GC is off (a high
/// threshold of 100) or the line leaves no room (a threshold as large as
/// the disk).
pub fn pressure_policy(policy: &GcPolicy, lines: &[AvailableThreshold], capacity: u64) -> Option<GcPolicy> {
    if policy.high_threshold_percent >= 100 {
        return None;
    }
    let line = eviction_usage_percent(lines, capacity)?;
    let high = line - PRESSURE_MARGIN_PERCENT;
    if high >= policy.high_threshold_percent || high < 1 {
        return None;
    }
    let down = policy.high_threshold_percent - high;
    let low = (policy.low_threshold_percent - down).clamp(0, high - 1);
    Some(GcPolicy { high_threshold_percent: high, low_threshold_percent: low, ..policy.clone() })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn thresholds_parse_as_the_kubelet_writes_them() {
        let p = |t| AvailableThreshold::parse(t);
        assert_eq!(p("15%"), Ok(Some(AvailableThreshold::Percent(1500))));
        assert_eq!(p(" 7.5% "), Ok(Some(AvailableThreshold::Percent(750))));
        assert_eq!(p("2Gi"), Ok(Some(AvailableThreshold::Bytes(2 * GIB))));
        assert_eq!(p("+2Gi"), Ok(Some(AvailableThreshold::Bytes(2 * GIB))));
        assert_eq!(p("1.5Gi"), Ok(Some(AvailableThreshold::Bytes(3 * GIB / 2))));
        assert_eq!(p("500M"), Ok(Some(AvailableThreshold::Bytes(500_000_000))));
        assert_eq!(p("100k"), Ok(Some(AvailableThreshold::Bytes(100_000))));
        assert_eq!(p("1e9"), Ok(Some(AvailableThreshold::Bytes(1_000_000_000))));
        assert_eq!(p("1.5E3"), Ok(Some(AvailableThreshold::Bytes(1_500))));
        assert_eq!(p("2E"), Ok(Some(AvailableThreshold::Bytes(2_000_000_000_000_000_000))));
        assert_eq!(p("1500m"), Ok(Some(AvailableThreshold::Bytes(2))), "rounded up to a byte");
        assert_eq!(p("1073741824"), Ok(Some(AvailableThreshold::Bytes(GIB))));
        // The kubelet ignores 0% and 100%.
        assert_eq!(p("0%"), Ok(None));
        assert_eq!(p("100%"), Ok(None));
        // Only those two texts: other spellings are kept, as the kubelet keeps them.
        assert_eq!(p("100.0%"), Ok(Some(AvailableThreshold::Percent(10_000))));
        assert_eq!(p("99.995%"), Ok(Some(AvailableThreshold::Percent(10_000))));
        assert_eq!(p("0.0%"), Ok(Some(AvailableThreshold::Percent(0))));
        // A negative exponent: a fraction of a byte, rounded up.
        assert_eq!(p("1e-3"), Ok(Some(AvailableThreshold::Bytes(1))));
        assert_eq!(p("15e-1"), Ok(Some(AvailableThreshold::Bytes(2))));
        assert_eq!(p("2000E-3"), Ok(Some(AvailableThreshold::Bytes(2))));
        assert_eq!(p("1e-19"), Ok(Some(AvailableThreshold::Bytes(1))));
        assert_eq!(p("5e-400"), Ok(Some(AvailableThreshold::Bytes(1))));
        assert_eq!(p("12345678901234567890e-19"), Ok(Some(AvailableThreshold::Bytes(2))), "exact past 10^-18");
        assert_eq!(p("1.5e-39"), Ok(Some(AvailableThreshold::Bytes(1))));
        assert!(p("0e-30").unwrap_err().contains("must be positive"));
        assert_eq!(p("15%").unwrap().unwrap().to_string(), "15%");
        assert_eq!(p("7.5%").unwrap().unwrap().to_string(), "7.5%");
        for bad in [
            "",
            "%",
            "-5%",
            "150%",
            "abc",
            "2GB",
            "-1Gi",
            "0",
            "0Gi",
            "1.2.3",
            "99999999999999Ei",
            "340282366920938463463374607431768211455.5",
            "340282366920938463463.9E",
            "1e19",
        ] {
            let err = p(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
        assert!(p("0").unwrap_err().contains("must be positive"));
    }

    #[test]
    fn the_eviction_line_is_the_first_usage_gc_measures_past_a_threshold() {
        let lines = [AvailableThreshold::Percent(1500), AvailableThreshold::Percent(1000)];
        assert_eq!(eviction_usage_percent(&lines, 100 * GIB), Some(86));
        // The same on a disk whose size is no multiple of 100.
        assert_eq!(eviction_usage_percent(&lines, 500_107_862_016), Some(86));
        assert_eq!(eviction_usage_percent(&lines, 4096 * 26_214_399), Some(86));
        // 20 GiB available of 100: the quantity comes first.
        let lines = [AvailableThreshold::Percent(1500), AvailableThreshold::Bytes(20 * GIB)];
        assert_eq!(eviction_usage_percent(&lines, 100 * GIB), Some(81));
        // On a disk ten times larger the percent does.
        assert_eq!(eviction_usage_percent(&lines, 1000 * GIB), Some(86));
        assert_eq!(eviction_usage_percent(&lines, 0), None);
        assert_eq!(eviction_usage_percent(&[], 100 * GIB), None);
        // A threshold as large as the disk: evicting at any usage.
        assert_eq!(eviction_usage_percent(&[AvailableThreshold::Bytes(200 * GIB)], 100 * GIB), Some(0));
    }

    #[test]
    fn a_pressure_run_stops_short_of_a_looser_eviction_line_keeping_the_policys_band() {
        let policy = GcPolicy { high_threshold_percent: 85, low_threshold_percent: 80, ..GcPolicy::default() };
        // The kubelet's default (imagefs.available<15%): 85 is already the
        // last usage before it.
        assert_eq!(pressure_policy(&policy, &[AvailableThreshold::Percent(1500)], 100 * GIB), None);
        assert_eq!(pressure_policy(&policy, &[AvailableThreshold::Percent(1500)], 500_107_862_016), None);
        let run = pressure_policy(&policy, &[AvailableThreshold::Percent(2000)], 100 * GIB).unwrap();
        assert_eq!((run.high_threshold_percent, run.low_threshold_percent), (80, 75));
        assert_eq!(run.min_age, policy.min_age, "only the thresholds move");
        let run = pressure_policy(&policy, &[AvailableThreshold::Percent(2000)], 500_107_862_016).unwrap();
        assert_eq!((run.high_threshold_percent, run.low_threshold_percent), (80, 75), "any disk size");
        // An eviction line well above the high threshold: the policy's own.
        assert_eq!(pressure_policy(&policy, &[AvailableThreshold::Percent(1000)], 100 * GIB), None);
        assert_eq!(pressure_policy(&policy, &[], 100 * GIB), None);
        // A threshold that leaves no room is not acted on.
        assert_eq!(pressure_policy(&policy, &[AvailableThreshold::Bytes(200 * GIB)], 100 * GIB), None);
        assert_eq!(pressure_policy(&policy, &[AvailableThreshold::Percent(9950)], 100 * GIB), None);
        // 100.0% (always under the line) and 0.0% (never): no room, and no line.
        assert_eq!(pressure_policy(&policy, &[AvailableThreshold::Percent(10_000)], 100 * GIB), None);
        assert_eq!(pressure_policy(&policy, &[AvailableThreshold::Percent(0)], 100 * GIB), None);
        // A narrow room keeps low below high.
        let run = pressure_policy(&policy, &[AvailableThreshold::Percent(9700)], 100 * GIB).unwrap();
        assert_eq!((run.high_threshold_percent, run.low_threshold_percent), (3, 0));
        let run = pressure_policy(&policy, &[AvailableThreshold::Percent(9800)], 100 * GIB).unwrap();
        assert_eq!((run.high_threshold_percent, run.low_threshold_percent), (2, 0));
        // Usage GC off (age-only GC): left off.
        let age_only = GcPolicy { high_threshold_percent: 100, ..policy.clone() };
        assert_eq!(pressure_policy(&age_only, &[AvailableThreshold::Percent(2000)], 100 * GIB), None);
    }
}
