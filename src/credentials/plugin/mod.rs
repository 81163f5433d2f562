//! Exec credential-provider plugins (the kubelet's
//! `--image-credential-provider-config` and `--image-credential-provider-bin-dir`,
//! reference §7.4): [`config`] reads and validates `CredentialProviderConfig`
//! (strictly, see `decode`), [`provider`] runs one plugin with its cache,
//! [`service_account`] gives plugins with `tokenAttributes` the pod's
//! service-account token (KEP-4412).

pub mod config;
mod decode;
pub mod provider;
pub mod service_account;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use config::{
    EnvVar, ProviderConfigError, ProviderSpec, RegisteredProviders, TokenAttributes, TokenCacheType,
    load_provider_config, register_providers,
};
pub use provider::{
    CacheKeyType, DEFAULT_PLUGIN_TIMEOUT, GLOBAL_CACHE_KEY, PluginError, PluginOutput, PluginProvider, PluginResponse,
    PluginRunner, ProcessRunner, Provided, decode_response, registry_of,
};
pub use service_account::{
    PluginPod, PodServiceAccount, ServiceAccountInfo, ServiceAccountTokenSource, TokenRequest, TokenSourceError,
};

use super::secrets::DockerConfig;
use crate::clock::Clock;

/// The registered plugins, in configuration order.
#[derive(Debug, Clone, Default)]
pub struct CredentialProviders {
    plugins: Vec<Arc<PluginProvider>>,
    /// `sha256:<hex>` over the configuration files (empty when none).
    config_hash: String,
    /// Service accounts and tokens for plugins in token mode.
    token_source: Option<Arc<dyn ServiceAccountTokenSource>>,
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
        Self::register_run_by(config_path, bin_dir, timeout, clock, metrics, Arc::new(ProcessRunner))
    }

    /// [`register`](Self::register), each plugin run by `runner` (an
    /// embedder's stand-in for the executables; the configuration and the
    /// executables' presence are checked all the same).
    pub fn register_run_by(
        config_path: &Path,
        bin_dir: &Path,
        timeout: Duration,
        clock: Clock,
        metrics: &crate::metrics::Metrics,
        runner: Arc<dyn PluginRunner>,
    ) -> Result<Self, ProviderConfigError> {
        let registered = register_providers(config_path, bin_dir)?;
        metrics.set_credential_provider_config(&registered.config_hash);
        let plugins = registered
            .providers
            .into_iter()
            .map(|(spec, bin)| {
                Arc::new(
                    PluginProvider::new(spec, bin, timeout)
                        .with_clock(clock.clone())
                        .with_metrics(metrics.clone())
                        .with_runner(runner.clone()),
                )
            })
            .collect();
        Ok(Self { plugins, config_hash: registered.config_hash, token_source: None })
    }

    /// The same plugins, getting service accounts and tokens for plugins in
    /// token mode from `source` (when the request does not carry them).
    #[must_use]
    pub fn with_token_source(mut self, source: Arc<dyn ServiceAccountTokenSource>) -> Self {
        self.token_source = Some(source);
        self
    }

    /// True when some plugin runs in service-account token mode.
    pub fn uses_tokens(&self) -> bool {
        self.plugins.iter().any(|p| p.spec().token_attributes.is_some())
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
    /// (plugins that match nothing or fail give nothing), for a pod
    /// without a service account.
    pub async fn provide(&self, image: &str) -> Vec<DockerConfig> {
        self.provide_for(image, &PluginPod::default()).await.into_iter().map(|p| p.config).collect()
    }

    /// Each matching plugin's credentials for `image` for `pod` (the
    /// kubelet's per-pod plugin keyring), with the service account a token
    /// plugin obtained them for.
    pub async fn provide_for(&self, image: &str, pod: &PluginPod) -> Vec<Provided> {
        let mut out = Vec::new();
        for p in &self.plugins {
            if p.matches(image) {
                let provided = p.provide_for(image, pod, self.token_source.as_deref()).await;
                if !provided.config.entries.is_empty() {
                    out.push(provided);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
