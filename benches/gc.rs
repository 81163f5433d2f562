//! Image GC costs at node scale, pure (no runtime): detection and planning
//! at 10,000, 100,000 and 1,000,000 images (a fifth as many containers),
//! and the memory of the image records. Prints `name: value` lines.
//!
//! - `detect_{n}_ms`: one steady-state detection (records known, the
//!   in-use ones used again, every 5 minutes) through the detector's own
//!   logic (`Detector::apply`: who uses what, then the kubelet's record
//!   rules); `detect_first_{n}_ms`: the first one (every record new);
//!   `gc_plan_{n}_ms`: `plan_gc` with usage above the high threshold.
//!   Each the median of repeated runs (min and max printed too). Targets at
//!   100k: detect ≤ 200, plan ≤ 50.
//! - `*_growth_10k_to_1m`: time per image at 1M ÷ at 10k. 1.0 is linear;
//!   n log n would be about 1.5 (log 1M ÷ log 10k).
//! - `records_rss_mb`: resident memory of 100,000 records between
//!   detections; `records_peak_rss_mb`: the same at the peak of a
//!   detection (what the detection adds on top, its input list excluded).
//!   Measured in a fresh child process each (`gc --peak N`), in the steady
//!   state (a detection after the restart grace). Target at the peak: ≤ 60.
//!   `records_{n}_heap_mb_in_restart_grace`: the same right after records
//!   were loaded at a start, while every loaded image counts as in use
//!   (`recent_window`, 2 minutes here). `bytes_per_record_{n}`: heap bytes per record, counted by
//!   the allocator. `records_{n}_peak_heap_mb_during_a_gc_run`: the peak
//!   of a detection while a GC run removes images (the run holds its
//!   report, not the detection); `..._if_the_last_were_held`: what the
//!   same detection costs when someone holds the last one (every record
//!   copied). `gc_report_{n}_heap_mb` (and `_bytes_per_image`): a run's
//!   whole report; `gc_last_report_{n}_heap_mb`: what the executor keeps of
//!   it between runs (`GcReport::bounded`); `gc_report_{n}_api_mb` and
//!   `gc_last_report_{n}_api_mb`: each as the API sends it (the last one
//!   goes with every `imagectl status`); and
//!   `records_{n}_peak_heap_mb_with_the_last_report`: the peak of a
//!   detection between runs while it is kept, as in the daemon (and during
//!   the periodic run, which holds only that much of its report;
//!   `..._during_a_gc_run` is a run someone asked for, holding all of it).
//!
//! - `store_open_{n}_ms`, `store_load_image_records_{n}_ms` (n ≤ 100k): a
//!   restart's store work before imaged serves — the database opened (its
//!   integrity check and a read of every entry) and the records loaded;
//!   `store_file_{n}_mb` its size.
//!
//! Data: 64-hex image ids, 1–3 tags of about 40 characters and one digest
//! per image, sizes 10 MiB–2 GiB, first detections over 30 days.
//! `GC_BENCH_SIZES=10000,100000` picks the sizes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use imaged::actors::detector::{Detection, Detector, DetectorSettings, Listed};
use imaged::actors::gc_executor::{GcReport, KEPT_LISTED_PER_REASON};
use imaged::clock::ManualClock;
use imaged::domain::{Container, ContainerState, Image, ImageSpec};
use imaged::gc::capacity::FsCapacity;
use imaged::gc::detect::Records;
use imaged::gc::in_use_hints::InUseHints;
use imaged::gc::plan::{GcMode, GcRunInputs, plan_gc};
use imaged::gc::policy::{GcPolicy, ProtectionRules};
use imaged::gc::record::{ImageRecord, RecordKey};
use imaged::store::Store;

const DAY: u64 = 86_400;

#[path = "common/mem.rs"]
mod mem;
use mem::{live, peak_bytes, reset_hwm, reset_peak};

#[global_allocator]
static ALLOC: mem::Counting = mem::Counting;

/// A deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn hex64(&mut self) -> String {
        format!("{:016x}{:016x}{:016x}{:016x}", self.next(), self.next(), self.next(), self.next())
    }
}

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_780_000_000)
}

