//! Exec credential-provider plugins (the kubelet's
//! `--image-credential-provider-config` and `--image-credential-provider-bin-dir`,
//! reference §7.4): [`config`] reads and validates `CredentialProviderConfig`,
//! [`provider`] runs one plugin with its cache.
//!
//! Service-account token mode (`tokenAttributes`) is not supported.

pub mod config;
mod decode;
pub mod provider;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use config::{
    EnvVar, ProviderConfigError, ProviderSpec, RegisteredProviders, TokenAttributes, TokenCacheType,
    load_provider_config, register_providers,
};
pub use provider::{
    CacheKeyType, DEFAULT_PLUGIN_TIMEOUT, GLOBAL_CACHE_KEY, PluginError, PluginProvider, PluginResponse,
    decode_response, registry_of,
};

use super::secrets::DockerConfig;
use crate::clock::Clock;

/// The registered plugins, in configuration order.
#[derive(Debug, Clone, Default)]
pub struct CredentialProviders {
    plugins: Vec<Arc<PluginProvider>>,
    /// `sha256:<hex>` over the configuration files (empty when none).
    config_hash: String,
}

impl CredentialProviders {
    /// Registers the plugins configured at `config_path` (file or directory)
    /// with executables in `bin_dir`, each run limited to `timeout`, their
    /// caches reading time from `clock`, each run reported to `metrics`
    /// (`credential_provider_plugin_duration`, `..._errors`) and the
    /// configuration's hash set in `credential_provider_config_info`. Fails
    /// with the kubelet's texts; the kubelet exits when this fails.
    pub fn register(
        config_path: &Path,
        bin_dir: &Path,
        timeout: Duration,
        clock: Clock,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Self, ProviderConfigError> {
        let registered = register_providers(config_path, bin_dir)?;
        metrics.set_credential_provider_config(&registered.config_hash);
        let plugins = registered
            .providers
            .into_iter()
            .map(|(spec, bin)| {
                Arc::new(
                    PluginProvider::new(spec, bin, timeout).with_clock(clock.clone()).with_metrics(metrics.clone()),
                )
            })
            .collect();
        Ok(Self { plugins, config_hash: registered.config_hash })
    }

    /// The kubelet's configuration hash: `sha256:<hex>` of each file's
    /// 8-byte big-endian length and content, in reading order.
    pub fn config_hash(&self) -> &str {
        &self.config_hash
    }

    /// The plugins, in order.
    pub fn plugins(&self) -> &[Arc<PluginProvider>] {
        &self.plugins
    }

    /// True when no plugin is registered.
    pub fn is_empty(&self) -> bool {
        self.plugins.is_empty()
    }

    /// Each matching plugin's credentials for `image`, in plugin order
    /// (plugins that match nothing or fail give nothing).
    pub async fn provide(&self, image: &str) -> Vec<DockerConfig> {
        let mut out = Vec::new();
        for p in &self.plugins {
            if p.matches(image) {
                let config = p.provide(image).await;
                if !config.entries.is_empty() {
                    out.push(config);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
