//! `imaged simulate`: one seed (`--seed N`, replayed bit for bit, its trace
//! with `--trace`) or a sweep (`--seeds N` from `--first`, on `--jobs`
//! threads, with a progress line and a summary). A failing seed is shrunk
//! (unless `--no-shrink`) and reported with the command that replays it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal as _, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::{DEFAULT_STEPS, Options, Outcome, Shape, Stats, report, run, shrink};
use crate::error::AppError;

/// `println!` that ignores a closed stdout (`imaged simulate | head`).
macro_rules! out {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

/// `eprintln!`/`eprint!` that ignore a closed stderr.
macro_rules! err {
    () => {{
        let _ = writeln!(std::io::stderr().lock());
    }};
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stderr().lock(), $($t)*);
    }};
}
macro_rules! err_inline {
    ($($t:tt)*) => {{
        let mut e = std::io::stderr().lock();
        let _ = write!(e, $($t)*);
        let _ = e.flush();
    }};
}

/// `imaged simulate`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Run this one seed (the default: seed 1).
    #[arg(long, conflicts_with = "seeds")]
    pub seed: Option<u64>,
    /// Run this many seeds, from --first.
    #[arg(long)]
    pub seeds: Option<u64>,
    /// The first seed of a sweep.
    #[arg(long, default_value_t = 1)]
    pub first: u64,
    /// Steps per seed.
    #[arg(long, default_value_t = DEFAULT_STEPS)]
    pub steps: usize,
    /// Keep only these steps' events (a shrunk failure's list).
    #[arg(long, value_delimiter = ',', requires = "seed")]
    pub keep: Option<Vec<usize>>,
    /// Threads for a sweep (default: the machine's cores).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Print the whole trace of a single seed.
    #[arg(long)]
    pub trace: bool,
    /// Do not shrink failing seeds.
    #[arg(long)]
    pub no_shrink: bool,
    /// Runs the shrinker may make per failing seed.
    #[arg(long, default_value_t = 150)]
    pub shrink_budget: usize,
    /// The shape plans are drawn in: `current`, or an earlier one (`v1`,
    /// `v2`, `v3`, `v4`, `v5`, `v6`) for the seeds found under it.
    #[arg(long, value_enum, default_value_t = ShapeArg::Current)]
    pub shape: ShapeArg,
}

/// `--shape`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ShapeArg {
    /// `Shape::CURRENT`.
    Current,
    /// `Shape::V1`.
    V1,
    /// `Shape::V2`.
    V2,
    /// `Shape::V3`.
    V3,
    /// `Shape::V4`.
    V4,
    /// `Shape::V5`.
    V5,
    /// `Shape::V6`.
    V6,
    /// `Shape::V7`.
    V7,
    /// `Shape::V8`.
    V8,
}

impl ShapeArg {
    fn shape(self) -> Shape {
        match self {
            Self::Current => Shape::CURRENT,
            Self::V1 => Shape::V1,
            Self::V2 => Shape::V2,
            Self::V3 => Shape::V3,
            Self::V4 => Shape::V4,
            Self::V5 => Shape::V5,
            Self::V6 => Shape::V6,
            Self::V7 => Shape::V7,
            Self::V8 => Shape::V8,
        }
    }
}

/// Runs the command; an error when an invariant broke (exit code 1).
pub fn simulate(args: &SimulateArgs) -> Result<(), AppError> {
    match args.seeds {
        Some(n) => sweep(args, n),
        None => one(args, args.seed.unwrap_or(1)),
    }
}

fn one(args: &SimulateArgs, seed: u64) -> Result<(), AppError> {
    let keep: Option<BTreeSet<usize>> = args.keep.as_ref().map(|k| k.iter().copied().collect());
    let opts = Options { steps: args.steps, keep: keep.clone(), full_trace: args.trace, shape: args.shape.shape() };
    let started = Instant::now();
    let o = run(seed, &opts);
    if let Some(trace) = &o.trace {
        let mut out = std::io::stdout().lock();
        for l in trace {
            let _ = writeln!(out, "{l}");
        }
    }
    let wall = started.elapsed();
    out!("{}", summary_line(&o, wall));
    if o.passed() {
        return Ok(());
    }
    out!("{}", report(&o, keep.as_ref()));
    if !args.no_shrink && keep.is_none() {
        shrink_and_report(args, &o);
    }
    Err(AppError::Other(format!("seed {seed} broke an invariant")))
}

