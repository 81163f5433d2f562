#![allow(clippy::pedantic)] // test code: pedantic lints are for what ships
use std::time::Duration;

use super::*;
use crate::cri::{CriErrorKind, StatusCode};
use crate::testing::Scrape;

fn scrape(m: &Metrics) -> Scrape {
    Scrape::parse(&m.encode()).expect("the encoding parses")
}

#[test]
fn size_buckets_are_the_kubelets() {
    const MB: u64 = 1 << 20;
    const GB: u64 = 1 << 30;
    let cases = [
        (0, "N/A"),
        (1, "0-10MB"),
        (10 * MB, "0-10MB"),
        (10 * MB + 1, "10MB-100MB"),
        (100 * MB + 1, "100MB-500MB"),
        (500 * MB + 1, "500MB-1GB"),
        (GB, "500MB-1GB"),
        (GB + 1, "1GB-5GB"),
        (5 * GB + 1, "5GB-10GB"),
        (10 * GB + 1, "10GB-20GB"),
        (20 * GB + 1, "20GB-30GB"),
        (30 * GB + 1, "30GB-40GB"),
        (40 * GB + 1, "40GB-60GB"),
        (60 * GB + 1, "60GB-100GB"),
        (100 * GB, "60GB-100GB"),
        (100 * GB + 1, "GT100GB"),
        (u64::MAX, "GT100GB"),
    ];
    for (size, want) in cases {
        assert_eq!(image_size_bucket(size), want, "size {size}");
    }
}

#[test]
fn every_family_is_prefixed_and_typed() {
    // Labelled families appear once they have a series.
    let m = Metrics::default();
    m.image_pulled(1, Duration::from_secs(1));
    m.image_garbage_collected("age", 1);
    drop(m.ensure_request(PullPolicy::Always));
    m.mustpull_check(crate::domain::pull_record::MustPullResult::Error);
    m.credential_plugin_ran("p", Duration::from_millis(1), true);
    m.cri_call(Rpc::Version, Duration::from_millis(1), Some(&CriError::deadline_exceeded()));
    m.gc_run(true);
    m.backoff_reset(crate::metrics::BackoffResetReason::Cleared, 1);
    let s = scrape(&m);
    for (family, ty) in [
        ("imaged_image_pull_duration_seconds", "histogram"),
        ("imaged_image_garbage_collected", "counter"),
        ("imaged_image_manager_ensure_image_requests", "counter"),
        ("imaged_imagemanager_image_mustpull_checks", "counter"),
        ("imaged_credential_provider_plugin_duration", "histogram"),
        ("imaged_credential_provider_plugin_errors", "counter"),
        ("imaged_pull_queue_depth", "gauge"),
        ("imaged_pulls_in_flight", "gauge"),
        ("imaged_pull_single_flight_joins", "counter"),
        ("imaged_pull_throttle_waits", "counter"),
        ("imaged_pull_throttle_rejections", "counter"),
        ("imaged_pull_transient_retries", "counter"),
        ("imaged_backoff_entries", "gauge"),
        ("imaged_backoff_resets", "counter"),
        ("imaged_cri_request_duration_seconds", "histogram"),
        ("imaged_cri_request_errors", "counter"),
        ("imaged_image_gc_runs", "counter"),
        ("imaged_image_gc_freed_bytes", "counter"),
        ("imaged_image_gc_reclaimed_bytes", "counter"),
        ("imaged_imagemanager_ondisk_pullintents", "gauge"),
        ("imaged_imagemanager_ondisk_pulledrecords", "gauge"),
        ("imaged_build_info", "gauge"),
    ] {
        assert_eq!(s.types.get(family).map(String::as_str), Some(ty), "{family}");
    }
    assert!(s.types.keys().all(|k| k.starts_with("imaged_")), "{:?}", s.types.keys());
    // imaged restarts as a process (actors.md, panic policy): no restart counter.
    assert!(!s.types.contains_key("imaged_actor_restarts"));
    assert_eq!(s.value("imaged_build_info", &[("version", env!("CARGO_PKG_VERSION"))]), Some(1.0));
}

