#![allow(clippy::pedantic)] // test code: pedantic lints are for what ships
use super::*;

fn key(image: &str) -> PullKey {
    PullKey { image: image.into(), runtime_handler: String::new(), credentials: String::new() }
}

fn with_creds(image: &str, creds: &str) -> PullKey {
    PullKey { credentials: creds.into(), ..key(image) }
}

#[test]
fn serial_runs_one_at_a_time_in_fifo_order() {
    let mut q: PullQueue<&str, u32> = PullQueue::new(Concurrency::Serial, Some(10), true);
    for (i, img) in ["a", "b", "c"].into_iter().enumerate() {
        assert_eq!(q.submit(key(img), 0, img, i as u32), Submitted::Queued);
    }
    assert_eq!(q.start_next().map(|(_, r)| r), Some("a"));
    assert_eq!(q.start_next(), None, "one at a time");
    assert_eq!(q.finish(&key("a")), vec![0]);
    assert_eq!(q.start_next().map(|(_, r)| r), Some("b"));
}

#[test]
fn higher_priority_starts_first_fifo_within_a_priority() {
    let mut q: PullQueue<&str, ()> = PullQueue::new(Concurrency::Serial, None, true);
    q.submit(key("low1"), 0, "low1", ());
    q.submit(key("high1"), 10, "high1", ());
    q.submit(key("low2"), 0, "low2", ());
    q.submit(key("high2"), 10, "high2", ());
    q.submit(key("neg"), -5, "neg", ());
    let mut order = Vec::new();
    while let Some((k, r)) = q.start_next() {
        order.push(r);
        q.finish(&k);
    }
    assert_eq!(order, ["high1", "high2", "low1", "low2", "neg"]);
}

#[test]
fn same_key_joins_queued_or_running_pull_different_credentials_do_not() {
    let mut q: PullQueue<&str, u32> = PullQueue::new(Concurrency::Parallel(Some(4)), None, true);
    assert_eq!(q.submit(key("img"), 0, "first", 1), Submitted::Queued);
    assert_eq!(q.submit(key("img"), 0, "second", 2), Submitted::Joined);
    assert_eq!(q.submit(with_creds("img", "secret-a"), 0, "other-creds", 3), Submitted::Queued);
    let (k, r) = q.start_next().expect("starts");
    assert_eq!((k.clone(), r), (key("img"), "first"));
    assert_eq!(q.submit(key("img"), 0, "third", 4), Submitted::Joined, "joins a running pull too");
    assert_eq!(q.queued(), 1);
    assert_eq!(q.finish(&k), vec![1, 2, 4]);
    assert_eq!(q.start_next().map(|(k, _)| k), Some(with_creds("img", "secret-a")));
}

#[test]
fn without_single_flight_every_request_is_its_own_pull() {
    let mut q: PullQueue<u32, u32> = PullQueue::new(Concurrency::Parallel(None), None, false);
    for i in 0..3 {
        assert_eq!(q.submit(key("img"), 0, i, i), Submitted::Queued);
    }
    let started: Vec<_> = std::iter::from_fn(|| q.start_next()).collect();
    assert_eq!(started.len(), 3);
}

#[test]
fn a_full_queue_parks_requests_in_arrival_order_until_a_pull_starts() {
    let mut q: PullQueue<u32, u32> = PullQueue::new(Concurrency::Serial, Some(2), true);
    assert_eq!(q.submit(key("a"), 0, 0, 0), Submitted::Queued);
    assert_eq!(q.submit(key("b"), 0, 1, 1), Submitted::Queued);
    assert_eq!(q.submit(key("c"), 9, 2, 2), Submitted::Parked, "full: parked even with a high priority");
    assert_eq!(q.submit(key("d"), 0, 3, 3), Submitted::Parked);
    // Joining needs no slot, but a request behind parked ones keeps its turn.
    assert_eq!(q.submit(key("a"), 0, 4, 4), Submitted::Joined);
    assert_eq!(q.parked(), 2);
    assert!(q.admit_parked(|_, _, _| {}).is_empty(), "still full");
    let (k, _) = q.start_next().expect("a starts");
    assert_eq!(k, key("a"));
    let mut seen = Vec::new();
    assert_eq!(q.admit_parked(|_, _, w| seen.push(*w)), vec![(key("c"), Submitted::Queued)]);
    assert_eq!(seen, [2]);
    assert_eq!(q.parked(), 1);
    // c (priority 9) now outranks b.
    q.finish(&k);
    assert_eq!(q.start_next().map(|(k, _)| k), Some(key("c")));
}