fn summary_line(o: &Outcome, wall: Duration) -> String {
    let s = &o.stats;
    format!(
        "seed {}: {} steps, {} simulated in {:.1}s: {} ensures ({} ok, {} errors, {} lost; {} through the CRI front), {} runtime pulls, {} removals \
         ({} by the kubelet's GC through the front, {} refused), {} outage fallbacks answered, {} refused, {} starts, {} kills, {} reloads, {} GC reports, {} store checks ({} unsynced records lost), {} plugin runs ({} failed), {} stall cancels, trace {:016x}: {}",
        o.seed,
        o.steps,
        humantime::format_duration(Duration::from_secs(o.simulated.as_secs())),
        wall.as_secs_f64(),
        s.ensures,
        s.ensure_ok,
        s.ensure_err,
        s.ensure_lost,
        s.front,
        s.runtime_pulls,
        s.removals,
        s.kubelet_removes,
        s.kubelet_refused,
        s.fallback_used,
        s.fallback_refused,
        s.starts,
        s.kills,
        s.reloads,
        s.gc_reports,
        s.store_checks,
        s.unsynced_lost,
        s.plugin_runs,
        s.plugin_failures,
        s.stall_cancels,
        o.trace_hash,
        o.violation.as_ref().map_or("every invariant held".to_string(), |v| format!("`{}` broke", v.invariant)),
    )
}

fn shrink_and_report(args: &SimulateArgs, o: &Outcome) {
    out!("shrinking seed {} (up to {} runs)…", o.seed, args.shrink_budget);
    let (keep, shrunk) = shrink(o.seed, args.steps, &args.shape.shape(), o, args.shrink_budget);
    out!("{}", report(&shrunk, Some(&keep)));
}

fn add(total: &mut Stats, s: &Stats) {
    total.ensures += s.ensures;
    total.ensure_ok += s.ensure_ok;
    total.ensure_err += s.ensure_err;
    total.ensure_lost += s.ensure_lost;
    total.runtime_pulls += s.runtime_pulls;
    total.removals += s.removals;
    total.starts += s.starts;
    total.kills += s.kills;
    total.reloads += s.reloads;
    total.gc_reports += s.gc_reports;
    total.store_checks += s.store_checks;
    total.unsynced_lost += s.unsynced_lost;
    total.plugin_runs += s.plugin_runs;
    total.plugin_failures += s.plugin_failures;
    total.front += s.front;
    total.kubelet_removes += s.kubelet_removes;
    total.kubelet_refused += s.kubelet_refused;
    total.fallback_refused += s.fallback_refused;
    total.fallback_used += s.fallback_used;
    total.stall_cancels += s.stall_cancels;
}

