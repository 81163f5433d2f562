//! Plugin configuration tables, response decoding, and small `/bin/sh`
//! plugins written at test time (their runs counted in a file).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;

const V1: &str = "credentialprovider.kubelet.k8s.io/v1";

fn write_file(path: &Path, content: &str) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    std::fs::write(path, content).expect("write");
}

fn write_plugin(bin: &Path, name: &str, body: &str) {
    let path = bin.join(name);
    write_file(&path, &format!("#!/bin/sh\n{body}\n"));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// One provider's YAML (as a list item).
fn provider_yaml(name: &str, match_images: &str, default_cache: &str, extra: &str) -> String {
    format!(
        "  - name: {name}\n    matchImages: {match_images}\n    defaultCacheDuration: \"{default_cache}\"\n    apiVersion: {V1}\n{extra}"
    )
}

fn config_yaml(providers: &[String]) -> String {
    format!("apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n{}", providers.concat())
}

// === configuration ===

#[test]
fn a_config_file_in_yaml_or_json_loads_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = dir.path().join("providers.yaml");
    write_file(
        &yaml,
        &config_yaml(&[
            provider_yaml(
                "ecr",
                "[\"*.dkr.ecr.*.amazonaws.com\"]",
                "12h",
                "    args: [get-credentials, -v]\n    env:\n      - name: AWS_PROFILE\n        value: temp\n",
            ),
            provider_yaml("gcr", "[\"gcr.io\", \"*.pkg.dev\"]", "0s", ""),
        ]),
    );
    let specs = load_provider_config(&yaml).expect("valid");
    assert_eq!(specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["ecr", "gcr"]);
    assert_eq!(specs[0].default_cache_duration, Duration::from_secs(12 * 3600));
    assert_eq!(specs[0].args, ["get-credentials", "-v"]);
    assert_eq!(specs[0].env, [EnvVar { name: "AWS_PROFILE".into(), value: "temp".into() }]);
    assert_eq!(specs[1].match_images, ["gcr.io", "*.pkg.dev"]);
    assert_eq!(specs[1].default_cache_duration, Duration::ZERO);

    let json = dir.path().join("providers.json");
    write_file(
        &json,
        &format!(
            r#"{{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"CredentialProviderConfig","providers":[{{"name":"p","matchImages":["r.io"],"defaultCacheDuration":"1m","apiVersion":"{V1}"}}]}}"#
        ),
    );
    assert_eq!(load_provider_config(&json).expect("valid JSON")[0].name, "p");
}

#[test]
fn a_config_directory_merges_its_files_in_name_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().join("conf.d");
    write_file(&d.join("20-b.yml"), &config_yaml(&[provider_yaml("b", "[b.io]", "1m", "")]));
    write_file(&d.join("10-a.json"), &config_yaml(&[provider_yaml("a", "[a.io]", "1m", "")]));
    write_file(&d.join("30-c.yaml"), &config_yaml(&[provider_yaml("c", "[c.io]", "1m", "")]));
    write_file(&d.join("README.md"), "not a config");
    std::fs::create_dir_all(d.join("sub.yaml")).expect("a directory is skipped");
    let specs = load_provider_config(&d).expect("valid");
    assert_eq!(specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);

    write_file(&d.join("40-dup.yaml"), &config_yaml(&[provider_yaml("b", "[x.io]", "1m", "")]));
    assert_eq!(
        load_provider_config(&d).expect_err("duplicate").to_string(),
        "duplicate provider name \"b\" found in configuration file(s)"
    );

    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).expect("mkdir");
    write_file(&empty.join("notes.txt"), "x");
    assert_eq!(
        load_provider_config(&empty).expect_err("no files").to_string(),
        format!("no configuration files found in directory \"{}\"", empty.display())
    );
    assert_eq!(
        load_provider_config(Path::new("")).expect_err("empty").to_string(),
        "credential provider config path is empty"
    );
    let missing = dir.path().join("missing.yaml");
    let err = load_provider_config(&missing).expect_err("missing").to_string();
    assert!(err.starts_with(&format!("unable to access path \"{}\": ", missing.display())), "{err}");
}

#[test]
fn provider_validation_uses_the_kubelets_texts() {
    let one = |p: String| config_yaml(&[p]);
    let cases: Vec<(String, &str)> = vec![
        (one(provider_yaml("a/b", "[r.io]", "1m", "")), "providers.name: Invalid value: \"a/b\": provider name cannot contain '/'"),
        (one(provider_yaml("\"a b\"", "[r.io]", "1m", "")), "providers.name: Invalid value: \"a b\": provider name cannot contain spaces"),
        (one(provider_yaml("\".\"", "[r.io]", "1m", "")), "providers.name: Invalid value: \".\": provider name cannot be '.'"),
        (one(provider_yaml("\"..\"", "[r.io]", "1m", "")), "providers.name: Invalid value: \"..\": provider name cannot be '..'"),
        (
            config_yaml(&[provider_yaml("p", "[r.io]", "1m", ""), provider_yaml("p", "[s.io]", "1m", "")]),
            "providers.name: Duplicate value: \"p\"",
        ),
        (one(provider_yaml("p", "[]", "1m", "")), "providers.matchImages: Required value: at least 1 item in matchImages is required"),
        (
            one(provider_yaml("p", "[\"r.io:port\"]", "1m", "")),
            "providers.matchImages: Invalid value: \"r.io:port\": match image is invalid: parse \"https://r.io:port\": invalid port \":port\" after host",
        ),
        (one(provider_yaml("p", "[r.io]", "-1m", "")), "providers.defaultCacheDuration: Invalid value: \"-1m0s\": must be greater than or equal to 0"),
        (
            one(provider_yaml("p", "[\"%invalid%\"]", "1m", "")),
            "providers.matchImages: Invalid value: \"%invalid%\": match image is invalid: parse \"https://%invalid%\": invalid URL escape \"%in\"",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: p\n    matchImages: [r.io]\n    apiVersion: credentialprovider.kubelet.k8s.io/v1\n".to_string(),
            "providers.defaultCacheDuration: Required value",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: p\n    matchImages: [r.io]\n    defaultCacheDuration: 1m\n".to_string(),
            "providers.apiVersion: Required value",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: p\n    matchImages: [r.io]\n    defaultCacheDuration: 1m\n    apiVersion: credentialprovider.kubelet.k8s.io/v2\n".to_string(),
            "providers.apiVersion: Unsupported value: \"credentialprovider.kubelet.k8s.io/v2\": supported values: \"credentialprovider.kubelet.k8s.io/v1\", \"credentialprovider.kubelet.k8s.io/v1alpha1\", \"credentialprovider.kubelet.k8s.io/v1beta1\"",
        ),
        ("apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders: []\n".to_string(), "providers: Required value: at least 1 item in plugins is required"),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    for (i, (yaml, want)) in cases.iter().enumerate() {
        let f = dir.path().join(format!("{i}.yaml"));
        write_file(&f, yaml);
        let err = load_provider_config(&f).expect_err(yaml).to_string();
        assert!(err.starts_with("failed to validate credential provider config: "), "{err}");
        assert!(err.contains(want), "case {i}: {err}\nwant {want}");
    }
    // Several errors: Go's aggregate in brackets.
    let f = dir.path().join("many.yaml");
    write_file(&f, &one(provider_yaml("a/b", "[]", "1m", "")));
    assert_eq!(
        load_provider_config(&f).expect_err("two errors").to_string(),
        "failed to validate credential provider config: [providers.name: Invalid value: \"a/b\": provider name cannot contain '/', providers.matchImages: Required value: at least 1 item in matchImages is required]"
    );
}

#[test]
fn undecodable_configs_name_the_file_never_env_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("c.yaml");
    let cases = [
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
            "failed to decode \"KubeletConfiguration\" (wrong Kind)",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n",
            "no kind \"KubeletConfiguration\" is registered for version \"kubelet.config.k8s.io/v1\"",
        ),
        (
            "apiVersion: other.io/v1\nkind: CredentialProviderConfig\n",
            "no kind \"CredentialProviderConfig\" is registered for version \"other.io/v1\"",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v9\nkind: CredentialProviderConfig\n",
            "no kind \"CredentialProviderConfig\" is registered for version \"kubelet.config.k8s.io/v9\"",
        ),
        ("providers: [unclosed hunter2", "invalid document at line"),
        (
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: p\n    defaultCacheDuration: soon\n",
            "time: invalid duration \"soon\"",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n  - name: p\n    env: hunter2\n",
            "json: cannot unmarshal string into Go struct field CredentialProvider.providers.env of type []v1.ExecEnvVar",
        ),
    ];
    for (yaml, want) in cases {
        write_file(&f, yaml);
        let err = load_provider_config(&f).expect_err(yaml).to_string();
        assert!(err.starts_with(&format!("error decoding config \"{}\": ", f.display())), "{err}");
        assert!(err.contains(want) && !err.contains("hunter2"), "{err}");
    }
    // A wrongly typed env value is named by position only.
    write_file(
        &f,
        &config_yaml(&[provider_yaml(
            "p",
            "[r.io]",
            "1m",
            "    env:\n      - name: TOKEN\n        value: [hunter2]\n",
        )]),
    );
    let err = load_provider_config(&f).expect_err("bad env").to_string();
    assert!(
        err.ends_with(
            ": json: cannot unmarshal array into Go struct field ExecEnvVar.providers.env.value of type string"
        ) && !err.contains("hunter2"),
        "{err}"
    );
    // Debug of a spec keeps env values hidden.
    write_file(
        &f,
        &config_yaml(&[provider_yaml("p", "[r.io]", "1m", "    env:\n      - name: TOKEN\n        value: hunter2\n")]),
    );
    let specs = load_provider_config(&f).expect("valid");
    assert!(!format!("{specs:?}").contains("hunter2"));
}

