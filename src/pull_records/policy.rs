//! The kubelet's `imagePullCredentialsVerificationPolicy` and its
//! `preloadedImagesVerificationAllowlist` (reference §8.1).

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use crate::domain::reference::parse_normalized_named;

/// When a present image needs the pod's credentials checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum VerificationPolicy {
    /// Never: any pod may use any present image (the behaviour before KEP-2535).
    NeverVerify,
    /// Images pulled by imaged are verified; images found on the node that
    /// imaged never pulled (preloaded) are not. The default.
    #[default]
    NeverVerifyPreloadedImages,
    /// Like [`NeverVerifyPreloadedImages`](Self::NeverVerifyPreloadedImages),
    /// but only preloaded images matching the allowlist are exempt.
    NeverVerifyAllowlistedImages,
    /// Every image, preloaded or not.
    AlwaysVerify,
}

impl VerificationPolicy {
    /// The kubelet's name of the policy.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NeverVerify => "NeverVerify",
            Self::NeverVerifyPreloadedImages => "NeverVerifyPreloadedImages",
            Self::NeverVerifyAllowlistedImages => "NeverVerifyAllowlistedImages",
            Self::AlwaysVerify => "AlwaysVerify",
        }
    }
}

impl fmt::Display for VerificationPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy name that is not one of the four (the kubelet's text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown image pull credential verification policy: {0}")]
pub struct UnknownPolicy(pub String);

impl FromStr for VerificationPolicy {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "NeverVerify" => Ok(Self::NeverVerify),
            "NeverVerifyPreloadedImages" => Ok(Self::NeverVerifyPreloadedImages),
            "NeverVerifyAllowlistedImages" => Ok(Self::NeverVerifyAllowlistedImages),
            "AlwaysVerify" => Ok(Self::AlwaysVerify),
            other => Err(UnknownPolicy(other.to_string())),
        }
    }
}

/// An allowlist pattern that is not valid (the kubelet's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AllowlistError(pub String);

/// The `preloadedImagesVerificationAllowlist`: exact normalised repository
/// names (`docker.io/library/nginx`) and prefixes (`registry.example.com/team/*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    exact: HashSet<String>,
    prefixes: Vec<String>,
}

impl Allowlist {
    /// Validates `patterns` with the kubelet's rules and texts: no leading or
    /// trailing spaces; `*` only as a final `/*`; a wildcard needs at least a
    /// registry host; an exact pattern must be a normalised repository name
    /// with neither tag nor digest.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, AllowlistError> {
        let mut list = Self::default();
        for p in patterns {
            let p = p.as_ref();
            match allowlist_pattern(p)? {
                (prefix, true) => list.prefixes.push(prefix),
                (exact, false) => {
                    list.exact.insert(exact);
                }
            }
        }
        Ok(list)
    }

    /// True when no pattern is set.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }

    /// Whether the normalised repository `repo` (`docker.io/library/nginx`)
    /// matches: equal to an exact pattern, or starting with a prefix (which
    /// keeps its trailing `/`).
    pub fn matches(&self, repo: &str) -> bool {
        self.exact.contains(repo) || self.prefixes.iter().any(|p| repo.starts_with(p.as_str()))
    }
}

/// The kubelet's `getAllowlistImagePattern`: (pattern without the final
/// `*`, is a wildcard).
fn allowlist_pattern(pattern: &str) -> Result<(String, bool), AllowlistError> {
    if pattern != pattern.trim() {
        return Err(AllowlistError(format!("leading/trailing spaces are not allowed: {pattern}")));
    }
    let wildcard = pattern.ends_with("/*");
    let trimmed = if wildcard { &pattern[..pattern.len() - 1] } else { pattern };
    if trimmed.is_empty() {
        return Err(AllowlistError(format!("the supplied pattern is too short: {pattern}")));
    }
    if trimmed.contains('*') {
        return Err(AllowlistError(format!(
            "not a valid wildcard pattern, only patterns ending with '/*' are allowed: {pattern}"
        )));
    }
    if wildcard {
        if trimmed.len() == 1 {
            return Err(AllowlistError("at least registry hostname is required".into()));
        }
        return Ok((trimmed.to_string(), true));
    }
    let named = parse_normalized_named(trimmed)
        .map_err(|e| AllowlistError(format!("failed to parse as an image name: {e}")))?;
    if trimmed != named.name() {
        return Err(AllowlistError(format!("neither tag nor digest is accepted in an image reference: {pattern}")));
    }
    Ok((trimmed.to_string(), false))
}

/// The policy with its allowlist: decides whether a present image needs
/// the pod's credentials checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyPolicy {
    /// The policy.
    pub policy: VerificationPolicy,
    /// The allowlist (used by `NeverVerifyAllowlistedImages` only).
    pub allowlist: Allowlist,
}

impl VerifyPolicy {
    /// A policy without an allowlist.
    pub fn new(policy: VerificationPolicy) -> Self {
        Self { policy, allowlist: Allowlist::default() }
    }

    /// The kubelet's `RequireCredentialVerificationForImage`. `repo` is the
    /// image's normalised repository (`None` when it does not parse: then
    /// the allowlist cannot exempt it). `pulled_by_kubelet`: a pulled record
    /// or a pull intent exists for it.
    ///
    /// Deliberate difference: under `NeverVerifyAllowlistedImages` an
    /// allowlisted image is exempt only while imaged never pulled it (the
    /// allowlist names *preloaded* images); once a pod pulled it with a
    /// secret, other pods must show their credentials, as for any pulled
    /// image. The kubelet (1.35) exempts allowlisted images outright.
    pub fn requires_verification(&self, repo: Option<&str>, pulled_by_kubelet: bool) -> bool {
        match self.policy {
            VerificationPolicy::NeverVerify => false,
            VerificationPolicy::AlwaysVerify => true,
            VerificationPolicy::NeverVerifyPreloadedImages => pulled_by_kubelet,
            VerificationPolicy::NeverVerifyAllowlistedImages => {
                pulled_by_kubelet || !repo.is_some_and(|r| self.allowlist.matches(r))
            }
        }
    }
}
