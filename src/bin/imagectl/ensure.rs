//! `imagectl ensure`: calls EnsureImage while printing the pod's events and
//! the image's pull phases to stderr, then prints the answer.

use std::io::Write;

use imaged::api::proto;
use imaged::error::AppError;
use tonic::Streaming;

use crate::commands::{Session, deadline_ms, read_secrets, rpc};
use crate::output::Format;
use crate::print::{print_ensure_result, print_event};
use crate::{EXIT_ENSURE_FAILED, EnsureArgs};

/// The EnsureImage request `imagectl ensure` sends.
fn request(args: EnsureArgs) -> Result<proto::EnsureImageRequest, AppError> {
    let EnsureArgs { image, policy, pod, pod_uid, runtime_handler, secrets, priority, deadline } = args;
    let (namespace, name) = pod;
    let pull_secrets = read_secrets(&secrets)?;
    Ok(proto::EnsureImageRequest {
        pod: Some(proto::Pod { uid: pod_uid, namespace, name, runtime_handler, priority, ..Default::default() }),
        container: String::new(),
        image,
        pull_policy: policy.unwrap_or_default(),
        pull_secrets,
        deadline_ms: deadline_ms(deadline),
    })
}

/// Prints the pod `uid`'s events and `image`'s phases from `progress` to
/// stderr; finishes at the pod's final event for the image (Pulled, Failed,
/// BackOff, ...), or never.
async fn print_progress(progress: Option<Streaming<proto::Event>>, uid: String, image: String) {
    let Some(mut stream) = progress else { return std::future::pending::<()>().await };
    let mut err = std::io::stderr();
    while let Ok(Some(e)) = stream.message().await {
        let (mine, last) = match &e.kind {
            Some(proto::event::Kind::ImageEvent(ie)) => (ie.pod_uid == uid, ie.reason != "Pulling"),
            Some(proto::event::Kind::PullPhase(p)) => (same_image(&p.image, &image), false),
            _ => (false, false),
        };
        if mine {
            let _ = print_event(&e, Format::Table, &mut err);
            if last {
                return;
            }
        }
    }
    std::future::pending::<()>().await;
}

/// Whether two references name the same image, each normalised or as
/// written: `busybox:1.36` is `docker.io/library/busybox:1.36`.
pub fn same_image(a: &str, b: &str) -> bool {
    let normal = |r: &str| imaged::domain::reference::parse_normalized_named(r).ok().map(|n| n.docker_ref());
    a == b || normal(a).is_some_and(|n| Some(n) == normal(b))
}

impl<W: Write> Session<W> {
    /// `imagectl ensure IMAGE …`: exit 0 when the image is there, 2 when it
    /// could not be ensured.
    pub async fn ensure(&mut self, args: EnsureArgs) -> Result<u8, AppError> {
        let uid = args.pod_uid.clone();
        let req = request(args)?;
        let image = req.image.clone();
        let mut watcher = self.client.clone();
        let progress = match watcher.watch_events(proto::WatchEventsRequest { recent: false, follow: true }).await {
            Ok(s) => Some(s.into_inner()),
            Err(_) => None,
        };
        let printer = print_progress(progress, uid, image);
        let call = self.client.ensure_image(req);
        tokio::pin!(call);
        tokio::pin!(printer);
        let mut final_event_seen = false;
        let result = loop {
            tokio::select! {
                r = &mut call => break r,
                () = &mut printer, if !final_event_seen => final_event_seen = true,
            }
        };
        if !final_event_seen {
            // The reply can overtake the pod's last event; give it a moment.
            let _ = tokio::time::timeout(std::time::Duration::from_millis(500), &mut printer).await;
        }
        let result = result
            .map_err(|s| rpc("EnsureImage", s))?
            .into_inner()
            .result
            .ok_or_else(|| AppError::Other("EnsureImage: the daemon sent an empty result".into()))?;
        print_ensure_result(&result, self.format, &mut self.o)?;
        Ok(match result {
            proto::ensure_image_response::Result::Ok(_) => 0,
            proto::ensure_image_response::Result::Failure(_) => EXIT_ENSURE_FAILED,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::same_image;

    #[test]
    fn images_match_as_written_or_normalised_either_way() {
        assert!(same_image("busybox:1.36", "docker.io/library/busybox:1.36"));
        assert!(same_image("docker.io/library/busybox:1.36", "busybox:1.36"));
        assert!(same_image("Not A Ref", "Not A Ref"));
        assert!(!same_image("busybox:1.36", "busybox:1.37"));
        assert!(!same_image("Not A Ref", "busybox"));
    }
}
