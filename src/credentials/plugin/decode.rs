//! Decoding one `CredentialProviderConfig` file as strictly as the kubelet
//! (since 1.33) does, with its texts: the kind and `apiVersion` looked up
//! in the kubelet's scheme, values of the wrong type named the way Go's
//! `encoding/json` names them, and every unknown field reported with its
//! path (`strict decoding error: unknown field "providers[0].unknownField"`),
//! so a typo is refused instead of silently dropped.
//!
//! The document is read into a YAML value (JSON is YAML) and walked along
//! the schema of its version; no error quotes a value from the file (`env`
//! values may be secrets): Go's own type errors name only the JSON type.

use std::fmt::Write as _;

use serde_yaml_ng::Value;

use crate::domain::Secret;
use crate::domain::go_text::{parse_duration, quote};

/// `kind` of the configuration.
const CONFIG_KIND: &str = "CredentialProviderConfig";
/// The kubelet's scheme: each version it registers and the kinds in it.
const REGISTERED: [(&str, &[&str]); 6] = [
    ("kubelet.config.k8s.io/v1alpha1", &["CredentialProviderConfig", "ImagePullIntent", "ImagePulledRecord"]),
    (
        "kubelet.config.k8s.io/v1beta1",
        &["CredentialProviderConfig", "KubeletConfiguration", "SerializedNodeConfigSource"],
    ),
    ("kubelet.config.k8s.io/v1", &["CredentialProviderConfig"]),
    ("credentialprovider.kubelet.k8s.io/v1alpha1", &["CredentialProviderRequest", "CredentialProviderResponse"]),
    ("credentialprovider.kubelet.k8s.io/v1beta1", &["CredentialProviderRequest", "CredentialProviderResponse"]),
    ("credentialprovider.kubelet.k8s.io/v1", &["CredentialProviderRequest", "CredentialProviderResponse"]),
];

/// A decoded configuration file (before validation).
#[derive(Debug, Default)]
pub(super) struct RawConfig {
    pub(super) providers: Vec<RawProvider>,
}

/// One provider as decoded.
#[derive(Debug, Default)]
pub(super) struct RawProvider {
    pub(super) name: String,
    pub(super) match_images: Vec<String>,
    /// `defaultCacheDuration` in Go nanoseconds; `None` when absent.
    pub(super) default_cache_ns: Option<i64>,
    pub(super) api_version: String,
    pub(super) args: Vec<String>,
    pub(super) env: Vec<RawEnv>,
    pub(super) token_attributes: Option<RawTokenAttributes>,
}

/// One `env` entry.
#[derive(Debug, Default)]
pub(super) struct RawEnv {
    pub(super) name: String,
    pub(super) value: Secret,
}

/// `tokenAttributes` as decoded (only `kubelet.config.k8s.io/v1` has it).
#[derive(Debug, Default)]
pub(super) struct RawTokenAttributes {
    pub(super) audience: String,
    pub(super) cache_type: String,
    pub(super) require_service_account: Option<bool>,
    pub(super) required_keys: Vec<String>,
    pub(super) optional_keys: Vec<String>,
}

/// Go's name of a value's JSON type (`encoding/json`'s `UnmarshalTypeError.Value`).
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Sequence(_) => "array",
        Value::Mapping(_) => "object",
        Value::Tagged(t) => json_type(&t.value),
    }
}

fn untag(v: &Value) -> &Value {
    match v {
        Value::Tagged(t) => untag(&t.value),
        v => v,
    }
}

/// The walk's state: where it is, and what it found wrong.
struct Walk<'a> {
    /// Go package of the versioned types (`v1`, `v1beta1`, `v1alpha1`).
    package: &'a str,
    /// JSON field names from the root, for type errors (`providers.env.value`).
    fields: Vec<&'static str>,
    /// The path with indices, for unknown fields (`providers[0].env[1]`).
    path: String,
    /// The first value of the wrong type (Go keeps decoding and reports it at the end).
    type_error: Option<String>,
    /// A `metav1.Duration` that did not decode (Go stops there).
    fatal: Option<String>,
    /// Every unknown field, in document order.
    unknown: Vec<String>,
}