#[test]
fn configs_are_decoded_strictly_with_the_kubelets_texts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("c.yaml");
    let head = |v: &str| format!("kind: CredentialProviderConfig\napiVersion: kubelet.config.k8s.io/{v}\nproviders:\n");
    let cases = [
        // The kubelet's own test case: a typo'd field refuses the file.
        (
            format!("{}{}", head("v1"), provider_yaml("test", "[registry.io/foobar]", "10m", "    unknownField: should not be here\n")),
            "strict decoding error: unknown field \"providers[0].unknownField\"".to_string(),
        ),
        // A misspelt matchImages.
        (
            format!("{}  - name: p\n    matchImage: [r.io]\n    defaultCacheDuration: 1m\n    apiVersion: {V1}\n", head("v1")),
            "strict decoding error: unknown field \"providers[0].matchImage\"".to_string(),
        ),
        // Every unknown field, in order, nested ones with their path.
        (
            format!(
                "extra: 1\n{}{}",
                head("v1"),
                provider_yaml("p", "[r.io]", "1m", "    env:\n      - name: A\n        valu: hunter2\n    Args: []\n")
            ),
            "strict decoding error: unknown field \"extra\", unknown field \"providers[0].env[0].valu\", unknown field \"providers[0].Args\"".to_string(),
        ),
        // tokenAttributes exists only in kubelet.config.k8s.io/v1.
        (
            format!("{}{}", head("v1beta1"), provider_yaml("p", "[r.io]", "1m", "    tokenAttributes:\n      serviceAccountTokenAudience: a\n")),
            "strict decoding error: unknown field \"providers[0].tokenAttributes\"".to_string(),
        ),
        (
            format!("{}{}", head("v1alpha1"), provider_yaml("p", "[r.io]", "1m", "    tokenAttributes:\n      serviceAccountTokenAudience: a\n")),
            "strict decoding error: unknown field \"providers[0].tokenAttributes\"".to_string(),
        ),
        (
            format!("{}{}", head("v1"), provider_yaml("p", "[r.io]", "1m", "    tokenAttributes:\n      audience: a\n")),
            "strict decoding error: unknown field \"providers[0].tokenAttributes.audience\"".to_string(),
        ),
        // Values of the wrong type: Go's encoding/json texts, no value shown.
        (
            format!("{}  - name: 7\n", head("v1")),
            "json: cannot unmarshal number into Go struct field CredentialProvider.providers.name of type string".to_string(),
        ),
        (
            format!("{}  - name: p\n    matchImages: r.io\n", head("v1beta1")),
            "json: cannot unmarshal string into Go struct field CredentialProvider.providers.matchImages of type []string".to_string(),
        ),
        (
            format!("{}  - hunter2\n", head("v1")),
            "json: cannot unmarshal string into Go struct field CredentialProviderConfig.providers of type v1.CredentialProvider".to_string(),
        ),
        (
            format!("{}  - name: p\n    defaultCacheDuration: 5\n", head("v1")),
            "json: cannot unmarshal number into Go struct field CredentialProvider.providers.defaultCacheDuration of type string".to_string(),
        ),
        (
            format!("{}{}", head("v1"), provider_yaml("p", "[r.io]", "1m", "    tokenAttributes:\n      requireServiceAccount: \"yes\"\n")),
            "json: cannot unmarshal string into Go struct field ServiceAccountTokenAttributes.providers.tokenAttributes.requireServiceAccount of type bool".to_string(),
        ),
        // A type error wins over unknown fields (Go reports strict errors last).
        (
            format!("{}  - name: [x]\n    typo: 1\n", head("v1")),
            "json: cannot unmarshal array into Go struct field CredentialProvider.providers.name of type string".to_string(),
        ),
        ("kind: CredentialProviderConfig\n".to_string(), "Object 'apiVersion' is missing in the document".to_string()),
        ("apiVersion: kubelet.config.k8s.io/v1\n".to_string(), "Object 'Kind' is missing in the document".to_string()),
        (
            "apiVersion: a/b/c\nkind: CredentialProviderConfig\n".to_string(),
            "unexpected GroupVersion string: a/b/c".to_string(),
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1\nkind: WrongKind\n".to_string(),
            "no kind \"WrongKind\" is registered for version \"kubelet.config.k8s.io/v1\"".to_string(),
        ),
        (
            "apiVersion: foobar/v1alpha1\nkind: CredentialProviderConfig\n".to_string(),
            "no kind \"CredentialProviderConfig\" is registered for version \"foobar/v1alpha1\"".to_string(),
        ),
    ];
    for (yaml, want) in cases {
        write_file(&f, &yaml);
        let err = load_provider_config(&f).expect_err(&yaml).to_string();
        let prefix = format!("error decoding config \"{}\": ", f.display());
        assert!(err.starts_with(&prefix), "{err}");
        assert!(err[prefix.len()..].starts_with(&want), "{yaml}\ngot  {err}\nwant {want}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}

#[test]
fn token_attributes_are_read_and_validated_with_the_kubelets_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("c.yaml");
    let with = |attrs: &str, api: &str| {
        config_yaml(&[format!(
            "  - name: p\n    matchImages: [r.io]\n    defaultCacheDuration: 1m\n    apiVersion: {api}\n    tokenAttributes:\n{attrs}"
        )])
    };
    write_file(
        &f,
        &with(
            "      serviceAccountTokenAudience: registry.example\n      cacheType: Token\n      requireServiceAccount: true\n      requiredServiceAccountAnnotationKeys: [example.com/role]\n      optionalServiceAccountAnnotationKeys: [example.com/tier]\n",
            V1,
        ),
    );
    let specs = load_provider_config(&f).expect("valid");
    assert_eq!(
        specs[0].token_attributes,
        Some(TokenAttributes {
            audience: "registry.example".into(),
            cache_type: TokenCacheType::Token,
            require_service_account: true,
            required_annotation_keys: vec!["example.com/role".into()],
            optional_annotation_keys: vec!["example.com/tier".into()],
        })
    );
    let prefix = "failed to validate credential provider config: ";
    let cases: Vec<(String, &str)> = vec![
        (
            with("      cacheType: Token\n      requireServiceAccount: true\n", V1),
            "providers.tokenAttributes.serviceAccountTokenAudience: Required value",
        ),
        (
            with("      serviceAccountTokenAudience: a\n      requireServiceAccount: true\n", V1),
            "providers.tokenAttributes.cacheType: Required value: cacheType is required to be set when tokenAttributes is specified. Supported values are: ServiceAccount, Token",
        ),
        (
            with(
                "      serviceAccountTokenAudience: a\n      cacheType: invalid-cache-type\n      requireServiceAccount: true\n",
                V1,
            ),
            "providers.tokenAttributes.cacheType: Unsupported value: \"invalid-cache-type\": supported values: \"ServiceAccount\", \"Token\"",
        ),
        (
            with("      serviceAccountTokenAudience: a\n      cacheType: Token\n", V1),
            "providers.tokenAttributes.requireServiceAccount: Required value",
        ),
        (
            with(
                "      serviceAccountTokenAudience: a\n      cacheType: Token\n      requireServiceAccount: true\n",
                "credentialprovider.kubelet.k8s.io/v1beta1",
            ),
            "providers.tokenAttributes: Forbidden: tokenAttributes is only supported for credentialprovider.kubelet.k8s.io/v1 API version",
        ),
        (
            with(
                "      serviceAccountTokenAudience: a\n      cacheType: Token\n      requireServiceAccount: false\n      requiredServiceAccountAnnotationKeys: [a.io/x]\n",
                V1,
            ),
            "providers.tokenAttributes.requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set",
        ),
        (
            with(
                "      serviceAccountTokenAudience: a\n      cacheType: Token\n      requireServiceAccount: true\n      requiredServiceAccountAnnotationKeys: [a.io/x, a.io/x]\n",
                V1,
            ),
            "providers.tokenAttributes.requiredServiceAccountAnnotationKeys: Duplicate value: \"a.io/x\"",
        ),
        (
            with(
                "      serviceAccountTokenAudience: a\n      cacheType: Token\n      requireServiceAccount: true\n      optionalServiceAccountAnnotationKeys: [\"bad key\"]\n",
                V1,
            ),
            "providers.tokenAttributes.optionalServiceAccountAnnotationKeys: Invalid value: \"bad key\": name part must consist of alphanumeric characters",
        ),
        (
            with(
                "      serviceAccountTokenAudience: a\n      cacheType: ServiceAccount\n      requireServiceAccount: true\n      requiredServiceAccountAnnotationKeys: [b.io/y, a.io/x]\n      optionalServiceAccountAnnotationKeys: [a.io/x, b.io/y]\n",
                V1,
            ),
            "providers.tokenAttributes: Invalid value: [\"a.io/x\",\"b.io/y\"]: annotation keys cannot be both required and optional",
        ),
    ];
    for (yaml, want) in cases {
        write_file(&f, &yaml);
        let err = load_provider_config(&f).expect_err(&yaml).to_string();
        assert!(err.starts_with(prefix) && err.contains(want), "got  {err}\nwant {want}");
    }
}

#[test]
fn identical_validation_errors_are_reported_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("c.yaml");
    write_file(&f, &config_yaml(&[provider_yaml("a", "[]", "1m", ""), provider_yaml("b", "[]", "1m", "")]));
    assert_eq!(
        load_provider_config(&f).expect_err("two empty matchImages").to_string(),
        "failed to validate credential provider config: providers.matchImages: Required value: at least 1 item in matchImages is required"
    );
}

