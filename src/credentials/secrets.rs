//! Pull secrets: typed [`PullSecret`]s (from JSON or YAML Secret manifests or built by
//! embedders), the docker config formats they carry
//! (`kubernetes.io/dockerconfigjson` and `kubernetes.io/dockercfg`), and the
//! keyring the kubelet builds from them.
//!
//! JSON is read the way Go's `encoding/json` reads it into the kubelet's
//! types: unknown fields ignored, field names matched case-insensitively,
//! `null` meaning "unset". Errors name the secret and the field, never a
//! value.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use serde_json::{Map, Value};

use super::CredentialError;
use super::keyring::{Credential, CredentialSource, Keyring};
use crate::domain::Secret;

/// Secret type of a `config.json`-style pull secret.
pub const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// Data key of a `kubernetes.io/dockerconfigjson` secret.
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
/// Secret type of a legacy `.dockercfg` pull secret.
pub const DOCKERCFG_TYPE: &str = "kubernetes.io/dockercfg";
/// Data key of a `kubernetes.io/dockercfg` secret.
pub const DOCKERCFG_KEY: &str = ".dockercfg";

/// A Kubernetes Secret as the kubelet sees it: `data` already
/// base64-decoded. `Debug` shows the data keys only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PullSecret {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `type` (`kubernetes.io/dockerconfigjson`, `Opaque`, ...).
    pub type_: String,
    /// `data`, decoded.
    pub data: BTreeMap<String, Vec<u8>>,
}

impl fmt::Debug for PullSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let data: BTreeMap<&str, Secret> = self
            .data
            .iter()
            .map(|(k, v)| (k.as_str(), if v.is_empty() { Secret::default() } else { Secret::new("x") }))
            .collect();
        f.debug_struct("PullSecret")
            .field("uid", &self.uid)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("type_", &self.type_)
            .field("data", &data)
            .finish()
    }
}

/// A docker config entry with `auth` resolved into username/password.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DockerConfigEntry {
    /// User name.
    pub username: String,
    /// Password.
    pub password: Secret,
    /// E-mail (deprecated, carried along).
    pub email: String,
}

/// The entries of a docker config (`.dockercfg` map or `config.json`
/// `auths`), registry key → entry, in key order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DockerConfig {
    /// (registry key as written, entry).
    pub entries: Vec<(String, DockerConfigEntry)>,
}

/// Why a docker config did not decode. Names fields and registry keys,
/// never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DockerConfigError {
    /// Not JSON.
    #[error("invalid JSON ({kind} at line {line} column {column})")]
    InvalidJson {
        /// `syntax error`, `unexpected end of input`, ...
        kind: &'static str,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
    },
    /// A field of the wrong JSON type.
    #[error("{path}: expected {expected}")]
    WrongType {
        /// Where, e.g. `auths["registry.io"].password`.
        path: String,
        /// What was expected.
        expected: &'static str,
    },
    /// The kubelet's `unable to parse auth field` (bad base64 or no `:`).
    #[error("{path}: unable to parse auth field, must be formatted as base64(username:password)")]
    BadAuth {
        /// Where, e.g. `auths["registry.io"].auth`.
        path: String,
    },
}

/// Why a Secret manifest was rejected. Names fields, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Not JSON.
    #[error("invalid JSON ({kind} at line {line} column {column})")]
    InvalidJson {
        /// `syntax error`, `unexpected end of input`, ...
        kind: &'static str,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
    },
    /// Not YAML (or not one YAML document of plain data).
    #[error("invalid YAML{}", yaml_position(*.line, *.column))]
    InvalidYaml {
        /// 1-based line, when known.
        line: Option<usize>,
        /// 1-based column, when known.
        column: Option<usize>,
    },
    /// Flow collections (`{…}`, `[…]`) nested deeper than a Secret ever
    /// is: refused before parsing, which takes time quadratic in the depth.
    #[error("invalid YAML: collections nested deeper than {max} levels")]
    TooDeep {
        /// The most levels accepted.
        max: usize,
    },
    /// `kind` is set and is not `Secret`.
    #[error("kind must be \"Secret\"")]
    NotASecret,
    /// `apiVersion` is set and is not `v1`.
    #[error("apiVersion must be \"v1\"")]
    WrongApiVersion,
    /// `metadata.name` missing or empty.
    #[error("metadata.name is required")]
    MissingName,
    /// A field of the wrong JSON type.
    #[error("{field}: expected {expected}")]
    WrongType {
        /// e.g. `data[".dockerconfigjson"]`.
        field: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A `data` value that is not standard padded base64.
    #[error("data[{0:?}]: illegal base64 data")]
    BadBase64(String),
}

fn yaml_position(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" (at line {l} column {c})"),
        _ => String::new(),
    }
}

