//! The records' housekeeping outside a pull: at start, intents a crash
//! left become record entries without credentials ([`PullRecords::recover_intents`]);
//! after each image GC run, records of images the runtime no longer has are
//! pruned ([`PullRecords::prune_unknown_records`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use super::{PullRecords, image_key, to_the_end};
use crate::domain::Image;
use crate::domain::pull_record::{ImagePullCredentials, PulledRecord, merge_pulled};
use crate::store::{PullRecordsWrite, StoreError};

#[cfg(test)]
mod tests;

// === impl PullRecords: housekeeping ===

impl PullRecords {
    /// The kubelet's `initialize`: every stored intent whose image is one of
    /// `images`' tags or digests (compared normalised) becomes an entry
    /// with no credentials under its repository in that image's record (a
    /// hollow one, unless the repository has an entry; in a new record if
    /// need be), and the intent is deleted, in one
    /// transaction. Returns how many intents were recovered. Call once at
    /// start, before ensuring images.
    pub async fn recover_intents(&self, images: &[Image]) -> Result<usize, StoreError> {
        let _w = self.inner.writes.lock().await;
        let intents: HashSet<String> = self.state().stored_intents.clone();
        if intents.is_empty() {
            return Ok(0);
        }
        let mut w = PullRecordsWrite::default();
        let mut records: HashMap<String, PulledRecord> = HashMap::new();
        let now = self.inner.clock.now();
        for image in images {
            for name in image.repo_tags.iter().chain(&image.repo_digests) {
                let key = image_key(name);
                if !intents.contains(&key) || w.delete_intents.contains(&key) {
                    continue;
                }
                // Under the intent's own repository (a hollow entry): a
                // record of the image under another name must not leave
                // this one preloaded (kubernetes/kubernetes#138175 aside).
                let repo = super::image_repo(name).unwrap_or_default();
                w.delete_intents.push(key);
                let existing = records
                    .get(&image.id)
                    .cloned()
                    .or_else(|| self.state().records.get(&image.id).map(|r| PulledRecord::clone(r)));
                let (record, changed) =
                    merge_pulled(existing.as_ref(), &image.id, &repo, &ImagePullCredentials::default(), now);
                if changed {
                    records.insert(image.id.clone(), record);
                }
            }
        }
        w.upsert_records = records.into_values().collect();
        let recovered = w.delete_intents.len();
        if w.is_empty() {
            return Ok(0);
        }
        self.commit(w.clone()).await?;
        let mut st = self.state();
        for key in &w.delete_intents {
            st.stored_intents.remove(key);
        }
        for record in w.upsert_records {
            st.unreadable.remove(&record.image_ref);
            st.records.insert(record.image_ref.clone(), Arc::new(record));
        }
        tracing::info!(recovered, "pull intents of images present in the runtime turned into records");
        Ok(recovered)
    }

    /// Whether a crash left pull intents to recover (see
    /// [`PullRecords::recover_intents`]; the kubelet lists the runtime's
    /// images only then).
    pub fn has_stored_intents(&self) -> bool {
        !self.state().stored_intents.is_empty()
    }

    /// An image was removed outside GC (the kubelet's `RemoveImage` through
    /// the CRI front): its record goes, as GC's prune would take it, unless
    /// it was updated at or after `until` (pulled again since). Returns
    /// whether a record was deleted.
    ///
    /// Like every deletion here it runs to its end even if its caller stops
    /// waiting (`to_the_end`): dropped halfway, the deletion would land on
    /// disk while memory kept the record, and went on granting what it
    /// granted for the rest of the process.
    pub async fn forget_removed_image(&self, image_ref: &str, until: SystemTime) -> Result<bool, StoreError> {
        let (this, image_ref) = (self.clone(), image_ref.to_string());
        to_the_end(self, None, async move { this.forget_removed_image_now(&image_ref, until).await })
            .await
            .unwrap_or_else(unended)
    }

    /// [`PullRecords::forget_removed_image`], cancellable.
    async fn forget_removed_image_now(&self, image_ref: &str, until: SystemTime) -> Result<bool, StoreError> {
        let _w = self.inner.writes.lock().await;
        let doomed = {
            let st = self.state();
            st.records.get(image_ref).is_some_and(|r| r.last_updated_time < until) || st.unreadable.contains(image_ref)
        };
        if !doomed {
            return Ok(false);
        }
        let image_ref = image_ref.to_string();
        // The kept intents of names last pulled as this image stay on disk
        // (the names' next pulls start without a write), unless more are
        // kept than may outlive their images.
        let kept = if self.kept_past_bound() { self.take_kept(|r| r == image_ref) } else { Vec::new() };
        let w =
            PullRecordsWrite { delete_records: vec![image_ref.clone()], delete_intents: kept, ..Default::default() };
        self.commit(w).await?;
        let mut st = self.state();
        st.records.remove(&image_ref);
        st.unreadable.remove(&image_ref);
        tracing::debug!(image = %image_ref, "pulled record of a removed image deleted");
        Ok(true)
    }

    /// The kubelet's `PruneUnknownRecords`: deletes every record last
    /// updated before `until` whose image ref is not in `present` (the ids
    /// of the images the runtime still has), and every unreadable record
    /// (its time unknown) whose image ref is not in `present`. Returns how
    /// many were deleted. Runs to its end even if its caller stops waiting
    /// (see [`PullRecords::forget_removed_image`]).
    pub async fn prune_unknown_records(
        &self,
        present: HashSet<String>,
        until: SystemTime,
    ) -> Result<usize, StoreError> {
        let this = self.clone();
        to_the_end(self, None, async move { this.prune_unknown_records_now(&present, until).await })
            .await
            .unwrap_or_else(unended)
    }

    /// [`PullRecords::prune_unknown_records`], cancellable.
    async fn prune_unknown_records_now(
        &self,
        present: &HashSet<String>,
        until: SystemTime,
    ) -> Result<usize, StoreError> {
        let _w = self.inner.writes.lock().await;
        let doomed: Vec<String> = {
            let st = self.state();
            let old = st
                .records
                .values()
                .filter(|r| r.last_updated_time < until && !present.contains(&r.image_ref))
                .map(|r| r.image_ref.clone());
            let unreadable = st.unreadable.iter().filter(|r| !present.contains(*r)).cloned();
            old.chain(unreadable).collect()
        };
        // The kept intents of removed images stay (they only spare their
        // names' next pulls a synced write) while few enough; past that
        // bound they all go with their images.
        let kept = if self.kept_past_bound() { self.take_kept(|r| !present.contains(r)) } else { Vec::new() };
        if doomed.is_empty() && kept.is_empty() {
            return Ok(0);
        }
        let w = PullRecordsWrite { delete_records: doomed.clone(), delete_intents: kept, ..Default::default() };
        self.commit(w).await?;
        let mut st = self.state();
        for r in &doomed {
            st.records.remove(r);
            st.unreadable.remove(r);
        }
        tracing::debug!(pruned = doomed.len(), "pulled records of removed images pruned");
        Ok(doomed.len())
    }
}

/// A deletion's task that ended before its end (it panicked).
fn unended<T>() -> Result<T, StoreError> {
    Err(StoreError::Blocking("the records' deletion ended before completing".into()))
}
