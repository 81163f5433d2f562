//! `imagectl cri …`: talks CRI to a runtime directly through imaged's CRI
//! gateway (like `crictl`'s image commands), without a daemon.

use std::io::{BufRead, Write};

use clap::Subcommand;
use imaged::actors::cri_gateway::{
    GetImageFsInfo, GetImageStatus, GetVersion, ListContainers, ListImages, PullImage, RemoveImage,
};
use imaged::domain::{AuthConfig, ImageSpec};
use imaged::error::AppError;

/// CRI commands (no daemon needed).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runtime name and versions.
    Version,
    /// List images.
    Images,
    /// Show one image (exit 1 when absent).
    Status {
        /// Image reference or id.
        image: String,
    },
    /// Pull an image.
    Pull {
        /// Image reference.
        image: String,
        /// Registry user name (the password is read from the first line of stdin).
        #[arg(long)]
        username: Option<String>,
    },
    /// Remove an image.
    Rmi {
        /// Image reference or id.
        image: String,
    },
    /// Image filesystem usage.
    Fsinfo,
    /// List containers (all states).
    Ps,
}

fn out(e: std::io::Error) -> AppError {
    AppError::Other(format!("writing output: {e}"))
}

/// Runs one CRI command; returns the exit code.
pub fn run(cfg: imaged::config::Config, command: Command) -> Result<u8, AppError> {
    let password = match &command {
        Command::Pull { username: Some(_), .. } => {
            let mut line = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut line)
                .map_err(|e| AppError::Usage(format!("reading the password from stdin: {e}")))?;
            Some(line.trim_end_matches(['\r', '\n']).to_string())
        }
        _ => None,
    };
    actix::System::new().block_on(async move {
        let rt = imaged::connect::runtime(&cfg).await?;
        let g = &rt.gateway;
        let closed = |_| AppError::Mailbox("CRI gateway".into());
        let mut o = std::io::stdout().lock();
        match command {
            Command::Version => {
                let v = g.send(GetVersion).await.map_err(closed)?.map_err(|e| AppError::cri("Version", e))?;
                writeln!(
                    o,
                    "RuntimeName: {}\nRuntimeVersion: {}\nRuntimeApiVersion: {}",
                    v.runtime_name, v.runtime_version, v.runtime_api_version
                )
                .map_err(out)?;
            }
            Command::Images => {
                let images =
                    g.send(ListImages::default()).await.map_err(closed)?.map_err(|e| AppError::cri("ListImages", e))?;
                writeln!(o, "{:<20} {:>12} {:<6} TAGS", "IMAGE ID", "SIZE", "PINNED").map_err(out)?;
                for i in images {
                    let id = i.id.strip_prefix("sha256:").unwrap_or(&i.id);
                    writeln!(
                        o,
                        "{:<20} {:>12} {:<6} {}",
                        id.get(..13).unwrap_or(id),
                        i.size,
                        i.pinned,
                        i.repo_tags.join(",")
                    )
                    .map_err(out)?;
                }
            }
            Command::Status { image } => {
                let st = g
                    .send(GetImageStatus { image: ImageSpec::new(image.clone()), verbose: false })
                    .await
                    .map_err(closed)?;
                match st.map_err(|e| AppError::cri(format!("ImageStatus {image}"), e))?.image {
                    Some(i) => writeln!(
                        o,
                        "id: {}\ntags: {}\ndigests: {}\nsize: {}\npinned: {}",
                        i.id,
                        i.repo_tags.join(","),
                        i.repo_digests.join(","),
                        i.size,
                        i.pinned
                    )
                    .map_err(out)?,
                    None => {
                        writeln!(o, "{image}: not present").map_err(out)?;
                        return Ok(1);
                    }
                }
            }
            Command::Pull { image, username } => {
                let auth = username.map(|u| AuthConfig::basic(registry_host(&image), u, password.unwrap_or_default()));
                let id = g
                    .send(PullImage { auth, ..PullImage::new(ImageSpec::new(image.clone())) })
                    .await
                    .map_err(closed)?
                    .map_err(|e| AppError::cri(format!("PullImage {image}"), e))?;
                writeln!(o, "Image is up to date for {id}").map_err(out)?;
            }
            Command::Rmi { image } => {
                g.send(RemoveImage { image: ImageSpec::new(image.clone()) })
                    .await
                    .map_err(closed)?
                    .map_err(|e| AppError::cri(format!("RemoveImage {image}"), e))?;
                writeln!(o, "Deleted: {image}").map_err(out)?;
            }
            Command::Fsinfo => {
                let fs = g.send(GetImageFsInfo).await.map_err(closed)?.map_err(|e| AppError::cri("ImageFsInfo", e))?;
                for f in fs.image_filesystems {
                    writeln!(
                        o,
                        "{} used_bytes={} inodes_used={}",
                        f.mountpoint,
                        f.used_bytes.unwrap_or(0),
                        f.inodes_used.unwrap_or(0)
                    )
                    .map_err(out)?;
                }
            }
            Command::Ps => {
                let cs = g
                    .send(ListContainers::default())
                    .await
                    .map_err(closed)?
                    .map_err(|e| AppError::cri("ListContainers", e))?;
                for c in cs {
                    writeln!(o, "{} {:?} {} {}", c.id, c.state, c.image.image, c.image_ref).map_err(out)?;
                }
            }
        }
        Ok(0)
    })
}

/// The registry host of a reference (`docker.io` when it names none).
fn registry_host(image: &str) -> String {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => first.to_string(),
        _ => "docker.io".to_string(),
    }
}
