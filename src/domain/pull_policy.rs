//! Image pull policies and the API server's defaulting of an empty one.

use std::fmt;
use std::str::FromStr;

use super::go_text::quote;
use super::reference::{DEFAULT_TAG, parse_image_name};

/// When to pull an image (a container's `imagePullPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PullPolicy {
    /// Always pull (the registry decides whether anything changed).
    Always,
    /// Pull only if the image is not present.
    IfNotPresent,
    /// Never pull; fail if the image is not present.
    Never,
    /// imaged's addition, not a Kubernetes value: pull like `Always`, but
    /// when the registry cannot be reached and the image is present, use
    /// the local image.
    AlwaysWithLocalFallback,
}

impl PullPolicy {
    /// Every policy, Kubernetes' three first.
    pub const ALL: [PullPolicy; 4] =
        [PullPolicy::Always, PullPolicy::IfNotPresent, PullPolicy::Never, PullPolicy::AlwaysWithLocalFallback];

    /// The policy's name as written in a pod spec or configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            PullPolicy::Always => "Always",
            PullPolicy::IfNotPresent => "IfNotPresent",
            PullPolicy::Never => "Never",
            PullPolicy::AlwaysWithLocalFallback => "AlwaysWithLocalFallback",
        }
    }

    /// Whether this is one of Kubernetes' own values (`Always`,
    /// `IfNotPresent`, `Never`), i.e. not an imaged extension.
    pub fn is_kubernetes(self) -> bool {
        !matches!(self, PullPolicy::AlwaysWithLocalFallback)
    }
}

impl fmt::Display for PullPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pull policy name that is not one of the known ones (names are
/// case-sensitive, as in Kubernetes). `Display`:
/// `unknown pull policy "<value>": must be one of Always, IfNotPresent, Never, AlwaysWithLocalFallback`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown pull policy {}: must be one of Always, IfNotPresent, Never, AlwaysWithLocalFallback", quote(.0))]
pub struct UnknownPullPolicy(pub String);

impl FromStr for PullPolicy {
    type Err = UnknownPullPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PullPolicy::ALL.into_iter().find(|p| p.as_str() == s).ok_or_else(|| UnknownPullPolicy(s.to_string()))
    }
}

/// The API server's defaulting of an empty pull policy (core/v1
/// `SetDefaults_Container`, also used for image volumes): the tag from the
/// kubelet's `ParseImageName`, parse errors ignored (the tag is then empty);
/// `latest`, written or implied by the absence of both tag and digest, gives
/// `Always`; anything else gives `IfNotPresent` — including a digest-only
/// image and an image that does not parse (validation rejects those).
pub fn default_pull_policy(image: &str) -> PullPolicy {
    match parse_image_name(image) {
        Ok((_, tag, _)) if tag == DEFAULT_TAG => PullPolicy::Always,
        _ => PullPolicy::IfNotPresent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:7cc4b5aefd1d0cadf8d97d4350462ba51c694ebca145b08d7d41b41acc8db5aa";

    #[test]
    fn defaulting_follows_the_api_server() {
        let table: Vec<(String, PullPolicy)> = vec![
            ("busybox".into(), PullPolicy::Always),
            ("busybox:latest".into(), PullPolicy::Always),
            ("docker.io/library/busybox".into(), PullPolicy::Always),
            ("localhost:5000/app".into(), PullPolicy::Always),
            ("busybox:1.36".into(), PullPolicy::IfNotPresent),
            ("busybox:Latest".into(), PullPolicy::IfNotPresent),
            ("busybox:latest-alpine".into(), PullPolicy::IfNotPresent),
            ("registry.k8s.io/pause:3.10".into(), PullPolicy::IfNotPresent),
            ("localhost:5000/app:5000".into(), PullPolicy::IfNotPresent),
            (format!("busybox@{DIGEST}"), PullPolicy::IfNotPresent),
            (format!("busybox:latest@{DIGEST}"), PullPolicy::Always),
            (format!("busybox:1@{DIGEST}"), PullPolicy::IfNotPresent),
            // Unparsable images: the error is ignored, no tag → IfNotPresent.
            ("Not/Valid".into(), PullPolicy::IfNotPresent),
            ("BUSYBOX".into(), PullPolicy::IfNotPresent),
            (String::new(), PullPolicy::IfNotPresent),
            ("http://example.com/x".into(), PullPolicy::IfNotPresent),
            (format!("busybox@sha256:{}", &DIGEST[7..40]), PullPolicy::IfNotPresent),
        ];
        for (image, want) in table {
            assert_eq!(default_pull_policy(&image), want, "{image:?}");
        }
    }

    #[test]
    fn names_parse_and_print() {
        for p in PullPolicy::ALL {
            assert_eq!(p.as_str().parse::<PullPolicy>(), Ok(p));
            assert_eq!(p.to_string(), p.as_str());
        }
        assert!(PullPolicy::Never.is_kubernetes() && !PullPolicy::AlwaysWithLocalFallback.is_kubernetes());
        let table = [
            (
                "always",
                "unknown pull policy \"always\": must be one of Always, IfNotPresent, Never, AlwaysWithLocalFallback",
            ),
            ("", "unknown pull policy \"\": must be one of Always, IfNotPresent, Never, AlwaysWithLocalFallback"),
            (
                " Never",
                "unknown pull policy \" Never\": must be one of Always, IfNotPresent, Never, AlwaysWithLocalFallback",
            ),
            (
                "If\nNotPresent",
                "unknown pull policy \"If\\nNotPresent\": must be one of Always, IfNotPresent, Never, AlwaysWithLocalFallback",
            ),
        ];
        for (input, text) in table {
            let err = input.parse::<PullPolicy>().map_err(|e| e.to_string());
            assert_eq!(err, Err(text.to_string()), "{input:?}");
        }
    }
}
