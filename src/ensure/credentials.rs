//! The credentials a pull tries and what each proves (KEP-2535): the pod's
//! pull secrets, the node's credentials, the request's own; and which pod
//! credentials may use an image already present.

use std::sync::Arc;

use super::{EnsureError, EnsureImageRequest, ImageManager};
use crate::credentials::{PluginPod, PullSecret};
use crate::domain::pull_record::{ImagePullCredentials, ImagePullSecret};
use crate::domain::reference::{Named, ReferenceError};
use crate::domain::{AuthConfig, ErrorClass, ImageErrorKind};
use crate::pull_records::PodCredentials;

/// The credentials of one request, in the order a pull tries them, each
/// with what a successful pull with it proves (KEP-2535), and the pod's
/// credentials a must-pull check compares (the kubelet's
/// `getPodCredentials`).
#[derive(Debug, Default)]
pub(super) struct Lookup {
    /// What is sent to the runtime, in order.
    pub(super) credentials: Vec<AuthConfig>,
    /// One per credential: a secret's coordinates and hash, a token
    /// plugin's service account, or (node-level, the request's own) every pod.
    pub(super) proves: Vec<ImagePullCredentials>,
    /// Every matching pull-secret credential and the first service account
    /// a token plugin obtained credentials for.
    pub(super) pod: PodCredentials,
}

/// A request's [`Lookup`], made at most once and no earlier than needed
/// (the kubelet's `lookupPullCredentials`, a `sync.OnceValues`): the
/// must-pull check and the pull share it, so a token plugin runs once per
/// ensure.
pub(super) struct LazyLookup<'a> {
    manager: &'a ImageManager,
    req: &'a EnsureImageRequest,
    image: &'a str,
    /// `image` normalised, parsed once per name (`ImageManager::default_tag`).
    named: &'a Result<Named, ReferenceError>,
    cell: tokio::sync::OnceCell<Result<Arc<Lookup>, EnsureError>>,
}

impl<'a> LazyLookup<'a> {
    /// Nothing is copied until the lookup is needed: most ensures (a
    /// present image under a policy that needs no credentials) never need it.
    pub(super) fn new(
        manager: &'a ImageManager,
        req: &'a EnsureImageRequest,
        image: &'a str,
        named: &'a Result<Named, ReferenceError>,
    ) -> Self {
        Self { manager, req, image, named, cell: tokio::sync::OnceCell::new() }
    }

    /// The image's normalised name, if it parses.
    pub(super) fn named(&self) -> Option<&'a Named> {
        self.named.as_ref().ok()
    }

    /// The lookup (made now if not yet).
    pub(super) async fn get(&self) -> Result<Arc<Lookup>, EnsureError> {
        self.cell
            .get_or_init(|| async {
                let req = self.req;
                let pod = PluginPod {
                    namespace: req.pod.namespace.clone(),
                    name: req.pod.name.clone(),
                    uid: req.pod.uid.clone(),
                    service_account: req.pod.service_account.clone(),
                };
                let image = (self.image, self.named);
                self.manager.lookup(&req.pull_secrets, &req.credentials, &pod, image).await.map(Arc::new)
            })
            .await
            .clone()
    }

    /// The pod's credentials, for a must-pull check.
    pub(super) async fn pod_credentials(&self) -> Result<PodCredentials, EnsureError> {
        self.get().await.map(|l| l.pod.clone())
    }
}

impl ImageManager {
    /// The credentials to try for `image`, in order: the pull secrets'
    /// matching ones (a secret that does not decode fails the request), the
    /// node's (config files, then plugins, for `pod`), then `extra`; with
    /// what each proves and the pod's credentials (see [`Lookup`]).
    /// `image` with its normalised name (or why it has none).
    pub(super) async fn lookup(
        &self,
        pull_secrets: &[PullSecret],
        extra: &[AuthConfig],
        pod: &PluginPod,
        (image, named): (&str, &Result<Named, ReferenceError>),
    ) -> Result<Lookup, EnsureError> {
        let bad = |e: crate::credentials::CredentialError| {
            self.fail(ImageErrorKind::ErrImagePull, e.to_string(), ErrorClass::Permanent)
        };
        let tracked = if pull_secrets.is_empty() {
            Vec::new()
        } else {
            crate::credentials::tracked_credentials_for_image(pull_secrets, None, image).map_err(bad)?
        };
        let node = match self.node_credentials.as_deref().filter(|n| !n.is_empty()) {
            Some(node) => {
                // As `credentials::image_repo` gives it.
                let named = named.as_ref().map_err(|source| {
                    bad(crate::credentials::CredentialError::InvalidImage {
                        image: image.to_string(),
                        source: source.clone(),
                    })
                })?;
                let creds = node.lookup_for(&named.name(), pod).await;
                creds.into_iter().map(|c| (c.to_auth_config(named), c.service_account)).collect()
            }
            None => Vec::new(),
        };
        let mut out = Lookup::default();
        for t in tracked {
            let proves = match t.source {
                Some(s) => {
                    let secret = ImagePullSecret {
                        uid: s.secret_uid,
                        namespace: s.namespace,
                        name: s.name,
                        credential_hash: t.hash,
                    };
                    out.pod.secrets.push(secret.clone());
                    ImagePullCredentials::secret(secret)
                }
                None => ImagePullCredentials::node_accessible(),
            };
            out.proves.push(proves);
            out.credentials.push(t.auth);
        }
        for (auth, service_account) in node {
            out.proves.push(match service_account {
                Some(sa) => {
                    // The kubelet takes the first service account only.
                    if out.pod.service_account.is_none() {
                        out.pod.service_account = Some(sa.clone());
                    }
                    ImagePullCredentials::service_account(sa)
                }
                None => ImagePullCredentials::node_accessible(),
            });
            out.credentials.push(auth);
        }
        for c in extra {
            out.credentials.push(c.clone());
            out.proves.push(ImagePullCredentials::node_accessible());
        }
        Ok(out)
    }
}

/// What the pull that succeeded with credential `index` (of the request's
/// list, whose proofs are `proves`) proves for the pulled record: no
/// credential (anonymous pull) → every pod may use the image; an index the
/// list does not have (a bug) → nothing, logged: a record without
/// credentials, so every pod must pull to use the image.
pub(super) fn credentials_used(
    proves: &[ImagePullCredentials],
    index: Option<usize>,
    image: &str,
) -> ImagePullCredentials {
    let Some(i) = index else { return ImagePullCredentials::node_accessible() };
    match proves.get(i) {
        Some(p) => p.clone(),
        None => {
            tracing::warn!(
                image,
                index = i,
                credentials = proves.len(),
                "the pull reported a credential it was not given; recording no credentials"
            );
            ImagePullCredentials::default()
        }
    }
}

#[cfg(test)]
mod tests;
