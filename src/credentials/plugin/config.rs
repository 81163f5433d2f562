//! `CredentialProviderConfig`: read from a file or a directory of
//! `*.json`/`*.yaml`/`*.yml` files (lexicographic order, merged), decoded
//! and validated with the kubelet's texts.
//!
//! `env` values may be secrets: they are kept in [`Secret`]s and no error
//! shows them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::decode::{RawEnv, RawProvider, RawTokenAttributes};
use crate::credentials::keyring::normalize_key;
use crate::domain::Secret;
use crate::domain::go_text::{duration as go_duration, json_string, quote};

/// API group of `CredentialProviderConfig`.
pub const CONFIG_GROUP: &str = "kubelet.config.k8s.io";
/// `apiVersion`s of `CredentialProviderConfig` accepted.
pub const CONFIG_API_VERSIONS: [&str; 3] =
    ["kubelet.config.k8s.io/v1alpha1", "kubelet.config.k8s.io/v1beta1", "kubelet.config.k8s.io/v1"];
/// `apiVersion`s a provider may speak (request and response).
pub const PROVIDER_API_VERSIONS: [&str; 3] = [
    "credentialprovider.kubelet.k8s.io/v1alpha1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1",
];

/// Why the provider configuration could not be used (the kubelet's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderConfigError {
    /// No config path given.
    #[error("credential provider config path is empty")]
    EmptyPath,
    /// The config path could not be inspected.
    #[error("unable to access path {}: {reason}", quote(&.path.display().to_string()))]
    Access {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        reason: String,
    },
    /// A directory without any config file.
    #[error("no configuration files found in directory {}", quote(&.0.display().to_string()))]
    NoFiles(PathBuf),
    /// A file could not be read.
    #[error("unable to read file {}: {reason}", quote(&.path.display().to_string()))]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        reason: String,
    },
    /// A file did not decode.
    #[error("error decoding config {}: {reason}", quote(&.path.display().to_string()))]
    Decode {
        /// The file.
        path: PathBuf,
        /// What was wrong (no values of `env`).
        reason: String,
    },
    /// The same provider name in two files.
    #[error("duplicate provider name {} found in configuration file(s)", quote(.0))]
    DuplicateAcrossFiles(String),
    /// Validation failed: every field error, as the kubelet aggregates them.
    #[error("failed to validate credential provider config: {}", aggregate(.0))]
    Invalid(Vec<String>),
    /// The plugin directory is missing.
    #[error("plugin binary directory {} did not exist", .0.display())]
    NoBinDir(PathBuf),
    /// The plugin directory could not be inspected.
    #[error("error inspecting binary directory {}: {reason}", .path.display())]
    BinDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        reason: String,
    },
    /// A provider's executable is missing.
    #[error("plugin binary executable {} did not exist", .0.display())]
    NoExecutable(PathBuf),
    /// The kubeconfig for service-account tokens cannot be used.
    #[error(transparent)]
    Kubeconfig(crate::credentials::KubeconfigError),
    /// A provider's executable could not be inspected.
    #[error("error inspecting binary executable {}: {reason}", .path.display())]
    Executable {
        /// The executable.
        path: PathBuf,
        /// The I/O error.
        reason: String,
    },
}

/// Go's `field.ErrorList.ToAggregate` text: identical messages once, one
/// error alone, several in brackets.
fn aggregate(errors: &[String]) -> String {
    let mut unique: Vec<&str> = Vec::with_capacity(errors.len());
    for e in errors {
        if !unique.contains(&e.as_str()) {
            unique.push(e);
        }
    }
    match unique.as_slice() {
        [one] => (*one).to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// One environment variable for a plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvVar {
    /// Name.
    pub name: String,
    /// Value (may be a secret).
    pub value: Secret,
}

/// One configured exec plugin, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderSpec {
    /// Name = executable name in the bin dir.
    pub name: String,
    /// Image patterns the plugin is asked about.
    pub match_images: Vec<String>,
    /// Cache duration when a response gives none.
    pub default_cache_duration: Duration,
    /// `credentialprovider.kubelet.k8s.io/...` version spoken.
    pub api_version: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Environment added after imaged's own.
    pub env: Vec<EnvVar>,
    /// Service-account token mode (KEP-4412), when configured.
    pub token_attributes: Option<TokenAttributes>,
}