#[test]
fn registration_checks_the_bin_dir_and_executables() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("c.yaml");
    write_file(&conf, &config_yaml(&[provider_yaml("p", "[r.io]", "1m", "")]));
    let bin = dir.path().join("bin");
    assert_eq!(
        register_providers(&conf, &bin).expect_err("no bin dir").to_string(),
        format!("plugin binary directory {} did not exist", bin.display())
    );
    std::fs::create_dir_all(&bin).expect("mkdir");
    assert_eq!(
        register_providers(&conf, &bin).expect_err("no executable").to_string(),
        format!("plugin binary executable {} did not exist", bin.join("p").display())
    );
    write_plugin(&bin, "p", "exit 0");
    let registered = register_providers(&conf, &bin).expect("registers");
    assert_eq!(registered.providers[0].1, bin.join("p"));

    // The kubelet's hash: SHA-256 over each file's 8-byte big-endian length and content.
    use sha2::Digest as _;
    let content = std::fs::read(&conf).expect("read");
    let mut h = sha2::Sha256::new();
    h.update((content.len() as u64).to_be_bytes());
    h.update(&content);
    let want = crate::domain::go_text::hex(&h.finalize());
    assert_eq!(registered.config_hash, format!("sha256:{want}"));
}

// === responses ===

#[test]
fn responses_are_validated_without_quoting_them() {
    let ok = format!(
        r#"{{"apiVersion":"{V1}","kind":"CredentialProviderResponse","cacheKeyType":"Registry","cacheDuration":"5m","auth":{{"*.r.io":{{"username":"u","password":"hunter2"}}}}}}"#
    );
    let r = decode_response(ok.as_bytes(), V1).expect("valid");
    assert_eq!(r.cache_key_type, "Registry");
    assert_eq!(r.cache_duration, Some(Duration::from_secs(300)));
    assert_eq!(r.auth.entries[0].0, "*.r.io");
    assert_eq!(r.auth.entries[0].1.username, "u");
    assert_eq!(r.auth.entries[0].1.password.expose(), "hunter2");
    assert!(!format!("{r:?}").contains("hunter2"));

    let no_duration = format!(r#"{{"apiVersion":"{V1}","kind":"CredentialProviderResponse","cacheKeyType":"Image"}}"#);
    assert_eq!(decode_response(no_duration.as_bytes(), V1).expect("valid").cache_duration, None);

    let cases = [
        (
            ok.replace("/v1\"", "/v1beta1\""),
            "apiVersion from credential plugin response did not match expected apiVersion:credentialprovider.kubelet.k8s.io/v1, actual apiVersion:credentialprovider.kubelet.k8s.io/v1beta1",
        ),
        (
            ok.replace("/v1\"", "/v7\""),
            "apiVersion from credential plugin response did not match expected apiVersion:credentialprovider.kubelet.k8s.io/v1, actual apiVersion:credentialprovider.kubelet.k8s.io/v7",
        ),
        (
            ok.replace("CredentialProviderResponse", "Secret"),
            "error decoding credential provider plugin response from stdout",
        ),
        (ok.replace("\"5m\"", "\"soon\""), "error decoding credential provider plugin response from stdout"),
        (ok[..ok.len() - 3].to_string(), "error decoding credential provider plugin response from stdout"),
        ("hunter2 is not JSON".to_string(), "error decoding credential provider plugin response from stdout"),
    ];
    for (body, want) in cases {
        let err = decode_response(body.as_bytes(), V1).expect_err(&body).to_string();
        assert_eq!(err, want);
    }
}

// === running plugins ===

/// A temp dir with a plugin `name` whose runs append to `count` and whose
/// stdin goes to `request`, printing `response`.
struct Plugin {
    dir: tempfile::TempDir,
}

impl Plugin {
    fn new(response: &str) -> Self {
        Self::with_body(&format!("cat > \"$REQUEST_FILE\"\ncat <<'EOF'\n{response}\nEOF"))
    }

    fn with_body(body: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        write_plugin(&bin, "test-plugin", &format!("echo \"$1\" >> \"$COUNT_FILE\"\n{body}"));
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn provider(&self, default_cache: &str, timeout: Duration, clock: &ManualClock) -> PluginProvider {
        let spec = ProviderSpec {
            name: "test-plugin".into(),
            match_images: vec!["*.example.com".into(), "registry.local:5000/team".into()],
            default_cache_duration: Duration::from_nanos(
                crate::domain::go_text::parse_duration(default_cache).expect("duration").unsigned_abs(),
            ),
            api_version: V1.into(),
            args: vec!["get-credentials".into()],
            env: vec![
                EnvVar { name: "COUNT_FILE".into(), value: self.path("count").display().to_string().into() },
                EnvVar { name: "REQUEST_FILE".into(), value: self.path("request").display().to_string().into() },
            ],
            token_attributes: None,
        };
        PluginProvider::new(spec, self.path("bin/test-plugin"), timeout).with_clock(clock.clock())
    }

    fn runs(&self) -> usize {
        std::fs::read_to_string(self.path("count")).map_or(0, |s| s.lines().count())
    }
}

fn response(cache_key_type: &str, cache_duration: Option<&str>) -> String {
    let duration = cache_duration.map(|d| format!(",\"cacheDuration\":\"{d}\"")).unwrap_or_default();
    format!(
        r#"{{"apiVersion":"{V1}","kind":"CredentialProviderResponse","cacheKeyType":"{cache_key_type}"{duration},"auth":{{"*.example.com":{{"username":"plugin-user","password":"plugin-pass"}}}}}}"#
    )
}

fn users(c: &crate::credentials::DockerConfig) -> Vec<(&str, &str, &str)> {
    c.entries.iter().map(|(k, e)| (k.as_str(), e.username.as_str(), e.password.expose())).collect()
}

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn the_request_goes_on_stdin_with_args_and_env() {
    let p = Plugin::new(&response("Image", None));
    let clock = ManualClock::new();
    let provider = p.provider("1m", MINUTE, &clock);
    let got = provider.provide("a.example.com/team/app").await;
    assert_eq!(users(&got), [("*.example.com", "plugin-user", "plugin-pass")]);
    // The kubelet's bytes: its encoder's key order and final newline.
    assert_eq!(
        std::fs::read_to_string(p.path("request")).expect("request"),
        format!(
            "{{\"kind\":\"CredentialProviderRequest\",\"apiVersion\":\"{V1}\",\"image\":\"a.example.com/team/app\"}}\n"
        )
    );
    assert_eq!(std::fs::read_to_string(p.path("count")).expect("count"), "get-credentials\n", "args are passed");
}

#[tokio::test]
async fn only_matching_images_run_the_plugin() {
    let p = Plugin::new(&response("Image", Some("0s")));
    let clock = ManualClock::new();
    let provider = p.provider("1m", MINUTE, &clock);
    for (image, runs) in [
        ("quay.io/app", 0),
        ("example.com/app", 0),           // one label fewer than *.example.com
        ("a.b.example.com/app", 0),       // one label more
        ("registry.local:5000/other", 0), // path prefix differs
        ("registry.local/team/app", 0),   // port differs
        ("a.example.com/app", 1),
        ("registry.local:5000/team/app", 2),
    ] {
        let _ = provider.provide(image).await;
        assert_eq!(p.runs(), runs, "{image}");
    }
}

#[tokio::test]
async fn responses_are_cached_per_key_type() {
    // (cacheKeyType, images asked in order, runs after each)
    let cases: &[(&str, &[(&str, usize)])] = &[
        ("Image", &[("a.example.com/x", 1), ("a.example.com/x", 1), ("a.example.com/y", 2), ("b.example.com/x", 3)]),
        ("Registry", &[("a.example.com/x", 1), ("a.example.com/y", 1), ("b.example.com/x", 2), ("b.example.com/z", 2)]),
        ("Global", &[("a.example.com/x", 1), ("b.example.com/y", 1), ("registry.local:5000/team/q", 1)]),
    ];
    for (key_type, steps) in cases {
        let p = Plugin::new(&response(key_type, Some("10m")));
        let clock = ManualClock::new();
        let provider = p.provider("1m", MINUTE, &clock);
        for (image, runs) in *steps {
            let got = provider.provide(image).await;
            assert_eq!(users(&got), [("*.example.com", "plugin-user", "plugin-pass")], "{key_type} {image}");
            assert_eq!(p.runs(), *runs, "{key_type} {image}");
        }
        // The response's duration (10m), not the default (1m), sets expiry;
        // an entry expires once strictly past it.
        let (first, _) = steps[0];
        clock.advance(Duration::from_secs(600));
        let _ = provider.provide(first).await;
        assert_eq!(p.runs(), steps.last().map_or(0, |s| s.1), "{key_type}: still cached");
        clock.advance(Duration::from_nanos(1));
        let _ = provider.provide(first).await;
        assert_eq!(p.runs(), steps.last().map_or(0, |s| s.1) + 1, "{key_type}: expired");
    }
}

#[tokio::test]
async fn cache_durations_null_takes_the_default_and_zero_does_not_cache() {
    // (response cacheDuration, provider default, runs after two lookups, after just over 1m more)
    let cases = [(None, "1m", 1, 2), (Some("0"), "1m", 2, 3), (Some("0s"), "1h", 2, 3), (None, "0s", 2, 3)];
    for (duration, default, runs, later) in cases {
        let p = Plugin::new(&response("Image", duration));
        let clock = ManualClock::new();
        let provider = p.provider(default, MINUTE, &clock);
        provider.provide("a.example.com/x").await;
        provider.provide("a.example.com/x").await;
        assert_eq!(p.runs(), runs, "{duration:?} {default}");
        clock.advance(MINUTE + Duration::from_nanos(1));
        provider.provide("a.example.com/x").await;
        assert_eq!(p.runs(), later, "{duration:?} {default}");
    }
}

#[tokio::test]
async fn bad_responses_give_no_credentials_and_are_not_cached() {
    for body in [
        response("Image", None).replace("/v1\"", "/v1alpha1\""),
        "{not json".to_string(),
        response("Repository", None),
        response("", None),
    ] {
        let p = Plugin::new(&body);
        let clock = ManualClock::new();
        let provider = p.provider("1m", MINUTE, &clock);
        assert!(provider.provide("a.example.com/x").await.entries.is_empty(), "{body}");
        assert!(provider.provide("a.example.com/x").await.entries.is_empty(), "{body}");
        assert_eq!(p.runs(), 2, "{body}");
    }
    let p = Plugin::new(&response("Image", None).replace("/v1\"", "/v1alpha1\""));
    let err = p.provider("1m", MINUTE, &ManualClock::new()).run("a.example.com/x").await.expect_err("mismatch");
    assert_eq!(
        err.to_string(),
        "apiVersion from credential plugin response did not match expected apiVersion:credentialprovider.kubelet.k8s.io/v1, actual apiVersion:credentialprovider.kubelet.k8s.io/v1alpha1"
    );
}

#[tokio::test]
async fn a_failing_plugin_names_itself_and_the_image_but_never_shows_its_stderr() {
    let p = Plugin::with_body("echo 'token=abc.def.ghi' >&2\nexit 3");
    let provider = p.provider("1m", MINUTE, &ManualClock::new());
    let err = provider.run("a.example.com/x").await.expect_err("fails").to_string();
    assert_eq!(
        err,
        "error execing credential provider plugin test-plugin for image a.example.com/x: exit status 3 \
         (stderr: 18 bytes, not shown: a plugin's output may hold credentials)"
    );
    assert!(!err.contains("abc.def"), "{err}");
    assert!(provider.provide("a.example.com/x").await.entries.is_empty());
}

#[tokio::test]
async fn a_plugin_past_its_timeout_is_killed() {
    let p = Plugin::with_body("exec sleep 30");
    let provider = p.provider("1m", Duration::from_millis(200), &ManualClock::new());
    let err = provider.run("a.example.com/x").await.expect_err("times out").to_string();
    assert_eq!(
        err,
        "error execing credential provider plugin test-plugin for image a.example.com/x: context deadline exceeded \
         (stderr: 0 bytes, not shown: a plugin's output may hold credentials)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_lookups_for_one_image_run_the_plugin_once() {
    // Not cacheable ("0"): only the merging of concurrent runs explains one run.
    let p = Plugin::with_body(&format!(
        "cat > \"$REQUEST_FILE\"\nsleep 1\ncat <<'EOF'\n{}\nEOF",
        response("Image", Some("0"))
    ));
    let provider = std::sync::Arc::new(p.provider("1m", MINUTE, &ManualClock::new()));
    let lookups = (0..10).map(|_| {
        let provider = provider.clone();
        tokio::spawn(async move { provider.provide("a.example.com/x").await })
    });
    for got in futures_util::future::join_all(lookups).await {
        assert_eq!(users(&got.expect("joins")), [("*.example.com", "plugin-user", "plugin-pass")]);
    }
    assert_eq!(p.runs(), 1);
    // Once done, the next lookup runs it again (nothing cached).
    provider.provide("a.example.com/x").await;
    assert_eq!(p.runs(), 2);
}

#[tokio::test]
async fn providers_run_in_order_and_only_when_matching() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    for (name, user) in [("first", "u1"), ("second", "u2")] {
        write_plugin(
            &bin,
            name,
            &format!("cat >/dev/null\ncat <<'EOF'\n{}\nEOF", response("Image", None).replace("plugin-user", user)),
        );
    }
    let conf = dir.path().join("c.yaml");
    write_file(
        &conf,
        &config_yaml(&[
            provider_yaml("first", "[\"*.example.com\"]", "1m", ""),
            provider_yaml("second", "[\"a.example.com\", \"other.io\"]", "1m", ""),
        ]),
    );
    let providers = CredentialProviders::register(
        &conf,
        &bin,
        MINUTE,
        crate::clock::Clock::new(),
        &crate::metrics::Metrics::default(),
    )
    .expect("registers");
    let names = |cs: &[crate::credentials::DockerConfig]| {
        cs.iter().map(|c| c.entries[0].1.username.clone()).collect::<Vec<_>>()
    };
    assert_eq!(names(&providers.provide("a.example.com/x").await), ["u1", "u2"]);
    assert_eq!(names(&providers.provide("b.example.com/x").await), ["u1"]);
    assert!(providers.provide("quay.io/x").await.is_empty());
}

#[tokio::test]
async fn runs_and_failed_runs_are_metered_and_the_config_hash_is_published() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    write_plugin(&bin, "good", &format!("cat >/dev/null\ncat <<'EOF'\n{}\nEOF", response("Image", Some("0"))));
    write_plugin(&bin, "garbled", "cat >/dev/null\necho 'not a response'");
    write_plugin(&bin, "broken", "exit 1");
    let conf = dir.path().join("c.yaml");
    write_file(
        &conf,
        &config_yaml(&[
            provider_yaml("good", "[\"*.example.com\"]", "0s", ""),
            provider_yaml("garbled", "[\"*.example.com\"]", "0s", ""),
            provider_yaml("broken", "[\"*.example.com\"]", "0s", ""),
        ]),
    );
    let metrics = crate::metrics::Metrics::default();
    let providers =
        CredentialProviders::register(&conf, &bin, MINUTE, crate::clock::Clock::new(), &metrics).expect("registers");
    providers.provide("a.example.com/x").await;
    providers.provide("a.example.com/x").await;
    let s = crate::testing::Scrape::parse(&metrics.encode()).expect("scrape");
    for name in ["good", "garbled", "broken"] {
        assert_eq!(
            s.value("imaged_credential_provider_plugin_duration_count", &[("plugin_name", name)]),
            Some(2.0),
            "{name}"
        );
    }
    // A failed run counts as an error; a response that does not decode does not (the kubelet).
    assert_eq!(s.value("imaged_credential_provider_plugin_errors_total", &[("plugin_name", "broken")]), Some(2.0));
    assert_eq!(s.value("imaged_credential_provider_plugin_errors_total", &[("plugin_name", "garbled")]), None);
    assert_eq!(s.value("imaged_credential_provider_plugin_errors_total", &[("plugin_name", "good")]), None);
    assert_eq!(s.value("imaged_credential_provider_config_info", &[("hash", providers.config_hash())]), Some(1.0));
}

// === properties ===

#[allow(clippy::pedantic)] // test code: pedantic lints are for what ships
mod props {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::domain::go_text::duration as go_duration;
    use crate::testing::props::{config, marker};

    fn api_version() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => Just(V1.to_string()),
            1 => Just("credentialprovider.kubelet.k8s.io/v1beta1".to_string()),
            1 => "\\PC{0,20}",
        ]
    }

    /// `cacheDuration` as a plugin may write it, and the duration it means
    /// when it is one imaged takes.
    fn cache_duration() -> impl Strategy<Value = (Option<serde_json::Value>, Option<Option<Duration>>)> {
        prop_oneof![
            Just((None::<serde_json::Value>, Some(None::<Duration>))),
            Just((Some(serde_json::Value::Null), Some(None::<Duration>))),
            (0..=i64::MAX as u64).prop_map(|ns| {
                let d = Duration::from_nanos(ns);
                (Some(json!(go_duration(d))), Some(Some(d)))
            }),
            // Some of these are durations: a negative one means "do not cache".
            "[-+]?[0-9.]{0,22}(ns|us|ms|s|m|h|d)?".prop_map(|s| {
                let want = crate::domain::go_text::parse_duration(&s)
                    .ok()
                    .map(|ns| Some(Duration::from_nanos(u64::try_from(ns).unwrap_or(0))));
                (Some(json!(s)), want)
            }),
            any::<i64>().prop_map(|n| (Some(json!(n)), None)),
        ]
    }

    fn auth() -> impl Strategy<Value = Vec<(String, String, String)>> {
        prop::collection::btree_map("[a-z*][a-z0-9.*-]{0,12}", ("[a-z0-9]{0,8}", marker()), 0..4)
            .prop_map(|m| m.into_iter().map(|(k, (u, p))| (k, u, p)).collect())
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn any_bytes_as_a_response_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_response(&bytes, V1);
        }

        #[test]
        fn a_response_is_read_or_refused_never_showing_a_password(
            version in api_version(),
            kind in prop_oneof![4 => Just("CredentialProviderResponse".to_string()), 1 => "[A-Za-z]{0,10}"],
            key_type in prop_oneof![Just("Image"), Just("Registry"), Just("Global"), Just("")],
            (duration_json, want_duration) in cache_duration(),
            auth in auth(),
            cut in any::<prop::sample::Index>(),
            damaged in any::<bool>(),
        ) {
            let mut body = json!({ "apiVersion": version, "kind": kind, "cacheKeyType": key_type });
            if let Some(d) = duration_json {
                body["cacheDuration"] = d;
            }
            body["auth"] = auth.iter().map(|(k, u, p)| (k.clone(), json!({ "username": u, "password": p }))).collect();
            let mut bytes = body.to_string().into_bytes();
            if damaged {
                bytes.truncate(cut.index(bytes.len()));
            }
            match decode_response(&bytes, V1) {
                Ok(r) => {
                    prop_assert!(!damaged && version == V1 && kind == "CredentialProviderResponse");
                    prop_assert_eq!(Some(r.cache_duration), want_duration);
                    prop_assert_eq!(r.cache_key_type.as_str(), key_type);
                    let got: Vec<_> = r
                        .auth
                        .entries
                        .iter()
                        .map(|(k, e)| (k.clone(), e.username.clone(), e.password.expose().to_string()))
                        .collect();
                    prop_assert_eq!(got, auth.clone());
                    let shown = format!("{r:?}");
                    for (_, _, p) in &auth {
                        prop_assert!(!shown.contains(p.as_str()), "{}", shown);
                    }
                }
                Err(e) => {
                    prop_assert!(damaged || version != V1 || kind != "CredentialProviderResponse" || want_duration.is_none(), "{}", e);
                    let text = format!("{e} {e:?}");
                    for (_, _, p) in &auth {
                        prop_assert!(!text.contains(p.as_str()), "{}", text);
                    }
                }
            }
        }
    }

    /// One provider of a generated config, its env values markers.
    #[derive(Debug, Clone)]
    struct Provider {
        name: String,
        match_images: Vec<String>,
        cache: serde_json::Value,
        cache_ns: Option<u64>,
        api_version: String,
        env: Vec<(String, serde_json::Value)>,
    }

    fn provider() -> impl Strategy<Value = Provider> {
        (
            prop_oneof![4 => "[a-z][a-z0-9-]{0,8}", 1 => Just("a/b".to_string()), 1 => Just("..".to_string()), 1 => "\\PC{0,6}"],
            prop::collection::vec(prop_oneof![4 => "[a-z*][a-z0-9.*-]{0,10}", 1 => "\\PC{0,10}"], 0..3),
            prop_oneof![
                (0..=i64::MAX as u64).prop_map(|ns| (json!(go_duration(Duration::from_nanos(ns))), Some(ns))),
                "[-+]?[0-9.]{0,22}(ns|s|m|h|d)?".prop_map(|s| {
                    let ns = crate::domain::go_text::parse_duration(&s).ok().and_then(|ns| u64::try_from(ns).ok());
                    (json!(s), ns)
                }),
                Just((serde_json::Value::Null, None::<u64>)),
            ],
            api_version(),
            prop::collection::vec(
                (
                    "[A-Z_]{0,6}",
                    prop_oneof![
                        4 => marker().prop_map(|m| json!(m)),
                        1 => marker().prop_map(|m| json!([m])),
                        1 => marker().prop_map(|m| json!({ "k": m })),
                    ],
                ),
                0..3,
            ),
        )
            .prop_map(|(name, match_images, (cache, cache_ns), api_version, env)| Provider {
                name,
                match_images,
                cache,
                cache_ns,
                api_version,
                env,
            })
    }

    fn markers_of(providers: &[Provider]) -> Vec<String> {
        let mut out = Vec::new();
        for p in providers {
            for (_, v) in &p.env {
                let text = v.to_string();
                let start = text.find("PWX").expect("a marker");
                out.push(text[start..start + 15].to_string());
            }
        }
        out
    }

    proptest! {
        #![proptest_config(config(128))]

        #[test]
        fn any_bytes_as_a_provider_config_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let dir = tempfile::tempdir().unwrap();
            let f = dir.path().join("c.yaml");
            std::fs::write(&f, &bytes).unwrap();
            let _ = load_provider_config(&f);
        }

        #[test]
        fn a_provider_config_loads_or_names_the_field_never_an_env_value(
            providers in prop::collection::vec(provider(), 0..3),
            yaml in any::<bool>(),
        ) {
            let doc = json!({
                "apiVersion": "kubelet.config.k8s.io/v1",
                "kind": "CredentialProviderConfig",
                "providers": providers.iter().map(|p| json!({
                    "name": p.name,
                    "matchImages": p.match_images,
                    "defaultCacheDuration": p.cache,
                    "apiVersion": p.api_version,
                    "env": p.env.iter().map(|(n, v)| json!({ "name": n, "value": v })).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            });
            let text = if yaml { serde_yaml_ng::to_string(&doc).unwrap() } else { doc.to_string() };
            let dir = tempfile::tempdir().unwrap();
            let f = dir.path().join(if yaml { "c.yaml" } else { "c.json" });
            std::fs::write(&f, &text).unwrap();
            let markers = markers_of(&providers);
            match load_provider_config(&f) {
                Ok(specs) => {
                    prop_assert_eq!(specs.len(), providers.len());
                    for (spec, p) in specs.iter().zip(&providers) {
                        prop_assert_eq!(&spec.name, &p.name);
                        prop_assert_eq!(Some(spec.default_cache_duration), p.cache_ns.map(Duration::from_nanos));
                        let env: Vec<_> = spec.env.iter().map(|e| (e.name.clone(), json!(e.value.expose()))).collect();
                        prop_assert_eq!(&env, &p.env);
                    }
                    let shown = format!("{specs:?}");
                    for m in &markers {
                        prop_assert!(!shown.contains(m.as_str()), "{}", shown);
                    }
                }
                Err(e) => {
                    let text = format!("{e} {e:?}");
                    for m in &markers {
                        prop_assert!(!text.contains(m.as_str()), "{} leaked in {}", m, text);
                    }
                    match &e {
                        ProviderConfigError::Invalid(errs) => {
                            for err in errs {
                                prop_assert!(err.starts_with("providers"), "{} names no field", err);
                            }
                        }
                        ProviderConfigError::Decode { .. } => {}
                        other => prop_assert!(false, "unexpected {}", other),
                    }
                }
            }
        }
    }
}

// === service-account tokens (KEP-4412) ===

/// A token source that mints `tok-<pod uid>` and knows one account per name.
#[derive(Debug, Default)]
struct Tokens {
    minted: std::sync::Mutex<Vec<TokenRequest>>,
    accounts: std::sync::Mutex<usize>,
}

impl ServiceAccountTokenSource for Tokens {
    fn service_account<'a>(
        &'a self,
        _namespace: &'a str,
        name: &'a str,
    ) -> futures_util::future::BoxFuture<'a, Result<ServiceAccountInfo, TokenSourceError>> {
        *self.accounts.lock().expect("lock") += 1;
        let info = ServiceAccountInfo {
            uid: format!("uid-{name}"),
            annotations: [("example.com/role", "puller"), ("unrelated", "x")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        Box::pin(async move { if name == "missing" { Err(TokenSourceError("not found".into())) } else { Ok(info) } })
    }

    fn token<'a>(
        &'a self,
        request: &'a TokenRequest,
    ) -> futures_util::future::BoxFuture<'a, Result<crate::domain::Secret, TokenSourceError>> {
        self.minted.lock().expect("lock").push(request.clone());
        Box::pin(async move { Ok(crate::domain::Secret::new(format!("tok-{}", request.pod_uid))) })
    }
}

