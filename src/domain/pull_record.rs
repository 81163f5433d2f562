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

impl ImagePullSecret {
    fn coordinates(&self) -> (&str, &str, &str) {
        (&self.namespace, &self.name, &self.uid)
    }
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
/// - No record yet: a new record, with `creds` under `repo` unless they are
///   empty (a record with no credentials: tracked, every pod must verify).
/// - Empty `creds`: no change.
/// - No mapping for `repo`: added.
/// - The mapping is node-accessible already: no change.
/// - `creds` node-accessible: the mapping becomes node-accessible, lists cleared.
/// - Otherwise secrets merge by (namespace, name, uid) with the new hash
///   winning, service accounts are unioned, both sorted by namespace, name, uid.
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
        if !creds.is_empty() {
            credential_mapping.insert(repo.to_string(), normalized(creds.clone()));
        }
        return (PulledRecord { last_updated_time: now, image_ref: image_ref.to_string(), credential_mapping }, true);
    };
    let mut record = existing.clone();
    if creds.is_empty() {
        return (record, false);
    }
    let changed = match record.credential_mapping.get_mut(repo) {
        None => {
            record.credential_mapping.insert(repo.to_string(), normalized(creds.clone()));
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
    let before = current.clone();
    for secret in &new.kubernetes_secrets {
        match current.kubernetes_secrets.iter_mut().find(|s| s.coordinates() == secret.coordinates()) {
            Some(s) => s.credential_hash.clone_from(&secret.credential_hash),
            None => current.kubernetes_secrets.push(secret.clone()),
        }
    }
    for sa in &new.kubernetes_service_accounts {
        if !current.kubernetes_service_accounts.contains(sa) {
            current.kubernetes_service_accounts.push(sa.clone());
        }
    }
    sort(current);
    *current != before
}

fn normalized(mut creds: ImagePullCredentials) -> ImagePullCredentials {
    if creds.node_pods_accessible {
        return ImagePullCredentials::node_accessible();
    }
    sort(&mut creds);
    creds.kubernetes_secrets.dedup_by(|a, b| a.coordinates() == b.coordinates());
    creds.kubernetes_service_accounts.dedup();
    creds
}

fn sort(creds: &mut ImagePullCredentials) {
    creds.kubernetes_secrets.sort_by(|a, b| a.coordinates().cmp(&b.coordinates()));
    creds
        .kubernetes_service_accounts
        .sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
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
