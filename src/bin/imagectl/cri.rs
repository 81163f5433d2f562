//! `imagectl cri …`: talks CRI to a runtime directly through imaged's CRI
//! gateway, as `crictl`'s image commands do (same names and flags, and
//! `-o json|yaml` prints the CRI answer in proto3 JSON's camelCase names),
//! without a daemon.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};

use actix::{Addr, Handler, Message};
use clap::Subcommand;
use imaged::actors::cri_gateway::{
    CriGatewayActor, GetImageFsInfo, GetImageStatus, GetVersion, ListContainers, ListImages, PullImage, RemoveImage,
};
use imaged::cri::CriError;
use imaged::cri::proto as pb;
use imaged::domain::{AuthConfig, ContainerState, Image, ImageSpec};
use imaged::error::AppError;

use crate::output::{Format, Plain, out};
use crate::print::{human_bytes, short};

type Gateway = Addr<CriGatewayActor>;

/// CRI commands (no daemon needed), named as crictl's.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runtime name and versions.
    Version,
    /// List images.
    #[command(visible_aliases = ["image", "img"])]
    Images {
        /// Only show image IDs.
        #[arg(short, long)]
        quiet: bool,
        /// Show digests.
        #[arg(long)]
        digests: bool,
        /// Show whether the image is pinned.
        #[arg(long)]
        pinned: bool,
        /// Show output without truncating the IDs.
        #[arg(long)]
        no_trunc: bool,
    },
    /// Show one or more images (exit 1 when one is not there).
    Inspecti {
        /// Image references or ids.
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<String>,
    },
    /// Pull an image.
    Pull {
        /// Image reference.
        image: String,
        /// Registry user name (the password is read from the first line of stdin).
        #[arg(short, long)]
        username: Option<String>,
    },
    /// Remove one or more images (exit 1 when one is not there or cannot be removed).
    #[command(group(clap::ArgGroup::new("which").args(["images", "all", "prune"]).required(true).multiple(true)))]
    Rmi {
        /// Image references or ids.
        #[arg(value_name = "IMAGE")]
        images: Vec<String>,
        /// Remove all images.
        #[arg(short, long)]
        all: bool,
        /// Remove all images no container uses (pinned ones stay).
        #[arg(long)]
        prune: bool,
    },
    /// Image filesystem usage.
    Imagefsinfo,
    /// List containers (running ones; `-a` for all).
    Ps {
        /// Show all containers, whatever their state.
        #[arg(short, long)]
        all: bool,
    },
}

