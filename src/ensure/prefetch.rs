//! Prefetch: a pull started before any pod asks for the image (beyond the
//! kubelet, user-asks §1.3: pull a pod's later images while its first
//! containers start, or warm a node). It goes through the same pull queue
//! as `EnsureImageExists`, so an ensure that comes while it runs joins it
//! (single-flight) instead of pulling again; it has no pod, so no events,
//! no back-off and no pod pulling times. It writes the KEP-2535 intent and
//! record as an ensure's pull does, so which pods may use the image later
//! is decided exactly as if a pod had pulled it with those credentials.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::ImageManager;
use crate::actors::pull_queue::{EnqueuePull, PullRequest};
use crate::domain::go_text::quote;
use crate::domain::{AuthConfig, ErrorClass, ImageErrorKind, ImageSpec};

/// A pull to make ahead of need.
#[derive(Debug, Clone, Default)]
pub struct PrefetchRequest {
    /// The image as a pod spec would name it.
    pub image: String,
    /// The RuntimeClass handler it is for (empty = the runtime's default).
    pub runtime_handler: String,
    /// Pull secrets whose credentials for the image are tried first.
    pub pull_secrets: Vec<crate::credentials::PullSecret>,
    /// Further credentials, tried after the secrets' and the node's.
    pub credentials: Vec<AuthConfig>,
    /// Pull priority (higher first); a prefetch usually yields to pods'
    /// pulls with a negative one.
    pub priority: i32,
    /// Overall pull deadline (overrides `pull.pull_deadline`).
    pub deadline: Option<Duration>,
}

impl PrefetchRequest {
    /// An anonymous prefetch of `image` at priority 0.
    pub fn new(image: impl Into<String>) -> Self {
        Self { image: image.into(), ..Self::default() }
    }
}

/// What a prefetch found when it was admitted to the queue.
pub enum Prefetch {
    /// The image is present: nothing to pull.
    Present {
        /// Its image reference (image id).
        image_ref: String,
    },
    /// A pull is queued or running for it.
    Pulling {
        /// True when it joined a pull of the same image (and credentials)
        /// already queued or running.
        joined: bool,
        /// Resolves when the pull ends; dropping it does not stop the pull.
        done: PrefetchDone,
    },
}

impl fmt::Debug for Prefetch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Prefetch::Present { image_ref } => f.debug_struct("Present").field("image_ref", image_ref).finish(),
            Prefetch::Pulling { joined, .. } => f.debug_struct("Pulling").field("joined", joined).finish(),
        }
    }
}

/// The end of a prefetch's pull: the image reference, or the pull's error.
pub struct PrefetchDone(oneshot::Receiver<Result<String, String>>);

impl Future for PrefetchDone {
    type Output = Result<String, String>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|_| Err("image pull abandoned: imaged is shutting down".to_string())))
    }
}

impl ImageManager {
    /// Starts pulling `req.image` unless it is present, and returns once the
    /// pull is admitted to the queue (a full queue makes the caller wait,
    /// as an ensure does). The pull goes on in the background; await
    /// [`Prefetch::Pulling::done`] for its end, or drop it. Errors (bad
    /// image name, undecodable secret, failed presence check) come before
    /// anything is queued.
    pub async fn prefetch(&self, req: &PrefetchRequest) -> Result<Prefetch, super::EnsureError> {
        let requested = req.image.as_str();
        let defaulted = self.default_tag(requested).map_err(|e| {
            let msg = super::failed_to_apply_default_tag(requested, &e);
            self.fail(ImageErrorKind::InvalidImageName, msg, ErrorClass::Permanent)
        })?;
        let spec = ImageSpec {
            image: defaulted.image.clone(),
            runtime_handler: req.runtime_handler.clone(),
            user_specified_image: requested.to_string(),
            ..ImageSpec::default()
        };
        match self.image_present(&spec).await {
            Ok(Some(image_ref)) if self.mark_ensured_unless_removed(&image_ref).await => {
                return Ok(Prefetch::Present { image_ref });
            }
            // Absent, or removed meanwhile by GC: pulled.
            Ok(Some(_) | None) => {}
            Err(e) => {
                let msg = format!("Failed to inspect image {}: {e}", quote(requested));
                return Err(self.fail(ImageErrorKind::ImageInspectError, msg, super::class_of_cri(&e)));
            }
        }
        let absent_at = Instant::now();
        // No pod: plugins in token mode run without a service account (or not at all).
        let found = self
            .lookup(
                &req.pull_secrets,
                &req.credentials,
                &crate::credentials::PluginPod::default(),
                (&spec.image, &defaulted.named),
            )
            .await?;
        let (credentials, proves) = (found.credentials, found.proves);
        let intent = self.records.begin_pull(&spec.image).await.map_err(|e| {
            let msg = super::failed_to_record_pull_intent(requested, &e.to_string());
            self.fail(ImageErrorKind::ErrImagePull, msg, ErrorClass::Transient)
        })?;
        let began = self.records.clock().now();
        let request = PullRequest {
            image: spec.clone(),
            credentials,
            sandbox: None,
            pod: None,
            priority: req.priority,
            skip_if_present: true,
            absent_at: Some(absent_at),
            deadline: req.deadline,
            wire: None,
            records: true,
        };
        // While it runs, an image it would replace counts as in use for GC.
        let in_flight = defaulted.named.as_ref().ok().map(|n| self.hints.pull_started(&n.docker_ref()));
        let ticket = self.queue.send(EnqueuePull(request)).await.map_err(|_| {
            self.fail(ImageErrorKind::ErrImagePull, "imaged is shutting down".into(), ErrorClass::Transient)
        })?;
        let joined = ticket.joined;
        let (tx, rx) = oneshot::channel();
        let (manager, requested) = (self.clone(), requested.to_string());
        tokio::spawn(async move {
            let _in_flight = in_flight;
            let result = match ticket.await {
                Ok(outcome) => {
                    // Pulled for a pod to come: GC keeps it as if just used
                    // (marked before its record is written, which GC then keeps).
                    manager.mark_ensured_after_removals(&outcome.image_ref).await;
                    // The end runs to its end once begun (as an ensure's).
                    intent.disarm();
                    manager.record_pull_end(&spec.image, &requested, Ok(&outcome), &proves, began).await;
                    tracing::info!(
                        image = requested,
                        image_ref = outcome.image_ref,
                        pulled = outcome.pulled,
                        "prefetched"
                    );
                    Ok(outcome.image_ref)
                }
                Err(failure) => {
                    intent.disarm();
                    manager.record_pull_end(&spec.image, &requested, Err(&failure), &proves, began).await;
                    let text = format!("Failed to pull image {}: {failure}", quote(&requested));
                    tracing::warn!(image = requested, error = %failure, "prefetch failed");
                    Err(text)
                }
            };
            let _ = tx.send(result);
        });
        Ok(Prefetch::Pulling { joined, done: PrefetchDone(rx) })
    }
}
