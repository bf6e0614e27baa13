//! Applying logged changes to the table: each bucket touched by a batch is read once, changed
//! by every record for it in log order, and written once; spilled records go to the overflow
//! store in one transaction after the buckets. The sections do this in the background and the
//! open does it for the replayed log, with the same code.
//!
//! A record goes to the overflow store only when its bucket has no room, and the bucket's
//! overflow flag is set in the same batch. The buckets are written before the overflow
//! transaction commits, and the commit flushes the drive, so a key is never in the overflow
//! store while its bucket's flag is not durable: a lookup that misses in the block and sees no
//! flag may stop there. A record that moves from its bucket to the overflow store (its new value
//! does not fit) is missing from both if power fails between the two, which is why the log keeps
//! every record until the checkpoint after its batch: the replay puts it back.

use std::collections::HashMap;
use std::sync::Arc;

use crate::drive::Drive;
use tundra_device::{BLOCK_SIZE, BlockDevice, Lba};

use crate::bucket::Bucket;
use crate::layout::{Key, Layout};
use crate::overflow::{Overflow, OverflowChange};
use crate::wal::WalRecord;
use crate::{Error, Result};

/// What a batch did, for the statistics.
#[derive(Clone, Copy, Debug, Default)]
pub struct Applied {
    pub buckets_written: u64,
    pub overflow_changes: u64,
}

/// The table and the overflow store, as the sections and the replay change them.
pub struct Applier {
    pub drive: Arc<Drive>,
    pub layout: Layout,
    pub overflow: Overflow,
}

/// The overflow store's view of one bucket's keys during a batch: what was read, and what
/// the batch changed.
struct Staged<'a> {
    applier: &'a Applier,
    lba: Lba,
    /// Key to (value in the overflow store as the batch left it, changed by the batch).
    keys: HashMap<Key, (Option<Vec<u8>>, bool)>,
}

impl Staged<'_> {
    fn get(&mut self, key: &Key) -> Result<Option<&Vec<u8>>> {
        if !self.keys.contains_key(key) {
            let value = self.applier.overflow.get(self.lba, key)?;
            self.keys.insert(*key, (value, false));
        }
        Ok(self.keys[key].0.as_ref())
    }

    fn set(&mut self, key: Key, value: Option<Vec<u8>>) {
        self.keys.insert(key, (value, true));
    }
}

impl Applier {
    /// Applies `records` in order; on success every change is on the drive (durable after the
    /// next flush; overflow changes are durable already).
    pub fn apply(&self, records: &[&WalRecord]) -> Result<Applied> {
        // Records by bucket, in log order within each (a stable sort on the LBA alone).
        let mut by_lba: Vec<(u64, &WalRecord)> =
            records.iter().map(|record| (self.layout.lba_of(&record.key).0, *record)).collect();
        by_lba.sort_by_key(|(lba, _)| *lba);
        let mut writes: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut changes: Vec<OverflowChange> = Vec::new();
        let mut block = vec![0u8; BLOCK_SIZE];
        for group in by_lba.chunk_by(|a, b| a.0 == b.0) {
            let lba = Lba(group[0].0);
            let records = group.iter().map(|(_, record)| *record);
            self.drive.read(lba, &mut block).map_err(|e| Error::device("reading a table block", e))?;
            let mut bucket = Bucket::decode(lba, &block)?;
            let mut staged = Staged { applier: self, lba, keys: HashMap::new() };
            for record in records {
                apply_one(&mut bucket, &mut staged, record)?;
            }
            let encoded = bucket.encode(lba);
            if encoded != block {
                writes.push((lba.0, encoded));
            }
            for (key, (value, changed)) in staged.keys {
                if changed {
                    changes.push(OverflowChange { lba, key, value });
                }
            }
        }
        let applied = Applied { buckets_written: writes.len() as u64, overflow_changes: changes.len() as u64 };
        self.write_runs(writes)?;
        if !changes.is_empty() {
            self.overflow.apply(&changes)?;
        }
        Ok(applied)
    }

    /// Writes blocks sorted by LBA, one drive write per run of adjacent ones.
    fn write_runs(&self, writes: Vec<(u64, Vec<u8>)>) -> Result<()> {
        let mut at = 0;
        while at < writes.len() {
            let mut end = at + 1;
            while end < writes.len() && writes[end].0 == writes[at].0 + (end - at) as u64 {
                end += 1;
            }
            let write = |data: &[u8]| {
                self.drive.write(Lba(writes[at].0), data).map_err(|e| Error::device("writing table blocks", e))
            };
            if end == at + 1 {
                write(&writes[at].1)?;
            } else {
                let mut data = Vec::with_capacity((end - at) * BLOCK_SIZE);
                writes[at..end].iter().for_each(|(_, block)| data.extend_from_slice(block));
                write(&data)?;
            }
            at = end;
        }
        Ok(())
    }
}

/// One record against its bucket: in the block when it fits, in the overflow store otherwise;
/// a key already in the overflow store is updated there.
fn apply_one(bucket: &mut Bucket, staged: &mut Staged<'_>, record: &WalRecord) -> Result<()> {
    let key = record.key;
    let in_overflow = bucket.overflow && staged.get(&key)?.is_some();
    match &record.value {
        Some(value) => {
            if bucket.get(&key).is_some() {
                if !bucket.try_put(key, value) {
                    bucket.remove(&key);
                    bucket.overflow = true;
                    staged.set(key, Some(value.clone()));
                } else if in_overflow {
                    // Never both: the block's copy is the one lookups find first.
                    staged.set(key, None);
                }
            } else if in_overflow {
                staged.set(key, Some(value.clone()));
            } else if !bucket.try_put(key, value) {
                bucket.overflow = true;
                staged.set(key, Some(value.clone()));
            }
        }
        None => {
            bucket.remove(&key);
            if in_overflow {
                staged.set(key, None);
            }
        }
    }
    Ok(())
}
