//! The two text formats `/metrics` speaks: OpenMetrics 1.0 (what
//! `prometheus-client` encodes) and the classic Prometheus text format
//! 0.0.4, made from it here, for scrapers and tools that ask for it or ask
//! for nothing in particular (`promtool check metrics`, older agents).
//!
//! The classic format differs in what concerns imaged's families:
//!
//! - a counter's `# HELP` and `# TYPE` name its samples' name (`foo_total`),
//!   where OpenMetrics names the family (`foo`);
//! - no `_created` samples, `# UNIT` lines, exemplars or `# EOF`;
//! - `info` and `stateset` families are gauges, `unknown` is `untyped`,
//!   `gaugehistogram` is a histogram; timestamps are in milliseconds;
//! - `# HELP` text escapes only `\` and newlines.

use std::collections::HashMap;
use std::fmt::Write as _;

/// The content type of the OpenMetrics text (`Metrics::encode`).
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of the classic Prometheus text (`Metrics::encode_prometheus`).
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The text format a scraper gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4.
    Prometheus,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text` (version 1.0.0, 0.0.1 or none) with a
    /// weight at least that of anything the classic text matches
    /// (`text/plain`, `text/*`, `*/*`); the classic text otherwise,
    /// including when there is no header (as Prometheus' own client
    /// libraries negotiate).
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else { return Format::Prometheus };
        let (mut openmetrics, mut classic) = (0.0_f64, 0.0_f64);
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let mut q = 1.0;
            let mut version = None;
            for p in parts {
                let Some((k, v)) = p.split_once('=') else { continue };
                let v = v.trim().trim_matches('"');
                match k.trim().to_ascii_lowercase().as_str() {
                    "q" => q = v.parse::<f64>().ok().filter(|q| (0.0..=1.0).contains(q)).unwrap_or(0.0),
                    "version" => version = Some(v.to_string()),
                    _ => {}
                }
            }
            match media.as_str() {
                "application/openmetrics-text" if version.as_deref().is_none_or(|v| v == "1.0.0" || v == "0.0.1") => {
                    openmetrics = openmetrics.max(q);
                }
                "text/plain" | "text/*" | "*/*" => classic = classic.max(q),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= classic { Format::OpenMetrics } else { Format::Prometheus }
    }

    /// This format's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::Prometheus => PROMETHEUS_CONTENT_TYPE,
        }
    }
}

/// The classic Prometheus text (0.0.4) of an OpenMetrics text.
pub fn openmetrics_to_prometheus(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // Family name → its type, from the `# TYPE` lines read so far.
    let mut types: HashMap<&str, &str> = HashMap::new();
    // A family's `# HELP` comes before its `# TYPE` in OpenMetrics; it is
    // held until the type says which name the classic text gives it.
    let mut pending_help: Option<(&str, String)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut out, &mut pending_help, None);
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            pending_help = Some((name, help.replace("\\\"", "\"")));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            types.insert(name, ty);
            let (classic_name, classic_ty) = classic_family(name, ty);
            let help_for_this = pending_help.as_ref().is_some_and(|(n, _)| *n == name);
            flush_help(&mut out, &mut pending_help, help_for_this.then_some(classic_name.as_str()));
            let _ = writeln!(out, "# TYPE {classic_name} {classic_ty}");
        } else if line.starts_with('#') {
            // `# UNIT`, `# EOF` and any other comment: not in the classic text.
            flush_help(&mut out, &mut pending_help, None);
        } else if !line.trim().is_empty() {
            flush_help(&mut out, &mut pending_help, None);
            if let Some(sample) = classic_sample(line, &types) {
                out.push_str(&sample);
                out.push('\n');
            }
        }
    }
    flush_help(&mut out, &mut pending_help, None);
    out
}

/// Writes a held `# HELP` line under `name` (its own family name when
/// `None`).
fn flush_help(out: &mut String, pending: &mut Option<(&str, String)>, name: Option<&str>) {
    if let Some((family, help)) = pending.take() {
        let _ = writeln!(out, "# HELP {} {help}", name.unwrap_or(family));
    }
}

/// A family's name and type in the classic text.
fn classic_family(name: &str, ty: &str) -> (String, &'static str) {
    match ty {
        "counter" => (format!("{name}_total"), "counter"),
        "gauge" | "stateset" => (name.to_string(), "gauge"),
        "histogram" | "gaugehistogram" => (name.to_string(), "histogram"),
        "summary" => (name.to_string(), "summary"),
        "info" => (format!("{name}_info"), "gauge"),
        _ => (name.to_string(), "untyped"),
    }
}

