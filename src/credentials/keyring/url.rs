//! Keys and image names parsed the way Go's `net/url` parses
//! `https://<text>`: a small hand parser covering what the kubelet relies on.

/// Why a URL did not parse (Go `net/url` rules the kubelet depends on).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// An ASCII control character anywhere.
    #[error("net/url: invalid control character in URL")]
    ControlCharacter,
    /// A character not allowed in the user-info part.
    #[error("net/url: invalid userinfo")]
    InvalidUserinfo,
    /// `[` without a closing `]`.
    #[error("missing ']' in host")]
    MissingBracket,
    /// A port that is not all digits: the `:port` text, as Go quotes it.
    #[error("invalid port {} after host", quote(.0))]
    InvalidPort(String),
    /// A character that is not allowed in a host name.
    #[error("invalid character {} in host name", quote(&.0.to_string()))]
    InvalidHostCharacter(char),
    /// A `%` not followed by two hex digits (or an escape a host may not
    /// have): the (up to) three characters from the `%`.
    #[error("invalid URL escape {}", quote(.0))]
    InvalidEscape(String),
}

use crate::domain::go_text::quote;

/// Go's `EscapeError` text: the `%` and at most two characters after it.
fn escape_error(from_percent: &str) -> UrlError {
    UrlError::InvalidEscape(from_percent.chars().take(3).collect())
}

/// The parts of a parsed URL the keyring uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ParsedUrl {
    /// `host[:port]`, user-info removed.
    pub(super) host: String,
    /// The percent-decoded path (empty or starting with `/`).
    pub(super) path: String,
}

/// Parses `scheme://authority/path?query#fragment` like Go's `url.Parse`
/// for the inputs the keyring builds (always with a scheme).
pub(super) fn parse_url(raw: &str) -> Result<ParsedUrl, UrlError> {
    if raw.chars().any(|c| (c as u32) < 0x20 || c == '\u{7f}') {
        return Err(UrlError::ControlCharacter);
    }
    let (rest, fragment) = match raw.split_once('#') {
        Some((r, f)) => (r, Some(f)),
        None => (raw, None),
    };
    if let Some(f) = fragment {
        percent_decode(f)?;
    }
    let rest = rest.split_once('?').map_or(rest, |(r, _query)| r);
    let Some((_scheme, rest)) = rest.split_once("://") else {
        return Ok(ParsedUrl { host: String::new(), path: percent_decode(rest)? });
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let host = match authority.rfind('@') {
        Some(i) => {
            let userinfo = &authority[..i];
            if !userinfo.chars().all(|c| c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c)) {
                return Err(UrlError::InvalidUserinfo);
            }
            &authority[i + 1..]
        }
        None => authority,
    };
    validate_host(host)?;
    Ok(ParsedUrl { host: host.to_string(), path: percent_decode(path)? })
}

fn valid_optional_port(colon_port: &str) -> bool {
    match colon_port.strip_prefix(':') {
        Some(digits) => digits.bytes().all(|b| b.is_ascii_digit()),
        None => colon_port.is_empty(),
    }
}

fn validate_host(host: &str) -> Result<(), UrlError> {
    if host.starts_with('[') {
        let i = host.rfind(']').ok_or(UrlError::MissingBracket)?;
        if !valid_optional_port(&host[i + 1..]) {
            return Err(UrlError::InvalidPort(host[i + 1..].to_string()));
        }
    } else if let Some(i) = host.rfind(':')
        && !valid_optional_port(&host[i..])
    {
        return Err(UrlError::InvalidPort(host[i..].to_string()));
    }
    for (i, c) in host.char_indices() {
        if c == '%' {
            // Go: a host may hold only escapes of non-ASCII bytes (or `%25`).
            let seq = &host[i..];
            let b = seq.as_bytes();
            let hex_ok = b.len() >= 3 && b[1].is_ascii_hexdigit() && b[2].is_ascii_hexdigit();
            if !hex_ok || (b[1] < b'8' && b[1].is_ascii_digit() && &seq[..3] != "%25") {
                return Err(escape_error(seq));
            }
            continue;
        }
        let allowed = !c.is_ascii() || c.is_ascii_alphanumeric() || "-_.~!$&'()*+,;=:[]<>\"".contains(c);
        if !allowed {
            return Err(UrlError::InvalidHostCharacter(c));
        }
    }
    Ok(())
}

fn percent_decode(s: &str) -> Result<String, UrlError> {
    if !s.contains('%') {
        return Ok(s.to_string());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let bad = || escape_error(&String::from_utf8_lossy(&bytes[i..]));
            let hex = bytes.get(i + 1..i + 3).ok_or_else(bad)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return Err(bad());
            }
            let text = std::str::from_utf8(hex).map_err(|_| bad())?;
            let b = u8::from_str_radix(text, 16).map_err(|_| bad())?;
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// `user:password@` in a key's authority replaced by `<redacted>@`.
pub(super) fn redact_userinfo(key: &str) -> String {
    let (prefix, rest) = match key.find("://") {
        Some(i) => key.split_at(i + 3),
        None => ("", key),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{prefix}<redacted>{}", &rest[at..]),
        None => key.to_string(),
    }
}

/// Go's `net.SplitHostPort`, falling back to (whole host, "") on error as
/// the kubelet's `SplitURL` does.
pub(super) fn split_host_port(hostport: &str) -> (&str, &str) {
    let whole = (hostport, "");
    if let Some(rest) = hostport.strip_prefix('[') {
        let Some(end) = rest.find(']') else { return whole };
        let host = &rest[..end];
        match rest[end + 1..].strip_prefix(':') {
            Some(port) if !port.contains(':') && !host.contains('[') => (host, port),
            _ => whole,
        }
    } else {
        let Some(i) = hostport.rfind(':') else { return whole };
        let host = &hostport[..i];
        if host.contains([':', '[', ']']) || hostport[i + 1..].contains(['[', ']']) {
            return whole;
        }
        (host, &hostport[i + 1..])
    }
}
