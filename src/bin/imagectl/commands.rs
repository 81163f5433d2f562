//! The subcommands that talk to the daemon: one method per subcommand,
//! each making its RPC and printing the answer ([`crate::print`]). `ensure`,
//! which also follows the pod's events, is in [`crate::ensure`].

use std::io::Write;
use std::path::PathBuf;

use imaged::api::{ImagedClient, proto};
use imaged::error::AppError;
use tonic::transport::Channel;

use crate::print::{self, out};
use crate::{EXIT_ENSURE_FAILED, PrefetchArgs};

/// A gRPC status as the error to report, with its exit code.
pub fn rpc(what: &str, s: tonic::Status) -> AppError {
    match s.code() {
        tonic::Code::InvalidArgument | tonic::Code::OutOfRange => {
            AppError::Usage(format!("{what}: the daemon rejected the request: {}", s.message()))
        }
        tonic::Code::Unavailable => AppError::Unavailable(format!("{what}: {}", s.message())),
        _ => AppError::Other(format!("{what}: {}: {}", s.code(), s.message())),
    }
}

/// The pull secret manifests named by `--secret`.
pub fn read_secrets(files: &[PathBuf]) -> Result<Vec<Vec<u8>>, AppError> {
    files
        .iter()
        .map(|f| {
            std::fs::read(f).map_err(|e| AppError::Usage(format!("--secret {}: reading the file: {e}", f.display())))
        })
        .collect()
}

/// `--deadline` as the API's `deadline_ms` (0: none).
pub fn deadline_ms(deadline: Option<std::time::Duration>) -> u64 {
    deadline.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What every daemon subcommand works with: the client, and where and how
/// to print the answer. Each method returns the exit code.
pub struct Session<W> {
    /// The daemon's API.
    pub client: ImagedClient<Channel>,
    /// `-o json` rather than tables.
    pub json: bool,
    /// Where the answer goes (stdout).
    pub o: W,
}

impl<W: Write> Session<W> {
    /// `imagectl images`.
    pub async fn images(&mut self) -> Result<u8, AppError> {
        let images = self
            .client
            .list_images(proto::ListImagesRequest {})
            .await
            .map_err(|s| rpc("ListImages", s))?
            .into_inner()
            .images;
        print::print_images(&images, self.json, &mut self.o)?;
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
        print::print_gc(&report, self.json, &mut self.o)?;
        Ok(0)
    }

    /// `imagectl events [--follow]`.
    pub async fn events(&mut self, follow: bool) -> Result<u8, AppError> {
        let mut stream = self
            .client
            .watch_events(proto::WatchEventsRequest { recent: true, follow })
            .await
            .map_err(|s| rpc("WatchEvents", s))?
            .into_inner();
        while let Some(e) = stream.message().await.map_err(|s| rpc("WatchEvents", s))? {
            print::print_event(&e, self.json, &mut self.o)?;
            self.o.flush().map_err(out)?;
        }
        Ok(0)
    }

    /// `imagectl backoff clear [--pod UID] [--image IMAGE]`.
    pub async fn backoff_clear(&mut self, pod: Option<String>, image: Option<String>) -> Result<u8, AppError> {
        let cleared = self
            .client
            .clear_backoff(proto::ClearBackoffRequest {
                pod_uid: pod.unwrap_or_default(),
                image: image.unwrap_or_default(),
            })
            .await
            .map_err(|s| rpc("ClearBackoff", s))?
            .into_inner()
            .cleared;
        print::print_cleared(cleared, self.json, &mut self.o)?;
        Ok(0)
    }

    /// `imagectl backoff list`.
    pub async fn backoff_list(&mut self) -> Result<u8, AppError> {
        let s = self.get_status().await?;
        print::print_backoffs(&s.backoffs, self.json, &mut self.o)?;
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
        print::print_prefetch(&answers, self.json, &mut self.o)?;
        let failed = answers.iter().any(|(_, a)| a.state == "failed");
        Ok(if failed { EXIT_ENSURE_FAILED } else { 0 })
    }

    /// `imagectl pulls`.
    pub async fn pulls(&mut self) -> Result<u8, AppError> {
        let pulls = self
            .client
            .list_pulls(proto::ListPullsRequest {})
            .await
            .map_err(|s| rpc("ListPulls", s))?
            .into_inner()
            .pulls;
        print::print_pulls(&pulls, self.json, &mut self.o)?;
        Ok(0)
    }

    /// `imagectl status`.
    pub async fn status(&mut self) -> Result<u8, AppError> {
        let s = self.get_status().await?;
        print::print_status(&s, self.json, &mut self.o)?;
        Ok(0)
    }

    async fn get_status(&mut self) -> Result<proto::StatusResponse, AppError> {
        Ok(self.client.get_status(proto::GetStatusRequest {}).await.map_err(|s| rpc("GetStatus", s))?.into_inner())
    }
}
