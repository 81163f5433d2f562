//! Image references: the distribution/reference grammar and its
//! normalisation (`ParseNormalizedNamed`), go-digest's digest checks, and the
//! kubelet's `ParseImageName`, `applyDefaultImageTag` and
//! `trimImageTagDigest`, with upstream's error texts.
//!
//! The grammar (distribution/reference v0.6, go-digest v1.0.0, as vendored
//! by the kubelet):
//!
//! ```text
//! reference      := name [ ":" tag ] [ "@" digest ]
//! name           := [domain "/"] remote-name
//! domain         := host [":" port-number]
//! host           := domain-name | "[" ipv6 "]"       ipv6 := [a-fA-F0-9:]+
//! domain-name    := domain-component ("." domain-component)*
//! domain-component := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
//! port-number    := [0-9]+
//! remote-name    := path-component ("/" path-component)*
//! path-component := [a-z0-9]+ (separator [a-z0-9]+)*     separator := "." | "_" | "__" | "-"+
//! tag            := [\w][\w.-]{0,127}                     (\w is ASCII [0-9A-Za-z_])
//! digest         := algorithm ":" [0-9a-fA-F]{32,}
//! algorithm      := component ([-_+.] component)*        component := [A-Za-z][A-Za-z0-9]*
//! ```
//!
//! Upstream matches that grammar with RE2 regular expressions; this module
//! matches it by hand. The result is the same because the grammar is
//! unambiguous where it matters: `@` can only start the digest, a tag is the
//! text after the last `:` when no `/` follows it, and a domain is the text
//! before the first `/` when that text is a valid domain (upstream's optional
//! domain group is greedy, so a first component that is both a domain and a
//! path component is the domain).

use std::fmt;

use super::go_text::quote;

/// Longest image reference imaged accepts from a client, on its API and
/// its CRI front (the grammar's own limit is 255 for the name; a tag or
/// digest adds at most ~140): a longer one is refused `InvalidArgument`,
/// not copied into events, logs and the pull queue.
pub const MAX_IMAGE_LEN: usize = 4096;

/// Docker Hub's canonical domain.
pub const DEFAULT_DOMAIN: &str = "docker.io";
/// Docker Hub's legacy domain, rewritten to [`DEFAULT_DOMAIN`].
pub const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
/// The namespace of Docker Hub's official images.
pub const OFFICIAL_REPO_PREFIX: &str = "library/";
/// The tag the kubelet uses when a reference has neither tag nor digest.
pub const DEFAULT_TAG: &str = "latest";
/// Longest repository path upstream accepts (the domain is not counted).
pub const NAME_TOTAL_LENGTH_MAX: usize = 255;
/// Longest tag the grammar accepts.
pub const TAG_MAX_LEN: usize = 128;

/// Why a reference does not parse. `Display` is upstream's text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ReferenceError {
    /// The string does not match the grammar: `invalid reference format`.
    #[error("invalid reference format")]
    InvalidFormat,
    /// `Parse`: the string matches the grammar once lower-cased:
    /// `repository name must be lowercase`.
    #[error("repository name must be lowercase")]
    NameContainsUppercase,
    /// `ParseNormalizedNamed`: the repository part (everything before the
    /// first `:` after the domain) is not lowercase:
    /// `invalid reference format: repository name (<remote>) must be lowercase`.
    #[error("invalid reference format: repository name ({0}) must be lowercase")]
    RemoteNameNotLowercase(String),
    /// `repository name must have at least one component`.
    #[error("repository name must have at least one component")]
    NameEmpty,
    /// `repository name must not be more than 255 characters`.
    #[error("repository name must not be more than 255 characters")]
    NameTooLong,
    /// A bare 64-hex-digit string, which would be an image ID:
    /// `invalid repository name (<s>), cannot specify 64-byte hexadecimal strings`.
    #[error("invalid repository name ({0}), cannot specify 64-byte hexadecimal strings")]
    HexIdentifier(String),
    /// go-digest: `invalid checksum digest format`.
    #[error("invalid checksum digest format")]
    DigestInvalidFormat,
    /// go-digest: `unsupported digest algorithm`.
    #[error("unsupported digest algorithm")]
    DigestUnsupported,
    /// go-digest: `invalid checksum digest length`.
    #[error("invalid checksum digest length")]
    DigestInvalidLength,
}

