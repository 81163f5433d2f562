use super::*;
use crate::domain::reference::parse_normalized_named;

fn cred(user: &str) -> Credential {
    Credential::new(user, format!("{user}-password"), "")
}

fn keyring(keys: &[(&str, &str)]) -> Keyring {
    let mut k = Keyring::new();
    for (key, user) in keys {
        k.add(key, cred(user)).expect("valid key");
    }
    k
}

fn users(creds: &[Credential]) -> Vec<&str> {
    creds.iter().map(|c| c.username.as_str()).collect()
}

#[test]
fn key_normalisation_table() {
    let cases: &[(&str, &str)] = &[
        ("https://index.docker.io/v1/", "index.docker.io"),
        ("index.docker.io", "index.docker.io"),
        ("http://foo.example.com:5000/v2/", "foo.example.com:5000"),
        ("registry.io/team", "registry.io/team"),
        ("registry.io/", "registry.io"),
        ("registry.io", "registry.io"),
        ("https://registry.io/v2/team/app", "registry.io/team/app"),
        ("registry.io/v1", "registry.io/v1"),
        ("registry.io/v3/", "registry.io/v3/"),
        ("https://user:pw@registry.io:443/", "registry.io:443"),
        ("registry.io/a?query#frag", "registry.io/a"),
        ("reg?.io", "reg"),
        ("registry.io/a%20b", "registry.io/a b"),
        ("*.example.com", "*.example.com"),
        ("[::1]:5000", "[::1]:5000"),
        ("localhost:", "localhost:"),
    ];
    for (input, want) in cases {
        assert_eq!(normalize_key(input).as_deref(), Ok(*want), "normalize_key({input:?})");
    }
}

