//! The demo's simulated registries: a few dozen images with realistic
//! sizes, pull times scaled down so the whole run fits in half a minute,
//! one private registry, one slow (far-away) registry host and one image
//! that does not exist anywhere.

use std::time::Duration;

use crate::embedded::RemoteImage;

/// The sandbox (pause) image every node has; preloaded, as on a real node.
pub const PAUSE: &str = "registry.k8s.io/pause:3.10";
/// Node agents (DaemonSets).
pub const KUBE_PROXY: &str = "registry.k8s.io/kube-proxy:v1.31.2";
/// Node agents (DaemonSets).
pub const NODE_EXPORTER: &str = "quay.io/prometheus/node-exporter:v1.8.2";
/// Node agents (DaemonSets).
pub const FLUENT_BIT: &str = "cr.fluentbit.io/fluent/fluent-bit:3.1.9";
/// The service-mesh sidecar in every meshed pod: the most shared image.
pub const ISTIO_PROXY: &str = "docker.io/istio/proxyv2:1.23.2";
/// Init containers.
pub const BUSYBOX: &str = "docker.io/library/busybox:1.36";
/// CronJob helpers.
pub const ALPINE: &str = "docker.io/library/alpine:3.20";
/// CronJob helpers.
pub const KUBECTL: &str = "docker.io/bitnami/kubectl:1.31";
/// Ingress.
pub const NGINX: &str = "docker.io/library/nginx:1.27";
/// Data stores.
pub const REDIS: &str = "docker.io/library/redis:7.4";
/// Data stores.
pub const POSTGRES: &str = "docker.io/library/postgres:16.4";
/// Queue workers.
pub const PYTHON: &str = "docker.io/library/python:3.12-slim";
/// The shop's web front end, before and after its rollout.
pub const WEB_V1: &str = "ghcr.io/acme/shop-web:v1.4.0";
/// The shop's web front end, before and after its rollout.
pub const WEB_V2: &str = "ghcr.io/acme/shop-web:v1.5.0";
/// The shop's API, before and after its rollout.
pub const API_V1: &str = "ghcr.io/acme/shop-api:v2.3.1";
/// The shop's API, before and after its rollout.
pub const API_V2: &str = "ghcr.io/acme/shop-api:v2.4.0";
/// Cart service.
pub const CART: &str = "ghcr.io/acme/cart:v0.9.2";
/// Checkout service.
pub const CHECKOUT: &str = "ghcr.io/acme/checkout:v1.0.3";
/// Search, before and after its rollout.
pub const SEARCH_V1: &str = "ghcr.io/acme/search:v3.1.0";
/// Search, before and after its rollout.
pub const SEARCH_V2: &str = "ghcr.io/acme/search:v3.2.0";
/// A Python + PyTorch service: large.
pub const RECOMMENDER: &str = "ghcr.io/acme/recommender:v0.7.0";
/// Schema migration job.
pub const DB_MIGRATE: &str = "ghcr.io/acme/db-migrate:v2.4.0";
/// Batch jobs.
pub const ETL: &str = "ghcr.io/acme/etl:1.7.2";
/// Batch jobs.
pub const SPARK: &str = "docker.io/apache/spark:3.5.3";
/// Batch jobs: a training image of several gigabytes.
pub const ML_TRAIN: &str = "ghcr.io/acme/ml-train:2024.11";
/// Batch jobs.
pub const REPORT_BATCH: &str = "ghcr.io/acme/report-batch:2.1";
/// Private registry: needs the `billing/regcred` pull secret.
pub const LEDGER: &str = "registry.acme.internal/billing/ledger:4.2.0";
/// Private registry: needs the `billing/regcred` pull secret.
pub const INVOICER: &str = "registry.acme.internal/billing/invoicer:4.2.0";
/// The private registry's host.
pub const PRIVATE_HOST: &str = "registry.acme.internal";
/// Slow registry host (a far-away mirror).
pub const REPORT_UI: &str = "registry.slow.example.org/analytics/report-ui:1.2.0";
/// Slow registry host (a far-away mirror).
pub const ANALYTICS_WORKER: &str = "registry.slow.example.org/analytics/worker:1.2.0";
/// The slow registry's host.
pub const SLOW_HOST: &str = "registry.slow.example.org";
/// Not in any registry: the crash-looping pod's image.
pub const MISSING: &str = "ghcr.io/acme/legacy-reporter:0.3.1";