/// A parsed named reference: domain, path, optional tag and digest.
///
/// From [`parse_normalized_named`] it is normalised (`busybox` →
/// `docker.io/library/busybox`). The domain is empty only in the upstream
/// corner where the first component looks like a domain to the normaliser
/// (it has a `.`) but not to the grammar (`foo_bar.com/x`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Named {
    domain: String,
    path: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl Named {
    /// Registry domain, with its port if any (`docker.io`, `localhost:5000`, `[::1]:5000`).
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// Repository path (`library/busybox`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Full repository name, `domain/path` (`docker.io/library/busybox`),
    /// or the path alone when the domain is empty.
    pub fn name(&self) -> String {
        join_name(&self.domain, &self.path)
    }

    /// The tag, if any.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The digest (`sha256:…`), if any.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// Upstream `FamiliarName`: the name as Docker shows it, without
    /// `docker.io/` and, for single-component official images, `library/`
    /// (`busybox`, `user/app`, `library/a/b`, `quay.io/a/b`).
    pub fn familiar_name(&self) -> String {
        if self.domain != DEFAULT_DOMAIN {
            return self.name();
        }
        match self.path.strip_prefix(OFFICIAL_REPO_PREFIX) {
            Some(rest) if !rest.contains('/') => rest.to_string(),
            _ => self.path.clone(),
        }
    }

    /// Upstream `FamiliarString`: [`Named::familiar_name`] with the tag and
    /// digest (`busybox:1.36`, `user/app@sha256:…`).
    pub fn familiar_string(&self) -> String {
        let mut out = self.familiar_name();
        self.push_suffix(&mut out);
        out
    }

    /// Same as [`Named::familiar_string`].
    pub fn familiar(&self) -> String {
        self.familiar_string()
    }

    /// containerd's `ParseDockerRef` form: `name:tag`, `name@digest` (a
    /// reference with both keeps only the digest), `name:latest` otherwise.
    pub fn docker_ref(&self) -> String {
        match (&self.tag, &self.digest) {
            (_, Some(d)) => format!("{}@{d}", self.name()),
            (Some(t), None) => format!("{}:{t}", self.name()),
            (None, None) => format!("{}:{DEFAULT_TAG}", self.name()),
        }
    }

    fn push_suffix(&self, out: &mut String) {
        if let Some(t) = &self.tag {
            out.push(':');
            out.push_str(t);
        }
        if let Some(d) = &self.digest {
            out.push('@');
            out.push_str(d);
        }
    }
}

impl fmt::Display for Named {
    /// The full string: `name[:tag][@digest]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = self.name();
        self.push_suffix(&mut s);
        f.write_str(&s)
    }
}

fn join_name(domain: &str, path: &str) -> String {
    if domain.is_empty() { path.to_string() } else { format!("{domain}/{path}") }
}

// ---------------------------------------------------------------------------
// The grammar, matched by hand.

/// `[a-z0-9]+ (separator [a-z0-9]+)*` with separator `.`, `_`, `__` or `-`+.
fn is_path_component(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let (Some(&first), Some(&last)) = (b.first(), b.last()) else { return false };
    if !alnum(first) || !alnum(last) {
        return false;
    }
    // Every maximal run of non-alphanumerics must be one separator.
    let mut run_start: Option<usize> = None;
    for (i, &c) in b.iter().enumerate() {
        match (alnum(c), run_start) {
            (true, Some(start)) => {
                if !is_separator(b.get(start..i).unwrap_or_default()) {
                    return false;
                }
                run_start = None;
            }
            (false, None) => run_start = Some(i),
            _ => {}
        }
    }
    true
}

fn is_separator(sep: &[u8]) -> bool {
    matches!(sep, b"." | b"_" | b"__") || (!sep.is_empty() && sep.iter().all(|&c| c == b'-'))
}

/// `path-component ("/" path-component)*`.
fn is_remote_name(s: &str) -> bool {
    s.split('/').all(is_path_component)
}

/// `[a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]`.
fn is_domain_component(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        }
        _ => false,
    }
}

/// `host [":" port]`, host being a domain name or a bracketed IPv6 address.
fn is_domain_and_port(s: &str) -> bool {
    let (host, port) = if let Some(inner) = s.strip_prefix('[') {
        let Some((addr, rest)) = inner.split_once(']') else { return false };
        if addr.is_empty() || !addr.bytes().all(|c| c.is_ascii_hexdigit() || c == b':') {
            return false;
        }
        (None, rest)
    } else {
        match s.find(':') {
            Some(i) => (s.get(..i), s.get(i..).unwrap_or_default()),
            None => (Some(s), ""),
        }
    };
    if let Some(host) = host
        && !host.split('.').all(is_domain_component)
    {
        return false;
    }
    match port.strip_prefix(':') {
        None => port.is_empty(),
        Some(digits) => !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit()),
    }
}

