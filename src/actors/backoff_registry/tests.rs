//! Table logic with explicit instants (plain tests), then the actor with
//! paused tokio time.

use std::time::Duration;

use actix::prelude::*;
use tokio::time::Instant;

use super::*;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn key(pod: &str, image: &str) -> BackoffKey {
    BackoffKey::new(pod, image)
}

// === BackoffTable ===

#[test]
fn key_displays_as_the_kubelet_key() {
    assert_eq!(key("uid-1", "nginx").to_string(), "uid-1_nginx");
    assert_eq!(key("uid-1", "docker.io/library/nginx:1.27").to_string(), "uid-1_docker.io/library/nginx:1.27");
}

#[test]
fn default_config_is_the_kubelets() {
    let cfg = BackoffDelays::default();
    assert_eq!((cfg.initial, cfg.max, cfg.expiry()), (secs(10), secs(300), secs(600)));
}

#[test]
fn backoff_doubles_from_10s_and_caps_at_300s() {
    let mut t = BackoffTable::new(BackoffDelays::default());
    let k = key("p", "img");
    let mut now = Instant::now();
    let mut seen = Vec::new();
    for _ in 0..8 {
        let b = t.next(&k, now);
        assert_eq!(t.current(&k), Some(b));
        seen.push(b.as_secs());
        // Retry when the back-off ends, as the kubelet's pod worker would.
        now += b;
    }
    assert_eq!(seen, [10, 20, 40, 80, 160, 300, 300, 300]);
}

#[test]
fn in_backoff_until_last_update_plus_backoff_strictly() {
    let mut t = BackoffTable::new(BackoffDelays::default());
    let k = key("p", "img");
    let t0 = Instant::now();
    assert!(!t.is_in_backoff_since_update(&k, t0), "no entry, no back-off");
    assert_eq!(t.retry_in(&k, t0), None);
    t.next(&k, t0);
    assert!(t.is_in_backoff_since_update(&k, t0));
    assert_eq!(t.retry_in(&k, t0), Some(secs(10)));
    let just_before = t0 + secs(10) - Duration::from_nanos(1);
    assert!(t.is_in_backoff_since_update(&k, just_before));
    assert_eq!(t.retry_in(&k, just_before), Some(Duration::from_nanos(1)));
    assert!(!t.is_in_backoff_since_update(&k, t0 + secs(10)), "elapsed == backoff is out (strict <)");
    assert_eq!(t.retry_in(&k, t0 + secs(10)), None);

    // Second failure at 10 s: 20 s from then.
    t.next(&k, t0 + secs(10));
    assert!(t.is_in_backoff_since_update(&k, t0 + secs(30) - Duration::from_nanos(1)));
    assert!(!t.is_in_backoff_since_update(&k, t0 + secs(30)));
}

#[test]
fn entry_idle_over_600s_expires_and_restarts_at_10s() {
    let mut t = BackoffTable::new(BackoffDelays::default());
    let k = key("p", "img");
    let t0 = Instant::now();
    for i in 0..6 {
        t.next(&k, t0 + secs(i));
    }
    assert_eq!(t.current(&k), Some(secs(300)));
    let last = t0 + secs(5);

    // Exactly 600 s idle: not expired, so the next failure stays at the cap.
    assert!(!t.is_expired(&k, last + secs(600)));
    let mut at_boundary = t.clone();
    assert_eq!(at_boundary.next(&k, last + secs(600)), secs(300));

    // A moment more: expired, not in back-off, and the next failure starts over.
    let after = last + secs(600) + Duration::from_nanos(1);
    assert!(t.is_expired(&k, after));
    assert!(!t.is_in_backoff_since_update(&k, after));
    assert_eq!(t.next(&k, after), secs(10));
    assert_eq!(t.next(&k, after + secs(10)), secs(20));
}

