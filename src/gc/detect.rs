//! The kubelet's `detectImages` on an in-memory set of [`ImageRecord`]s:
//! new images get a first-detected time, images in use get a last-used
//! time, every listed image's size, pinning and names are refreshed, and
//! records of images no longer listed are dropped. [`Records::detect`]
//! returns what changed so the caller persists only that.
//!
//! Storage: the records live in one dense `Vec` (no key stored twice), with
//! a hash index from a 64-bit hash of the key to the record's position.
//! 100 000 records take about 50 MiB, most of it the records' own strings.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::time::SystemTime;

use crate::domain::Image;
use crate::gc::record::{ImageRecord, RecordKey};

#[cfg(test)]
mod tests;

/// What one [`Records::detect`] changed, by key, for the durable store
/// (upsert `added` and `updated`, set `used`'s last-used time, delete
/// `removed`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DetectDiff {
    /// Images seen for the first time (first detected now).
    pub added: Vec<RecordKey>,
    /// Known images whose size, pinning, tags or digests changed (and
    /// perhaps their last-used time).
    pub updated: Vec<RecordKey>,
    /// Known images in use whose record changed only in being last used
    /// now: the steady state of every running container's image, written
    /// as a touch rather than a copy of the whole record.
    pub used: Vec<RecordKey>,
    /// Images no longer listed: their records were dropped.
    pub removed: Vec<RecordKey>,
}

impl DetectDiff {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.updated.is_empty() && self.used.is_empty() && self.removed.is_empty()
    }
}

/// The ids of the images in use, as [`Records::detect`] asks them: a set,
/// or the detector's map of who uses what (no copy of its keys).
pub trait InUseIds: std::fmt::Debug {
    /// Whether image `id` is in use.
    fn contains_id(&self, id: &str) -> bool;
}

impl<S: BuildHasher> InUseIds for HashSet<String, S> {
    fn contains_id(&self, id: &str) -> bool {
        self.contains(id)
    }
}

impl<V: std::fmt::Debug, S: BuildHasher> InUseIds for HashMap<String, V, S> {
    fn contains_id(&self, id: &str) -> bool {
        self.contains_key(id)
    }
}

impl<V: std::fmt::Debug> InUseIds for std::collections::BTreeMap<String, V> {
    fn contains_id(&self, id: &str) -> bool {
        self.contains_key(id)
    }
}

/// The image records GC works from, keyed by [`RecordKey`].
#[derive(Debug, Clone, Default)]
pub struct Records {
    /// The records, dense, in no particular order (removal swaps the last
    /// record into the hole).
    slots: Vec<ImageRecord>,
    /// Hash of a key → its position in `slots`, for every key whose hash no
    /// other key took first.
    index: HashMap<u64, u32, BuildHasherDefault<PassThrough>>,
    /// Positions of keys whose hash collided with an indexed key (64-bit
    /// collisions: in practice empty; searched linearly).
    collided: Vec<u32>,
    /// Hashes keys; fixed for the life of this value.
    hasher: RandomState,
    /// Tests: every key hashes to 0, so every lookup goes through `collided`.
    #[cfg(test)]
    degenerate_hash: bool,
}

/// A `Hasher` for keys that are already hashes.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl FromIterator<ImageRecord> for Records {
    /// Records loaded from the durable store; a later record with the same
    /// key replaces an earlier one.
    fn from_iter<I: IntoIterator<Item = ImageRecord>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut records = Records::default();
        let (hint, _) = iter.size_hint();
        records.slots.reserve(hint);
        records.index.reserve(hint);
        for record in iter {
            records.insert(record);
        }
        records
    }
}

impl<'a> IntoIterator for &'a Records {
    type Item = &'a ImageRecord;
    type IntoIter = std::slice::Iter<'a, ImageRecord>;

    fn into_iter(self) -> Self::IntoIter {
        self.slots.iter()
    }
}

