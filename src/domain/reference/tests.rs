//! The grammar's tables (distribution/reference's reference and normalise
//! tests, go-digest's checks, the kubelet's parser tests), rewritten as Rust
//! tables, plus the exact error texts.

use super::*;

const F64: &str = "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";
const E3: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

fn ok(s: &str) -> Named {
    parse_normalized_named(s).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
}

/// Expected outcome of upstream `Parse`: (name, domain, tag, digest) or an error.
type Want = Result<(&'static str, &'static str, Option<&'static str>, Option<String>), ReferenceError>;

fn parse_table() -> Vec<(String, Want)> {
    use ReferenceError::*;
    let sha = |h: &str| Some(format!("sha256:{h}"));
    let sha512 = Some(format!("sha512:{}", "f".repeat(128)));
    vec![
        ("test_com".into(), Ok(("test_com", "", None, None))),
        ("test.com:tag".into(), Ok(("test.com", "", Some("tag"), None))),
        ("test.com:5000".into(), Ok(("test.com", "", Some("5000"), None))),
        ("test.com/repo:tag".into(), Ok(("test.com/repo", "test.com", Some("tag"), None))),
        ("test:5000/repo".into(), Ok(("test:5000/repo", "test:5000", None, None))),
        ("test:5000/repo:tag".into(), Ok(("test:5000/repo", "test:5000", Some("tag"), None))),
        (format!("test:5000/repo@sha256:{F64}"), Ok(("test:5000/repo", "test:5000", None, sha(F64)))),
        (format!("test:5000/repo:tag@sha256:{F64}"), Ok(("test:5000/repo", "test:5000", Some("tag"), sha(F64)))),
        (String::new(), Err(NameEmpty)),
        (":justtag".into(), Err(InvalidFormat)),
        (format!("@sha256:{F64}"), Err(InvalidFormat)),
        (format!("repo@sha256:{}", "f".repeat(34)), Err(DigestInvalidLength)),
        (format!("validname@invaliddigest:{F64}"), Err(DigestUnsupported)),
        ("Uppercase:tag".into(), Err(NameContainsUppercase)),
        ("test:5000/Uppercase/lowercase:tag".into(), Err(NameContainsUppercase)),
        ("lowercase:Uppercase".into(), Ok(("lowercase", "", Some("Uppercase"), None))),
        // Upstream limits the path only since reference v0.6 (PR #9).
        (format!("domain/{}:tag", "a".repeat(256)), Err(NameTooLong)),
        (
            format!("example.com/{}:tag", "a".repeat(255)),
            Ok((&*format!("example.com/{}", "a".repeat(255)).leak(), "example.com", Some("tag"), None)),
        ),
        (format!("{}a:tag", "a/".repeat(128)), Ok((&*format!("{}a", "a/".repeat(128)).leak(), "a", Some("tag"), None))),
        (
            format!("{}a:tag-puts-this-over-max", "a/".repeat(127)),
            Ok((&*format!("{}a", "a/".repeat(127)).leak(), "a", Some("tag-puts-this-over-max"), None)),
        ),
        ("aa/asdf$$^/aa".into(), Err(InvalidFormat)),
        ("sub-dom1.foo.com/bar/baz/quux".into(), Ok(("sub-dom1.foo.com/bar/baz/quux", "sub-dom1.foo.com", None, None))),
        (
            "sub-dom1.foo.com/bar/baz/quux:some-long-tag".into(),
            Ok(("sub-dom1.foo.com/bar/baz/quux", "sub-dom1.foo.com", Some("some-long-tag"), None)),
        ),
        (
            "b.gcr.io/test.example.com/my-app:test.example.com".into(),
            Ok(("b.gcr.io/test.example.com/my-app", "b.gcr.io", Some("test.example.com"), None)),
        ),
        (
            "xn--n3h.com/myimage:xn--n3h.com".into(),
            Ok(("xn--n3h.com/myimage", "xn--n3h.com", Some("xn--n3h.com"), None)),
        ),
        (
            format!("xn--7o8h.com/myimage:xn--7o8h.com@sha512:{}", "f".repeat(128)),
            Ok(("xn--7o8h.com/myimage", "xn--7o8h.com", Some("xn--7o8h.com"), sha512)),
        ),
        ("foo_bar.com:8080".into(), Ok(("foo_bar.com", "", Some("8080"), None))),
        ("foo/foo_bar.com:8080".into(), Ok(("foo/foo_bar.com", "foo", Some("8080"), None))),
        ("192.168.1.1".into(), Ok(("192.168.1.1", "", None, None))),
        ("192.168.1.1:tag".into(), Ok(("192.168.1.1", "", Some("tag"), None))),
        ("192.168.1.1:5000".into(), Ok(("192.168.1.1", "", Some("5000"), None))),
        ("192.168.1.1/repo".into(), Ok(("192.168.1.1/repo", "192.168.1.1", None, None))),
        ("192.168.1.1:5000/repo".into(), Ok(("192.168.1.1:5000/repo", "192.168.1.1:5000", None, None))),
        ("192.168.1.1:5000/repo:5050".into(), Ok(("192.168.1.1:5000/repo", "192.168.1.1:5000", Some("5050"), None))),
        ("[2001:db8::1]".into(), Err(InvalidFormat)),
        ("[2001:db8::1]:5000".into(), Err(InvalidFormat)),
        ("[2001:db8::1]:tag".into(), Err(InvalidFormat)),
        ("[2001:db8::1]/repo".into(), Ok(("[2001:db8::1]/repo", "[2001:db8::1]", None, None))),
        (
            "[2001:db8:1:2:3:4:5:6]/repo:tag".into(),
            Ok(("[2001:db8:1:2:3:4:5:6]/repo", "[2001:db8:1:2:3:4:5:6]", Some("tag"), None)),
        ),
        ("[2001:db8::1]:5000/repo".into(), Ok(("[2001:db8::1]:5000/repo", "[2001:db8::1]:5000", None, None))),
        (
            "[2001:db8::1]:5000/repo:tag".into(),
            Ok(("[2001:db8::1]:5000/repo", "[2001:db8::1]:5000", Some("tag"), None)),
        ),
        (
            format!("[2001:db8::1]:5000/repo@sha256:{F64}"),
            Ok(("[2001:db8::1]:5000/repo", "[2001:db8::1]:5000", None, sha(F64))),
        ),
        (
            format!("[2001:db8::1]:5000/repo:tag@sha256:{F64}"),
            Ok(("[2001:db8::1]:5000/repo", "[2001:db8::1]:5000", Some("tag"), sha(F64))),
        ),
        ("[2001:db8::]:5000/repo".into(), Ok(("[2001:db8::]:5000/repo", "[2001:db8::]:5000", None, None))),
        ("[::1]:5000/repo".into(), Ok(("[::1]:5000/repo", "[::1]:5000", None, None))),
        ("[fe80::1%eth0]:5000/repo".into(), Err(InvalidFormat)),
        ("[fe80::1%@invalidzone]:5000/repo".into(), Err(InvalidFormat)),
        // Beyond upstream's table: the grammar's edges.
        (format!("a:{}", "t".repeat(128)), Ok(("a", "", Some(&*"t".repeat(128).leak()), None))),
        (format!("a:{}", "t".repeat(129)), Err(InvalidFormat)),
        ("a:-tag".into(), Err(InvalidFormat)),
        ("a:_t.A-9".into(), Ok(("a", "", Some("_t.A-9"), None))),
        ("a__b/c---d/e.f_g".into(), Ok(("a__b/c---d/e.f_g", "", None, None))),
        ("a___b".into(), Err(InvalidFormat)),
        ("a._b".into(), Err(InvalidFormat)),
        ("a..b".into(), Err(InvalidFormat)),
        ("a-".into(), Err(InvalidFormat)),
        ("a/".into(), Err(InvalidFormat)),
        ("a//b".into(), Err(InvalidFormat)),
        ("-a.com/b".into(), Err(InvalidFormat)),
        ("a-.com/b".into(), Err(InvalidFormat)),
        ("a-b.com:/b".into(), Err(InvalidFormat)),
        ("a-b.com:x/b".into(), Err(InvalidFormat)),
        ("A-b.COM:80/b".into(), Ok(("A-b.COM:80/b", "A-b.COM:80", None, None))),
        ("[]/b".into(), Err(InvalidFormat)),
        ("[::1]x/b".into(), Err(InvalidFormat)),
        ("a@b".into(), Err(InvalidFormat)),
        (format!("a@sha256:{F64}@x"), Err(InvalidFormat)),
        (format!("a@sha256:{}", "f".repeat(31)), Err(InvalidFormat)),
        (format!("a@SHA256:{F64}"), Err(DigestInvalidFormat)),
        (format!("a@sha256:{}", F64.to_uppercase()), Err(DigestInvalidFormat)),
        (format!("a@sha256:{F64}0"), Err(DigestInvalidLength)),
        (format!("a@sha384:{}", "0".repeat(96)), Ok(("a", "", None, Some(format!("sha384:{}", "0".repeat(96)))))),
        (format!("a@sha512:{F64}"), Err(DigestInvalidLength)),
        (format!("a@md5:{}", "d".repeat(32)), Err(DigestUnsupported)),
        (format!("a@sha-x+b64.x_y:{F64}"), Err(DigestUnsupported)),
        (format!("a@sha-256:{F64}"), Err(InvalidFormat)),
        (format!("a@Md5:{}", "d".repeat(32)), Err(DigestInvalidFormat)),
        (format!("a@1md5:{}", "d".repeat(32)), Err(InvalidFormat)),
        // Go's ToLower maps the Kelvin sign to ASCII `k`: upstream then
        // reports uppercase rather than a bad format.
        ("a:\u{212a}".into(), Err(NameContainsUppercase)),
        ("a:\u{e9}".into(), Err(InvalidFormat)),
    ]
}

#[test]
fn parse_matches_upstreams_reference_table() {
    for (input, want) in parse_table() {
        let got = parse(&input);
        match (&got, &want) {
            (Ok(n), Ok((name, domain, tag, digest))) => {
                assert_eq!(n.to_string(), input, "round trip of {input:?}");
                assert_eq!(
                    (n.name().as_str(), n.domain(), n.tag(), n.digest()),
                    (*name, *domain, *tag, digest.as_deref()),
                    "{input:?}"
                );
            }
            (Err(e), Err(w)) => assert_eq!(e, w, "{input:?}"),
            _ => panic!("{input:?}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn normalized_names_valid_and_invalid() {
    let valid = [
        "docker/docker",
        "library/debian",
        "debian",
        "docker.io/docker/docker",
        "docker.io/library/debian",
        "docker.io/debian",
        "index.docker.io/docker/docker",
        "index.docker.io/library/debian",
        "index.docker.io/debian",
        "127.0.0.1:5000/docker/docker",
        "127.0.0.1:5000/library/debian",
        "127.0.0.1:5000/debian",
        "192.168.0.1",
        "192.168.0.1:80",
        "192.168.0.1:8/debian",
        "192.168.0.2:25000/debian",
        "thisisthesongthatneverendsitgoesonandonandonthisisthesongthatnev",
        "[fc00::1]:5000/docker",
        "[fc00::1]:5000/docker/docker",
        "[fc00:1:2:3:4:5:6:7]:5000/library/debian",
        "docker.io/1a3f5e7d9c1b3a5f7e9d1c3b5a7f9e1d3c5b7a9f1e3d5d7c9b1a3f5e7d9c1b3a",
        "Docker/docker",
        "DOCKER/docker",
        "docker-rules/docker",
        "docker---rules/docker",
        "doc/docker",
        "d/docker",
        "jess/t",
        "dock__er/docker",
    ];
    for name in valid {
        assert!(parse_normalized_named(name).is_ok(), "{name} should be valid: {:?}", parse_normalized_named(name));
    }
    let long_ns =
        format!("{}/docker", "this_is_not_a_valid_namespace_because_its_lenth_is_greater_than_255_".repeat(4));
    let invalid = [
        "https://github.com/docker/docker",
        "docker/Docker",
        "-docker",
        "-docker/docker",
        "-docker.io/docker/docker",
        "docker///docker",
        "docker.io/docker/Docker",
        "docker.io/docker///docker",
        "[fc00::1]",
        "[fc00::1]:5000",
        "fc00::1:5000/debian",
        "[fe80::1%eth0]:5000/debian",
        "[2001:db8:3:4::192.0.2.33]:5000/debian",
        "1a3f5e7d9c1b3a5f7e9d1c3b5a7f9e1d3c5b7a9f1e3d5d7c9b1a3f5e7d9c1b3a",
        "docker-/docker",
        "-docker-/docker",
        "____/____",
        "_docker/_docker",
        "dock..er/docker",
        "dock_.er/docker",
        "dock-.er/docker",
        "docker/",
        &long_ns,
    ];
    for name in invalid {
        assert!(parse_normalized_named(name).is_err(), "{name} should be invalid");
    }
}

#[test]
fn normalisation_follows_upstreams_repository_info_table() {
    // (path, familiar, full, ambiguous, domain)
    let table = [
        ("fooo/bar", "fooo/bar", "docker.io/fooo/bar", "index.docker.io/fooo/bar", "docker.io"),
        ("library/ubuntu", "ubuntu", "docker.io/library/ubuntu", "library/ubuntu", "docker.io"),
        ("nonlibrary/ubuntu", "nonlibrary/ubuntu", "docker.io/nonlibrary/ubuntu", "", "docker.io"),
        ("other/library", "other/library", "docker.io/other/library", "", "docker.io"),
        (
            "private/moonbase",
            "127.0.0.1:8000/private/moonbase",
            "127.0.0.1:8000/private/moonbase",
            "",
            "127.0.0.1:8000",
        ),
        ("privatebase", "127.0.0.1:8000/privatebase", "127.0.0.1:8000/privatebase", "", "127.0.0.1:8000"),
        ("private/moonbase", "example.com/private/moonbase", "example.com/private/moonbase", "", "example.com"),
        ("privatebase", "example.com/privatebase", "example.com/privatebase", "", "example.com"),
        (
            "private/moonbase",
            "example.com:8000/private/moonbase",
            "example.com:8000/private/moonbase",
            "",
            "example.com:8000",
        ),
        ("privatebasee", "example.com:8000/privatebasee", "example.com:8000/privatebasee", "", "example.com:8000"),
        (
            "library/ubuntu-12.04-base",
            "ubuntu-12.04-base",
            "docker.io/library/ubuntu-12.04-base",
            "index.docker.io/library/ubuntu-12.04-base",
            "docker.io",
        ),
        ("library/foo", "foo", "docker.io/library/foo", "docker.io/foo", "docker.io"),
        ("library/foo/bar", "library/foo/bar", "docker.io/library/foo/bar", "", "docker.io"),
        ("store/foo/bar", "store/foo/bar", "docker.io/store/foo/bar", "", "docker.io"),
        ("bar", "Foo/bar", "Foo/bar", "", "Foo"),
        ("bar", "FOO/bar", "FOO/bar", "", "FOO"),
    ];
    for (path, familiar, full, ambiguous, domain) in table {
        for input in [familiar, full, ambiguous].into_iter().filter(|s| !s.is_empty()) {
            let n = ok(input);
            assert_eq!(n.familiar_name(), familiar, "familiar of {input}");
            assert_eq!(n.to_string(), full, "full of {input}");
            assert_eq!(n.domain(), domain, "domain of {input}");
            assert_eq!(n.path(), path, "path of {input}");
        }
    }
}

#[test]
fn normalisation_splits_domain_and_path() {
    let table = [
        ("test.com/foo", "test.com", "foo"),
        ("test_com/foo", "docker.io", "test_com/foo"),
        ("docker/migrator", "docker.io", "docker/migrator"),
        ("test.com:8080/foo", "test.com:8080", "foo"),
        ("test-com:8080/foo", "test-com:8080", "foo"),
        ("foo", "docker.io", "library/foo"),
        ("xn--n3h.com/foo", "xn--n3h.com", "foo"),
        ("xn--n3h.com:18080/foo", "xn--n3h.com:18080", "foo"),
        ("docker.io/foo", "docker.io", "library/foo"),
        ("docker.io/library/foo", "docker.io", "library/foo"),
        ("docker.io/library/foo/bar", "docker.io", "library/foo/bar"),
        ("localhost/foo", "localhost", "foo"),
        ("localhost:5000/foo:1", "localhost:5000", "foo"),
        ("index.docker.io/foo", "docker.io", "library/foo"),
        ("[::1]/foo", "[::1]", "foo"),
        // Upstream quirk: a `.` makes it a domain for the normaliser, the
        // grammar then reads the whole as a path with no domain.
        ("foo_bar.com/x", "", "foo_bar.com/x"),
    ];
    for (input, domain, path) in table {
        let n = ok(input);
        assert_eq!((n.domain(), n.path()), (domain, path), "{input}");
    }
    assert_eq!(ok("foo_bar.com/x:1").to_string(), "foo_bar.com/x:1");
    assert_eq!(trim_image_tag_digest("foo_bar.com/x:1").as_deref(), Ok("foo_bar.com/x"));
}

#[test]
fn tag_and_digest_are_both_kept() {
    let short = "busybox:latest@sha256:86e0e091d0da6bde2456dbb48306f3956bbeb2eae1b5b9a43045843f69fe4aaa";
    let n = ok(short);
    assert_eq!(n.to_string(), format!("docker.io/library/{short}"));
    assert_eq!(n.familiar_string(), short);
    assert_eq!(n.familiar(), short);
    assert_eq!(n.tag(), Some("latest"));
    assert!(n.digest().is_some_and(|d| d.starts_with("sha256:86e0")));
    assert_eq!(n.docker_ref(), format!("docker.io/library/busybox@{}", n.digest().unwrap_or_default()));
    assert_eq!(ok("busybox").docker_ref(), "docker.io/library/busybox:latest");
    assert_eq!(ok("quay.io/a/b:1").docker_ref(), "quay.io/a/b:1");
    assert_eq!(ok("quay.io/a/b:1").familiar_string(), "quay.io/a/b:1");
    for (familiar, full) in [
        ("redis", "docker.io/library/redis"),
        ("redis:latest", "docker.io/library/redis:latest"),
        ("dmcgowan/myapp", "docker.io/dmcgowan/myapp"),
        ("dmcgowan/myapp:latest", "docker.io/dmcgowan/myapp:latest"),
        (&format!("redis@sha256:{E3}"), &format!("docker.io/library/redis@sha256:{E3}")),
        (
            "dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9",
            "docker.io/library/dbcc1c35ac38df41fd2f5e4130b32ffdb93ebae8b3dbe638c23575912276fc9",
        ),
        ("dbcc1", "docker.io/library/dbcc1"),
    ] {
        assert_eq!(ok(familiar).to_string(), full, "{familiar}");
        assert_eq!(ok(full).to_string(), full, "{full}");
    }
}

#[test]
fn normalised_errors_have_upstreams_texts() {
    let hex_err = format!("invalid repository name ({E3}), cannot specify 64-byte hexadecimal strings");
    let max_path = "a".repeat(NAME_TOTAL_LENGTH_MAX - OFFICIAL_REPO_PREFIX.len());
    let too_long = format!("{max_path}a");
    let table: Vec<(String, String)> = vec![
        (String::new(), "invalid reference format".into()),
        (":".into(), "invalid reference format".into()),
        ("nodejs::".into(), "invalid reference format".into()),
        ("nodejs@@".into(), "invalid reference format".into()),
        ("nodejs@sha256:asdf@".into(), "invalid reference format".into()),
        ("http://root".into(), "invalid reference format".into()),
        ("busybox:".into(), "invalid reference format".into()),
        ("foo_bar.com:8080/baz".into(), "invalid reference format".into()),
        ("ROOT".into(), "invalid reference format: repository name (library/ROOT) must be lowercase".into()),
        ("Busybox:1".into(), "invalid reference format: repository name (library/Busybox) must be lowercase".into()),
        ("user/App:1".into(), "invalid reference format: repository name (user/App) must be lowercase".into()),
        ("UPPER/Case".into(), "invalid reference format: repository name (Case) must be lowercase".into()),
        ("example.com/Foo".into(), "invalid reference format: repository name (Foo) must be lowercase".into()),
        (
            format!("Foo@sha256:{E3}"),
            "invalid reference format: repository name (library/Foo@sha256) must be lowercase".into(),
        ),
        (
            "test:5000/Uppercase/lowercase:tag".into(),
            "invalid reference format: repository name (Uppercase/lowercase) must be lowercase".into(),
        ),
        ("Foo_x/bar".into(), "repository name must be lowercase".into()),
        ("a.B_c/d".into(), "repository name must be lowercase".into()),
        (E3.into(), hex_err),
        (too_long, "repository name must not be more than 255 characters".into()),
        (format!("busybox@sha256:{}", &E3[..60]), "invalid checksum digest length".into()),
        (format!("busybox@sha256:{}", E3.to_uppercase()), "invalid checksum digest format".into()),
        (format!("busybox@sha1:{E3}"), "unsupported digest algorithm".into()),
    ];
    for (input, text) in table {
        match parse_normalized_named(&input) {
            Err(e) => assert_eq!(e.to_string(), text, "{input:?}"),
            Ok(n) => panic!("{input:?} parsed as {n}"),
        }
    }
    assert!(parse_normalized_named(&max_path).is_ok());
    // The domain does not count towards the limit.
    assert!(parse_normalized_named(&format!("registry.example.com:5000/{}", "a".repeat(255))).is_ok());
    assert!(parse_normalized_named(&format!("registry.example.com:5000/{}", "a".repeat(256))).is_err());
    assert_eq!(ReferenceError::NameEmpty.to_string(), "repository name must have at least one component");
}

#[test]
fn go_digest_validation() {
    use ReferenceError::*;
    let table: Vec<(String, Result<(), ReferenceError>)> = vec![
        (format!("sha256:{E3}"), Ok(())),
        (format!("sha384:{}", "a".repeat(96)), Ok(())),
        (format!("sha512:{}", "b".repeat(128)), Ok(())),
        (format!("sha256:{}", &E3[1..]), Err(DigestInvalidLength)),
        (format!("sha256:{}z", &E3[1..]), Err(DigestInvalidFormat)),
        (format!("sha512:{E3}"), Err(DigestInvalidLength)),
        ("sha256".into(), Err(DigestInvalidFormat)),
        ("sha256:".into(), Err(DigestInvalidFormat)),
        (":abc".into(), Err(DigestInvalidFormat)),
        ("foo:bar".into(), Err(DigestUnsupported)),
        ("foo+b64:YWJj=".into(), Err(DigestUnsupported)),
        ("Foo:bar".into(), Err(DigestInvalidFormat)),
        ("foo:b:r".into(), Err(DigestInvalidFormat)),
        ("foo..x:bar".into(), Err(DigestInvalidFormat)),
    ];
    for (d, want) in table {
        assert_eq!(validate_digest(&d), want, "{d}");
    }
}

#[test]
fn kubelet_parse_image_name() {
    let d = format!("sha256:{E3}");
    let table: Vec<(String, &str, &str, &str)> = vec![
        ("root".into(), "docker.io/library/root", "latest", ""),
        ("root:tag".into(), "docker.io/library/root", "tag", ""),
        (format!("root@{d}"), "docker.io/library/root", "", &d),
        ("user/repo".into(), "docker.io/user/repo", "latest", ""),
        ("user/repo:tag".into(), "docker.io/user/repo", "tag", ""),
        (format!("user/repo@{d}"), "docker.io/user/repo", "", &d),
        ("url:5000/repo".into(), "url:5000/repo", "latest", ""),
        ("url:5000/repo:tag".into(), "url:5000/repo", "tag", ""),
        (format!("url:5000/repo@{d}"), "url:5000/repo", "", &d),
        (format!("url:5000/repo:latest@{d}"), "url:5000/repo", "latest", &d),
    ];
    for (input, repo, tag, digest) in table {
        let got = parse_image_name(&input);
        assert_eq!(got, Ok((repo.to_string(), tag.to_string(), digest.to_string())), "{input}");
        assert_eq!(trim_image_tag_digest(&input).as_deref(), Ok(repo), "{input}");
        assert_eq!(repository_of(&input).as_deref(), Ok(repo), "{input}");
    }
    for bad in ["ROOT", "http://root", "root:tag:tag", "", "a\tb"] {
        assert!(parse_image_name(bad).is_err(), "{bad}");
    }
    let err = |s: &str| parse_image_name(s).map(|_| ()).map_err(|e| e.to_string());
    assert_eq!(err("a\tb"), Err("couldn't parse image name \"a\\tb\": invalid reference format".into()));
    // Only the image is Go-quoted; the grammar's text embeds it raw.
    assert_eq!(
        err("a\tB"),
        Err("couldn't parse image name \"a\\tB\": invalid reference format: repository name (library/a\tB) must be lowercase"
            .into())
    );
}

#[test]
fn kubelet_apply_default_image_tag() {
    let d = format!("sha256:{E3}");
    let table: Vec<(String, String)> = vec![
        ("root".into(), "root:latest".into()),
        ("root:tag".into(), "root:tag".into()),
        (format!("root@{d}"), format!("root@{d}")),
        (format!("root:latest@{d}"), format!("root:latest@{d}")),
        ("root:latest".into(), "root:latest".into()),
        ("localhost:5000/foo".into(), "localhost:5000/foo:latest".into()),
        ("docker.io/library/busybox".into(), "docker.io/library/busybox:latest".into()),
    ];
    for (input, want) in table {
        assert_eq!(apply_default_image_tag(&input), Ok(want), "{input}");
    }
    let err = apply_default_image_tag("Busybox").map_err(|e| e.to_string());
    assert_eq!(
        err,
        Err("couldn't parse image name \"Busybox\": invalid reference format: repository name (library/Busybox) must be lowercase"
            .into())
    );
}

/// Every short string over an alphabet of the grammar's special
/// characters: no input panics, and the parsers agree with each other.
#[test]
fn no_input_panics_and_results_are_consistent() {
    let alphabet = ['a', 'B', '0', '.', '_', '-', '/', ':', '@', '[', ']', 'é', '\u{130}'];
    let mut inputs = vec![String::new()];
    let mut frontier = vec![String::new()];
    for _ in 0..4 {
        frontier = frontier.iter().flat_map(|p| alphabet.iter().map(move |c| format!("{p}{c}"))).collect();
        inputs.extend(frontier.iter().cloned());
    }
    for s in &inputs {
        let _ = parse(s);
        if let Ok(n) = parse_normalized_named(s) {
            // A normalised reference re-parses to itself.
            assert_eq!(parse(&n.to_string()).as_ref(), Ok(&n), "{s:?}");
            assert_eq!(parse_normalized_named(&n.to_string()).as_ref(), Ok(&n), "{s:?}");
            assert!(apply_default_image_tag(s).is_ok());
        } else {
            assert!(parse_image_name(s).is_err());
        }
    }
}

#[test]
fn one_image_under_its_familiar_and_full_names_is_the_same_image() {
    for (a, b) in [
        ("nginx", "docker.io/library/nginx:latest"),
        ("nginx:latest", "docker.io/library/nginx"),
        ("doesnotexist/foo:1", "docker.io/doesnotexist/foo:1"),
        ("index.docker.io/x/y:2", "x/y:2"),
        ("Bad Name", "Bad Name"),
    ] {
        assert!(same_image(a, b), "{a} = {b}");
        assert!(same_image(b, a), "{b} = {a}");
    }
    for (a, b) in [
        ("nginx:1.27", "nginx:1.28"),
        ("nginx", "quay.io/library/nginx"),
        ("Bad Name", "bad name"),
        ("Bad Name", "busybox"),
        ("busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000", "busybox"),
    ] {
        assert!(!same_image(a, b), "{a} != {b}");
    }
}

// === properties ===

#[allow(clippy::pedantic)] // test code: pedantic lints are for what ships
mod props {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::go_text::quote;

    /// A path component: `[a-z0-9]+ (separator [a-z0-9]+)*`.
    fn component() -> impl Strategy<Value = String> {
        "[a-z0-9]{1,8}(([._]|__|-{1,3})[a-z0-9]{1,8}){0,2}"
    }

    fn domain() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9]([a-zA-Z0-9-]{0,6}[a-z0-9])?(\\.[a-zA-Z0-9]{1,5}){0,2}(:[0-9]{1,5})?",
            Just("localhost".to_string()),
            // An IPv6 address has a `:` (what tells the normaliser it is a domain).
            "\\[[0-9a-f]{0,4}:[0-9a-f:]{0,10}\\](:[0-9]{1,5})?",
        ]
    }

    /// A reference the grammar accepts, written out: domain, path, tag, digest.
    fn valid_reference() -> impl Strategy<Value = (Option<String>, String, Option<String>, Option<String>)> {
        (
            proptest::option::of(domain()),
            prop::collection::vec(component(), 1..4).prop_map(|c| c.join("/")),
            proptest::option::of("[A-Za-z0-9_][A-Za-z0-9_.-]{0,30}"),
            proptest::option::of("[0-9a-f]{64}".prop_map(|h| format!("sha256:{h}"))),
        )
    }

    fn write((domain, path, tag, digest): &(Option<String>, String, Option<String>, Option<String>)) -> String {
        let mut s = domain.as_ref().map_or_else(|| path.clone(), |d| format!("{d}/{path}"));
        if let Some(t) = tag {
            s.push(':');
            s.push_str(t);
        }
        if let Some(d) = digest {
            s.push('@');
            s.push_str(d);
        }
        s
    }

    /// Strings over the grammar's special characters (and a few that are
    /// not ASCII, `İ` lower-cases to two bytes fewer): the corners.
    fn reference_ish() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9.:/@_\\-\\[\\]İé ]{0,80}"
    }

    fn check_any(s: &str) {
        let _ = parse(s);
        let _ = trim_image_tag_digest(s);
        match parse_normalized_named(s) {
            Ok(n) => {
                // What parses prints back to a string that parses to it.
                assert_eq!(parse(&n.to_string()).as_ref(), Ok(&n), "{s:?}");
                assert_eq!(parse_normalized_named(&n.to_string()).as_ref(), Ok(&n), "{s:?}");
                assert!(apply_default_image_tag(s).is_ok(), "{s:?}");
            }
            Err(_) => {
                // The kubelet's error names the image as given.
                let e = parse_image_name(s).expect_err("the normaliser refused it");
                assert!(e.to_string().contains(&quote(s)), "{e} does not name {s:?}");
                assert!(apply_default_image_tag(s).is_err(), "{s:?}");
            }
        }
    }

    proptest! {
        #![proptest_config(crate::testing::props::config(256))]

        #[test]
        fn any_string_parses_or_is_refused_naming_it(s in any::<String>()) {
            check_any(&s);
        }

        #[test]
        fn reference_like_strings_parse_or_are_refused_naming_them(s in reference_ish()) {
            check_any(&s);
        }

        #[test]
        fn a_valid_reference_round_trips(r in valid_reference()) {
            let text = write(&r);
            let n = parse(&text).map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
            prop_assert_eq!(n.to_string(), text.clone());
            prop_assert_eq!(n.tag(), r.2.as_deref());
            prop_assert_eq!(n.digest(), r.3.as_deref());
            // Normalised, it keeps its tag and digest and round-trips too.
            let normal = parse_normalized_named(&text).map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
            prop_assert_eq!(parse_normalized_named(&normal.to_string()), Ok(normal.clone()));
            prop_assert_eq!(normal.tag(), r.2.as_deref());
            prop_assert_eq!(normal.digest(), r.3.as_deref());
        }

        #[test]
        fn a_valid_reference_with_one_byte_changed_never_panics(
            r in valid_reference(),
            at in any::<prop::sample::Index>(),
            c in any::<char>(),
        ) {
            let mut chars: Vec<char> = write(&r).chars().collect();
            let i = at.index(chars.len());
            chars[i] = c;
            check_any(&chars.into_iter().collect::<String>());
        }
    }
}
