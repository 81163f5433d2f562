//! The type of every key, taken from the documented defaults (and the few
//! optional keys they leave unset), to refuse a value of the wrong type in
//! the user's terms before the config crate converts it or serde names a
//! Rust type:
//!
//! - a `--config` file's values must have their key's type (`"85"` for a
//!   percent is refused, not read as 85), and an unknown key is named with
//!   its dotted path, the file and the line;
//! - `--set` and `IMAGED_*` values are text: each is read as its key's type
//!   (`90`, `2.5`, `true`, a list literal `["a", "b"]`), and text that is
//!   not one is refused naming the key.

use std::fmt::Write as _;

use super::values::invalid;
use super::{ConfigError, DEFAULT_TOML};

/// Keys `config/default.toml` leaves unset (unset has a meaning: the
/// kubelet's defaulting, the kubelet's search path), with a value of
/// their type; and the full `[[cri_server.priority]]` rule, of which the
/// defaults use only some keys, and the `[[pull.registries]]` rule, of
/// which they have none. An optional key added to a `Raw*` struct
/// belongs here (`the_key_schema_has_every_key_of_the_raw_configuration`
/// checks it).
const OPTIONAL_KEYS: &str = r#"
[pull]
serialize_image_pulls = true
max_parallel_image_pulls = 1

[credentials]
config_json_dirs = [""]
dockercfg_dirs = [""]

[[cri_server.priority]]
namespace = ""
label = ""
annotation = ""
priority = 0

[[pull.registries]]
registry = ""
qps = 0.0
burst = 0
max_parallel = 0
"#;

/// How to write a list, for the errors that ask for one.
const LIST_SYNTAX: &str = r#"write a list as ["a", "b"] (quoted strings, comma-separated; [] for none)"#;
/// How to write a list of tables (`cri_server.priority`).
const TABLE_LIST_SYNTAX: &str = r#"write a list of tables as [{ key = "value", other = 1 }, …]"#;

/// How to write a value of the list key whose schema value is `expected`.
fn list_syntax(expected: &toml::Value) -> &'static str {
    if list_item(expected).is_some_and(toml::Value::is_table) { TABLE_LIST_SYNTAX } else { LIST_SYNTAX }
}

/// Every key with a value of its type: the defaults with [`OPTIONAL_KEYS`]
/// merged in (a list of tables is replaced by its full form).
pub(super) fn schema() -> Result<toml::Table, ConfigError> {
    let parse = |text: &str| {
        toml::from_str::<toml::Table>(text)
            .map_err(|e| ConfigError::Load(format!("the built-in defaults do not parse: {}", e.message())))
    };
    let mut schema = parse(DEFAULT_TOML)?;
    merge(&mut schema, parse(OPTIONAL_KEYS)?);
    Ok(schema)
}

fn merge(into: &mut toml::Table, from: toml::Table) {
    for (name, value) in from {
        match (into.get_mut(&name), value) {
            (Some(toml::Value::Table(inner)), toml::Value::Table(more)) => merge(inner, more),
            (_, value) => {
                into.insert(name, value);
            }
        }
    }
}

/// Where a value was given, for the errors that name it.
pub(super) struct Place<'a> {
    /// The file (its path, or `TOML` for a string), `--set k=v` or
    /// `environment IMAGED_K`.
    pub(super) origin: &'a str,
    /// The file's text, to find a key's line.
    pub(super) text: Option<&'a str>,
    /// Whether type errors name the file and line too (a real file; the
    /// strings tests load keep the reasons bare).
    pub(super) locate_types: bool,
    /// Inside a list of tables (`[[cri_server.priority]]`): which item is
    /// being checked, so its line is the one named.
    pub(super) item: Option<usize>,
}

