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
fn a_released_slot_starts_the_next_pull_while_the_first_still_takes_joiners() {
    let mut q: PullQueue<u32, u32> = PullQueue::new(Concurrency::Serial, None, true);
    q.submit(key("a"), 0, 0, 0);
    q.submit(key("b"), 0, 1, 1);
    let (a, _) = q.start_next().expect("a");
    assert!(q.start_next().is_none());
    q.release_slot(&a);
    assert_eq!(q.running(), 0);
    assert_eq!(q.submit(key("a"), 0, 2, 2), Submitted::Joined, "a still takes joiners until it finishes");
    let (b, _) = q.start_next().expect("b starts once a's slot is free");
    assert_eq!(b, key("b"));
    assert_eq!(q.finish(&a), vec![0, 2]);
    assert_eq!(q.running(), 1, "finishing a released job frees nothing more");
    assert_eq!(q.finish(&b), vec![1]);
    assert_eq!(q.running(), 0);
}