/// Runs one CRI command, against the runtime or, with `image_endpoint`,
/// against that ImageService only; returns the exit code.
pub fn run(
    cfg: imaged::config::Config,
    image_endpoint: Option<&str>,
    command: Command,
    format: Format,
) -> Result<u8, AppError> {
    let image_endpoint = image_endpoint
        .map(|e| {
            e.parse::<imaged::cri::CriEndpoint>()
                .map_err(|err| AppError::Usage(format!("--image-endpoint {e:?}: {err}")))
        })
        .transpose()?;
    // As crictl: `version`, `ps` and the containers `rmi --prune` keeps
    // go to the runtime endpoint, whatever the image endpoint.
    let needs_runtime = matches!(command, Command::Version | Command::Ps { .. } | Command::Rmi { prune: true, .. });
    if (image_endpoint.is_none() || needs_runtime)
        && matches!(cfg.endpoint, imaged::config::RuntimeEndpoint::Embedded { .. })
    {
        return Err(AppError::Usage(
            "runtime.endpoint is \"embedded\": `imagectl cri` would start an empty runtime of its own, \
             gone when the command ends. Name the node's runtime: --runtime-endpoint unix:///run/containerd/containerd.sock \
             (or a running `imaged embedded-runtime --socket PATH`'s unix://PATH)"
                .into(),
        ));
    }
    // A command tries the runtime once: waiting `runtime.startup_timeout`
    // for it to come up is the daemon's start-up, not a command's.
    let mut cfg = cfg;
    cfg.cri.startup_timeout = std::time::Duration::ZERO;
    // The password is read before connecting to the runtime.
    let password = match &command {
        Command::Pull { username: Some(_), .. } => Some(read_password()?),
        _ => None,
    };
    actix::System::new().block_on(async move {
        let runtime =
            if image_endpoint.is_none() || needs_runtime { Some(imaged::connect::runtime(&cfg).await?) } else { None };
        // An image endpoint answers no `Version`: the gateway is started
        // over it without the runtime's start-up check.
        let gateway = match (&image_endpoint, &runtime) {
            (Some(e), _) => {
                let client = imaged::cri::CriClient::new(e, cfg.cri.connect_timeout)
                    .map_err(|err| AppError::Usage(format!("--image-endpoint {e}: {err}")))?;
                actix::Actor::start(CriGatewayActor::new(client, &cfg.cri))
            }
            (None, Some(rt)) => rt.gateway.clone(),
            (None, None) => return Err(AppError::Other("no CRI endpoint to talk to".into())),
        };
        let r = runtime.as_ref().map_or(&gateway, |rt| &rt.gateway);
        let g = &gateway;
        let mut o = std::io::stdout().lock();
        match command {
            Command::Version => version(r, format, &mut o).await,
            Command::Images { quiet, digests, pinned, no_trunc } => {
                let view = (!quiet).then_some(ImagesView { digests, pinned, no_trunc });
                images(g, view, format, &mut o).await
            }
            Command::Inspecti { images } => inspecti(g, images, format, &mut o).await,
            Command::Pull { image, username } => pull(g, image, username, password, &mut o).await,
            Command::Rmi { images, all, prune } => rmi(g, r, images, all, prune, &mut o).await,
            Command::Imagefsinfo => imagefsinfo(g, format, &mut o).await,
            Command::Ps { all } => ps(r, all, format, &mut o).await,
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

/// Reports `e` (once, on stderr) for a command that goes on with its other
/// arguments; the first such failure's exit code is the command's.
fn failed(e: &AppError, code: &mut u8) {
    let c = u8::try_from(imaged::cli::report("imagectl", e)).unwrap_or(1);
    if *code == 0 {
        *code = c;
    }
}

async fn version(g: &Gateway, f: Format, o: &mut impl Write) -> Result<u8, AppError> {
    let v: pb::VersionResponse = call(g, GetVersion, || "Version".into()).await?.into();
    if f.is_document() {
        f.document(&v, o)?;
    } else {
        writeln!(
            o,
            "Version:  {}\nRuntimeName:  {}\nRuntimeVersion:  {}\nRuntimeApiVersion:  {}",
            v.version, v.runtime_name, v.runtime_version, v.runtime_api_version
        )
        .map_err(out)?;
    }
    Ok(0)
}

/// `cri images`' table options, as crictl's.
#[derive(Debug, Clone, Copy)]
struct ImagesView {
    digests: bool,
    pinned: bool,
    no_trunc: bool,
}

/// A tag split as crictl shows it: (`docker.io/library/busybox`, `1.36`).
fn repo_and_tag(tag: &str) -> (&str, &str) {
    let name_end = tag.rfind('/').map_or(0, |i| i + 1);
    match tag[name_end..].rfind(':') {
        Some(i) => (&tag[..name_end + i], &tag[name_end + i + 1..]),
        None => (tag, "<none>"),
    }
}

/// Rows of `cri images`: one per tag (an untagged image: one, named by its
/// digest's repository), sorted by name.
fn image_rows(mut images: Vec<Image>, view: ImagesView) -> Plain {
    images.sort_by(|a, b| a.repo_tags.first().cmp(&b.repo_tags.first()).then_with(|| a.id.cmp(&b.id)));
    let mut header = vec!["IMAGE", "TAG"];
    if view.digests {
        header.push("DIGEST");
    }
    header.extend(["IMAGE ID", "SIZE"]);
    if view.pinned {
        header.push("PINNED");
    }
    let size_column = header.len() - 1 - usize::from(view.pinned);
    let mut t = Plain::new(&header).right(&[size_column]);
    let trunc = |id: &str| if view.no_trunc { id.to_string() } else { short(id).to_string() };
    for i in &images {
        let digest = i.repo_digests.first().and_then(|d| d.split_once('@'));
        let pairs: Vec<(String, String)> = if i.repo_tags.is_empty() {
            vec![(digest.map_or("<none>", |(repo, _)| repo).to_string(), "<none>".to_string())]
        } else {
            i.repo_tags.iter().map(|t| repo_and_tag(t)).map(|(r, t)| (r.to_string(), t.to_string())).collect()
        };
        for (repo, tag) in pairs {
            let mut row = vec![repo, tag];
            if view.digests {
                row.push(digest.map_or_else(|| "<none>".to_string(), |(_, d)| trunc(d)));
            }
            row.extend([trunc(&i.id), human_bytes(i.size)]);
            if view.pinned {
                row.push(i.pinned.to_string());
            }
            t.row(row);
        }
    }
    t
}

/// `cri images`: a table with `view`'s columns, or (`-q`, no view) the ids.
async fn images(g: &Gateway, view: Option<ImagesView>, f: Format, o: &mut impl Write) -> Result<u8, AppError> {
    let images = call(g, ListImages::default(), || "ListImages".into()).await?;
    if f.is_document() {
        f.document(&pb::ListImagesResponse { images: images.into_iter().map(Into::into).collect() }, o)?;
    } else if let Some(view) = view {
        image_rows(images, view).write(o)?;
    } else {
        for i in &images {
            writeln!(o, "{}", i.id).map_err(out)?;
        }
    }
    Ok(0)
}

/// The status of `image`; absent is an error, as crictl says it.
async fn image_status(g: &Gateway, image: &str) -> Result<Image, AppError> {
    let st = call(g, GetImageStatus { image: ImageSpec::new(image.to_string()), verbose: false }, || {
        format!("ImageStatus {image}")
    })
    .await?;
    st.image.ok_or_else(|| AppError::Other(format!("no such image {image:?} present")))
}

/// `cri inspecti IMAGE…`: each image found, and an error for each absent.
async fn inspecti(g: &Gateway, images: Vec<String>, f: Format, o: &mut impl Write) -> Result<u8, AppError> {
    let mut code = 0;
    let several = images.len() > 1;
    for image in images {
        let i = match image_status(g, &image).await {
            Ok(i) => i,
            Err(e) => {
                failed(&e, &mut code);
                continue;
            }
        };
        match f {
            // One document per image: concatenated JSON, `---`-separated YAML.
            Format::Yaml if several => {
                f.stream_item(&pb::ImageStatusResponse { image: Some(i.into()), ..Default::default() }, o)?;
            }
            Format::Json | Format::Yaml => {
                f.document(&pb::ImageStatusResponse { image: Some(i.into()), ..Default::default() }, o)?;
            }
            Format::Table => writeln!(
                o,
                "ID: {}\nTags: {}\nDigests: {}\nSize: {}\nPinned: {}",
                i.id,
                i.repo_tags.join(","),
                i.repo_digests.join(","),
                i.size,
                i.pinned
            )
            .map_err(out)?,
        }
    }
    Ok(code)
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

/// `cri rmi`: as crictl, each image is looked up first: one that is not
/// there is an error ("no such image"), never "Deleted"; each removed one
/// prints `Deleted: ` with its tags (or digests, or id).
/// `rmi`: images through `g`, the containers `--prune` keeps images for
/// through `runtime`.
async fn rmi(
    g: &Gateway,
    runtime: &Gateway,
    images: Vec<String>,
    all: bool,
    prune: bool,
    o: &mut impl Write,
) -> Result<u8, AppError> {
    let mut targets: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for i in images {
        if seen.insert(i.clone()) {
            targets.push(i);
        }
    }
    if all || prune {
        let listed = call(g, ListImages::default(), || "ListImages".into()).await?;
        let in_use = if prune { images_in_use(runtime).await? } else { BTreeSet::new() };
        for i in listed {
            if prune && (i.pinned || in_use.contains(&i.id)) {
                continue;
            }
            if seen.insert(i.id.clone()) {
                targets.push(i.id);
            }
        }
    }
    let mut code = 0;
    for target in targets {
        let image = match image_status(g, &target).await {
            Ok(i) => i,
            Err(e) => {
                failed(&e, &mut code);
                continue;
            }
        };
        let removed =
            call(g, RemoveImage { image: ImageSpec::new(target.clone()) }, || format!("RemoveImage {target}")).await;
        if let Err(e) = removed {
            failed(&e, &mut code);
            continue;
        }
        let names = if !image.repo_tags.is_empty() {
            image.repo_tags
        } else if !image.repo_digests.is_empty() {
            image.repo_digests
        } else {
            vec![image.id]
        };
        for name in names {
            writeln!(o, "Deleted: {name}").map_err(out)?;
        }
    }
    Ok(code)
}

/// Ids of the images containers (in any state) use, for `rmi --prune`.
async fn images_in_use(g: &Gateway) -> Result<BTreeSet<String>, AppError> {
    let containers = call(g, ListContainers::default(), || "ListContainers".into()).await?;
    let mut ids = BTreeSet::new();
    for c in containers {
        for id in [&c.image_id, &c.image_ref] {
            if !id.is_empty() {
                ids.insert(id.clone());
            }
        }
        // The image the container names may have been re-tagged since.
        if let Ok(st) = call(g, GetImageStatus { image: c.image.clone(), verbose: false }, String::new).await
            && let Some(i) = st.image
        {
            ids.insert(i.id);
        }
    }
    Ok(ids)
}

async fn imagefsinfo(g: &Gateway, f: Format, o: &mut impl Write) -> Result<u8, AppError> {
    let fs: pb::ImageFsInfoResponse = call(g, GetImageFsInfo, || "ImageFsInfo".into()).await?.into();
    if f.is_document() {
        f.document(&fs, o)?;
        return Ok(0);
    }
    let mut t = Plain::new(&["FILESYSTEM", "MOUNTPOINT", "USED", "INODES"]).right(&[2, 3]);
    let figure = |v: Option<&pb::UInt64Value>| v.map_or_else(|| "-".to_string(), |v| v.value.to_string());
    // Bytes as every other table sizes them (`images`: 72.1MB); -o json keeps them exact.
    let size = |v: Option<&pb::UInt64Value>| v.map_or_else(|| "-".to_string(), |v| human_bytes(v.value));
    for (kind, list) in [("image", &fs.image_filesystems), ("container", &fs.container_filesystems)] {
        for u in list {
            let mountpoint = u.fs_id.as_ref().map_or("", |i| i.mountpoint.as_str());
            t.row([
                kind.to_string(),
                mountpoint.to_string(),
                size(u.used_bytes.as_ref()),
                figure(u.inodes_used.as_ref()),
            ]);
        }
    }
    t.write(o)?;
    Ok(0)
}

async fn ps(g: &Gateway, all: bool, f: Format, o: &mut impl Write) -> Result<u8, AppError> {
    let mut cs = call(g, ListContainers::default(), || "ListContainers".into()).await?;
    if !all {
        cs.retain(|c| c.state == ContainerState::Running);
    }
    cs.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    if f.is_document() {
        f.document(&pb::ListContainersResponse { containers: cs.into_iter().map(Into::into).collect() }, o)?;
        return Ok(0);
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut t = Plain::new(&["CONTAINER", "IMAGE", "CREATED", "STATE", "NAME", "ATTEMPT", "POD ID"]).right(&[5]);
    for c in cs {
        let created = std::time::Duration::from_nanos(u64::try_from(c.created_at).unwrap_or(0));
        let ago = now.saturating_sub(created);
        t.row([
            short(&c.id).to_string(),
            c.image.image.clone(),
            format!("{} ago", imaged::domain::go_text::duration(std::time::Duration::from_secs(ago.as_secs()))),
            format!("{:?}", c.state),
            c.name.clone(),
            c.attempt.to_string(),
            short(&c.pod_sandbox_id).to_string(),
        ]);
    }
    t.write(o)?;
    Ok(0)
}

/// The registry host of a reference (`docker.io` when it names none).
fn registry_host(image: &str) -> String {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => first.to_string(),
        _ => "docker.io".to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
    use super::*;

    #[test]
    fn tags_split_into_repository_and_tag_as_crictl_shows_them() {
        assert_eq!(repo_and_tag("docker.io/library/busybox:1.36"), ("docker.io/library/busybox", "1.36"));
        assert_eq!(repo_and_tag("localhost:5000/app:v1"), ("localhost:5000/app", "v1"));
        assert_eq!(repo_and_tag("localhost:5000/app"), ("localhost:5000/app", "<none>"));
    }

    #[test]
    fn image_rows_follow_crictls_columns() {
        let images = vec![
            Image {
                id: "sha256:0123456789abcdef".into(),
                repo_tags: vec!["docker.io/library/redis:7".into()],
                repo_digests: vec!["docker.io/library/redis@sha256:feedfacefeedface".into()],
                size: 4_300_000,
                ..Default::default()
            },
            Image {
                id: "sha256:aaaaaaaaaaaaaaaa".into(),
                repo_digests: vec!["example.com/app@sha256:bbbbbbbbbbbbbbbbbb".into()],
                size: 12,
                pinned: true,
                ..Default::default()
            },
        ];
        let view = ImagesView { digests: true, pinned: true, no_trunc: false };
        let mut o = Vec::new();
        image_rows(images, view).write(&mut o).unwrap();
        let text = String::from_utf8(o).unwrap();
        let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows[0], ["IMAGE", "TAG", "DIGEST", "IMAGE", "ID", "SIZE", "PINNED"], "{text}");
        assert_eq!(rows[1], ["example.com/app", "<none>", "bbbbbbbbbbbbb", "aaaaaaaaaaaaa", "12B", "true"], "{text}");
        assert_eq!(
            rows[2],
            ["docker.io/library/redis", "7", "feedfacefeedf", "0123456789abc", "4.3MB", "false"],
            "{text}"
        );
    }
}