/// How a provider's credentials are cached when it gets a service-account
/// token (`tokenAttributes.cacheType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenCacheType {
    /// Per service account (namespace, name, uid, annotations): every pod
    /// of the account shares the credentials.
    ServiceAccount,
    /// Per token as well: an entry serves only the token it was got with.
    Token,
}

impl TokenCacheType {
    /// The configuration's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ServiceAccount => "ServiceAccount",
            Self::Token => "Token",
        }
    }
}

/// A provider's `tokenAttributes`, validated (KEP-4412): the plugin is sent
/// a service-account token for `audience` and the annotations named here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenAttributes {
    /// `serviceAccountTokenAudience`.
    pub audience: String,
    /// `cacheType`.
    pub cache_type: TokenCacheType,
    /// `requireServiceAccount`: a pod without a service account gets no
    /// credentials from this plugin (false: the plugin runs without a token).
    pub require_service_account: bool,
    /// Annotations the service account must have (else the plugin is not run).
    pub required_annotation_keys: Vec<String>,
    /// Annotations passed when the service account has them.
    pub optional_annotation_keys: Vec<String>,
}

/// Decodes one file into its providers (see [`super::decode`]), naming the
/// file in the error.
fn decode(path: &Path, bytes: &[u8]) -> Result<Vec<RawProvider>, ProviderConfigError> {
    super::decode::decode(bytes)
        .map(|c| c.providers)
        .map_err(|reason| ProviderConfigError::Decode { path: path.to_path_buf(), reason })
}

