//! The kubelet's `BasicDockerKeyring`: registry keys normalised on insert,
//! looked up most specific first with per-label host globs, equal ports and
//! path prefixes, and a Docker Hub fallback to `index.docker.io`.
//!
//! Keys and image names are parsed the way Go's `net/url` parses
//! `https://<text>` (a small hand parser covering what the kubelet relies
//! on), host labels are matched with Go's `filepath.Match` semantics.

use std::collections::BTreeMap;
use std::fmt;

use sha2::{Digest, Sha256};

use crate::domain::reference::Named;
use crate::domain::{AuthConfig, Secret};

/// The registry host the kubelet falls back to for Docker Hub images.
pub const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// Where a credential came from: the pull secret it was read from (node
/// credentials have none).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CredentialSource {
    /// The secret's `metadata.uid`.
    pub secret_uid: String,
    /// The secret's namespace.
    pub namespace: String,
    /// The secret's name.
    pub name: String,
}

/// One set of registry credentials, as stored in a [`Keyring`]. The `auth`
/// field of a docker config is already resolved into `username`/`password`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Credential {
    /// User name for basic auth.
    pub username: String,
    /// Password for basic auth.
    pub password: Secret,
    /// The (deprecated) e-mail of the docker config entry.
    pub email: String,
    /// The pull secret this credential came from; `None` for node credentials.
    pub source: Option<CredentialSource>,
    /// The normalised keyring key it is stored under (set by [`Keyring::add`]).
    pub key: String,
}

impl Credential {
    /// A credential with no source and no key yet.
    pub fn new(username: impl Into<String>, password: impl Into<Secret>, email: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: password.into(),
            email: email.into(),
            source: None,
            key: String::new(),
        }
    }

    /// The same credential, tagged with the secret it came from.
    pub fn with_source(mut self, source: CredentialSource) -> Self {
        self.source = Some(source);
        self
    }

    /// The kubelet's `AuthConfigHash`: SHA-256 hex of Go's `json.Marshal` of
    /// `AuthConfig{Username, Password, Email}` (fields `username`, `password`,
    /// `email`, each omitted when empty). Identifies the credential without
    /// keeping it.
    pub fn auth_config_hash(&self) -> String {
        let mut json = String::from("{");
        for (name, value) in
            [("username", self.username.as_str()), ("password", self.password.expose()), ("email", self.email.as_str())]
        {
            if value.is_empty() {
                continue;
            }
            if json.len() > 1 {
                json.push(',');
            }
            go_json_string(&mut json, name);
            json.push(':');
            go_json_string(&mut json, value);
        }
        json.push('}');
        let digest = Sha256::digest(json.as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The CRI `AuthConfig` to pull `image` with: username and password, and
    /// `server_address` = the registry host the key matched (the image's
    /// `host[:port]`, scheme-less). It is left empty for Docker Hub, whose
    /// pulls containerd sends to `registry-1.docker.io`: an address of
    /// `index.docker.io` would make containerd drop the credentials.
    pub fn to_auth_config(&self, image: &Named) -> AuthConfig {
        let server_address = if image.domain() == "docker.io" { String::new() } else { image.domain().to_string() };
        AuthConfig::basic(server_address, self.username.clone(), self.password.clone())
    }
}

/// Appends `s` as Go's `encoding/json` encodes a string (HTML-safe escaping).
fn go_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Why a URL did not parse (Go `net/url` rules the kubelet depends on).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// An ASCII control character anywhere.
    #[error("invalid control character in URL")]
    ControlCharacter,
    /// A character not allowed in the user-info part.
    #[error("invalid userinfo")]
    InvalidUserinfo,
    /// `[` without a closing `]`.
    #[error("missing ']' in host")]
    MissingBracket,
    /// A port that is not all digits.
    #[error("invalid port after host")]
    InvalidPort,
    /// A character that is not allowed in a host name.
    #[error("invalid character {0:?} in host name")]
    InvalidHostCharacter(char),
    /// A `%` not followed by two hex digits (or any `%` in a host).
    #[error("invalid URL escape")]
    InvalidEscape,
}

/// A keyring entry whose key is not a valid URL; the kubelet logs and skips
/// it. Any user-info in the key is redacted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("entry {entry:?} in dockercfg invalid ({reason}), ignoring")]
pub struct KeyError {
    /// The key as written, with any `user:password@` replaced by `<redacted>@`.
    pub entry: String,
    /// What was wrong with it.
    pub reason: UrlError,
}

/// The parts of a parsed URL the keyring uses.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ParsedUrl {
    /// `host[:port]`, user-info removed.
    host: String,
    /// The percent-decoded path (empty or starting with `/`).
    path: String,
}