/// Go's `base64.StdEncoding` (padded, lax trailing bits).
const GO_STD: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
);
/// Go's `base64.RawStdEncoding` (unpadded, lax trailing bits).
const GO_RAW: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone),
);

/// Go's decoders skip `\r` and `\n`.
fn strip_newlines(s: &str) -> String {
    s.chars().filter(|c| *c != '\r' && *c != '\n').collect()
}

fn json_error_kind(e: &serde_json::Error) -> &'static str {
    match e.classify() {
        serde_json::error::Category::Io => "read error",
        serde_json::error::Category::Syntax => "syntax error",
        serde_json::error::Category::Data => "data error",
        serde_json::error::Category::Eof => "unexpected end of input",
    }
}

/// Parses bytes as JSON the way Go does: invalid UTF-8 becomes U+FFFD.
/// The error carries only a category and a position.
fn parse_json(bytes: &[u8]) -> Result<Value, (&'static str, usize, usize)> {
    let text = String::from_utf8_lossy(bytes);
    serde_json::from_str(&text).map_err(|e| (json_error_kind(&e), e.line(), e.column()))
}

/// Values of the fields of `obj` whose name equals `name` ignoring ASCII
/// case (Go's struct-field matching), in map order; `null`s skipped.
fn fields<'a>(obj: &'a Map<String, Value>, name: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    obj.iter().filter(move |(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v).filter(|v| !v.is_null())
}

/// The deepest nesting of YAML flow collections a Secret manifest may have
/// (a real one has three or four).
const MAX_YAML_FLOW_DEPTH: usize = 64;