/// `[\w][\w.-]{0,127}` with ASCII `\w`.
fn is_tag(s: &str) -> bool {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let b = s.as_bytes();
    match b.first() {
        Some(&f) => word(f) && b.len() <= TAG_MAX_LEN && b.iter().all(|&c| word(c) || c == b'.' || c == b'-'),
        None => false,
    }
}

/// The reference grammar's digest: `algorithm ":" hex{32,}`.
fn is_digest_pattern(s: &str) -> bool {
    let Some((alg, hex)) = s.split_once(':') else { return false };
    let component = |c: &str| {
        let b = c.as_bytes();
        b.first().is_some_and(u8::is_ascii_alphabetic) && b.iter().all(u8::is_ascii_alphanumeric)
    };
    hex.len() >= 32 && hex.bytes().all(|c| c.is_ascii_hexdigit()) && alg.split(['-', '_', '+', '.']).all(component)
}

/// Splits a name into (domain, path) like upstream's anchored name pattern:
/// the first component is the domain when it is one and the rest is a
/// remote name; otherwise the whole is the path. `None` if not a name.
fn split_name(name: &str) -> Option<(&str, &str)> {
    if let Some((first, rest)) = name.split_once('/')
        && is_domain_and_port(first)
        && is_remote_name(rest)
    {
        return Some((first, rest));
    }
    is_remote_name(name).then_some(("", name))
}

/// The parts of a string matching the whole reference grammar.
struct Parts<'a> {
    domain: &'a str,
    path: &'a str,
    tag: Option<&'a str>,
    digest: Option<&'a str>,
}

fn match_reference(s: &str) -> Option<Parts<'_>> {
    // `@` appears in no other production: it starts the digest.
    let (rest, digest) = match s.split_once('@') {
        Some((rest, d)) if is_digest_pattern(d) => (rest, Some(d)),
        Some(_) => return None,
        None => (s, None),
    };
    // A tag is what follows the last `:` when no `/` follows it (a `:` in
    // the name can only be a port's, before the first `/`).
    let (name, tag) = match rest.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => {
            if !is_tag(tag) {
                return None;
            }
            (name, Some(tag))
        }
        _ => (rest, None),
    };
    let (domain, path) = split_name(name)?;
    Some(Parts { domain, path, tag, digest })
}

/// Go's `strings.ToLower`: per-character simple lower-case mapping (no
/// context, `İ` → `i`, unlike `str::to_lowercase`).
fn go_to_lower(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '\u{130}' => 'i',
            c => c.to_lowercase().next().unwrap_or(c),
        })
        .collect()
}

fn is_lowercase(s: &str) -> bool {
    go_to_lower(s) == s
}

/// go-digest v1.0.0's `Digest.Validate`, with sha256, sha384 and sha512
/// registered (as in the kubelet).
pub fn validate_digest(d: &str) -> Result<(), ReferenceError> {
    let Some((alg, encoded)) = d.split_once(':').filter(|(a, e)| !a.is_empty() && !e.is_empty()) else {
        return Err(ReferenceError::DigestInvalidFormat);
    };
    let hex_len = match alg {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => {
            // Unregistered: well-formed per go-digest's DigestRegexp → unsupported.
            let alg_ok = alg
                .split(['.', '+', '_', '-'])
                .all(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
            let enc_ok = encoded.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'=' | b'_' | b'-'));
            return Err(if alg_ok && enc_ok {
                ReferenceError::DigestUnsupported
            } else {
                ReferenceError::DigestInvalidFormat
            });
        }
    };
    if encoded.len() != hex_len {
        return Err(ReferenceError::DigestInvalidLength);
    }
    if !encoded.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(ReferenceError::DigestInvalidFormat);
    }
    Ok(())
}

/// Upstream `Parse`: a reference as written, without normalisation
/// (`busybox` has an empty domain and path `busybox`). Digest-only strings
/// are not accepted (they do not match the grammar).
pub fn parse(s: &str) -> Result<Named, ReferenceError> {
    if s.is_empty() {
        return Err(ReferenceError::NameEmpty);
    }
    let Some(parts) = match_reference(s) else {
        let lower = go_to_lower(s);
        if lower != s && match_reference(&lower).is_some() {
            return Err(ReferenceError::NameContainsUppercase);
        }
        return Err(ReferenceError::InvalidFormat);
    };
    if parts.path.len() > NAME_TOTAL_LENGTH_MAX {
        return Err(ReferenceError::NameTooLong);
    }
    if let Some(d) = parts.digest {
        validate_digest(d)?;
    }
    Ok(Named {
        domain: parts.domain.to_string(),
        path: parts.path.to_string(),
        tag: parts.tag.map(str::to_string),
        digest: parts.digest.map(str::to_string),
    })
}