/// One sample line in the classic text: without its exemplar, with its
/// timestamp in milliseconds; `None` for a sample the classic text does not
/// have (`_created`).
fn classic_sample(line: &str, types: &HashMap<&str, &str>) -> Option<String> {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    let labels_end =
        if line[name_end..].starts_with('{') { name_end + labels_len(&line[name_end..]) } else { name_end };
    if let Some(family) = name.strip_suffix("_created")
        && types.get(family).is_some_and(|t| matches!(*t, "counter" | "histogram" | "summary" | "gaugehistogram"))
    {
        return None;
    }
    let mut rest = line[labels_end..].split_whitespace();
    let value = rest.next()?;
    let mut sample = format!("{} {value}", &line[..labels_end]);
    // A timestamp, unless what follows is an exemplar (`# {…} v`).
    if let Some(ts) = rest.next().filter(|t| *t != "#")
        && let Ok(seconds) = ts.parse::<f64>()
    {
        let _ = write!(sample, " {}", (seconds * 1000.0).round());
    }
    Some(sample)
}

/// The length of the `{…}` label set at the start of `s`, quotes and
/// escapes in label values respected.
fn labels_len(s: &str) -> usize {
    let (mut in_quotes, mut escaped) = (false, false);
    for (i, c) in s.char_indices() {
        match (in_quotes, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => in_quotes = !in_quotes,
            (false, _, '}') => return i + 1,
            _ => {}
        }
    }
    s.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers_pick_the_format() {
        use Format::{OpenMetrics, Prometheus};
        for (accept, want) in [
            (None, Prometheus),
            (Some(""), Prometheus),
            (Some("*/*"), Prometheus),
            (Some("text/plain"), Prometheus),
            (Some("text/plain;version=0.0.4"), Prometheus),
            // Prometheus 2.x's scrape default.
            (
                Some(
                    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                     text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                ),
                OpenMetrics,
            ),
            (Some("application/openmetrics-text"), OpenMetrics),
            (Some("Application/OpenMetrics-Text; Version=1.0.0"), OpenMetrics),
            (Some("application/openmetrics-text; version=0.0.1"), OpenMetrics),
            // A version imaged does not write.
            (Some("application/openmetrics-text; version=2.0.0"), Prometheus),
            // Weights: the classic text preferred, or OpenMetrics refused.
            (Some("application/openmetrics-text;q=0.3,text/plain;q=0.9"), Prometheus),
            (Some("application/openmetrics-text;q=0,*/*"), Prometheus),
            (Some("text/plain;q=0.5,application/openmetrics-text;q=0.5"), OpenMetrics),
            (Some("application/json"), Prometheus),
        ] {
            assert_eq!(Format::negotiate(accept), want, "{accept:?}");
        }
    }

    #[test]
    fn openmetrics_is_rewritten_as_the_classic_text() {
        let om = "\
# HELP app_requests Requests served, \"all\" of them.
# TYPE app_requests counter
app_requests_total{path=\"/a}b\",q=\"x # y\"} 3 # {trace_id=\"1\"} 1.0 1.5
app_requests_created{path=\"/a}b\",q=\"x # y\"} 1700000000.0
# HELP app_queue Items waiting.
# TYPE app_queue gauge
app_queue 4 1700000000.5
# HELP app_seconds Durations.
# TYPE app_seconds histogram
# UNIT app_seconds seconds
app_seconds_sum 1.5
app_seconds_count 2
app_seconds_bucket{le=\"1.0\"} 1
app_seconds_bucket{le=\"+Inf\"} 2
app_seconds_created 1700000000.0
# HELP app_build Build.
# TYPE app_build info
app_build_info{version=\"1\"} 1
# TYPE app_other unknown
app_other 7
# HELP app_empty Nothing yet.
# TYPE app_empty counter
# EOF
";
        let classic = openmetrics_to_prometheus(om);
        assert_eq!(
            classic,
            "\
# HELP app_requests_total Requests served, \"all\" of them.
# TYPE app_requests_total counter
app_requests_total{path=\"/a}b\",q=\"x # y\"} 3
# HELP app_queue Items waiting.
# TYPE app_queue gauge
app_queue 4 1700000000500
# HELP app_seconds Durations.
# TYPE app_seconds histogram
app_seconds_sum 1.5
app_seconds_count 2
app_seconds_bucket{le=\"1.0\"} 1
app_seconds_bucket{le=\"+Inf\"} 2
# HELP app_build_info Build.
# TYPE app_build_info gauge
app_build_info{version=\"1\"} 1
# TYPE app_other untyped
app_other 7
# HELP app_empty_total Nothing yet.
# TYPE app_empty_total counter
"
        );
    }
}
