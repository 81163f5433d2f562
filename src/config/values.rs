//! Value parsers and the error helpers every section shares.

use std::time::Duration;

use super::{ConfigError, Sources};

/// A count where 0 means `zero` (off, no limit…): `None` for 0, the count
/// otherwise; a negative value is rejected naming `key`.
pub(super) fn zero_is_off(key: &str, v: i64, zero: &str) -> Result<Option<usize>, ConfigError> {
    match usize::try_from(v) {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(invalid(key, &v.to_string(), format!("must be 0 ({zero}) or more"))),
    }
}

/// A value the KubeletConfiguration set (and nothing later overrode) that
/// imaged's validation refused: name the file and the kubelet's field.
pub(super) fn blame_kubelet_field(
    e: ConfigError,
    k: &crate::kubelet_config::KubeletImageFields,
    sources: &Sources,
) -> ConfigError {
    let ConfigError::Invalid { key, value, reason } = &e else { return e };
    let Some((_, _, field)) = k.overrides().into_iter().find(|(k, _, _)| key == k) else { return e };
    let env_name = format!("IMAGED_{}", key.replace('.', "__").to_uppercase());
    let overridden = sources.env.as_ref().is_some_and(|env| env.contains_key(&env_name))
        || sources.overrides.iter().any(|o| o.split_once('=').is_some_and(|(k, _)| k.trim() == key));
    if overridden {
        return e;
    }
    crate::kubelet_config::KubeletConfigError::Field {
        file: k.file.clone(),
        field: field.to_string(),
        reason: format!("{value}: {reason} (imaged key {key})"),
    }
    .into()
}

/// A value the layers gave that validation refused: where it was given,
/// after its reason (` (FILE, line N)`, ` (environment IMAGED_…)`,
/// ` (command line)`), so an operator finds it in a long file. A default
/// (a cross-key check naming the key left alone) and a KubeletConfiguration
/// field ([`blame_kubelet_field`]) are left as they are.
pub(super) fn locate_invalid(e: ConfigError, effective: &super::Effective, file_text: Option<&str>) -> ConfigError {
    use super::Origin;
    let ConfigError::Invalid { key, value, reason } = e else { return e };
    // `pull.registries[1].qps`: the key `pull.registries.qps` of item 1.
    let mut item = None;
    let path: Vec<&str> = key
        .split('.')
        .map(|part| match part.split_once('[') {
            Some((name, index)) => {
                item = index.trim_end_matches(']').parse().ok();
                name
            }
            None => part,
        })
        .collect();
    let at = match effective.origin(&path.join(".")) {
        Origin::File(file) => {
            let origin = file.display().to_string();
            let place = super::schema::Place { origin: &origin, text: file_text, locate_types: true, item };
            place.line_of(&path).unwrap_or(origin)
        }
        Origin::Environment(var) => format!("environment {var}"),
        Origin::Flag => "command line".to_string(),
        Origin::Default | Origin::Kubelet { .. } => return ConfigError::Invalid { key, value, reason },
    };
    let reason = if reason.ends_with(&format!("({at})")) { reason } else { format!("{reason} ({at})") };
    ConfigError::Invalid { key, value, reason }
}

/// An actor's mailbox capacity: from 1 to 1,000,000, naming `key` otherwise.
pub(super) fn mailbox_capacity(key: &str, v: i64) -> Result<usize, ConfigError> {
    usize::try_from(v)
        .ok()
        .filter(|c| (1..=1_000_000).contains(c))
        .ok_or_else(|| invalid(key, &v.to_string(), "must be from 1 to 1000000"))
}

pub(super) fn invalid(key: &str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.to_string(), value: value.to_string(), reason: reason.into() }
}

/// Parses a duration with Go's grammar (`time.ParseDuration`, as the
/// kubelet's files use): `500ms`, `10s`, `2m`, `1h30m`, `1.5h`, `0`. Units
/// are `ns`, `us` (`µs`), `ms`, `s`, `m`, `h`; anything else (`2min`,
/// `1d`, `1M`) is refused naming `key`, with the Go form where one exists.
pub fn duration(key: &str, v: &str) -> Result<Duration, ConfigError> {
    use crate::domain::go_text::{ParseDurationError, parse_duration};
    let text = v.trim();
    let too_large = |given: &str| crate::domain::limits::DurationTooLarge { given: given.to_string() }.reason();
    match parse_duration(text) {
        Ok(ns) => match u64::try_from(ns) {
            Ok(ns) => crate::domain::limits::check_duration(Duration::from_nanos(ns), || text.to_string())
                .map_err(|e| invalid(key, v, e.reason())),
            Err(_) => Err(invalid(key, v, "must not be negative")),
        },
        Err(ParseDurationError::OutOfRange(_)) => Err(invalid(key, v, too_large(text))),
        Err(e) => Err(invalid(key, v, format!("not a Go duration ({e}); {}", duration_hint(text)))),
    }
}

/// What to write instead of `text`: its Go form when `text` is a duration
/// in another common notation with the same meaning (`2min` → `2m`, `1day`
/// → `24h`); months and years have no Go unit and no fixed length.
fn duration_hint(text: &str) -> String {
    const GRAMMAR: &str = "write a number and a unit (ns, us, ms, s, m, h), e.g. \"500ms\", \"10s\", \"2m\", \"1h30m\"";
    let has_calendar_unit = text
        .split(|c: char| c.is_ascii_digit() || c == '.' || c.is_whitespace())
        .any(|unit| matches!(unit, "M" | "month" | "months" | "y" | "year" | "years"));
    if has_calendar_unit {
        return format!("{GRAMMAR}; there is no month or year unit (\"M\" is not minutes: those are \"m\")");
    }
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => format!("{GRAMMAR}: here \"{}\"", crate::domain::go_text::duration(d)),
        _ => GRAMMAR.to_string(),
    }
}

/// Parses `text` as TOML only to report a syntax error well: the key (with
/// its section) and the line, which the config crate's message lacks (an
/// integer past 64 bits says only "number too large to fit in target
/// type"). `origin` names the file. A document that parses has its keys
/// and value types checked (`super::schema`); `locate_types` adds the
/// file and line to a type error's reason (the unknown-key error always
/// has them).
pub(super) fn check_toml(text: &str, origin: &str, locate_types: bool) -> Result<(), ConfigError> {
    let e = match toml::from_str::<toml::Table>(text) {
        Ok(table) => {
            let place = super::schema::Place { origin, text: Some(text), locate_types, item: None };
            return super::schema::check_file(&table, &place);
        }
        Err(e) => e,
    };
    let Some(at) = e.span().map(|s| s.start.min(text.len())) else {
        return Err(ConfigError::Load(format!("{origin}: {}", e.message())));
    };
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line_no = text[..line_start].matches('\n').count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("");
    let section = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    let what = |value: &str| {
        let digits = value.trim_start_matches(['+', '-']);
        if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit() || c == '_') {
            format!("an integer past TOML's 64-bit range (±{})", i64::MAX)
        } else {
            e.message().trim().to_string()
        }
    };
    match line.split_once('=') {
        Some((name, value)) => {
            let reason = format!("{} ({origin}, line {line_no})", what(value.trim()));
            let name = name.trim();
            let key = match section {
                Some(s) if !s.is_empty() => format!("{s}.{name}"),
                _ => name.to_string(),
            };
            Err(invalid(&key, value.trim(), reason))
        }
        None => Err(ConfigError::Load(format!("{} ({origin}, line {line_no}): {}", e.message().trim(), line.trim()))),
    }
}
