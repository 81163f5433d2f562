//! `imagectl`: the terminal client of the imaged daemon (its gRPC API on a
//! unix socket), plus `imagectl cri …` to talk CRI to a runtime directly.
//!
//! Exit codes: 0 done; 1 the daemon or runtime failed the request; 2 the
//! image could not be ensured (the kubelet's reason is printed); 64 bad
//! usage or a request the daemon rejected as invalid; 69 no daemon
//! answering on the socket (or it is shutting down).

mod commands;
mod cri;
mod ensure;
mod print;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use imaged::cli::{ConfigArgs, report};
use imaged::error::AppError;

use commands::Session;

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
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Human-readable tables.
    Table,
    /// JSON, one document per command (one object per line for `events`).
    Json,
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
    /// Image events and pull phases the daemon saw.
    Events {
        /// Keep printing new events until interrupted.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Back-off control.
    Backoff {
        #[command(subcommand)]
        command: BackoffCommand,
    },
    /// Pull images ahead of need, in the background (no pod: no events, no
    /// back-off); a pod's ensure that comes meanwhile joins the pull.
    Prefetch(PrefetchArgs),
    /// Pulls the daemon holds now: running, queued (in start order) and parked.
    Pulls,
    /// Runtime, queue, back-offs, last GC and configuration summary.
    Status,
    /// Talk CRI to the runtime directly (no daemon).
    Cri {
        /// Send the image calls to this CRI ImageService endpoint instead
        /// (`unix:///path`), as crictl's `--image-endpoint`: e.g. imaged's
        /// own CRI socket (`cri_server.socket`), which serves no
        /// RuntimeService (so `version` and `ps` need the runtime).
        #[arg(long, value_name = "ENDPOINT")]
        image_endpoint: Option<String>,
        #[command(subcommand)]
        command: cri::Command,
    },
}

// `imagectl ensure`'s arguments. (A plain comment: a doc comment here would
// compete with the variant's as the subcommand's help.)
#[derive(Debug, Args)]
struct EnsureArgs {
    /// The image, as a pod spec names it.
    image: String,
    /// Always, IfNotPresent, Never or AlwaysWithLocalFallback (default: the API server's defaulting).
    #[arg(long)]
    policy: Option<String>,
    /// The pod, NAMESPACE/NAME.
    #[arg(long, default_value = "default/imagectl")]
    pod: String,
    /// The pod's UID (back-off is per pod UID and image).
    #[arg(long, default_value = "imagectl")]
    pod_uid: String,
    /// A pull secret manifest (JSON or YAML `kind: Secret`), repeatable.
    #[arg(long = "secret", value_name = "FILE")]
    secrets: Vec<PathBuf>,
    /// Pull priority (higher first).
    #[arg(long, default_value_t = 0)]
    priority: i32,
    /// Overall pull deadline (e.g. `2m`).
    #[arg(long, value_parser = parse_deadline)]
    deadline: Option<std::time::Duration>,
}

// `imagectl prefetch`'s arguments.
#[derive(Debug, Args)]
struct PrefetchArgs {
    /// The images, as pod specs name them.
    #[arg(required = true)]
    images: Vec<String>,
    /// A pull secret manifest (JSON or YAML `kind: Secret`), repeatable.
    #[arg(long = "secret", value_name = "FILE")]
    secrets: Vec<PathBuf>,
    /// Pull priority (higher first; negative lets pods' pulls go first).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// RuntimeClass handler the images are for.
    #[arg(long, default_value = "")]
    runtime_handler: String,
    /// Overall pull deadline (e.g. `2m`).
    #[arg(long, value_parser = parse_deadline)]
    deadline: Option<std::time::Duration>,
    /// Wait for the pulls to end (exit 2 if one failed).
    #[arg(long)]
    wait: bool,
}

#[derive(Debug, Subcommand)]
enum BackoffCommand {
    /// Clear back-off: for a pod, an image, one pod's image, or (neither) everything.
    Clear {
        /// The pod's UID.
        #[arg(long)]
        pod: Option<String>,
        /// The image, as the pod named it.
        #[arg(long)]
        image: Option<String>,
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
        Err(e) => ExitCode::from(u8::try_from(report("imagectl", &e)).unwrap_or(1)),
    }
}

/// `--deadline`: a duration no larger than the daemon accepts.
fn parse_deadline(text: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    imaged::domain::limits::check_duration(d, || text.to_string()).map_err(|e| e.reason())
}

/// Loads the configuration, then runs the command: `cri …` against the
/// runtime, the others against the daemon's socket. Returns the exit code.
fn run(cli: Cli) -> Result<u8, AppError> {
    let cfg = cli.config.load()?;
    let _ = imaged::telemetry::init(&imaged::config::LogSettings { filter: "warn".into(), ..cfg.log.clone() });
    let command = match cli.command {
        Command::Cri { image_endpoint, command } => return cri::run(cfg, image_endpoint.as_deref(), command),
        c => c,
    };
    let socket = cli.socket.clone().unwrap_or_else(|| cfg.daemon.socket.clone());
    let json = cli.output == Output::Json;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| AppError::Other(format!("starting the client runtime: {e}")))?;
    rt.block_on(async move {
        let client = imaged::api::client(&socket)?;
        let mut session = Session { client, json, o: std::io::stdout().lock() };
        match command {
            Command::Ensure(args) => session.ensure(args).await,
            Command::Images => session.images().await,
            Command::Gc { dry_run, delete_unused } => session.gc(dry_run, delete_unused).await,
            Command::Events { follow } => session.events(follow).await,
            Command::Backoff { command: BackoffCommand::Clear { pod, image } } => {
                session.backoff_clear(pod, image).await
            }
            Command::Backoff { command: BackoffCommand::List } => session.backoff_list().await,
            Command::Prefetch(args) => session.prefetch(args).await,
            Command::Pulls => session.pulls().await,
            Command::Status => session.status().await,
            Command::Cri { .. } => Ok(0),
        }
    })
}