/// Upstream `splitDockerDomain`: (domain, remainder), the remainder keeping
/// any tag and digest.
fn split_docker_domain(s: &str) -> (&str, String) {
    let Some((maybe_domain, maybe_remote)) = s.split_once('/') else {
        return (DEFAULT_DOMAIN, format!("{OFFICIAL_REPO_PREFIX}{s}"));
    };
    let (domain, remote) = if maybe_domain == "localhost" {
        (maybe_domain, maybe_remote)
    } else if maybe_domain == LEGACY_DEFAULT_DOMAIN {
        (DEFAULT_DOMAIN, maybe_remote)
    } else if maybe_domain.contains(['.', ':']) || !is_lowercase(maybe_domain) {
        (maybe_domain, maybe_remote)
    } else {
        (DEFAULT_DOMAIN, s)
    };
    if domain == DEFAULT_DOMAIN && !remote.contains('/') {
        return (domain, format!("{OFFICIAL_REPO_PREFIX}{remote}"));
    }
    (domain, remote.to_string())
}

fn is_hex_identifier(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Upstream `ParseNormalizedNamed`: parses a familiar or full reference into
/// its normalised form (`busybox` → `docker.io/library/busybox`,
/// `index.docker.io/x/y` → `docker.io/x/y`), keeping tag and digest.
pub fn parse_normalized_named(s: &str) -> Result<Named, ReferenceError> {
    if is_hex_identifier(s) {
        return Err(ReferenceError::HexIdentifier(s.to_string()));
    }
    let (domain, remainder) = split_docker_domain(s);
    let remote = remainder.split_once(':').map_or(remainder.as_str(), |(r, _)| r);
    if !is_lowercase(remote) {
        return Err(ReferenceError::RemoteNameNotLowercase(remote.to_string()));
    }
    parse(&format!("{domain}/{remainder}"))
}

/// The kubelet's image-name parse failure:
/// `couldn't parse image name "<image>": <err>` (Go `%q` quoting).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("couldn't parse image name {}: {source}", quote(.image))]
pub struct ImageNameError {
    /// The image as given.
    pub image: String,
    /// The grammar's error.
    pub source: ReferenceError,
}

/// The kubelet's `ParseImageName`: (repository, tag, digest) where the
/// repository is the normalised name and tag/digest are empty when absent;
/// the tag is `latest` when neither tag nor digest is given.
pub fn parse_image_name(image: &str) -> Result<(String, String, String), ImageNameError> {
    let named = parse_normalized_named(image).map_err(|source| ImageNameError { image: image.to_string(), source })?;
    let digest = named.digest.unwrap_or_default();
    let tag = match named.tag {
        Some(t) => t,
        None if digest.is_empty() => DEFAULT_TAG.to_string(),
        None => String::new(),
    };
    Ok((join_name(&named.domain, &named.path), tag, digest))
}

/// The kubelet's `applyDefaultImageTag`: appends `:latest` to the image *as
/// written* when it has neither tag nor digest (it does not qualify it:
/// `busybox` → `busybox:latest`); otherwise returns it unchanged.
pub fn apply_default_image_tag(image: &str) -> Result<String, ImageNameError> {
    let (_, tag, digest) = parse_image_name(image)?;
    if digest.is_empty() && !tag.is_empty() && !image.ends_with(&format!(":{tag}")) {
        return Ok(format!("{image}:{tag}"));
    }
    Ok(image.to_string())
}

/// The kubelet's `trimImageTagDigest`: the normalised repository without
/// tag or digest (`nginx:1.27` → `docker.io/library/nginx`), the key of
/// pull records and credential lookups.
pub fn trim_image_tag_digest(image: &str) -> Result<String, ImageNameError> {
    parse_image_name(image).map(|(repo, _, _)| repo)
}

/// Same as [`trim_image_tag_digest`].
pub fn repository_of(image: &str) -> Result<String, ImageNameError> {
    trim_image_tag_digest(image)
}

/// Whether `a` and `b` name the same image once normalised, as the
/// kubelet's `ParseImageName` reads them (`nginx`, `nginx:latest` and
/// `docker.io/library/nginx:latest` are one image). A name that does not
/// parse is the same only as itself.
pub fn same_image(a: &str, b: &str) -> bool {
    a == b || matches!((parse_image_name(a), parse_image_name(b)), (Ok(x), Ok(y)) if x == y)
}

#[cfg(test)]
mod tests;
