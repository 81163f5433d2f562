//! TEMPORARY stand-in for Go formatting (replaced by the full module).
#![allow(missing_docs)]
use std::time::Duration;

pub fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub fn duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    let frac = |v: u128, unit: u128| -> String {
        let whole = v / unit;
        let rem = v % unit;
        if rem == 0 {
            return whole.to_string();
        }
        let digits = unit.to_string().len() - 1;
        let s = format!("{rem:0digits$}");
        format!("{whole}.{}", s.trim_end_matches('0'))
    };
    if ns < 1_000_000 {
        return format!("{}µs", frac(ns, 1_000));
    }
    if ns < 1_000_000_000 {
        return format!("{}ms", frac(ns, 1_000_000));
    }
    let h = ns / 3_600_000_000_000;
    let m = (ns / 60_000_000_000) % 60;
    let s = ns % 60_000_000_000;
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    out.push_str(&format!("{}s", frac(s, 1_000_000_000)));
    out
}

pub fn duration_truncated_ms(d: Duration) -> String {
    duration(Duration::from_millis(d.as_millis() as u64))
}
