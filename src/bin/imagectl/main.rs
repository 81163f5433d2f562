//! `imagectl`: the terminal client of the imaged daemon (its gRPC API on a
//! unix socket), plus `imagectl cri …` to talk CRI to a runtime directly.
//!
//! Exit codes: 0 done; 1 the daemon or runtime failed the request (or an
//! image to inspect or remove is not there); 2 the image could not be
//! ensured (the kubelet's reason is printed); 64 bad usage or a request the
//! daemon rejected as invalid; 69 no daemon answering on the socket (or it
//! is shutting down). Every error is printed once, on stderr.

mod commands;
mod cri;
mod ensure;
mod output;
mod print;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};
use imaged::cli::{ConfigArgs, report};
use imaged::error::AppError;

use commands::{EventFilter, Session};
use output::Format;

/// The image could not be ensured.
const EXIT_ENSURE_FAILED: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "imagectl",
    version,
    about = "Drive the imaged daemon: ensure images, list, GC, events, back-off, status"
)]
struct Cli {
    #[command(flatten)]
    config: ConfigArgs,
    /// The daemon's API socket (default: `daemon.socket` from the configuration).
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Output format: tables for people, the API's messages as JSON or YAML for scripts.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Format::Table)]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Make sure an image is present, pulling it per the policy; shows progress while it waits.
    Ensure(EnsureArgs),
    /// The runtime's images, largest first.
    Images,
    /// Garbage-collect images (the threshold GC), or with `--delete-unused` every unused image.
    Gc {
        /// Plan only: show what would be removed and why.
        #[arg(long)]
        dry_run: bool,
        /// Remove every unused image old enough, whatever the disk usage.
        #[arg(long)]
        delete_unused: bool,
    },
    /// Image events and pull phases: the last 256 the daemon saw (all
    /// pods', then filtered: one pod's or image's), then, with `-f`, new ones.
    Events {
        /// Keep printing new events until interrupted.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Only this pod's, NAMESPACE/NAME.
        #[arg(long, value_name = "NAMESPACE/NAME", value_parser = parse_pod)]
        pod: Option<(String, String)>,
        /// Only the pod with this UID.
        #[arg(long, value_name = "UID", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        pod_uid: Option<String>,
        /// Only this image's (under any of its names: `nginx` is
        /// `docker.io/library/nginx:latest`).
        #[arg(long, value_name = "IMAGE", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        image: Option<String>,
    },
    /// Back-off control.
    Backoff {
        #[command(subcommand)]
        command: BackoffCommand,
    },
    /// Pull images ahead of need, in the background (no pod: no events, no
    /// back-off); a pod's ensure that comes meanwhile joins the pull.
    Prefetch(PrefetchArgs),
    /// Pulls the daemon holds now: running, queued (in start order) and
    /// parked, and the runtime's downloads; with `-w`, again and again.
    Pulls {
        /// Keep printing them, every --interval, until interrupted (JSON:
        /// one object per line; YAML: one document each).
        #[arg(long, short = 'w')]
        watch: bool,
        /// How often with --watch: a Go duration, from 100ms to 1h0m0s.
        #[arg(long, value_parser = parse_interval, default_value = "1s", requires = "watch")]
        interval: std::time::Duration,
    },
    /// Runtime, queue, back-offs, last GC and the settings in force.
    Status,
    /// Talk CRI to the runtime directly (no daemon), as crictl's image commands.
    Cri {
        /// Send the image calls to this CRI ImageService endpoint instead
        /// (`unix:///path`), as crictl's `--image-endpoint`: e.g. imaged's
        /// own CRI socket (`cri_server.socket`), which serves no
        /// RuntimeService: `version`, `ps` and the containers `rmi --prune`
        /// keeps images for still go to the runtime (`--runtime-endpoint`).
        #[arg(short = 'i', long, value_name = "ENDPOINT")]
        image_endpoint: Option<String>,
        #[command(subcommand)]
        command: cri::Command,
    },
    /// Print a shell completion script: `source <(imagectl completion bash)`.
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

// `imagectl ensure`'s arguments. (A plain comment: a doc comment here would
// compete with the variant's as the subcommand's help.)
#[derive(Debug, Args)]
struct EnsureArgs {
    /// The image, as a pod spec names it.
    image: String,
    /// Always, IfNotPresent, Never or AlwaysWithLocalFallback (default: the API server's defaulting).
    #[arg(long, value_name = "POLICY")]
    policy: Option<String>,
    /// The pod, NAMESPACE/NAME.
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = "default/imagectl", value_parser = parse_pod)]
    pod: (String, String),
    /// The pod's UID (back-off is per pod UID and image).
    #[arg(long, value_name = "UID", default_value = "imagectl")]
    pod_uid: String,
    /// RuntimeClass handler the image is for.
    #[arg(long, value_name = "HANDLER", default_value = "")]
    runtime_handler: String,
    /// A pull secret manifest (JSON or YAML `kind: Secret`), repeatable.
    #[arg(long = "secret", value_name = "FILE")]
    secrets: Vec<PathBuf>,
    /// Pull priority (higher first).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Overall pull deadline (e.g. `2m`).
    #[arg(long, value_parser = parse_deadline, allow_hyphen_values = true)]
    deadline: Option<std::time::Duration>,
    /// The pod's service account (spec.serviceAccountName), for credential
    /// plugins with tokenAttributes; the daemon looks it up and mints its
    /// token when configured with credentials.kubeconfig.
    #[arg(long, value_name = "NAME")]
    service_account: Option<String>,
    /// A token minted for the pod, for one audience: AUDIENCE=FILE (the
    /// token is read from the file, never given on the command line), repeatable.
    #[arg(long = "service-account-token", value_name = "AUDIENCE=FILE", value_parser = parse_token_file, requires = "service_account")]
    service_account_tokens: Vec<(String, PathBuf)>,
}