#[test]
fn invalid_keys_are_rejected_and_redacted() {
    let cases: &[(&str, UrlError)] = &[
        ("registry.io:port", UrlError::InvalidPort(":port".into())),
        ("registry io", UrlError::InvalidHostCharacter(' ')),
        ("reg{istry}.io", UrlError::InvalidHostCharacter('{')),
        ("registry.io/%zz", UrlError::InvalidEscape("%zz".into())),
        ("registry.io/\n", UrlError::ControlCharacter),
        ("[::1", UrlError::MissingBracket),
        ("https://us er:hunter2@registry.io", UrlError::InvalidUserinfo),
    ];
    for (input, want) in cases {
        let err = normalize_key(input).expect_err(input);
        assert_eq!(&err.reason, want, "{input:?}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
    let err = normalize_key("https://us er:hunter2@registry.io").expect_err("bad userinfo");
    assert_eq!(err.entry, "https://<redacted>@registry.io");
    let mut k = Keyring::new();
    assert!(k.add("registry.io:port", cred("a")).is_err());
    assert!(k.is_empty());
}

#[test]
fn index_is_reverse_lexicographic_and_unique() {
    let k = keyring(&[
        ("quay.io", "1"),
        ("https://quay.io/coreos", "2"),
        ("gcr.io", "3"),
        ("quay.io/coreos/etcd", "4"),
        ("https://quay.io/v1/", "5"),
    ]);
    assert_eq!(k.index(), vec!["quay.io/coreos/etcd", "quay.io/coreos", "quay.io", "gcr.io"]);
    // More specific paths first; entries under one key in insertion order.
    assert_eq!(users(&k.lookup("quay.io/coreos/etcd")), vec!["4", "2", "1", "5"]);
    assert_eq!(users(&k.lookup("quay.io/other/app")), vec!["1", "5"]);
    assert_eq!(k.lookup("quay.io/coreos/etcd")[0].key, "quay.io/coreos/etcd");
}

#[test]
fn urls_match_table() {
    let cases: &[(&str, &str, bool)] = &[
        ("*.example.com", "a.example.com/app", true),
        ("*.example.com", "a.b.example.com/app", false),
        ("*.example.com", "example.com/app", false),
        ("*.io", "a.b.io/app", false),
        ("*.*.io", "a.b.io/app", true),
        // As in the kubelet, `?` starts the URL's query: `reg?.io` is host `reg`.
        ("reg?.io", "reg1.io/app", false),
        ("reg?.io", "reg/app", true),
        ("re*", "reg/app", true),
        ("reg[0-9].io", "reg7.io/app", true),
        ("reg[0-9].io", "regx.io/app", false),
        // `^` and `\\` are not allowed in a URL host (Go's url.Parse fails), so
        // negated classes and escapes never match, as in the kubelet.
        ("reg[^0-9].io", "regx.io/app", false),
        ("reg\\*.io", "reg*.io/app", false),
        ("reg[.io", "reg[.io/app", false),
        ("reg[].io", "reg].io/app", false),
        ("registry.io", "registry.io/app", true),
        ("registry.io", "registry.io:5000/app", false),
        ("registry.io:5000", "registry.io/app", false),
        ("registry.io:5000", "registry.io:5000/app", true),
        ("registry.io:5000", "registry.io:5001/app", false),
        ("registry.io:*", "registry.io:5000/app", false),
        ("registry.io/team", "registry.io/team/app", true),
        ("registry.io/team", "registry.io/teamx/app", true),
        ("registry.io/team", "registry.io/other/app", false),
        ("registry.io/team/app", "registry.io/team", false),
        ("registry.io/t*", "registry.io/team/app", false),
        ("Registry.io", "registry.io/app", false),
        ("", "busybox", false),
    ];
    for (glob, target, want) in cases {
        assert_eq!(urls_match(glob, target), *want, "urls_match({glob:?}, {target:?})");
    }
}

#[test]
fn glob_match_table() {
    let cases: &[(&str, &str, bool)] = &[
        ("*", "", true),
        ("*", "abc", true),
        ("a*c", "abbbc", true),
        ("a*c", "abbb", false),
        ("*b*", "abc", true),
        ("a*b*c", "aXbYbZc", true),
        ("?", "", false),
        ("[a-c][x-z]", "by", true),
        ("[a-c][x-z]", "bw", false),
        ("[\\]]", "]", true),
        ("[a-]", "a", false),
        ("\\", "\\", false),
        ("é*", "été", true),
        ("[^a]", "é", true),
    ];
    for (pattern, name, want) in cases {
        assert_eq!(glob_match(pattern, name), *want, "glob_match({pattern:?}, {name:?})");
    }
}

#[test]
fn docker_hub_fallback_to_index_docker_io() {
    let k = keyring(&[("https://index.docker.io/v1/", "hub"), ("registry.io", "reg")]);
    for image in ["busybox", "user/app", "docker.io/library/busybox", "index.docker.io/user/app", "localhost/app"] {
        assert_eq!(users(&k.lookup(image)), vec!["hub"], "{image}");
    }
    for image in ["quay.io/app", "localhost:5000/app", "registry.io:5000/app", "/app", ""] {
        assert!(k.lookup(image).is_empty(), "{image}");
    }
    // A `docker.io` key matches docker.io images directly; no fallback needed.
    let k = keyring(&[("docker.io", "d"), ("index.docker.io", "i")]);
    assert_eq!(users(&k.lookup("docker.io/library/busybox")), vec!["d"]);
    assert_eq!(users(&k.lookup("busybox")), vec!["i"]);
    // Only `index.docker.io` is the fallback key.
    let k = keyring(&[("docker.io", "d")]);
    assert!(k.lookup("busybox").is_empty());
}

#[test]
fn default_registry_match_table() {
    let cases: &[(&str, bool)] = &[
        ("busybox", true),
        ("library/busybox", true),
        ("docker.io/library/busybox", true),
        ("index.docker.io/library/busybox", true),
        ("localhost/app", true),
        ("localhost:5000/app", false),
        ("quay.io/app", false),
        ("", false),
        ("/app", false),
    ];
    for (image, want) in cases {
        assert_eq!(is_default_registry_match(image), *want, "{image:?}");
    }
}

#[test]
fn no_match_is_empty() {
    let k = keyring(&[("registry.io/team", "a"), ("*.example.com", "b")]);
    assert!(k.lookup("other.io/team/app").is_empty());
    assert!(k.lookup("registry.io/other").is_empty());
    assert!(Keyring::new().lookup("docker.io/library/busybox").is_empty());
}

#[test]
fn auth_config_matches_the_image_registry() {
    let c = cred("u");
    let cases: &[(&str, &str)] = &[
        ("registry.example.com:5000/team/app:1", "registry.example.com:5000"),
        ("a.example.com/app", "a.example.com"),
        ("busybox", ""),
        ("docker.io/user/app", ""),
        ("localhost/app", "localhost"),
    ];
    for (image, want) in cases {
        let named = parse_normalized_named(image).expect("valid image");
        let auth = c.to_auth_config(&named);
        assert_eq!(auth.server_address, *want, "{image}");
        assert_eq!(auth.username, "u");
        assert_eq!(auth.password.expose(), "u-password");
        assert!(auth.auth.is_empty() && auth.identity_token.is_empty() && auth.registry_token.is_empty());
    }
}

#[test]
fn auth_config_hash_is_the_kubelets() {
    // sha256 of Go's json.Marshal(AuthConfig{Username, Password, Email}).
    let c = Credential::new("alice", "p<&", "a@b.c");
    assert_eq!(c.auth_config_hash(), "ac9ff598836edafef0d8abe517d5a19338e69df53daf9ecfa948563e6965ca47");
    assert_eq!(
        Credential::default().auth_config_hash(),
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    );
    // Go (1.22+) escapes \b and \f short, U+2028 and other controls as \u
    // with lower-case hex: sha256 of
    // {"username":"u","password":"a\bb\fc\u2028d\u0001","email":"e"}.
    assert_eq!(
        Credential::new("u", "a\u{8}b\u{c}c\u{2028}d\u{1}", "e").auth_config_hash(),
        "bccfacb28f72950c1ed09f296b7bf28b8ba9474a769a29234a9885117b3c5e06"
    );
    // The source and key do not change the hash.
    let tagged =
        c.clone().with_source(CredentialSource { secret_uid: "u1".into(), namespace: "ns".into(), name: "s".into() });
    assert_eq!(tagged.auth_config_hash(), c.auth_config_hash());
}

#[test]
fn debug_never_shows_the_password() {
    let k = keyring(&[("registry.io", "alice")]);
    let dump = format!("{k:?} {:?} {:#?}", k.lookup("registry.io/app"), k.lookup("registry.io/app"));
    assert!(!dump.contains("alice-password"), "{dump}");
    assert!(dump.contains("<redacted>"));
}

#[test]
fn odd_inputs_never_panic() {
    let pieces = [
        "", "[", "]", "^", "\\", "*", "?", ":", "::", "@", "/", "%", "%4", "é", "-", ".", "#", "[a-", "https://",
        "[::1]",
    ];
    let mut k = Keyring::new();
    for a in pieces {
        for b in pieces {
            for c in pieces {
                let s = format!("{a}{b}{c}");
                let _ = k.add(&s, cred("x"));
                let _ = glob_match(&s, &s);
                let _ = urls_match(&s, &s);
                let _ = is_default_registry_match(&s);
            }
        }
    }
    for image in pieces {
        let _ = k.lookup(image);
    }
}
