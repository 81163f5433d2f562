//! Pulled records and the kubelet's rules for merging credentials into them
//! (reference §8.2, §8.3). Pure: no I/O, no clock (the caller passes `now`).

use std::collections::BTreeMap;
use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// Most secrets recorded per repository by a must-pull check that matched a
/// pod's secret by hash (the kubelet's cap on "write while matching").
pub const MAX_SECRETS_WRITTEN_WHILE_MATCHING: usize = 100;

/// A pull secret that was used (or accepted) for an image: its coordinates
/// and the hash of the credential ([`crate::credentials::Credential::auth_config_hash`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePullSecret {
    /// The secret's `metadata.uid`.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// SHA-256 hex of the credential (never the credential itself).
    pub credential_hash: String,
}

/// A service account whose token obtained the credentials (credential
/// plugins in service-account mode).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePullServiceAccount {
    /// The service account's `metadata.uid`.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// Who may use an image of one repository without pulling it again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePullCredentials {
    /// Pods presenting one of these secrets (same coordinates or same hash).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_secrets: Vec<ImagePullSecret>,
    /// Pods running as one of these service accounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_service_accounts: Vec<ImagePullServiceAccount>,
    /// Every pod: the image was pulled anonymously or with node credentials.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_pods_accessible: bool,
}

impl ImagePullCredentials {
    /// Nothing recorded (the kubelet treats it like no credentials at all).
    pub fn is_empty(&self) -> bool {
        !self.node_pods_accessible && self.kubernetes_secrets.is_empty() && self.kubernetes_service_accounts.is_empty()
    }

    /// Credentials of a pull made without credentials or with node-level ones.
    pub fn node_accessible() -> Self {
        Self { node_pods_accessible: true, ..Self::default() }
    }

    /// Credentials of a pull made with one pull secret.
    pub fn secret(secret: ImagePullSecret) -> Self {
        Self { kubernetes_secrets: vec![secret], ..Self::default() }
    }

    /// Credentials of a pull made with service-account-bound plugin credentials.
    pub fn service_account(sa: ImagePullServiceAccount) -> Self {
        Self { kubernetes_service_accounts: vec![sa], ..Self::default() }
    }
}

/// The kubelet's `ImagePulledRecord`: an image (by its image ref) and, per
/// normalised repository, who may use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PulledRecord {
    /// When the record last changed, or its image was last pulled.
    pub last_updated_time: SystemTime,
    /// The image ref (image id) the runtime returned for the pull.
    pub image_ref: String,
    /// Normalised repository (`docker.io/library/nginx`) → credentials.
    pub credential_mapping: BTreeMap<String, ImagePullCredentials>,
}

/// The kubelet's `RecordImagePulled` merge: folds `creds`, used to pull the
/// image of `repo`, into `existing` (the record of `image_ref`, if any).
/// Returns the record to store and whether anything changed.
///
/// - No record yet: a new record, with `creds` under `repo` as given (not
///   sorted), a hollow entry (no pod shown) when they are empty; with no
///   `repo` either, a record without a mapping (tracked, every name of
///   the image counts as pulled by imaged, every pod must verify).
/// - Empty `creds`: a hollow entry under `repo` when it has none and the
///   record names repositories (a pull that proved nothing still made the
///   name imaged's: every pod of it must verify, kubernetes/kubernetes#138175
///   aside); otherwise no change.
/// - No mapping for `repo`: added, as given.
/// - The mapping is node-accessible already: no change.
/// - `creds` node-accessible: the mapping becomes node-accessible, lists cleared.
/// - `creds` with secrets: only the secrets merge, by (namespace, name, uid)
///   with the new hash winning; the list is sorted by namespace, name, uid
///   when (and only when) that changed it.
/// - Otherwise service accounts are unioned, sorted likewise when changed.
///
/// `last_updated_time` becomes `now` only when something changed (the
/// kubelet's rule; [`crate::pull_records::PullRecords::record_image_pulled`]
/// deliberately refreshes it on every pull, see there).
pub fn merge_pulled(
    existing: Option<&PulledRecord>,
    image_ref: &str,
    repo: &str,
    creds: &ImagePullCredentials,
    now: SystemTime,
) -> (PulledRecord, bool) {
    let Some(existing) = existing else {
        let mut credential_mapping = BTreeMap::new();
        if !creds.is_empty() || !repo.is_empty() {
            credential_mapping.insert(repo.to_string(), creds.clone());
        }
        return (PulledRecord { last_updated_time: now, image_ref: image_ref.to_string(), credential_mapping }, true);
    };
    let mut record = existing.clone();
    // Empty `creds` add only a missing hollow entry (below); a record
    // without a mapping already counts every name as imaged's.
    if creds.is_empty()
        && (repo.is_empty() || record.credential_mapping.is_empty() || record.credential_mapping.contains_key(repo))
    {
        return (record, false);
    }
    let changed = match record.credential_mapping.get_mut(repo) {
        None => {
            record.credential_mapping.insert(repo.to_string(), creds.clone());
            true
        }
        Some(current) => merge_credentials(current, creds),
    };
    if changed {
        record.last_updated_time = now;
    }
    (record, changed)
}

