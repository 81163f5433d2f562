use super::*;
use crate::domain::Secret;

fn state() -> State {
    let mut s = State::default();
    s.add_remote(RemoteImage::new("busybox:1.36", 100)).unwrap();
    s.add_remote(RemoteImage::new("busybox:latest", 100).with_id(RemoteImage::new("busybox:1.36", 100).id)).unwrap();
    s.add_remote(RemoteImage::new("example.com:5000/team/app:v1", 50).private("u", "p")).unwrap();
    s
}

fn pull(s: &mut State, image: &str, auth: Option<&AuthConfig>) -> Result<String, CriError> {
    let spec = ImageSpec::new(image);
    let p = s.plan_pull(&spec, auth)?;
    Ok(s.finish_pull(&p, &spec))
}

#[test]
fn two_tags_of_one_image_share_it_and_removing_one_tag_removes_the_image() {
    let mut s = state();
    let a = pull(&mut s, "busybox:1.36", None).unwrap();
    let b = pull(&mut s, "busybox", None).unwrap();
    assert_eq!(a, b);
    assert_eq!(s.images.len(), 1);
    assert_eq!(s.images[&a].repo_tags, ["docker.io/library/busybox:1.36", "docker.io/library/busybox:latest"]);
    s.remove_image(&ImageSpec::new("busybox:latest")).unwrap();
    assert!(s.images.is_empty());
}

#[test]
fn pull_by_digest_records_no_tag() {
    let mut s = state();
    let digest = s.catalogue["docker.io/library/busybox:1.36"].digest.clone();
    let id = pull(&mut s, &format!("busybox@{digest}"), None).unwrap();
    assert!(s.images[&id].repo_tags.is_empty());
    assert_eq!(s.images[&id].repo_digests, [format!("docker.io/library/busybox@{digest}")]);
    assert!(s.resolve(&id).is_some(), "found by id");
}

#[test]
fn a_tag_moves_to_the_newly_pulled_image() {
    let mut s = state();
    let old = pull(&mut s, "busybox:latest", None).unwrap();
    s.add_remote(RemoteImage::new("busybox:latest", 300).with_id("sha256:feed")).unwrap();
    let new = pull(&mut s, "busybox:latest", None).unwrap();
    assert_ne!(old, new);
    assert!(!s.images[&old].repo_tags.contains(&"docker.io/library/busybox:latest".to_string()));
    assert_eq!(s.resolve("busybox:latest").map(|i| i.id.as_str()), Some("sha256:feed"));
}

#[test]
fn private_images_take_basic_or_auth_credentials() {
    let mut s = state();
    let img = "example.com:5000/team/app:v1";
    let basic = AuthConfig::basic("https://example.com:5000", "u", "p");
    assert!(pull(&mut s, img, Some(&basic)).is_ok());
    let auth = AuthConfig { auth: Secret::new("dTpw"), ..AuthConfig::default() }; // base64("u:p"), unpadded
    assert!(pull(&mut s, img, Some(&auth)).is_ok());
    let wrong = AuthConfig::basic("", "u", "x");
    let e = pull(&mut s, img, Some(&wrong)).unwrap_err();
    assert_eq!(e.kind(), crate::cri::CriErrorKind::Unauthorized);
    assert!(
        e.message()
            .contains("pulling from host example.com:5000 failed with status code [manifests v1]: 401 Unauthorized"),
        "{e}"
    );
    let no_scheme = AuthConfig::basic("example.com:5000", "u", "p");
    let e = pull(&mut s, img, Some(&no_scheme)).unwrap_err();
    assert!(e.message().contains("example.com:5000"), "{e}");
}

