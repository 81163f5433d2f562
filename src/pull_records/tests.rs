#![allow(clippy::pedantic)] // test code: pedantic lints are for what ships
//! Pure tests: merge rules, the must-pull decision table, the policy and
//! allowlist texts; and the handle's bookkeeping over a real store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::domain::pull_record::*;

fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn secret(ns: &str, name: &str, uid: &str, hash: &str) -> ImagePullSecret {
    ImagePullSecret { uid: uid.into(), namespace: ns.into(), name: name.into(), credential_hash: hash.into() }
}

fn sa(ns: &str, name: &str, uid: &str) -> ImagePullServiceAccount {
    ImagePullServiceAccount { uid: uid.into(), namespace: ns.into(), name: name.into() }
}

const REPO: &str = "example.com/private";
const REF: &str = "sha256:aaaa";

fn record_with(creds: ImagePullCredentials) -> PulledRecord {
    PulledRecord {
        last_updated_time: t(100),
        image_ref: REF.into(),
        credential_mapping: BTreeMap::from([(REPO.to_string(), creds)]),
    }
}

// === merge rules ===

#[test]
fn merge_into_no_record_creates_one_and_empty_creds_make_an_empty_mapping() {
    let (r, changed) = merge_pulled(None, REF, REPO, &ImagePullCredentials::node_accessible(), t(5));
    assert!(changed);
    assert_eq!(r.image_ref, REF);
    assert_eq!(r.last_updated_time, t(5));
    assert_eq!(r.credential_mapping[REPO], ImagePullCredentials::node_accessible());

    let (r, changed) = merge_pulled(None, REF, REPO, &ImagePullCredentials::default(), t(5));
    assert!(changed, "a record without credentials is still a record");
    assert_eq!(r.credential_mapping[REPO], ImagePullCredentials::default(), "a hollow entry names the repository");
    let (r, changed) = merge_pulled(None, REF, "", &ImagePullCredentials::default(), t(5));
    assert!(changed);
    assert!(r.credential_mapping.is_empty(), "no repository: no mapping");
}

#[test]
fn merge_of_empty_creds_adds_only_a_missing_hollow_entry() {
    let existing = record_with(ImagePullCredentials::secret(secret("ns", "a", "u1", "h1")));
    let (r, changed) = merge_pulled(Some(&existing), REF, REPO, &ImagePullCredentials::default(), t(500));
    assert!(!changed, "the repository has an entry");
    assert_eq!(r, existing);
    let (r, changed) =
        merge_pulled(Some(&existing), REF, "example.com/other", &ImagePullCredentials::default(), t(500));
    assert!(changed, "another repository gets a hollow entry");
    assert_eq!(r.credential_mapping["example.com/other"], ImagePullCredentials::default());
    assert_eq!(r.credential_mapping[REPO], existing.credential_mapping[REPO]);
    assert_eq!(r.last_updated_time, t(500));
    let unmapped = merge_pulled(None, REF, "", &ImagePullCredentials::default(), t(5)).0;
    assert!(
        !merge_pulled(Some(&unmapped), REF, REPO, &ImagePullCredentials::default(), t(500)).1,
        "every name already"
    );
}

#[test]
fn merge_adds_a_new_repository_mapping() {
    let existing = record_with(ImagePullCredentials::secret(secret("ns", "a", "u1", "h1")));
    let (r, changed) =
        merge_pulled(Some(&existing), REF, "example.com/other", &ImagePullCredentials::node_accessible(), t(500));
    assert!(changed);
    assert_eq!(r.last_updated_time, t(500));
    assert_eq!(r.credential_mapping.len(), 2);
    assert_eq!(r.credential_mapping[REPO], existing.credential_mapping[REPO]);
}

#[test]
fn node_accessible_mapping_absorbs_everything_and_wins_over_lists() {
    let node = record_with(ImagePullCredentials::node_accessible());
    let (r, changed) =
        merge_pulled(Some(&node), REF, REPO, &ImagePullCredentials::secret(secret("ns", "a", "u1", "h1")), t(500));
    assert!(!changed);
    assert_eq!(r, node);

    let secrets = record_with(ImagePullCredentials {
        kubernetes_secrets: vec![secret("ns", "a", "u1", "h1")],
        kubernetes_service_accounts: vec![sa("ns", "sa", "s1")],
        node_pods_accessible: false,
    });
    let (r, changed) = merge_pulled(Some(&secrets), REF, REPO, &ImagePullCredentials::node_accessible(), t(500));
    assert!(changed);
    assert_eq!(r.credential_mapping[REPO], ImagePullCredentials::node_accessible(), "lists are cleared");
    assert_eq!(r.last_updated_time, t(500));
}

#[test]
fn secrets_merge_by_coordinates_new_hash_wins_and_lists_are_sorted() {
    let existing = record_with(ImagePullCredentials {
        kubernetes_secrets: vec![secret("b", "s", "u2", "h2"), secret("a", "s", "u1", "old")],
        ..Default::default()
    });
    let new = ImagePullCredentials {
        kubernetes_secrets: vec![secret("a", "s", "u1", "new"), secret("a", "r", "u3", "h3")],
        ..Default::default()
    };
    let (r, changed) = merge_pulled(Some(&existing), REF, REPO, &new, t(500));
    assert!(changed);
    assert_eq!(
        r.credential_mapping[REPO].kubernetes_secrets,
        [secret("a", "r", "u3", "h3"), secret("a", "s", "u1", "new"), secret("b", "s", "u2", "h2")]
    );
    // Same secret again: no change, time kept.
    let (again, changed) = merge_pulled(Some(&r), REF, REPO, &new, t(900));
    assert!(!changed);
    assert_eq!(again.last_updated_time, t(500));
    // A secret of the same name but another uid is another secret.
    let (r2, changed) =
        merge_pulled(Some(&r), REF, REPO, &ImagePullCredentials::secret(secret("a", "s", "u9", "h9")), t(901));
    assert!(changed);
    assert_eq!(r2.credential_mapping[REPO].kubernetes_secrets.len(), 4);
}