/// `--service-account-token`: AUDIENCE=FILE.
fn parse_token_file(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((audience, file)) if !audience.is_empty() && !file.is_empty() => {
            Ok((audience.to_string(), PathBuf::from(file)))
        }
        _ => Err("must be AUDIENCE=FILE (the token itself goes in the file)".into()),
    }
}

// `imagectl prefetch`'s arguments.
#[derive(Debug, Args)]
struct PrefetchArgs {
    /// The images, as pod specs name them.
    #[arg(required = true, value_name = "IMAGE")]
    images: Vec<String>,
    /// A pull secret manifest (JSON or YAML `kind: Secret`), repeatable.
    #[arg(long = "secret", value_name = "FILE")]
    secrets: Vec<PathBuf>,
    /// Pull priority (higher first; negative lets pods' pulls go first).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// RuntimeClass handler the images are for.
    #[arg(long, value_name = "HANDLER", default_value = "")]
    runtime_handler: String,
    /// Overall pull deadline (e.g. `2m`).
    #[arg(long, value_parser = parse_deadline, allow_hyphen_values = true)]
    deadline: Option<std::time::Duration>,
    /// Wait for the pulls to end (exit 2 if one failed).
    #[arg(long)]
    wait: bool,
}

#[derive(Debug, Subcommand)]
enum BackoffCommand {
    /// Clear back-off: for a pod, an image, one pod's image, or with `--all` everything.
    #[command(group(clap::ArgGroup::new("scope").args(["pod_uid", "image", "all"]).required(true).multiple(true)))]
    Clear {
        /// The pod's UID (back-off is kept per pod UID and image).
        #[arg(long, value_name = "UID", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        pod_uid: Option<String>,
        /// The image, under any of its names (`nginx` clears the back-off
        /// of a pod that named it `docker.io/library/nginx:latest`).
        #[arg(long, value_name = "IMAGE", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        image: Option<String>,
        /// Every back-off on the node: said outright, so that a command
        /// whose `--pod-uid` or `--image` was left out (an empty shell
        /// variable) is a usage error, not a node-wide clear.
        #[arg(long, conflicts_with_all = ["pod_uid", "image"])]
        all: bool,
        // `--pod UID` was this command's spelling; `--pod` now means
        // NAMESPACE/NAME everywhere, and back-off is kept by UID, so `--pod`
        // is unknown here (clap's error points to `--pod-uid`).
    },
    /// The keys in back-off.
    List,
}