/// Merges `new` into `current` (one repository's mapping); true if it changed.
fn merge_credentials(current: &mut ImagePullCredentials, new: &ImagePullCredentials) -> bool {
    if current.node_pods_accessible {
        return false;
    }
    if new.node_pods_accessible {
        *current = ImagePullCredentials::node_accessible();
        return true;
    }
    if !new.kubernetes_secrets.is_empty() {
        return merge_secrets(&mut current.kubernetes_secrets, &new.kubernetes_secrets);
    }
    merge_service_accounts(&mut current.kubernetes_service_accounts, &new.kubernetes_service_accounts)
}

/// The kubelet's `mergePullSecrets`: unique by coordinates, the new hash
/// winning; sorted by namespace, name, uid, only when something changed.
fn merge_secrets(current: &mut Vec<ImagePullSecret>, new: &[ImagePullSecret]) -> bool {
    let mut set: BTreeMap<(String, String, String), String> = current
        .iter()
        .map(|s| ((s.namespace.clone(), s.name.clone(), s.uid.clone()), s.credential_hash.clone()))
        .collect();
    let mut changed = false;
    for s in new {
        let key = (s.namespace.clone(), s.name.clone(), s.uid.clone());
        if set.get(&key) != Some(&s.credential_hash) {
            changed = true;
            set.insert(key, s.credential_hash.clone());
        }
    }
    if changed {
        *current = set
            .into_iter()
            .map(|((namespace, name, uid), credential_hash)| ImagePullSecret { uid, namespace, name, credential_hash })
            .collect();
    }
    changed
}

/// The kubelet's `mergePullServiceAccounts`: a union, sorted by namespace,
/// name, uid, only when something was added.
fn merge_service_accounts(current: &mut Vec<ImagePullServiceAccount>, new: &[ImagePullServiceAccount]) -> bool {
    let mut set: std::collections::BTreeSet<(String, String, String)> =
        current.iter().map(|s| (s.namespace.clone(), s.name.clone(), s.uid.clone())).collect();
    let mut changed = false;
    for s in new {
        changed |= set.insert((s.namespace.clone(), s.name.clone(), s.uid.clone()));
    }
    if changed {
        *current =
            set.into_iter().map(|(namespace, name, uid)| ImagePullServiceAccount { uid, namespace, name }).collect();
    }
    changed
}

/// The `result` label of `kubelet_imagemanager_image_mustpull_checks_total`
/// (imaged's `imaged_imagemanager_image_mustpull_checks_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MustPullResult {
    /// The policy does not ask for verification of this image.
    CredentialPolicyAllowed,
    /// A record shows the pod may use the image.
    CredentialRecordFound,
    /// The pod must pull (authenticate) to use the image.
    MustAuthenticate,
    /// The check failed; the pod must pull.
    Error,
}

impl MustPullResult {
    /// Every result, in [`MustPullResult::index`] order.
    pub const ALL: [MustPullResult; 4] =
        [Self::CredentialPolicyAllowed, Self::CredentialRecordFound, Self::MustAuthenticate, Self::Error];

    /// The position in [`MustPullResult::ALL`].
    pub fn index(self) -> usize {
        match self {
            Self::CredentialPolicyAllowed => 0,
            Self::CredentialRecordFound => 1,
            Self::MustAuthenticate => 2,
            Self::Error => 3,
        }
    }

    /// The kubelet's label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CredentialPolicyAllowed => "credentialPolicyAllowed",
            Self::CredentialRecordFound => "credentialRecordFound",
            Self::MustAuthenticate => "mustAuthenticate",
            Self::Error => "error",
        }
    }
}

impl fmt::Display for MustPullResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
