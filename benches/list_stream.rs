//! Peak memory of a detection over 100 000 images: listed with one
//! `ListImages` answer, or streamed with `StreamImages` (KEP-5825), through
//! imaged's CRI client (the calls the gateway makes for the detector and
//! the cache refresher) and then `Records::detect` over the list.
//!
//! The runtime is a child process (this binary, re-run with
//! `IMAGED_BENCH_SERVE=<socket>`) serving both calls over one prepared list
//! in batches of 512, so only imaged's side is measured: a counting global
//! allocator gives the peak of live heap bytes during each run (its peak
//! reset before it). Prints:
//!
//! - `list_images_100k_listing_peak_mb`, `stream_images_100k_listing_peak_mb`:
//!   peak heap while the list is received and converted, beyond what was
//!   live before, and `stream_vs_list_listing_peak_ratio` (lower is better);
//! - `list_images_100k_peak_mb`, `stream_images_100k_peak_mb`,
//!   `stream_vs_list_peak_ratio`: the same over the whole detection
//!   (listing, then `Records::detect`, whose own records can dominate);
//! - `list_result_mb`: the listed images alone (what any detection keeps).
//!
//! Peaks count allocations, so the profile barely changes them: `cargo
//! bench --bench list_stream` (or `--profile dev` to skip a release build).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // bench code: a failed unwrap is a failed run

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use imaged::cri::proto as pb;
use imaged::cri::proto::image_service_server::{ImageService, ImageServiceServer};
use imaged::cri::{CriClient, CriEndpoint};
use imaged::gc::detect::Records;
use tonic::{Request, Response, Status};

const IMAGES: usize = 100_000;
const BATCH: usize = 512;

#[path = "common/mem.rs"]
mod mem;

#[global_allocator]
static ALLOC: mem::Counting = mem::Counting;

/// 64-hex ids, two tags of about 45 characters and a digest, as on a busy node.
fn images() -> Vec<pb::Image> {
    (0..IMAGES)
        .map(|i| {
            let repo = format!("reg.example.com/team{:02}/service-{:05}", i % 100, i);
            pb::Image {
                id: format!("sha256:{i:064x}"),
                repo_tags: vec![format!("{repo}:v1.2.{}", i % 1000), format!("{repo}:latest")],
                repo_digests: vec![format!("{repo}@sha256:{:064x}", i * 7 + 1)],
                size: 10 << 20,
                ..pb::Image::default()
            }
        })
        .collect()
}

struct Server {
    images: std::sync::Arc<Vec<pb::Image>>,
}

type Batches = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::StreamImagesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ImageService for Server {
    type StreamImagesStream = Batches;

    async fn list_images(&self, _: Request<pb::ListImagesRequest>) -> Result<Response<pb::ListImagesResponse>, Status> {
        Ok(Response::new(pb::ListImagesResponse { images: self.images.to_vec() }))
    }

    async fn stream_images(&self, _: Request<pb::StreamImagesRequest>) -> Result<Response<Batches>, Status> {
        let images = self.images.clone();
        let n = images.len().div_ceil(BATCH);
        let stream = tokio_stream::iter((0..n).map(move |b| {
            let end = ((b + 1) * BATCH).min(images.len());
            Ok(pb::StreamImagesResponse { images: images[b * BATCH..end].to_vec() })
        }));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn image_status(
        &self,
        _: Request<pb::ImageStatusRequest>,
    ) -> Result<Response<pb::ImageStatusResponse>, Status> {
        Err(Status::unimplemented("bench"))
    }

    async fn pull_image(&self, _: Request<pb::PullImageRequest>) -> Result<Response<pb::PullImageResponse>, Status> {
        Err(Status::unimplemented("bench"))
    }

    async fn remove_image(
        &self,
        _: Request<pb::RemoveImageRequest>,
    ) -> Result<Response<pb::RemoveImageResponse>, Status> {
        Err(Status::unimplemented("bench"))
    }

    async fn image_fs_info(
        &self,
        _: Request<pb::ImageFsInfoRequest>,
    ) -> Result<Response<pb::ImageFsInfoResponse>, Status> {
        Err(Status::unimplemented("bench"))
    }
}

/// The child: serves the list on `socket` until killed.
fn serve(socket: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        let server = Server { images: std::sync::Arc::new(images()) };
        tonic::transport::Server::builder()
            .add_service(ImageServiceServer::new(server).max_encoding_message_size(usize::MAX))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await
            .unwrap();
    });
}

fn mb(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// One detection's peaks of live heap bytes beyond those live at its start.
struct Peaks {
    /// While listing (the answer received and converted).
    listing: usize,
    /// Over the whole detection (listing, then `Records::detect`).
    detection: usize,
    /// What the listed images hold once listed.
    held: usize,
}

/// One detection: list (streamed or not), then detect over the list.
async fn detection(client: &CriClient, stream: bool) -> Peaks {
    let base = mem::live();
    mem::reset_peak();
    let images = if stream {
        client.stream_images(None, None).await.expect("stream")
    } else {
        client.list_images(None, None).await.expect("list")
    };
    let listing = mem::peak_bytes() - base;
    let held = mem::live() - base;
    let mut records = Records::default();
    let now = UNIX_EPOCH + Duration::from_secs(1_780_000_000);
    let diff = records.detect(&images, &HashSet::new(), now.max(SystemTime::UNIX_EPOCH));
    std::hint::black_box(&diff);
    assert_eq!(images.len(), IMAGES);
    drop((images, records, diff));
    Peaks { listing, detection: mem::peak_bytes() - base, held }
}

fn main() {
    if let Ok(socket) = std::env::var("IMAGED_BENCH_SERVE") {
        serve(&socket);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("runtime.sock");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .env("IMAGED_BENCH_SERVE", &socket)
        .spawn()
        .expect("the runtime process starts");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        for _ in 0..600 {
            if socket.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let client = CriClient::new(&CriEndpoint::Unix(socket.clone()), Duration::from_secs(10)).unwrap();
        // A warm-up of each (connection, buffers), then the measured runs.
        detection(&client, false).await;
        detection(&client, true).await;
        let mut list = Vec::new();
        let mut stream = Vec::new();
        for _ in 0..3 {
            list.push(detection(&client, false).await);
            stream.push(detection(&client, true).await);
        }
        let median = |runs: &[Peaks], f: fn(&Peaks) -> usize| {
            let mut v: Vec<usize> = runs.iter().map(f).collect();
            v.sort_unstable();
            v[v.len() / 2]
        };
        let (ll, sl) = (median(&list, |p| p.listing), median(&stream, |p| p.listing));
        let (ld, sd) = (median(&list, |p| p.detection), median(&stream, |p| p.detection));
        println!("list_images_100k_listing_peak_mb: {:.1}", mb(ll));
        println!("stream_images_100k_listing_peak_mb: {:.1}", mb(sl));
        println!("stream_vs_list_listing_peak_ratio: {:.2}", sl as f64 / ll as f64);
        println!("list_images_100k_peak_mb: {:.1}", mb(ld));
        println!("stream_images_100k_peak_mb: {:.1}", mb(sd));
        println!("stream_vs_list_peak_ratio: {:.2}", sd as f64 / ld as f64);
        println!("list_result_mb: {:.1}", mb(median(&list, |p| p.held)));
    });
    let _ = child.kill();
    let _ = child.wait();
}
