//! One task per pod of the workload: the pod arrives, its images are
//! ensured container by container as the kubelet does (a failing pod
//! retries every [`RETRY`] until the horizon or its deletion), its
//! containers are created in the runtime once its images are there (so GC
//! sees them in use) and removed when it stops. Every step is counted into
//! the [`Tally`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{PRIVATE_PASSWORD, RETRY, Shared, catalogue, tally};
use crate::credentials::PullSecret;
use crate::demo::summary::Tally;
use crate::demo::workload::{ContainerPlan, PodPlan};
use crate::domain::{Container, ContainerState, ImageSpec};
use crate::embedded::EmbeddedRuntime;
use crate::ensure::{EnsureError, EnsureImageRequest, EnsureOk};
use crate::node::{Node, NodeError};

/// The billing namespace's `regcred` secret for the private registry.
pub(super) fn billing_secret() -> PullSecret {
    let json = format!(
        r#"{{"auths":{{"{}":{{"username":"{}","password":"{}"}}}}}}"#,
        catalogue::PRIVATE_HOST,
        catalogue::PRIVATE_USER,
        PRIVATE_PASSWORD
    );
    PullSecret::new("billing", "regcred", "kubernetes.io/dockerconfigjson")
        .with_uid("billing-regcred-uid")
        .with_data(".dockerconfigjson", json.into_bytes())
}

/// A short reason for a pod that never started, from its last error (a
/// back-off message carries the error it backs off from).
fn why_not_started(kind: &str, message: &str) -> String {
    let cause = if message.contains("401 Unauthorized") {
        "unauthorized"
    } else if message.contains(": not found") {
        "image not found"
    } else if message.contains("no space left on device") {
        "disk full"
    } else {
        return kind.to_string();
    };
    format!("{kind} ({cause})")
}

/// What a pod does after an ensure.
enum Step {
    /// Ensure the next container's image.
    Next,
    /// Try again after [`RETRY`].
    Retry,
    /// Stop trying (horizon, deletion, or the node stopping).
    GiveUp,
}

/// A pod's way through its containers' images.
#[derive(Default)]
struct Progress {
    /// The image refs ensured so far, one per container, in order.
    refs: Vec<String>,
    /// Whether the pod is counted in `pods_failing` now.
    failing: bool,
}

impl Progress {
    /// Counts one ensure's outcome into `t` and says what the pod does next;
    /// a pod that gives up is counted as settled, never started.
    fn record(
        &mut self,
        t: &mut Tally,
        result: Result<Result<EnsureOk, EnsureError>, NodeError>,
        took: Duration,
        give_up: Instant,
    ) -> Step {
        t.ensure_calls += 1;
        match result {
            Ok(Ok(ok)) => {
                t.ensure_ok.push(took);
                self.refs.push(ok.image_ref);
                Step::Next
            }
            Ok(Err(e)) => {
                *t.ensure_errors.entry(e.kind.to_string()).or_insert(0) += 1;
                if e.message.contains("pull QPS exceeded") {
                    t.qps_exceeded += 1;
                }
                if !self.failing {
                    self.failing = true;
                    t.pods_failing += 1;
                }
                if Instant::now() + RETRY >= give_up {
                    t.pods_failing -= 1;
                    *t.never_started.entry(why_not_started(&e.kind.to_string(), &e.message)).or_insert(0) += 1;
                    t.pods_settled += 1;
                    Step::GiveUp
                } else {
                    Step::Retry
                }
            }
            // The node is stopping: the run is over.
            Err(_) => {
                if self.failing {
                    t.pods_failing -= 1;
                }
                *t.never_started.entry("node stopping".into()).or_insert(0) += 1;
                t.pods_settled += 1;
                Step::GiveUp
            }
        }
    }
}

/// The kubelet's ensure for one container of `pod`.
fn ensure_request(pod: &PodPlan, c: &ContainerPlan, secret: &PullSecret) -> EnsureImageRequest {
    let mut req = EnsureImageRequest::new(pod.uid.clone(), c.image.clone(), c.policy);
    req.pod.namespace.clone_from(&pod.namespace);
    req.pod.name.clone_from(&pod.name);
    req.pod.priority = pod.priority;
    req.container = Some(c.name.clone());
    if pod.pull_secret {
        req.pull_secrets = vec![secret.clone()];
    }
    req
}

