//! `--kubelet-config FILE`: the image fields of a real KubeletConfiguration
//! (`kubelet.config.k8s.io/v1beta1`), read so imaged runs with the node's
//! own settings. Every other field is ignored.
//!
//! The fields map onto imaged's keys ([`KubeletImageFields::overrides`]) and
//! are layered between the configuration file and the environment: `IMAGED_*`
//! variables and flags still win. A bad value is an error naming the file
//! and the KubeletConfiguration field.

use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The only apiVersion accepted.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The only kind accepted.
pub const KIND: &str = "KubeletConfiguration";

/// A KubeletConfiguration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeletConfigError {
    /// The file cannot be read, is not YAML, or is not a v1beta1 KubeletConfiguration.
    #[error("KubeletConfiguration {}: {reason}", file.display())]
    File {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A field has a value imaged cannot use.
    #[error("KubeletConfiguration {}: field {field}: {reason}", file.display())]
    Field {
        /// The file.
        file: PathBuf,
        /// The KubeletConfiguration field (`imageMinimumGCAge`).
        field: String,
        /// What is wrong, with the value.
        reason: String,
    },
}

// Types are loose (serde_yaml_ng::Value) where the kubelet's are loose or
// where a wrong type should name the field instead of failing the document.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawKubeletConfiguration {
    api_version: Option<String>,
    kind: Option<String>,
    serialize_image_pulls: Option<serde_yaml_ng::Value>,
    max_parallel_image_pulls: Option<serde_yaml_ng::Value>,
    #[serde(rename = "registryPullQPS")]
    registry_pull_qps: Option<serde_yaml_ng::Value>,
    registry_burst: Option<serde_yaml_ng::Value>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    image_gc_high_threshold_percent: Option<serde_yaml_ng::Value>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    image_gc_low_threshold_percent: Option<serde_yaml_ng::Value>,
    #[serde(rename = "imageMinimumGCAge")]
    image_minimum_gc_age: Option<serde_yaml_ng::Value>,
    #[serde(rename = "imageMaximumGCAge")]
    image_maximum_gc_age: Option<serde_yaml_ng::Value>,
    image_pull_credentials_verification_policy: Option<serde_yaml_ng::Value>,
    preloaded_images_verification_allowlist: Option<serde_yaml_ng::Value>,
    pod_sandbox_image: Option<serde_yaml_ng::Value>,
    container_runtime_endpoint: Option<serde_yaml_ng::Value>,
    image_service_endpoint: Option<serde_yaml_ng::Value>,
    eviction_hard: Option<serde_yaml_ng::Value>,
    eviction_soft: Option<serde_yaml_ng::Value>,
    merge_default_eviction_settings: Option<serde_yaml_ng::Value>,
    runtime_request_timeout: Option<serde_yaml_ng::Value>,
    node_status_max_images: Option<serde_yaml_ng::Value>,
}

/// The kubelet's default `evictionHard` thresholds for the filesystems
/// images live on (Linux).
const DEFAULT_EVICTION_HARD: [(&str, &str); 2] = [("imagefs.available", "15%"), ("nodefs.available", "10%")];

/// The eviction signals whose thresholds bound the image filesystem: its
/// own, and the node filesystem's (the same disk on most nodes, where the
/// kubelet's reclaim for either deletes images).
const IMAGE_FS_SIGNALS: [&str; 2] = ["imagefs.available", "nodefs.available"];