#[test]
fn a_new_mapping_keeps_the_order_given_and_a_merge_sorts_only_what_it_changed() {
    // The kubelet stores a new mapping as given, unsorted.
    let unsorted = ImagePullCredentials {
        kubernetes_secrets: vec![secret("b", "s", "u2", "h2"), secret("a", "s", "u1", "h1")],
        ..Default::default()
    };
    let (r, _) = merge_pulled(None, REF, REPO, &unsorted, t(1));
    assert_eq!(r.credential_mapping[REPO], unsorted);
    let (r, changed) = merge_pulled(Some(&r), REF, "example.com/other", &unsorted, t(2));
    assert!(changed);
    assert_eq!(r.credential_mapping["example.com/other"], unsorted, "a new repository mapping, as given");
    // Merging a secret it already has changes nothing, order included.
    let (same, changed) =
        merge_pulled(Some(&r), REF, REPO, &ImagePullCredentials::secret(secret("b", "s", "u2", "h2")), t(3));
    assert!(!changed);
    assert_eq!(same.credential_mapping[REPO], unsorted);
    // A secret merge leaves the service accounts as they were; an account merge the secrets.
    let both = ImagePullCredentials {
        kubernetes_secrets: vec![secret("z", "s", "u", "h")],
        kubernetes_service_accounts: vec![sa("b", "x", "1"), sa("a", "y", "2")],
        node_pods_accessible: false,
    };
    let (r, _) = merge_pulled(None, REF, REPO, &both, t(1));
    let (r, changed) =
        merge_pulled(Some(&r), REF, REPO, &ImagePullCredentials::secret(secret("c", "s", "u", "h")), t(2));
    assert!(changed);
    assert_eq!(r.credential_mapping[REPO].kubernetes_service_accounts, [sa("b", "x", "1"), sa("a", "y", "2")]);
    assert_eq!(r.credential_mapping[REPO].kubernetes_secrets, [secret("c", "s", "u", "h"), secret("z", "s", "u", "h")]);
    // The kubelet merges only the secrets of credentials that hold both.
    let (r2, changed) = merge_pulled(
        Some(&r),
        REF,
        REPO,
        &ImagePullCredentials { kubernetes_service_accounts: vec![sa("c", "c", "3")], ..both.clone() },
        t(3),
    );
    assert!(!changed, "the secret was there; the account is not merged");
    assert_eq!(r2.credential_mapping[REPO].kubernetes_service_accounts.len(), 2);
}

#[test]
fn service_accounts_are_unioned_and_sorted() {
    let existing = record_with(ImagePullCredentials::service_account(sa("b", "x", "1")));
    let (r, changed) =
        merge_pulled(Some(&existing), REF, REPO, &ImagePullCredentials::service_account(sa("a", "y", "2")), t(500));
    assert!(changed);
    assert_eq!(r.credential_mapping[REPO].kubernetes_service_accounts, [sa("a", "y", "2"), sa("b", "x", "1")]);
    let (_, changed) =
        merge_pulled(Some(&r), REF, REPO, &ImagePullCredentials::service_account(sa("a", "y", "2")), t(600));
    assert!(!changed);
}

#[test]
fn record_json_uses_the_kubelet_field_names() {
    let r = record_with(ImagePullCredentials::secret(secret("ns", "a", "u1", "h1")));
    let v: serde_json::Value = serde_json::to_value(&r).unwrap();
    let m = &v["credentialMapping"][REPO];
    assert_eq!(m["kubernetesSecrets"][0]["credentialHash"], "h1");
    assert_eq!(m["kubernetesSecrets"][0]["uid"], "u1");
    assert!(m.get("nodePodsAccessible").is_none(), "false is omitted");
    assert_eq!(v["imageRef"], REF);
    assert!(v.get("lastUpdatedTime").is_some());
    let back: PulledRecord = serde_json::from_value(v).unwrap();
    assert_eq!(back, r);
}

// === policy and allowlist ===

#[test]
fn policy_names_parse_and_unknown_ones_get_the_kubelet_text() {
    for p in [
        VerificationPolicy::NeverVerify,
        VerificationPolicy::NeverVerifyPreloadedImages,
        VerificationPolicy::NeverVerifyAllowlistedImages,
        VerificationPolicy::AlwaysVerify,
    ] {
        assert_eq!(p.as_str().parse::<VerificationPolicy>(), Ok(p));
    }
    assert_eq!(VerificationPolicy::default(), VerificationPolicy::NeverVerifyPreloadedImages);
    assert_eq!(
        "neververify".parse::<VerificationPolicy>().unwrap_err().to_string(),
        "unknown image pull credential verification policy: neververify"
    );
}

#[test]
fn allowlist_patterns_are_validated_with_the_kubelet_texts() {
    let cases: &[(&str, &str)] = &[
        (" docker.io/library/nginx", "leading/trailing spaces are not allowed:  docker.io/library/nginx"),
        ("docker.io/library/nginx ", "leading/trailing spaces are not allowed: docker.io/library/nginx "),
        ("*", "not a valid wildcard pattern, only patterns ending with '/*' are allowed: *"),
        (
            "registry.io/*/x",
            "not a valid wildcard pattern, only patterns ending with '/*' are allowed: registry.io/*/x",
        ),
        (
            "registry.io/a*/*",
            "not a valid wildcard pattern, only patterns ending with '/*' are allowed: registry.io/a*/*",
        ),
        ("/*", "at least registry hostname is required"),
        (
            "docker.io/library/nginx:1.27",
            "neither tag nor digest is accepted in an image reference: docker.io/library/nginx:1.27",
        ),
        ("nginx", "neither tag nor digest is accepted in an image reference: nginx"),
        (
            "docker.io/library/nginx@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "neither tag nor digest is accepted in an image reference: docker.io/library/nginx@sha256:0000000000000000000000000000000000000000000000000000000000000000",
        ),
        ("", "the supplied pattern is too short: "),
    ];
    for (pattern, text) in cases {
        assert_eq!(Allowlist::new(&[*pattern]).unwrap_err().to_string(), *text, "pattern {pattern:?}");
    }
    assert!(
        Allowlist::new(&["Docker.io/Upper"]).unwrap_err().to_string().starts_with("failed to parse as an image name: "),
        "an unparsable name"
    );
    assert!(
        Allowlist::new(&["docker.io/library/nginx", "registry.example.com/team/*", "registry.example.com/*"]).is_ok()
    );
}

