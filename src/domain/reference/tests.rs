//! The grammar's table: inputs, their normalised parts, and upstream's errors.

use super::*;

const HEX64: &str = "7cc4b5aefd1d0cadf8d97d4350462ba51c694ebca145b08d7d41b41acc8db5aa";

fn ok(s: &str) -> Named {
    parse_normalized_named(s).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
}

#[test]
#[allow(clippy::type_complexity)]
fn familiar_and_full_names_normalise_as_upstream() {
    let table: &[(&str, &str, &str, Option<&str>, Option<String>)] = &[
        ("busybox", "docker.io", "library/busybox", None, None),
        ("busybox:1.36", "docker.io", "library/busybox", Some("1.36"), None),
        ("library/busybox", "docker.io", "library/busybox", None, None),
        ("docker.io/busybox", "docker.io", "library/busybox", None, None),
        ("index.docker.io/busybox", "docker.io", "library/busybox", None, None),
        ("index.docker.io/user/app:v1", "docker.io", "user/app", Some("v1"), None),
        ("user/app", "docker.io", "user/app", None, None),
        ("localhost/app", "localhost", "app", None, None),
        ("localhost:5000/app:1", "localhost:5000", "app", Some("1"), None),
        ("example.com/a/b/c:tag", "example.com", "a/b/c", Some("tag"), None),
        ("127.0.0.1:5000/foo", "127.0.0.1:5000", "foo", None, None),
        ("[::1]:5000/foo:x", "[::1]:5000", "foo", Some("x"), None),
        ("[2001:db8::1]/foo", "[2001:db8::1]", "foo", None, None),
        ("Example.com/foo", "Example.com", "foo", None, None),
        ("a.b-c/d__e/f--g/h.i_j:1_A.b-c", "a.b-c", "d__e/f--g/h.i_j", Some("1_A.b-c"), None),
        ("registry.k8s.io/pause:3.10", "registry.k8s.io", "pause", Some("3.10"), None),
        (&format!("busybox@sha256:{HEX64}"), "docker.io", "library/busybox", None, Some(format!("sha256:{HEX64}"))),
        (
            &format!("busybox:latest@sha256:{HEX64}"),
            "docker.io",
            "library/busybox",
            Some("latest"),
            Some(format!("sha256:{HEX64}")),
        ),
    ];
    for (input, domain, path, tag, digest) in table {
        let n = ok(input);
        assert_eq!((n.domain(), n.path(), n.tag(), n.digest()), (*domain, *path, *tag, digest.as_deref()), "{input}");
    }
    assert_eq!(ok("busybox").to_string(), "docker.io/library/busybox");
    assert_eq!(ok("busybox:1").familiar(), "busybox:1");
    assert_eq!(ok("quay.io/a/b").familiar(), "quay.io/a/b");
    assert_eq!(ok("docker.io/user/app").familiar(), "user/app");
    assert_eq!(ok("busybox").docker_ref(), "docker.io/library/busybox:latest");
    assert_eq!(
        ok(&format!("busybox:1@sha256:{HEX64}")).docker_ref(),
        format!("docker.io/library/busybox@sha256:{HEX64}")
    );
}

#[test]
fn digests_follow_go_digest() {
    assert!(ok(&format!("a@sha384:{}", "b".repeat(96))).digest().is_some());
    assert!(ok(&format!("a@sha512:{}", "c".repeat(128))).digest().is_some());
    let cases = [
        (format!("a@sha256:{}", &HEX64[..63]), ReferenceError::DigestInvalidLength),
        (format!("a@sha256:{}", HEX64.to_uppercase()), ReferenceError::DigestInvalidFormat),
        (format!("a@md5:{}", "d".repeat(32)), ReferenceError::DigestUnsupported),
        (format!("a@sha256:{}", "e".repeat(31)), ReferenceError::InvalidFormat),
    ];
    for (input, want) in cases {
        assert_eq!(parse_normalized_named(&input), Err(want), "{input}");
    }
}

#[test]
fn invalid_references_fail_with_upstreams_texts() {
    let long = "a".repeat(NAME_TOTAL_LENGTH_MAX - "library/".len() + 1);
    let max = "a".repeat(NAME_TOTAL_LENGTH_MAX - "library/".len());
    assert!(parse_normalized_named(&max).is_ok());
    let hex_err = format!("invalid repository name ({HEX64}), cannot specify 64-byte hexadecimal strings");
    let table: Vec<(String, &str)> = vec![
        ("".into(), "invalid reference format"),
        ("Busybox".into(), "invalid reference format: repository name (library/Busybox) must be lowercase"),
        ("UPPER/Case".into(), "invalid reference format: repository name (Case) must be lowercase"),
        ("user/App:1".into(), "invalid reference format: repository name (user/App) must be lowercase"),
        (HEX64.into(), hex_err.as_str()),
        ("http://busybox".into(), "invalid reference format"),
        ("busybox:".into(), "invalid reference format"),
        ("-busybox".into(), "invalid reference format"),
        ("busybox/".into(), "invalid reference format"),
        ("a//b".into(), "invalid reference format"),
        ("foo_bar.com:8080/baz".into(), "invalid reference format"),
        ("busybox:a b".into(), "invalid reference format"),
        (format!("busybox:{}", "t".repeat(129)), "invalid reference format"),
        (long, "repository name must not be more than 255 characters"),
        ("example.com/Foo".into(), "invalid reference format: repository name (Foo) must be lowercase"),
    ];
    for (input, text) in table {
        let err = parse_normalized_named(&input).expect_err(&input);
        assert_eq!(err.to_string(), text, "{input:?}");
    }
    assert!(parse_normalized_named(&format!("busybox:{}", "t".repeat(128))).is_ok());
}

#[test]
fn parse_reports_uppercase_and_empty_like_upstream() {
    assert_eq!(parse(""), Err(ReferenceError::NameEmpty));
    assert_eq!(parse("Docker.io/Library/Busybox").map(|_| ()), Err(ReferenceError::NameContainsUppercase));
    assert_eq!(ReferenceError::NameEmpty.to_string(), "repository name must have at least one component");
}

#[test]
fn kubelet_parse_image_name_and_default_tag() {
    assert_eq!(
        parse_image_name("busybox").unwrap(),
        ("docker.io/library/busybox".into(), "latest".into(), String::new())
    );
    assert_eq!(parse_image_name(&format!("busybox@sha256:{HEX64}")).unwrap().1, "");
    assert_eq!(apply_default_image_tag("busybox").unwrap(), "busybox:latest");
    assert_eq!(apply_default_image_tag("busybox:1").unwrap(), "busybox:1");
    assert_eq!(apply_default_image_tag("busybox:latest").unwrap(), "busybox:latest");
    assert_eq!(apply_default_image_tag("localhost:5000/foo").unwrap(), "localhost:5000/foo:latest");
    let digested = format!("busybox@sha256:{HEX64}");
    assert_eq!(apply_default_image_tag(&digested).unwrap(), digested);
    let err = apply_default_image_tag("Busybox").unwrap_err();
    assert_eq!(
        err.to_string(),
        "couldn't parse image name \"Busybox\": invalid reference format: repository name (library/Busybox) must be lowercase"
    );
    assert_eq!(repository_of("nginx:1.27").unwrap(), "docker.io/library/nginx");
}