/// The image fields a KubeletConfiguration sets (`None` = not in the file).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KubeletImageFields {
    /// The file they came from.
    pub file: PathBuf,
    /// `serializeImagePulls`.
    pub serialize_image_pulls: Option<bool>,
    /// `maxParallelImagePulls`.
    pub max_parallel_image_pulls: Option<i64>,
    /// `registryPullQPS`.
    pub registry_pull_qps: Option<f64>,
    /// `registryBurst`.
    pub registry_burst: Option<i64>,
    /// `imageGCHighThresholdPercent`.
    pub image_gc_high_threshold_percent: Option<i64>,
    /// `imageGCLowThresholdPercent`.
    pub image_gc_low_threshold_percent: Option<i64>,
    /// `imageMinimumGCAge`.
    pub image_minimum_gc_age: Option<Duration>,
    /// `imageMaximumGCAge`.
    pub image_maximum_gc_age: Option<Duration>,
    /// `imagePullCredentialsVerificationPolicy` (KEP-2535). Read and checked
    /// to be a string; imaged has no key for it yet, so it is not layered.
    pub image_pull_credentials_verification_policy: Option<String>,
    /// `preloadedImagesVerificationAllowlist` (KEP-2535). As above.
    pub preloaded_images_verification_allowlist: Option<Vec<String>>,
    /// `podSandboxImage` (not a v1beta1 field; some distributions add it).
    pub pod_sandbox_image: Option<String>,
    /// `containerRuntimeEndpoint`.
    pub container_runtime_endpoint: Option<String>,
    /// `imageServiceEndpoint`.
    pub image_service_endpoint: Option<String>,
    /// The available-space thresholds below which the kubelet evicts, for
    /// the image and node filesystems (`evictionHard`, with the kubelet's
    /// defaults as it applies them, then `evictionSoft`), as written
    /// (`"15%"`, `"2Gi"`), those the kubelet ignores left out; and the
    /// fields they come from, as `--show-origin` names them.
    pub eviction_available: (Vec<String>, &'static str),
    /// `runtimeRequestTimeout`: the deadline of every CRI call but
    /// `PullImage` and `ImageFsInfo`, which have none.
    pub runtime_request_timeout: Option<Duration>,
    /// `nodeStatusMaxImages`.
    pub node_status_max_images: Option<i64>,
    /// Fields the kubelet does not know (misspelled, or from another
    /// version), as its strict decoding names them (`imageMinimumGCAg`,
    /// `authentication.x509.foo`): ignored, and logged as a warning
    /// ([`strict_decoding_error`](Self::strict_decoding_error)).
    pub unknown_fields: Vec<String>,
}

impl KubeletImageFields {
    /// Reads and checks `file`.
    pub fn read(file: &Path) -> Result<Self, KubeletConfigError> {
        let text = crate::files::read_to_string(file, crate::files::CONFIG_FILE_LIMIT)
            .map_err(|e| KubeletConfigError::File { file: file.to_path_buf(), reason: e.to_string() })?;
        Self::parse(file, &text)
    }

