//! Image references: the docker/distribution reference grammar, its
//! normalisation (`ParseNormalizedNamed`), and the kubelet's `ParseImageName`
//! and `applyDefaultImageTag`, with the upstream error texts.
//!
//! The grammar is expressed with the same regular expressions upstream uses
//! (RE2 semantics in Go; the `regex` crate has the same semantics), built
//! from the same productions:
//!
//! ```text
//! reference  := name [ ":" tag ] [ "@" digest ]
//! name       := [domain '/'] remote-name
//! domain     := host [':' port-number]
//! remote-name:= path-component ['/' path-component]*
//! path-component := [a-z0-9]+ (separator [a-z0-9]+)*     separator := [._] | __ | -+
//! tag        := [\w][\w.-]{0,127}
//! digest     := algorithm ":" hex{32,}
//! ```

use std::fmt;
use std::sync::LazyLock;

use regex::Regex;

use super::gofmt::quote;

/// Docker Hub's canonical domain.
pub const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
const OFFICIAL_REPO_PREFIX: &str = "library/";
/// The tag used when a reference has neither tag nor digest.
pub const DEFAULT_TAG: &str = "latest";
/// Longest repository path upstream accepts.
pub const NAME_TOTAL_LENGTH_MAX: usize = 255;

const ALPHANUMERIC: &str = "[a-z0-9]+";
const SEPARATOR: &str = "(?:[._]|__|[-]+)";
const DOMAIN_NAME_COMPONENT: &str = "(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])";
const OPTIONAL_PORT: &str = "(?::[0-9]+)?";
// Go's \w is ASCII only.
const TAG: &str = "[0-9A-Za-z_][0-9A-Za-z_.-]{0,127}";
const DIGEST: &str = "[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][[:xdigit:]]{32,}";
const IPV6: &str = r"\[(?:[a-fA-F0-9:]+)\]";

fn domain_and_port() -> String {
    let domain_name = format!(r"{DOMAIN_NAME_COMPONENT}(?:\.{DOMAIN_NAME_COMPONENT})*");
    format!("(?:{domain_name}|{IPV6}){OPTIONAL_PORT}")
}

fn remote_name() -> String {
    let path_component = format!("{ALPHANUMERIC}(?:{SEPARATOR}{ALPHANUMERIC})*");
    format!("{path_component}(?:/{path_component})*")
}

#[allow(clippy::expect_used)] // the patterns are constants: a failure is a bug caught by every test
fn compile(p: &str) -> Regex {
    Regex::new(p).expect("reference grammar pattern compiles")
}

static REFERENCE: LazyLock<Regex> = LazyLock::new(|| {
    let name = format!("(?:{}/)?{}", domain_and_port(), remote_name());
    compile(&format!("^({name})(?::({TAG}))?(?:@({DIGEST}))?$"))
});
static ANCHORED_NAME: LazyLock<Regex> =
    LazyLock::new(|| compile(&format!("^(?:({})/)?({})$", domain_and_port(), remote_name())));
static IDENTIFIER: LazyLock<Regex> = LazyLock::new(|| compile("^[a-f0-9]{64}$"));

/// Why a reference does not parse. `Display` is upstream's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// `invalid reference format`.
    #[error("invalid reference format")]
    InvalidFormat,
    /// `repository name must be lowercase`.
    #[error("repository name must be lowercase")]
    NameContainsUppercase,
    /// `invalid reference format: repository name (<name>) must be lowercase`.
    #[error("invalid reference format: repository name ({0}) must be lowercase")]
    RemoteNameNotLowercase(String),
    /// `repository name must have at least one component`.
    #[error("repository name must have at least one component")]
    NameEmpty,
    /// `repository name must not be more than 255 characters`.
    #[error("repository name must not be more than 255 characters")]
    NameTooLong,
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

/// A parsed, normalised, named reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Named {
    domain: String,
    path: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl Named {
    /// Registry domain (`docker.io`, `localhost:5000`).
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// Repository path (`library/busybox`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Full repository name (`docker.io/library/busybox`).
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }

    /// The tag, if any.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The digest (`sha256:…`), if any.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// The short form Docker shows (`busybox:1.36`, `user/app`).
    pub fn familiar(&self) -> String {
        let mut path = self.path.as_str();
        let mut out = String::new();
        if self.domain == DEFAULT_DOMAIN {
            if let Some(rest) = path.strip_prefix(OFFICIAL_REPO_PREFIX)
                && !rest.contains('/')
            {
                path = rest;
            }
        } else {
            out.push_str(&self.domain);
            out.push('/');
        }
        out.push_str(path);
        self.push_suffix(&mut out);
        out
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

    /// containerd's `ParseDockerRef` form: `name:tag`, `name@digest` (a
    /// reference with both keeps only the digest), `name:latest` otherwise.
    pub fn docker_ref(&self) -> String {
        match (&self.tag, &self.digest) {
            (_, Some(d)) => format!("{}@{d}", self.name()),
            (Some(t), None) => format!("{}:{t}", self.name()),
            (None, None) => format!("{}:{DEFAULT_TAG}", self.name()),
        }
    }
}

impl fmt::Display for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = self.name();
        self.push_suffix(&mut s);
        f.write_str(&s)
    }
}