#[test]
fn requests_parked_with_one_key_all_join_the_pull_made_for_the_first() {
    // Capacity 1: a burst of two images, asked for alternately, parks.
    let mut q: PullQueue<u32, u32> = PullQueue::new(Concurrency::Serial, Some(1), true);
    let must = |img: &str| PullKey::new(img.into(), String::new(), String::new(), true);
    assert_eq!(q.submit(must("x"), 0, 0, 0), Submitted::Queued);
    for (i, img) in ["b", "c", "b", "c", "b"].into_iter().enumerate() {
        assert_eq!(q.submit(must(img), 0, 0, i as u32 + 1), Submitted::Parked);
    }
    let (x, _) = q.start_next().expect("x starts");
    let mut seen = Vec::new();
    // b is queued for the first b; the other two join it (they arrived
    // before its pull starts), and c stays parked behind the full queue.
    assert_eq!(
        q.admit_parked(|_, how, w| seen.push((*w, how))),
        vec![(must("b"), Submitted::Queued), (must("b"), Submitted::Joined), (must("b"), Submitted::Joined)]
    );
    assert_eq!(seen, [(1, Submitted::Queued), (3, Submitted::Joined), (5, Submitted::Joined)]);
    assert_eq!(q.parked(), 2, "both c requests, in arrival order");
    q.finish(&x);
    let (b, _) = q.start_next().expect("b starts");
    assert_eq!(q.admit_parked(|_, _, _| {}), vec![(must("c"), Submitted::Queued), (must("c"), Submitted::Joined)]);
    assert_eq!(q.parked(), 0);
    assert_eq!(q.finish(&b), vec![1, 3, 5], "one pull answers every b");
    let (c, _) = q.start_next().expect("c starts");
    assert_eq!(q.finish(&c), vec![2, 4]);
    assert_eq!(q.start_next(), None, "three pulls for six requests");
}

#[test]
fn parallel_limit_bounds_running_pulls() {
    let mut q: PullQueue<u32, ()> = PullQueue::new(Concurrency::Parallel(Some(3)), None, true);
    for i in 0..10 {
        q.submit(key(&format!("i{i}")), 0, i, ());
    }
    let started: Vec<_> = std::iter::from_fn(|| q.start_next()).collect();
    assert_eq!(started.len(), 3);
    assert_eq!(q.running(), 3);
    q.finish(&started[0].0);
    assert!(q.start_next().is_some());
    assert!(q.start_next().is_none());
}

#[test]
fn a_finished_pull_frees_its_slot_and_a_later_request_is_a_new_pull() {
    let mut q: PullQueue<u32, u32> = PullQueue::new(Concurrency::Serial, None, true);
    q.submit(key("a"), 0, 0, 0);
    q.submit(key("b"), 0, 1, 1);
    let (a, _) = q.start_next().expect("a");
    assert!(q.start_next().is_none());
    assert_eq!(q.submit(key("a"), 0, 2, 2), Submitted::Joined, "a takes joiners while it runs");
    assert_eq!(q.finish(&a), vec![0, 2], "a's waiters are answered when it pulled");
    assert_eq!(q.running(), 0);
    assert_eq!(q.submit(key("a"), 0, 3, 3), Submitted::Queued, "a pull that ended takes no joiners");
    let (b, _) = q.start_next().expect("b starts once a's slot is free");
    assert_eq!(b, key("b"));
    assert_eq!(q.finish(&a), vec![3], "a's new pull, taken out unrun, answers its own waiter");
    assert_eq!(q.running(), 1, "b runs");
    assert_eq!(q.finish(&b), vec![1]);
    assert_eq!(q.running(), 0);
}

#[test]
fn registry_of_is_the_domain_of_the_normalised_reference() {
    assert_eq!(registry_of("docker.io/library/busybox:1.36"), "docker.io");
    assert_eq!(registry_of("localhost:5000/app:1"), "localhost:5000");
    assert_eq!(registry_of("not a reference"), "not a reference");
}

