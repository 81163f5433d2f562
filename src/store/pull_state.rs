//! The KEP-2535 tables (`pull_intents_v1`, `pulled_records_v1`): the
//! state read at start and one transaction per change (durable, or
//! unsynced and made durable by the next sync).

use redb::{Durability, ReadableDatabase, ReadableTable};

use super::{PULL_INTENTS, PULLED_RECORDS, Store, StoreError, Undo};
use crate::domain::pull_record::PulledRecord;

#[cfg(test)]
mod tests;

/// The KEP-2535 state read at start: pulled records, intents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullRecordsState {
    /// Records that decode.
    pub records: Vec<PulledRecord>,
    /// Image refs whose stored record does not decode (kept: the image
    /// counts as pulled by imaged, and pods must pull it to use it).
    pub unreadable: Vec<String>,
    /// Images with a pull intent (pulls that began and never ended).
    pub intents: Vec<String>,
}

/// One write transaction of KEP-2535 state (see [`Store::apply_pull_records`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullRecordsWrite {
    /// Records to insert or replace (by image ref).
    pub upsert_records: Vec<PulledRecord>,
    /// Image refs whose records to delete.
    pub delete_records: Vec<String>,
    /// Images whose intents to record.
    pub put_intents: Vec<String>,
    /// Images whose intents to delete.
    pub delete_intents: Vec<String>,
}

impl PullRecordsWrite {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.upsert_records.is_empty()
            && self.delete_records.is_empty()
            && self.put_intents.is_empty()
            && self.delete_intents.is_empty()
    }
}

impl crate::metrics::PullRecordCounts for Store {
    fn pull_record_counts(&self) -> Option<(u64, u64)> {
        Store::pull_record_counts(self).ok()
    }
}

// === impl Store: pull records ===

impl Store {
    /// How many pull intents and pulled records (readable or not) the
    /// tables hold, from one read transaction.
    pub fn pull_record_counts(&self) -> Result<(u64, u64), StoreError> {
        use redb::ReadableTableMetadata;
        let op = "counting pull records";
        let txn = self.db.begin_read().map_err(|e| self.tx_error(op, e))?;
        let intents = txn.open_table(PULL_INTENTS).map_err(|e| self.tx_error(op, e))?;
        let records = txn.open_table(PULLED_RECORDS).map_err(|e| self.tx_error(op, e))?;
        let count = |n: Result<u64, redb::StorageError>| n.map_err(|e| self.tx_error(op, e));
        Ok((count(intents.len())?, count(records.len())?))
    }

    /// The pulled records (and the keys of those that do not decode) and the
    /// pull intents, from one read transaction.
    pub fn pull_records_state(&self) -> Result<PullRecordsState, StoreError> {
        let op = "reading pull records";
        let txn = self.db.begin_read().map_err(|e| self.tx_error(op, e))?;
        let mut state = PullRecordsState::default();
        let records = txn.open_table(PULLED_RECORDS).map_err(|e| self.tx_error(op, e))?;
        for entry in records.iter().map_err(|e| self.tx_error(op, e))? {
            let (key, value) = entry.map_err(|e| self.tx_error(op, e))?;
            let key = key.value();
            match serde_json::from_slice::<PulledRecord>(value.value()) {
                Ok(record) if record.image_ref == key => state.records.push(record),
                Ok(record) => {
                    tracing::warn!(db = %self.path.display(), key = %key.escape_debug(), found = %record.image_ref.escape_debug(), "pulled record is stored under another image ref; treating it as unreadable");
                    state.unreadable.push(key.to_string());
                }
                Err(reason) => {
                    tracing::warn!(db = %self.path.display(), key = %key.escape_debug(), %reason, "pulled record does not decode; treating it as unreadable");
                    state.unreadable.push(key.to_string());
                }
            }
        }
        let intents = txn.open_table(PULL_INTENTS).map_err(|e| self.tx_error(op, e))?;
        for entry in intents.iter().map_err(|e| self.tx_error(op, e))? {
            let (key, _) = entry.map_err(|e| self.tx_error(op, e))?;
            state.intents.push(key.value().to_string());
        }
        Ok(state)
    }

