//! `imagectl cri …`: talks CRI to a runtime directly through imaged's CRI
//! gateway (like `crictl`'s image commands), without a daemon.

use std::io::{BufRead, Write};

use actix::{Addr, Handler, Message};
use clap::Subcommand;
use imaged::actors::cri_gateway::{
    CriGatewayActor, GetImageFsInfo, GetImageStatus, GetVersion, ListContainers, ListImages, PullImage, RemoveImage,
};
use imaged::cri::CriError;
use imaged::domain::{AuthConfig, ImageSpec};
use imaged::error::AppError;

use crate::print::out;

type Gateway = Addr<CriGatewayActor>;

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

/// Runs one CRI command, against the runtime or, with `image_endpoint`,
/// against that ImageService only; returns the exit code.
pub fn run(cfg: imaged::config::Config, image_endpoint: Option<&str>, command: Command) -> Result<u8, AppError> {
    let image_endpoint = image_endpoint
        .map(|e| {
            e.parse::<imaged::cri::CriEndpoint>()
                .map_err(|err| AppError::Usage(format!("--image-endpoint {e:?}: {err}")))
        })
        .transpose()?;
    if image_endpoint.is_some() && matches!(command, Command::Version | Command::Ps) {
        return Err(AppError::Usage(
            "--image-endpoint serves image calls only; `version` and `ps` talk to the runtime (--runtime-endpoint)"
                .into(),
        ));
    }
    // The password is read before connecting to the runtime.
    let password = match &command {
        Command::Pull { username: Some(_), .. } => Some(read_password()?),
        _ => None,
    };
    actix::System::new().block_on(async move {
        // An image endpoint answers no `Version`: the gateway is started
        // over it without the runtime's start-up check.
        let (gateway, _runtime) = match &image_endpoint {
            Some(e) => {
                let client = imaged::cri::CriClient::new(e, cfg.cri.connect_timeout)
                    .map_err(|err| AppError::Usage(format!("--image-endpoint {e}: {err}")))?;
                (actix::Actor::start(CriGatewayActor::new(client, &cfg.cri)), None)
            }
            None => {
                let rt = imaged::connect::runtime(&cfg).await?;
                (rt.gateway.clone(), Some(rt))
            }
        };
        let g = &gateway;
        let mut o = std::io::stdout().lock();
        match command {
            Command::Version => version(g, &mut o).await,
            Command::Images => images(g, &mut o).await,
            Command::Status { image } => status(g, image, &mut o).await,
            Command::Pull { image, username } => pull(g, image, username, password, &mut o).await,
            Command::Rmi { image } => rmi(g, image, &mut o).await,
            Command::Fsinfo => fsinfo(g, &mut o).await,
            Command::Ps => ps(g, &mut o).await,
        }
    })
}

/// The registry password: the first line of stdin, without its line end.
fn read_password() -> Result<String, AppError> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| AppError::Usage(format!("reading the password from stdin: {e}")))?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

/// Sends one CRI call through the gateway; `what` names it in the error.
async fn call<M, T>(g: &Gateway, msg: M, what: impl FnOnce() -> String) -> Result<T, AppError>
where
    M: Message<Result = Result<T, CriError>> + Send + 'static,
    T: Send + 'static,
    CriGatewayActor: Handler<M>,
{
    g.send(msg).await.map_err(|_| AppError::Mailbox("CRI gateway".into()))?.map_err(|e| AppError::cri(what(), e))
}

async fn version(g: &Gateway, o: &mut impl Write) -> Result<u8, AppError> {
    let v = call(g, GetVersion, || "Version".into()).await?;
    writeln!(
        o,
        "RuntimeName: {}\nRuntimeVersion: {}\nRuntimeApiVersion: {}",
        v.runtime_name, v.runtime_version, v.runtime_api_version
    )
    .map_err(out)?;
    Ok(0)
}

async fn images(g: &Gateway, o: &mut impl Write) -> Result<u8, AppError> {
    let images = call(g, ListImages::default(), || "ListImages".into()).await?;
    writeln!(o, "{:<20} {:>12} {:<6} TAGS", "IMAGE ID", "SIZE", "PINNED").map_err(out)?;
    for i in images {
        let id = i.id.strip_prefix("sha256:").unwrap_or(&i.id);
        writeln!(o, "{:<20} {:>12} {:<6} {}", id.get(..13).unwrap_or(id), i.size, i.pinned, i.repo_tags.join(","))
            .map_err(out)?;
    }
    Ok(0)
}

/// Exit 1 when the image is absent.
async fn status(g: &Gateway, image: String, o: &mut impl Write) -> Result<u8, AppError> {
    let st = call(g, GetImageStatus { image: ImageSpec::new(image.clone()), verbose: false }, || {
        format!("ImageStatus {image}")
    })
    .await?;
    match st.image {
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
    Ok(0)
}

async fn pull(
    g: &Gateway,
    image: String,
    username: Option<String>,
    password: Option<String>,
    o: &mut impl Write,
) -> Result<u8, AppError> {
    let auth = username.map(|u| AuthConfig::basic(registry_host(&image), u, password.unwrap_or_default()));
    let id =
        call(g, PullImage { auth, ..PullImage::new(ImageSpec::new(image.clone())) }, || format!("PullImage {image}"))
            .await?;
    writeln!(o, "Image is up to date for {id}").map_err(out)?;
    Ok(0)
}

async fn rmi(g: &Gateway, image: String, o: &mut impl Write) -> Result<u8, AppError> {
    call(g, RemoveImage { image: ImageSpec::new(image.clone()) }, || format!("RemoveImage {image}")).await?;
    writeln!(o, "Deleted: {image}").map_err(out)?;
    Ok(0)
}

async fn fsinfo(g: &Gateway, o: &mut impl Write) -> Result<u8, AppError> {
    let fs = call(g, GetImageFsInfo, || "ImageFsInfo".into()).await?;
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
    Ok(0)
}

async fn ps(g: &Gateway, o: &mut impl Write) -> Result<u8, AppError> {
    let cs = call(g, ListContainers::default(), || "ListContainers".into()).await?;
    for c in cs {
        writeln!(o, "{} {:?} {} {}", c.id, c.state, c.image.image, c.image_ref).map_err(out)?;
    }
    Ok(0)
}

/// The registry host of a reference (`docker.io` when it names none).
fn registry_host(image: &str) -> String {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => first.to_string(),
        _ => "docker.io".to_string(),
    }
}
