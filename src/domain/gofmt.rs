//! Go's text formatting where users and tools match on it: `%q` quoting
//! (`strconv.Quote`) and `time.Duration.String()`.

use std::time::Duration;

/// Go's `strconv.Quote` (`%q`): double quotes, Go escapes, printable
/// characters kept. Printability follows Go's `unicode.IsPrint` for ASCII
/// exactly; beyond ASCII, control, format, private-use, unassigned-looking
/// and separator characters are escaped (an approximation of Go's tables).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if is_print(c) => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

fn is_print(c: char) -> bool {
    let u = c as u32;
    if u < 0x80 {
        return (0x20..0x7f).contains(&u);
    }
    // Go: letters, marks, numbers, punctuation, symbols and U+0020 are
    // printable; other spaces, controls, format characters, surrogates,
    // private use and noncharacters are not.
    !(c.is_control()
        || c.is_whitespace()
        || matches!(u, 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e | 0x200b..=0x200f | 0x202a..=0x202e
            | 0x2060..=0x206f | 0xfeff | 0xfff9..=0xfffb | 0xe000..=0xf8ff | 0xf0000..=0x10ffff)
        || (u & 0xfffe) == 0xfffe
        || (0xfdd0..=0xfdef).contains(&u))
}

/// Go's `time.Duration.String()`: `0s`, `1.5µs`, `981ms`, `15.981s`,
/// `1m2.5s`, `1h0m3s`.
pub fn duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    let frac = |v: u128, unit: u128, digits: usize| -> String {
        let (whole, rem) = (v / unit, v % unit);
        if rem == 0 {
            return whole.to_string();
        }
        let f = format!("{rem:0digits$}");
        format!("{whole}.{}", f.trim_end_matches('0'))
    };
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    if ns < 1_000_000 {
        return format!("{}µs", frac(ns, 1_000, 3));
    }
    if ns < 1_000_000_000 {
        return format!("{}ms", frac(ns, 1_000_000, 6));
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
    out.push_str(&format!("{}s", frac(s, 1_000_000_000, 9)));
    out
}

/// [`duration`] of `d` truncated to whole milliseconds (the kubelet's
/// `Truncate(time.Millisecond)` before printing pull times).
pub fn duration_truncated_ms(d: Duration) -> String {
    duration(Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_matches_go() {
        let table = [
            ("", r#""""#),
            ("busybox:1.36", r#""busybox:1.36""#),
            ("a\tb", r#""a\tb""#),
            ("say \"hi\"\\", r#""say \"hi\"\\""#),
            ("\u{7}\u{8}\u{c}\n\r\u{b}", r#""\a\b\f\n\r\v""#),
            ("\u{0}\u{1f}\u{7f}", r#""\x00\x1f\x7f""#),
            ("é日本", "\"é日本\""),
            ("\u{200b}", r#""\u200b""#),
            ("\u{feff}", r#""\ufeff""#),
            ("\u{a0}", r#""\u00a0""#),
            ("\u{10ffff}", r#""\U0010ffff""#),
            ("😀", "\"😀\""),
        ];
        for (input, want) in table {
            assert_eq!(quote(input), want, "{input:?}");
        }
    }

    #[test]
    fn durations_match_go() {
        let ms = Duration::from_millis;
        let table = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_nanos(1_500), "1.5µs"),
            (Duration::from_micros(1), "1µs"),
            (ms(981), "981ms"),
            (Duration::from_micros(1_500), "1.5ms"),
            (ms(15_981), "15.981s"),
            (ms(62_500), "1m2.5s"),
            (Duration::from_secs(3_603), "1h0m3s"),
            (Duration::from_secs(7_200), "2h0m0s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(300), "5m0s"),
            (Duration::from_nanos(1_000_000_001), "1.000000001s"),
        ];
        for (d, want) in table {
            assert_eq!(duration(d), want, "{d:?}");
        }
        assert_eq!(duration_truncated_ms(Duration::from_micros(981_999)), "981ms");
    }
}
