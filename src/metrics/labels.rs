//! Label values: the kubelet's size ranges and tri-states, pull policies,
//! back-off reset reasons.

use crate::domain::pull_policy::PullPolicy;

/// The kubelet's `image_size_in_bytes` label for an image of `size` bytes:
/// `N/A` for 0 (size unknown), else the range it falls in (MB and GB are
/// 2^20 and 2^30 bytes; a size exactly on a boundary belongs to the lower range).
pub fn image_size_bucket(size: u64) -> &'static str {
    const MB: u64 = 1 << 20;
    const GB: u64 = 1 << 30;
    const RANGES: [(u64, &str); 12] = [
        (100 * GB, "GT100GB"),
        (60 * GB, "60GB-100GB"),
        (40 * GB, "40GB-60GB"),
        (30 * GB, "30GB-40GB"),
        (20 * GB, "20GB-30GB"),
        (10 * GB, "10GB-20GB"),
        (5 * GB, "5GB-10GB"),
        (GB, "1GB-5GB"),
        (500 * MB, "500MB-1GB"),
        (100 * MB, "100MB-500MB"),
        (10 * MB, "10MB-100MB"),
        (0, "0-10MB"),
    ];
    if size == 0 {
        return "N/A";
    }
    RANGES.iter().find(|(lower, _)| size > *lower).map_or("0-10MB", |(_, label)| label)
}

/// A tri-state label value (`true`, `false`, `unknown`) as the kubelet's
/// `present_locally` and `pull_required` use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tristate {
    /// Not determined (the request ended before it was known).
    #[default]
    Unknown,
    /// Yes.
    True,
    /// No.
    False,
}

impl Tristate {
    pub(super) fn index(self) -> usize {
        self as usize
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Tristate::Unknown => "unknown",
            Tristate::True => "true",
            Tristate::False => "false",
        }
    }
}

impl From<bool> for Tristate {
    fn from(b: bool) -> Self {
        if b { Tristate::True } else { Tristate::False }
    }
}

/// `pull_policy` label values, indexed as [`policy_index`].
pub(super) const POLICY_LABELS: [&str; 4] = ["always", "ifnotpresent", "never", "alwayswithlocalfallback"];

pub(super) fn policy_index(policy: PullPolicy) -> usize {
    match policy {
        PullPolicy::Always => 0,
        PullPolicy::IfNotPresent => 1,
        PullPolicy::Never => 2,
        PullPolicy::AlwaysWithLocalFallback => 3,
    }
}

/// Why the CRI front refused a `RemoveImage`
/// (`imaged_cri_front_removes_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoveRefused {
    /// Pinned, with `cri_server.refuse_remove_pinned`.
    Pinned,
    /// Given to a pod within the minimum age, with
    /// `cri_server.refuse_remove_in_use`.
    InUse,
    /// A pull of one of its names in flight, with
    /// `cri_server.refuse_remove_in_use`.
    Pulling,
}

impl RemoveRefused {
    /// Every reason, in index order.
    pub const ALL: [Self; 3] = [Self::Pinned, Self::InUse, Self::Pulling];

    /// The `reason` label value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pinned => "pinned",
            Self::InUse => "in_use",
            Self::Pulling => "pulling",
        }
    }
}

/// Why back-offs ended before their time (`imaged_backoff_resets_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackoffResetReason {
    /// An operator's `ClearBackoff`.
    Cleared,
    /// The pod's credentials changed since its last failed pull.
    CredentialsChanged,
    /// A pull from the registry its transient failure waited for succeeded.
    RegistryRecovered,
}

impl BackoffResetReason {
    /// The `reason` label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Cleared => "cleared",
            Self::CredentialsChanged => "credentials_changed",
            Self::RegistryRecovered => "registry_recovered",
        }
    }
}