#[test]
fn previous_error_text_is_kept_until_cleared() {
    let mut t = BackoffTable::new(BackoffDelays::default());
    let k = key("p", "img");
    let t0 = Instant::now();
    t.next(&k, t0);
    t.set_previous_error(&k, "ErrImagePull: rpc error: code = NotFound desc = nope");
    assert_eq!(t.previous_error(&k), Some("ErrImagePull: rpc error: code = NotFound desc = nope"));
    t.clear_previous_error(&k);
    assert_eq!(t.previous_error(&k), None);
    assert_eq!(t.current(&k), Some(secs(10)), "clearing the text keeps the period");
}

#[test]
fn gc_deletes_only_expired_entries_and_their_texts() {
    let mut t = BackoffTable::new(BackoffDelays::default());
    let (old, fresh) = (key("p1", "a"), key("p2", "b"));
    let t0 = Instant::now();
    t.next(&old, t0);
    t.set_previous_error(&old, "old error");
    t.next(&fresh, t0 + secs(500));
    t.set_previous_error(&fresh, "fresh error");
    assert_eq!(t.gc(t0 + secs(600)), 0, "600 s idle is not expired");
    assert_eq!(t.gc(t0 + secs(601)), 1);
    assert_eq!((t.current(&old), t.previous_error(&old)), (None, None));
    assert_eq!((t.current(&fresh), t.previous_error(&fresh)), (Some(secs(10)), Some("fresh error")));
}

#[test]
fn clear_by_pod_image_key_and_all_counts_entries() {
    let mut t = BackoffTable::new(BackoffDelays::default());
    let now = Instant::now();
    for (pod, image) in [("p1", "a"), ("p1", "b"), ("p2", "a"), ("p2", "c"), ("p3", "c")] {
        t.next(&key(pod, image), now);
        t.set_previous_error(&key(pod, image), "boom");
    }
    assert_eq!(t.clear(&ClearScope::Pod("p1".into())), 2);
    assert_eq!(t.previous_error(&key("p1", "a")), None);
    assert_eq!(t.clear(&ClearScope::Pod("p1".into())), 0, "already gone");
    assert_eq!(t.clear(&ClearScope::Image("c".into())), 2, "image c of p2 and p3");
    assert_eq!(t.clear(&ClearScope::Key(key("p2", "b"))), 0, "p2 never pulled b");
    assert_eq!(t.clear(&ClearScope::Key(key("p2", "a"))), 1);
    assert!(t.is_empty());
    t.next(&key("p9", "z"), now);
    t.next(&key("p8", "y"), now);
    assert_eq!(t.clear(&ClearScope::All), 2);
    assert_eq!(t.entries(now), []);
}

#[test]
fn an_image_is_cleared_under_any_of_its_names() {
    // Pods name images as they like; an operator clears the image.
    let mut t = BackoffTable::new(BackoffDelays::default());
    let now = Instant::now();
    for (pod, image) in [("p1", "doesnotexist/foo:1"), ("p2", "docker.io/doesnotexist/foo:1"), ("p3", "nginx")] {
        t.next(&key(pod, image), now);
    }
    assert_eq!(t.clear(&ClearScope::Image("docker.io/doesnotexist/foo:1".into())), 2);
    assert_eq!(t.clear(&ClearScope::Key(key("p3", "docker.io/library/nginx:latest"))), 1);
    assert!(t.is_empty());
}

#[test]
fn cleared_key_starts_again_at_initial() {
    let mut t = BackoffTable::new(BackoffDelays::default());
    let k = key("p", "img");
    let now = Instant::now();
    t.next(&k, now);
    t.next(&k, now);
    t.clear(&ClearScope::Key(k.clone()));
    assert!(!t.is_in_backoff_since_update(&k, now));
    assert_eq!(t.next(&k, now), secs(10));
}