#[test]
fn allowlist_matches_exact_names_and_prefixes_of_normalised_repositories() {
    let list = Allowlist::new(&["docker.io/library/nginx", "registry.example.com/team/*"]).unwrap();
    assert!(list.matches("docker.io/library/nginx"));
    assert!(!list.matches("docker.io/library/nginx-extra"));
    assert!(list.matches("registry.example.com/team/app"));
    assert!(list.matches("registry.example.com/team/a/b"));
    assert!(!list.matches("registry.example.com/teammate/app"), "the prefix keeps its '/'");
    assert!(!list.matches("registry.example.com/other"));
    // The pod's image is compared normalised.
    assert_eq!(image_repo("nginx:1.27").as_deref(), Some("docker.io/library/nginx"));
    assert!(list.matches(&image_repo("nginx:1.27").unwrap()));
}

#[test]
fn policies_decide_whether_verification_is_required() {
    use VerificationPolicy::*;
    let allow = Allowlist::new(&["example.com/*"]).unwrap();
    let p = |policy| VerifyPolicy { policy, allowlist: allow.clone() };
    for (policy, repo, pulled, want) in [
        (NeverVerify, Some("other.io/x"), true, false),
        (AlwaysVerify, Some("example.com/x"), false, true),
        (NeverVerifyPreloadedImages, Some("other.io/x"), false, false),
        (NeverVerifyPreloadedImages, Some("other.io/x"), true, true),
        (NeverVerifyAllowlistedImages, Some("example.com/x"), false, false),
        (NeverVerifyAllowlistedImages, Some("other.io/x"), false, true),
        // Deliberate: an allowlisted image imaged pulled is verified.
        (NeverVerifyAllowlistedImages, Some("example.com/x"), true, true),
        (NeverVerifyAllowlistedImages, None, false, true),
    ] {
        assert_eq!(p(policy).requires_verification(repo, pulled), want, "{policy} {repo:?} pulled={pulled}");
    }
}

// === the must-pull decision table ===

type Pod = Result<PodCredentials, &'static str>;

fn pod_with(secrets: Vec<ImagePullSecret>) -> impl FnOnce() -> Pod {
    move || Ok(PodCredentials { secrets, service_account: None })
}

fn run(
    record: RecordLookup<'_>,
    pulled: bool,
    pod: impl FnOnce() -> Pod,
) -> (bool, MustPullResult, Vec<ImagePullSecret>) {
    let policy = VerifyPolicy::default();
    let (d, e) = decide(&policy, Some(REPO), record, pulled, pod);
    assert!(e.is_none());
    (d.must_pull, d.result, d.record_secrets)
}

#[test]
fn decision_table() {
    use MustPullResult::*;
    let never = || -> Pod { panic!("pod credentials must not be evaluated") };
    // Unreadable record: pull.
    assert_eq!(run(RecordLookup::Unreadable, true, never), (true, Error, vec![]));
    // Not pulled by imaged (preloaded) under the default policy: allowed.
    assert_eq!(run(RecordLookup::Absent, false, never), (false, CredentialPolicyAllowed, vec![]));
    // An intent but no record: must authenticate.
    assert_eq!(run(RecordLookup::Absent, true, never), (true, MustAuthenticate, vec![]));
    // Record without a mapping for the repository (e.g. recovered intent).
    let empty = PulledRecord { last_updated_time: t(1), image_ref: REF.into(), credential_mapping: BTreeMap::new() };
    assert_eq!(run(RecordLookup::Found(&empty), true, never), (true, MustAuthenticate, vec![]));
    // Node accessible: everyone.
    let node = record_with(ImagePullCredentials::node_accessible());
    assert_eq!(run(RecordLookup::Found(&node), true, never), (false, CredentialRecordFound, vec![]));
    // A mapping with empty lists.
    let hollow = record_with(ImagePullCredentials::default());
    assert_eq!(run(RecordLookup::Found(&hollow), true, never), (true, MustAuthenticate, vec![]));

    let a = secret("ns", "a", "u1", "h1");
    let rec = record_with(ImagePullCredentials::secret(a.clone()));
    // Same secret, same hash.
    assert_eq!(run(RecordLookup::Found(&rec), true, pod_with(vec![a.clone()])), (false, CredentialRecordFound, vec![]));
    // No secret at all.
    assert_eq!(run(RecordLookup::Found(&rec), true, pod_with(vec![])), (true, MustAuthenticate, vec![]));
    // Another secret with another hash.
    let other = secret("ns2", "b", "u2", "h2");
    assert_eq!(run(RecordLookup::Found(&rec), true, pod_with(vec![other])), (true, MustAuthenticate, vec![]));
    // Another secret with the same hash (same credential): allowed, and recorded.
    let copy = secret("ns2", "copy", "u3", "h1");
    assert_eq!(
        run(RecordLookup::Found(&rec), true, pod_with(vec![copy.clone()])),
        (false, CredentialRecordFound, vec![copy])
    );
    // The same secret updated (new hash): allowed, the new hash recorded.
    let rotated = secret("ns", "a", "u1", "h-new");
    assert_eq!(
        run(RecordLookup::Found(&rec), true, pod_with(vec![rotated.clone()])),
        (false, CredentialRecordFound, vec![rotated])
    );
    // An empty hash never matches by hash.
    let no_hash_rec =
        record_with(ImagePullSecret { credential_hash: String::new(), ..secret("x", "y", "z", "") }.into_creds());
    assert_eq!(
        run(RecordLookup::Found(&no_hash_rec), true, pod_with(vec![secret("p", "q", "r", "")])),
        (true, MustAuthenticate, vec![])
    );
    // Service accounts.
    let sa_rec = record_with(ImagePullCredentials::service_account(sa("ns", "puller", "s1")));
    let with_sa = |s| move || -> Pod { Ok(PodCredentials { secrets: vec![], service_account: Some(s) }) };
    assert_eq!(
        run(RecordLookup::Found(&sa_rec), true, with_sa(sa("ns", "puller", "s1"))),
        (false, CredentialRecordFound, vec![])
    );
    assert_eq!(
        run(RecordLookup::Found(&sa_rec), true, with_sa(sa("ns", "puller", "s2"))),
        (true, MustAuthenticate, vec![])
    );
}

trait IntoCreds {
    fn into_creds(self) -> ImagePullCredentials;
}
impl IntoCreds for ImagePullSecret {
    fn into_creds(self) -> ImagePullCredentials {
        ImagePullCredentials::secret(self)
    }
}