/// Parses `scheme://authority/path?query#fragment` like Go's `url.Parse`
/// for the inputs the keyring builds (always with a scheme).
fn parse_url(raw: &str) -> Result<ParsedUrl, UrlError> {
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
            return Err(UrlError::InvalidPort);
        }
    } else if let Some(i) = host.rfind(':')
        && !valid_optional_port(&host[i..])
    {
        return Err(UrlError::InvalidPort);
    }
    for c in host.chars() {
        if c == '%' {
            return Err(UrlError::InvalidEscape);
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
            let hex = bytes.get(i + 1..i + 3).ok_or(UrlError::InvalidEscape)?;
            let text = std::str::from_utf8(hex).map_err(|_| UrlError::InvalidEscape)?;
            let b = u8::from_str_radix(text, 16).map_err(|_| UrlError::InvalidEscape)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return Err(UrlError::InvalidEscape);
            }
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
fn redact_userinfo(key: &str) -> String {
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

/// The kubelet's key normalisation: prepend `https://` unless the key starts
/// with `http://` or `https://`, parse it as a URL, strip a leading `/v1/` or
/// `/v2/` from the path (keeping the slash), and return `host[:port]` +
/// path, or the host alone when the path is empty or `/`.
///
/// `https://index.docker.io/v1/` → `index.docker.io`;
/// `registry.io/team` → `registry.io/team`.
pub fn normalize_key(registry_key: &str) -> Result<String, KeyError> {
    let value = if registry_key.starts_with("https://") || registry_key.starts_with("http://") {
        registry_key.to_string()
    } else {
        format!("https://{registry_key}")
    };
    let parsed = parse_url(&value).map_err(|reason| KeyError { entry: redact_userinfo(registry_key), reason })?;
    let mut path = parsed.path.as_str();
    if path.starts_with("/v2/") || path.starts_with("/v1/") {
        path = &path[3..];
    }
    Ok(if !path.is_empty() && path != "/" { format!("{}{path}", parsed.host) } else { parsed.host })
}

/// Go's `net.SplitHostPort`, falling back to (whole host, "") on error as
/// the kubelet's `SplitURL` does.
fn split_host_port(hostport: &str) -> (&str, &str) {
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

/// The kubelet's `URLsMatchStr(glob, target)`: both scheme-less. Ports must
/// be equal (both empty counts), hosts must have as many `.`-separated
/// labels, the target's path must start with the glob's path (plain string
/// prefix), and each host label must match its glob label
/// (`*`, `?`, `[...]`, `\` escapes; `*.io` does not match `a.b.io`). An
/// unparsable URL or a malformed glob never matches.
pub fn urls_match(glob: &str, target: &str) -> bool {
    let (Ok(g), Ok(t)) = (parse_url(&format!("https://{glob}")), parse_url(&format!("https://{target}"))) else {
        return false;
    };
    let (g_host, g_port) = split_host_port(&g.host);
    let (t_host, t_port) = split_host_port(&t.host);
    if g_port != t_port {
        return false;
    }
    let g_parts: Vec<&str> = g_host.split('.').collect();
    let t_parts: Vec<&str> = t_host.split('.').collect();
    if g_parts.len() != t_parts.len() || !t.path.starts_with(&g.path) {
        return false;
    }
    g_parts.iter().zip(&t_parts).all(|(g, t)| glob_match(g, t))
}

/// Go's `filepath.Match` on Unix: `*` (any run of non-`/`), `?` (one
/// non-`/` character), `[...]` / `[^...]` classes with ranges, `\` escapes.
/// A malformed pattern matches nothing.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    if !valid_pattern(&p) {
        return false;
    }
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() {
            if p[pi] == '*' {
                star = Some((pi, ni));
                pi += 1;
                continue;
            }
            if let Some(len) = match_one(&p[pi..], n[ni]) {
                pi += len;
                ni += 1;
                continue;
            }
        }
        match star {
            Some((sp, sn)) if n[sn] != '/' => {
                star = Some((sp, sn + 1));
                pi = sp + 1;
                ni = sn + 1;
            }
            _ => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// One escaped or plain character of a class; `None` when malformed.
fn class_char(p: &[char], i: usize) -> Option<(char, usize)> {
    match p.get(i)? {
        '-' | ']' => None,
        '\\' => p.get(i + 1).map(|&c| (c, i + 2)),
        &c => Some((c, i + 1)),
    }
}

/// A parsed `[...]` class: negated, its inclusive ranges, the index after `]`.
type Class = (bool, Vec<(char, char)>, usize);

/// Parses a class starting after `[`.
fn parse_class(p: &[char], start: usize) -> Option<Class> {
    let mut i = start;
    let negated = p.get(i) == Some(&'^');
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    loop {
        if p.get(i) == Some(&']') && !ranges.is_empty() {
            return Some((negated, ranges, i + 1));
        }
        let (lo, next) = class_char(p, i)?;
        i = next;
        let mut hi = lo;
        if p.get(i) == Some(&'-') {
            let (h, next) = class_char(p, i + 1)?;
            hi = h;
            i = next;
        }
        ranges.push((lo, hi));
    }
}

fn valid_pattern(p: &[char]) -> bool {
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            '\\' if i + 1 >= p.len() => return false,
            '\\' => i += 2,
            '[' => match parse_class(p, i + 1) {
                Some((_, _, next)) => i = next,
                None => return false,
            },
            _ => i += 1,
        }
    }
    true
}

/// Matches one non-`*` pattern element at the start of `p` against `c`;
/// returns the element's length in the pattern.
fn match_one(p: &[char], c: char) -> Option<usize> {
    match p.first()? {
        '?' => (c != '/').then_some(1),
        '\\' => (p.get(1)? == &c).then_some(2),
        '[' => {
            let (negated, ranges, next) = parse_class(p, 1)?;
            let inside = ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi);
            (inside != negated && c != '/').then_some(next)
        }
        &x => (x == c).then_some(1),
    }
}