/// go-digest's `Digest.Validate` for the algorithms the kubelet registers.
fn validate_digest(d: &str) -> Result<(), ReferenceError> {
    let Some((alg, hex)) = d.split_once(':').filter(|(a, h)| !a.is_empty() && !h.is_empty()) else {
        return Err(ReferenceError::DigestInvalidFormat);
    };
    let size = match alg {
        "sha256" => 32,
        "sha384" => 48,
        "sha512" => 64,
        _ => return Err(ReferenceError::DigestUnsupported),
    };
    if hex.len() != size * 2 {
        return Err(ReferenceError::DigestInvalidLength);
    }
    if !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(ReferenceError::DigestInvalidFormat);
    }
    Ok(())
}

/// Upstream `Parse`: a reference with a name (digest-only references are
/// not names and fail with `NameEmpty`).
pub fn parse(s: &str) -> Result<Named, ReferenceError> {
    if s.is_empty() {
        return Err(ReferenceError::NameEmpty);
    }
    let Some(caps) = REFERENCE.captures(s) else {
        let lower = s.to_lowercase();
        if lower != s && REFERENCE.is_match(&lower) {
            return Err(ReferenceError::NameContainsUppercase);
        }
        return Err(ReferenceError::InvalidFormat);
    };
    let name = caps.get(1).map_or("", |m| m.as_str());
    let (domain, path) = match ANCHORED_NAME.captures(name) {
        Some(n) => (n.get(1).map_or("", |m| m.as_str()), n.get(2).map_or(name, |m| m.as_str())),
        None => ("", name),
    };
    if path.len() > NAME_TOTAL_LENGTH_MAX {
        return Err(ReferenceError::NameTooLong);
    }
    let digest = caps.get(3).map(|m| m.as_str().to_string());
    if let Some(d) = &digest {
        validate_digest(d)?;
    }
    Ok(Named {
        domain: domain.to_string(),
        path: path.to_string(),
        tag: caps.get(2).map(|m| m.as_str().to_string()),
        digest,
    })
}

/// Upstream `splitDockerDomain`.
fn split_docker_domain(name: &str) -> (String, String) {
    let (domain, remote) = match name.split_once('/') {
        None => return (DEFAULT_DOMAIN.to_string(), format!("{OFFICIAL_REPO_PREFIX}{name}")),
        Some((d, _)) if d == "localhost" => (d.to_string(), name[d.len() + 1..].to_string()),
        Some((d, r)) if d == LEGACY_DEFAULT_DOMAIN => (DEFAULT_DOMAIN.to_string(), r.to_string()),
        Some((d, r)) if d.contains(['.', ':']) => (d.to_string(), r.to_string()),
        Some((d, r)) if d.to_lowercase() != d => (d.to_string(), r.to_string()),
        Some(_) => (DEFAULT_DOMAIN.to_string(), name.to_string()),
    };
    if domain == DEFAULT_DOMAIN && !remote.contains('/') {
        return (domain, format!("{OFFICIAL_REPO_PREFIX}{remote}"));
    }
    (domain, remote)
}

/// Upstream `ParseNormalizedNamed`: parses a familiar or full reference into
/// its normalised form (`busybox` → `docker.io/library/busybox`).
pub fn parse_normalized_named(s: &str) -> Result<Named, ReferenceError> {
    if IDENTIFIER.is_match(s) {
        return Err(ReferenceError::HexIdentifier(s.to_string()));
    }
    let (domain, remainder) = split_docker_domain(s);
    let remote = match remainder.find(':') {
        Some(i) => &remainder[..i],
        None => remainder.as_str(),
    };
    if remote.to_lowercase() != remote {
        return Err(ReferenceError::RemoteNameNotLowercase(remote.to_string()));
    }
    parse(&format!("{domain}/{remainder}"))
}

/// The kubelet's `ParseImageName` failure: `couldn't parse image name "<s>": <err>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("couldn't parse image name {}: {source}", quote(.image))]
pub struct ImageNameError {
    /// The image as given.
    pub image: String,
    /// The grammar's error.
    pub source: ReferenceError,
}

/// The kubelet's `ParseImageName`: (repository, tag, digest); the tag is
/// `latest` when neither tag nor digest is given.
pub fn parse_image_name(image: &str) -> Result<(String, String, String), ImageNameError> {
    let named = parse_normalized_named(image).map_err(|source| ImageNameError { image: image.to_string(), source })?;
    let tag = named.tag().unwrap_or_default().to_string();
    let digest = named.digest().unwrap_or_default().to_string();
    let tag = if tag.is_empty() && digest.is_empty() { DEFAULT_TAG.to_string() } else { tag };
    Ok((named.name(), tag, digest))
}

/// The kubelet's `applyDefaultImageTag`: appends `:latest` to the image *as
/// written* when it has neither tag nor digest (it does not fully qualify it).
pub fn apply_default_image_tag(image: &str) -> Result<String, ImageNameError> {
    let (_, tag, digest) = parse_image_name(image)?;
    if digest.is_empty() && !tag.is_empty() && !image.ends_with(&format!(":{tag}")) {
        return Ok(format!("{image}:{tag}"));
    }
    Ok(image.to_string())
}

/// The normalised repository without tag or digest (the kubelet's
/// pull-record key, `trimImageTagDigest`).
pub fn repository_of(image: &str) -> Result<String, ImageNameError> {
    parse_image_name(image).map(|(repo, _, _)| repo)
}

#[cfg(test)]
mod tests;