/// Ensures `pod`'s images container by container, retrying every [`RETRY`]
/// on failure until `give_up`. `None` when the pod gave up (already
/// counted as settled).
async fn ensure_images(
    node: &Node,
    pod: &PodPlan,
    secret: &PullSecret,
    shared: &Shared,
    give_up: Instant,
) -> Option<Progress> {
    let mut progress = Progress::default();
    while let Some(c) = pod.containers.get(progress.refs.len()) {
        let req = ensure_request(pod, c, secret);
        let t0 = Instant::now();
        let result = node.ensure_image_exists(&req).await;
        let took = t0.elapsed();
        let step = progress.record(&mut tally(shared), result, took, give_up);
        match step {
            Step::Next => {}
            Step::Retry => tokio::time::sleep(RETRY).await,
            Step::GiveUp => return None,
        }
    }
    Some(progress)
}

/// Creates `pod`'s containers, running, each on its ensured image ref;
/// returns their ids.
fn create_containers(rt: &EmbeddedRuntime, pod: &PodPlan, refs: &[String]) -> Vec<String> {
    let ids: Vec<String> = pod.containers.iter().map(|c| format!("{}-{}", pod.uid, c.name)).collect();
    for ((c, image_ref), id) in pod.containers.iter().zip(refs).zip(&ids) {
        rt.add_container(Container {
            id: id.clone(),
            pod_sandbox_id: pod.uid.clone(),
            name: c.name.clone(),
            image: ImageSpec::new(c.image.clone()),
            image_ref: image_ref.clone(),
            image_id: image_ref.clone(),
            state: ContainerState::Running,
            ..Container::default()
        });
    }
    ids
}

/// One pod's life on the node: arrive, ensure its images container by
/// container (retrying every [`RETRY`] on failure until the horizon or its
/// deletion), create its containers, and remove them when it stops.
pub(super) async fn drive_pod(
    node: Arc<Node>,
    pod: PodPlan,
    secret: PullSecret,
    shared: Shared,
    start: Instant,
    horizon: Duration,
) {
    tokio::time::sleep_until(start + pod.arrive).await;
    let give_up = start + pod.stop.map_or(horizon, |s| s.min(horizon));
    let Some(progress) = ensure_images(&node, &pod, &secret, &shared, give_up).await else { return };
    let Some(rt) = node.runtime().embedded.as_ref() else {
        tally(&shared).pods_settled += 1;
        return;
    };
    let ids = create_containers(rt, &pod, &progress.refs);
    {
        let mut t = tally(&shared);
        t.pods_started += 1;
        if progress.failing {
            t.pods_failing -= 1;
        }
        t.pods_settled += usize::from(pod.stop.is_none());
    }
    if let Some(stop) = pod.stop {
        tokio::time::sleep_until(start + stop).await;
        for id in &ids {
            rt.remove_container(id);
        }
        let mut t = tally(&shared);
        t.pods_stopped += 1;
        t.pods_settled += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_that_never_started_is_explained_by_its_last_error() {
        let backoff = "Back-off pulling image \"ghcr.io/acme/legacy-reporter:0.3.1\": ErrImagePull: failed to pull and \
                       unpack image \"ghcr.io/acme/legacy-reporter:0.3.1\": failed to resolve reference \
                       \"ghcr.io/acme/legacy-reporter:0.3.1\": ghcr.io/acme/legacy-reporter:0.3.1: not found";
        assert_eq!(why_not_started("ImagePullBackOff", backoff), "ImagePullBackOff (image not found)");
        let unauthorized = "failed to pull and unpack image \"x\": pulling from host h failed with status code \
                            [manifests 4.2.0]: 401 Unauthorized";
        assert_eq!(why_not_started("ErrImagePull", unauthorized), "ErrImagePull (unauthorized)");
        assert_eq!(why_not_started("ErrImagePull", "pull QPS exceeded"), "ErrImagePull");
    }
}
