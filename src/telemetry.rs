//! Tracing setup: text or JSON lines on stderr, filtered by `RUST_LOG` or the
//! configured filter.

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber. Returns an error text when a subscriber
/// is already installed (tests, embedders) or the filter is bad.
pub fn init(cfg: &LogConfig) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(&v).map_err(|e| format!("RUST_LOG {v:?}: {e}"))?,
        _ => EnvFilter::try_new(&cfg.filter).map_err(|e| format!("log.filter {:?}: {e}", cfg.filter))?,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cfg.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
    .map_err(|e| e.to_string())
}