fn attrs(cache_type: TokenCacheType, require: bool, required: &[&str]) -> TokenAttributes {
    TokenAttributes {
        audience: "registry.example".into(),
        cache_type,
        require_service_account: require,
        required_annotation_keys: required.iter().map(|k| (*k).to_string()).collect(),
        optional_annotation_keys: vec!["example.com/tier".into()],
    }
}

fn pod(uid: &str, sa: Option<&str>) -> PluginPod {
    PluginPod {
        namespace: "ns".into(),
        name: format!("pod-{uid}"),
        uid: uid.into(),
        service_account: sa.map(PodServiceAccount::named),
    }
}

impl Plugin {
    fn token_provider(&self, attrs: TokenAttributes, clock: &ManualClock) -> PluginProvider {
        let mut p = self.provider("1m", MINUTE, clock);
        let mut spec = p.spec().clone();
        spec.token_attributes = Some(attrs);
        p = PluginProvider::new(spec, self.path("bin/test-plugin"), MINUTE).with_clock(clock.clock());
        p
    }

    fn request(&self) -> String {
        std::fs::read_to_string(self.path("request")).expect("request")
    }
}

#[tokio::test]
async fn a_token_plugin_gets_the_pods_bound_token_and_its_annotations() {
    let p = Plugin::new(&response("Image", None));
    let clock = ManualClock::new();
    let provider = p.token_provider(attrs(TokenCacheType::ServiceAccount, true, &["example.com/role"]), &clock);
    let tokens = Tokens::default();
    let got = provider.provide_for("a.example.com/app", &pod("p1", Some("builder")), Some(&tokens)).await;
    assert_eq!(users(&got.config), [("*.example.com", "plugin-user", "plugin-pass")]);
    assert_eq!(
        got.service_account,
        Some(crate::domain::pull_record::ImagePullServiceAccount {
            uid: "uid-builder".into(),
            namespace: "ns".into(),
            name: "builder".into()
        })
    );
    // The token bound to the pod, for the plugin's audience, the account's uid checked.
    assert_eq!(
        tokens.minted.lock().expect("lock").as_slice(),
        [TokenRequest {
            namespace: "ns".into(),
            service_account: "builder".into(),
            service_account_uid: "uid-builder".into(),
            pod_name: "pod-p1".into(),
            pod_uid: "p1".into(),
            audience: "registry.example".into(),
        }]
    );
    // Sent as the kubelet writes it: the named annotations only.
    assert_eq!(
        p.request(),
        format!(
            "{{\"kind\":\"CredentialProviderRequest\",\"apiVersion\":\"{V1}\",\"image\":\"a.example.com/app\",\"serviceAccountToken\":\"tok-p1\",\"serviceAccountAnnotations\":{{\"example.com/role\":\"puller\"}}}}\n"
        )
    );
}