impl Place<'_> {
    /// `(FILE, line N)` for the key at `path`, when it can be found.
    pub(super) fn line_of(&self, path: &[&str]) -> Option<String> {
        let (origin, text) = (self.origin, self.text?);
        let doc = toml::de::DeTable::parse(text).ok()?;
        let mut table = doc.get_ref();
        let mut start = None;
        for (i, name) in path.iter().enumerate() {
            let (key, value) = table.iter().find(|(k, _)| k.get_ref().as_ref() == *name)?;
            start = Some(key.span().start);
            match value.get_ref() {
                toml::de::DeValue::Table(inner) => table = inner,
                // A key inside `[[a.b]]`: the item being checked, else the
                // first item that has it.
                toml::de::DeValue::Array(items) if i + 1 < path.len() => {
                    let next = path[i + 1];
                    let checked =
                        self.item.and_then(|n| items.get(n)).and_then(|item| table_with(item.get_ref(), next));
                    table = checked.or_else(|| items.iter().find_map(|item| table_with(item.get_ref(), next)))?;
                }
                _ => break,
            }
        }
        let at = start?.min(text.len());
        Some(format!("{origin}, line {}", text[..at].matches('\n').count() + 1))
    }

    /// Where the key at `path` was given: `FILE, line N`, or the origin.
    fn at(&self, path: &[&str]) -> String {
        self.line_of(path).unwrap_or_else(|| self.origin.to_string())
    }

    /// ` (FILE, line N)` after a type error's reason, for a real file.
    fn suffix(&self, path: &[&str]) -> String {
        match self.line_of(path) {
            Some(at) if self.locate_types => format!(" ({at})"),
            _ => String::new(),
        }
    }
}

/// `item` when it is a table holding `key`.
fn table_with<'t, 'd>(item: &'t toml::de::DeValue<'d>, key: &str) -> Option<&'t toml::de::DeTable<'d>> {
    match item {
        toml::de::DeValue::Table(t) if t.iter().any(|(k, _)| k.get_ref().as_ref() == key) => Some(t),
        _ => None,
    }
}

/// Checks a parsed file's keys and value types against the schema.
pub(super) fn check_file(table: &toml::Table, place: &Place<'_>) -> Result<(), ConfigError> {
    let schema = schema()?;
    check_table(table, &schema, &mut Vec::new(), place)
}

fn check_table<'a>(
    table: &'a toml::Table,
    schema: &toml::Table,
    path: &mut Vec<&'a str>,
    place: &Place<'_>,
) -> Result<(), ConfigError> {
    for (name, value) in table {
        path.push(name);
        let Some(expected) = schema.get(name) else {
            return Err(unknown(&path.join("."), place.at(path), schema, &path[..path.len() - 1]));
        };
        check_value(expected, value, path, place)?;
        path.pop();
    }
    Ok(())
}

/// Checks `value` against its key's `expected` (a value of the key's type).
fn check_value<'a>(
    expected: &toml::Value,
    value: &'a toml::Value,
    path: &mut Vec<&'a str>,
    place: &Place<'_>,
) -> Result<(), ConfigError> {
    use toml::Value as V;
    let wrong = |path: &[&str], reason: &str| {
        let text = match value {
            V::String(s) => s.clone(),
            V::Float(f) => f.to_string(),
            // A table where none belongs may hold a mistyped key's secret.
            V::Table(_) => "{…}".to_string(),
            V::Array(items) if items.iter().any(holds_table) => "[…]".to_string(),
            other => other.to_string(),
        };
        Err(invalid(&path.join("."), &text, format!("{reason}{}", place.suffix(path))))
    };
    match (expected, value) {
        (V::Table(schema), V::Table(t)) => check_table(t, schema, path, place),
        (V::Table(_), _) => {
            // Not echoed: a table's key given one value may be that table's
            // secret (`credentials = "…"`).
            let key = path.join(".");
            let reason =
                format!("expected a table of settings, got a single value; set its keys one at a time ({key}.<key>)");
            Err(invalid(&key, "…", format!("{reason}{}", place.suffix(path))))
        }
        (V::Integer(_), V::Float(_) | V::Boolean(_)) => wrong(path, "must be an integer"),
        (V::Integer(_) | V::Float(_), V::String(_)) => wrong(path, "must be a number, not a string"),
        (V::Float(_), V::Boolean(_)) | (V::Integer(_) | V::Float(_), V::Array(_) | V::Table(_)) => {
            wrong(path, "must be a number")
        }
        (V::Boolean(_), V::Integer(_) | V::Float(_) | V::Array(_) | V::Table(_)) => {
            wrong(path, "must be true or false")
        }
        (V::Boolean(_), V::String(_)) => wrong(path, "must be true or false, not a string"),
        (V::Array(_), V::Array(items)) => match list_item(expected) {
            Some(V::Table(rule)) => {
                for (n, item) in items.iter().enumerate() {
                    match item {
                        V::Table(t) => check_table(t, rule, path, &Place { item: Some(n), ..*place })?,
                        _ => return wrong(path, &format!("must be a list of tables: {TABLE_LIST_SYNTAX}")),
                    }
                }
                Ok(())
            }
            _ if items.iter().all(toml::Value::is_str) => Ok(()),
            _ => wrong(path, &format!("must be a list of strings: {LIST_SYNTAX}")),
        },
        (V::Array(_), _) => wrong(path, &format!("must be a list: {}", list_syntax(expected))),
        // A string key: text. An integer reads as its digits (a group id for
        // `socket_group`, "0" for a duration); true, false or a fraction
        // is never meant.
        (V::String(_), V::Array(_) | V::Table(_) | V::Boolean(_) | V::Float(_)) => wrong(path, "must be a string"),
        _ => Ok(()),
    }
}

