//! The kubelet's `BasicDockerKeyring`: registry keys normalised on insert,
//! looked up most specific first with per-label host globs, equal ports and
//! path prefixes, and a Docker Hub fallback to `index.docker.io`.
//!
//! Keys and image names are parsed the way Go's `net/url` parses
//! `https://<text>` (a small hand parser covering what the kubelet relies
//! on, in `url.rs`), host labels are matched with Go's `filepath.Match`
//! semantics (`glob.rs`). The credentials themselves are in `credential.rs`.

mod credential;
mod glob;
mod url;

use std::collections::BTreeMap;

pub use credential::{Credential, CredentialSource};
pub use glob::glob_match;
pub use url::UrlError;
use url::{parse_url, redact_userinfo, split_host_port};

/// The registry host the kubelet falls back to for Docker Hub images.
pub const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

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
        cred.key.clone_from(&key);
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

    /// Tags every credential with the service account whose token obtained
    /// it (a credential plugin in token mode).
    pub fn tag_service_account(&mut self, sa: &crate::domain::pull_record::ImagePullServiceAccount) {
        for cred in self.creds.values_mut().flatten() {
            cred.service_account = Some(sa.clone());
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

#[cfg(test)]
mod tests;
