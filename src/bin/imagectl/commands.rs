//! The subcommands that talk to the daemon: one method per subcommand,
//! each making its RPC and printing the answer ([`crate::print`]). `ensure`,
//! which also follows the pod's events, is in [`crate::ensure`].

use std::io::Write;
use std::path::PathBuf;

use imaged::api::{ImagedClient, proto};
use imaged::domain::reference::same_image;
use imaged::error::AppError;
use tonic::transport::Channel;

use crate::output::{Format, out};
use crate::print;
use crate::{EXIT_ENSURE_FAILED, PrefetchArgs};

/// A gRPC status as the error to report, with its exit code.
pub fn rpc(what: &str, s: tonic::Status) -> AppError {
    match s.code() {
        tonic::Code::InvalidArgument | tonic::Code::OutOfRange => {
            AppError::Usage(format!("{what}: the daemon rejected the request: {}", s.message()))
        }
        // The daemon answered: the runtime is what is not there (exit 1,
        // as any failure of the runtime's).
        tonic::Code::Unavailable if unavailable_what(&s) == Some(imaged::api::UNAVAILABLE_RUNTIME) => {
            AppError::Other(format!("{what}: imaged cannot reach the CRI runtime: {}", s.message()))
        }
        tonic::Code::Unavailable => AppError::Unavailable(format!("{what}: {}", s.message())),
        // tonic's word for a connection that broke under the call (the
        // daemon killed or gone): no answer came, as with no daemon.
        // The connection's first bytes never came (see `imaged::api::client`).
        tonic::Code::Unknown if s.message().starts_with("transport error") && timed_out(&s) => {
            AppError::Unavailable(format!(
                "{what}: no answer within {:?}: something accepted the connection but does not speak gRPC (a hung process?)",
                imaged::api::CLIENT_CONNECT_TIMEOUT
            ))
        }
        // A stream's body broken off (the daemon killed while it streamed).
        tonic::Code::Unknown
            if s.message().starts_with("transport error") || s.message().starts_with("h2 protocol error") =>
        {
            AppError::Unavailable(format!("{what}: the connection to imaged was lost: {}", s.message()))
        }
        _ => AppError::Other(format!("{what}: {}: {}", s.code(), s.message())),
    }
}

/// What an `Unavailable` the daemon sent says is unavailable
/// (`imaged::api::UNAVAILABLE_WHAT`); `None` when the daemon did not send
/// it (the transport's: no daemon answering).
fn unavailable_what(s: &tonic::Status) -> Option<&str> {
    s.metadata().get(imaged::api::UNAVAILABLE_WHAT).and_then(|v| v.to_str().ok())
}

/// Whether `s` comes of an I/O timeout (the connect timeout).
fn timed_out(s: &tonic::Status) -> bool {
    let mut e = std::error::Error::source(s);
    while let Some(cause) = e {
        if cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut) {
            return true;
        }
        e = cause.source();
    }
    false
}

/// The largest `--secret` manifest read: Kubernetes' limit on a Secret
/// (1 MiB).
pub const MAX_SECRET_FILE_BYTES: u64 = 1024 * 1024;

/// The pull secret manifests named by `--secret`: regular files of at most
/// [`MAX_SECRET_FILE_BYTES`] each (a device such as `/dev/zero`, a FIFO or
/// a larger file is refused naming the file and the limit).
pub fn read_secrets(files: &[PathBuf]) -> Result<Vec<Vec<u8>>, AppError> {
    files
        .iter()
        .map(|f| {
            let bytes = read_bounded(f, "--secret", MAX_SECRET_FILE_BYTES)?;
            // Checked here too, so the error names the file (the daemon's
            // names its index). The error never holds the secret's values.
            imaged::credentials::PullSecret::from_manifest(&bytes)
                .map_err(|e| AppError::Usage(format!("--secret {}: {e}", f.display())))?;
            Ok(bytes)
        })
        .collect()
}

/// Reads `path` (named `flag` in errors) if it is a regular file of at
/// most `limit` bytes ([`imaged::files::read`]).
pub fn read_bounded(path: &std::path::Path, flag: &str, limit: u64) -> Result<Vec<u8>, AppError> {
    imaged::files::read(path, limit).map_err(|e| {
        let e = match e {
            imaged::files::InputFileError::TooLarge { limit } => {
                format!("larger than {limit} bytes (the limit of a Kubernetes Secret)")
            }
            other => other.to_string(),
        };
        AppError::Usage(format!("{flag} {}: {e}", path.display()))
    })
}

