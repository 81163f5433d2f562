//! The node's credentials (the kubelet's default keyring): docker config
//! files and exec credential-provider plugins, looked up together in one
//! keyring as the kubelet's `providersDockerKeyring` does (file entries
//! added before plugin entries, so for equal keys files come first).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::keyring::{Credential, Keyring};
use super::node_files::{DEFAULT_CACHE_PERIOD, DockerConfigSearch, NodeConfigFiles, config_keyring};
use super::plugin::{CredentialProviders, DEFAULT_PLUGIN_TIMEOUT, ProviderConfigError};

/// Node credential settings (the `[credentials]` configuration section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCredentialSettings {
    /// Where docker config files are searched (empty = none).
    pub search: DockerConfigSearch,
    /// How long a read of the files is reused.
    pub cache_period: Duration,
    /// `CredentialProviderConfig` file or directory (`None` = no plugins).
    pub provider_config: Option<PathBuf>,
    /// Directory of the plugin executables.
    pub provider_bin_dir: Option<PathBuf>,
    /// Longest run of a plugin.
    pub provider_timeout: Duration,
    /// Where plugin runs and the provider configuration's hash are reported.
    pub metrics: crate::metrics::Metrics,
}

impl Default for NodeCredentialSettings {
    /// The kubelet's: its search order from `/var/lib/kubelet`, 5 minutes,
    /// no plugins, 1 minute plugin timeout.
    fn default() -> Self {
        Self {
            search: DockerConfigSearch::kubelet_default(std::path::Path::new(super::node_files::DEFAULT_ROOT_DIR)),
            cache_period: DEFAULT_CACHE_PERIOD,
            provider_config: None,
            provider_bin_dir: None,
            provider_timeout: DEFAULT_PLUGIN_TIMEOUT,
            metrics: crate::metrics::Metrics::default(),
        }
    }
}

/// The node's credential sources. Share it behind an `Arc` (see
/// [`ImageManager::with_node_credentials`](crate::ensure::ImageManager::with_node_credentials)).
#[derive(Debug, Default)]
pub struct NodeCredentials {
    files: Option<NodeConfigFiles>,
    plugins: CredentialProviders,
}

impl NodeCredentials {
    /// No node credentials.
    pub fn none() -> Self {
        Self::default()
    }

    /// Built from settings: registers the plugins (failing with the
    /// kubelet's registration errors) and sets up the file search.
    pub fn from_settings(s: &NodeCredentialSettings) -> Result<Self, ProviderConfigError> {
        let files = (!s.search.is_empty()).then(|| NodeConfigFiles::new(s.search.clone(), s.cache_period));
        let plugins = match (&s.provider_config, &s.provider_bin_dir) {
            (None, None) => CredentialProviders::default(),
            (config, bin_dir) => CredentialProviders::register(
                config.as_deref().unwrap_or(std::path::Path::new("")),
                bin_dir.as_deref().unwrap_or(std::path::Path::new("")),
                s.provider_timeout,
                crate::clock::Clock::new(),
                &s.metrics,
            )?,
        };
        Ok(Self { files, plugins })
    }

    /// Sources: docker config files (if any), then plugins.
    pub fn new(files: Option<NodeConfigFiles>, plugins: CredentialProviders) -> Self {
        Self { files, plugins }
    }

    /// True when there is no source at all.
    pub fn is_empty(&self) -> bool {
        self.files.is_none() && self.plugins.is_empty()
    }

    /// The node credentials for `image_repo` (a normalised repository, no
    /// tag), in the order to try them: one keyring of the config file's
    /// entries followed by each matching plugin's, looked up with the
    /// kubelet's rules (most specific key first; within a key, files before
    /// plugins in plugin order).
    pub async fn lookup(&self, image_repo: &str) -> Vec<Credential> {
        let files = match &self.files {
            Some(f) => Some(f.keyring().await),
            None => None,
        };
        let configs = self.plugins.provide(image_repo).await;
        if configs.is_empty() {
            return files.map(|k| k.lookup(image_repo)).unwrap_or_default();
        }
        let mut keyring: Keyring = files.map(|k| Keyring::clone(&k)).unwrap_or_default();
        for config in &configs {
            let plugin_keyring = config_keyring(config, "credential provider plugin");
            keyring.extend(plugin_keyring);
        }
        keyring.lookup(image_repo)
    }
}

/// Shared node credentials.
pub type SharedNodeCredentials = Arc<NodeCredentials>;

#[cfg(test)]
mod tests;