#[test]
fn decision_with_a_full_secret_list_does_not_grow_it() {
    let list: Vec<ImagePullSecret> = (0..MAX_SECRETS_WRITTEN_WHILE_MATCHING)
        .map(|i| secret("ns", &format!("s{i}"), &format!("u{i}"), "h"))
        .collect();
    let rec = record_with(ImagePullCredentials { kubernetes_secrets: list, ..Default::default() });
    let (must, _, record) = run(RecordLookup::Found(&rec), true, pod_with(vec![secret("other", "x", "ux", "h")]));
    assert!(!must);
    assert!(record.is_empty());
}

#[test]
fn decision_pod_credential_error_forces_a_pull_and_is_returned() {
    let rec = record_with(ImagePullCredentials::secret(secret("ns", "a", "u1", "h1")));
    let (d, e) = decide(&VerifyPolicy::default(), Some(REPO), RecordLookup::Found(&rec), true, || -> Pod {
        Err("secret does not decode")
    });
    assert!(d.must_pull);
    assert_eq!(d.result, MustPullResult::Error);
    assert_eq!(e, Some("secret does not decode"));
}

#[test]
fn decision_unparsable_image_with_a_record_forces_a_pull() {
    let rec = record_with(ImagePullCredentials::node_accessible());
    let (d, _) =
        decide(&VerifyPolicy::default(), None, RecordLookup::Found(&rec), true, || -> Pod { Ok(Default::default()) });
    assert_eq!((d.must_pull, d.result), (true, MustPullResult::Error));
}

// === the handle ===

const IMAGE: &str = "example.com/private:1";

/// The `imaged_imagemanager_image_mustpull_checks_total` series in `metrics`' scrape, by result.
fn mustpull_checks(metrics: &crate::metrics::Metrics) -> Vec<(String, f64)> {
    let s = crate::testing::Scrape::parse(&metrics.encode()).unwrap();
    s.by_label("imaged_imagemanager_image_mustpull_checks_total", "result")
}

fn store(dir: &std::path::Path) -> Arc<crate::store::Store> {
    Arc::new(crate::store::Store::open(dir).unwrap())
}

fn pod(secrets: Vec<ImagePullSecret>) -> impl FnOnce() -> Result<PodCredentials, std::convert::Infallible> {
    move || Ok(PodCredentials { secrets, service_account: None })
}

#[tokio::test]
async fn an_intent_whose_deletion_failed_after_reaching_the_disk_is_written_again() {
    let dir = tempfile::tempdir().unwrap();
    {
        let st = store(dir.path());
        let r = PullRecords::open(VerifyPolicy::default(), Some(st.clone())).unwrap();
        r.record_pull_intent(IMAGE).await.unwrap();
        // The pull fails; deleting its intent reaches the disk, then the
        // commit reports a failure.
        st.fail_after_next_commit.store(true, std::sync::atomic::Ordering::Release);
        r.record_image_pull_failed(IMAGE).await;
        assert_eq!(r.stored_intents(), [IMAGE], "written again: memory and disk agree");
        // Meanwhile, in this process, the name counts as pulled by imaged.
        assert!(r.must_attempt_pull(IMAGE, REF, pod(vec![])).await.unwrap());
        // The next pull of the name, then a crash before its record.
        r.record_pull_intent(IMAGE).await.unwrap();
    }
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    assert_eq!(r.stored_intents(), [IMAGE], "the crashed pull's intent is on disk");
    assert!(r.must_attempt_pull(IMAGE, REF, pod(vec![])).await.unwrap(), "not taken for preloaded");
}

#[tokio::test]
async fn a_sync_whose_kept_intents_cannot_be_deleted_still_puts_the_unsynced_records_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    {
        let st = store(dir.path());
        let r = PullRecords::open(VerifyPolicy::default(), Some(st.clone())).unwrap();
        r.record_pull_intent(IMAGE).await.unwrap();
        // Unsynced (node-accessible), its intent kept on disk.
        r.record_image_pulled(IMAGE, REF, &ImagePullCredentials::node_accessible()).await.unwrap();
        assert_eq!(r.kept_intents(), [IMAGE]);
        st.refuse_next_write.store(true, std::sync::atomic::Ordering::Release);
        assert!(r.sync().await.is_err(), "the deletion's failure is reported");
        st.fence_as_killed(); // kill -9 after the graceful stop's sync
    }
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    assert!(r.record(REF).is_some(), "the unsynced record was put on disk all the same");
    assert_eq!(r.stored_intents(), [IMAGE], "the kept intent stays, recovered as any");
}

#[tokio::test]
async fn intents_and_records_persist_and_reload() {
    let dir = tempfile::tempdir().unwrap();
    let a = secret("ns", "a", "u1", "h1");
    {
        let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
        r.record_pull_intent(IMAGE).await.unwrap();
        assert_eq!(r.stored_intents(), ["example.com/private:1"]);
        // While the pull runs, the image counts as pulled by imaged.
        assert!(r.must_attempt_pull(IMAGE, REF, pod(vec![])).await.unwrap());
        r.record_image_pulled(IMAGE, REF, &ImagePullCredentials::secret(a.clone())).await.unwrap();
        assert!(r.stored_intents().is_empty());
    }
    let metrics = crate::metrics::Metrics::default();
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap().with_metrics(metrics.clone());
    let rec = r.record(REF).expect("record reloaded");
    assert_eq!(rec.credential_mapping[REPO].kubernetes_secrets, std::slice::from_ref(&a));
    assert!(!r.must_attempt_pull(IMAGE, REF, pod(vec![a])).await.unwrap());
    assert!(r.must_attempt_pull(IMAGE, REF, pod(vec![])).await.unwrap());
    let checks = mustpull_checks(&metrics);
    assert_eq!(checks, [("credentialRecordFound".to_string(), 1.0), ("mustAuthenticate".to_string(), 1.0)]);
}