/// One image as the runtime lists it: `sha256:` + 64 hex, 1–3 tags of
/// about 40 characters in one repository, one digest.
fn image(rng: &mut Rng, i: usize) -> Image {
    let repo = format!("reg.example.com/team{:02}/svc-{:05}", rng.below(100), i % 40_000);
    let tags = (0..=rng.below(3)).map(|t| format!("{repo}:v1.{t}.{:03}", rng.below(1000))).collect();
    let digest = format!("{repo}@sha256:{}", rng.hex64());
    Image {
        id: format!("sha256:{}", rng.hex64()),
        repo_tags: tags,
        repo_digests: vec![digest],
        size: (10 << 20) + rng.below(2 << 30),
        spec: i.is_multiple_of(50).then(|| ImageSpec::new("").with_runtime_handler("kata")),
        pinned: i.is_multiple_of(1000),
        ..Image::default()
    }
}

/// The record of an image, with history: first detected within 30 days (a
/// few in the last minute), three in four used at some point.
fn record(rng: &mut Rng, img: &Image) -> ImageRecord {
    let first = if rng.below(200) == 0 { rng.below(60) } else { rng.below(30 * DAY) };
    let first_detected = now() - Duration::from_secs(first);
    let last_used = (rng.below(4) != 0).then(|| first_detected + Duration::from_secs(rng.below(first + 1)));
    ImageRecord {
        key: RecordKey {
            id: img.id.clone(),
            runtime_handler: img.spec.as_ref().map(|s| s.runtime_handler.clone()).unwrap_or_default(),
        },
        first_detected,
        last_used,
        size: img.size,
        pinned: img.pinned,
        repo_tags: img.repo_tags.clone(),
        repo_digests: img.repo_digests.clone(),
    }
}

fn rss_kib() -> u64 {
    mem::status_kib(None, "VmRSS:").unwrap_or(0)
}

