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
fn capacity_is_enforced_and_reported() {
    let mut s = state();
    s.capacity_bytes = 120;
    pull(&mut s, "busybox:1.36", None).unwrap();
    let e = pull(&mut s, "example.com:5000/team/app:v1", Some(&AuthConfig::basic("", "u", "p"))).unwrap_err();
    assert!(e.message().contains("no space left on device"));
    let fs = s.image_fs_info();
    assert_eq!(fs.image_filesystems[0].used_bytes, Some(100));
}
