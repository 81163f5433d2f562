//! The README's main job until the daemon lands: one round of pull, list,
//! status and remove through the CRI gateway, printing what happened.

use std::io::Write;

use tokio::time::Instant;

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
    let listed = g.send(ListImages::default()).await.map_err(mailbox("list"))?.map_err(|e| AppError::cri("ListImages", e))?;
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
    let left = g.send(ListImages::default()).await.map_err(mailbox("list"))?.map_err(|e| AppError::cri("ListImages", e))?;
    writeln!(out, "list    {} image(s) left", left.len()).map_err(io)?;
    Ok(())
}

fn short(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    hex.get(..12).unwrap_or(hex)
}