#[tokio::test]
async fn every_pods_record_is_written_unsynced_a_secrets_synced_and_a_kill_leaves_the_intent() {
    let dir = tempfile::tempdir().unwrap();
    let a = secret("ns", "a", "u1", "h1");
    let other = "example.com/private:2";
    let other_ref = "sha256:other";
    {
        let st = store(dir.path());
        let r = PullRecords::open(VerifyPolicy::default(), Some(st.clone())).unwrap();
        r.record_pull_intent(IMAGE).await.unwrap();
        r.record_image_pulled(IMAGE, REF, &ImagePullCredentials::secret(a.clone())).await.unwrap();
        r.record_pull_intent(other).await.unwrap();
        r.record_image_pulled(other, other_ref, &ImagePullCredentials::node_accessible()).await.unwrap();
        // In force at once.
        assert!(!r.must_attempt_pull(other, other_ref, pod(vec![])).await.unwrap());
        assert!(r.stored_intents().is_empty());
        st.fence_as_killed(); // kill -9
    }
    let st = store(dir.path());
    let r = PullRecords::open(VerifyPolicy::default(), Some(st.clone())).unwrap();
    assert_eq!(r.record(REF).expect("synced").credential_mapping[REPO].kubernetes_secrets, std::slice::from_ref(&a));
    assert!(r.record(other_ref).is_none(), "written unsynced, lost");
    // The intent, synced before the pull, is left; so is the first pull's,
    // kept (its synced record decides for it).
    assert_eq!(r.stored_intents(), [IMAGE, other], "the intent, synced before the pull, is left");
    assert!(!r.must_attempt_pull(IMAGE, REF, pod(vec![a])).await.unwrap());
    // So the image counts as pulled by imaged: a pod without credentials must pull.
    assert!(r.must_attempt_pull(other, other_ref, pod(vec![])).await.unwrap());
    // Synced (as a graceful stop does), a kill loses nothing.
    r.record_pull_intent(other).await.unwrap();
    r.record_image_pulled(other, other_ref, &ImagePullCredentials::node_accessible()).await.unwrap();
    r.sync().await.unwrap();
    drop(r);
    st.fence_as_killed();
    drop(st);
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    assert!(r.record(other_ref).is_some_and(|c| c.credential_mapping[REPO].node_pods_accessible));
    // The graceful stop deleted `other`'s kept intent; the first image's,
    // left by the kill, was never recovered here.
    assert_eq!(r.stored_intents(), [IMAGE]);
}

#[tokio::test]
async fn concurrent_intents_for_one_image_end_with_the_last_pull() {
    let dir = tempfile::tempdir().unwrap();
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_pull_intent("example.com/private:1").await.unwrap();
    r.record_image_pull_failed(IMAGE).await;
    assert_eq!(r.stored_intents().len(), 1, "one pull still in flight");
    r.record_image_pull_failed(IMAGE).await;
    assert!(r.stored_intents().is_empty());
    drop(r);
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    assert!(r.stored_intents().is_empty(), "deleted on disk too");
}

#[tokio::test]
async fn a_matching_copy_of_the_secret_is_written_while_matching() {
    let r = PullRecords::in_memory(VerifyPolicy::default());
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pulled(IMAGE, REF, &ImagePullCredentials::secret(secret("ns", "a", "u1", "h1"))).await.unwrap();
    let copy = secret("ns2", "copy", "u2", "h1");
    assert!(!r.must_attempt_pull(IMAGE, REF, pod(vec![copy.clone()])).await.unwrap());
    assert!(r.record(REF).unwrap().credential_mapping[REPO].kubernetes_secrets.contains(&copy));
}

#[tokio::test]
async fn never_verify_needs_no_records() {
    let metrics = crate::metrics::Metrics::default();
    let r = PullRecords::in_memory(VerifyPolicy::new(VerificationPolicy::NeverVerify)).with_metrics(metrics.clone());
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pulled(IMAGE, REF, &ImagePullCredentials::secret(secret("ns", "a", "u1", "h1"))).await.unwrap();
    let must =
        r.must_attempt_pull(IMAGE, REF, || -> Result<PodCredentials, &str> { panic!("not evaluated") }).await.unwrap();
    assert!(!must);
    assert_eq!(mustpull_checks(&metrics), [("credentialPolicyAllowed".to_string(), 1.0)]);
}

#[tokio::test]
async fn an_empty_image_ref_must_pull_under_every_policy_and_is_not_counted() {
    for policy in [
        VerificationPolicy::NeverVerify,
        VerificationPolicy::NeverVerifyPreloadedImages,
        VerificationPolicy::NeverVerifyAllowlistedImages,
        VerificationPolicy::AlwaysVerify,
    ] {
        let metrics = crate::metrics::Metrics::default();
        let r = PullRecords::in_memory(VerifyPolicy::new(policy)).with_metrics(metrics.clone());
        let must = r
            .must_attempt_pull(IMAGE, "", || -> Result<PodCredentials, &str> { panic!("not evaluated") })
            .await
            .unwrap();
        assert!(must, "{policy:?}: no image ref, so the image must be pulled");
        assert!(mustpull_checks(&metrics).is_empty(), "{policy:?}: the kubelet returns before its metric");
    }
}

#[tokio::test(start_paused = true)]
async fn a_secret_matched_while_checking_does_not_refresh_the_record_time() {
    let r = PullRecords::in_memory(VerifyPolicy::default());
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pulled(IMAGE, REF, &ImagePullCredentials::secret(secret("ns", "a", "u1", "h1"))).await.unwrap();
    let pulled = r.record(REF).unwrap().last_updated_time;
    tokio::time::advance(Duration::from_secs(60)).await;
    // The same secret again: served from the record, nothing to write (the kubelet's rule).
    assert!(!r.must_attempt_pull(IMAGE, REF, pod(vec![secret("ns", "a", "u1", "h1")])).await.unwrap());
    assert_eq!(r.record(REF).unwrap().last_updated_time, pulled);
}

#[test]
fn must_pull_results_have_the_kubelets_labels_and_a_stable_index() {
    let labels: Vec<&str> = MustPullResult::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(labels, ["credentialPolicyAllowed", "credentialRecordFound", "mustAuthenticate", "error"]);
    for (i, r) in MustPullResult::ALL.iter().enumerate() {
        assert_eq!(r.index(), i);
    }
}

