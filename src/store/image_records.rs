//! The GC image records table (`image_records_v1`): reads that skip
//! records that no longer decode, and durable batched writes.

use std::time::SystemTime;

use redb::{Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use super::{IMAGE_RECORDS, Store, StoreError};
use crate::gc::record::{ImageRecord, RecordKey};

// === impl Store: image records ===

impl Store {
    /// All GC image records, in key order. Records that do not decode are
    /// skipped (see [`Store::image_records_with_skipped`]).
    pub fn image_records(&self) -> Result<Vec<ImageRecord>, StoreError> {
        self.image_records_with_skipped().map(|(records, _)| records)
    }

    /// All GC image records that decode, in key order, and how many did not.
    ///
    /// A record that does not decode (corruption, an unknown older format, a
    /// value whose key does not match the key it is stored under) is skipped
    /// with a `warn` log naming its key; it stays in the database until an
    /// upsert or delete of that key, or [`Store::replace_image_records`],
    /// replaces it. Failing to read the table at all is an error.
    pub fn image_records_with_skipped(&self) -> Result<(Vec<ImageRecord>, usize), StoreError> {
        let op = "reading image records";
        let txn = self.db.begin_read().map_err(|e| self.tx_error(op, e))?;
        let table = txn.open_table(IMAGE_RECORDS).map_err(|e| self.tx_error(op, e))?;
        let len = table.len().map_err(|e| self.tx_error(op, e))?;
        let mut records = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        let mut skipped = 0;
        for entry in table.iter().map_err(|e| self.tx_error(op, e))? {
            let (key, value) = entry.map_err(|e| self.tx_error(op, e))?;
            let key = key.value();
            match decode_record(key, value.value()) {
                Ok(record) => records.push(record),
                Err(reason) => {
                    skipped += 1;
                    tracing::warn!(
                        db = %self.path.display(),
                        key = %key.escape_debug(),
                        %reason,
                        "skipping image record that does not decode"
                    );
                }
            }
        }
        Ok((records, skipped))
    }

    /// Applies `upserts` (insert or replace, by key) and then `deletes` (a
    /// missing key is not an error) in one write transaction: when this
    /// returns `Ok` all of it is durable, and a crash applies all or none of
    /// it. A key both upserted and deleted ends up deleted.
    pub fn apply_image_records(&self, upserts: &[ImageRecord], deletes: &[RecordKey]) -> Result<(), StoreError> {
        self.apply_image_records_touching(upserts, &[], SystemTime::UNIX_EPOCH, deletes).map(|_| ())
    }

    /// [`Store::apply_image_records`], also setting the last-used time of
    /// the records of `used` to `at` (each read, changed and written back in
    /// the same transaction: a detection's steady state, where only running
    /// containers' images were used again, writes no copy of their records).
    /// Returns the keys of `used` that had no stored record (or one that no
    /// longer decodes), whose whole records the caller must write.
    pub fn apply_image_records_touching(
        &self,
        upserts: &[ImageRecord],
        used: &[RecordKey],
        at: SystemTime,
        deletes: &[RecordKey],
    ) -> Result<Vec<RecordKey>, StoreError> {
        let encoded = self.encode_records(upserts)?;
        let op = "committing image records";
        let mut missing = Vec::new();
        self.write(op, |table| {
            for (key, value) in &encoded {
                table.insert(key.as_str(), value.as_slice())?;
            }
            for key in used {
                let stored = encode_key(key);
                let touched = table.get(stored.as_str())?.and_then(|v| {
                    let mut record = decode_record(&stored, v.value()).ok()?;
                    record.last_used = Some(at);
                    serde_json::to_vec(&record).ok()
                });
                match touched {
                    Some(value) => {
                        table.insert(stored.as_str(), value.as_slice())?;
                    }
                    None => missing.push(key.clone()),
                }
            }
            for key in deletes {
                table.remove(encode_key(key).as_str())?;
            }
            Ok(())
        })?;
        Ok(missing)
    }

    /// Replaces every image record with `all`, in one durable write
    /// transaction (like [`Store::apply_image_records`]). Also drops records
    /// that no longer decode.
    pub fn replace_image_records(&self, all: &[ImageRecord]) -> Result<(), StoreError> {
        let encoded = self.encode_records(all)?;
        self.write("replacing image records", |table| {
            table.retain(|_, _| false)?;
            for (key, value) in &encoded {
                table.insert(key.as_str(), value.as_slice())?;
            }
            Ok(())
        })
    }

    /// Runs `f` on the image records table in one write transaction and
    /// commits it durably; any error aborts the whole transaction.
    fn write(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut redb::Table<'_, &'static str, &'static [u8]>) -> Result<(), redb::StorageError>,
    ) -> Result<(), StoreError> {
        let began = std::time::Instant::now();
        let mut txn = self.begin_write(op)?;
        txn.set_durability(Durability::Immediate).map_err(|e| self.tx_error(op, e))?;
        {
            let mut table = txn.open_table(IMAGE_RECORDS).map_err(|e| self.tx_error(op, e))?;
            f(&mut table).map_err(|e| self.tx_error(op, e))?;
        }
        self.commit_timed(op, txn, began, false)
    }

    /// Encodes records before a write transaction starts, so the write lock
    /// is not held while serialising.
    fn encode_records(&self, records: &[ImageRecord]) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        records
            .iter()
            .map(|record| {
                let value = serde_json::to_vec(record).map_err(|source| StoreError::Encode {
                    path: self.path.clone(),
                    key: record.key.clone(),
                    source,
                })?;
                Ok((encode_key(&record.key), value))
            })
            .collect()
    }
}

/// The table key of a record: `"<id>\0<runtime_handler>"`. Image ids and
/// handler names never contain NUL, so the encoding is unambiguous, and it
/// sorts by id, then handler.
fn encode_key(key: &RecordKey) -> String {
    let mut encoded = String::with_capacity(key.id.len() + 1 + key.runtime_handler.len());
    encoded.push_str(&key.id);
    encoded.push('\0');
    encoded.push_str(&key.runtime_handler);
    encoded
}

/// Decodes a stored record, checking that it belongs under `key`.
fn decode_record(key: &str, value: &[u8]) -> Result<ImageRecord, String> {
    let record: ImageRecord = serde_json::from_slice(value).map_err(|e| e.to_string())?;
    if encode_key(&record.key) != key {
        return Err(format!(
            "record is for {:?} (runtime handler {:?}), not for its key",
            record.key.id, record.key.runtime_handler
        ));
    }
    Ok(record)
}