#[test]
fn custom_cap_of_60s_caps_the_sequence_and_expires_after_120s() {
    let cfg = BackoffDelays::try_new(secs(10), secs(60)).expect("valid");
    assert_eq!(cfg.expiry(), secs(120));
    let mut t = BackoffTable::new(cfg);
    let k = key("p", "img");
    let mut now = Instant::now();
    let mut seen = Vec::new();
    for _ in 0..5 {
        let b = t.next(&k, now);
        seen.push(b.as_secs());
        now += b;
    }
    assert_eq!(seen, [10, 20, 40, 60, 60]);
    let last = now - secs(60);
    assert!(!t.is_expired(&k, last + secs(120)));
    assert!(t.is_expired(&k, last + secs(121)));
    assert_eq!(t.gc(last + secs(120)), 0);
    assert_eq!(t.gc(last + secs(121)), 1);
}

#[test]
fn try_new_rejects_zero_initial_and_max_below_initial_naming_both() {
    let err = BackoffDelays::try_new(Duration::ZERO, secs(300)).expect_err("zero initial");
    assert_eq!(err, InvalidBackoff::ZeroInitial { initial: Duration::ZERO, max: secs(300) });
    let text = err.to_string();
    assert!(text.contains("0ns") && text.contains("300s"), "{text}");

    let err = BackoffDelays::try_new(secs(10), secs(5)).expect_err("max below initial");
    let text = err.to_string();
    assert!(text.contains("10s") && text.contains("5s"), "{text}");
    assert_eq!(text, "back-off max period 5s is shorter than the initial period 10s");

    assert!(BackoffDelays::try_new(secs(10), secs(10)).is_ok(), "max == initial is fine");
}

#[test]
fn keys_are_per_pod_and_per_image_string() {
    let mut t = BackoffTable::new(BackoffDelays::default());
    let t0 = Instant::now();
    let (a, b) = (key("pod-a", "nginx"), key("pod-b", "nginx"));
    t.next(&a, t0);
    t.next(&a, t0);
    t.next(&b, t0);
    assert_eq!((t.current(&a), t.current(&b)), (Some(secs(20)), Some(secs(10))));
    assert_eq!(t.current(&key("pod-a", "nginx:latest")), None, "raw strings, not normalised");
    assert!(!t.is_in_backoff_since_update(&b, t0 + secs(10)));
    assert!(t.is_in_backoff_since_update(&a, t0 + secs(10)));
}

#[test]
fn entries_are_sorted_and_show_retry_in_expiry_and_text() {
    let mut t = BackoffTable::new(BackoffDelays::default());
    let t0 = Instant::now();
    t.next(&key("p2", "x"), t0);
    t.next(&key("p1", "y"), t0 - secs(700));
    t.set_previous_error(&key("p2", "x"), "ErrImagePull: boom");
    let views = t.entries(t0 + secs(4));
    assert_eq!(
        views,
        [
            BackoffView { key: key("p1", "y"), backoff: secs(10), retry_in: None, expired: true, previous_error: None },
            BackoffView {
                key: key("p2", "x"),
                backoff: secs(10),
                retry_in: Some(secs(6)),
                expired: false,
                previous_error: Some("ErrImagePull: boom".into()),
            },
        ]
    );
}

// === BackoffRegistryActor (paused time) ===

fn start(gc_interval: Option<Duration>) -> Addr<BackoffRegistryActor> {
    BackoffRegistryActor::new(BackoffDelays::default(), 64, gc_interval).start()
}

async fn fail(addr: &Addr<BackoffRegistryActor>, k: &BackoffKey, text: &str) -> Duration {
    addr.send(RecordFailure::new(k.clone(), text)).await.expect("registry answers")
}

async fn check(addr: &Addr<BackoffRegistryActor>, k: &BackoffKey) -> BackoffCheck {
    addr.send(CheckBackoff { key: k.clone(), credentials: None }).await.expect("registry answers")
}

async fn list(addr: &Addr<BackoffRegistryActor>) -> Vec<BackoffView> {
    addr.send(ListBackoffs).await.expect("registry answers")
}

