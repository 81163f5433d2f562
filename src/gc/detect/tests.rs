use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::domain::{Image, ImageSpec};

fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

fn image(id: &str, size: u64) -> Image {
    Image {
        id: id.into(),
        repo_tags: vec![format!("example.com/{id}:v1")],
        repo_digests: vec![format!("example.com/{id}@sha256:{id}")],
        size,
        ..Image::default()
    }
}

fn ids(v: &[&str]) -> HashSet<String> {
    v.iter().map(std::string::ToString::to_string).collect()
}

fn keys(v: &[&str]) -> Vec<RecordKey> {
    v.iter().map(|s| RecordKey::id(*s)).collect()
}

fn sorted(mut v: Vec<RecordKey>) -> Vec<RecordKey> {
    v.sort();
    v
}

#[test]
fn a_new_image_is_first_detected_now_and_never_used() {
    let mut records = Records::new();
    let diff = records.detect(&[image("a", 10)], &ids(&[]), t(0));
    assert_eq!(diff, DetectDiff { added: keys(&["a"]), ..DetectDiff::default() });
    let r = records.get(&RecordKey::id("a")).cloned();
    assert_eq!(
        r,
        Some(ImageRecord {
            key: RecordKey::id("a"),
            first_detected: t(0),
            last_used: None,
            size: 10,
            pinned: false,
            repo_tags: vec!["example.com/a:v1".into()],
            repo_digests: vec!["example.com/a@sha256:a".into()],
        })
    );
}

#[test]
fn a_new_image_in_use_is_also_last_used_now() {
    let mut records = Records::new();
    records.detect(&[image("a", 10)], &ids(&["a"]), t(5));
    assert_eq!(records.get_by_id("a", "").map(|r| (r.first_detected, r.last_used)), Some((t(5), Some(t(5)))));
}

#[test]
fn an_image_in_use_gets_last_used_now_and_keeps_first_detected() {
    let mut records = Records::new();
    records.detect(&[image("a", 10), image("b", 20)], &ids(&[]), t(0));
    let diff = records.detect(&[image("a", 10), image("b", 20)], &ids(&["a", "not-listed"]), t(300));
    assert_eq!(diff, DetectDiff { used: keys(&["a"]), ..DetectDiff::default() }, "a touch, not an update");
    let a = records.get_by_id("a", "").cloned();
    assert_eq!(a.map(|r| (r.first_detected, r.last_used)), Some((t(0), Some(t(300)))));
    // No longer in use: last used stays.
    let diff = records.detect(&[image("a", 10), image("b", 20)], &ids(&[]), t(600));
    assert!(diff.is_empty(), "{diff:?}");
    assert_eq!(records.get_by_id("a", "").and_then(|r| r.last_used), Some(t(300)));
}

#[test]
fn size_pinning_tags_and_digests_are_refreshed_and_reported_as_updates() {
    let mut records = Records::new();
    records.detect(&[image("a", 10), image("b", 20), image("c", 30), image("d", 40), image("e", 50)], &ids(&[]), t(0));
    let mut a = image("a", 11);
    let mut b = image("b", 20);
    b.pinned = true;
    let mut c = image("c", 30);
    c.repo_tags.push("example.com/c:latest".into());
    let mut d = image("d", 40);
    d.repo_digests.clear();
    a.spec = Some(ImageSpec::new("ignored"));
    let diff = records.detect(&[a, b, c, d, image("e", 50)], &ids(&[]), t(1));
    assert_eq!(sorted(diff.updated), keys(&["a", "b", "c", "d"]));
    assert!(diff.added.is_empty() && diff.removed.is_empty());
    let get = |id: &str| records.get_by_id(id, "").cloned().unwrap_or_else(|| panic!("{id} missing"));
    assert_eq!(get("a").size, 11);
    assert!(get("b").pinned);
    assert_eq!(get("c").repo_tags, ["example.com/c:v1", "example.com/c:latest"]);
    assert!(get("d").repo_digests.is_empty());
    assert_eq!(get("e").first_detected, t(0));
}

#[test]
fn records_of_images_no_longer_listed_are_dropped() {
    let mut records = Records::new();
    let all: Vec<Image> = (0..6).map(|i| image(&format!("i{i}"), i)).collect();
    records.detect(&all, &ids(&[]), t(0));
    let remaining = [all[1].clone(), all[4].clone(), image("new", 7)];
    let diff = records.detect(&remaining, &ids(&[]), t(1));
    assert_eq!(diff.added, keys(&["new"]));
    assert_eq!(sorted(diff.removed), keys(&["i0", "i2", "i3", "i5"]));
    assert_eq!(records.len(), 3);
    for id in ["i1", "i4", "new"] {
        assert!(records.get_by_id(id, "").is_some(), "{id}");
    }
    let diff = records.detect(&[], &ids(&[]), t(2));
    assert_eq!(diff.removed.len(), 3);
    assert!(records.is_empty());
}

#[test]
fn the_runtime_handler_is_part_of_the_key() {
    let mut records = Records::new();
    let mut kata = image("a", 10);
    kata.spec = Some(ImageSpec::new("a").with_runtime_handler("kata"));
    let diff = records.detect(&[image("a", 10), kata.clone()], &ids(&["a"]), t(0));
    let kata_key = RecordKey { id: "a".into(), runtime_handler: "kata".into() };
    assert_eq!(diff.added, vec![RecordKey::id("a"), kata_key.clone()]);
    assert_eq!(records.len(), 2);
    // The in-use set holds ids: both handlers' records are used.
    assert_eq!(records.get(&kata_key).and_then(|r| r.last_used), Some(t(0)));
    let diff = records.detect(&[kata], &ids(&[]), t(1));
    assert_eq!(diff.removed, keys(&["a"]));
    assert!(records.get(&kata_key).is_some());
}