/// The files of `config_path`: itself, or the `*.json`, `*.yaml`, `*.yml`
/// files of a directory in lexicographic order.
fn config_files(config_path: &Path) -> Result<Vec<PathBuf>, ProviderConfigError> {
    if config_path.as_os_str().is_empty() {
        return Err(ProviderConfigError::EmptyPath);
    }
    let meta = std::fs::metadata(config_path)
        .map_err(|e| ProviderConfigError::Access { path: config_path.to_path_buf(), reason: e.to_string() })?;
    if !meta.is_dir() {
        return Ok(vec![config_path.to_path_buf()]);
    }
    let read_dir =
        |e: std::io::Error| ProviderConfigError::Access { path: config_path.to_path_buf(), reason: e.to_string() };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(config_path).map_err(read_dir)? {
        let entry = entry.map_err(read_dir)?;
        if entry.file_type().map_err(read_dir)?.is_dir() {
            continue;
        }
        let path = entry.path();
        if matches!(path.extension().and_then(|e| e.to_str()), Some("json" | "yaml" | "yml")) {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(ProviderConfigError::NoFiles(config_path.to_path_buf()));
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

/// Reads, merges and validates the providers configured at `config_path`
/// (a file or a directory), in configuration order.
pub fn load_provider_config(config_path: &Path) -> Result<Vec<ProviderSpec>, ProviderConfigError> {
    load_with_hash(config_path).map(|(specs, _)| specs)
}

/// [`load_provider_config`] and the kubelet's configuration hash.
fn load_with_hash(config_path: &Path) -> Result<(Vec<ProviderSpec>, String), ProviderConfigError> {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    let mut providers: Vec<RawProvider> = Vec::new();
    for file in config_files(config_path)? {
        let bytes = crate::files::read(&file, crate::files::CONFIG_FILE_LIMIT)
            .map_err(|e| ProviderConfigError::Read { path: file.clone(), reason: e.to_string() })?;
        // Length-prefixed, so file boundaries change the hash.
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(&bytes);
        let decoded = decode(&file, &bytes)?;
        // Duplicates within one file are a validation error; across files a merge error.
        for p in &decoded {
            if providers.iter().any(|q| q.name == p.name) {
                return Err(ProviderConfigError::DuplicateAcrossFiles(p.name.clone()));
            }
        }
        providers.extend(decoded);
    }
    let hash = crate::domain::go_text::hex(&hasher.finalize());
    Ok((validate(providers)?, format!("sha256:{hash}")))
}

/// Registered providers: each with its executable, and the configuration's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredProviders {
    /// (provider, executable), in configuration order.
    pub providers: Vec<(ProviderSpec, PathBuf)>,
    /// `sha256:<hex>` of every file's 8-byte big-endian length and content.
    pub config_hash: String,
}

fn invalid_value(field: &str, value: &str, detail: &str) -> String {
    format!("{field}: Invalid value: {}: {detail}", quote(value))
}

/// `field.Required`: the detail, when given, after the body.
fn required(field: &str, detail: &str) -> String {
    if detail.is_empty() { format!("{field}: Required value") } else { format!("{field}: Required value: {detail}") }
}

/// The kubelet's `validateCredentialProviderConfig` (service-account token
/// mode is not supported: `tokenAttributes` is rejected). Every error is
/// collected, in the kubelet's order.
fn validate(providers: Vec<RawProvider>) -> Result<Vec<ProviderSpec>, ProviderConfigError> {
    let mut errs = Vec::new();
    if providers.is_empty() {
        errs.push(required("providers", "at least 1 item in plugins is required"));
    }
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for p in providers {
        validate_name(&p.name, &seen, &mut errs);
        seen.push(p.name.clone());
        out.push(validate_provider(p, &mut errs));
    }
    if errs.is_empty() { Ok(out) } else { Err(ProviderConfigError::Invalid(errs)) }
}

/// `providers.name`: a file name in the bin dir, unique (`seen` holds the
/// names before it).
fn validate_name(name: &str, seen: &[String], errs: &mut Vec<String>) {
    if name.contains('/') {
        errs.push(invalid_value("providers.name", name, "provider name cannot contain '/'"));
    }
    if name.contains(' ') {
        errs.push(invalid_value("providers.name", name, "provider name cannot contain spaces"));
    }
    if name == "." {
        errs.push(invalid_value("providers.name", name, "provider name cannot be '.'"));
    }
    if name == ".." {
        errs.push(invalid_value("providers.name", name, "provider name cannot be '..'"));
    }
    if name.is_empty() {
        errs.push(required("providers.name", "name is required"));
    }
    if seen.iter().any(|s| s == name) {
        errs.push(format!("providers.name: Duplicate value: {}", quote(name)));
    }
}

/// The checks of one provider after its name; the spec as far as it is valid.
fn validate_provider(p: RawProvider, errs: &mut Vec<String>) -> ProviderSpec {
    validate_api_version(&p.api_version, errs);
    let match_images = p.match_images;
    validate_match_images(&match_images, errs);
    let default_cache_duration = validate_cache_duration(p.default_cache_ns, errs);
    let token_attributes = p.token_attributes.and_then(|t| validate_token_attributes(t, &p.api_version, errs));
    let env = env_vars(p.env);
    ProviderSpec {
        name: p.name,
        match_images,
        default_cache_duration,
        api_version: p.api_version,
        args: p.args,
        env,
        token_attributes,
    }
}

/// The kubelet's `tokenAttributes` rules, in its order; the attributes when
/// valid.
fn validate_token_attributes(
    t: RawTokenAttributes,
    provider_api_version: &str,
    errs: &mut Vec<String>,
) -> Option<TokenAttributes> {
    const FIELD: &str = "providers.tokenAttributes";
    let before = errs.len();
    if t.audience.is_empty() {
        errs.push(required(&format!("{FIELD}.serviceAccountTokenAudience"), ""));
    }
    if t.require_service_account.is_none() {
        errs.push(required(&format!("{FIELD}.requireServiceAccount"), ""));
    }
    let v1 = "credentialprovider.kubelet.k8s.io/v1";
    if provider_api_version != v1 {
        errs.push(format!("{FIELD}: Forbidden: tokenAttributes is only supported for {v1} API version"));
    }
    if t.require_service_account == Some(false) && !t.required_keys.is_empty() {
        errs.push(format!(
            "{FIELD}.requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set"
        ));
    }
    validate_annotation_keys(&format!("{FIELD}.requiredServiceAccountAnnotationKeys"), &t.required_keys, errs);
    validate_annotation_keys(&format!("{FIELD}.optionalServiceAccountAnnotationKeys"), &t.optional_keys, errs);
    let mut both: Vec<&String> = t.required_keys.iter().filter(|k| t.optional_keys.contains(k)).collect();
    both.sort();
    both.dedup();
    if !both.is_empty() {
        // `field.Invalid` of a list: the value as JSON.
        let mut list = String::from("[");
        for (i, k) in both.iter().enumerate() {
            if i > 0 {
                list.push(',');
            }
            json_string(&mut list, k);
        }
        list.push(']');
        errs.push(format!("{FIELD}: Invalid value: {list}: annotation keys cannot be both required and optional"));
    }
    let cache_type = match t.cache_type.as_str() {
        "" => {
            errs.push(required(
                &format!("{FIELD}.cacheType"),
                "cacheType is required to be set when tokenAttributes is specified. Supported values are: ServiceAccount, Token",
            ));
            None
        }
        "ServiceAccount" => Some(TokenCacheType::ServiceAccount),
        "Token" => Some(TokenCacheType::Token),
        other => {
            errs.push(format!(
                "{FIELD}.cacheType: Unsupported value: {}: supported values: \"ServiceAccount\", \"Token\"",
                quote(other)
            ));
            None
        }
    };
    if errs.len() > before {
        return None;
    }
    Some(TokenAttributes {
        audience: t.audience,
        cache_type: cache_type?,
        require_service_account: t.require_service_account?,
        required_annotation_keys: t.required_keys,
        optional_annotation_keys: t.optional_keys,
    })
}

/// Each key a qualified name (case aside), none twice.
fn validate_annotation_keys(field: &str, keys: &[String], errs: &mut Vec<String>) {
    let mut seen: Vec<&str> = Vec::new();
    for k in keys {
        for msg in crate::domain::k8s_names::qualified_name_errors(&k.to_lowercase()) {
            errs.push(invalid_value(field, k, &msg));
        }
        if seen.contains(&k.as_str()) {
            errs.push(format!("{field}: Duplicate value: {}", quote(k)));
        }
        seen.push(k);
    }
}

fn validate_api_version(api_version: &str, errs: &mut Vec<String>) {
    if api_version.is_empty() {
        errs.push(required("providers.apiVersion", ""));
    } else if !PROVIDER_API_VERSIONS.contains(&api_version) {
        let mut supported: Vec<String> = PROVIDER_API_VERSIONS.iter().map(|v| quote(v)).collect();
        supported.sort();
        errs.push(format!(
            "providers.apiVersion: Unsupported value: {}: supported values: {}",
            quote(api_version),
            supported.join(", ")
        ));
    }
}

/// At least one pattern, each a valid keyring key.
fn validate_match_images(match_images: &[String], errs: &mut Vec<String>) {
    if match_images.is_empty() {
        errs.push(required("providers.matchImages", "at least 1 item in matchImages is required"));
    }
    for m in match_images {
        if let Err(e) = normalize_key(m) {
            let detail = format!("match image is invalid: parse {}: {}", quote(&format!("https://{m}")), e.reason);
            errs.push(invalid_value("providers.matchImages", m, &detail));
        }
    }
}

/// Required and not negative; zero when invalid.
fn validate_cache_duration(ns: Option<i64>, errs: &mut Vec<String>) -> Duration {
    match ns {
        None => errs.push(required("providers.defaultCacheDuration", "")),
        // `field.Invalid` renders a `metav1.Duration` as its JSON: quoted.
        Some(ns) if ns < 0 => errs.push(format!(
            "providers.defaultCacheDuration: Invalid value: \"-{}\": must be greater than or equal to 0",
            go_duration(Duration::from_nanos(ns.unsigned_abs()))
        )),
        Some(ns) => return Duration::from_nanos(ns.unsigned_abs()),
    }
    Duration::ZERO
}

/// The variables, their values kept as [`Secret`]s (decoding already
/// refused a value that is not a string, without showing it).
fn env_vars(env: Vec<RawEnv>) -> Vec<EnvVar> {
    env.into_iter().map(|e| EnvVar { name: e.name, value: e.value }).collect()
}

/// The kubelet's registration checks: the bin dir exists, the config loads
/// and validates, and every provider's executable exists in the bin dir.
/// Returns each provider with its executable.
pub fn register_providers(config_path: &Path, bin_dir: &Path) -> Result<RegisteredProviders, ProviderConfigError> {
    if let Err(e) = std::fs::metadata(bin_dir) {
        return Err(if e.kind() == std::io::ErrorKind::NotFound {
            ProviderConfigError::NoBinDir(bin_dir.to_path_buf())
        } else {
            ProviderConfigError::BinDir { path: bin_dir.to_path_buf(), reason: e.to_string() }
        });
    }
    let (specs, config_hash) = load_with_hash(config_path)?;
    let mut out = Vec::with_capacity(specs.len());
    for spec in specs {
        let bin = bin_dir.join(&spec.name);
        if let Err(e) = std::fs::metadata(&bin) {
            return Err(if e.kind() == std::io::ErrorKind::NotFound {
                ProviderConfigError::NoExecutable(bin)
            } else {
                ProviderConfigError::Executable { path: bin, reason: e.to_string() }
            });
        }
        out.push((spec, bin));
    }
    Ok(RegisteredProviders { providers: out, config_hash })
}