impl Walk<'_> {
    fn type_error(&mut self, strukt: &str, value: &Value, go_type: &str) {
        if self.type_error.is_none() {
            self.type_error = Some(format!(
                "json: cannot unmarshal {} into Go struct field {strukt}.{} of type {go_type}",
                json_type(value),
                self.fields.join(".")
            ));
        }
    }

    fn go_type(&self, name: &str) -> String {
        format!("{}.{name}", self.package)
    }

    /// Walks a JSON object of Go type `go_type` (a field of struct
    /// `parent`): each known field goes to `field`, unknown ones are
    /// recorded. Returns false (a type error recorded) when `value` is not
    /// an object.
    fn object(
        &mut self,
        parent: &str,
        go_type: &str,
        value: &Value,
        known: &[&'static str],
        mut field: impl FnMut(&mut Self, &'static str, &Value),
    ) -> bool {
        let value = untag(value);
        let Value::Mapping(map) = value else {
            if !matches!(value, Value::Null) {
                self.type_error(parent, value, go_type);
            }
            return false;
        };
        for (k, v) in map {
            let key = match untag(k) {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => String::new(),
            };
            match known.iter().find(|f| **f == key) {
                Some(name) => {
                    let path_len = self.path.len();
                    if !self.path.is_empty() {
                        self.path.push('.');
                    }
                    self.path.push_str(name);
                    self.fields.push(name);
                    field(self, name, v);
                    self.fields.pop();
                    self.path.truncate(path_len);
                }
                None => {
                    let full = if self.path.is_empty() { key } else { format!("{}.{key}", self.path) };
                    self.unknown.push(format!("unknown field {}", quote(&full)));
                }
            }
        }
        true
    }

    /// A string field of `strukt` (null: empty).
    fn string(&mut self, strukt: &str, v: &Value) -> String {
        match untag(v) {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => {
                self.type_error(strukt, other, "string");
                String::new()
            }
        }
    }

    /// A `[]string` field of `strukt` (null: empty).
    fn strings(&mut self, strukt: &str, v: &Value) -> Vec<String> {
        match untag(v) {
            Value::Sequence(items) => items
                .iter()
                .filter_map(|item| match untag(item) {
                    Value::String(s) => Some(s.clone()),
                    Value::Null => Some(String::new()),
                    other => {
                        self.type_error(strukt, other, "string");
                        None
                    }
                })
                .collect(),
            Value::Null => Vec::new(),
            other => {
                self.type_error(strukt, other, "[]string");
                Vec::new()
            }
        }
    }

    /// The elements of a `[]T` field (null: none), each walked by `item`
    /// with its index on the path.
    fn list<T>(&mut self, strukt: &str, elem: &str, v: &Value, mut item: impl FnMut(&mut Self, &Value) -> T) -> Vec<T> {
        match untag(v) {
            Value::Sequence(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, it) in items.iter().enumerate() {
                    let len = self.path.len();
                    let _ = write!(self.path, "[{i}]");
                    out.push(item(self, it));
                    self.path.truncate(len);
                }
                out
            }
            Value::Null => Vec::new(),
            other => {
                let t = format!("[]{}", self.go_type(elem));
                self.type_error(strukt, other, &t);
                Vec::new()
            }
        }
    }

    fn provider(&mut self, v: &Value, with_token_attributes: bool) -> RawProvider {
        let mut p = RawProvider::default();
        let known: &[&'static str] = if with_token_attributes {
            &["name", "matchImages", "defaultCacheDuration", "apiVersion", "args", "env", "tokenAttributes"]
        } else {
            &["name", "matchImages", "defaultCacheDuration", "apiVersion", "args", "env"]
        };
        let t = self.go_type("CredentialProvider");
        let s = "CredentialProvider";
        self.object(CONFIG_KIND, &t, v, known, |w, field, v| match field {
            "name" => p.name = w.string(s, v),
            "matchImages" => p.match_images = w.strings(s, v),
            "defaultCacheDuration" => p.default_cache_ns = w.duration(s, v),
            "apiVersion" => p.api_version = w.string(s, v),
            "args" => p.args = w.strings(s, v),
            "env" => p.env = w.list(s, "ExecEnvVar", v, Self::env),
            "tokenAttributes" => p.token_attributes = w.token_attributes(v),
            _ => {}
        });
        p
    }

    /// A `*metav1.Duration`: a Go duration string; anything else stops the
    /// decoding as its `UnmarshalJSON` does.
    fn duration(&mut self, strukt: &str, v: &Value) -> Option<i64> {
        match untag(v) {
            Value::Null => None,
            Value::String(text) => match parse_duration(text) {
                Ok(ns) => Some(ns),
                Err(e) => {
                    self.fatal.get_or_insert_with(|| e.to_string());
                    None
                }
            },
            other => {
                let text = format!(
                    "json: cannot unmarshal {} into Go struct field {strukt}.{} of type string",
                    json_type(other),
                    self.fields.join(".")
                );
                self.fatal.get_or_insert(text);
                None
            }
        }
    }

    fn env(&mut self, v: &Value) -> RawEnv {
        let mut e = RawEnv::default();
        let t = self.go_type("ExecEnvVar");
        self.object("CredentialProvider", &t, v, &["name", "value"], |w, field, v| match field {
            "name" => e.name = w.string("ExecEnvVar", v),
            // Checked like any string; the type error names no value.
            "value" => e.value = Secret::new(w.string("ExecEnvVar", v)),
            _ => {}
        });
        e
    }

    fn token_attributes(&mut self, v: &Value) -> Option<RawTokenAttributes> {
        if matches!(untag(v), Value::Null) {
            return None;
        }
        let mut a = RawTokenAttributes::default();
        let s = "ServiceAccountTokenAttributes";
        let t = self.go_type(s);
        let known = [
            "serviceAccountTokenAudience",
            "cacheType",
            "requireServiceAccount",
            "requiredServiceAccountAnnotationKeys",
            "optionalServiceAccountAnnotationKeys",
        ];
        let is_object = self.object("CredentialProvider", &t, v, &known, |w, field, v| match field {
            "serviceAccountTokenAudience" => a.audience = w.string(s, v),
            "cacheType" => {
                a.cache_type = match untag(v) {
                    Value::String(text) => text.clone(),
                    Value::Null => String::new(),
                    other => {
                        let go = w.go_type("ServiceAccountTokenCacheType");
                        w.type_error(s, other, &go);
                        String::new()
                    }
                };
            }
            "requireServiceAccount" => {
                a.require_service_account = match untag(v) {
                    Value::Bool(b) => Some(*b),
                    Value::Null => None,
                    other => {
                        w.type_error(s, other, "bool");
                        None
                    }
                };
            }
            "requiredServiceAccountAnnotationKeys" => a.required_keys = w.strings(s, v),
            "optionalServiceAccountAnnotationKeys" => a.optional_keys = w.strings(s, v),
            _ => {}
        });
        is_object.then_some(a)
    }
}