impl Records {
    /// No records.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// No records at all.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Every record, in no particular order.
    pub fn iter(&self) -> std::slice::Iter<'_, ImageRecord> {
        self.slots.iter()
    }

    /// The record of `key`.
    pub fn get(&self, key: &RecordKey) -> Option<&ImageRecord> {
        self.position(&key.id, &key.runtime_handler).and_then(|i| self.slots.get(i))
    }

    /// The record of image `id` under runtime handler `runtime_handler`
    /// (empty = default), without building a [`RecordKey`].
    pub fn get_by_id(&self, id: &str, runtime_handler: &str) -> Option<&ImageRecord> {
        self.position(id, runtime_handler).and_then(|i| self.slots.get(i))
    }

    /// Inserts `record`, replacing (and returning) the record with its key.
    pub fn insert(&mut self, record: ImageRecord) -> Option<ImageRecord> {
        match self.position(&record.key.id, &record.key.runtime_handler) {
            Some(i) => self.slots.get_mut(i).map(|slot| std::mem::replace(slot, record)),
            None => {
                self.push(record);
                None
            }
        }
    }

    /// Drops the record of `key` (after its image was deleted), returning it.
    pub fn remove(&mut self, key: &RecordKey) -> Option<ImageRecord> {
        let i = self.position(&key.id, &key.runtime_handler)?;
        self.remove_at(i)
    }

    /// The kubelet's `detectImages`: updates the records from the runtime's
    /// image list and the set of image ids in use, at time `now`.
    ///
    /// - an image without a record gets one: first detected `now`, never
    ///   used; key = its id and its spec's runtime handler;
    /// - an image whose id is in `in_use` is last used `now`;
    /// - every listed image's size, pinning, tags and digests are refreshed;
    /// - records of images not in `images` are dropped.
    ///
    /// The kubelet gives first-detected time "now" to every image it has no
    /// record of; with durable records that only happens for images really
    /// new since the last detection (or since the records were lost).
    pub fn detect(&mut self, images: &[Image], in_use: &(impl InUseIds + ?Sized), now: SystemTime) -> DetectDiff {
        let known = self.slots.len();
        let mut seen = vec![false; known];
        let mut diff = DetectDiff::default();
        for image in images {
            let handler = image.spec.as_ref().map_or("", |spec| spec.runtime_handler.as_str());
            let used = in_use.contains_id(&image.id);
            match self.position(&image.id, handler) {
                Some(i) => {
                    // A record made earlier in this pass (the image is listed
                    // twice) is already in `added`.
                    let fresh = match seen.get_mut(i) {
                        Some(flag) => {
                            *flag = true;
                            false
                        }
                        None => true,
                    };
                    if let Some(record) = self.slots.get_mut(i) {
                        match refresh(record, image, used, now) {
                            _ if fresh => {}
                            Refreshed::Unchanged => {}
                            Refreshed::Used => diff.used.push(record.key.clone()),
                            Refreshed::Changed => diff.updated.push(record.key.clone()),
                        }
                    }
                }
                None => {
                    let record = ImageRecord {
                        key: RecordKey { id: image.id.clone(), runtime_handler: handler.to_owned() },
                        first_detected: now,
                        last_used: used.then_some(now),
                        size: image.size,
                        pinned: image.pinned,
                        repo_tags: image.repo_tags.clone(),
                        repo_digests: image.repo_digests.clone(),
                    };
                    diff.added.push(record.key.clone());
                    self.push(record);
                }
            }
        }
        // Drop unlisted records from the highest position down, so the
        // record each removal swaps in (the current last) is one to keep.
        for i in (0..known).rev() {
            if !seen.get(i).copied().unwrap_or(true)
                && let Some(record) = self.remove_at(i)
            {
                diff.removed.push(record.key);
            }
        }
        diff
    }

    /// Hash of a key given as its parts; the same for a stored key and a
    /// lookup, since both hash the same `(&str, &str)`.
    fn hash_of(&self, id: &str, runtime_handler: &str) -> u64 {
        #[cfg(test)]
        if self.degenerate_hash {
            return 0;
        }
        self.hasher.hash_one((id, runtime_handler))
    }

    fn is_at(&self, i: usize, id: &str, runtime_handler: &str) -> bool {
        self.slots.get(i).is_some_and(|r| r.key.id == id && r.key.runtime_handler == runtime_handler)
    }

    /// Position of a key in `slots`.
    fn position(&self, id: &str, runtime_handler: &str) -> Option<usize> {
        let hash = self.hash_of(id, runtime_handler);
        if let Some(&i) = self.index.get(&hash) {
            let i = i as usize;
            if self.is_at(i, id, runtime_handler) {
                return Some(i);
            }
        }
        self.collided.iter().map(|&i| i as usize).find(|&i| self.is_at(i, id, runtime_handler))
    }

    /// Appends a record whose key is not present.
    fn push(&mut self, record: ImageRecord) {
        let i = slot_number(self.slots.len());
        let hash = self.hash_of(&record.key.id, &record.key.runtime_handler);
        self.slots.push(record);
        match self.index.entry(hash) {
            Entry::Vacant(slot) => {
                slot.insert(i);
            }
            Entry::Occupied(_) => self.collided.push(i),
        }
    }

    /// Removes the record at `i`, moving the last record into its place.
    fn remove_at(&mut self, i: usize) -> Option<ImageRecord> {
        let record = self.slots.get(i)?;
        let hash = self.hash_of(&record.key.id, &record.key.runtime_handler);
        let at = slot_number(i);
        if self.index.get(&hash) == Some(&at) {
            self.index.remove(&hash);
            // Promote a collided key with the same hash, if any.
            if let Some(c) = self.collided.iter().position(|&j| {
                self.slots.get(j as usize).is_some_and(|r| self.hash_of(&r.key.id, &r.key.runtime_handler) == hash)
            }) {
                let j = self.collided.swap_remove(c);
                self.index.insert(hash, j);
            }
        } else if let Some(c) = self.collided.iter().position(|&j| j == at) {
            self.collided.swap_remove(c);
        }
        let last = self.slots.len().checked_sub(1)?;
        let removed = self.slots.swap_remove(i);
        if i != last
            && let Some(moved) = self.slots.get(i)
        {
            let moved_hash = self.hash_of(&moved.key.id, &moved.key.runtime_handler);
            let (from, to) = (slot_number(last), at);
            match self.index.get_mut(&moved_hash) {
                Some(slot) if *slot == from => *slot = to,
                _ => {
                    if let Some(slot) = self.collided.iter_mut().find(|j| **j == from) {
                        *slot = to;
                    }
                }
            }
        }
        Some(removed)
    }
}

/// A position as stored in the index. Positions beyond `u32::MAX` (four
/// billion images) saturate; such a record would be found by no lookup.
fn slot_number(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

/// What [`refresh`] changed in a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refreshed {
    Unchanged,
    /// Only its last-used time.
    Used,
    /// Its size, pinning, tags or digests (perhaps last used too).
    Changed,
}

/// Refreshes a known image's record; what changed.
fn refresh(record: &mut ImageRecord, image: &Image, used: bool, now: SystemTime) -> Refreshed {
    let touched = used && record.last_used != Some(now);
    if touched {
        record.last_used = Some(now);
    }
    let mut changed = false;
    if record.size != image.size {
        record.size = image.size;
        changed = true;
    }
    if record.pinned != image.pinned {
        record.pinned = image.pinned;
        changed = true;
    }
    if record.repo_tags != image.repo_tags {
        record.repo_tags.clone_from(&image.repo_tags);
        changed = true;
    }
    if record.repo_digests != image.repo_digests {
        record.repo_digests.clone_from(&image.repo_digests);
        changed = true;
    }
    match (changed, touched) {
        (true, _) => Refreshed::Changed,
        (false, true) => Refreshed::Used,
        (false, false) => Refreshed::Unchanged,
    }
}