    /// Parses `text` (the contents of `file`, named in errors). Fields are
    /// read, then checked, in the kubelet's order: the first bad one is the
    /// error.
    pub fn parse(file: &Path, text: &str) -> Result<Self, KubeletConfigError> {
        let raw = decode(file, text)?;
        // The same text parsed once more, whole, to find the fields the
        // kubelet does not know (it parsed as the typed form just now).
        let unknown_fields = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text)
            .map(|doc| schema::unknown_fields(&doc))
            .unwrap_or_default();
        let f = Fields { file };
        let serialize_image_pulls = f.bool("serializeImagePulls", raw.serialize_image_pulls)?;
        let max_parallel_image_pulls = f.int("maxParallelImagePulls", raw.max_parallel_image_pulls)?;
        f.check_range(&[("maxParallelImagePulls", max_parallel_image_pulls)], 1.., "must be a positive number")?;
        let registry_pull_qps = f.int("registryPullQPS", raw.registry_pull_qps)?;
        let registry_burst = f.int("registryBurst", raw.registry_burst)?;
        f.check_range(
            &[("registryPullQPS", registry_pull_qps), ("registryBurst", registry_burst)],
            0..,
            "must not be a negative number",
        )?;
        let high = f.int("imageGCHighThresholdPercent", raw.image_gc_high_threshold_percent)?;
        let low = f.int("imageGCLowThresholdPercent", raw.image_gc_low_threshold_percent)?;
        f.check_range(
            &[("imageGCHighThresholdPercent", high), ("imageGCLowThresholdPercent", low)],
            0..=100,
            "must be between 0 and 100, inclusive",
        )?;
        let allowlist = f.allowlist(raw.preloaded_images_verification_allowlist)?;
        let (runtime, image) = f.endpoints(raw.container_runtime_endpoint, raw.image_service_endpoint)?;
        let eviction_available =
            f.eviction_available(raw.eviction_hard, raw.eviction_soft, raw.merge_default_eviction_settings)?;
        Ok(Self {
            file: file.to_path_buf(),
            serialize_image_pulls,
            max_parallel_image_pulls,
            registry_pull_qps: registry_pull_qps.map(|n| n as f64),
            // The kubelet's defaulting reads these zeros as unset (kubeadm
            // writes every duration, `imageMinimumGCAge: 0s` among them):
            // burst 10, minimum age 2m and request timeout 2m, as when the
            // field is absent.
            registry_burst: registry_burst.filter(|&b| b != 0),
            image_gc_high_threshold_percent: high,
            image_gc_low_threshold_percent: low,
            image_minimum_gc_age: f.duration("imageMinimumGCAge", raw.image_minimum_gc_age)?.filter(|d| !d.is_zero()),
            image_maximum_gc_age: f.duration("imageMaximumGCAge", raw.image_maximum_gc_age)?,
            image_pull_credentials_verification_policy: f
                .string("imagePullCredentialsVerificationPolicy", raw.image_pull_credentials_verification_policy)?,
            preloaded_images_verification_allowlist: allowlist,
            pod_sandbox_image: f.string("podSandboxImage", raw.pod_sandbox_image)?.filter(|s| !s.is_empty()),
            container_runtime_endpoint: runtime,
            image_service_endpoint: image,
            eviction_available,
            runtime_request_timeout: f
                .duration("runtimeRequestTimeout", raw.runtime_request_timeout)?
                .filter(|d| !d.is_zero()),
            node_status_max_images: f.int("nodeStatusMaxImages", raw.node_status_max_images)?,
            unknown_fields,
        })
    }

    /// The kubelet's text for the fields it does not know, `strict decoding
    /// error: unknown field "imageMinimumGCAg", unknown field "…"` (`None`
    /// when every field is known). The kubelet then decodes the file
    /// leniently and logs `Using lenient decoding as strict decoding
    /// failed` with this text; imaged logs the same as a warning.
    pub fn strict_decoding_error(&self) -> Option<String> {
        if self.unknown_fields.is_empty() {
            return None;
        }
        let fields: Vec<String> =
            self.unknown_fields.iter().map(|f| format!("unknown field {}", crate::domain::go_text::quote(f))).collect();
        Some(format!("strict decoding error: {}", fields.join(", ")))
    }

    /// Logs [`strict_decoding_error`](Self::strict_decoding_error), if any,
    /// as a warning naming the file (the kubelet's message and text).
    pub fn warn_unknown_fields(&self) {
        if let Some(err) = self.strict_decoding_error() {
            tracing::warn!(file = %self.file.display(), err = %err, "Using lenient decoding as strict decoding failed");
        }
    }

    /// imaged's keys and values for the fields that are set, with the
    /// KubeletConfiguration field each comes from: `(key, value, field)`.
    /// Durations are written as Go prints them (`"2m0s"`).
    pub fn overrides(&self) -> Vec<(&'static str, KeyValue, &'static str)> {
        let mut out = Vec::new();
        let mut put = |key, v: Option<KeyValue>, field| {
            if let Some(v) = v {
                out.push((key, v, field));
            }
        };
        put("pull.serialize_image_pulls", self.serialize_image_pulls.map(KeyValue::Bool), "serializeImagePulls");
        put("pull.max_parallel_image_pulls", self.max_parallel_image_pulls.map(KeyValue::Int), "maxParallelImagePulls");
        put("pull.registry_pull_qps", self.registry_pull_qps.map(KeyValue::Float), "registryPullQPS");
        put("pull.registry_burst", self.registry_burst.map(KeyValue::Int), "registryBurst");
        put(
            "gc.image_gc_high_threshold_percent",
            self.image_gc_high_threshold_percent.map(KeyValue::Int),
            "imageGCHighThresholdPercent",
        );
        put(
            "gc.image_gc_low_threshold_percent",
            self.image_gc_low_threshold_percent.map(KeyValue::Int),
            "imageGCLowThresholdPercent",
        );
        put("gc.image_minimum_gc_age", self.image_minimum_gc_age.map(duration_text), "imageMinimumGCAge");
        put("gc.image_maximum_gc_age", self.image_maximum_gc_age.map(duration_text), "imageMaximumGCAge");
        put("gc.sandbox_image", self.pod_sandbox_image.clone().map(KeyValue::Str), "podSandboxImage");
        put(
            "credential_verification.policy",
            self.image_pull_credentials_verification_policy.clone().map(KeyValue::Str),
            "imagePullCredentialsVerificationPolicy",
        );
        put(
            "credential_verification.allowlist",
            self.preloaded_images_verification_allowlist.clone().map(KeyValue::List),
            "preloadedImagesVerificationAllowlist",
        );
        put(
            "runtime.endpoint",
            self.container_runtime_endpoint.clone().or_else(|| self.image_service_endpoint.clone()).map(KeyValue::Str),
            if self.container_runtime_endpoint.is_some() { "containerRuntimeEndpoint" } else { "imageServiceEndpoint" },
        );
        // The kubelet gives every CRI call but `PullImage` and `ImageFsInfo` this deadline.
        for key in REQUEST_DEADLINE_KEYS {
            put(key, self.runtime_request_timeout.map(duration_text), "runtimeRequestTimeout");
        }
        put("gc.node_status_max_images", self.node_status_max_images.map(KeyValue::Int), "nodeStatusMaxImages");
        let (lines, fields) = &self.eviction_available;
        put("gc.eviction_available", Some(KeyValue::List(lines.clone())), fields);
        out
    }
}

