//! Tracing setup: text or JSON lines on stderr, filtered by `RUST_LOG` or the
//! configured filter; the filter can be replaced while running (SIGHUP).

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

use crate::config::{LogFormat, LogSettings};

/// Replaces the log filter of the installed subscriber.
#[derive(Clone)]
pub struct LogReload {
    handle: reload::Handle<EnvFilter, Registry>,
    /// `RUST_LOG` was set at start: it keeps precedence over reloads.
    pinned_by_env: bool,
}

impl std::fmt::Debug for LogReload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReload").field("pinned_by_env", &self.pinned_by_env).finish_non_exhaustive()
    }
}

impl LogReload {
    /// Installs `filter` (already validated by the configuration). Returns
    /// false when `RUST_LOG` pins the filter and nothing changed.
    pub fn set_filter(&self, filter: &str) -> Result<bool, String> {
        if self.pinned_by_env {
            return Ok(false);
        }
        let f = EnvFilter::try_new(filter).map_err(|e| format!("log.filter {filter:?}: {e}"))?;
        self.handle.reload(f).map_err(|e| e.to_string())?;
        Ok(true)
    }
}

/// Installs the global subscriber. Returns an error text when a subscriber
/// is already installed (tests, embedders) or the filter is bad.
pub fn init(cfg: &LogSettings) -> Result<LogReload, String> {
    let (filter, pinned_by_env) = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => (EnvFilter::try_new(&v).map_err(|e| format!("RUST_LOG {v:?}: {e}"))?, true),
        _ => (EnvFilter::try_new(&cfg.filter).map_err(|e| format!("log.filter {:?}: {e}", cfg.filter))?, false),
    };
    let (filter, handle) = reload::Layer::new(filter);
    // Colours only for a terminal: journald and log files get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let fmt = match cfg.format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    };
    tracing_subscriber::registry().with(filter).with(fmt).try_init().map_err(|e| e.to_string())?;
    Ok(LogReload { handle, pinned_by_env })
}