#[actix::test]
async fn registry_follows_the_kubelet_sequence_with_paused_time() {
    tokio::time::pause();
    let addr = start(None);
    let k = key("p", "img");
    let mut seen = Vec::new();
    for _ in 0..7 {
        let b = fail(&addr, &k, "ErrImagePull: boom").await;
        seen.push(b.as_secs());
        tokio::time::advance(b.checked_sub(Duration::from_millis(1)).unwrap()).await;
        assert!(check(&addr, &k).await.in_backoff, "1 ms before the end of {b:?}");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!check(&addr, &k).await.in_backoff, "at the end of {b:?}");
    }
    assert_eq!(seen, [10, 20, 40, 80, 160, 300, 300]);
}

#[actix::test]
async fn check_reports_previous_error_until_begin_attempt() {
    tokio::time::pause();
    let addr = start(None);
    let k = key("p", "img");
    let unknown = check(&addr, &k).await;
    assert_eq!(
        unknown,
        BackoffCheck {
            in_backoff: false,
            previous_error: None,
            retry_in: None,
            backoff: None,
            credentials_changed: false
        }
    );

    let text = "ErrImagePull: rpc error: code = Unknown desc = failed to resolve";
    assert_eq!(fail(&addr, &k, text).await, secs(10));
    tokio::time::advance(secs(3)).await;
    let c = check(&addr, &k).await;
    assert_eq!(
        c,
        BackoffCheck {
            in_backoff: true,
            previous_error: Some(text.into()),
            retry_in: Some(secs(7)),
            backoff: Some(secs(10)),
            credentials_changed: false,
        }
    );

    tokio::time::advance(secs(7)).await;
    let c = check(&addr, &k).await;
    assert!(!c.in_backoff);
    assert_eq!(c.previous_error.as_deref(), Some(text), "kept until a pull is attempted");
    addr.send(BeginAttempt { key: k.clone() }).await.expect("registry answers");
    let c = check(&addr, &k).await;
    assert_eq!((c.previous_error, c.backoff), (None, Some(secs(10))), "text gone, period kept");
    assert_eq!(fail(&addr, &k, "ErrImagePull: again").await, secs(20));
}

#[actix::test]
async fn check_reports_no_period_for_an_expired_entry() {
    tokio::time::pause();
    let addr = start(None);
    let k = key("p", "img");
    fail(&addr, &k, "x").await;
    tokio::time::advance(secs(600)).await;
    assert_eq!(check(&addr, &k).await.backoff, Some(secs(10)), "600 s idle: still live");
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(check(&addr, &k).await.backoff, None);
    assert_eq!(fail(&addr, &k, "x").await, secs(10), "expired: starts over");
}

#[actix::test]
async fn record_success_gcs_expired_entries_only() {
    tokio::time::pause();
    let addr = start(None);
    let (old, fresh) = (key("p1", "a"), key("p2", "b"));
    fail(&addr, &old, "old").await;
    tokio::time::advance(secs(500)).await;
    fail(&addr, &fresh, "fresh").await;
    tokio::time::advance(secs(101)).await; // old: 601 s idle, fresh: 101 s
    assert_eq!(list(&addr).await.len(), 2, "nothing deletes entries without a success or a timer");
    addr.send(RecordSuccess).await.expect("registry answers");
    let left: Vec<BackoffKey> = list(&addr).await.into_iter().map(|v| v.key).collect();
    assert_eq!(left, [fresh]);
}