#[test]
fn pull_duration_uses_the_kubelets_buckets_and_size_label() {
    let m = Metrics::default();
    m.image_pulled(5 << 20, Duration::from_secs(7));
    m.image_pulled(5 << 20, Duration::from_millis(500));
    m.image_pulled(0, Duration::from_secs(4000));
    let s = scrape(&m);
    let small = [("image_size_in_bytes", "0-10MB")];
    assert_eq!(s.value("imaged_image_pull_duration_seconds_count", &small), Some(2.0));
    assert_eq!(s.value("imaged_image_pull_duration_seconds_sum", &small), Some(7.5));
    let le = |le: &'static str| [("image_size_in_bytes", "0-10MB"), ("le", le)];
    assert_eq!(s.value("imaged_image_pull_duration_seconds_bucket", &le("1.0")), Some(1.0));
    assert_eq!(s.value("imaged_image_pull_duration_seconds_bucket", &le("5.0")), Some(1.0));
    assert_eq!(s.value("imaged_image_pull_duration_seconds_bucket", &le("10.0")), Some(2.0));
    assert_eq!(s.value("imaged_image_pull_duration_seconds_bucket", &le("3600.0")), Some(2.0));
    let buckets = s
        .samples
        .iter()
        .filter(|x| {
            x.name == "imaged_image_pull_duration_seconds_bucket" && x.labels["image_size_in_bytes"] == "0-10MB"
        })
        .count();
    assert_eq!(buckets, PULL_DURATION_BUCKETS.len() + 1, "18 buckets and +Inf");
    let na = [("image_size_in_bytes", "N/A"), ("le", "+Inf")];
    assert_eq!(s.value("imaged_image_pull_duration_seconds_bucket", &na), Some(1.0));
    let na_top = [("image_size_in_bytes", "N/A"), ("le", "3600.0")];
    assert_eq!(s.value("imaged_image_pull_duration_seconds_bucket", &na_top), Some(0.0));
}

#[test]
fn ensure_tally_counts_on_drop_with_what_was_learnt() {
    let m = Metrics::default();
    {
        let mut t = m.ensure_request(PullPolicy::IfNotPresent);
        t.present_locally = Tristate::True;
        t.pull_required = Tristate::False;
    }
    for _ in 0..2 {
        let mut t = m.ensure_request(PullPolicy::Always);
        t.pull_required = true.into();
    }
    drop(m.ensure_request(PullPolicy::Never));
    let s = scrape(&m);
    let n = |policy, present, required| {
        s.value(
            "imaged_image_manager_ensure_image_requests_total",
            &[("pull_policy", policy), ("present_locally", present), ("pull_required", required)],
        )
    };
    assert_eq!(n("ifnotpresent", "true", "false"), Some(1.0));
    assert_eq!(n("always", "unknown", "true"), Some(2.0));
    assert_eq!(n("never", "unknown", "unknown"), Some(1.0));
    assert_eq!(n("never", "false", "unknown"), None);
}

#[test]
fn cri_calls_are_timed_per_method_and_errors_counted_by_code() {
    let m = Metrics::default();
    m.cri_call(Rpc::ImageStatus, Duration::from_micros(300), None);
    m.cri_call(Rpc::PullImage, Duration::from_secs(2), Some(&CriError::new(CriErrorKind::NotFound, "no such image")));
    m.cri_call(Rpc::PullImage, Duration::from_secs(3), Some(&CriError::from_status(StatusCode::Unavailable, "down")));
    let s = scrape(&m);
    assert_eq!(s.value("imaged_cri_request_duration_seconds_count", &[("method", "ImageStatus")]), Some(1.0));
    assert_eq!(s.value("imaged_cri_request_duration_seconds_count", &[("method", "PullImage")]), Some(2.0));
    assert_eq!(s.value("imaged_cri_request_duration_seconds_sum", &[("method", "PullImage")]), Some(5.0));
    assert_eq!(s.value("imaged_cri_request_duration_seconds_count", &[("method", "RemoveImage")]), Some(0.0));
    let errors = |code| s.value("imaged_cri_request_errors_total", &[("method", "PullImage"), ("code", code)]);
    assert_eq!(errors("NotFound"), Some(1.0));
    assert_eq!(errors("Unavailable"), Some(1.0));
    assert_eq!(s.sum("imaged_cri_request_errors_total", &[("method", "ImageStatus")]), 0.0);
}