#[test]
fn a_private_image_takes_a_robot_account_it_also_accepts() {
    let mut s = state();
    s.add_remote(RemoteImage::new("example.com/team/db:1", 50).private("u", "p").also_accepts("robot", "r")).unwrap();
    let img = "example.com/team/db:1";
    assert!(pull(&mut s, img, Some(&AuthConfig::basic("", "robot", "r"))).is_ok());
    assert!(pull(&mut s, img, Some(&AuthConfig::basic("", "u", "p"))).is_ok());
    let e = pull(&mut s, img, Some(&AuthConfig::basic("", "robot", "p"))).unwrap_err();
    assert_eq!(e.kind(), crate::cri::CriErrorKind::Unauthorized);
    // Only the image that names it takes it.
    let e = pull(&mut s, "example.com:5000/team/app:v1", Some(&AuthConfig::basic("", "robot", "r"))).unwrap_err();
    assert_eq!(e.kind(), crate::cri::CriErrorKind::Unauthorized);
}

#[test]
fn capacity_is_enforced_and_reported() {
    let mut s = state();
    s.capacity_bytes = 120;
    pull(&mut s, "busybox:1.36", None).unwrap();
    let e = pull(&mut s, "example.com:5000/team/app:v1", Some(&AuthConfig::basic("", "u", "p"))).unwrap_err();
    assert!(e.message().contains("no space left on device"));
    let fs = s.image_fs_info();
    assert_eq!(fs.image_filesystems[0].used_bytes, Some(100));
}

/// Three images whose ids are `sha256:abc1…`, `sha256:abc2…` and `sha256:def0…`.
fn three_with_close_ids() -> (State, [String; 3]) {
    let id = |p: &str| format!("sha256:{p}{}", "0".repeat(60));
    let ids = [id("abc1"), id("abc2"), id("def0")];
    let mut s = State::default();
    for (name, id) in ["busybox:1.36", "nginx:1.27", "redis:7"].into_iter().zip(&ids) {
        s.add_remote(RemoteImage::new(name, 100).with_id(id.clone())).unwrap();
        assert_eq!(&pull(&mut s, name, None).unwrap(), id);
    }
    (s, ids)
}

#[test]
fn an_unambiguous_id_prefix_names_the_image_with_or_without_its_algorithm() {
    let (s, ids) = three_with_close_ids();
    let status = |r: &str| s.image_status(&ImageSpec::new(r)).unwrap().map(|i| i.id);
    for (r, want) in [
        ("sha256:abc1", &ids[0]),
        ("abc1", &ids[0]),
        ("abc1000", &ids[0]),
        (ids[0].as_str(), &ids[0]),
        ("def", &ids[2]),
        ("d", &ids[2]),
    ] {
        assert_eq!(status(r).as_ref(), Some(want), "{r}");
    }
    for r in ["sha512:abc1", "fff", "sha256:", "abc10001", "sha256:abc1x"] {
        assert_eq!(status(r), None, "{r} names no image");
    }
}

#[test]
fn an_ambiguous_id_prefix_is_containerds_error_and_removes_nothing() {
    let (mut s, ids) = three_with_close_ids();
    for r in ["abc", "sha256:abc", "sha256:a"] {
        let e = s.image_status(&ImageSpec::new(r)).unwrap_err();
        assert_eq!(e.code(), StatusCode::Unknown, "{r}");
        assert_eq!(e.message(), format!("can not resolve {r:?} locally: ambiguous digest string"));
        let e = s.remove_image(&ImageSpec::new(r)).unwrap_err();
        assert_eq!(e.code(), StatusCode::Unknown, "{r}");
        assert_eq!(s.images.len(), 3, "{r} removed nothing");
    }
    // Once one of them is gone, the prefix names the other.
    s.remove_image(&ImageSpec::new("sha256:abc2")).unwrap();
    assert!(!s.images.contains_key(&ids[1]));
    s.remove_image(&ImageSpec::new("abc")).unwrap();
    assert_eq!(s.images.keys().collect::<Vec<_>>(), [&ids[2]]);
    s.remove_image(&ImageSpec::new("abc")).unwrap();
    assert_eq!(s.images.len(), 1, "an absent prefix is success, as an absent image");
}