#[actix::test]
async fn clear_backoff_by_pod_image_key_and_all() {
    tokio::time::pause();
    let addr = start(None);
    for (pod, image) in [("p1", "a"), ("p1", "b"), ("p2", "a"), ("p3", "c"), ("p4", "d")] {
        fail(&addr, &key(pod, image), "boom").await;
    }
    let clear = |scope| addr.send(ClearBackoff { scope });
    assert_eq!(clear(ClearScope::Pod("p1".into())).await.expect("answers"), 2);
    assert_eq!(clear(ClearScope::Image("a".into())).await.expect("answers"), 1, "p2's a; p1's is gone");
    assert_eq!(clear(ClearScope::Key(key("p3", "c"))).await.expect("answers"), 1);
    assert!(!check(&addr, &key("p3", "c")).await.in_backoff, "retry now");
    assert_eq!(clear(ClearScope::All).await.expect("answers"), 1);
    assert_eq!(list(&addr).await, []);
}

#[actix::test]
async fn same_image_in_two_pods_backs_off_independently() {
    tokio::time::pause();
    let addr = start(None);
    let (a, b) = (key("pod-a", "nginx"), key("pod-b", "nginx"));
    fail(&addr, &a, "a1").await;
    tokio::time::advance(secs(10)).await;
    assert_eq!(fail(&addr, &a, "a2").await, secs(20));
    assert_eq!(fail(&addr, &b, "b1").await, secs(10));
    tokio::time::advance(secs(10)).await;
    let (ca, cb) = (check(&addr, &a).await, check(&addr, &b).await);
    assert!(ca.in_backoff && !cb.in_backoff);
    assert_eq!((ca.previous_error.as_deref(), cb.previous_error.as_deref()), (Some("a2"), Some("b1")));
}

#[actix::test]
async fn gc_timer_deletes_expired_entries_while_the_registry_answers() {
    tokio::time::pause();
    let addr = start(Some(secs(60)));
    let (old, fresh) = (key("p1", "a"), key("p2", "b"));
    fail(&addr, &old, "old").await; // t = 0
    // Ticks at 60, 120, … 600: none sees more than 600 s idle.
    for _ in 0..10 {
        tokio::time::advance(secs(60)).await;
        assert_eq!(list(&addr).await.len(), 1);
    }
    tokio::time::advance(secs(30)).await; // t = 630
    fail(&addr, &fresh, "fresh").await;
    assert!(check(&addr, &fresh).await.in_backoff);
    tokio::time::advance(secs(30)).await; // t = 660: a tick, old is 660 s idle
    tokio::task::yield_now().await;
    let left: Vec<BackoffKey> = list(&addr).await.into_iter().map(|v| v.key).collect();
    assert_eq!(left, std::slice::from_ref(&fresh));
    // The fresh entry goes once it has been idle over 600 s: tick at 1260 (idle 630).
    tokio::time::advance(secs(600)).await;
    tokio::task::yield_now().await;
    assert_eq!(list(&addr).await, []);
}

#[actix::test]
async fn zero_gc_interval_means_no_timer() {
    tokio::time::pause();
    let addr = start(Some(Duration::ZERO));
    fail(&addr, &key("p", "img"), "x").await;
    tokio::time::advance(secs(3600)).await;
    assert_eq!(list(&addr).await.len(), 1, "only RecordSuccess deletes it");
    addr.send(RecordSuccess).await.expect("registry answers");
    assert_eq!(list(&addr).await, []);
}

#[actix::test]
async fn mailbox_capacity_is_set_when_started() {
    let addr = BackoffRegistryActor::new(BackoffDelays::default(), 2, None).start();
    addr.send(ListBackoffs).await.expect("started");
    let full = (0..50).map(|_| addr.try_send(RecordSuccess)).filter(|r| matches!(r, Err(SendError::Full(_)))).count();
    assert!(full > 0, "a capacity of 2 rejects part of a burst of 50");
}

