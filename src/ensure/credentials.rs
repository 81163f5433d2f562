//! The credentials a pull tries and what each proves (KEP-2535): the pod's
//! pull secrets, the node's credentials, the request's own; and which pod
//! credentials may use an image already present.

use super::{EnsureError, EnsureImageRequest, ImageManager};
use crate::domain::pull_record::{ImagePullCredentials, ImagePullSecret};
use crate::domain::{AuthConfig, ErrorClass, ImageErrorKind};
use crate::pull_records::PodCredentials;

impl ImageManager {
    /// The credentials to try for `image`, in order: the pull secrets'
    /// matching ones (a secret that does not decode fails the request), the
    /// node's (config files, plugins), then `extra`. With each, what a
    /// successful pull with it proves, for the pull record: a secret's
    /// coordinates and hash, or (node-level and `extra`) access for every pod.
    pub(super) async fn credentials_for(
        &self,
        pull_secrets: &[crate::credentials::PullSecret],
        extra: &[AuthConfig],
        image: &str,
    ) -> Result<(Vec<AuthConfig>, Vec<ImagePullCredentials>), EnsureError> {
        let tracked = if pull_secrets.is_empty() {
            Vec::new()
        } else {
            crate::credentials::tracked_credentials_for_image(pull_secrets, None, image)
                .map_err(|e| self.fail(ImageErrorKind::ErrImagePull, e.to_string(), ErrorClass::Permanent))?
        };
        let node = crate::credentials::lookup_credentials(&[], self.node_credentials.as_deref(), image)
            .await
            .map_err(|e| self.fail(ImageErrorKind::ErrImagePull, e.to_string(), ErrorClass::Permanent))?;
        let mut credentials = Vec::with_capacity(tracked.len() + node.len() + extra.len());
        let mut proves = Vec::with_capacity(credentials.capacity());
        for t in tracked {
            proves.push(match t.source {
                Some(s) => ImagePullCredentials::secret(ImagePullSecret {
                    uid: s.secret_uid,
                    namespace: s.namespace,
                    name: s.name,
                    credential_hash: t.hash,
                }),
                None => ImagePullCredentials::node_accessible(),
            });
            credentials.push(t.auth);
        }
        for c in node.into_iter().chain(extra.iter().cloned()) {
            credentials.push(c);
            proves.push(ImagePullCredentials::node_accessible());
        }
        Ok((credentials, proves))
    }
}

/// The pod's credentials with a known source for `image` (the kubelet's
/// `getPodCredentials`): every matching pull-secret credential, with its
/// coordinates and hash. Node-level credentials are left out.
pub(super) fn pod_credentials(
    req: &EnsureImageRequest,
    image: &str,
) -> Result<PodCredentials, crate::credentials::CredentialError> {
    if req.pull_secrets.is_empty() {
        return Ok(PodCredentials::default());
    }
    let tracked = crate::credentials::tracked_credentials_for_image(&req.pull_secrets, None, image)?;
    Ok(PodCredentials {
        secrets: tracked
            .into_iter()
            .filter_map(|t| {
                t.source.map(|s| ImagePullSecret {
                    uid: s.secret_uid,
                    namespace: s.namespace,
                    name: s.name,
                    credential_hash: t.hash,
                })
            })
            .collect(),
        service_account: None,
    })
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