fn mb(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// min, median, max.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn label(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n.is_multiple_of(1_000_000) => format!("{}m", n / 1_000_000),
        n if n >= 1_000 && n.is_multiple_of(1_000) => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

fn print_spread(name: &str, v: Vec<f64>) -> f64 {
    let (lo, mid, hi) = spread(v);
    println!("{name}: {mid:.1}");
    println!("{name}_min_median_max: {lo:.1} / {mid:.1} / {hi:.1}");
    mid
}

/// A node's listing: `n` images, and `n / 5` running containers on random ones.
fn listing(rng: &mut Rng, n: usize) -> Listed {
    let images: Vec<Image> = (0..n).map(|i| image(rng, i)).collect();
    let containers = (0..n / 5)
        .map(|c| Container {
            id: format!("c{c}"),
            pod_sandbox_id: format!("sb{}", c / 2),
            name: format!("app{}", c % 2),
            image_ref: images[rng.below(n as u64) as usize].id.clone(),
            state: ContainerState::Running,
            ..Container::default()
        })
        .collect();
    Listed { images, containers, ..Listed::default() }
}

fn settings() -> DetectorSettings {
    DetectorSettings {
        period: Duration::from_secs(300),
        sandbox_image: String::new(),
        recent_window: Duration::from_secs(120),
        mailbox_capacity: 1,
    }
}

/// A detector just restarted: every listed image's record loaded from the
/// store, one detection made, still in the restart grace (every loaded
/// image counts as in use for `recent_window`).
fn restarted_detector(rng: &mut Rng, listed: &Listed) -> (Detector, ManualClock) {
    let clock = ManualClock::new();
    let mut detector = Detector::new(&settings(), InUseHints::default(), clock.clock());
    detector.load(listed.images.iter().map(|img| record(rng, img)).collect());
    drop(detector.apply(listed.clone()));
    (detector, clock)
}

/// A detector standing at `now()` with every listed image's record known,
/// past the restart grace (one detection after it: the steady state).
fn steady_detector(rng: &mut Rng, listed: &Listed) -> (Detector, ManualClock) {
    let (mut detector, clock) = restarted_detector(rng, listed);
    clock.advance(Duration::from_secs(300));
    drop(detector.apply(listed.clone()));
    (detector, clock)
}

/// Times at `n` images; returns (detect, plan) per-image microseconds.
fn timings(n: usize) -> (f64, f64) {
    let l = label(n);
    let runs = if n >= 1_000_000 { 5 } else { 11 };
    let mut rng = Rng(2024 + n as u64);
    let listed = listing(&mut rng, n);

    let mut first = Vec::new();
    for _ in 0..runs.min(5) {
        let clock = ManualClock::new();
        let mut detector = Detector::new(&settings(), InUseHints::default(), clock.clock());
        let input = listed.clone();
        let start = Instant::now();
        let (detection, write) = detector.apply(input);
        first.push(ms(start.elapsed()));
        assert_eq!(detection.records.len(), n);
        black_box((&detection, &write));
    }
    print_spread(&format!("detect_first_{l}_ms"), first);

    let (mut detector, clock) = steady_detector(&mut rng, &listed);
    let mut steady = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        clock.advance(Duration::from_secs(300));
        let input = listed.clone();
        drop(last.take());
        let start = Instant::now();
        let (detection, write) = detector.apply(input);
        steady.push(ms(start.elapsed()));
        black_box(&write);
        last = Some(detection);
    }
    let detect = print_spread(&format!("detect_{l}_ms"), steady);
    let detection = last.expect("a detection");
    println!("detect_{l}_in_use_images: {}", detection.in_use.len());

    // A plan with usage above the high threshold: images fill 90 % of the
    // filesystem.
    let records: &Records = &detection.records;
    let in_use = detection.in_use_ids();
    let image_bytes: u64 = records.iter().map(|r| r.size).sum();
    let capacity = image_bytes / 90 * 100;
    let fs = FsCapacity { capacity, available: capacity - image_bytes };
    let policy = GcPolicy::default();
    let mut rules = ProtectionRules {
        pinned_images: vec![
            "registry.k8s.io/*".into(),
            "reg.example.com/team07/*".into(),
            "reg.example.com/team01/svc-00042:*".into(),
        ],
        sandbox_image_id: Some(listed.images[7].id.clone()),
        keep_newest_tags_per_repo: None,
    };
    let began = detection.at - Duration::from_secs(DAY);
    let at = detection.at + Duration::from_secs(60);
    let plan_times = |rules: &ProtectionRules, mode: GcMode| {
        let mut times = Vec::new();
        let mut summary = String::new();
        for _ in 0..runs {
            let start = Instant::now();
            let plan =
                plan_gc(GcRunInputs { records, in_use: &in_use, fs, policy: &policy, rules, began, now: at, mode });
            times.push(ms(start.elapsed()));
            if let Ok(plan) = &plan {
                summary = format!(
                    "usage {:?}% amount {} deletions {} bytes {}",
                    plan.usage_percent,
                    plan.amount_to_free,
                    plan.deletions().count(),
                    plan.bytes_to_delete
                );
            }
            black_box(&plan);
        }
        (times, summary)
    };
    let (times, summary) = plan_times(&rules, GcMode::Threshold);
    let plan = print_spread(&format!("gc_plan_{l}_ms"), times);
    println!("gc_plan_{l}_summary: {summary}");
    rules.keep_newest_tags_per_repo = Some(2);
    print_spread(&format!("gc_plan_{l}_retention_ms"), plan_times(&rules, GcMode::Threshold).0);
    print_spread(&format!("gc_plan_{l}_delete_unused_ms"), plan_times(&rules, GcMode::DeleteUnused).0);
    (detect * 1e3 / n as f64, plan * 1e3 / n as f64)
}

/// What a GC run keeps through its removals: the report of a plan from
/// `detection` (usage above the high threshold, default policy).
fn gc_report(detection: &Detection) -> GcReport {
    let image_bytes: u64 = detection.records.iter().map(|r| r.size).sum();
    let capacity = image_bytes / 90 * 100;
    let fs = FsCapacity { capacity, available: capacity - image_bytes };
    let (policy, rules) = (GcPolicy::default(), ProtectionRules::default());
    let began = detection.at - Duration::from_secs(DAY);
    let inputs = GcRunInputs {
        records: &detection.records,
        in_use: detection,
        fs,
        policy: &policy,
        rules: &rules,
        began,
        now: detection.at,
        mode: GcMode::Threshold,
    };
    let plan = plan_gc(inputs).expect("a plan");
    GcReport::from_plan(&plan, |id| detection.used_by(id), false, began, fs)
}