/// The kubelet's `schema.ParseGroupVersion`: `""`, `"v1"`, `"group/v1"`.
fn parse_group_version(api_version: &str) -> Result<(&str, &str), String> {
    if api_version.is_empty() || api_version == "/" {
        return Ok(("", ""));
    }
    match api_version.split('/').count() {
        1 => Ok(("", api_version)),
        2 => Ok(api_version.split_once('/').unwrap_or(("", api_version))),
        _ => Err(format!("unexpected GroupVersion string: {api_version}")),
    }
}

/// Decodes one file (JSON or YAML) as the kubelet's strict decoder does.
/// Errors are the text after `error decoding config "<file>": `.
pub(super) fn decode(bytes: &[u8]) -> Result<RawConfig, String> {
    let doc: Value = serde_yaml_ng::from_slice(bytes).map_err(|e| {
        // Positions only: the parser's messages can quote scalars (env values).
        match e.location() {
            Some(l) => format!("invalid document at line {} column {}", l.line(), l.column()),
            None => "invalid document".to_string(),
        }
    })?;
    let doc = untag(&doc);
    let Value::Mapping(map) = doc else {
        return Err(format!(
            "json: cannot unmarshal {} into Go value of type struct {{ APIVersion string \"json:\\\"apiVersion,omitempty\\\"\"; Kind string \"json:\\\"kind,omitempty\\\"\" }}",
            json_type(doc)
        ));
    };
    let meta = |name: &str| -> Result<String, String> {
        match map.get(name).map(untag) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => {
                Err(format!("json: cannot unmarshal {} into Go struct field .{name} of type string", json_type(other)))
            }
        }
    };
    let (api_version, kind) = (meta("apiVersion")?, meta("kind")?);
    let (group, version) = parse_group_version(&api_version)?;
    // Go quotes the whole document here; it may hold env values, so imaged does not.
    if kind.is_empty() {
        return Err("Object 'Kind' is missing in the document (not shown: it may hold env values)".to_string());
    }
    if version.is_empty() {
        return Err("Object 'apiVersion' is missing in the document (not shown: it may hold env values)".to_string());
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    let registered = REGISTERED.iter().find(|(v, _)| *v == gv).is_some_and(|(_, kinds)| kinds.contains(&kind.as_str()));
    if !registered {
        return Err(format!("no kind {} is registered for version {}", quote(&kind), quote(&gv)));
    }
    if kind != CONFIG_KIND {
        return Err(format!("failed to decode {} (wrong Kind)", quote(&kind)));
    }
    let mut walk = Walk {
        package: version,
        fields: Vec::new(),
        path: String::new(),
        type_error: None,
        fatal: None,
        unknown: Vec::new(),
    };
    let with_token_attributes = version == "v1";
    let mut config = RawConfig::default();
    let struct_type = walk.go_type(CONFIG_KIND);
    walk.object(CONFIG_KIND, &struct_type, doc, &["apiVersion", "kind", "providers"], |w, field, v| {
        if field == "providers" {
            config.providers =
                w.list(CONFIG_KIND, "CredentialProvider", v, |w, v| w.provider(v, with_token_attributes));
        }
    });
    if let Some(e) = walk.fatal.or(walk.type_error) {
        return Err(e);
    }
    if !walk.unknown.is_empty() {
        return Err(format!("strict decoding error: {}", walk.unknown.join(", ")));
    }
    Ok(config)
}