#[tokio::test]
async fn a_dropped_intent_guard_ends_the_pull_but_keeps_its_intent_and_a_disarmed_one_ends_nothing() {
    let r = PullRecords::in_memory(VerifyPolicy::default());
    let guard = r.begin_pull(IMAGE).await.unwrap();
    assert_eq!(r.stored_intents().len(), 1);
    drop(guard); // the caller gave up mid-pull: the runtime may still pull it
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(r.stored_intents().len(), 1, "the intent stays: the pull's outcome is unknown");
    // A later pull of it that fails does not end the intent either.
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pull_failed(IMAGE).await;
    assert_eq!(r.stored_intents().len(), 1);
    assert!(r.must_attempt_pull(IMAGE, REF, pod(vec![])).await.unwrap(), "never preloaded");

    let r = PullRecords::in_memory(VerifyPolicy::default());
    let guard = r.begin_pull(IMAGE).await.unwrap();
    r.record_image_pulled(IMAGE, REF, &ImagePullCredentials::node_accessible()).await.unwrap();
    guard.disarm();
    r.record_pull_intent(IMAGE).await.unwrap();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(r.stored_intents().len(), 1, "a disarmed guard ends nothing");
}

#[tokio::test]
async fn a_name_imaged_never_pulled_keeps_its_preloaded_standing() {
    // kubernetes/kubernetes#138175: the same image id, pulled with a secret as Y.
    const X: &str = "public.example.org/tools/app:v1";
    let y_secret = ImagePullCredentials::secret(secret("ns", "regcred", "u1", "h1"));
    let preloaded = PullRecords::in_memory(VerifyPolicy::default());
    preloaded.record_image_pulled(IMAGE, REF, &y_secret).await.unwrap();
    assert!(!preloaded.must_attempt_pull(X, REF, pod(vec![])).await.unwrap(), "X stays preloaded");
    assert!(preloaded.must_attempt_pull(IMAGE, REF, pod(vec![])).await.unwrap(), "Y needs its secret");
    // Once imaged pulls X itself (an intent, then a record), X is imaged's.
    let intent = preloaded.begin_pull(X).await.unwrap();
    assert!(preloaded.must_attempt_pull(X, REF, pod(vec![])).await.unwrap(), "a pull of X in flight");
    preloaded.record_image_pulled(X, REF, &y_secret).await.unwrap();
    intent.disarm();
    assert!(preloaded.must_attempt_pull(X, REF, pod(vec![])).await.unwrap(), "X pulled with a secret");
    // A pull that proved nothing (a token through the front) makes its
    // name imaged's though the image has a record under Y.
    let token = PullRecords::in_memory(VerifyPolicy::default());
    token.record_image_pulled(IMAGE, REF, &y_secret).await.unwrap();
    let intent = token.begin_pull(X).await.unwrap();
    token.record_image_pulled(X, REF, &ImagePullCredentials::default()).await.unwrap();
    intent.disarm();
    assert!(token.must_attempt_pull(X, REF, pod(vec![])).await.unwrap(), "X pulled with a token");
    // AlwaysVerify exempts nothing.
    let strict = PullRecords::in_memory(VerifyPolicy::new(VerificationPolicy::AlwaysVerify));
    strict.record_image_pulled(IMAGE, REF, &y_secret).await.unwrap();
    assert!(strict.must_attempt_pull(X, REF, pod(vec![])).await.unwrap());
}

#[tokio::test]
async fn a_pull_whose_outcome_is_unknown_keeps_its_intent_and_the_image_is_never_preloaded() {
    let r = PullRecords::in_memory(VerifyPolicy::default());
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pull_unknown(IMAGE).await;
    assert_eq!(r.stored_intents().len(), 1);
    // The image turned up (the runtime finished the lost pull): it is imaged's,
    // so a pod must show its credentials.
    assert!(r.must_attempt_pull(IMAGE, REF, pod(vec![])).await.unwrap());
    // A later successful pull records the image; the intent still stays, for
    // the next start's recovery.
    r.record_pull_intent(IMAGE).await.unwrap();
    r.record_image_pulled(IMAGE, REF, &ImagePullCredentials::node_accessible()).await.unwrap();
    assert_eq!(r.stored_intents().len(), 1);
    assert!(!r.must_attempt_pull(IMAGE, REF, pod(vec![])).await.unwrap(), "the record lets every pod use it");
    // A known failure of another image ends its intent as before.
    const OTHER: &str = "docker.io/library/other:1";
    r.record_pull_intent(OTHER).await.unwrap();
    r.record_image_pull_failed(OTHER).await;
    assert_eq!(r.stored_intents(), vec![image_key(IMAGE)]);
}

#[tokio::test(start_paused = true)]
async fn pulls_ended_waits_for_the_pulls_in_flight_of_the_image_and_no_longer_than_told() {
    let records = PullRecords::in_memory(VerifyPolicy::default());
    let wait = Duration::from_millis(500);
    assert!(!records.pulls_ended("busybox:1.36", wait).await, "none in flight: nothing to wait for");

    let intent = records.begin_pull("busybox:1.36").await.unwrap();
    let started = tokio::time::Instant::now();
    assert!(records.pulls_ended("docker.io/library/busybox:1.36", wait).await, "one was in flight: look again");
    assert_eq!(started.elapsed(), wait, "still in flight: given up after the wait");
    assert!(!records.pulls_ended("nginx:1.27", wait).await, "another image's pull is not waited for");

    let ending = records.clone();
    let recorder = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        ending.record_image_pulled("busybox:1.36", "sha256:a", &ImagePullCredentials::node_accessible()).await.unwrap();
        intent.disarm();
    });
    let started = tokio::time::Instant::now();
    assert!(records.pulls_ended("busybox:1.36", wait).await, "ended when its record was written");
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    recorder.await.unwrap();
}

/// Synced commits of pull records so far, as `metrics` counts them.
fn synced_commits(metrics: &crate::metrics::Metrics) -> f64 {
    let s = crate::testing::Scrape::parse(&metrics.encode()).unwrap();
    s.value("imaged_store_write_duration_seconds_count", &[("table", "pull_records")]).unwrap_or(0.0)
}