/// In a fresh process: the records' memory between detections and at the
/// peak of one.
fn peak(n: usize) {
    let l = label(n);
    let mut rng = Rng(7 + n as u64);
    let rss_start = rss_kib();
    let heap_start = live();
    let listed = listing(&mut rng, n);
    let (rss_listed, heap_listed) = (rss_kib(), live());
    // Right after a restart: the records, and every loaded image held as
    // in use by the last detection for the grace.
    let (mut detector, clock) = restarted_detector(&mut rng, &listed);
    let in_grace_heap = live() - heap_listed;
    // Past the grace: the steady state.
    clock.advance(Duration::from_secs(300));
    drop(detector.apply(listed.clone()));
    clock.advance(Duration::from_secs(300));
    let input = listed.clone();
    // Between detections: the records (and the detector's small state).
    let (rss_between, heap_between) = (rss_kib(), live());
    // Less the detection's input, a copy of the listing.
    let (listing_heap, listing_rss) = (heap_listed - heap_start, rss_listed.saturating_sub(rss_start));
    let records_heap = heap_between - heap_listed - listing_heap;
    let records_rss_kib = rss_between.saturating_sub(rss_listed).saturating_sub(listing_rss) as f64;

    let hwm_reset = reset_hwm();
    reset_peak();
    let (detection, write) = detector.apply(input);
    let transient_heap = peak_bytes() - heap_between;
    let transient_rss_kib = mem::status_kib(None, "VmHWM:").unwrap_or(0).saturating_sub(rss_between);
    black_box(&write);
    drop(write);

    // A detection while a GC run removes images: the run planned from the
    // last detection, keeps its report and has let the detection go
    // (`run_gc`), so the records are updated in place.
    clock.advance(Duration::from_secs(300));
    let before_report = live();
    let report = gc_report(&detection);
    let report_heap = live().saturating_sub(before_report);
    drop(detection);
    let input = listed.clone();
    reset_peak();
    let (during, write) = detector.apply(input);
    let during_gc_transient = peak_bytes().saturating_sub(heap_between);
    black_box((&report, &during, &write));
    drop(write);
    // What the executor keeps of that report until the next run.
    let before_last = live();
    let last = report.bounded(KEPT_LISTED_PER_REASON);
    let last_heap = live().saturating_sub(before_last);
    // And what `imagectl status` receives of each (the API's message).
    let api_bytes = |r: &GcReport| prost::Message::encoded_len(&imaged::api::convert::gc_report(r));
    let (report_api, last_api) = (api_bytes(&report), api_bytes(&last));
    drop(report);

    // The same if the last detection were still held (as a GC run held it
    // through its removals until this session): every record is copied.
    clock.advance(Duration::from_secs(300));
    let input = listed.clone();
    let before_held = live();
    reset_peak();
    let (held, write) = detector.apply(input);
    let held_transient = peak_bytes() - before_held;
    black_box((&during, &held, &write));
    drop((during, held, write));

    // A detection between runs, as the daemon makes it: the executor holds
    // the last run's report as it keeps it.
    clock.advance(Duration::from_secs(300));
    let input = listed.clone();
    reset_peak();
    let (between_runs, write) = detector.apply(input);
    let with_last_transient = peak_bytes().saturating_sub(heap_between);
    black_box((&last, &between_runs, &write));
    drop((last, between_runs, write));

    let records_rss = records_rss_kib / 1024.0;
    println!("listing_{l}_heap_mb: {:.1}", mb(listing_heap as f64));
    println!("listing_{l}_rss_mb: {:.1}", listing_rss as f64 / 1024.0);
    println!("records_{l}_heap_mb: {:.1}", mb(records_heap as f64));
    println!("bytes_per_record_{l}: {:.0}", records_heap as f64 / n as f64);
    println!("detection_{l}_transient_heap_mb: {:.1}", mb(transient_heap as f64));
    println!("records_{l}_peak_heap_mb: {:.1}", mb((records_heap + transient_heap) as f64));
    println!("records_{l}_peak_heap_mb_during_a_gc_run: {:.1}", mb((records_heap + during_gc_transient) as f64));
    println!("records_{l}_peak_heap_mb_if_the_last_were_held: {:.1}", mb((records_heap + held_transient) as f64));
    println!("records_{l}_heap_mb_in_restart_grace: {:.1}", mb(in_grace_heap as f64));
    println!("gc_report_{l}_heap_mb: {:.1}", mb(report_heap as f64));
    println!("gc_report_{l}_bytes_per_image: {:.0}", report_heap as f64 / n as f64);
    println!("gc_last_report_{l}_heap_mb: {:.2}", mb(last_heap as f64));
    println!("gc_report_{l}_api_mb: {:.2}", report_api as f64 / 1e6);
    println!("gc_last_report_{l}_api_mb: {:.2}", last_api as f64 / 1e6);
    println!("records_{l}_peak_heap_mb_with_the_last_report: {:.1}", mb((records_heap + with_last_transient) as f64));
    if n == 100_000 {
        println!("records_rss_mb: {records_rss:.1}");
        if hwm_reset {
            println!("records_peak_rss_mb: {:.1}", records_rss + transient_rss_kib as f64 / 1024.0);
        } else {
            println!("records_peak_rss_mb: unavailable (cannot reset VmHWM via /proc/self/clear_refs)");
        }
    }
}