#[test]
fn the_fronts_kept_answers_have_a_series_only_for_the_methods_it_keeps() {
    let m = Metrics::default();
    m.front_answer_cached(Rpc::ImageStatus);
    m.front_answer_cached(Rpc::ImageStatus);
    m.front_answer_cached(Rpc::PullImage);
    let s = scrape(&m);
    let kept = |method| s.value("imaged_cri_front_cached_answers_total", &[("method", method)]);
    assert_eq!(kept("ImageStatus"), Some(2.0));
    assert_eq!(kept("ListImages"), Some(0.0), "present from the start");
    for never in ["PullImage", "RemoveImage", "ImageFsInfo", "Version"] {
        assert_eq!(kept(never), None, "{never}: never kept, no series");
    }
}

#[test]
fn the_fronts_refused_removes_count_by_reason_every_series_from_the_start() {
    let m = Metrics::default();
    m.front_remove_refused(RemoveRefused::InUse);
    m.front_remove_refused(RemoveRefused::InUse);
    m.front_remove_refused(RemoveRefused::Pinned);
    let s = scrape(&m);
    let refused = |reason| s.value("imaged_cri_front_removes_refused_total", &[("reason", reason)]);
    assert_eq!((refused("in_use"), refused("pinned"), refused("pulling")), (Some(2.0), Some(1.0), Some(0.0)));
}

#[test]
fn cri_calls_feed_the_kubelets_runtime_operations_by_operation_type() {
    let m = Metrics::default();
    m.cri_call(Rpc::PullImage, Duration::from_secs(2), None);
    m.cri_call(Rpc::PullImage, Duration::from_secs(3), Some(&CriError::from_status(StatusCode::Unavailable, "down")));
    m.cri_call(Rpc::ListPodSandbox, Duration::from_millis(4), Some(&CriError::deadline_exceeded()));
    let s = scrape(&m);
    let op = |name: &str, ty: &str| s.value(name, &[("operation_type", ty)]);
    assert_eq!(op("imaged_runtime_operations_total", "pull_image"), Some(2.0));
    assert_eq!(op("imaged_runtime_operations_errors_total", "pull_image"), Some(1.0));
    assert_eq!(op("imaged_runtime_operations_duration_seconds_count", "pull_image"), Some(2.0));
    assert_eq!(op("imaged_runtime_operations_duration_seconds_sum", "pull_image"), Some(5.0));
    assert_eq!(op("imaged_runtime_operations_total", "list_podsandbox"), Some(1.0));
    assert_eq!(op("imaged_runtime_operations_errors_total", "list_podsandbox"), Some(1.0));
    // The kubelet's label values, every one present from the start.
    for ty in [
        "version",
        "list_images",
        "image_status",
        "remove_image",
        "image_fs_info",
        "list_containers",
        "container_status",
    ] {
        assert_eq!(op("imaged_runtime_operations_total", ty), Some(0.0), "{ty}");
        assert_eq!(op("imaged_runtime_operations_errors_total", ty), Some(0.0), "{ty}");
    }
    // The kubelet's buckets: ExponentialBuckets(.005, 2.5, 14), 4 ms in the first.
    let bucket = |le: &str| {
        s.value(
            "imaged_runtime_operations_duration_seconds_bucket",
            &[("operation_type", "list_podsandbox"), ("le", le)],
        )
    };
    assert_eq!(bucket("0.005"), Some(1.0));
    assert_eq!(bucket("+Inf"), Some(1.0));
}

