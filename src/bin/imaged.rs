//! `imaged`: the node image manager's binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use imaged::cli::{ConfigArgs, report, shutdown_signal};
use imaged::config::Config;
use imaged::embedded::{EmbeddedRuntime, demo_catalogue};
use imaged::error::AppError;

#[derive(Debug, Parser)]
#[command(name = "imaged", version, about = "Node image manager: kubelet-compatible pulls and image GC over CRI")]
struct Cli {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon: serve the API on `daemon.socket` until SIGTERM/SIGINT (SIGHUP reloads).
    Run,
    /// The main job: replay a node workload (a few hundred pods) on the embedded runtime with a live
    /// display and a closing summary.
    Demo {
        /// Seed of the generated workload (the same seed replays the same pods).
        #[arg(long, default_value_t = imaged::demo::workload::DEFAULT_SEED)]
        seed: u64,
        /// Do not serve the API on a temporary socket while the demo runs.
        #[arg(long)]
        no_api: bool,
    },
    /// The whole-node simulation: imaged's actors, the embedded runtime and the store on simulated
    /// time under a seeded workload, faults and crashes, with invariants checked after every step
    /// (docs/simulation.md). Exit code 1 when an invariant breaks.
    Simulate(imaged::sim::cli::SimulateArgs),
    /// Serve the embedded CRI runtime on a unix socket until SIGINT/SIGTERM.
    EmbeddedRuntime {
        /// Socket path to serve on.
        #[arg(long)]
        socket: PathBuf,
        /// Start with an empty catalogue instead of the demo images.
        #[arg(long)]
        empty: bool,
        /// Keep the local images, containers and sandboxes in this directory across restarts
        /// (default: runtime.embedded_state_dir; none = in memory).
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Validate the configuration and print it, as TOML that `--config` accepts (every key's
    /// effective value). Exit code 64 when it is invalid.
    CheckConfig {
        /// Follow each key with a comment naming where its value came from (default, file,
        /// KubeletConfiguration field, environment, flag).
        #[arg(long)]
        show_origin: bool,
    },
}

fn main() -> ExitCode {
    // Before any thread: it reads and clears LISTEN_FDS (socket activation).
    imaged::api::server::take_passed_sockets();
    let cli: Cli = match imaged::cli::parse_or_exit() {
        Ok(c) => c,
        Err(code) => return code,
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => ExitCode::from(u8::try_from(report("imaged", &e)).unwrap_or(1)),
    }
}

fn run(cli: Cli) -> Result<(), AppError> {
    if let Command::Simulate(args) = &cli.command {
        // Each seed draws its own configuration: a flag that sets one
        // would be silently ignored, so it is refused.
        let c = &cli.config;
        if c.config.is_some()
            || c.kubelet_config.is_some()
            || !c.overrides.is_empty()
            || c.runtime_endpoint.is_some()
            || c.log_format.is_some()
        {
            return Err(AppError::Usage(
                "imaged simulate takes no --config, --kubelet-config, --set, --runtime-endpoint or --log-format: \
                 each seed draws its own configuration (docs/simulation.md)"
                    .into(),
            ));
        }
        // Its own settings per seed; logs only when RUST_LOG asks.
        if std::env::var_os("RUST_LOG").is_some() {
            let log = imaged::config::LogSettings { format: imaged::config::LogFormat::Text, filter: "info".into() };
            let _ = imaged::telemetry::init(&log).map_err(AppError::Other)?;
        }
        return imaged::sim::cli::simulate(args);
    }
    let sources = match &cli.command {
        Command::Demo { .. } => imaged::demo::sources(cli.config.sources()?)?,
        _ => cli.config.sources()?,
    };
    let loaded = Config::load_full(&sources)?;
    let log = imaged::telemetry::init(&loaded.config.log).map_err(AppError::Other)?;
    loaded.warn();
    let cfg: Config = loaded.config.clone();
    match cli.command {
        Command::Run => {
            cfg.check_on_host()?;
            actix::System::new().block_on(imaged::daemon::run(loaded, sources, Some(log)))
        }
        Command::CheckConfig { show_origin } => {
            cfg.check_on_host()?;
            imaged::connect::node_credentials(&cfg)?;
            print!("{}", loaded.effective.to_toml(show_origin));
            Ok(())
        }
        Command::Demo { seed, no_api } => {
            let opts = imaged::demo::DemoOptions { seed, serve_api: !no_api };
            actix::System::new().block_on(async move { imaged::demo::run_main_job(cfg, &opts).await.map(|_| ()) })
        }
        Command::Simulate(_) => Ok(()),
        Command::EmbeddedRuntime { socket, empty, state_dir } => {
            let rt = match state_dir.or(cfg.embedded_state_dir) {
                Some(dir) => EmbeddedRuntime::start_persistent(&socket, &dir)?,
                None => EmbeddedRuntime::start(&socket)?,
            };
            if !empty {
                for img in demo_catalogue() {
                    rt.add_remote(img).map_err(|e| AppError::cri("loading the catalogue", e))?;
                }
            }
            tracing::info!(socket = %socket.display(), "embedded CRI runtime serving");
            let signals = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| AppError::Other(format!("starting the signal runtime: {e}")))?;
            signals.block_on(shutdown_signal());
            tracing::info!("embedded CRI runtime stopping");
            drop(rt);
            Ok(())
        }
    }
}
