//! The credentials a [`Keyring`](super::Keyring) holds, where they came
//! from, and the kubelet's hash that identifies one without keeping it.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::domain::reference::Named;
use crate::domain::{AuthConfig, Secret};

/// Where a credential came from: the pull secret it was read from (node
/// credentials have none).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CredentialSource {
    /// The secret's `metadata.uid`.
    pub secret_uid: String,
    /// The secret's namespace.
    pub namespace: String,
    /// The secret's name.
    pub name: String,
}

/// One set of registry credentials, as stored in a [`Keyring`]. The `auth`
/// field of a docker config is already resolved into `username`/`password`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Credential {
    /// User name for basic auth.
    pub username: String,
    /// Password for basic auth.
    pub password: Secret,
    /// The (deprecated) e-mail of the docker config entry.
    pub email: String,
    /// The pull secret this credential came from; `None` for node credentials.
    pub source: Option<CredentialSource>,
    /// The service account whose token a credential plugin exchanged for
    /// this credential (KEP-4412); `None` otherwise.
    pub service_account: Option<crate::domain::pull_record::ImagePullServiceAccount>,
    /// The normalised keyring key it is stored under (set by [`Keyring::add`]).
    pub key: String,
}

impl Credential {
    /// A credential with no source and no key yet.
    pub fn new(username: impl Into<String>, password: impl Into<Secret>, email: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: password.into(),
            email: email.into(),
            source: None,
            service_account: None,
            key: String::new(),
        }
    }

    /// The same credential, tagged with the secret it came from.
    pub fn with_source(mut self, source: CredentialSource) -> Self {
        self.source = Some(source);
        self
    }

    /// The kubelet's `AuthConfigHash`: SHA-256 hex of Go's `json.Marshal` of
    /// `AuthConfig{Username, Password, Email}` (fields `username`, `password`,
    /// `email`, each omitted when empty). Identifies the credential without
    /// keeping it.
    pub fn auth_config_hash(&self) -> String {
        let mut json = String::from("{");
        for (name, value) in
            [("username", self.username.as_str()), ("password", self.password.expose()), ("email", self.email.as_str())]
        {
            if value.is_empty() {
                continue;
            }
            if json.len() > 1 {
                json.push(',');
            }
            crate::domain::go_text::json_string(&mut json, name);
            json.push(':');
            crate::domain::go_text::json_string(&mut json, value);
        }
        json.push('}');
        let digest = Sha256::digest(json.as_bytes());
        crate::domain::go_text::hex(&digest)
    }

    /// The CRI `AuthConfig` to pull `image` with: username and password, and
    /// `server_address` = the registry host the key matched (the image's
    /// `host[:port]`, scheme-less). It is left empty for Docker Hub, whose
    /// pulls containerd sends to `registry-1.docker.io`: an address of
    /// `index.docker.io` would make containerd drop the credentials.
    pub fn to_auth_config(&self, image: &Named) -> AuthConfig {
        let server_address = if image.domain() == "docker.io" { String::new() } else { image.domain().to_string() };
        AuthConfig::basic(server_address, self.username.clone(), self.password.clone())
    }
}

/// Appends `s` as Go's `encoding/json` encodes a string (HTML-safe escaping).
impl fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "secret {}/{}", self.namespace, self.name)
    }
}