#[test]
fn a_registry_at_its_limit_is_passed_over_and_keeps_its_place() {
    let mut q: PullQueue<&str, ()> =
        PullQueue::new(Concurrency::Parallel(Some(3)), None, true).with_registry_limit(Some(1));
    for img in ["slow.io/a:1", "slow.io/b:1", "fast.io/c:1", "slow.io/d:1", "fast.io/e:1"] {
        q.submit(key(img), 0, img, ());
    }
    let started: Vec<_> = std::iter::from_fn(|| q.start_next()).map(|(_, r)| r).collect();
    assert_eq!(started, ["slow.io/a:1", "fast.io/c:1"], "one per registry, though a third slot is free");
    assert_eq!((q.running_from("slow.io"), q.running_from("fast.io")), (1, 1));
    // The slow registry's first pull ends: its next pull, in order, starts.
    q.finish(&key("slow.io/a:1"));
    assert_eq!(q.start_next().map(|(_, r)| r), Some("slow.io/b:1"));
    assert_eq!(q.start_next(), None);
    // A pull that fails frees its registry too.
    q.finish(&key("fast.io/c:1"));
    assert_eq!(q.running_from("fast.io"), 0);
    assert_eq!(q.start_next().map(|(_, r)| r), Some("fast.io/e:1"));
    assert_eq!(q.start_next(), None, "slow.io/d waits for slow.io/b");
    q.finish(&key("slow.io/b:1"));
    assert_eq!(q.start_next().map(|(_, r)| r), Some("slow.io/d:1"));
    assert_eq!(q.queued(), 0);
}

#[test]
fn the_registry_limit_keeps_priority_order_among_registries_with_room() {
    let mut q: PullQueue<&str, ()> =
        PullQueue::new(Concurrency::Parallel(None), None, true).with_registry_limit(Some(2));
    q.submit(key("a.io/x:1"), 0, "a-low", ());
    q.submit(key("a.io/y:1"), 5, "a-high", ());
    q.submit(key("a.io/z:1"), 9, "a-top", ());
    q.submit(key("b.io/x:1"), 1, "b-mid", ());
    let started: Vec<_> = std::iter::from_fn(|| q.start_next()).map(|(_, r)| r).collect();
    assert_eq!(started, ["a-top", "a-high", "b-mid"], "a.io's lowest waits: its two slots are taken");
    q.finish(&key("a.io/z:1"));
    assert_eq!(q.start_next().map(|(_, r)| r), Some("a-low"));
}

#[test]
fn a_registry_of_its_own_limit_is_held_to_it_and_the_others_to_the_nodes() {
    let own = HashMap::from([("hub.io".to_string(), 1), ("big.io".to_string(), 3)]);
    let mut q: PullQueue<&str, ()> =
        PullQueue::new(Concurrency::Parallel(None), None, true).with_registry_limit(Some(2)).with_registry_limits(own);
    for img in ["hub.io/a:1", "hub.io/b:1", "big.io/c:1", "big.io/d:1", "big.io/e:1", "big.io/f:1"] {
        q.submit(key(img), 0, img, ());
    }
    for img in ["other.io/g:1", "other.io/h:1", "other.io/i:1"] {
        q.submit(key(img), 0, img, ());
    }
    let started: Vec<_> = std::iter::from_fn(|| q.start_next()).map(|(_, r)| r).collect();
    assert_eq!(
        started,
        ["hub.io/a:1", "big.io/c:1", "big.io/d:1", "big.io/e:1", "other.io/g:1", "other.io/h:1"],
        "hub.io one at a time, big.io three, the rest the node's two"
    );
    // With only registries' own limits, the others have none.
    let mut q: PullQueue<&str, ()> = PullQueue::new(Concurrency::Parallel(None), None, true)
        .with_registry_limits(HashMap::from([("hub.io".to_string(), 1)]));
    for img in ["hub.io/a:1", "hub.io/b:1", "other.io/c:1", "other.io/d:1", "other.io/e:1"] {
        q.submit(key(img), 0, img, ());
    }
    let started: Vec<_> = std::iter::from_fn(|| q.start_next()).map(|(_, r)| r).collect();
    assert_eq!(started, ["hub.io/a:1", "other.io/c:1", "other.io/d:1", "other.io/e:1"]);
    q.finish(&key("hub.io/a:1"));
    assert_eq!(q.start_next().map(|(_, r)| r), Some("hub.io/b:1"));
}