fn main() -> ExitCode {
    let cli: Cli = match imaged::cli::parse_or_exit() {
        Ok(c) => c,
        Err(code) => return code,
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        // `imagectl … | head`: the reader has what it wanted.
        Err(_) if output::stdout_closed() => ExitCode::SUCCESS,
        Err(e) => ExitCode::from(u8::try_from(report("imagectl", &e)).unwrap_or(1)),
    }
}

/// `--deadline`: a Go duration, as every duration imaged reads.
fn parse_deadline(text: &str) -> Result<std::time::Duration, String> {
    imaged::config::duration("--deadline", text).map_err(|e| match e {
        imaged::config::ConfigError::Invalid { reason, .. } => reason,
        other => other.to_string(),
    })
}

/// `pulls --interval`: a Go duration the daemon's `WatchPulls` takes.
fn parse_interval(text: &str) -> Result<std::time::Duration, String> {
    let d = imaged::config::duration("--interval", text).map_err(|e| match e {
        imaged::config::ConfigError::Invalid { reason, .. } => reason,
        other => other.to_string(),
    })?;
    let (min, max) = (imaged::api::WATCH_PULLS_MIN, imaged::api::WATCH_PULLS_MAX);
    if d < min || d > max {
        let go = imaged::domain::go_text::duration;
        return Err(format!("must be from {} to {}", go(min), go(max)));
    }
    Ok(d)
}

/// `--pod`: NAMESPACE/NAME, both parts non-empty, as kubectl writes a pod.
fn parse_pod(text: &str) -> Result<(String, String), String> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err("must be NAMESPACE/NAME (a pod UID goes in --pod-uid)".into()),
    }
}

/// Loads the configuration, then runs the command: `cri …` against the
/// runtime, the others against the daemon's socket. Returns the exit code.
fn run(cli: Cli) -> Result<u8, AppError> {
    if let Command::Completion { shell } = cli.command {
        // Into a buffer: clap_complete panics on a failed write.
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "imagectl", &mut script);
        std::io::stdout().lock().write_all(&script).map_err(output::out)?;
        return Ok(0);
    }
    let cfg = cli.config.load()?;
    let _ = imaged::telemetry::init(&imaged::config::LogSettings { filter: "warn".into(), ..cfg.log.clone() });
    let format = cli.output;
    let command = match cli.command {
        Command::Cri { image_endpoint, command } => return cri::run(cfg, image_endpoint.as_deref(), command, format),
        c => c,
    };
    let socket = cli.socket.clone().unwrap_or_else(|| cfg.daemon.socket.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| AppError::Other(format!("starting the client runtime: {e}")))?;
    let at = socket.clone();
    let result = rt.block_on(async move {
        let client = imaged::api::client(&socket)?;
        let mut session = Session { client, format, o: std::io::stdout().lock() };
        match command {
            Command::Ensure(args) => session.ensure(args).await,
            Command::Images => session.images().await,
            Command::Gc { dry_run, delete_unused } => session.gc(dry_run, delete_unused).await,
            Command::Events { follow, pod, pod_uid, image } => {
                session.events(follow, &EventFilter { pod, pod_uid, image }).await
            }
            Command::Backoff { command: BackoffCommand::Clear { pod_uid, image, all: _ } } => {
                session.backoff_clear(pod_uid, image).await
            }
            Command::Backoff { command: BackoffCommand::List } => session.backoff_list().await,
            Command::Prefetch(args) => session.prefetch(args).await,
            Command::Pulls { watch, interval } => session.pulls(watch.then_some(interval)).await,
            Command::Status => session.status().await,
            Command::Cri { .. } | Command::Completion { .. } => Ok(0),
        }
    });
    // No daemon answering: say where imagectl looked (`--socket`, or the
    // configuration's `daemon.socket`).
    result.map_err(|e| match e {
        AppError::Unavailable(m) => AppError::Unavailable(format!("{m} (imaged's API socket {})", at.display())),
        e => e,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn pod_is_namespace_and_name() {
        assert_eq!(parse_pod("web/front-1").unwrap(), ("web".to_string(), "front-1".to_string()));
        for bad in ["front-1", "/front-1", "web/", "a/b/c", ""] {
            assert!(parse_pod(bad).unwrap_err().contains("NAMESPACE/NAME"), "{bad}");
        }
    }
}
