//! The effective configuration as `imaged check-config` prints it: every
//! key's value after all the layers, as TOML that `--config` reads back to
//! the same [`Config`](super::Config), and where each value came from
//! (`--show-origin`).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;

use super::raw::RawConfig;
use super::{ConfigError, DEFAULT_TOML, Sources};
use crate::kubelet_config::KubeletImageFields;

/// Where a key's effective value came from (the last layer that set it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The built-in defaults (`config/default.toml`).
    Default,
    /// The `--config` file.
    File(PathBuf),
    /// A field of the `--kubelet-config` KubeletConfiguration.
    Kubelet {
        /// The KubeletConfiguration file.
        file: PathBuf,
        /// Its field (`imageMinimumGCAge`).
        field: &'static str,
    },
    /// An `IMAGED_<SECTION>__<KEY>` environment variable (its name).
    Environment(String),
    /// A command-line flag (`--set`, `--runtime-endpoint`, `--log-format`).
    Flag,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Default => f.write_str("default"),
            Origin::File(p) => write!(f, "file {}", p.display()),
            Origin::Kubelet { file, field } => write!(f, "KubeletConfiguration {} field {field}", file.display()),
            Origin::Environment(var) => write!(f, "environment {var}"),
            Origin::Flag => f.write_str("flag"),
        }
    }
}

/// Every key's effective value and origin.
#[derive(Debug, Clone)]
pub struct Effective {
    /// The merged keys, sections in `config/default.toml`'s order.
    table: toml::Table,
    /// Dotted key (`gc.image_minimum_gc_age`; a list of tables by its own
    /// key, `cri_server.priority`) → the layer that set it last.
    origins: HashMap<String, Origin>,
}

impl Effective {
    /// The merged `raw` configuration, with origins worked out from the
    /// layers of `sources` (and the KubeletConfiguration fields read).
    pub(super) fn new(
        raw: &RawConfig,
        sources: &Sources,
        file_text: Option<&str>,
        kubelet: Option<&KubeletImageFields>,
    ) -> Result<Self, ConfigError> {
        let table = toml::Table::try_from(raw)
            .map_err(|e| ConfigError::Load(format!("printing the effective configuration: {e}")))?;
        let mut origins = HashMap::new();
        if let Ok(defaults) = toml::from_str::<toml::Table>(DEFAULT_TOML) {
            set_all(&mut origins, &defaults, "", &Origin::Default);
        }
        if let (Some(path), Some(text)) = (&sources.file, file_text)
            && let Ok(file) = toml::from_str::<toml::Table>(text)
        {
            set_all(&mut origins, &file, "", &Origin::File(path.clone()));
        }
        if let Some(k) = kubelet {
            for (key, _, field) in k.overrides() {
                origins.insert(key.to_string(), Origin::Kubelet { file: k.file.clone(), field });
            }
        }
        for (var, key, value) in super::env_settings(sources) {
            let origin = Origin::Environment(var);
            set_inner(&mut origins, &key, &value, &origin);
            origins.insert(key, origin);
        }
        for o in &sources.overrides {
            if let Some((key, value)) = o.split_once('=') {
                let key = key.trim();
                set_inner(&mut origins, key, value, &Origin::Flag);
                origins.insert(key.to_string(), Origin::Flag);
            }
        }
        Ok(Self { table, origins })
    }

    /// Where `key` (dotted, as in `config/default.toml`) got its value.
    pub fn origin(&self, key: &str) -> Origin {
        // A key inside a list of tables has the list's origin.
        let mut k = key;
        loop {
            if let Some(o) = self.origins.get(k) {
                return o.clone();
            }
            match k.rsplit_once('.') {
                Some((parent, _)) => k = parent,
                None => return Origin::Default,
            }
        }
    }

    /// Every key's effective value by its dotted name
    /// (`runtime.deadlines.version`); a list of tables is one value under
    /// its own key (`pull.registries`), as a file sets it.
    pub fn values(&self) -> BTreeMap<String, toml::Value> {
        let mut out = BTreeMap::new();
        for_each_leaf(&self.table, "", &mut |key, value| {
            out.insert(key, value.clone());
        });
        out
    }

    /// The configuration as TOML that `--config` accepts; with
    /// `show_origin`, each key is followed by a comment naming its origin
    /// (`# default`, `# file /etc/imaged/imaged.toml`, …).
    pub fn to_toml(&self, show_origin: bool) -> String {
        let mut out = String::new();
        self.write_table(&mut out, &self.table, "", show_origin);
        out
    }

    fn comment(&self, key: &str, show_origin: bool) -> String {
        if show_origin { format!("  # {}", self.origin(key)) } else { String::new() }
    }