/// The kubelet's `isDefaultRegistryMatch`: would `image` (a repository name
/// without tag) be pulled from Docker Hub? A single component, a first
/// component of `docker.io` or `index.docker.io`, or one without `.` or `:`
/// (so `localhost/x` counts, as in the kubelet).
pub fn is_default_registry_match(image: &str) -> bool {
    let (first, rest) = match image.split_once('/') {
        Some((f, r)) => (f, Some(r)),
        None => (image, None),
    };
    if first.is_empty() {
        return false;
    }
    rest.is_none() || first == "docker.io" || first == DEFAULT_REGISTRY_HOST || !first.contains(['.', ':'])
}

/// Something that finds the credentials to try for an image, in order.
pub trait DockerKeyring: Send + Sync {
    /// The credentials for `image_repo` (normalised repository, no tag), in
    /// the order to try them; empty when none match.
    fn lookup(&self, image_repo: &str) -> Vec<Credential>;
}

/// The kubelet's `BasicDockerKeyring`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyring {
    /// Normalised key → credentials in insertion order. Iterated in reverse
    /// (byte-wise) key order, which is the kubelet's index order.
    creds: BTreeMap<String, Vec<Credential>>,
}

impl Keyring {
    /// An empty keyring.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `cred` under the normalised form of `registry_key` (see
    /// [`normalize_key`]), after any credentials already there. An invalid
    /// key adds nothing and is returned for the caller to log.
    pub fn add(&mut self, registry_key: &str, mut cred: Credential) -> Result<(), KeyError> {
        let key = normalize_key(registry_key)?;
        cred.key = key.clone();
        self.creds.entry(key).or_default().push(cred);
        Ok(())
    }

    /// Appends every credential of `other` after the ones already under
    /// the same key (keys of both are already normalised).
    pub fn extend(&mut self, other: Keyring) {
        for (key, creds) in other.creds {
            self.creds.entry(key).or_default().extend(creds);
        }
    }

    /// The unique keys, most specific first (reverse lexicographic order).
    pub fn index(&self) -> Vec<&str> {
        self.creds.keys().rev().map(String::as_str).collect()
    }

    /// True when the keyring holds no credentials.
    pub fn is_empty(&self) -> bool {
        self.creds.is_empty()
    }

    /// The kubelet's `Lookup`: for each key in index order whose glob
    /// matches `image_repo`, all its credentials; if none matched and the
    /// image is a Docker Hub image, those under `index.docker.io`.
    pub fn lookup(&self, image_repo: &str) -> Vec<Credential> {
        let found: Vec<Credential> = self
            .creds
            .iter()
            .rev()
            .filter(|(key, _)| urls_match(key, image_repo))
            .flat_map(|(_, creds)| creds.iter().cloned())
            .collect();
        if !found.is_empty() {
            return found;
        }
        if is_default_registry_match(image_repo)
            && let Some(creds) = self.creds.get(DEFAULT_REGISTRY_HOST)
        {
            return creds.clone();
        }
        Vec::new()
    }
}

impl DockerKeyring for Keyring {
    fn lookup(&self, image_repo: &str) -> Vec<Credential> {
        Keyring::lookup(self, image_repo)
    }
}

impl fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "secret {}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests;