/// The deadlines the kubelet's `runtimeRequestTimeout` sets: every CRI
/// call but `PullImage` and `ImageFsInfo` ("it takes time"), which have none.
pub const REQUEST_DEADLINE_KEYS: [&str; 7] = [
    "runtime.deadlines.version",
    "runtime.deadlines.list_images",
    "runtime.deadlines.image_status",
    "runtime.deadlines.remove_image",
    "runtime.deadlines.list_containers",
    "runtime.deadlines.list_pod_sandbox",
    "runtime.deadlines.container_status",
];

/// A value for one imaged key.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyValue {
    /// true/false.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A number.
    Float(f64),
    /// Text (durations too).
    Str(String),
    /// A list of texts.
    List(Vec<String>),
}

impl From<KeyValue> for config::ValueKind {
    fn from(v: KeyValue) -> Self {
        match v {
            KeyValue::Bool(b) => b.into(),
            KeyValue::Int(n) => n.into(),
            KeyValue::Float(x) => x.into(),
            KeyValue::Str(s) => s.into(),
            KeyValue::List(l) => config::ValueKind::Array(l.into_iter().map(config::Value::from).collect()),
        }
    }
}

/// The fields as a `config` source (dotted keys), placed after the
/// configuration file and before the environment.
#[derive(Debug, Clone)]
pub(crate) struct KubeletSource(pub(crate) KubeletImageFields);

impl config::Source for KubeletSource {
    fn clone_into_box(&self) -> Box<dyn config::Source + Send + Sync> {
        Box::new(self.clone())
    }

    fn collect(&self) -> Result<config::Map<String, config::Value>, config::ConfigError> {
        let origin = self.0.file.display().to_string();
        Ok(self
            .0
            .overrides()
            .into_iter()
            .map(|(key, v, _)| (key.to_string(), config::Value::new(Some(&origin), v)))
            .collect())
    }
}

/// A duration as imaged's keys take it: Go's own text (`2m0s`), which Go's
/// grammar reads back exactly.
fn duration_text(d: Duration) -> KeyValue {
    KeyValue::Str(crate::domain::go_text::duration(d))
}

/// The document as YAML, if it is a v1beta1 KubeletConfiguration.
fn decode(file: &Path, text: &str) -> Result<RawKubeletConfiguration, KubeletConfigError> {
    let file_err = |reason: String| KubeletConfigError::File { file: file.to_path_buf(), reason };
    let raw: RawKubeletConfiguration =
        serde_yaml_ng::from_str(text).map_err(|e| file_err(format!("not a YAML mapping: {e}")))?;
    match (raw.api_version.as_deref(), raw.kind.as_deref()) {
        (Some(API_VERSION), Some(KIND)) => Ok(raw),
        (a, k) => Err(file_err(format!(
            "apiVersion {:?} and kind {:?}: want apiVersion {API_VERSION:?} and kind {KIND:?}",
            a.unwrap_or(""),
            k.unwrap_or("")
        ))),
    }
}

