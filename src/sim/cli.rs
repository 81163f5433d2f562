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
#[allow(clippy::struct_excessive_bools, reason = "each bool is a command-line flag clap fills")]
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
    /// Run the same seeds again in a second process, and fail on any seed
    /// whose trace differs there: a run must not depend on the process
    /// (hash keys, a runtime's random choices), or no failure replays.
    #[arg(long)]
    pub replay_check: bool,
    /// Print `seed N trace HASH` for each seed and nothing else (what
    /// --replay-check's second process prints).
    #[arg(long, hide = true, conflicts_with_all = ["trace", "replay_check"])]
    pub hashes: bool,
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

/// Runs the command; an error when an invariant broke (exit code 1), or
/// with `--replay-check` when a seed ran otherwise in a second process.
pub fn simulate(args: &SimulateArgs) -> Result<(), AppError> {
    if args.hashes {
        return hashes(args);
    }
    let ran = match args.seeds {
        Some(n) => sweep(args, n),
        None => one(args, args.seed.unwrap_or(1)),
    };
    let (here, broke) = match ran {
        Ok(here) => (here, None),
        Err((here, e)) => (here, Some(e)),
    };
    let replay = if args.replay_check { replay_check(args, &here) } else { Ok(()) };
    match (broke, replay) {
        (Some(AppError::Other(a)), Err(AppError::Other(b))) => Err(AppError::Other(format!("{a}; {b}"))),
        (Some(e), Ok(()) | Err(_)) | (None, Err(e)) => Err(e),
        (None, Ok(())) => Ok(()),
    }
}

/// Each seed's trace hash, by seed.
type Hashes = BTreeMap<u64, u64>;

/// A run's hashes, and the error when an invariant broke.
type Ran = Result<Hashes, (Hashes, AppError)>;

/// `--hashes`: the seeds asked for, run as a sweep would run them, one
/// `seed N trace HASH` line each, in the order they end.
fn hashes(args: &SimulateArgs) -> Result<(), AppError> {
    let (first, n) = match args.seeds {
        Some(n) => (args.first, n),
        None => (args.seed.unwrap_or(1), 1),
    };
    let opts = Options { full_trace: false, ..options(args) };
    let (rx, workers) = start(args, &opts, first, n)?;
    for o in rx {
        out!("seed {} trace {:016x}", o.seed, o.trace_hash);
    }
    for w in workers {
        let _ = w.join();
    }
    Ok(())
}

/// `--replay-check`: the same seeds in a second process of this program,
/// their hashes compared with this run's.
fn replay_check(args: &SimulateArgs, here: &Hashes) -> Result<(), AppError> {
    let exe = std::env::current_exe()
        .map_err(|e| AppError::Other(format!("--replay-check: finding this program to run again: {e}")))?;
    let mut argv: Vec<String> = vec!["simulate".into(), "--hashes".into(), "--steps".into(), args.steps.to_string()];
    match args.seeds {
        Some(n) => argv.extend(["--seeds".into(), n.to_string(), "--first".into(), args.first.to_string()]),
        None => argv.extend(["--seed".into(), args.seed.unwrap_or(1).to_string()]),
    }
    if let Some(jobs) = args.jobs {
        argv.extend(["--jobs".into(), jobs.to_string()]);
    }
    if let Some(keep) = &args.keep {
        let list: Vec<String> = keep.iter().map(ToString::to_string).collect();
        argv.extend(["--keep".into(), list.join(",")]);
    }
    if let Some(shape) = clap::ValueEnum::to_possible_value(&args.shape) {
        argv.extend(["--shape".into(), shape.get_name().to_string()]);
    }
    let started = Instant::now();
    let child = std::process::Command::new(&exe)
        .args(&argv)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| AppError::Other(format!("--replay-check: running {} again: {e}", exe.display())))?;
    if !child.status.success() {
        return Err(AppError::Other(format!(
            "--replay-check: the second process ({} {}) ended with {}",
            exe.display(),
            argv.join(" "),
            child.status
        )));
    }
    let there = parse_hashes(&String::from_utf8_lossy(&child.stdout))
        .map_err(|e| AppError::Other(format!("--replay-check: the second process's output: {e}")))?;
    let differ = mismatches(here, &there);
    let wall = started.elapsed().as_secs_f64();
    if differ.is_empty() {
        out!("replayed {} of {} seeds bit for bit in a second process ({wall:.1}s)", here.len(), here.len());
        return Ok(());
    }
    out!("{} of {} seeds ran otherwise in a second process ({wall:.1}s):", differ.len(), here.len());
    for m in differ.iter().take(20) {
        out!("  {m}");
    }
    if differ.len() > 20 {
        out!("  …");
    }
    if let Some(m) = differ.first() {
        out!(
            "compare: imaged simulate --seed {} --steps {} --trace --no-shrink (twice; the traces' first difference is the cause)",
            m.seed,
            args.steps
        );
    }
    Err(AppError::Other(format!("{} of {} seeds did not replay bit for bit", differ.len(), here.len())))
}