fn sweep(args: &SimulateArgs, n: u64) -> Result<(), AppError> {
    let jobs =
        args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get)).max(1);
    let next = Arc::new(AtomicU64::new(args.first));
    let end = args.first.saturating_add(n);
    let (tx, rx) = mpsc::channel::<Outcome>();
    let mut workers = Vec::new();
    for _ in 0..jobs {
        let (next, tx) = (next.clone(), tx.clone());
        let opts = Options { steps: args.steps, shape: args.shape.shape(), ..Options::default() };
        let worker = std::thread::Builder::new().name("imaged-sim".into()).spawn(move || {
            loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    return;
                }
                if tx.send(run(seed, &opts)).is_err() {
                    return;
                }
            }
        });
        match worker {
            Ok(w) => workers.push(w),
            Err(e) => return Err(AppError::Other(format!("starting a simulation thread: {e}"))),
        }
    }
    drop(tx);
    let started = Instant::now();
    let terminal = std::io::stderr().is_terminal();
    let mut done = 0u64;
    let mut failed: Vec<Outcome> = Vec::new();
    let mut total = Stats::default();
    let mut simulated = Duration::ZERO;
    let mut last_draw = Instant::now();
    for o in rx {
        done += 1;
        add(&mut total, &o.stats);
        simulated += o.simulated;
        if let Some(v) = &o.violation {
            err!(
                "{}seed {}: `{}` broke at step {}: {}",
                if terminal { "\r\x1b[K" } else { "" },
                o.seed,
                v.invariant,
                v.step,
                v.message
            );
            failed.push(o);
        }
        let every = if terminal { Duration::from_millis(200) } else { Duration::from_secs(10) };
        if last_draw.elapsed() >= every || done == n {
            last_draw = Instant::now();
            let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-3);
            let left = Duration::from_secs_f64((n - done) as f64 / rate.max(1e-9));
            let line = format!(
                "seeds {done}/{n} [{}] failed {} · {rate:.1} seeds/s · eta {}",
                bar(done, n, 30),
                failed.len(),
                humantime::format_duration(Duration::from_secs(left.as_secs()))
            );
            if terminal {
                err_inline!("\r\x1b[K{line}");
            } else {
                err!("{line}");
            }
        }
    }
    for w in workers {
        let _ = w.join();
    }
    if terminal {
        err!();
    }
    let wall = started.elapsed();
    let mut by: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for o in &failed {
        if let Some(v) = &o.violation {
            by.entry(v.invariant).or_default().push(o.seed);
        }
    }
    out!(
        "simulated {done} seeds x {} steps ({} of node time) in {:.1}s on {jobs} threads: {} failed",
        args.steps,
        humantime::format_duration(Duration::from_secs(simulated.as_secs())),
        wall.as_secs_f64(),
        failed.len()
    );
    out!(
        "  {} ensures ({} ok, {} errors, {} lost; {} through the CRI front), {} runtime pulls, {} removals ({} by the kubelet's GC through the front, {} refused), {} outage fallbacks answered, {} refused, {} starts, {} kills, {} reloads, {} GC reports, {} store checks ({} unsynced records lost), {} plugin runs ({} failed), {} stall cancels",
        total.ensures,
        total.ensure_ok,
        total.ensure_err,
        total.ensure_lost,
        total.front,
        total.runtime_pulls,
        total.removals,
        total.kubelet_removes,
        total.kubelet_refused,
        total.fallback_used,
        total.fallback_refused,
        total.starts,
        total.kills,
        total.reloads,
        total.gc_reports,
        total.store_checks,
        total.unsynced_lost,
        total.plugin_runs,
        total.plugin_failures,
        total.stall_cancels
    );
    for (invariant, seeds) in &by {
        let list: Vec<String> = seeds.iter().take(20).map(ToString::to_string).collect();
        out!(
            "  `{invariant}`: {} seeds ({}{})",
            seeds.len(),
            list.join(", "),
            if seeds.len() > 20 { ", …" } else { "" }
        );
    }
    if failed.is_empty() {
        return Ok(());
    }
    // The first failure of each invariant, reported (and shrunk) in full.
    for seeds in by.values() {
        if let Some(o) = failed.iter().find(|o| o.seed == seeds[0]) {
            out!("{}", report(o, None));
            if !args.no_shrink {
                shrink_and_report(args, o);
            }
        }
    }
    Err(AppError::Other(format!("{} of {done} seeds broke an invariant", failed.len())))
}

fn bar(done: u64, of: u64, width: u64) -> String {
    let full = (done * width).checked_div(of).unwrap_or(width);
    let full = usize::try_from(full).unwrap_or(0);
    let width = usize::try_from(width).unwrap_or(0);
    format!("{}{}", "#".repeat(full), ".".repeat(width.saturating_sub(full)))
}
