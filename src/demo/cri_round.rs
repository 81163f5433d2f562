//! `imaged demo --cri-round`: one round of pull, list, status and remove
//! through the CRI gateway, then the kubelet's `EnsureImageExists` flow with
//! its events, then a GC plan (dry run) with every image's verdict, printing
//! what happened. Works against any runtime endpoint.

use std::io::Write;

use actix::prelude::*;
use tokio::time::Instant;

use crate::config::Config;
use crate::domain::pull_policy::PullPolicy;
use crate::ensure::{EnsureImageRequest, ImageManager};
use crate::events::ImageEvent;

use crate::actors::cri_gateway::{GetImageFsInfo, GetImageStatus, ListImages, PullImage, RemoveImage};
use crate::domain::ImageSpec;
use crate::error::AppError;
use crate::runtime::ConnectedRuntime;

fn io(e: std::io::Error) -> AppError {
    AppError::Other(format!("writing output: {e}"))
}

/// Runs the round against `rt`, pulling `images` and removing them again.
pub async fn run(rt: &ConnectedRuntime, images: &[String], out: &mut impl Write) -> Result<(), AppError> {
    let g = &rt.gateway;
    let mailbox = |what: &str| {
        let what = what.to_string();
        move |_| AppError::Mailbox(what)
    };
    writeln!(
        out,
        "runtime: {} {} (CRI {}) at {}",
        rt.version.runtime_name, rt.version.runtime_version, rt.version.runtime_api_version, rt.endpoint
    )
    .map_err(io)?;
    for image in images {
        let spec = ImageSpec::new(image.clone());
        let before = g.send(GetImageStatus { image: spec.clone(), verbose: false }).await.map_err(mailbox("status"))?;
        let present = before.map_err(|e| AppError::cri(format!("ImageStatus {image}"), e))?.image.is_some();
        writeln!(out, "status  {image}: {}", if present { "present" } else { "absent" }).map_err(io)?;
        let t = Instant::now();
        let id = g
            .send(PullImage::new(spec.clone()))
            .await
            .map_err(mailbox("pull"))?
            .map_err(|e| AppError::cri(format!("PullImage {image}"), e))?;
        writeln!(out, "pull    {image}: {id} in {}ms", t.elapsed().as_millis()).map_err(io)?;
    }
    let listed =
        g.send(ListImages::default()).await.map_err(mailbox("list"))?.map_err(|e| AppError::cri("ListImages", e))?;
    writeln!(out, "list    {} image(s)", listed.len()).map_err(io)?;
    for img in &listed {
        writeln!(out, "        {} {} bytes {}", short(&img.id), img.size, img.repo_tags.join(",")).map_err(io)?;
    }
    let fs = g.send(GetImageFsInfo).await.map_err(mailbox("fsinfo"))?.map_err(|e| AppError::cri("ImageFsInfo", e))?;
    for f in &fs.image_filesystems {
        writeln!(out, "fsinfo  {}: {} bytes used", f.mountpoint, f.used_bytes.unwrap_or(0)).map_err(io)?;
    }
    for image in images {
        g.send(RemoveImage { image: ImageSpec::new(image.clone()) })
            .await
            .map_err(mailbox("remove"))?
            .map_err(|e| AppError::cri(format!("RemoveImage {image}"), e))?;
        writeln!(out, "remove  {image}: done").map_err(io)?;
    }
    let left =
        g.send(ListImages::default()).await.map_err(mailbox("list"))?.map_err(|e| AppError::cri("ListImages", e))?;
    writeln!(out, "list    {} image(s) left", left.len()).map_err(io)?;
    Ok(())
}

/// Prints image events as they come.
struct EventPrinter;

impl Actor for EventPrinter {
    type Context = Context<Self>;
}

impl Handler<ImageEvent> for EventPrinter {
    type Result = ();
    fn handle(&mut self, e: ImageEvent, _: &mut Self::Context) {
        println!(
            "event   {:<7} {:<17} {}/{}: {}",
            e.event_type.to_string(),
            e.reason.to_string(),
            e.object.namespace,
            e.object.pod_name,
            e.message
        );
    }
}