/// `seed N trace HASH` lines, as `--hashes` prints them.
fn parse_hashes(text: &str) -> Result<Hashes, String> {
    let mut hashes = Hashes::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = || format!("line {}: {line:?} is not `seed N trace HASH`", i + 1);
        let parts: Vec<&str> = line.split_whitespace().collect();
        let ["seed", seed, "trace", hash] = parts.as_slice() else {
            return Err(bad());
        };
        let seed = seed.parse::<u64>().map_err(|_| bad())?;
        let hash = u64::from_str_radix(hash, 16).map_err(|_| bad())?;
        if hashes.insert(seed, hash).is_some() {
            return Err(format!("line {}: seed {seed} a second time", i + 1));
        }
    }
    Ok(hashes)
}

/// A seed whose two runs differ, or that one of them lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mismatch {
    seed: u64,
    here: Option<u64>,
    there: Option<u64>,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = |h: Option<u64>| h.map_or_else(|| "no run".to_string(), |h| format!("trace {h:016x}"));
        write!(f, "seed {}: {} here, {} in the second process", self.seed, text(self.here), text(self.there))
    }
}

/// The seeds whose hashes differ between the two runs, or that only one has.
fn mismatches(here: &Hashes, there: &Hashes) -> Vec<Mismatch> {
    let seeds: BTreeSet<u64> = here.keys().chain(there.keys()).copied().collect();
    seeds
        .into_iter()
        .filter_map(|seed| {
            let (h, t) = (here.get(&seed).copied(), there.get(&seed).copied());
            (h != t).then_some(Mismatch { seed, here: h, there: t })
        })
        .collect()
}

/// The run options the arguments ask for: steps, `--keep`, `--trace`, shape.
fn options(args: &SimulateArgs) -> Options {
    Options {
        steps: args.steps,
        keep: args.keep.as_ref().map(|k| k.iter().copied().collect()),
        full_trace: args.trace,
        shape: args.shape.shape(),
    }
}

fn one(args: &SimulateArgs, seed: u64) -> Ran {
    let opts = options(args);
    let keep = opts.keep.clone();
    let started = Instant::now();
    let o = run(seed, &opts);
    let here = Hashes::from([(seed, o.trace_hash)]);
    if let Some(trace) = &o.trace {
        let mut out = std::io::stdout().lock();
        for l in trace {
            let _ = writeln!(out, "{l}");
        }
    }
    let wall = started.elapsed();
    out!("{}", summary_line(&o, wall));
    if o.passed() {
        return Ok(here);
    }
    out!("{}", report(&o, keep.as_ref()));
    if !args.no_shrink && keep.is_none() {
        shrink_and_report(args, &o);
    }
    Err((here, AppError::Other(format!("seed {seed} broke an invariant"))))
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

/// Threads for a sweep: `--jobs`, or the machine's cores.
fn jobs(args: &SimulateArgs) -> usize {
    args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get)).max(1)
}

