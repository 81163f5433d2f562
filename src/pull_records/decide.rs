//! The kubelet's `MustAttemptImagePull` decision (reference §8.3 steps
//! 3–12), pure: the caller looks the record up and supplies the pod's
//! credentials lazily.

use super::policy::VerifyPolicy;
use crate::domain::pull_record::{
    ImagePullCredentials, ImagePullSecret, ImagePullServiceAccount, MAX_SECRETS_WRITTEN_WHILE_MATCHING, MustPullResult,
    PulledRecord,
};

/// What is known of the image's pulled record.
#[derive(Debug, Clone, Copy)]
pub enum RecordLookup<'a> {
    /// No record.
    Absent,
    /// A record is stored but does not decode (the kubelet: a read error).
    Unreadable,
    /// The record.
    Found(&'a PulledRecord),
}

/// The pod's credentials that came from a known source (node-level
/// credentials are left out, as the kubelet does).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodCredentials {
    /// Every pull secret credential matching the image.
    pub secrets: Vec<ImagePullSecret>,
    /// The first service account whose token obtained credentials.
    pub service_account: Option<ImagePullServiceAccount>,
}

/// The outcome of a must-pull check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The pod must pull the image (with its own credentials) to use it.
    pub must_pull: bool,
    /// The metric label.
    pub result: MustPullResult,
    /// Pod secrets to add to the record's mapping for the repository
    /// (matched by hash under other coordinates, or same coordinates with a
    /// new hash): the kubelet's "write while matching".
    pub record_secrets: Vec<ImagePullSecret>,
}

impl Decision {
    fn new(must_pull: bool, result: MustPullResult) -> Self {
        Self { must_pull, result, record_secrets: Vec::new() }
    }
}

/// Where a must-pull check stands before the pod's credentials are needed.
#[derive(Debug, Clone)]
pub enum Step<'a> {
    /// Decided without them.
    Done(Decision),
    /// The record names secrets or service accounts for the image's
    /// repository: the pod's credentials decide ([`match_credentials`]).
    Match(&'a ImagePullCredentials),
}

/// Steps 2–8 of the kubelet's check: everything up to comparing the pod's
/// credentials. `repo` is the image's normalised repository (`None` if it
/// does not parse); `pulled_by_kubelet` = imaged pulled this image (see
/// `PullRecords::must_attempt_pull`).
pub fn decide_without_credentials<'a>(
    policy: &VerifyPolicy,
    repo: Option<&str>,
    record: RecordLookup<'a>,
    pulled_by_kubelet: bool,
) -> Step<'a> {
    // 2. An unreadable record: pull (the kubelet returns true without an error).
    if let RecordLookup::Unreadable = record {
        return Step::Done(Decision::new(true, MustPullResult::Error));
    }
    // 3. The policy.
    if !policy.requires_verification(repo, pulled_by_kubelet) {
        return Step::Done(Decision::new(false, MustPullResult::CredentialPolicyAllowed));
    }
    // 4. No record.
    let RecordLookup::Found(record) = record else {
        return Step::Done(Decision::new(true, MustPullResult::MustAuthenticate));
    };
    // 5. An image name that does not parse.
    let Some(repo) = repo else {
        return Step::Done(Decision::new(true, MustPullResult::Error));
    };
    // 6. Nothing recorded for this repository.
    let Some(cached) = record.credential_mapping.get(repo) else {
        return Step::Done(Decision::new(true, MustPullResult::MustAuthenticate));
    };
    // 7. Pulled without credentials or with node credentials: every pod may use it.
    if cached.node_pods_accessible {
        return Step::Done(Decision::new(false, MustPullResult::CredentialRecordFound));
    }
    // 8. Nothing to compare with.
    if cached.kubernetes_secrets.is_empty() && cached.kubernetes_service_accounts.is_empty() {
        return Step::Done(Decision::new(true, MustPullResult::MustAuthenticate));
    }
    Step::Match(cached)
}

/// Steps 10–12: the pod's secrets and service account against the record's.
pub fn match_credentials(cached: &ImagePullCredentials, pod: &PodCredentials) -> Decision {
    // 10. Secrets: a matching hash, or the same secret with a new hash.
    let room = cached.kubernetes_secrets.len() < MAX_SECRETS_WRITTEN_WHILE_MATCHING;
    for pod_secret in &pod.secrets {
        for cached_secret in &cached.kubernetes_secrets {
            // Coordinates name a secret: a record's credential without
            // them (a CRI front's pull) matches by its hash only.
            let same_coordinates = !cached_secret.name.is_empty()
                && pod_secret.uid == cached_secret.uid
                && pod_secret.namespace == cached_secret.namespace
                && pod_secret.name == cached_secret.name;
            if !pod_secret.credential_hash.is_empty() && pod_secret.credential_hash == cached_secret.credential_hash {
                let record_secrets = if !same_coordinates && room { vec![pod_secret.clone()] } else { Vec::new() };
                return Decision { must_pull: false, result: MustPullResult::CredentialRecordFound, record_secrets };
            }
            if same_coordinates {
                // The secret was updated since: its new content is trusted
                // (the kubelet's choice; the KEP leaves it open).
                let record_secrets = if room { vec![pod_secret.clone()] } else { Vec::new() };
                return Decision { must_pull: false, result: MustPullResult::CredentialRecordFound, record_secrets };
            }
        }
    }
    // 11. The pod's service account: uid, namespace and name all equal.
    if let Some(sa) = &pod.service_account
        && cached.kubernetes_service_accounts.contains(sa)
    {
        return Decision::new(false, MustPullResult::CredentialRecordFound);
    }
    // 12. No match.
    Decision::new(true, MustPullResult::MustAuthenticate)
}

/// Decides whether a pod must pull a present image: [`decide_without_credentials`],
/// then, when needed, `pod_credentials` and [`match_credentials`]. An error
/// from `pod_credentials` makes the pod pull and is returned with the decision.
pub fn decide<E>(
    policy: &VerifyPolicy,
    repo: Option<&str>,
    record: RecordLookup<'_>,
    pulled_by_kubelet: bool,
    pod_credentials: impl FnOnce() -> Result<PodCredentials, E>,
) -> (Decision, Option<E>) {
    match decide_without_credentials(policy, repo, record, pulled_by_kubelet) {
        Step::Done(d) => (d, None),
        // 9. The pod's credentials.
        Step::Match(cached) => match pod_credentials() {
            Ok(pod) => (match_credentials(cached, &pod), None),
            Err(e) => (Decision::new(true, MustPullResult::Error), Some(e)),
        },
    }
}
