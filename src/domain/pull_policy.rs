//! Image pull policies and the API server's defaulting of an empty one.

use std::fmt;
use std::str::FromStr;

use super::reference::parse_image_name;

/// When to pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PullPolicy {
    /// Always pull (the registry decides whether anything changed).
    Always,
    /// Pull only if the image is not present.
    IfNotPresent,
    /// Never pull; fail if the image is not present.
    Never,
    /// imaged's addition: pull like `Always`, but when the registry cannot
    /// be reached and the image is present, use the local image.
    AlwaysWithLocalFallback,
}

impl PullPolicy {
    /// The policy's name as written in a pod spec.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
            PullPolicy::AlwaysWithLocalFallback => "AlwaysWithLocalFallback",
        }
    }
}

impl fmt::Display for PullPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pull policy name that is not one of the known ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown pull policy {0:?}: use Always, IfNotPresent, Never or AlwaysWithLocalFallback")]
pub struct UnknownPullPolicy(pub String);

impl FromStr for PullPolicy {
    type Err = UnknownPullPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "Always" => Ok(PullPolicy::Always),
            "IfNotPresent" => Ok(PullPolicy::IfNotPresent),
            "Never" => Ok(PullPolicy::Never),
            "AlwaysWithLocalFallback" => Ok(PullPolicy::AlwaysWithLocalFallback),
            other => Err(UnknownPullPolicy(other.to_string())),
        }
    }
}

/// The API server's defaulting of an empty pull policy
/// (`SetDefaults_Container`): `Always` when the tag is `latest` (written or
/// implied), otherwise `IfNotPresent` (so a digest-only image is
/// `IfNotPresent`). A name that does not parse has no tag, so it gets
/// `IfNotPresent`: upstream ignores the error (validation reports it).
pub fn default_pull_policy(image: &str) -> PullPolicy {
    let tag = parse_image_name(image).map(|(_, tag, _)| tag).unwrap_or_default();
    if tag == "latest" { PullPolicy::Always } else { PullPolicy::IfNotPresent }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaulting_follows_the_api_server() {
        let d = "sha256:7cc4b5aefd1d0cadf8d97d4350462ba51c694ebca145b08d7d41b41acc8db5aa";
        let table = [
            ("busybox", PullPolicy::Always),
            ("busybox:latest", PullPolicy::Always),
            ("busybox:1.36", PullPolicy::IfNotPresent),
            ("registry.k8s.io/pause:3.10", PullPolicy::IfNotPresent),
        ];
        for (image, want) in table {
            assert_eq!(default_pull_policy(image), want, "{image}");
        }
        assert_eq!(default_pull_policy(&format!("busybox@{d}")), PullPolicy::IfNotPresent);
        assert_eq!(default_pull_policy(&format!("busybox:latest@{d}")), PullPolicy::Always);
        assert_eq!(default_pull_policy("Not/Valid"), PullPolicy::IfNotPresent);
    }

    #[test]
    fn names_parse_and_print() {
        for p in [PullPolicy::Always, PullPolicy::IfNotPresent, PullPolicy::Never, PullPolicy::AlwaysWithLocalFallback]
        {
            assert_eq!(p.as_str().parse::<PullPolicy>(), Ok(p));
        }
        let e = "always".parse::<PullPolicy>().unwrap_err();
        assert!(e.to_string().contains("\"always\""));
    }
}