/// What a restart costs at `n` images before imaged serves: the state
/// database opened (redb's integrity check and a read of every entry, as
/// every open does) and the image records loaded, timed three times over a
/// database holding every record of a node's listing.
fn restart(n: usize) {
    let l = label(n);
    let mut rng = Rng(11 + n as u64);
    let listed = listing(&mut rng, n);
    let records: Vec<ImageRecord> = listed.images.iter().map(|img| record(&mut rng, img)).collect();
    drop(listed);
    let dir = tempfile::Builder::new().prefix("imgc").tempdir_in("/var/tmp").expect("tempdir");
    {
        let store = Store::open(dir.path()).expect("store");
        let t = Instant::now();
        store.apply_image_records(&records, &[]).expect("write");
        println!("store_write_{l}_records_ms: {:.0}", t.elapsed().as_secs_f64() * 1e3);
    }
    drop(records);
    let size = std::fs::metadata(dir.path().join("imaged.redb")).map(|m| m.len()).unwrap_or(0);
    println!("store_file_{l}_mb: {:.1}", size as f64 / 1e6);
    let (mut open, mut load) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let t = Instant::now();
        let store = Store::open(dir.path()).expect("reopen");
        open.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let loaded = store.image_records().expect("load");
        load.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(loaded.len(), n);
    }
    print_spread(&format!("store_open_{l}_ms"), open);
    print_spread(&format!("store_load_image_records_{l}_ms"), load);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--peak") {
        peak(args[i + 1].parse().expect("--peak N"));
        return;
    }
    let sizes: Vec<usize> = std::env::var("GC_BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().parse().expect("GC_BENCH_SIZES: numbers")).collect())
        .unwrap_or_else(|| vec![10_000, 100_000, 1_000_000]);

    // Memory first, each size in a fresh process (a heap nothing else used).
    let me = std::env::current_exe().expect("own path");
    for &n in &sizes {
        let out = std::process::Command::new(&me).args(["--peak", &n.to_string()]).output().expect("child");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }

    // A restart's store work, up to 100k (1M would write a 700 MB file).
    for &n in sizes.iter().filter(|&&n| n <= 100_000) {
        restart(n);
    }

    let per_image: Vec<(usize, (f64, f64))> = sizes.iter().map(|&n| (n, timings(n))).collect();
    for (n, (detect, plan)) in &per_image {
        println!("detect_{}_us_per_image: {detect:.3}", label(*n));
        println!("gc_plan_{}_us_per_image: {plan:.3}", label(*n));
    }
    if let (Some((lo_n, lo)), Some((hi_n, hi))) = (per_image.first(), per_image.last())
        && hi_n > lo_n
    {
        let name = format!("{}_to_{}", label(*lo_n), label(*hi_n));
        println!("detect_growth_{name}: {:.2}", hi.0 / lo.0);
        println!("gc_plan_growth_{name}: {:.2}", hi.1 / lo.1);
        println!("n_log_n_growth_{name}: {:.2}", (*hi_n as f64).ln() / (*lo_n as f64).ln());
    }
}
