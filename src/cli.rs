//! Command-line pieces shared by `imaged` and `imagectl`: the configuration
//! flags and the shutdown signal.

use std::path::PathBuf;

use crate::config::{Config, ConfigError, Sources};
use crate::error::AppError;

/// Flags every binary takes to build its configuration.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// Configuration file (TOML), layered over the built-in defaults.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A KubeletConfiguration YAML (kubelet.config.k8s.io/v1beta1) whose image
    /// fields (serializeImagePulls, registryPullQPS, imageGC*, containerRuntimeEndpoint, …)
    /// are layered after `--config` and before `IMAGED_*` variables and flags. An empty value
    /// is none (for manifests that fill it from a variable that may be empty).
    #[arg(long, global = true, value_name = "FILE", value_parser = path_or_empty)]
    pub kubelet_config: Option<PathBuf>,
    /// Override one key, e.g. `--set runtime.deadlines.pull_image=5m` (repeatable). A list key
    /// takes a TOML list: `--set 'gc.pinned_images=["registry.k8s.io/*", "quay.io/team/*"]'`
    /// (quoted strings; `[]` for none).
    #[arg(long = "set", global = true, value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// CRI endpoint (`embedded`, `unix:///path`, `tcp://host:port`); same as `--set runtime.endpoint=…`
    /// (giving both with different values is an error).
    #[arg(long, global = true, value_name = "ENDPOINT")]
    pub runtime_endpoint: Option<String>,
    /// Log format (`text` or `json`); same as `--set log.format=…` (giving both with different
    /// values is an error).
    #[arg(long, global = true, value_name = "FORMAT")]
    pub log_format: Option<String>,
}

/// A path, empty allowed (clap's own path parser refuses "").
#[allow(clippy::unnecessary_wraps)] // clap's value parsers return a Result
fn path_or_empty(s: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(s))
}

impl ConfigArgs {
    /// Loads the configuration: defaults, file, `IMAGED_*` environment, flags.
    pub fn load(&self) -> Result<Config, AppError> {
        Ok(Config::load(&self.sources()?)?)
    }

    /// Where the configuration comes from (for reloads). A flag that is a
    /// key's short form (`--runtime-endpoint`, `--log-format`) given with a
    /// `--set` of that key to another value is refused: neither silently wins.
    pub fn sources(&self) -> Result<Sources, ConfigError> {
        let mut overrides = self.overrides.clone();
        for (flag, key, value) in [
            ("--runtime-endpoint", "runtime.endpoint", &self.runtime_endpoint),
            ("--log-format", "log.format", &self.log_format),
        ] {
            if let Some(value) = value {
                agrees(flag, key, value, &self.overrides)?;
                overrides.push(format!("{key}={value}"));
            }
        }
        Ok(Sources::from_process(self.config.clone(), overrides)
            .with_kubelet_config(self.kubelet_config.clone().filter(|p| !p.as_os_str().is_empty())))
    }
}

/// Whether every `--set key=…` in `overrides` gives `value`, as `flag` does
/// (also a `--set section={ key = … }` of the key's section).
fn agrees(flag: &str, key: &str, value: &str, overrides: &[String]) -> Result<(), ConfigError> {
    let (section, name) = key.split_once('.').unwrap_or(("", key));
    for o in overrides {
        let Some((k, v)) = o.split_once('=') else { continue };
        let whole_key = k.trim() == key;
        let given = if whole_key {
            Some(v.trim().to_string())
        } else if k.trim() == section {
            // An inline table: its `name`, if it sets one.
            toml::from_str::<toml::Table>(&format!("t = {}", v.trim()))
                .ok()
                .and_then(|t| t.get("t").and_then(|t| t.get(name)).and_then(|x| x.as_str().map(str::to_string)))
        } else {
            None
        };
        if let Some(g) = given.filter(|g| g.trim() != value.trim()) {
            // The key's own value, not the rest of a section's table (it
            // may hold a mistyped key's secret).
            let shown = if whole_key { format!("{key}={g}") } else { format!("{}={{{name} = {g:?}, …}}", k.trim()) };
            return Err(ConfigError::Conflict(format!(
                "{flag} {value} and --set {shown} set {key} to different values: give one of them"
            )));
        }
    }
    Ok(())
}

/// Resolves when the process gets SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