#[test]
fn without_a_registry_limit_one_registry_may_take_every_slot() {
    let mut q: PullQueue<&str, ()> = PullQueue::new(Concurrency::Parallel(Some(2)), None, true);
    for img in ["slow.io/a:1", "slow.io/b:1", "fast.io/c:1"] {
        q.submit(key(img), 0, img, ());
    }
    let started: Vec<_> = std::iter::from_fn(|| q.start_next()).map(|(_, r)| r).collect();
    assert_eq!(started, ["slow.io/a:1", "slow.io/b:1"]);
}

#[test]
fn with_a_registry_limit_a_backlog_for_one_registry_does_not_park_another() {
    let mut q: PullQueue<u32, u32> =
        PullQueue::new(Concurrency::Parallel(Some(4)), Some(2), true).with_registry_limit(Some(1));
    // slow.io: one runs, two wait (its capacity), the rest park.
    for i in 0..5 {
        let want = match i {
            0..=2 => Submitted::Queued,
            _ => Submitted::Parked,
        };
        assert_eq!(q.submit(key(&format!("slow.io/s{i}:1")), 0, i, i), want, "slow.io/s{i}");
        if i == 0 {
            assert!(q.start_next().is_some());
        }
    }
    // fast.io has room of its own: queued, not parked behind slow.io's backlog.
    assert_eq!(q.submit(key("fast.io/f:1"), 0, 10, 10), Submitted::Queued);
    assert_eq!(q.start_next().map(|(_, r)| r), Some(10));
    // fast.io fills its own share; its next request parks behind none of slow.io's.
    assert_eq!(q.submit(key("fast.io/g:1"), 0, 11, 11), Submitted::Queued);
    assert_eq!(q.submit(key("fast.io/h:1"), 0, 12, 12), Submitted::Queued);
    assert_eq!(q.submit(key("fast.io/i:1"), 0, 13, 13), Submitted::Parked);
    assert_eq!(q.parked(), 3);
    // fast.io's running pull ends: g starts, and fast.io's parked request is
    // admitted, though slow.io's parked before it (slow.io is still full).
    q.finish(&key("fast.io/f:1"));
    assert_eq!(q.start_next().map(|(_, r)| r), Some(11));
    let mut seen = Vec::new();
    assert_eq!(q.admit_parked(|_, _, w| seen.push(*w)), vec![(key("fast.io/i:1"), Submitted::Queued)]);
    assert_eq!(seen, [13]);
    // slow.io's parked requests come in their own arrival order as it drains.
    q.finish(&key("slow.io/s0:1"));
    assert_eq!(q.start_next().map(|(_, r)| r), Some(1));
    seen.clear();
    let admitted = q.admit_parked(|_, _, w| seen.push(*w));
    assert_eq!(admitted, vec![(key("slow.io/s3:1"), Submitted::Queued)]);
    assert_eq!(seen, [3], "s3 before s4");
    assert_eq!(q.parked(), 1);
}

#[test]
fn a_snapshot_lists_running_then_queued_in_start_order_then_parked_in_arrival_order() {
    let mut q: PullQueue<&str, u32> = PullQueue::new(Concurrency::Parallel(Some(2)), Some(2), true);
    q.submit(key("run-b"), 0, "run-b", 2);
    q.submit(key("run-a"), 1, "run-a", 1);
    let started: Vec<PullKey> = std::iter::from_fn(|| q.start_next().map(|(k, _)| k)).collect();
    assert_eq!(started, [key("run-a"), key("run-b")], "priority first");
    q.submit(key("low"), -1, "low", 3);
    q.submit(key("high"), 7, "high", 4);
    assert_eq!(q.submit(key("high"), 0, "high again", 5), Submitted::Joined);
    assert_eq!(q.submit(key("run-a"), 0, "joins a running pull", 6), Submitted::Joined);
    assert_eq!(q.submit(key("late-1"), 9, "late-1", 7), Submitted::Parked);
    assert_eq!(q.submit(key("late-2"), 0, "late-2", 8), Submitted::Parked);

    let seen: Vec<(&str, i32, Place, Vec<u32>)> =
        q.snapshot().iter().map(|v| (v.key.image.as_str(), v.priority, v.place, v.waiters.to_vec())).collect();
    assert_eq!(
        seen,
        [
            ("run-a", 1, Place::Running, vec![1, 6]),
            ("run-b", 0, Place::Running, vec![2]),
            ("high", 7, Place::Queued(1), vec![4, 5]),
            ("low", -1, Place::Queued(2), vec![3]),
            ("late-1", 9, Place::Parked(1), vec![7]),
            ("late-2", 0, Place::Parked(2), vec![8]),
        ]
    );
    // The positions are the start order: high starts next, once a slot frees.
    q.finish(&key("run-b"));
    assert_eq!(q.start_next().map(|(k, _)| k), Some(key("high")));
}

