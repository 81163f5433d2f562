use super::*;

#[test]
fn a_pull_proves_what_its_credential_proves_and_an_unknown_index_proves_nothing() {
    let secret = ImagePullCredentials::secret(ImagePullSecret {
        uid: "u".into(),
        namespace: "ns".into(),
        name: "regcred".into(),
        credential_hash: "h".into(),
    });
    let proves = [secret.clone(), ImagePullCredentials::node_accessible()];
    assert_eq!(credentials_used(&proves, Some(0), "a:1"), secret);
    assert_eq!(credentials_used(&proves, Some(1), "a:1"), ImagePullCredentials::node_accessible());
    // Anonymous pull: every pod may use the image.
    assert_eq!(credentials_used(&proves, None, "a:1"), ImagePullCredentials::node_accessible());
    // An index the request never had grants nobody anything.
    let none = credentials_used(&proves, Some(2), "a:1");
    assert!(none.is_empty() && !none.node_pods_accessible, "{none:?}");
    assert!(credentials_used(&[], Some(0), "a:1").is_empty());
}