/// Seeds `first..first + n` on [`jobs`] threads; their outcomes come on the
/// receiver as they end.
fn start(
    args: &SimulateArgs,
    opts: &Options,
    first: u64,
    n: u64,
) -> Result<(mpsc::Receiver<Outcome>, Vec<std::thread::JoinHandle<()>>), AppError> {
    let next = Arc::new(AtomicU64::new(first));
    let end = first.saturating_add(n);
    let (tx, rx) = mpsc::channel::<Outcome>();
    let mut workers = Vec::new();
    for _ in 0..jobs(args) {
        let (next, tx, opts) = (next.clone(), tx.clone(), opts.clone());
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
    Ok((rx, workers))
}

fn sweep(args: &SimulateArgs, n: u64) -> Ran {
    let jobs = jobs(args);
    let opts = Options { steps: args.steps, shape: args.shape.shape(), ..Options::default() };
    let (rx, workers) = start(args, &opts, args.first, n).map_err(|e| (Hashes::new(), e))?;
    let mut here = Hashes::new();
    let started = Instant::now();
    let terminal = std::io::stderr().is_terminal();
    let mut done = 0u64;
    let mut failed: Vec<Outcome> = Vec::new();
    let mut total = Stats::default();
    let mut simulated = Duration::ZERO;
    let mut last_draw = Instant::now();
    for o in rx {
        done += 1;
        here.insert(o.seed, o.trace_hash);
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
        return Ok(here);
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
    Err((here, AppError::Other(format!("{} of {done} seeds broke an invariant", failed.len()))))
}

fn bar(done: u64, of: u64, width: u64) -> String {
    let full = (done * width).checked_div(of).unwrap_or(width);
    let full = usize::try_from(full).unwrap_or(0);
    let width = usize::try_from(width).unwrap_or(0);
    format!("{}{}", "#".repeat(full), ".".repeat(width.saturating_sub(full)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_second_processs_lines_are_read_by_seed() {
        let text = "seed 3 trace 00000000000000ff\nseed 1 trace a1c9e8dfc3b8073b\n\n";
        let got = parse_hashes(text).expect("well-formed lines");
        assert_eq!(got, Hashes::from([(1, 0xa1c9_e8df_c3b8_073b), (3, 0xff)]));
    }

    #[test]
    fn a_line_that_is_not_a_seeds_hash_is_named() {
        let e = parse_hashes("seed 1 trace 0a\nseed two trace 0b\n").expect_err("a bad seed");
        assert_eq!(e, "line 2: \"seed two trace 0b\" is not `seed N trace HASH`");
        let e = parse_hashes("seed 1 trace xyz").expect_err("a bad hash");
        assert!(e.starts_with("line 1: "), "{e}");
        let e = parse_hashes("simulated 3 seeds").expect_err("another line");
        assert!(e.contains("is not `seed N trace HASH`"), "{e}");
        let e = parse_hashes("seed 1 trace 0a\nseed 1 trace 0a").expect_err("twice");
        assert_eq!(e, "line 2: seed 1 a second time");
    }

    #[test]
    fn seeds_that_differ_or_ran_once_are_the_mismatches() {
        let here = Hashes::from([(1, 10), (2, 20), (3, 30)]);
        let there = Hashes::from([(1, 10), (2, 21), (4, 40)]);
        let got = mismatches(&here, &there);
        assert_eq!(
            got,
            vec![
                Mismatch { seed: 2, here: Some(20), there: Some(21) },
                Mismatch { seed: 3, here: Some(30), there: None },
                Mismatch { seed: 4, here: None, there: Some(40) },
            ]
        );
        assert_eq!(
            got[0].to_string(),
            "seed 2: trace 0000000000000014 here, trace 0000000000000015 in the second process"
        );
        assert_eq!(got[1].to_string(), "seed 3: trace 000000000000001e here, no run in the second process");
        assert!(mismatches(&here, &here.clone()).is_empty());
    }
}