/// `--deadline` as the API's `deadline_ms` (0: none).
pub fn deadline_ms(deadline: Option<std::time::Duration>) -> u64 {
    deadline.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Which events `imagectl events` prints: those of one pod (by
/// NAMESPACE/NAME or UID) or image, or all.
#[derive(Debug, Default)]
pub struct EventFilter {
    /// `--pod`: (namespace, name).
    pub pod: Option<(String, String)>,
    /// `--pod-uid`.
    pub pod_uid: Option<String>,
    /// `--image`, as the pod spec named it (events) or normalised (pull phases).
    pub image: Option<String>,
}

impl EventFilter {
    /// Whether `e` passes every filter given (a lag notice always does).
    pub fn matches(&self, e: &proto::Event) -> bool {
        match &e.kind {
            Some(proto::event::Kind::ImageEvent(ie)) => {
                self.pod.as_ref().is_none_or(|(ns, name)| ie.namespace == *ns && ie.pod_name == *name)
                    && self.pod_uid.as_ref().is_none_or(|uid| ie.pod_uid == *uid)
                    && self.image.as_ref().is_none_or(|i| same_image(&ie.image, i))
            }
            Some(proto::event::Kind::PullPhase(p)) => {
                let pod = p.pod.as_ref();
                self.pod.as_ref().is_none_or(|(ns, name)| pod.is_some_and(|r| r.namespace == *ns && r.name == *name))
                    && self.pod_uid.as_ref().is_none_or(|uid| pod.is_some_and(|r| r.uid == *uid))
                    && self.image.as_ref().is_none_or(|i| same_image(&p.image, i))
            }
            Some(proto::event::Kind::Lagged(_)) => true,
            None => false,
        }
    }
}

/// What every daemon subcommand works with: the client, and where and how
/// to print the answer. Each method returns the exit code.
pub struct Session<W> {
    /// The daemon's API.
    pub client: ImagedClient<Channel>,
    /// How answers are printed (`-o`).
    pub format: Format,
    /// Where the answer goes (stdout).
    pub o: W,
}

impl<W: Write> Session<W> {
    /// `imagectl images`.
    pub async fn images(&mut self) -> Result<u8, AppError> {
        // In batches: one ListImages answer of a node with a few hundred
        // thousand images is over the API's 64 MiB message limit. A daemon
        // from before StreamImages answers the one list.
        let images = match self.client.stream_images(proto::ListImagesRequest {}).await {
            Ok(answer) => {
                let mut stream = answer.into_inner();
                let mut all = proto::ListImagesResponse::default();
                while let Some(batch) = stream.message().await.map_err(|s| rpc("StreamImages", s))? {
                    all.images.extend(batch.images);
                }
                all
            }
            Err(s) if s.code() == tonic::Code::Unimplemented => self
                .client
                .list_images(proto::ListImagesRequest {})
                .await
                .map_err(|s| rpc("ListImages", s))?
                .into_inner(),
            Err(s) => return Err(rpc("StreamImages", s)),
        };
        print::print_images(&images, self.format, &mut self.o)?;
        Ok(0)
    }

    /// `imagectl gc [--dry-run] [--delete-unused]`.
    pub async fn gc(&mut self, dry_run: bool, delete_unused: bool) -> Result<u8, AppError> {
        let report = if delete_unused {
            self.client.delete_unused_images(proto::DeleteUnusedImagesRequest { dry_run }).await
        } else {
            self.client.garbage_collect(proto::GarbageCollectRequest { dry_run }).await
        }
        .map_err(|s| rpc("GarbageCollect", s))?
        .into_inner();
        print::print_gc(&report, self.format, &mut self.o)?;
        // The run removed what it could and still failed: the report above
        // says what and why; the exit code says it failed.
        Ok(u8::from(!report.target_missed.is_empty()))
    }

    /// `imagectl events [--follow] [--pod NAMESPACE/NAME] [--pod-uid UID] [--image IMAGE]`.
    pub async fn events(&mut self, follow: bool, only: &EventFilter) -> Result<u8, AppError> {
        let mut stream = self
            .client
            .watch_events(proto::WatchEventsRequest { recent: true, follow })
            .await
            .map_err(|s| rpc("WatchEvents", s))?
            .into_inner();
        while let Some(e) = stream.message().await.map_err(|s| rpc("WatchEvents", s))? {
            if only.matches(&e) {
                print::print_event(&e, self.format, &mut self.o)?;
                self.o.flush().map_err(out)?;
            }
        }
        Ok(0)
    }

    /// `imagectl backoff clear [--pod-uid UID] [--image IMAGE]`.
    pub async fn backoff_clear(&mut self, pod_uid: Option<String>, image: Option<String>) -> Result<u8, AppError> {
        let cleared = self
            .client
            .clear_backoff(proto::ClearBackoffRequest {
                pod_uid: pod_uid.unwrap_or_default(),
                image: image.unwrap_or_default(),
            })
            .await
            .map_err(|s| rpc("ClearBackoff", s))?
            .into_inner();
        print::print_cleared(cleared, self.format, &mut self.o)?;
        Ok(0)
    }

    /// `imagectl backoff list`.
    pub async fn backoff_list(&mut self) -> Result<u8, AppError> {
        let s = self.get_status().await?;
        print::print_backoffs(&s.backoffs, self.format, &mut self.o)?;
        Ok(0)
    }

    /// `imagectl prefetch IMAGE…`: one PrefetchImage call per image, all at
    /// once; exit 2 when one of them failed.
    pub async fn prefetch(&mut self, args: PrefetchArgs) -> Result<u8, AppError> {
        let PrefetchArgs { images, secrets, priority, runtime_handler, deadline, wait } = args;
        let pull_secrets = read_secrets(&secrets)?;
        let calls = images.iter().map(|image| {
            let mut c = self.client.clone();
            let req = proto::PrefetchImageRequest {
                image: image.clone(),
                runtime_handler: runtime_handler.clone(),
                pull_secrets: pull_secrets.clone(),
                priority,
                deadline_ms: deadline_ms(deadline),
                wait,
            };
            async move { c.prefetch_image(req).await }
        });
        let mut answers = Vec::new();
        for (image, r) in images.iter().zip(futures_util::future::join_all(calls).await) {
            answers.push((image.as_str(), r.map_err(|s| rpc("PrefetchImage", s))?.into_inner()));
        }
        print::print_prefetch(&answers, self.format, &mut self.o)?;
        let failed = answers.iter().any(|(_, a)| a.state == "failed");
        Ok(if failed { EXIT_ENSURE_FAILED } else { 0 })
    }

    /// `imagectl pulls [--watch [--interval D]]`.
    pub async fn pulls(&mut self, watch: Option<std::time::Duration>) -> Result<u8, AppError> {
        let Some(every) = watch else {
            let pulls =
                self.client.list_pulls(proto::ListPullsRequest {}).await.map_err(|s| rpc("ListPulls", s))?.into_inner();
            print::print_pulls(&pulls, self.format, &mut self.o)?;
            return Ok(0);
        };
        let interval_ms = u32::try_from(every.as_millis()).unwrap_or(u32::MAX);
        let mut stream = self
            .client
            .watch_pulls(proto::WatchPullsRequest { interval_ms })
            .await
            .map_err(|s| rpc("WatchPulls", s))?
            .into_inner();
        while let Some(pulls) = stream.message().await.map_err(|s| rpc("WatchPulls", s))? {
            print::print_pulls_watched(&pulls, self.format, &mut self.o)?;
            self.o.flush().map_err(out)?;
        }
        Ok(0)
    }

    /// `imagectl status`.
    pub async fn status(&mut self) -> Result<u8, AppError> {
        let s = self.get_status().await?;
        print::print_status(&s, self.format, &mut self.o)?;
        Ok(0)
    }

    async fn get_status(&mut self) -> Result<proto::StatusResponse, AppError> {
        Ok(self.client.get_status(proto::GetStatusRequest {}).await.map_err(|s| rpc("GetStatus", s))?.into_inner())
    }
}

#[cfg(test)]
#[allow(clippy::pedantic)] // test code: pedantic lints are for what ships
mod tests {
    use super::*;

    #[test]
    fn a_broken_connection_is_no_daemon_answering_and_other_errors_keep_their_code() {
        let lost = rpc("EnsureImage", tonic::Status::unknown("transport error"));
        assert!(
            matches!(&lost, AppError::Unavailable(m) if m == "EnsureImage: the connection to imaged was lost: transport error"),
            "{lost:?}"
        );
        let other = rpc("EnsureImage", tonic::Status::unknown("something else"));
        assert!(matches!(&other, AppError::Other(m) if m.starts_with("EnsureImage: ")), "{other:?}");
        let bad = rpc("EnsureImage", tonic::Status::invalid_argument("image: must not be empty"));
        assert!(matches!(bad, AppError::Usage(_)));
        // A stream's body broken off by a killed daemon.
        let cut = rpc("WatchEvents", tonic::Status::unknown("h2 protocol error: error reading a body from connection"));
        assert!(
            matches!(&cut, AppError::Unavailable(m) if m.starts_with("WatchEvents: the connection to imaged was lost: h2 protocol error")),
            "{cut:?}"
        );
    }

    #[test]
    fn an_unavailable_runtime_the_daemon_reports_is_not_an_absent_daemon() {
        let sent = |what: &'static str| {
            let mut md = tonic::metadata::MetadataMap::new();
            md.insert(imaged::api::UNAVAILABLE_WHAT, tonic::metadata::MetadataValue::from_static(what));
            tonic::Status::with_metadata(tonic::Code::Unavailable, "rpc error: code = Unavailable desc = gone", md)
        };
        let runtime = rpc("StreamImages", sent(imaged::api::UNAVAILABLE_RUNTIME));
        assert!(
            matches!(&runtime, AppError::Other(m) if m == "StreamImages: imaged cannot reach the CRI runtime: rpc error: code = Unavailable desc = gone"),
            "{runtime:?}"
        );
        assert_eq!(runtime.exit_code(), 1);
        // Shutting down, or the transport's own (no such key): no daemon, 69.
        let stopping = rpc("StreamImages", sent(imaged::api::UNAVAILABLE_SHUTTING_DOWN));
        assert!(matches!(stopping, AppError::Unavailable(_)), "{stopping:?}");
        let transport = rpc("StreamImages", tonic::Status::unavailable("error trying to connect"));
        assert!(matches!(transport, AppError::Unavailable(_)), "{transport:?}");
    }

    #[test]
    fn secret_files_are_bounded_and_must_be_regular() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: regcred\ntype: kubernetes.io/dockerconfigjson\n\
                        stringData:\n  .dockerconfigjson: '{\"auths\":{\"r.example\":{\"auth\":\"dTpodW50ZXIy\"}}}'\n";
        let ok = dir.path().join("ok.yaml");
        std::fs::write(&ok, manifest).unwrap();
        assert_eq!(read_secrets(std::slice::from_ref(&ok)).unwrap(), vec![manifest.as_bytes().to_vec()]);

        // A manifest that is not one is refused naming the file, not its index.
        let junk = dir.path().join("junk.yaml");
        std::fs::write(&junk, "metadata: {name: s\n  password: hunter2").unwrap();
        let err = read_secrets(&[ok.clone(), junk.clone()]).unwrap_err();
        assert!(matches!(err, AppError::Usage(_)), "{err:?}");
        let err = err.to_string();
        assert!(err.starts_with(&format!("--secret {}: Secret manifest", junk.display())), "{err}");
        assert!(!err.contains("hunter2"), "{err}");

        let big = dir.path().join("big.yaml");
        let pad = |n: usize| format!("#{}\n{manifest}", "a".repeat(n - manifest.len() - 2));
        std::fs::write(&big, pad(MAX_SECRET_FILE_BYTES as usize + 1)).unwrap();
        let err = read_secrets(std::slice::from_ref(&big)).unwrap_err().to_string();
        assert!(err.contains("big.yaml") && err.contains("1048576 bytes"), "{err}");
        // Exactly at the limit is fine.
        std::fs::write(&big, pad(MAX_SECRET_FILE_BYTES as usize)).unwrap();
        assert!(read_secrets(std::slice::from_ref(&big)).is_ok());

        let err = read_secrets(&[PathBuf::from("/dev/zero")]).unwrap_err().to_string();
        assert!(err.contains("--secret /dev/zero: not a regular file"), "{err}");
        let err = read_secrets(&[dir.path().to_path_buf()]).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }
}