#[tokio::test]
async fn token_credentials_are_cached_per_service_account_or_per_token() {
    for (cache_type, runs_for_second_pod) in [(TokenCacheType::ServiceAccount, 1), (TokenCacheType::Token, 2)] {
        let p = Plugin::new(&response("Image", None));
        let clock = ManualClock::new();
        let provider = p.token_provider(attrs(cache_type, true, &[]), &clock);
        let tokens = Tokens::default();
        let image = "a.example.com/app";
        provider.provide_for(image, &pod("p1", Some("builder")), Some(&tokens)).await;
        assert_eq!(p.runs(), 1);
        // Another pod of the same account: its own token.
        let second = provider.provide_for(image, &pod("p2", Some("builder")), Some(&tokens)).await;
        assert_eq!(p.runs(), runs_for_second_pod, "{cache_type:?}");
        assert!(!second.config.entries.is_empty());
        // The first pod again: cached either way (same token).
        provider.provide_for(image, &pod("p1", Some("builder")), Some(&tokens)).await;
        assert_eq!(p.runs(), runs_for_second_pod, "{cache_type:?}: the first token's entry");
        // Another account never shares an entry.
        provider.provide_for(image, &pod("p3", Some("deployer")), Some(&tokens)).await;
        assert_eq!(p.runs(), runs_for_second_pod + 1, "{cache_type:?}");
        // And a pod without a token (no account, not required) neither.
        let optional = p.token_provider(attrs(cache_type, false, &[]), &clock);
        optional.provide_for(image, &pod("p4", None), Some(&tokens)).await;
        assert!(!p.request().contains("serviceAccountToken"), "{}", p.request());
    }
}