    /// Applies `w` in one durable write transaction: record upserts, then
    /// record deletes, intent puts, intent deletes. When this returns `Ok`
    /// all of it is on disk; a crash applies all or none of it.
    pub fn apply_pull_records(&self, w: &PullRecordsWrite) -> Result<(), StoreError> {
        self.apply_pull_records_as(w, true)
    }

    /// [`Store::apply_pull_records`] without waiting for the disk: the
    /// change is visible to reads at once and on disk after the next synced
    /// write or [`Store::sync`]; a crash before loses it (with every
    /// unsynced write since the last synced one, all or none of each, in
    /// order). For changes whose loss can only make a pod pull again (see
    /// `crate::pull_records`, "Unsynced").
    pub fn apply_pull_records_unsynced(&self, w: &PullRecordsWrite) -> Result<(), StoreError> {
        self.apply_pull_records_as(w, false)
    }

    /// Puts every unsynced write on disk (one synced, empty commit); true
    /// when there was one to put (a synced write since may already have).
    pub fn sync(&self) -> Result<bool, StoreError> {
        let op = "syncing pull records";
        let began = std::time::Instant::now();
        let mut txn = self.begin_write(op)?;
        if self.journal().is_empty() {
            // Dropped: aborted, nothing written.
            return Ok(false);
        }
        txn.set_durability(Durability::Immediate).map_err(|e| self.tx_error(op, e))?;
        self.commit_timed(op, txn, began, true).map(|()| true)
    }

    fn apply_pull_records_as(&self, w: &PullRecordsWrite, synced: bool) -> Result<(), StoreError> {
        #[cfg(test)]
        if self.refuse_next_write.swap(false, std::sync::atomic::Ordering::AcqRel) {
            return Err(StoreError::Blocking("injected: the write was refused".into()));
        }
        let encoded =
            w.upsert_records
                .iter()
                .map(|r| {
                    serde_json::to_vec(r).map(|v| (r.image_ref.as_str(), v)).map_err(|source| {
                        StoreError::EncodePulled { path: self.path.clone(), image_ref: r.image_ref.clone(), source }
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
        let op = "committing pull records";
        let began = std::time::Instant::now();
        let mut txn = self.begin_write(op)?;
        let durability = if synced { Durability::Immediate } else { Durability::None };
        txn.set_durability(durability).map_err(|e| self.tx_error(op, e))?;
        {
            let mut records = txn.open_table(PULLED_RECORDS).map_err(|e| self.tx_error(op, e))?;
            if !synced {
                // How to undo it, for a kill (see `Store::fence_as_killed`).
                let mut undo = Vec::new();
                let keys = encoded.iter().map(|(k, _)| *k).chain(w.delete_records.iter().map(String::as_str));
                for key in keys {
                    let was = records.get(key).map_err(|e| self.tx_error(op, e))?.map(|v| v.value().to_vec());
                    undo.push(Undo::Record(key.to_string(), was));
                }
                let intents = txn.open_table(PULL_INTENTS).map_err(|e| self.tx_error(op, e))?;
                for key in w.put_intents.iter().chain(&w.delete_intents) {
                    let was = intents.get(key.as_str()).map_err(|e| self.tx_error(op, e))?.map(|v| v.value());
                    undo.push(Undo::Intent(key.clone(), was));
                }
                self.journal().extend(undo);
            }
            for (key, value) in &encoded {
                records.insert(*key, value.as_slice()).map_err(|e| self.tx_error(op, e))?;
            }
            for key in &w.delete_records {
                records.remove(key.as_str()).map_err(|e| self.tx_error(op, e))?;
            }
            let mut intents = txn.open_table(PULL_INTENTS).map_err(|e| self.tx_error(op, e))?;
            for key in &w.put_intents {
                intents.insert(key.as_str(), now).map_err(|e| self.tx_error(op, e))?;
            }
            for key in &w.delete_intents {
                intents.remove(key.as_str()).map_err(|e| self.tx_error(op, e))?;
            }
        }
        let committed = if synced {
            self.commit_timed(op, txn, began, true)
        } else {
            txn.commit().map_err(|e| self.tx_error(op, e))
        };
        #[cfg(test)]
        if committed.is_ok() && self.fail_after_next_commit.swap(false, std::sync::atomic::Ordering::AcqRel) {
            return Err(StoreError::Blocking("injected: the commit reached the disk, then failed".into()));
        }
        committed
    }
}