/// The private registry's user (the password is made up per run).
pub const PRIVATE_USER: &str = "billing-ci";

/// Pull bandwidth of the simulation: 1.2 GB per (demo) second, plus a
/// fixed per-pull round trip. Real pulls are some 20 times slower.
const BYTES_PER_SECOND: u64 = 1_200_000_000;
const ROUND_TRIP: Duration = Duration::from_millis(80);
/// The slow registry answers this many times slower.
pub const SLOW_FACTOR: u32 = 6;

/// How long pulling `size` bytes takes in the simulation.
pub fn pull_time(size: u64, slow: bool) -> Duration {
    let transfer = Duration::from_micros(size.saturating_mul(1_000_000) / BYTES_PER_SECOND);
    let t = ROUND_TRIP + transfer;
    if slow { t * SLOW_FACTOR } else { t }
}

/// Every image in the demo's registries with its size in bytes.
pub const IMAGES: &[(&str, u64)] = &[
    (PAUSE, 320_368),
    (KUBE_PROXY, 91_514_880),
    (NODE_EXPORTER, 23_841_792),
    (FLUENT_BIT, 96_468_992),
    (ISTIO_PROXY, 271_712_256),
    (BUSYBOX, 4_261_574),
    (ALPINE, 7_806_976),
    (KUBECTL, 78_118_912),
    (NGINX, 192_118_784),
    (REDIS, 117_440_512),
    (POSTGRES, 453_001_216),
    (PYTHON, 130_547_712),
    (WEB_V1, 184_025_088),
    (WEB_V2, 186_122_240),
    (API_V1, 243_269_632),
    (API_V2, 245_366_784),
    (CART, 151_003_136),
    (CHECKOUT, 205_520_896),
    (SEARCH_V1, 612_368_384),
    (SEARCH_V2, 618_659_840),
    (RECOMMENDER, 1_240_465_408),
    (DB_MIGRATE, 95_420_416),
    (ETL, 824_180_736),
    (SPARK, 1_052_770_304),
    (ML_TRAIN, 3_401_580_544),
    (REPORT_BATCH, 388_014_080),
    (LEDGER, 312_475_648),
    (INVOICER, 287_309_824),
    (REPORT_UI, 212_860_928),
    (ANALYTICS_WORKER, 384_827_392),
];

/// Capacity of the simulated image filesystem: about the size of every
/// image in the registries, so the node cannot keep them all and GC must
/// make room as the workload moves on.
pub const DISK_BYTES: u64 = 12_000_000_000;

/// The size of `image` in the demo's registries.
pub fn size_of(image: &str) -> Option<u64> {
    IMAGES.iter().find(|(n, _)| *n == image).map(|(_, s)| *s)
}

/// The registries' content, ready for `EmbeddedRuntime::add_remote`;
/// private images demand `PRIVATE_USER` with `password`.
pub fn remote_images(password: &str) -> Vec<RemoteImage> {
    IMAGES
        .iter()
        .map(|(name, size)| {
            let host = name.split('/').next().unwrap_or("");
            let img = RemoteImage::new(*name, *size).latency(pull_time(*size, host == SLOW_HOST));
            if host == PRIVATE_HOST { img.private(PRIVATE_USER, password) } else { img }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registries_hold_a_few_dozen_images_more_than_the_disk_and_not_the_missing_one() {
        assert!(IMAGES.len() >= 24, "{}", IMAGES.len());
        let total: u64 = IMAGES.iter().map(|(_, s)| s).sum();
        assert!(total > DISK_BYTES, "every image fits ({total} <= {DISK_BYTES}): GC would have nothing to do");
        assert!(size_of(MISSING).is_none());
        let imgs = remote_images("pw");
        assert_eq!(imgs.iter().filter(|i| i.credentials.is_some()).count(), 2);
        let slow = imgs.iter().find(|i| i.name == REPORT_UI).map(|i| i.pull_latency);
        let fast = imgs.iter().find(|i| i.name == WEB_V1).map(|i| i.pull_latency);
        assert!(slow > fast, "{slow:?} vs {fast:?}");
    }

    #[test]
    fn pull_time_grows_with_size_and_the_slow_host() {
        assert_eq!(pull_time(0, false), ROUND_TRIP);
        assert_eq!(pull_time(1_200_000_000, false), ROUND_TRIP + Duration::from_secs(1));
        assert_eq!(pull_time(1_200_000_000, true), (ROUND_TRIP + Duration::from_secs(1)) * SLOW_FACTOR);
    }
}