    /// Writes `table`'s plain keys, then its sub-tables (`[a.b]`), then
    /// its lists of tables (`[[a.b]]`), as TOML requires.
    fn write_table(&self, out: &mut String, table: &toml::Table, prefix: &str, show_origin: bool) {
        let path = |name: &str| if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
        for (name, value) in table {
            if !matches!(value, toml::Value::Table(_)) && !is_table_list(value) {
                let key = path(name);
                let _ = writeln!(out, "{} = {value}{}", bare_or_quoted(name), self.comment(&key, show_origin));
            }
        }
        for (name, value) in table {
            if let toml::Value::Table(inner) = value {
                let key = path(name);
                let header = key.split('.').map(bare_or_quoted).collect::<Vec<_>>().join(".");
                let _ = writeln!(out, "{}[{header}]", if out.is_empty() { "" } else { "\n" });
                self.write_table(out, inner, &key, show_origin);
            }
        }
        for (name, value) in table {
            if let toml::Value::Array(items) = value
                && is_table_list(value)
            {
                let key = path(name);
                let header = key.split('.').map(bare_or_quoted).collect::<Vec<_>>().join(".");
                for item in items {
                    if let toml::Value::Table(inner) = item {
                        let _ = writeln!(out, "\n[[{header}]]{}", self.comment(&key, show_origin));
                        self.write_table(out, inner, &key, false);
                    }
                }
            }
        }
    }
}

/// The dotted keys whose values differ between `old` and `new` (set in
/// one only included), in order.
pub fn changed_keys(old: &BTreeMap<String, toml::Value>, new: &BTreeMap<String, toml::Value>) -> Vec<String> {
    let mut keys: Vec<String> = old.iter().filter(|(k, v)| new.get(*k) != Some(*v)).map(|(k, _)| k.clone()).collect();
    keys.extend(new.keys().filter(|k| !old.contains_key(*k)).cloned());
    keys.sort();
    keys
}

/// Whether `a` and `b` (`None`: unset) give `key` the same meaning, as
/// `"300s"` and `"5m"` do: each is set alone over the defaults and the
/// configurations compared. A value refused alone (one checked against
/// another key) counts as different.
pub fn same_meaning(key: &str, a: Option<&toml::Value>, b: Option<&toml::Value>) -> bool {
    let load = |v: Option<&toml::Value>| {
        let mut table = toml::Table::new();
        if let Some(v) = v {
            let mut path: Vec<&str> = key.split('.').collect();
            let last = path.pop().unwrap_or_default();
            let mut inner = &mut table;
            for name in path {
                let entry = inner.entry(name).or_insert_with(|| toml::Value::Table(toml::Table::new()));
                let toml::Value::Table(t) = entry else { return None };
                inner = t;
            }
            inner.insert(last.to_string(), v.clone());
        }
        super::Config::from_toml(&toml::to_string(&table).ok()?).ok()
    };
    matches!((load(a), load(b)), (Some(x), Some(y)) if x == y)
}

/// Calls `f` with every leaf of `table` (a value that is not a table; a
/// list is one leaf) and its dotted key under `prefix`.
fn for_each_leaf(table: &toml::Table, prefix: &str, f: &mut impl FnMut(String, &toml::Value)) {
    for (name, value) in table {
        let key = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
        match value {
            toml::Value::Table(inner) => for_each_leaf(inner, &key, f),
            _ => f(key, value),
        }
    }
}

/// A non-empty array whose items are all tables (`[[a.b]]`).
fn is_table_list(v: &toml::Value) -> bool {
    matches!(v, toml::Value::Array(items) if !items.is_empty() && items.iter().all(toml::Value::is_table))
}

fn bare_or_quoted(name: &str) -> String {
    if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        name.to_string()
    } else {
        toml::Value::String(name.to_string()).to_string()
    }
}

/// Marks every leaf of `table` (a value that is not a table; a list is one
/// leaf) as coming from `origin`.
/// A table value (`--set 'runtime.deadlines={version="1m"}'`, or the same
/// in `IMAGED_RUNTIME__DEADLINES`) sets the keys inside it: they are the
/// ones looked up, so each gets `origin`.
fn set_inner(origins: &mut HashMap<String, Origin>, key: &str, value: &str, origin: &Origin) {
    if let Ok(t) = toml::from_str::<toml::Table>(&format!("v = {}", value.trim()))
        && let Some(toml::Value::Table(inner)) = t.get("v")
    {
        set_all(origins, inner, key, origin);
    }
}

fn set_all(origins: &mut HashMap<String, Origin>, table: &toml::Table, prefix: &str, origin: &Origin) {
    for_each_leaf(table, prefix, &mut |key, _| {
        origins.insert(key, origin.clone());
    });
}