fn show(v: &serde_yaml_ng::Value) -> String {
    serde_yaml_ng::to_string(v).map_or_else(|_| "the value".into(), |s| s.trim_end().to_string())
}

struct Fields<'a> {
    file: &'a Path,
}

impl Fields<'_> {
    fn err(&self, field: &str, reason: String) -> KubeletConfigError {
        KubeletConfigError::Field { file: self.file.to_path_buf(), field: field.to_string(), reason }
    }

    fn bool(&self, field: &str, v: Option<serde_yaml_ng::Value>) -> Result<Option<bool>, KubeletConfigError> {
        match v {
            None | Some(serde_yaml_ng::Value::Null) => Ok(None),
            Some(serde_yaml_ng::Value::Bool(b)) => Ok(Some(b)),
            Some(other) => Err(self.err(field, format!("{} is not true or false", show(&other)))),
        }
    }

    fn int(&self, field: &str, v: Option<serde_yaml_ng::Value>) -> Result<Option<i64>, KubeletConfigError> {
        match v {
            None | Some(serde_yaml_ng::Value::Null) => Ok(None),
            Some(serde_yaml_ng::Value::Number(n)) if n.as_i64().is_some_and(|n| i32::try_from(n).is_ok()) => {
                Ok(n.as_i64())
            }
            Some(other) => Err(self.err(field, format!("{} is not a 32-bit integer", show(&other)))),
        }
    }

    fn string(&self, field: &str, v: Option<serde_yaml_ng::Value>) -> Result<Option<String>, KubeletConfigError> {
        match v {
            None | Some(serde_yaml_ng::Value::Null) => Ok(None),
            Some(serde_yaml_ng::Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.err(field, format!("{} is not a string", show(&other)))),
        }
    }

    /// A map of signal names to thresholds (`evictionHard`), `None` when
    /// not set.
    fn signal_map(
        &self,
        field: &str,
        v: Option<serde_yaml_ng::Value>,
    ) -> Result<Option<Vec<(String, String)>>, KubeletConfigError> {
        let map = match v {
            None | Some(serde_yaml_ng::Value::Null) => return Ok(None),
            Some(serde_yaml_ng::Value::Mapping(m)) => m,
            Some(other) => {
                return Err(self.err(field, format!("{} is not a map of signals to thresholds", show(&other))));
            }
        };
        let mut out = Vec::new();
        for (k, v) in map {
            match (k, v) {
                (serde_yaml_ng::Value::String(k), serde_yaml_ng::Value::String(v)) => out.push((k, v)),
                (k, v) => {
                    return Err(self
                        .err(field, format!("{}: {} is not a signal name and a threshold text", show(&k), show(&v))));
                }
            }
        }
        Ok(Some(out))
    }

    /// See [`KubeletImageFields::eviction_available`]. As the kubelet: no
    /// `evictionHard` takes its defaults; one that is set replaces them
    /// (signals it leaves out have no threshold) unless
    /// `mergeDefaultEvictionSettings` is true.
    fn eviction_available(
        &self,
        hard: Option<serde_yaml_ng::Value>,
        soft: Option<serde_yaml_ng::Value>,
        merge: Option<serde_yaml_ng::Value>,
    ) -> Result<(Vec<String>, &'static str), KubeletConfigError> {
        let merge = self.bool("mergeDefaultEvictionSettings", merge)?.unwrap_or(false);
        let defaults = || DEFAULT_EVICTION_HARD.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect();
        let hard = self.signal_map("evictionHard", hard)?;
        let defaulted = hard.is_none();
        let hard = match hard {
            None => defaults(),
            Some(set) if merge => {
                let mut all: Vec<(String, String)> = defaults();
                all.retain(|(k, _)| !set.iter().any(|(s, _)| s == k));
                all.extend(set);
                all
            }
            Some(set) => set,
        };
        let soft = self.signal_map("evictionSoft", soft)?.unwrap_or_default();
        let mut lines = Vec::new();
        let mut from_soft = false;
        for (field, map) in [("evictionHard", &hard), ("evictionSoft", &soft)] {
            for signal in IMAGE_FS_SIGNALS {
                let Some((_, text)) = map.iter().find(|(k, _)| k == signal) else { continue };
                match crate::gc::eviction::AvailableThreshold::parse(text) {
                    Ok(Some(_)) if !lines.contains(text) => {
                        lines.push(text.clone());
                        from_soft |= field == "evictionSoft";
                    }
                    Ok(_) => {}
                    Err(reason) => return Err(self.err(field, format!("{signal}: {reason}"))),
                }
            }
        }
        let fields = match (defaulted, from_soft) {
            (true, false) => "evictionHard (unset: the kubelet's defaults)",
            (true, true) => "evictionHard (unset: the kubelet's defaults), evictionSoft",
            (false, false) => "evictionHard",
            (false, true) => "evictionHard, evictionSoft",
        };
        Ok((lines, fields))
    }

    fn duration(&self, field: &str, v: Option<serde_yaml_ng::Value>) -> Result<Option<Duration>, KubeletConfigError> {
        let Some(text) = self.string(field, v)? else { return Ok(None) };
        parse_go_duration(&text).map(Some).map_err(|reason| self.err(field, format!("{text:?}: {reason}")))
    }

    /// The first of `values` (fields already read) outside `range`, as the
    /// error: `{n} {what}`.
    fn check_range(
        &self,
        values: &[(&str, Option<i64>)],
        range: impl RangeBounds<i64>,
        what: &str,
    ) -> Result<(), KubeletConfigError> {
        for (field, v) in values {
            if let Some(n) = v
                && !range.contains(n)
            {
                return Err(self.err(field, format!("{n} {what}")));
            }
        }
        Ok(())
    }

    /// `preloadedImagesVerificationAllowlist`: a list of strings.
    fn allowlist(&self, v: Option<serde_yaml_ng::Value>) -> Result<Option<Vec<String>>, KubeletConfigError> {
        const FIELD: &str = "preloadedImagesVerificationAllowlist";
        match v {
            None | Some(serde_yaml_ng::Value::Null) => Ok(None),
            Some(serde_yaml_ng::Value::Sequence(items)) => Ok(Some(
                items
                    .into_iter()
                    .map(|v| self.string(FIELD, Some(v)).map(Option::unwrap_or_default))
                    .collect::<Result<Vec<_>, _>>()?,
            )),
            Some(other) => Err(self.err(FIELD, format!("{} is not a list of image patterns", show(&other)))),
        }
    }

    /// `containerRuntimeEndpoint` and `imageServiceEndpoint` (empty counts
    /// as unset). imaged talks to the runtime: `containerRuntimeEndpoint`,
    /// or the image endpoint when only that is set. Two different endpoints
    /// are imaged in the kubelet's path (the image endpoint is imaged's CRI
    /// socket; `imaged run` warns when it is not).
    fn endpoints(
        &self,
        runtime: Option<serde_yaml_ng::Value>,
        image: Option<serde_yaml_ng::Value>,
    ) -> Result<(Option<String>, Option<String>), KubeletConfigError> {
        let runtime = self.string("containerRuntimeEndpoint", runtime)?.filter(|s| !s.is_empty());
        let image = self.string("imageServiceEndpoint", image)?.filter(|s| !s.is_empty());
        Ok((runtime, image))
    }
}

/// Parses a Go `time.Duration` string (`"2m0s"`, `"1h30m"`, `"1.5s"`,
/// `"300ms"`, `"0"`) with Go's own grammar (`domain::go_text::parse_duration`);
/// negative durations are refused.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let nanos = crate::domain::go_text::parse_duration(s).map_err(|e| e.to_string())?;
    u64::try_from(nanos).map(Duration::from_nanos).map_err(|_| "must not be negative".to_string())
}

mod schema;

#[cfg(test)]
mod tests;
