//! The node's credentials: docker config files (the kubelet's node
//! keyring) and exec credential-provider plugins (its per-pod plugin
//! keyring), looked up one after the other as the kubelet 1.36's
//! `UnionDockerKeyring` of the two does.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::keyring::{Credential, Keyring};
use super::node_files::{DEFAULT_CACHE_PERIOD, DockerConfigSearch, NodeConfigFiles, config_keyring};
use super::plugin::{
    CredentialProviders, DEFAULT_PLUGIN_TIMEOUT, PluginPod, PluginRunner, ProcessRunner, ProviderConfigError,
    ServiceAccountTokenSource,
};

/// An embedder's [`ServiceAccountTokenSource`] as a setting (compared by
/// identity).
#[derive(Clone)]
pub struct TokenSourceHandle(pub Arc<dyn ServiceAccountTokenSource>);

impl PartialEq for TokenSourceHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for TokenSourceHandle {}

impl std::fmt::Debug for TokenSourceHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// An embedder's [`PluginRunner`] as a setting (compared by identity).
#[derive(Clone)]
pub struct PluginRunnerHandle(pub Arc<dyn PluginRunner>);

impl PartialEq for PluginRunnerHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for PluginRunnerHandle {}

impl std::fmt::Debug for PluginRunnerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

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
    /// Kubeconfig of the API server that gives plugins in token mode their
    /// service accounts and tokens (`None`: only what requests carry).
    pub kubeconfig: Option<PathBuf>,
    /// The embedder's source of service accounts and tokens; used instead
    /// of `kubeconfig` when both are set (see `Config::with_token_source`).
    pub token_source: Option<TokenSourceHandle>,
    /// How plugins are run: as child processes (`None`, the daemon), or by
    /// the embedder's stand-in (the simulator; see `Config::with_plugin_runner`).
    pub plugin_runner: Option<PluginRunnerHandle>,
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
            kubeconfig: None,
            token_source: None,
            plugin_runner: None,
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
            (config, bin_dir) => CredentialProviders::register_run_by(
                config.as_deref().unwrap_or(std::path::Path::new("")),
                bin_dir.as_deref().unwrap_or(std::path::Path::new("")),
                s.provider_timeout,
                crate::clock::Clock::new(),
                &s.metrics,
                s.plugin_runner
                    .as_ref()
                    .map_or_else(|| Arc::new(ProcessRunner) as Arc<dyn PluginRunner>, |r| r.0.clone()),
            )?,
        };
        let plugins = match (&s.token_source, &s.kubeconfig) {
            (Some(source), _) => plugins.with_token_source(source.0.clone()),
            (None, Some(path)) => {
                let api = super::kube_api::KubeApi::from_kubeconfig(path).map_err(ProviderConfigError::Kubeconfig)?;
                plugins.with_token_source(Arc::new(api))
            }
            (None, None) => plugins,
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

    /// The same sources, plugins in token mode getting service accounts
    /// and tokens from `source` (see [`ServiceAccountTokenSource`]).
    #[must_use]
    pub fn with_token_source(mut self, source: Arc<dyn ServiceAccountTokenSource>) -> Self {
        self.plugins = self.plugins.with_token_source(source);
        self
    }

    /// The node credentials for `image_repo` (a normalised repository, no
    /// tag) for a pod without a service account; see [`Self::lookup_for`].
    pub async fn lookup(&self, image_repo: &str) -> Vec<Credential> {
        self.lookup_for(image_repo, &PluginPod::default()).await
    }

    /// The node credentials for `image_repo` for `pod`, in the order to try
    /// them, as the kubelet 1.36 unions its node keyring and the pod's
    /// plugin keyring: the config files' matches (most specific key first),
    /// then the plugins' (one keyring of every matching plugin's
    /// credentials, most specific key first, plugin order within a key).
    /// Credentials a token plugin got carry the pod's service account.
    pub async fn lookup_for(&self, image_repo: &str, pod: &PluginPod) -> Vec<Credential> {
        let mut creds = match &self.files {
            Some(f) => f.keyring().await.lookup(image_repo),
            None => Vec::new(),
        };
        let provided = self.plugins.provide_for(image_repo, pod).await;
        if provided.is_empty() {
            return creds;
        }
        let mut keyring = Keyring::new();
        for p in &provided {
            let mut plugin_keyring = config_keyring(&p.config, "credential provider plugin");
            if let Some(sa) = &p.service_account {
                plugin_keyring.tag_service_account(sa);
            }
            keyring.extend(plugin_keyring);
        }
        creds.extend(keyring.lookup(image_repo));
        creds
    }
}

/// Shared node credentials.
pub type SharedNodeCredentials = Arc<NodeCredentials>;

#[cfg(test)]
mod tests;
