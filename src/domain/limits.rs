//! Bounds on values that come from outside (API fields, flags, config files,
//! plugin answers) before they reach a library that panics on them.
//!
//! tonic's `Request::set_timeout` panics on a timeout past 99,999,999 hours,
//! `std::time::Instant + Duration` panics on overflow and
//! `Duration::from_secs_f64` panics on a value it cannot hold. A duration from
//! outside is therefore checked against [`MAX_DURATION`] where it enters, with
//! an error naming the field, and the places that hand one to such a library
//! clamp it as a second line of defence ([`clamp_duration`]).

use std::time::Duration;

/// The largest duration imaged accepts from outside: Go's largest
/// `time.Duration` (2^63-1 ns, "2562047h47m16.854775807s", about 292 years),
/// so every value the kubelet's own files can hold is accepted, and far below
/// what tonic, tokio and `std` panic on.
pub const MAX_DURATION: Duration = Duration::from_nanos(i64::MAX as u64);

/// A duration from outside that is larger than [`MAX_DURATION`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{given} is {}", self.reason())]
pub struct DurationTooLarge {
    /// The value as given (e.g. `"20000y"` or `"18446744073709551615ms"`).
    pub given: String,
}

impl DurationTooLarge {
    /// What is wrong without the value: "too large: at most …".
    pub fn reason(&self) -> String {
        format!("too large: at most {} (Go's largest duration)", super::go_text::duration(MAX_DURATION))
    }
}

/// `d` if it is at most [`MAX_DURATION`]; `given` names the value in the error.
pub fn check_duration(d: Duration, given: impl FnOnce() -> String) -> Result<Duration, DurationTooLarge> {
    if d <= MAX_DURATION { Ok(d) } else { Err(DurationTooLarge { given: given() }) }
}

/// A millisecond count from the API (`deadline_ms`), checked.
pub fn duration_from_millis(ms: u64) -> Result<Duration, DurationTooLarge> {
    check_duration(Duration::from_millis(ms), || format!("{ms}ms"))
}

/// `d` in whole milliseconds, for logs and metrics (`u64::MAX` past it).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `d`, no larger than [`MAX_DURATION`]: for code that passes a duration to a
/// library that panics on huge values, whatever its caller checked.
pub fn clamp_duration(d: Duration) -> Duration {
    d.min(MAX_DURATION)
}

/// `1 / per_second` as a duration, clamped to [`MAX_DURATION`] (a rate so low
/// that its period overflows is a period of ~292 years); `None` for a rate
/// that is not a positive finite number.
pub fn period_of_rate(per_second: f64) -> Option<Duration> {
    if per_second.is_nan() || per_second <= 0.0 || !per_second.is_finite() {
        return None;
    }
    Some(Duration::try_from_secs_f64(1.0 / per_second).map_or(MAX_DURATION, clamp_duration))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_is_gos_largest_duration() {
        assert_eq!(super::super::go_text::duration(MAX_DURATION), "2562047h47m16.854775807s");
        assert_eq!(check_duration(MAX_DURATION, || unreachable!()), Ok(MAX_DURATION));
    }

    #[test]
    fn too_large_names_the_value_and_the_bound() {
        let e = duration_from_millis(u64::MAX).unwrap_err();
        assert_eq!(
            e.to_string(),
            "18446744073709551615ms is too large: at most 2562047h47m16.854775807s (Go's largest duration)"
        );
        assert_eq!(duration_from_millis(1500), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn clamp_and_rate_never_panic() {
        assert_eq!(clamp_duration(Duration::MAX), MAX_DURATION);
        assert_eq!(period_of_rate(1e-300), Some(MAX_DURATION));
        assert_eq!(period_of_rate(f64::MIN_POSITIVE), Some(MAX_DURATION));
        assert_eq!(period_of_rate(4.0), Some(Duration::from_millis(250)));
        assert_eq!(period_of_rate(f64::MAX), Some(Duration::ZERO));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(period_of_rate(bad), None);
        }
    }
}