#[test]
fn an_image_listed_twice_is_added_once() {
    let mut records = Records::new();
    let diff = records.detect(&[image("a", 1), image("a", 2)], &ids(&[]), t(0));
    assert_eq!(diff, DetectDiff { added: keys(&["a"]), ..DetectDiff::default() });
    assert_eq!(records.get_by_id("a", "").map(|r| r.size), Some(2));
    let diff = records.detect(&[image("a", 2), image("a", 2)], &ids(&[]), t(1));
    assert!(diff.is_empty());
}

#[test]
fn from_iter_get_insert_remove_and_iter() {
    let rec = |id: &str, size: u64| ImageRecord {
        key: RecordKey::id(id),
        first_detected: t(0),
        last_used: None,
        size,
        pinned: false,
        repo_tags: vec![],
        repo_digests: vec![],
    };
    let mut records: Records = [rec("a", 1), rec("b", 2), rec("a", 3)].into_iter().collect();
    assert_eq!(records.len(), 2);
    assert_eq!(records.get(&RecordKey::id("a")).map(|r| r.size), Some(3), "the later record wins");
    assert_eq!(records.insert(rec("b", 4)).map(|r| r.size), Some(2));
    assert_eq!(records.insert(rec("c", 5)), None);
    let mut sizes: Vec<u64> = records.iter().map(|r| r.size).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [3, 4, 5]);
    assert_eq!(records.remove(&RecordKey::id("a")).map(|r| r.size), Some(3));
    assert_eq!(records.remove(&RecordKey::id("a")), None);
    assert_eq!(records.get(&RecordKey::id("c")).map(|r| r.size), Some(5));
    assert_eq!(records.get(&RecordKey::id("b")).map(|r| r.size), Some(4));
    // Detection over loaded records: known images keep their first detection.
    let diff = records.detect(&[image("b", 4), image("c", 5)], &ids(&[]), t(99));
    assert_eq!(sorted(diff.updated), keys(&["b", "c"]), "tags and digests differ from the loaded records");
    assert_eq!(records.get(&RecordKey::id("b")).map(|r| r.first_detected), Some(t(0)));
}

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
}

#[test]
fn detection_matches_a_simple_model_through_churn() {
    churn(false);
}

#[test]
fn detection_matches_a_simple_model_when_every_hash_collides() {
    churn(true);
}

fn churn(degenerate_hash: bool) {
    let mut rng = Rng(7);
    let mut records = Records { degenerate_hash, ..Records::new() };
    let mut model: BTreeMap<RecordKey, ImageRecord> = BTreeMap::new();
    for round in 0..60u64 {
        let now = t(round * 300);
        // Each round lists a random subset of 300 possible images, some for
        // a second handler, with random sizes and usage.
        let mut images = Vec::new();
        for n in 0..300u64 {
            if rng.below(3) == 0 {
                continue;
            }
            let mut img = image(&format!("sha256:{n:064x}"), rng.below(4));
            if n % 7 == 0 {
                img.spec = Some(ImageSpec::new("x").with_runtime_handler("kata"));
            }
            images.push(img);
        }
        let in_use: HashSet<String> = images.iter().filter(|_| rng.below(4) == 0).map(|i| i.id.clone()).collect();
        if round % 10 == 5 {
            // Now and then an explicit removal, as after a deletion.
            if let Some(key) = model.keys().nth(usize::try_from(rng.below(10)).unwrap_or(0)).cloned() {
                model.remove(&key);
                assert!(records.remove(&key).is_some());
            }
        }
        let diff = records.detect(&images, &in_use, now);

        let mut want = DetectDiff::default();
        let mut listed = HashSet::new();
        for img in &images {
            let key = RecordKey {
                id: img.id.clone(),
                runtime_handler: img.spec.as_ref().map(|s| s.runtime_handler.clone()).unwrap_or_default(),
            };
            listed.insert(key.clone());
            let used = in_use.contains(&img.id);
            match model.get_mut(&key) {
                None => {
                    want.added.push(key.clone());
                    model.insert(
                        key.clone(),
                        ImageRecord {
                            key,
                            first_detected: now,
                            last_used: used.then_some(now),
                            size: img.size,
                            pinned: img.pinned,
                            repo_tags: img.repo_tags.clone(),
                            repo_digests: img.repo_digests.clone(),
                        },
                    );
                }
                Some(r) => {
                    let before = r.clone();
                    if used {
                        r.last_used = Some(now);
                    }
                    r.size = img.size;
                    if r.size != before.size {
                        want.updated.push(key);
                    } else if *r != before {
                        // Only last used moved: a touch.
                        want.used.push(key);
                    }
                }
            }
        }
        let gone: Vec<RecordKey> = model.keys().filter(|k| !listed.contains(*k)).cloned().collect();
        for k in &gone {
            model.remove(k);
        }
        want.removed = gone;

        assert_eq!(sorted(diff.added), sorted(want.added), "round {round}");
        assert_eq!(sorted(diff.updated), sorted(want.updated), "round {round}");
        assert_eq!(sorted(diff.used), sorted(want.used), "round {round}");
        assert_eq!(sorted(diff.removed), sorted(want.removed), "round {round}");
        assert_eq!(records.len(), model.len(), "round {round}");
        for (key, r) in &model {
            assert_eq!(records.get(key), Some(r), "round {round}");
        }
    }
}