#[actix::test]
async fn other_credentials_than_the_last_failures_reset_the_back_off() {
    tokio::time::pause();
    let addr = start(None);
    let k = key("p", "img");
    let with = |creds: Option<&str>| CheckBackoff { key: k.clone(), credentials: creds.map(str::to_owned) };
    let failed = |creds: Option<&str>| RecordFailure {
        key: k.clone(),
        error_text: "ErrImagePull: unauthorized".into(),
        credentials: creds.map(str::to_owned),
        transient_registry: None,
    };
    assert_eq!(addr.send(failed(Some("anonymous"))).await.unwrap(), secs(10));
    assert_eq!(addr.send(failed(Some("anonymous"))).await.unwrap(), secs(20));
    // The same credentials, or none tracked (the kubelet's path): still in back-off.
    let same = addr.send(with(Some("anonymous"))).await.unwrap();
    assert!(same.in_backoff && !same.credentials_changed);
    assert!(addr.send(with(None)).await.unwrap().in_backoff);
    // A secret was added: the back-off goes, and the next failure starts again at 10 s.
    let changed = addr.send(with(Some("secret-a"))).await.unwrap();
    assert_eq!(
        changed,
        BackoffCheck {
            in_backoff: false,
            previous_error: None,
            retry_in: None,
            backoff: None,
            credentials_changed: true
        }
    );
    assert!(list(&addr).await.is_empty());
    assert_eq!(addr.send(failed(Some("secret-a"))).await.unwrap(), secs(10));
    // A failure recorded without credentials is never reset by them.
    let other = key("q", "img");
    addr.send(RecordFailure::new(other.clone(), "x")).await.unwrap();
    let c = addr.send(CheckBackoff { key: other, credentials: Some("secret-b".into()) }).await.unwrap();
    assert!(c.in_backoff && !c.credentials_changed);
}

#[actix::test]
async fn a_registry_that_recovers_ends_the_transient_back_offs_waiting_on_it() {
    tokio::time::pause();
    let addr = start(None);
    let fail_on = |k: &BackoffKey, registry: Option<&str>| RecordFailure {
        transient_registry: registry.map(str::to_owned),
        ..RecordFailure::new(k.clone(), "ErrImagePull: registry unavailable")
    };
    let (a, b, c, d) =
        (key("p1", "flaky.io/a:1"), key("p2", "flaky.io/b:1"), key("p3", "other.io/c:1"), key("p4", "flaky.io/d:1"));
    addr.send(fail_on(&a, Some("flaky.io"))).await.unwrap();
    addr.send(fail_on(&b, Some("flaky.io"))).await.unwrap();
    addr.send(fail_on(&c, Some("other.io"))).await.unwrap();
    // d failed transiently, then permanently (not found): the later failure drops the mark.
    addr.send(fail_on(&d, Some("flaky.io"))).await.unwrap();
    addr.send(fail_on(&d, None)).await.unwrap();
    assert_eq!(addr.send(RegistryRecovered { registry: "flaky.io".into() }).await.unwrap(), 2);
    let left: Vec<BackoffKey> = list(&addr).await.into_iter().map(|v| v.key).collect();
    assert_eq!(left, [c.clone(), d.clone()]);
    assert!(!check(&addr, &a).await.in_backoff);
    assert!(check(&addr, &c).await.in_backoff, "another registry's back-off stays");
    assert!(check(&addr, &d).await.in_backoff, "a permanent failure's back-off stays");
    assert_eq!(addr.send(RegistryRecovered { registry: "flaky.io".into() }).await.unwrap(), 0, "idempotent");
}