/// The `EnsureImageExists` round: a pull, a present image, a missing image
/// twice (the second time in back-off), printing events and results.
pub async fn run_ensure(
    cfg: &Config,
    rt: &ConnectedRuntime,
    image: &str,
    out: &mut impl Write,
) -> Result<(), AppError> {
    let node = crate::runtime::node_credentials(cfg)?;
    let manager = ImageManager::start(rt.gateway.clone(), &cfg.pull, &cfg.backoff, cfg.ensure.clone())
        .await
        .map_err(|_| AppError::Mailbox("CRI gateway".into()))?
        .with_pull_records(crate::pull_records::PullRecords::in_memory(cfg.verification.clone()))
        .with_node_credentials(node);
    manager.events().subscribe(EventPrinter.start().recipient());
    let missing = "docker.io/library/does-not-exist:1.0";
    let steps = [
        ("demo-1", image, PullPolicy::IfNotPresent),
        ("demo-2", image, PullPolicy::IfNotPresent),
        ("demo-1", missing, PullPolicy::IfNotPresent),
        ("demo-1", missing, PullPolicy::IfNotPresent),
    ];
    for (pod, img, policy) in steps {
        let mut req = EnsureImageRequest::new(format!("uid-{pod}"), img, policy);
        req.pod.namespace = "default".into();
        req.pod.name = pod.into();
        let result = manager.ensure_image_exists(&req).await;
        // Let the event printer catch up so output stays in order.
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        match result {
            Ok(ok) => {
                writeln!(out, "ensure  {pod} {img} ({policy:?}): ok, image ref {}", short(&ok.image_ref)).map_err(io)?
            }
            Err(e) => writeln!(out, "ensure  {pod} {img} ({policy:?}): {}: {}", e.kind, e.message).map_err(io)?,
        }
    }
    Ok(())
}

fn short(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    hex.get(..12).unwrap_or(hex)
}

/// The GC round: pulls the demo catalogue's public images, then plans a
/// garbage collection (dry run) and prints every image with its verdict.
pub async fn run_gc(cfg: &Config, rt: &ConnectedRuntime, out: &mut impl Write) -> Result<(), AppError> {
    use crate::actors::cri_gateway::PullImage;
    use crate::actors::gc_executor::DeleteUnusedImages;
    use crate::events::EventSink;
    use crate::gc::capacity::CapacitySource;
    use crate::gc::hints::InUseHints;
    use crate::gc_service::GcService;

    for image in ["busybox:1.36", "nginx:1.27", "redis:7", "registry.k8s.io/pause:3.10"] {
        rt.gateway
            .send(PullImage::new(ImageSpec::new(image)))
            .await
            .map_err(|_| AppError::Mailbox("CRI gateway".into()))?
            .map_err(|e| AppError::cri(format!("PullImage {image}"), e))?;
    }
    let capacity = match &rt.embedded {
        Some(e) => e.capacity_source(),
        None => CapacitySource::Statvfs,
    };
    // The demo's images were pulled a moment ago: plan as if they were old enough.
    let mut settings = cfg.gc.clone();
    settings.min_age = std::time::Duration::ZERO;
    let svc = GcService::start(&rt.gateway, &settings, capacity, None, InUseHints::default(), EventSink::default());
    let plan = svc
        .executor
        .send(DeleteUnusedImages { dry_run: true })
        .await
        .map_err(|_| AppError::Mailbox("GC executor".into()))?
        .map_err(|e| AppError::Other(format!("GC plan: {e}")))?;
    writeln!(out, "gc      dry run of DeleteUnusedImages (sandbox image {}):", settings.sandbox_image).map_err(io)?;
    for e in &plan.entries {
        writeln!(out, "        {} {:>10} bytes  {}  {}", short(&e.id), e.size, e.repo_tags.join(","), e.explain())
            .map_err(io)?;
    }
    writeln!(out, "gc      would free {} bytes", plan.bytes_expected).map_err(io)?;
    Ok(())
}