#[tokio::test]
async fn a_token_plugin_is_not_run_without_what_it_requires() {
    let p = Plugin::new(&response("Image", None));
    let clock = ManualClock::new();
    let tokens = Tokens::default();
    let image = "a.example.com/app";
    // requireServiceAccount and a pod without one.
    let required = p.token_provider(attrs(TokenCacheType::ServiceAccount, true, &[]), &clock);
    assert_eq!(required.provide_for(image, &pod("p1", None), Some(&tokens)).await, Provided::default());
    // A required annotation the account does not have.
    let annotated = p.token_provider(attrs(TokenCacheType::ServiceAccount, true, &["example.com/absent"]), &clock);
    assert_eq!(annotated.provide_for(image, &pod("p1", Some("builder")), Some(&tokens)).await, Provided::default());
    // An account the source cannot find, and no source at all.
    assert_eq!(required.provide_for(image, &pod("p1", Some("missing")), Some(&tokens)).await, Provided::default());
    assert_eq!(required.provide_for(image, &pod("p1", Some("builder")), None).await, Provided::default());
    assert_eq!(p.runs(), 0);
    assert!(tokens.minted.lock().expect("lock").is_empty(), "no token minted for a plugin that does not run");
}

#[tokio::test]
async fn the_requests_own_account_and_token_are_used_before_the_source() {
    let p = Plugin::new(&response("Image", None));
    let clock = ManualClock::new();
    let provider = p.token_provider(attrs(TokenCacheType::Token, true, &["example.com/role"]), &clock);
    let tokens = Tokens::default();
    let mut sa = PodServiceAccount::named("builder");
    sa.uid = "given-uid".into();
    sa.annotations.insert("example.com/role".into(), "given".into());
    sa.tokens.insert("registry.example".into(), crate::domain::Secret::new("caller-token"));
    let pod = PluginPod { service_account: Some(sa), ..pod("p1", None) };
    let got = provider.provide_for("a.example.com/app", &pod, Some(&tokens)).await;
    assert_eq!(got.service_account.map(|s| s.uid), Some("given-uid".to_string()));
    assert!(p.request().contains("\"serviceAccountToken\":\"caller-token\""));
    assert!(p.request().contains("\"example.com/role\":\"given\""));
    assert_eq!(*tokens.accounts.lock().expect("lock"), 0);
    assert!(tokens.minted.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn the_token_echoed_as_a_password_is_refused_unless_cached_per_token() {
    let echo = |cache_type| {
        let body = format!(
            r#"{{"apiVersion":"{V1}","kind":"CredentialProviderResponse","cacheKeyType":"Image","auth":{{"*.example.com":{{"username":"u","password":"tok-p1"}}}}}}"#
        );
        (Plugin::new(&body), cache_type)
    };
    let tokens = Tokens::default();
    let clock = ManualClock::new();
    let (p, t) = echo(TokenCacheType::ServiceAccount);
    let got = p
        .token_provider(attrs(t, true, &[]), &clock)
        .provide_for("a.example.com/x", &pod("p1", Some("sa")), Some(&tokens))
        .await;
    assert!(got.config.entries.is_empty());
    let (p, t) = echo(TokenCacheType::Token);
    let got = p
        .token_provider(attrs(t, true, &[]), &clock)
        .provide_for("a.example.com/x", &pod("p1", Some("sa")), Some(&tokens))
        .await;
    assert_eq!(got.config.entries.len(), 1);
}

// === a runner in place of the executable ===

/// A stand-in runner: answers with `output` (or hangs), records what it was
/// given. What the provider does around a run is the same as for a process.
#[derive(Debug, Default)]
struct StandIn {
    output: Option<PluginOutput>,
    asked: std::sync::Mutex<Vec<(PathBuf, Vec<String>, String)>>,
}

impl PluginRunner for StandIn {
    fn run<'a>(
        &'a self,
        executable: &'a Path,
        spec: &'a ProviderSpec,
        stdin: Vec<u8>,
    ) -> futures_util::future::BoxFuture<'a, Result<PluginOutput, String>> {
        self.asked.lock().expect("lock").push((
            executable.to_path_buf(),
            spec.args.clone(),
            String::from_utf8(stdin).expect("utf-8"),
        ));
        Box::pin(async move {
            match &self.output {
                Some(o) => Ok(o.clone()),
                None => std::future::pending().await,
            }
        })
    }
}