/// Prints `err` once on stderr and returns its exit code (for `main`).
pub fn report(bin: &str, err: &AppError) -> i32 {
    eprint!("{}", report_text(bin, err));
    err.exit_code()
}

/// The text [`report`] prints: `BIN: error: MESSAGE`, then a `caused by:`
/// line for each cause the lines above do not already say (most errors
/// put their cause in their own message).
fn report_text(bin: &str, err: &AppError) -> String {
    let mut text = format!("{bin}: error: {err}\n");
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        let cause = s.to_string();
        if !text.contains(&cause) {
            text.push_str("  caused by: ");
            text.push_str(&cause);
            text.push('\n');
        }
        source = s.source();
    }
    text
}

/// Parses the command line, or exits: `--help`/`--version` with 0, a usage
/// error with 64 (`EX_USAGE`), as both binaries do.
pub fn parse_or_exit<P: clap::Parser>() -> Result<P, std::process::ExitCode> {
    P::try_parse().map_err(|e| {
        let code = if e.use_stderr() { crate::error::EXIT_USAGE } else { 0 };
        let _ = e.print();
        std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("socket closed")]
    struct Closed;

    #[derive(Debug, thiserror::Error)]
    #[error("reading the reply")]
    struct Reading(#[source] Closed);

    #[test]
    fn each_cause_is_printed_once() {
        // The CRI error's text is in the message already: no second line.
        let e = AppError::cri("PullImage x", crate::cri::CriError::from(tonic::Status::not_found("x: not found")));
        let text = report_text("imagectl", &e);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.starts_with("imagectl: error: PullImage x: ") && text.contains("x: not found"), "{text}");
        // A cause the message does not say gets its line.
        let e = AppError::Embedded(crate::embedded::EmbeddedError::Bind {
            path: "/run/x.sock".into(),
            source: std::io::Error::other(Reading(Closed)),
        });
        let text = report_text("imaged", &e);
        assert_eq!(
            text,
            "imaged: error: embedded runtime: cannot listen on /run/x.sock: reading the reply\n  caused by: socket closed\n"
        );
    }

    fn args(endpoint: Option<&str>, log_format: Option<&str>, overrides: &[&str]) -> ConfigArgs {
        ConfigArgs {
            runtime_endpoint: endpoint.map(str::to_string),
            log_format: log_format.map(str::to_string),
            overrides: overrides.iter().map(ToString::to_string).collect(),
            ..ConfigArgs::default()
        }
    }

    #[test]
    fn a_flag_and_a_set_of_its_key_with_another_value_are_refused_naming_both() {
        let a = args(Some("unix:///a.sock"), None, &["gc.gc_period=1m", "runtime.endpoint=unix:///b.sock"]);
        let err = a.sources().expect_err("two endpoints").to_string();
        assert!(
            err.contains("--runtime-endpoint unix:///a.sock")
                && err.contains("--set runtime.endpoint=unix:///b.sock")
                && err.contains("runtime.endpoint"),
            "{err}"
        );
        let err = args(None, Some("json"), &["log.format=text"]).sources().expect_err("two formats").to_string();
        assert!(err.contains("--log-format json") && err.contains("--set log.format=text"), "{err}");
        // The same value twice is no conflict; either alone is none.
        let same =
            args(Some("unix:///a.sock"), Some("json"), &["runtime.endpoint = unix:///a.sock", "log.format=json"]);
        assert!(same.sources().is_ok());
        assert!(args(Some("unix:///a.sock"), None, &[]).sources().is_ok());
        assert!(args(None, None, &["runtime.endpoint=unix:///b.sock"]).sources().is_ok());
        // The key set through its section's table is the same key.
        let table = args(Some("unix:///a.sock"), None, &[r#"runtime={endpoint="unix:///b.sock", tokn="hunter2"}"#]);
        let err = table.sources().expect_err("two endpoints, one in a table").to_string();
        assert!(
            err.contains("--runtime-endpoint unix:///a.sock")
                && err.contains(r#"--set runtime={endpoint = "unix:///b.sock", …}"#),
            "{err}"
        );
        assert!(!err.contains("hunter2"), "the rest of the table is not shown: {err}");
        assert!(args(Some("unix:///a.sock"), None, &[r#"runtime={endpoint="unix:///a.sock"}"#]).sources().is_ok());
        assert!(args(Some("unix:///a.sock"), None, &[r#"runtime={startup_timeout="5s"}"#]).sources().is_ok());
    }
}
