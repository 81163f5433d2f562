//! Registry credentials the way the kubelet finds them (reference §7):
//! the pod's pull secrets ([`secrets`]), then the node's credentials
//! ([`node`]: docker config files ([`node_files`]) and exec
//! credential-provider plugins ([`plugin`])), each looked up with the
//! kubelet's `BasicDockerKeyring` matching rules ([`keyring`]).
//!
//! Passwords stay in [`Secret`](crate::domain::Secret)s; errors name secrets,
//! fields and registries, never a value.

pub mod keyring;
pub mod kube_api;
pub mod node;
pub mod node_files;
pub mod plugin;
pub mod secrets;

pub use keyring::{
    Credential, CredentialSource, DEFAULT_REGISTRY_HOST, DockerKeyring, KeyError, Keyring, UrlError, glob_match,
    is_default_registry_match, normalize_key, urls_match,
};
pub use kube_api::{KubeApi, KubeconfigError};
pub use node::{NodeCredentialSettings, NodeCredentials};
pub use node_files::{DockerConfigSearch, NodeConfigFiles};
pub use plugin::{
    CredentialProviders, PluginError, PluginOutput, PluginPod, PluginRunner, PodServiceAccount, ProcessRunner,
    ProviderConfigError, ServiceAccountInfo, ServiceAccountTokenSource, TokenRequest, TokenSourceError,
};
pub use secrets::{
    DOCKER_CONFIG_JSON_KEY, DOCKER_CONFIG_JSON_TYPE, DOCKERCFG_KEY, DOCKERCFG_TYPE, DockerConfig, DockerConfigEntry,
    DockerConfigError, ManifestError, PullSecret, parse_docker_config_json, parse_dockercfg, secrets_keyring,
};

use crate::domain::AuthConfig;
use crate::domain::reference::{Named, ReferenceError, parse_normalized_named};

/// Why credentials could not be looked up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// A pull secret's docker config did not decode; the kubelet aborts the
    /// whole lookup.
    #[error("pull secret \"{namespace}/{name}\": {key}: {source}")]
    Secret {
        /// The secret's namespace.
        namespace: String,
        /// The secret's name.
        name: String,
        /// The data key (`.dockerconfigjson` or `.dockercfg`).
        key: &'static str,
        /// What was wrong.
        source: DockerConfigError,
    },
    /// A Secret manifest was rejected.
    #[error("Secret manifest \"{secret}\": {reason}")]
    Manifest {
        /// `namespace/name`, or `<unnamed>` when the name is not known.
        secret: String,
        /// What was wrong.
        reason: ManifestError,
    },
    /// The image name did not parse.
    #[error("couldn't parse image name {image:?}: {source}")]
    InvalidImage {
        /// The image as given.
        image: String,
        /// The parse error.
        source: ReferenceError,
    },
}

/// The kubelet's `UnionDockerKeyring` of a pod: its pull secrets' keyring
/// (if any secret carried a docker config), then the node's keyring.
pub struct UnionKeyring<'a> {
    secrets: Option<Keyring>,
    node: Option<&'a dyn DockerKeyring>,
}

impl UnionKeyring<'_> {
    /// The pod secrets' keyring, when any secret carried a docker config.
    pub fn secrets(&self) -> Option<&Keyring> {
        self.secrets.as_ref()
    }
}

impl DockerKeyring for UnionKeyring<'_> {
    fn lookup(&self, image_repo: &str) -> Vec<Credential> {
        let mut creds = self.secrets.as_ref().map(|k| k.lookup(image_repo)).unwrap_or_default();
        if let Some(node) = self.node {
            creds.extend(node.lookup(image_repo));
        }
        creds
    }
}

/// The kubelet's `MakeDockerKeyring`: the keyring of `secrets` (see
/// [`secrets_keyring`]) followed by `node` (node config files, plugins).
/// A secret whose docker config does not decode fails the whole lookup.
pub fn make_docker_keyring<'a>(
    secrets: &[PullSecret],
    node: Option<&'a dyn DockerKeyring>,
) -> Result<UnionKeyring<'a>, CredentialError> {
    Ok(UnionKeyring { secrets: secrets_keyring(secrets)?, node })
}

/// Normalises `image` (`busybox:1.36` → `docker.io/library/busybox`).
pub fn image_repo(image: &str) -> Result<Named, CredentialError> {
    parse_normalized_named(image).map_err(|source| CredentialError::InvalidImage { image: image.to_string(), source })
}

/// The credentials to try for `image`, in order, as CRI `AuthConfig`s:
/// pod secrets' matches, then the node keyring's. Empty when none match
/// (pull without credentials).
pub fn credentials_for_image(
    secrets: &[PullSecret],
    node: Option<&Keyring>,
    image: &str,
) -> Result<Vec<AuthConfig>, CredentialError> {
    Ok(tracked_credentials_for_image(secrets, node, image)?.into_iter().map(|c| c.auth).collect())
}

/// A credential to try, with where it came from (the kubelet's
/// `TrackedAuthConfig`), for the pull records of KEP-2535.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedCredential {
    /// What is sent to the runtime.
    pub auth: AuthConfig,
    /// The pull secret it came from; `None` for node-level credentials.
    pub source: Option<CredentialSource>,
    /// [`Credential::auth_config_hash`]: identifies it without keeping it.
    pub hash: String,
}

/// [`credentials_for_image`] with each credential's source and hash.
pub fn tracked_credentials_for_image(
    secrets: &[PullSecret],
    node: Option<&Keyring>,
    image: &str,
) -> Result<Vec<TrackedCredential>, CredentialError> {
    let named = image_repo(image)?;
    let keyring = make_docker_keyring(secrets, node.map(|k| k as &dyn DockerKeyring))?;
    Ok(keyring
        .lookup(&named.name())
        .iter()
        .map(|c| TrackedCredential {
            auth: c.to_auth_config(&named),
            source: c.source.clone(),
            hash: c.auth_config_hash(),
        })
        .collect())
}

/// The credentials to try for `image`, in the kubelet's order, as CRI
/// `AuthConfig`s: the pod secrets' matches, then the node's (config files
/// and plugins, see [`NodeCredentials::lookup`]). Empty when none match
/// (pull without credentials). A secret that does not decode fails the
/// lookup before any plugin runs.
pub async fn lookup_credentials(
    secrets: &[PullSecret],
    node: Option<&NodeCredentials>,
    image: &str,
) -> Result<Vec<AuthConfig>, CredentialError> {
    let node = node.filter(|n| !n.is_empty());
    if secrets.is_empty() && node.is_none() {
        return Ok(Vec::new());
    }
    let named = image_repo(image)?;
    let repo = named.name();
    let mut creds = make_docker_keyring(secrets, None)?.lookup(&repo);
    if let Some(node) = node {
        creds.extend(node.lookup(&repo).await);
    }
    Ok(creds.iter().map(|c| c.to_auth_config(&named)).collect())
}

#[cfg(test)]
mod tests;