/// Whether `v` is or holds a table.
fn holds_table(v: &toml::Value) -> bool {
    match v {
        toml::Value::Table(_) => true,
        toml::Value::Array(items) => items.iter().any(holds_table),
        _ => false,
    }
}

/// `--set` text as an error may show it: a table's text is not shown (it
/// may hold a mistyped key's secret).
fn shown(text: &str) -> &str {
    if text.contains('{') { "{…}" } else { text }
}

/// The item of a list key, as the schema shows it (`None`: an empty list
/// in the defaults, which are all lists of strings).
fn list_item(expected: &toml::Value) -> Option<&toml::Value> {
    expected.as_array().and_then(|items| items.first())
}

/// An unknown key, with the keys its table has.
fn unknown(key: &str, origin: String, schema: &toml::Table, parent: &[&str]) -> ConfigError {
    let mut known = String::new();
    for (i, name) in schema.keys().enumerate() {
        let _ = write!(known, "{}{name}", if i == 0 { "" } else { ", " });
    }
    let hint = if parent.is_empty() {
        format!("the sections are {known}")
    } else {
        format!("the keys of [{}] are {known}", parent.join("."))
    };
    ConfigError::UnknownKey { key: key.to_string(), origin, hint }
}

/// A `--set` or `IMAGED_*` value (`text`, for the dotted `key`) as the type
/// its key takes; `origin` says where it was given (`--set k=v`,
/// `environment IMAGED_K`). A key with the config crate's index syntax
/// (`a.b[0].c`) is handed on as text.
pub(super) fn typed(key: &str, text: &str, origin: &str) -> Result<config::Value, ConfigError> {
    let schema = schema()?;
    if key.contains('[') {
        return Ok(config::Value::new(Some(&origin.to_string()), text));
    }
    let path: Vec<&str> = key.split('.').collect();
    let mut table = &schema;
    let mut expected = None;
    for (i, name) in path.iter().enumerate() {
        let Some(v) = table.get(*name) else {
            return Err(unknown(key, origin.to_string(), table, &path[..i]));
        };
        match v {
            toml::Value::Table(inner) if i + 1 < path.len() => table = inner,
            _ if i + 1 < path.len() => {
                let parent = path[..=i].join(".");
                return Err(ConfigError::UnknownKey {
                    key: key.to_string(),
                    origin: origin.to_string(),
                    hint: format!("{parent} is a single value, with no keys under it"),
                });
            }
            _ => expected = Some(v),
        }
    }
    let Some(expected) = expected else {
        return Err(unknown(key, origin.to_string(), table, &[]));
    };
    let value = from_text(key, text, expected)?;
    let mut p: Vec<&str> = path.clone();
    check_value(expected, &value, &mut p, &Place { origin, text: None, locate_types: false, item: None })?;
    Ok(to_config(value, &origin.to_string()))
}