#[test]
fn a_key_says_whether_it_uses_credentials_and_must_pull_never_which() {
    let anonymous = PullKey::new("img".into(), String::new(), String::new(), false);
    assert!(!anonymous.with_credentials() && !anonymous.must_pull());
    let must = PullKey::new("img".into(), String::new(), String::new(), true);
    assert!(!must.with_credentials() && must.must_pull());
    let creds = PullKey::new("img".into(), String::new(), "4f2a".into(), true);
    assert!(creds.with_credentials() && creds.must_pull());
    assert_ne!(must, creds, "different credentials, different pulls");
    // Without single flight the queue makes keys unique; the flags survive.
    let mut q: PullQueue<(), ()> = PullQueue::new(Concurrency::Parallel(None), None, false);
    q.submit(must.clone(), 0, (), ());
    q.submit(anonymous.clone(), 0, (), ());
    let flags: Vec<(bool, bool)> = q.snapshot().iter().map(|v| (v.key.with_credentials(), v.key.must_pull())).collect();
    assert_eq!(flags, [(false, true), (false, false)]);
}

#[test]
fn limits_set_while_pulls_run_count_the_pulls_already_running() {
    // No limit at the start: hub.io takes three slots.
    let mut q: PullQueue<&str, ()> = PullQueue::new(Concurrency::Parallel(None), Some(10), true);
    for img in ["hub.io/a:1", "hub.io/b:1", "hub.io/c:1"] {
        q.submit(key(img), 0, img, ());
    }
    assert_eq!(std::iter::from_fn(|| q.start_next()).count(), 3);
    assert_eq!(q.running_from("hub.io"), 3, "counted without a limit");
    // A limit of 2 from now on: the three keep running, a fourth waits
    // until fewer than 2 run.
    q.set_registry_limits(None, HashMap::from([("hub.io".to_string(), 2)]));
    q.submit(key("hub.io/d:1"), 0, "hub.io/d:1", ());
    q.submit(key("other.io/e:1"), 0, "other.io/e:1", ());
    assert_eq!(q.start_next().map(|(_, r)| r), Some("other.io/e:1"), "another registry is not held");
    q.finish(&key("hub.io/a:1"));
    assert_eq!(q.start_next(), None, "two still run");
    q.finish(&key("hub.io/b:1"));
    assert_eq!(q.start_next().map(|(_, r)| r), Some("hub.io/d:1"));
    // Raised: a waiting pull starts at once.
    q.submit(key("hub.io/f:1"), 0, "hub.io/f:1", ());
    assert_eq!(q.start_next(), None);
    q.set_registry_limits(None, HashMap::from([("hub.io".to_string(), 3)]));
    assert_eq!(q.start_next().map(|(_, r)| r), Some("hub.io/f:1"));
    // Gone: no limit again.
    q.set_registry_limits(None, HashMap::new());
    q.submit(key("hub.io/g:1"), 0, "hub.io/g:1", ());
    assert_eq!(q.start_next().map(|(_, r)| r), Some("hub.io/g:1"));
    for img in ["hub.io/c:1", "hub.io/d:1", "hub.io/f:1", "hub.io/g:1", "other.io/e:1"] {
        q.finish(&key(img));
    }
    assert_eq!((q.running_from("hub.io"), q.running_from("other.io"), q.running()), (0, 0, 0));
}
