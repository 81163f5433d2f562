//! `imagectl ensure`: calls EnsureImage while printing the pod's events and
//! the image's pull phases to stderr, then prints the answer.

use std::cell::Cell;
use std::io::Write;

use imaged::api::proto;
use imaged::domain::reference::same_image;
use imaged::error::AppError;
use tonic::Streaming;

use crate::commands::{Session, deadline_ms, read_bounded, read_secrets, rpc};

/// The largest token file `--service-account-token` reads (a bound token
/// is about 1 KiB).
const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;
use crate::output::Format;
use crate::print::{print_ensure_result, print_event};
use crate::{EXIT_ENSURE_FAILED, EnsureArgs};

/// How long `imagectl ensure` waits, after a reply that pulled, for the
/// pod's `Pulled` event: the daemon sends it once a size lookup (one
/// `ImageStatus`) returns, which a busy runtime can hold for seconds.
const PULLED_EVENT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long it waits after any other reply for the pod's last event, which
/// the reply can overtake (and which some errors never send).
const LAST_EVENT_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// The EnsureImage request `imagectl ensure` sends.
fn request(args: EnsureArgs) -> Result<proto::EnsureImageRequest, AppError> {
    let EnsureArgs {
        image,
        policy,
        pod,
        pod_uid,
        runtime_handler,
        secrets,
        priority,
        deadline,
        service_account,
        service_account_tokens,
    } = args;
    let (namespace, name) = pod;
    let pull_secrets = read_secrets(&secrets)?;
    let service_account = match service_account {
        Some(name) => {
            let mut tokens = std::collections::HashMap::new();
            for (audience, file) in service_account_tokens {
                let token = read_bounded(&file, "--service-account-token", MAX_TOKEN_FILE_BYTES)?;
                let token = String::from_utf8(token).map_err(|_| {
                    AppError::Usage(format!("--service-account-token {}: not UTF-8 text", file.display()))
                })?;
                tokens.insert(audience, token.trim().to_string());
            }
            Some(proto::ServiceAccount { name, tokens, ..Default::default() })
        }
        None => None,
    };
    Ok(proto::EnsureImageRequest {
        pod: Some(proto::Pod {
            uid: pod_uid,
            namespace,
            name,
            runtime_handler,
            priority,
            service_account,
            ..Default::default()
        }),
        container: String::new(),
        image,
        pull_policy: policy.unwrap_or_default(),
        pull_secrets,
        deadline_ms: deadline_ms(deadline),
    })
}

/// Prints the pod `uid`'s events and `image`'s phases from `progress` to
/// stderr; finishes at the pod's final event for the image (Pulled, Failed,
/// BackOff, ...), or when no event can come: there is no stream, or it
/// ended. `lagged` is set when the stream dropped events (a watcher that
/// fell behind): the final one may be among them.
async fn print_progress(progress: Option<Streaming<proto::Event>>, uid: String, image: String, lagged: &Cell<bool>) {
    let Some(mut stream) = progress else { return };
    let mut err = std::io::stderr();
    while let Ok(Some(e)) = stream.message().await {
        let (mine, last) = match &e.kind {
            Some(proto::event::Kind::ImageEvent(ie)) => (ie.pod_uid == uid, ie.reason != "Pulling"),
            Some(proto::event::Kind::PullPhase(p)) => (same_image(&p.image, &image), false),
            Some(proto::event::Kind::Lagged(_)) => {
                lagged.set(true);
                (false, false)
            }
            None => (false, false),
        };
        if mine {
            let _ = print_event(&e, Format::Table, &mut err);
            if last {
                return;
            }
        }
    }
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
        let lagged = Cell::new(false);
        let printer = print_progress(progress, uid, image, &lagged);
        let call = self.client.ensure_image(req);
        tokio::pin!(call);
        tokio::pin!(printer);
        let mut printer_done = false;
        let result = loop {
            tokio::select! {
                r = &mut call => break r,
                () = &mut printer, if !printer_done => printer_done = true,
            }
        };
        if !printer_done {
            // The reply can overtake the pod's last event. After a pull the
            // `Pulled` event is certain to follow (the daemon sends it once it
            // has the image's size) unless the stream dropped it; any other
            // answer may have none to wait for. The wait ends with the stream.
            let pulled = result.as_ref().is_ok_and(|r| {
                matches!(&r.get_ref().result, Some(proto::ensure_image_response::Result::Ok(ok)) if ok.message.is_empty())
            });
            let wait = if pulled && !lagged.get() { PULLED_EVENT_WAIT } else { LAST_EVENT_WAIT };
            let _ = tokio::time::timeout(wait, &mut printer).await;
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
    use super::request;
    use crate::EnsureArgs;

    fn args(service_account: Option<&str>, tokens: Vec<(String, std::path::PathBuf)>) -> EnsureArgs {
        EnsureArgs {
            image: "registry.example.com/app:1".into(),
            policy: None,
            pod: ("ns".into(), "web".into()),
            pod_uid: "u1".into(),
            runtime_handler: String::new(),
            secrets: Vec::new(),
            priority: 0,
            deadline: None,
            service_account: service_account.map(str::to_string),
            service_account_tokens: tokens,
        }
    }

    #[test]
    fn a_service_account_and_its_tokens_from_files_reach_the_request() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "eyJ.token.sig\n").unwrap();
        let req = request(args(Some("builder"), vec![("sts.example.com".into(), file)])).unwrap();
        let sa = req.pod.unwrap().service_account.unwrap();
        assert_eq!(sa.name, "builder");
        assert_eq!(sa.tokens.get("sts.example.com").map(String::as_str), Some("eyJ.token.sig"));
        let none = request(args(None, Vec::new())).unwrap();
        assert!(none.pod.unwrap().service_account.is_none());
        let missing = request(args(Some("b"), vec![("a".into(), "/nonexistent/token".into())])).unwrap_err();
        assert!(missing.to_string().contains("--service-account-token /nonexistent/token"), "{missing}");
    }
}