#[test]
fn gauges_counters_and_info_report_what_they_were_told() {
    let m = Metrics::default();
    let other = m.clone();
    assert!(m.same_registry(&other));
    assert!(!m.same_registry(&Metrics::default()));
    other.set_pull_queue(3, 2, 1);
    m.single_flight_joined();
    m.single_flight_joined();
    m.throttle_waited();
    m.throttle_rejected();
    m.set_backoff_entries(4);
    m.image_garbage_collected("space", 100);
    m.image_garbage_collected("age", 50);
    m.gc_reclaimed(120);
    m.gc_reclaimed(-40);
    m.gc_run(true);
    m.gc_run(false);
    m.mustpull_check(crate::domain::pull_record::MustPullResult::CredentialRecordFound);
    m.credential_plugin_ran("ecr", Duration::from_millis(20), true);
    m.set_credential_provider_config("sha256:aa");
    m.set_credential_provider_config("sha256:bb");
    let s = scrape(&m);
    assert_eq!(s.value("imaged_pull_queue_depth", &[]), Some(3.0));
    assert_eq!(s.value("imaged_pull_queue_parked", &[]), Some(2.0));
    assert_eq!(s.value("imaged_pulls_in_flight", &[]), Some(1.0));
    assert_eq!(s.value("imaged_pull_single_flight_joins_total", &[]), Some(2.0));
    assert_eq!(s.value("imaged_pull_throttle_waits_total", &[]), Some(1.0));
    assert_eq!(s.value("imaged_pull_throttle_rejections_total", &[]), Some(1.0));
    assert_eq!(s.value("imaged_backoff_entries", &[]), Some(4.0));
    assert_eq!(s.value("imaged_image_garbage_collected_total", &[("reason", "space")]), Some(1.0));
    assert_eq!(s.value("imaged_image_garbage_collected_total", &[("reason", "age")]), Some(1.0));
    assert_eq!(s.value("imaged_image_gc_freed_bytes_total", &[]), Some(150.0));
    assert_eq!(s.value("imaged_image_gc_reclaimed_bytes_total", &[]), Some(120.0), "a run that lost space adds 0");
    assert_eq!(s.value("imaged_image_gc_runs_total", &[("result", "success")]), Some(1.0));
    assert_eq!(s.value("imaged_image_gc_runs_total", &[("result", "failure")]), Some(1.0));
    assert_eq!(
        s.value("imaged_imagemanager_image_mustpull_checks_total", &[("result", "credentialRecordFound")]),
        Some(1.0)
    );
    assert_eq!(s.value("imaged_credential_provider_plugin_errors_total", &[("plugin_name", "ecr")]), Some(1.0));
    assert_eq!(s.value("imaged_credential_provider_plugin_duration_count", &[("plugin_name", "ecr")]), Some(1.0));
    assert_eq!(s.value("imaged_credential_provider_config_info", &[("hash", "sha256:bb")]), Some(1.0));
    assert_eq!(s.value("imaged_credential_provider_config_info", &[("hash", "sha256:aa")]), None);
}

#[test]
fn config_info_names_the_key_settings() {
    let m = Metrics::default();
    let cfg = crate::config::Config::defaults().expect("defaults");
    m.set_config_info(&cfg.info_labels());
    let s = scrape(&m);
    let labels = [
        ("runtime_endpoint", "embedded"),
        ("pull_concurrency", "serial"),
        ("single_flight", "true"),
        ("registry_pull_qps", "5"),
        ("registry_burst", "10"),
        ("image_gc_high_threshold_percent", "85"),
    ];
    assert_eq!(s.value("imaged_config_info", &labels), Some(1.0));
}

#[test]
fn handles_compare_equal_so_settings_stay_comparable() {
    assert_eq!(Metrics::default(), Metrics::default());
    assert_eq!(format!("{:?}", Metrics::default()), "Metrics { .. }");
}

#[test]
fn pull_failures_name_a_bounded_number_of_registries() {
    let m = Metrics::new();
    for i in 0..MAX_FAILURE_REGISTRIES + 5 {
        m.pull_failed(&format!("r{i}.example"), "not_found");
    }
    // A registry named before keeps its label past the bound.
    m.pull_failed("r0.example", "network");
    let s = scrape(&m);
    let by_registry = s.by_label("imaged_pull_failures_total", "registry");
    let named = by_registry.iter().filter(|(r, _)| r != "other").count();
    assert_eq!(named, MAX_FAILURE_REGISTRIES + 1, "one registry with two reasons among them");
    assert_eq!(s.value("imaged_pull_failures_total", &[("registry", "other")]), Some(5.0));
    assert_eq!(s.value("imaged_pull_failures_total", &[("registry", "r0.example"), ("reason", "network")]), Some(1.0));
}
