//! What image garbage collection may do: the kubelet's policy (thresholds,
//! minimum and maximum age, with its validation texts) and imaged's own
//! protection rules (pinned patterns, the sandbox image, per-repository
//! retention), with a matcher that names the rule that protected an image.

use std::time::Duration;

use crate::domain::go_text;

#[cfg(test)]
mod tests;

/// The kubelet's `ImageGCPolicy`: the disk-usage band GC keeps the image
/// filesystem in, and the ages that hold or force a deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcPolicy {
    /// `imageGCHighThresholdPercent`: usage at or above this starts a
    /// free-space pass (0–100).
    pub high_threshold_percent: i64,
    /// `imageGCLowThresholdPercent`: the free-space pass frees down to this
    /// usage (0–100, below the high threshold).
    pub low_threshold_percent: i64,
    /// `imageMinimumGCAge`: an image first seen less than this long ago is
    /// never deleted for space (it may have just been pulled for a pod).
    pub min_age: Duration,
    /// `imageMaximumGCAge`: unused images older than this are deleted
    /// whatever the usage; zero turns the max-age pass off.
    pub max_age: Duration,
}

impl Default for GcPolicy {
    /// The kubelet's defaults: 85 %, 80 %, 2m, off.
    fn default() -> Self {
        Self {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: Duration::ZERO,
        }
    }
}

/// As operators read it in the logs: `high 85%, low 80%, min age 2m0s,
/// max age off` (Go duration text, as the kubelet's configuration).
impl std::fmt::Display for GcPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "high {}%, low {}%, min age {}, max age ",
            self.high_threshold_percent,
            self.low_threshold_percent,
            go_text::duration(self.min_age)
        )?;
        if self.max_age.is_zero() { f.write_str("off") } else { f.write_str(&go_text::duration(self.max_age)) }
    }
}

impl GcPolicy {
    /// Checks the policy as the kubelet's configuration validation does,
    /// returning every failure with its exact text, in the kubelet's order.
    /// (A negative max age, which the kubelet also rejects, cannot be
    /// represented by a [`Duration`].)
    ///
    /// # Errors
    ///
    /// Every failed check's message.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let (high, low) = (self.high_threshold_percent, self.low_threshold_percent);
        let mut errors = Vec::new();
        if !(0..=100).contains(&high) {
            errors.push(format!(
                "invalid configuration: imageGCHighThresholdPercent (--image-gc-high-threshold) {high} must be between 0 and 100, inclusive"
            ));
        }
        if !(0..=100).contains(&low) {
            errors.push(format!(
                "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be between 0 and 100, inclusive"
            ));
        }
        if low >= high {
            errors.push(format!(
                "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) {low} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {high}"
            ));
        }
        if !self.max_age.is_zero() && self.max_age <= self.min_age {
            errors.push(format!(
                "invalid configuration: imageMaximumGCAge {} must be greater than imageMinimumGCAge {}",
                go_text::duration(self.max_age),
                go_text::duration(self.min_age)
            ));
        }
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }

    /// GC is off entirely: the high threshold is 100 and there is no max age
    /// (the kubelet then never starts its GC loop).
    pub fn is_disabled(&self) -> bool {
        self.high_threshold_percent == 100 && self.max_age.is_zero()
    }
}

/// imaged's protection and retention rules, applied on top of the kubelet's
/// (in use, pinned by the runtime).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProtectionRules {
    /// Patterns of images GC never deletes, matched against every repo tag
    /// and repo digest: an exact reference (`registry.k8s.io/pause:3.10`),
    /// `repo:*` (every tag or digest of one repository), or `prefix/*`
    /// (everything under a registry or path prefix). References are compared
    /// as the runtime reports them; normalising `nginx` to
    /// `docker.io/library/nginx` is the caller's job.
    pub pinned_images: Vec<String>,
    /// The image id the sandbox (pause) image resolved to; protected by id,
    /// not by name.
    pub sandbox_image_id: Option<String>,
    /// Retention: per repository, keep only the newest N unused images (by
    /// first detection); older ones are deleted. `None` = off.
    pub keep_newest_tags_per_repo: Option<usize>,
}

/// Why [`ProtectionRules`] protect an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection<'r> {
    /// The image is the sandbox image (by id).
    SandboxImage,
    /// A `pinned_images` pattern matched one of its references; the pattern.
    PinnedByRule(&'r str),
}

impl ProtectionRules {
    /// Whether the rules protect an image with this id and these references,
    /// and by which rule: the sandbox image id first, then the first
    /// `pinned_images` pattern (in configuration order) that matches any
    /// tag or digest.
    pub fn protection(&self, id: &str, repo_tags: &[String], repo_digests: &[String]) -> Option<Protection<'_>> {
        if self.sandbox_image_id.as_deref() == Some(id) {
            return Some(Protection::SandboxImage);
        }
        self.pinned_by(repo_tags, repo_digests).map(Protection::PinnedByRule)
    }

    /// The first `pinned_images` pattern that matches any of the references.
    pub fn pinned_by(&self, repo_tags: &[String], repo_digests: &[String]) -> Option<&str> {
        self.pinned_images
            .iter()
            .map(String::as_str)
            .find(|pattern| repo_tags.iter().chain(repo_digests).any(|reference| pattern_matches(pattern, reference)))
    }
}

/// Whether a `pinned_images` pattern matches one image reference (a repo
/// tag `repo:tag` or a repo digest `repo@sha256:…`):
///
/// - `prefix/*`: the reference starts with `prefix/`;
/// - `repo:*`: the reference is `repo:<tag>` or `repo@<digest>` for exactly
///   that repository (not `repo-other:…`, not `repo/sub:…`);
/// - anything else: the reference equals the pattern.
pub fn pattern_matches(pattern: &str, reference: &str) -> bool {
    if let Some(prefix) = pattern.strip_suffix("/*") {
        return reference.len() > prefix.len() + 1
            && reference.starts_with(prefix)
            && reference.as_bytes().get(prefix.len()) == Some(&b'/');
    }
    if let Some(repo) = pattern.strip_suffix(":*") {
        let Some(rest) = reference.strip_prefix(repo) else { return false };
        if let Some(tag) = rest.strip_prefix(':') {
            return !tag.is_empty() && !tag.contains('/') && !tag.contains('@');
        }
        if let Some(digest) = rest.strip_prefix('@') {
            return !digest.is_empty();
        }
        return false;
    }
    pattern == reference
}

/// The repository of a reference: the reference without its `:tag` and
/// `@digest` (`registry:5000/ns/app:v1` → `registry:5000/ns/app`).
pub fn repository_of(reference: &str) -> &str {
    let name = reference.split_once('@').map_or(reference, |(name, _)| name);
    match name.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => name,
    }
}