/// How deep `{` and `[` nest in `bytes`, outside quoted scalars and
/// comments: one linear scan (over-counting brackets inside plain scalars
/// errs on the side of refusing a document no Secret looks like).
fn flow_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut quote: Option<u8> = None;
    let mut comment = false;
    let mut escaped = false;
    for &b in bytes {
        if comment {
            comment = b != b'\n';
            continue;
        }
        match quote {
            Some(b'"') if escaped => escaped = false,
            Some(b'"') if b == b'\\' => escaped = true,
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None => match b {
                b'"' | b'\'' => quote = Some(b),
                b'#' => comment = true,
                b'{' | b'[' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                b'}' | b']' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
    }
    deepest
}

/// A string field (last match wins); "" when absent or null.
fn string_field(obj: &Map<String, Value>, name: &str, path: &str) -> Result<String, DockerConfigError> {
    let mut out = String::new();
    for v in fields(obj, name) {
        out = v
            .as_str()
            .ok_or_else(|| DockerConfigError::WrongType { path: format!("{path}.{name}"), expected: "a string" })?
            .to_string();
    }
    Ok(out)
}

/// The kubelet's `decodeDockerConfigFieldAuth`: base64 of `user:password`,
/// split at the first `:`; padded when the field, trimmed of white space,
/// ends in `=`, else raw. As Go's decoder, `\r` and `\n` anywhere are
/// skipped (a value wrapped across lines decodes); other white space is not.
fn decode_auth(field: &str, path: &str) -> Result<(String, Secret), DockerConfigError> {
    let bad = || DockerConfigError::BadAuth { path: format!("{path}.auth") };
    let cleaned = strip_newlines(field);
    let padded = field.trim().ends_with('=');
    let decoded = if padded { GO_STD.decode(&cleaned) } else { GO_RAW.decode(&cleaned) }.map_err(|_| bad())?;
    let text = String::from_utf8_lossy(&decoded);
    let (user, pass) = text.split_once(':').ok_or_else(bad)?;
    Ok((user.to_string(), Secret::new(pass)))
}

/// One entry (`DockerConfigEntry.UnmarshalJSON`).
fn parse_entry(value: &Value, path: &str) -> Result<DockerConfigEntry, DockerConfigError> {
    let obj = match value {
        Value::Null => return Ok(DockerConfigEntry::default()),
        Value::Object(obj) => obj,
        _ => return Err(DockerConfigError::WrongType { path: path.to_string(), expected: "an object" }),
    };
    let mut entry = DockerConfigEntry {
        username: string_field(obj, "username", path)?,
        password: Secret::new(string_field(obj, "password", path)?),
        email: string_field(obj, "email", path)?,
    };
    let auth = Secret::new(string_field(obj, "auth", path)?);
    if !auth.is_empty() {
        let (username, password) = decode_auth(auth.expose(), path)?;
        entry.username = username;
        entry.password = password;
    }
    Ok(entry)
}

/// A registry → entry map; `prefix` names it in errors.
fn parse_entries(
    value: &Value,
    prefix: &str,
    out: &mut Vec<(String, DockerConfigEntry)>,
) -> Result<(), DockerConfigError> {
    let obj = match value {
        Value::Null => return Ok(()),
        Value::Object(obj) => obj,
        _ => {
            let path = if prefix.is_empty() { "(top level)".to_string() } else { prefix.to_string() };
            return Err(DockerConfigError::WrongType { path, expected: "an object" });
        }
    };
    for (registry, entry) in obj {
        let path = format!("{prefix}[{registry:?}]");
        let entry = parse_entry(entry, &path)?;
        match out.iter_mut().find(|(k, _)| k == registry) {
            Some(slot) => slot.1 = entry,
            None => out.push((registry.clone(), entry)),
        }
    }
    Ok(())
}

/// Parses a `config.json` / `.dockerconfigjson` document
/// (`{"auths": {...}, "HttpHeaders": {...}}`; other fields ignored).
pub fn parse_docker_config_json(bytes: &[u8]) -> Result<DockerConfig, DockerConfigError> {
    let value =
        parse_json(bytes).map_err(|(kind, line, column)| DockerConfigError::InvalidJson { kind, line, column })?;
    let obj = match &value {
        Value::Null => return Ok(DockerConfig::default()),
        Value::Object(obj) => obj,
        _ => return Err(DockerConfigError::WrongType { path: "(top level)".to_string(), expected: "an object" }),
    };
    for headers in fields(obj, "HttpHeaders") {
        let ok = headers.as_object().is_some_and(|h| h.values().all(|v| v.is_string() || v.is_null()));
        if !ok {
            return Err(DockerConfigError::WrongType {
                path: "HttpHeaders".to_string(),
                expected: "an object of strings",
            });
        }
    }
    let mut entries = Vec::new();
    for auths in fields(obj, "auths") {
        parse_entries(auths, "auths", &mut entries)?;
    }
    Ok(DockerConfig { entries })
}

/// Parses a legacy `.dockercfg` document (a bare registry → entry map).
pub fn parse_dockercfg(bytes: &[u8]) -> Result<DockerConfig, DockerConfigError> {
    let value =
        parse_json(bytes).map_err(|(kind, line, column)| DockerConfigError::InvalidJson { kind, line, column })?;
    let mut entries = Vec::new();
    parse_entries(&value, "", &mut entries)?;
    Ok(DockerConfig { entries })
}

impl PullSecret {
    /// A secret with no data yet.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, type_: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into(), type_: type_.into(), ..Self::default() }
    }

    /// The same secret with `data[key] = value`.
    pub fn with_data(mut self, key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.data.insert(key.into(), value.into());
        self
    }

    /// The same secret with `metadata.uid` set.
    pub fn with_uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = uid.into();
        self
    }

    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The source tag for credentials read from this secret.
    pub fn source(&self) -> CredentialSource {
        CredentialSource { secret_uid: self.uid.clone(), namespace: self.namespace.clone(), name: self.name.clone() }
    }

    /// Parses a `v1` Secret manifest in JSON or YAML: JSON when the first
    /// non-blank character is `{` or `[`, YAML otherwise (see
    /// [`from_manifest_json`](Self::from_manifest_json)).
    pub fn from_manifest(bytes: &[u8]) -> Result<Self, CredentialError> {
        match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{' | b'[') => Self::from_manifest_json(bytes),
            _ => Self::from_manifest_yaml(bytes),
        }
    }

    /// Parses a `v1` Secret manifest in YAML, with the rules of
    /// [`from_manifest_json`](Self::from_manifest_json). A document that is
    /// not YAML is reported by position only (never a scalar of it).
    pub fn from_manifest_yaml(bytes: &[u8]) -> Result<Self, CredentialError> {
        if flow_depth(bytes) > MAX_YAML_FLOW_DEPTH {
            return Err(CredentialError::Manifest {
                secret: "<unnamed>".to_string(),
                reason: ManifestError::TooDeep { max: MAX_YAML_FLOW_DEPTH },
            });
        }
        let value: Value = serde_yaml_ng::from_slice(bytes).map_err(|e| CredentialError::Manifest {
            secret: "<unnamed>".to_string(),
            reason: ManifestError::InvalidYaml {
                line: e.location().map(|l| l.line()),
                column: e.location().map(|l| l.column()),
            },
        })?;
        Self::from_manifest_value(&value)
    }

    /// Parses a `v1` Secret manifest in JSON. `data` values are base64
    /// (decoded here), `stringData` values plain strings that override
    /// `data` (as the API server merges them). A missing namespace means
    /// `default`, a missing type `Opaque`.
    pub fn from_manifest_json(bytes: &[u8]) -> Result<Self, CredentialError> {
        let unnamed = |reason| CredentialError::Manifest { secret: "<unnamed>".to_string(), reason };
        let value = parse_json(bytes)
            .map_err(|(kind, line, column)| unnamed(ManifestError::InvalidJson { kind, line, column }))?;
        Self::from_manifest_value(&value)
    }

    /// A manifest already decoded into a JSON value.
    fn from_manifest_value(value: &Value) -> Result<Self, CredentialError> {
        let unnamed = |reason| CredentialError::Manifest { secret: "<unnamed>".to_string(), reason };
        let Value::Object(obj) = value else {
            return Err(unnamed(ManifestError::WrongType { field: "(top level)".to_string(), expected: "an object" }));
        };
        let text = |field: &str, v: Option<&Value>| -> Result<Option<String>, ManifestError> {
            match v {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(ManifestError::WrongType { field: field.to_string(), expected: "a string" }),
            }
        };
        let metadata = match obj.get("metadata") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            Some(_) => {
                return Err(unnamed(ManifestError::WrongType { field: "metadata".into(), expected: "an object" }));
            }
        };
        let meta = |field: &str| text(&format!("metadata.{field}"), metadata.and_then(|m| m.get(field)));
        let name = meta("name").map_err(unnamed)?.unwrap_or_default();
        let namespace =
            meta("namespace").map_err(unnamed)?.filter(|n| !n.is_empty()).unwrap_or_else(|| "default".to_string());
        let named = |reason| CredentialError::Manifest { secret: format!("{namespace}/{name}"), reason };
        if name.is_empty() {
            return Err(unnamed(ManifestError::MissingName));
        }
        let uid = meta("uid").map_err(named)?.unwrap_or_default();
        if text("kind", obj.get("kind")).map_err(named)?.is_some_and(|k| k != "Secret") {
            return Err(named(ManifestError::NotASecret));
        }
        if text("apiVersion", obj.get("apiVersion")).map_err(named)?.is_some_and(|v| v != "v1") {
            return Err(named(ManifestError::WrongApiVersion));
        }
        let type_ = text("type", obj.get("type"))
            .map_err(named)?
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| "Opaque".to_string());
        let mut data = BTreeMap::new();
        for (field, is_base64) in [("data", true), ("stringData", false)] {
            let map = match obj.get(field) {
                None | Some(Value::Null) => continue,
                Some(Value::Object(m)) => m,
                Some(_) => {
                    return Err(named(ManifestError::WrongType { field: field.to_string(), expected: "an object" }));
                }
            };
            for (key, v) in map {
                let Some(s) = text(&format!("{field}[{key:?}]"), Some(v)).map_err(named)? else {
                    data.insert(key.clone(), Vec::new());
                    continue;
                };
                let bytes = if is_base64 {
                    GO_STD.decode(strip_newlines(&s)).map_err(|_| named(ManifestError::BadBase64(key.clone())))?
                } else {
                    s.into_bytes()
                };
                data.insert(key.clone(), bytes);
            }
        }
        Ok(Self { uid, namespace, name, type_, data })
    }

    /// The docker config this secret carries: `Some` for a
    /// `kubernetes.io/dockerconfigjson` secret with a non-empty
    /// `.dockerconfigjson` or a `kubernetes.io/dockercfg` secret with a
    /// non-empty `.dockercfg`, `None` for anything else. A config that does
    /// not decode fails naming the secret.
    pub fn docker_config(&self) -> Result<Option<DockerConfig>, CredentialError> {
        type Parser = fn(&[u8]) -> Result<DockerConfig, DockerConfigError>;
        let (key, parse): (&'static str, Parser) = match self.type_.as_str() {
            DOCKER_CONFIG_JSON_TYPE => (DOCKER_CONFIG_JSON_KEY, parse_docker_config_json),
            DOCKERCFG_TYPE => (DOCKERCFG_KEY, parse_dockercfg),
            _ => return Ok(None),
        };
        match self.data.get(key) {
            Some(bytes) if !bytes.is_empty() => parse(bytes).map(Some).map_err(|source| CredentialError::Secret {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                key,
                source,
            }),
            _ => Ok(None),
        }
    }
}

/// The keyring of the pod's pull secrets (the first half of the kubelet's
/// `MakeDockerKeyring`): every docker-config secret's entries, in secret
/// order, tagged with their secret. `None` when no secret carries a docker
/// config; the first secret that does not decode fails the whole lookup.
/// Entries with invalid registry keys are logged and skipped.
pub fn secrets_keyring(secrets: &[PullSecret]) -> Result<Option<Keyring>, CredentialError> {
    let mut configs = Vec::new();
    for secret in secrets {
        if let Some(config) = secret.docker_config()? {
            configs.push((secret.source(), config));
        }
    }
    if configs.is_empty() {
        return Ok(None);
    }
    let mut keyring = Keyring::new();
    for (source, config) in configs {
        for (registry, entry) in config.entries {
            let cred = Credential::new(entry.username, entry.password, entry.email).with_source(source.clone());
            if let Err(e) = keyring.add(&registry, cred) {
                tracing::warn!(secret = %source, "{e}");
            }
        }
    }
    Ok(Some(keyring))
}

#[cfg(test)]
mod tests;