#[tokio::test]
async fn a_burst_of_intents_is_written_in_one_or_two_synced_commits_and_each_pull_counts() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = crate::metrics::Metrics::default();
    let images: Vec<String> = (0..16).map(|i| format!("example.com/burst/app-{i}:1")).collect();
    {
        let st = store(dir.path());
        st.set_metrics(&metrics);
        let r = PullRecords::open(VerifyPolicy::default(), Some(st.clone())).unwrap();
        // They all wait while another write holds the lock; two requests
        // of the first image among them: one intent, two pulls.
        let held = r.inner.writes.lock().await;
        let intents: Vec<_> = images
            .iter()
            .chain(std::iter::once(&images[0]))
            .map(|i| {
                let (r, i) = (r.clone(), i.clone());
                tokio::spawn(async move { r.record_pull_intent(&i).await })
            })
            .collect();
        for _ in 0..100 {
            if r.pull_records_waiting().len() == images.len() + 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(r.pull_records_waiting().len(), images.len() + 1, "all waiting");
        drop(held);
        for done in intents {
            done.await.unwrap().unwrap();
        }
        // The first to get the lock writes them all.
        assert_eq!(synced_commits(&metrics), 1.0, "one sync for the wave, not one per intent");
        let mut want = images.clone();
        want.sort();
        assert_eq!(r.stored_intents(), want);
        // Each request counts its own pull: the first pull of image 0 to
        // end leaves the intent to the second.
        r.record_image_pull_failed(&images[0]).await;
        assert!(r.stored_intents().contains(&images[0]), "the other pull of it is in flight");
        r.record_image_pull_failed(&images[0]).await;
        assert!(!r.stored_intents().contains(&images[0]), "the last ended: deleted");
        assert!(r.pull_records_waiting().is_empty());
        st.fence_as_killed(); // kill -9: synced, so kept
    }
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    let mut rest = images[1..].to_vec();
    rest.sort();
    assert_eq!(r.stored_intents(), rest);
}

/// A regression test for the group's clean-up: a request that gives up
/// before any commit took its intent leaves none (one that gives up after
/// is written with the group, as a crash would leave it: harmless).
#[tokio::test]
async fn an_intent_whose_request_gives_up_waiting_is_not_written_by_the_next_commit() {
    let dir = tempfile::tempdir().unwrap();
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    let (gave_up, next) = ("example.com/team/gave-up:1", "example.com/team/next:1");
    {
        // Another write holds the lock; the request waits, then its caller
        // gives up.
        let held = r.inner.writes.lock().await;
        let waiting = r.record_pull_intent(gave_up);
        let timed_out = tokio::time::timeout(Duration::from_millis(20), waiting).await;
        assert!(timed_out.is_err(), "waits for the lock");
        drop(held);
    }
    assert!(r.pull_records_waiting().is_empty());
    r.record_pull_intent(next).await.unwrap();
    assert_eq!(r.stored_intents(), [next]);
    // What the store holds, too.
    drop(r);
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    assert_eq!(r.stored_intents(), [next]);
}

/// The two images of the pull-end tests.
const FAILED: &str = "example.com/team/failed:1";
const PULLED: &str = "example.com/team/pulled:1";

/// Records over a store in a new directory, a pull of each of `FAILED` and
/// `PULLED` begun (their intents on disk).
async fn two_pulls_begun() -> (tempfile::TempDir, Arc<crate::store::Store>, PullRecords) {
    let dir = tempfile::tempdir().unwrap();
    let st = store(dir.path());
    let r = PullRecords::open(VerifyPolicy::default(), Some(st.clone())).unwrap();
    for image in [FAILED, PULLED] {
        r.record_pull_intent(image).await.unwrap();
    }
    (dir, st, r)
}

#[tokio::test]
async fn an_intent_ended_by_a_write_its_caller_stopped_waiting_for_is_written_again_by_the_next_pull() {
    let (_dir, st, r) = two_pulls_begun().await;
    let on_disk = || {
        let mut v = st.pull_records_state().unwrap().intents;
        v.sort();
        v
    };
    assert_eq!(on_disk(), [FAILED, PULLED]);
    // Each pull's end is dropped after its first poll (an ensure whose
    // caller went away while the intent's deletion was being written).
    let ends = [
        Box::pin(r.record_image_pull_failed(FAILED)) as std::pin::Pin<Box<dyn Future<Output = ()>>>,
        Box::pin(async {
            let _ = r.record_image_pulled(PULLED, REF, &ImagePullCredentials::node_accessible()).await;
        }),
    ];
    for mut end in ends {
        assert!(futures_util::poll!(end.as_mut()).is_pending());
    }
    // The writes land all the same; memory follows them.
    for _ in 0..200 {
        if on_disk() == [PULLED] && r.stored_intents().is_empty() && r.kept_intents() == [PULLED] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(on_disk(), [PULLED], "the failed pull's deletion landed; the pulled one's intent is kept");
    assert_eq!(r.kept_intents(), [PULLED]);
    // The next pulls of both images are on disk before they start.
    for image in [FAILED, PULLED] {
        r.record_pull_intent(image).await.unwrap();
    }
    assert_eq!(on_disk(), [FAILED, PULLED], "no pull without its intent on disk");
}

#[tokio::test]
async fn a_pull_whose_end_cannot_be_written_still_ends_and_keeps_its_intent() {
    let (_dir, st, r) = two_pulls_begun().await;
    st.fence(); // every write refused from here on
    r.record_image_pull_failed(FAILED).await;
    assert!(r.record_image_pulled(PULLED, REF, &ImagePullCredentials::node_accessible()).await.is_err());
    for image in [FAILED, PULLED] {
        // No pull of it in flight: a check does not wait for one.
        assert!(!r.pulls_ended(image, Duration::from_millis(50)).await, "{image} ended");
        // The image counts as pulled by imaged (its outcome is unknown).
        assert!(r.must_attempt_pull(image, REF, pod(vec![])).await.unwrap(), "{image} counts as pulled by imaged");
    }
    // The record's write touched no intent: it stays. The failed deletion
    // might have reached the disk, and writing the intent again was refused
    // too: memory does not claim it, so the next pull writes it.
    assert_eq!(r.stored_intents(), [PULLED]);
    assert!(r.record(REF).is_none(), "the record was not written");
}

#[tokio::test]
async fn a_pull_whose_end_panics_still_ends_and_keeps_its_intent() {
    let (_dir, st, r) = two_pulls_begun().await;
    let key = image_key(FAILED);
    // The panic comes after a commit that deleted the intent.
    let (records, k) = (r.clone(), key.clone());
    let ends = async move {
        let delete = PullRecordsWrite { delete_intents: vec![k], ..Default::default() };
        records.commit(delete).await.unwrap();
        panic!("a bug in a pull's end");
    };
    let ended: Option<()> = to_the_end(&r, Some(key.clone()), ends).await;
    assert_eq!(ended, None, "the caller hears the end did not complete");
    assert!(!r.pulls_ended(FAILED, Duration::from_millis(50)).await, "no pull of it in flight any more");
    assert!(r.state().unknown.contains(&key), "ended as one whose outcome is unknown");
    assert!(r.stored_intents().contains(&FAILED.to_string()), "its intent kept");
    assert!(st.pull_records_state().unwrap().intents.contains(&key), "and on disk again");
    // The other image's pull is untouched.
    assert!(r.pulls_ended(PULLED, Duration::from_millis(10)).await, "still in flight");
}

/// A GC run that begins while a pull's record is being written (stamped,
/// committed, not yet in memory, as on a disk slow to sync) still counts
/// the record among those its detection may keep: pruned after the run, it
/// would leave a present image with neither record nor intent.
#[tokio::test(start_paused = true)]
async fn a_record_being_written_counts_among_the_records_gc_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    crate::blocking::run_inline_on_this_thread(true);
    crate::blocking::answer_inline_after(Some(Box::new(|| Duration::from_millis(10))));
    r.record_pull_intent(PULLED).await.unwrap();
    let writer = r.clone();
    let write =
        tokio::spawn(
            async move { writer.record_image_pulled(PULLED, REF, &ImagePullCredentials::node_accessible()).await },
        );
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Mid-write: on disk, not yet in memory.
    assert!(r.record(REF).is_none());
    let gc_started = r.clock().now();
    // The run's detection lists the image; what it keeps of the records:
    let present: HashSet<String> = r.image_refs().into_iter().filter(|id| id == REF).collect();
    write.await.unwrap().unwrap();
    crate::blocking::answer_inline_after(None);
    crate::blocking::run_inline_on_this_thread(false);
    assert!(r.record(REF).is_some() && r.image_refs() == HashSet::from([REF.to_string()]));
    assert!(r.state().writing.is_empty(), "the write let its ref go");
    assert_eq!(r.prune_unknown_records(present, gc_started).await.unwrap(), 0, "the record stays");
    assert!(r.record(REF).is_some());
}

