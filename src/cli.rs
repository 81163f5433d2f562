//! Command-line pieces shared by `imaged` and `imagectl`: the configuration
//! flags and the shutdown signal.

use std::path::PathBuf;

use crate::config::{Config, Sources};
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
    /// Override one key, e.g. `--set runtime.deadlines.pull_image=5m` (repeatable).
    #[arg(long = "set", global = true, value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// CRI endpoint (`embedded`, `unix:///path`, `tcp://host:port`); same as `--set runtime.endpoint=…`.
    #[arg(long, global = true, value_name = "ENDPOINT")]
    pub runtime_endpoint: Option<String>,
    /// Log format (`text` or `json`); same as `--set log.format=…`.
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
        Ok(Config::load(&self.sources())?)
    }

    /// Where the configuration comes from (for reloads).
    pub fn sources(&self) -> Sources {
        let mut overrides = self.overrides.clone();
        if let Some(e) = &self.runtime_endpoint {
            overrides.push(format!("runtime.endpoint={e}"));
        }
        if let Some(f) = &self.log_format {
            overrides.push(format!("log.format={f}"));
        }
        Sources::from_process(self.config.clone(), overrides)
            .with_kubelet_config(self.kubelet_config.clone().filter(|p| !p.as_os_str().is_empty()))
    }
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

/// Prints `err` and returns its exit code (for `main`).
pub fn report(bin: &str, err: &AppError) -> i32 {
    eprintln!("{bin}: error: {err}");
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        eprintln!("  caused by: {s}");
        source = s.source();
    }
    err.exit_code()
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