#[actix::test]
async fn early_ends_of_back_offs_are_counted_by_reason() {
    tokio::time::pause();
    let metrics = crate::metrics::Metrics::default();
    let addr = BackoffRegistryActor::new(BackoffDelays::default(), 64, None).with_metrics(metrics.clone()).start();
    let failed = |k: &BackoffKey| RecordFailure {
        credentials: Some("anonymous".into()),
        transient_registry: Some("flaky.io".into()),
        ..RecordFailure::new(k.clone(), "ErrImagePull: unavailable")
    };
    let keys: Vec<BackoffKey> = (0..5).map(|i| key(&format!("p{i}"), "flaky.io/a:1")).collect();
    for k in &keys {
        addr.send(failed(k)).await.unwrap();
    }
    addr.send(CheckBackoff { key: keys[0].clone(), credentials: Some("secret".into()) }).await.unwrap();
    addr.send(ClearBackoff { scope: ClearScope::Key(keys[1].clone()) }).await.unwrap();
    addr.send(ClearBackoff { scope: ClearScope::Key(keys[1].clone()) }).await.unwrap();
    assert_eq!(addr.send(RegistryRecovered { registry: "flaky.io".into() }).await.unwrap(), 3);
    let scrape = crate::testing::Scrape::parse(&metrics.encode()).unwrap();
    assert_eq!(
        scrape.by_label("imaged_backoff_resets_total", "reason"),
        [
            ("cleared".to_string(), 1.0),
            ("credentials_changed".to_string(), 1.0),
            ("registry_recovered".to_string(), 3.0)
        ]
    );
}

#[actix::test]
async fn new_delays_apply_to_the_next_failure_and_cap_a_long_back_off_at_once() {
    tokio::time::pause();
    let addr = start(None);
    let (long, fresh) = (key("p", "long"), key("p", "fresh"));
    for _ in 0..6 {
        fail(&addr, &long, "ErrImagePull: boom").await;
    }
    assert_eq!(check(&addr, &long).await.backoff, Some(secs(300)));
    let delays = BackoffDelays::try_new(secs(2), secs(30)).unwrap();
    addr.send(UpdateBackoffDelays(delays)).await.expect("registry answers");
    // The key at 300 s waits no longer than the new cap from its last failure.
    let c = check(&addr, &long).await;
    assert_eq!((c.backoff, c.retry_in), (Some(secs(30)), Some(secs(30))));
    tokio::time::advance(secs(30)).await;
    assert!(!check(&addr, &long).await.in_backoff, "free at the new cap");
    // New keys double from the new initial period to the new cap.
    let seen: Vec<u64> = {
        let mut v = Vec::new();
        for _ in 0..6 {
            v.push(fail(&addr, &fresh, "ErrImagePull: boom").await.as_secs());
        }
        v
    };
    assert_eq!(seen, [2, 4, 8, 16, 30, 30]);
    // Entries expire after twice the new cap.
    tokio::time::advance(secs(61)).await;
    assert_eq!(fail(&addr, &fresh, "ErrImagePull: boom").await, secs(2), "expired: from the initial period");
}

#[actix::test]
async fn a_longer_initial_period_lifts_a_short_back_off_and_a_longer_cap_revives_nothing() {
    tokio::time::pause();
    let addr = start(None);
    let (short, old) = (key("p", "short"), key("p", "old"));
    // Expired under the default delays (twice the 300 s cap), not yet collected.
    fail(&addr, &old, "ErrImagePull: boom").await;
    tokio::time::advance(secs(601)).await;
    assert_eq!(fail(&addr, &short, "ErrImagePull: boom").await, secs(10));
    let delays = BackoffDelays::try_new(secs(60), secs(3600)).unwrap();
    addr.send(UpdateBackoffDelays(delays)).await.expect("registry answers");
    // The 10 s back-off is lifted to the new initial period.
    let c = check(&addr, &short).await;
    assert_eq!((c.backoff, c.retry_in), (Some(secs(60)), Some(secs(60))));
    // The expired key starts again from the new initial period, not from
    // its old period doubled (the new cap's expiry would have kept it).
    assert!(!check(&addr, &old).await.in_backoff);
    assert_eq!(fail(&addr, &old, "ErrImagePull: boom").await, secs(60));
}