/// The record of a pull that has ended is owed to its image ref until
/// written, before the answer (an ensure's credentialed pull) or behind it
/// (the CRI front's, an anonymous ensure's): a pod asking meanwhile for the
/// image by another name of its repository (another tag, its digest) waits
/// for it, rather than find no record of that repository and take an image
/// pulled with a secret as preloaded, also when the image has a record
/// under another repository; a write that takes longer than the bound is
/// waited for no longer, and the check decides as it did.
#[tokio::test(start_paused = true)]
async fn a_check_by_another_name_waits_for_the_record_an_ended_pull_owes_and_no_longer_than_the_bound() {
    const OTHER_TAG: &str = "example.com/private:stable";
    let regcred = secret("ns", "regcred", "u1", "h1");
    let dir = tempfile::tempdir().unwrap();
    let r = PullRecords::open(VerifyPolicy::default(), Some(store(dir.path()))).unwrap();
    crate::blocking::run_inline_on_this_thread(true);
    let write_takes = Arc::new(std::sync::Mutex::new(Duration::from_millis(10)));
    let takes = write_takes.clone();
    crate::blocking::answer_inline_after(Some(Box::new(move || *takes.lock().unwrap())));
    let end = |image_ref: &str| PullEnd::Pulled {
        image_ref: image_ref.to_string(),
        credentials: ImagePullCredentials::secret(regcred.clone()),
    };
    let no_secret = || pod(vec![]);

    // Behind the answer.
    r.begin_pull(IMAGE).await.unwrap().disarm();
    let write = r.end_pull_behind(IMAGE.to_string(), end(REF), r.clock().now(), ());
    assert!(r.record(REF).is_none(), "answered; the record is a write away");
    let started = tokio::time::Instant::now();
    assert!(r.must_attempt_pull(OTHER_TAG, REF, no_secret()).await.unwrap(), "no secret: pull");
    assert_eq!(started.elapsed(), Duration::from_millis(10), "decided once the record was written");
    assert!(!r.must_attempt_pull(OTHER_TAG, REF, pod(vec![regcred.clone()])).await.unwrap(), "its secret");
    write.await.unwrap();
    assert!(r.state().owed.is_empty(), "the write let its ref go");

    // Before the answer, the image known under another repository (a
    // mirror's anonymous pull of the same digest).
    const MIRRORED: &str = "sha256:dddd";
    r.begin_pull("mirror.example.org/private:1").await.unwrap().disarm();
    let anonymous = ImagePullCredentials::node_accessible();
    r.record_image_pulled("mirror.example.org/private:1", MIRRORED, &anonymous).await.unwrap();
    assert!(!r.must_attempt_pull(OTHER_TAG, MIRRORED, no_secret()).await.unwrap(), "preloaded under this name");
    r.begin_pull(IMAGE).await.unwrap().disarm();
    let ending = r.clone();
    let ended = end(MIRRORED);
    let write = tokio::spawn(async move { ending.end_pull(IMAGE, ended, ending.clock().now()).await });
    tokio::task::yield_now().await;
    let started = tokio::time::Instant::now();
    assert!(
        r.must_attempt_pull(OTHER_TAG, MIRRORED, no_secret()).await.unwrap(),
        "pulled with a secret as this repository"
    );
    assert_eq!(started.elapsed(), Duration::from_millis(10));
    write.await.unwrap();

    // A disk that stalls: waited for OWED_RECORD_WAIT, then as before.
    const STALLED: &str = "sha256:bbbb";
    *write_takes.lock().unwrap() = Duration::from_secs(60);
    r.begin_pull(IMAGE).await.unwrap().disarm();
    let write = r.end_pull_behind(IMAGE.to_string(), end(STALLED), r.clock().now(), ());
    let started = tokio::time::Instant::now();
    assert!(!r.must_attempt_pull(OTHER_TAG, STALLED, no_secret()).await.unwrap(), "no record yet: preloaded");
    assert_eq!(started.elapsed(), OWED_RECORD_WAIT);
    // A check of an image owed nothing does not wait.
    let started = tokio::time::Instant::now();
    assert!(!r.must_attempt_pull(OTHER_TAG, "sha256:cccc", no_secret()).await.unwrap());
    assert_eq!(started.elapsed(), Duration::ZERO);
    write.await.unwrap();
    crate::blocking::answer_inline_after(None);
    crate::blocking::run_inline_on_this_thread(false);
    assert!(r.record(STALLED).is_some() && r.state().owed.is_empty());
}
