//! Image GC costs at node scale, pure (no runtime): 100 000 images, 20 000
//! containers. Prints `name: value` lines. The three headline figures:
//!
//! - `records_rss_mb`: resident memory added by 100 000 image records
//!   (VmRSS before and after loading them, as from the durable store).
//!   Target ≤ 60.
//! - `detect_100k_ms`: `Records::detect` over 100 000 listed images with
//!   20 000 containers' images in use, records already known (the steady
//!   state every 5 minutes); median of several runs. Target ≤ 200. The
//!   first detection (every record new) is `detect_first_100k_ms`.
//! - `gc_plan_100k_ms`: `plan_gc` over those records with usage above the
//!   high threshold (the free-space pass runs), protection rules on; median
//!   of several runs. Target ≤ 50.
//!
//! Data: 64-hex image ids, 1–3 tags of about 40 characters and one digest
//! per image, sizes 10 MiB–2 GiB, first detections over 30 days.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::pedantic)] // test code: a failed unwrap is a failed test

use std::collections::HashSet;
use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use imaged::domain::{Image, ImageSpec};
use imaged::gc::capacity::FsCapacity;
use imaged::gc::detect::Records;
use imaged::gc::plan::{GcMode, GcRunInputs, plan_gc};
use imaged::gc::policy::{GcPolicy, ProtectionRules};
use imaged::gc::record::{ImageRecord, RecordKey};

const IMAGES: usize = 100_000;
const CONTAINERS: usize = 20_000;
const RUNS: usize = 11;
const DAY: u64 = 86_400;

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
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut rng = Rng(2024);

    // Memory first, on a fresh heap: records built one at a time and moved
    // in (as when loaded from the store), nothing else allocated meanwhile.
    let before = rss_kib();
    let loaded: Records = (0..IMAGES)
        .map(|i| {
            let img = image(&mut rng, i);
            record(&mut rng, &img)
        })
        .collect();
    let after = rss_kib();
    let rss_mb = after.saturating_sub(before) as f64 / 1024.0;
    println!("records_rss_mb: {rss_mb:.1}");
    println!("records_rss_bytes_per_record: {:.0}", rss_mb * 1024.0 * 1024.0 / IMAGES as f64);
    drop(loaded);

    // The runtime's list, and the images 20 000 containers use.
    let images: Vec<Image> = (0..IMAGES).map(|i| image(&mut rng, i)).collect();
    let in_use: HashSet<String> =
        (0..CONTAINERS).map(|_| images[rng.below(IMAGES as u64) as usize].id.clone()).collect();
    println!("in_use_images: {}", in_use.len());

    // First detection: every record new.
    let mut first = Vec::new();
    for _ in 0..5 {
        let mut records = Records::new();
        let start = Instant::now();
        let diff = records.detect(&images, &in_use, now());
        first.push(ms(start.elapsed()));
        assert_eq!(diff.added.len(), IMAGES);
        black_box(&records);
    }
    println!("detect_first_100k_ms: {:.1}", median(first));

    // Steady state: known records, the in-use ones used again.
    let mut records: Records = images.iter().map(|img| record(&mut rng, img)).collect();
    records.detect(&images, &in_use, now());
    let mut steady = Vec::new();
    let mut updated = 0;
    for run in 1..=RUNS as u64 {
        let at = now() + Duration::from_secs(300 * run);
        let start = Instant::now();
        let diff = records.detect(&images, &in_use, at);
        steady.push(ms(start.elapsed()));
        updated = diff.updated.len();
        black_box(&diff);
    }
    println!("detect_100k_ms: {:.1}", median(steady));
    println!("detect_100k_updated: {updated}");

    // A plan with usage above the high threshold: images fill 90 % of the
    // filesystem.
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
        sandbox_image_id: Some(images[7].id.clone()),
        keep_newest_tags_per_repo: None,
    };
    let began = now() - Duration::from_secs(DAY);
    let at = now() + Duration::from_secs(300 * (RUNS as u64 + 1));
    let mut times = Vec::new();
    let mut summary = String::new();
    for _ in 0..RUNS {
        let start = Instant::now();
        let plan = plan_gc(GcRunInputs {
            records: &records,
            in_use: &in_use,
            fs,
            policy: &policy,
            rules: &rules,
            began,
            now: at,
            mode: GcMode::Threshold,
        });
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
    println!("gc_plan_100k_ms: {:.1}", median(times));
    println!("gc_plan_100k_summary: {summary}");

    rules.keep_newest_tags_per_repo = Some(2);
    let mut times = Vec::new();
    for _ in 0..RUNS {
        let start = Instant::now();
        let plan = plan_gc(GcRunInputs {
            records: &records,
            in_use: &in_use,
            fs,
            policy: &policy,
            rules: &rules,
            began,
            now: at,
            mode: GcMode::Threshold,
        });
        times.push(ms(start.elapsed()));
        black_box(&plan);
    }
    println!("gc_plan_100k_retention_ms: {:.1}", median(times));

    let mut times = Vec::new();
    for _ in 0..RUNS {
        let start = Instant::now();
        let plan = plan_gc(GcRunInputs {
            records: &records,
            in_use: &in_use,
            fs,
            policy: &policy,
            rules: &rules,
            began,
            now: at,
            mode: GcMode::DeleteUnused,
        });
        times.push(ms(start.elapsed()));
        black_box(&plan);
    }
    println!("gc_plan_100k_delete_unused_ms: {:.1}", median(times));
}