#[actix::test]
async fn a_longer_initial_period_leaves_a_key_whose_wait_is_over_free() {
    tokio::time::pause();
    let addr = start(None);
    let free = key("p", "free");
    assert_eq!(fail(&addr, &free, "ErrImagePull: boom").await, secs(10));
    tokio::time::advance(secs(30)).await;
    assert!(!check(&addr, &free).await.in_backoff, "its 10 s are over");
    let delays = BackoffDelays::try_new(secs(60), secs(3600)).unwrap();
    addr.send(UpdateBackoffDelays(delays)).await.expect("registry answers");
    assert!(!check(&addr, &free).await.in_backoff, "a reload does not put it back");
    // Its next failure is never below the new initial period.
    assert_eq!(fail(&addr, &free, "ErrImagePull: boom").await, secs(60));
}

#[actix::test]
async fn a_reload_that_drops_expired_entries_updates_the_entries_gauge() {
    tokio::time::pause();
    let metrics = crate::metrics::Metrics::default();
    let addr = BackoffRegistryActor::new(BackoffDelays::default(), 64, None).with_metrics(metrics.clone()).start();
    fail(&addr, &key("p", "old"), "ErrImagePull: boom").await;
    let entries = || crate::testing::Scrape::parse(&metrics.encode()).unwrap().value("imaged_backoff_entries", &[]);
    assert_eq!(entries(), Some(1.0));
    tokio::time::advance(secs(601)).await;
    let delays = BackoffDelays::try_new(secs(10), secs(3600)).unwrap();
    addr.send(UpdateBackoffDelays(delays)).await.expect("registry answers");
    assert_eq!(entries(), Some(0.0), "expired under the old delays: collected, and counted so");
}

#[actix::test]
async fn the_registry_publishes_an_empty_table_so_a_check_of_it_need_not_be_sent() {
    let registry = BackoffRegistryActor::from_settings(&BackoffSettings::default());
    let occupancy = registry.occupancy();
    assert!(!occupancy.is_empty(), "not known before the registry starts");
    let addr = registry.start();
    let port = BackoffPort::from(&addr);
    assert!(!port.known_clear(), "a port from an address alone sends every check");
    let port = port.with_occupancy(occupancy.clone());
    assert_eq!(addr.send(ListBackoffs).await.unwrap(), vec![], "started");
    assert!(port.known_clear(), "an empty table: nothing backs off");
    let key = BackoffKey::new("u1", "example.com/a:1");
    port.failure.send(RecordFailure::new(key.clone(), "ErrImagePull: denied")).await.unwrap();
    assert!(!port.known_clear(), "a recorded failure is seen by the next check");
    let check = port.check.send(CheckBackoff { key: key.clone(), credentials: None }).await.unwrap();
    assert!(check.in_backoff, "which asks, and is told");
    // Another key's entry: checks of every key are sent again.
    let other = BackoffKey::new("u2", "example.com/b:1");
    port.failure.send(RecordFailure::new(other, "ErrImagePull: denied")).await.unwrap();
    assert_eq!(addr.send(ClearBackoff { scope: ClearScope::Key(key) }).await.unwrap(), 1);
    assert!(!port.known_clear(), "one entry left");
    assert_eq!(addr.send(ClearBackoff { scope: ClearScope::All }).await.unwrap(), 1);
    assert!(port.known_clear(), "cleared: known empty again");
    // A credentials-changed reset empties it too.
    let key = BackoffKey::new("u3", "example.com/c:1");
    let failed = RecordFailure { credentials: Some("h1".into()), ..RecordFailure::new(key.clone(), "ErrImagePull: x") };
    port.failure.send(failed).await.unwrap();
    let check = port.check.send(CheckBackoff { key, credentials: Some("h2".into()) }).await.unwrap();
    assert!(check.credentials_changed && port.known_clear());
    // Stopped: not known any more, so a check is sent, and fails as a
    // stopped registry's does.
    addr.send(crate::actors::Stop).await.unwrap();
    for _ in 0..1000 {
        if !occupancy.is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(!occupancy.is_empty(), "a stopped registry's table is not known");
    assert!(!port.known_clear());
    assert!(port.check.send(CheckBackoff { key: BackoffKey::new("u", "i"), credentials: None }).await.is_err());
}