/// `text` read as the type of `expected`.
fn from_text(key: &str, text: &str, expected: &toml::Value) -> Result<toml::Value, ConfigError> {
    use toml::Value as V;
    let literal = |what: &str| {
        text.parse::<V>().map_err(|e| {
            let syntax = if what == "a list" { list_syntax(expected) } else { "" };
            let reason = format!("not {what} ({})", e.message().trim().trim_end_matches('.'));
            invalid(key, shown(text), if syntax.is_empty() { reason } else { format!("{reason}: {syntax}") })
        })
    };
    match expected {
        V::String(_) | V::Datetime(_) => Ok(V::String(text.to_string())),
        V::Integer(_) => integer(key, text).map(V::Integer),
        V::Float(_) => text.parse::<f64>().map(V::Float).map_err(|_| invalid(key, shown(text), "must be a number")),
        V::Boolean(_) => match text.to_ascii_lowercase().as_str() {
            // The words the config crate took from the environment before.
            "true" | "1" | "on" | "yes" => Ok(V::Boolean(true)),
            "false" | "0" | "off" | "no" => Ok(V::Boolean(false)),
            _ => Err(invalid(key, shown(text), "must be true or false")),
        },
        V::Array(_) if text.trim_start().starts_with('[') => literal("a list"),
        V::Array(_) => Err(invalid(key, shown(text), format!("must be a list: {}", list_syntax(expected)))),
        V::Table(_) if text.trim_start().starts_with('{') => literal("a table"),
        // Not echoed either: a table's key given one value may be that
        // table's secret (`credentials=…`).
        V::Table(_) => Err(invalid(
            key,
            "…",
            format!("expected a table of settings, got a single value; set its keys one at a time ({key}.<key>)"),
        )),
    }
}

/// `text` as a 64-bit integer: digits past its range are "out of range",
/// anything else (`2.5`, `true`, `ten`) "must be an integer".
fn integer(key: &str, text: &str) -> Result<i64, ConfigError> {
    text.parse::<i64>().map_err(|e| {
        use std::num::IntErrorKind;
        match e.kind() {
            IntErrorKind::PosOverflow => {
                invalid(key, text, format!("out of range: an integer can be at most {}", i64::MAX))
            }
            IntErrorKind::NegOverflow => {
                invalid(key, text, format!("out of range: an integer can be at least {}", i64::MIN))
            }
            _ => invalid(key, shown(text), "must be an integer"),
        }
    })
}

fn to_config(value: toml::Value, origin: &String) -> config::Value {
    use config::ValueKind as K;
    let kind = match value {
        toml::Value::String(s) => K::String(s),
        toml::Value::Integer(n) => K::I64(n),
        toml::Value::Float(f) => K::Float(f),
        toml::Value::Boolean(b) => K::Boolean(b),
        toml::Value::Datetime(d) => K::String(d.to_string()),
        toml::Value::Array(items) => K::Array(items.into_iter().map(|v| to_config(v, origin)).collect()),
        toml::Value::Table(t) => K::Table(t.into_iter().map(|(k, v)| (k, to_config(v, origin))).collect()),
    };
    config::Value::new(Some(origin), kind)
}

/// The `IMAGED_<SECTION>__<KEY>` variables, each as its key's type.
#[derive(Debug, Clone)]
pub(super) struct EnvSource(config::Map<String, config::Value>);

impl EnvSource {
    pub(super) fn new(vars: &[(String, String, String)]) -> Result<Self, ConfigError> {
        let mut map = config::Map::new();
        for (var, key, text) in vars {
            map.insert(key.clone(), typed(key, text, &format!("environment {var}"))?);
        }
        Ok(Self(map))
    }
}

impl config::Source for EnvSource {
    fn clone_into_box(&self) -> Box<dyn config::Source + Send + Sync> {
        Box::new(self.clone())
    }

    fn collect(&self) -> Result<config::Map<String, config::Value>, config::ConfigError> {
        Ok(self.0.clone())
    }
}