fn run_by(runner: &std::sync::Arc<StandIn>, timeout: Duration) -> PluginProvider {
    let p = Plugin::new("unused");
    p.provider("1m", timeout, &ManualClock::new()).with_runner(runner.clone())
}

#[tokio::test(start_paused = true)]
async fn a_runner_stands_in_for_the_executable_with_the_same_checks_around_it() {
    let ok = |stdout: String| PluginOutput { code: Some(0), stdout: stdout.into_bytes(), stderr: Vec::new() };
    // A response: decoded, cached as it says, the executable never run.
    let runner =
        std::sync::Arc::new(StandIn { output: Some(ok(response("Registry", Some("5m")))), ..StandIn::default() });
    let provider = run_by(&runner, MINUTE);
    assert_eq!(users(&provider.provide("a.example.com/x").await), [("*.example.com", "plugin-user", "plugin-pass")]);
    provider.provide("a.example.com/y").await;
    assert!(provider.provide("quay.io/app").await.entries.is_empty(), "not matched: not asked");
    {
        let asked = runner.asked.lock().expect("lock");
        assert_eq!(asked.len(), 1, "the registry's entry serves the second image");
        assert!(asked[0].0.ends_with("bin/test-plugin"), "{:?}", asked[0].0);
        assert_eq!(asked[0].1, ["get-credentials"]);
        assert!(asked[0].2.contains("\"image\":\"a.example.com/x\""), "{}", asked[0].2);
    }
    // A non-zero exit: the process's error, stderr counted, never shown.
    let runner = std::sync::Arc::new(StandIn {
        output: Some(PluginOutput { code: Some(2), stdout: Vec::new(), stderr: b"token=abc".to_vec() }),
        ..StandIn::default()
    });
    let err = run_by(&runner, MINUTE).run("a.example.com/x").await.expect_err("exits 2").to_string();
    assert_eq!(
        err,
        "error execing credential provider plugin test-plugin for image a.example.com/x: exit status 2 \
         (stderr: 9 bytes, not shown: a plugin's output may hold credentials)"
    );
    // Killed by a signal, and a malformed response.
    let runner = std::sync::Arc::new(StandIn {
        output: Some(PluginOutput { code: None, ..PluginOutput::default() }),
        ..StandIn::default()
    });
    let err = run_by(&runner, MINUTE).run("a.example.com/x").await.expect_err("killed").to_string();
    assert!(err.contains(": signal: killed (stderr: 0 bytes"), "{err}");
    let runner = std::sync::Arc::new(StandIn { output: Some(ok("{\"apiVersion\":".into())), ..StandIn::default() });
    assert_eq!(run_by(&runner, MINUTE).run("a.example.com/x").await, Err(PluginError::Decode));
    // A run that never ends is cut at the timeout, on tokio's (paused) time.
    let runner = std::sync::Arc::new(StandIn::default());
    let started = tokio::time::Instant::now();
    let err = run_by(&runner, Duration::from_secs(20)).run("a.example.com/x").await.expect_err("times out").to_string();
    assert!(err.contains(": context deadline exceeded ("), "{err}");
    assert_eq!(started.elapsed(), Duration::from_secs(20));
}
