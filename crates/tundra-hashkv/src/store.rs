//! [`HashKv`], the store: format and open (the log replayed from the superblock's checkpoint),
//! GET, PUT and DELETE, checkpoints, close. A GET is served by the calling thread: the pending
//! changes of its section, then one synchronous read of its bucket (the drive's media is opened
//! with `O_DIRECT` by the callers that measure), then, only if the bucket's overflow flag is
//! set, the overflow store. A PUT is acknowledged once its record is durable in the log; the
//! sections apply it later (seed 001 §3.3.3).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use tundra_device::csd::{CsdDevice, CsdStats};
use tundra_device::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Lba};

use crate::apply::Applier;
use crate::bucket::{self, Bucket, Lookup};
use crate::drive::Drive;
use crate::layout::{Key, Layout, SUPERBLOCK_COPIES, Superblock};
use crate::overflow::Overflow;
use crate::section::{Failure, Sections};
use crate::wal::{self, Logged, Wal, WalHooks, WalRecord};
use crate::{Error, MAX_VALUE_BYTES, Result};

/// Physical bytes one acknowledged, unapplied record may still need: its bucket growing by up to
/// a whole raw block (with the drive's record header), and its share of log blocks.
const PHYSICAL_BYTES_PER_PENDING_RECORD: u64 = 2 * (BLOCK_SIZE_BYTES + 16);
/// Physical bytes kept for overflow-store commits, which copy a few pages each.
const OVERFLOW_RESERVE_BYTES: u64 = 256 * 1024;
/// Records per batch when the open applies the replayed log.
const REPLAY_BATCH_RECORDS: usize = 4096;

/// The sizes a store is formatted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashKvOptions {
    /// Buckets keys hash to: about a quarter of the expected key count keeps overflow rare
    /// (four 416-byte records on average where nine fit; seed 001 §3.3.2 asks below 1%).
    pub table_blocks: u64,
    /// Blocks of the log's ring.
    pub wal_blocks: u64,
    /// Blocks of the overflow store's region.
    pub overflow_blocks: u64,
    pub hash_seed: u64,
}

impl HashKvOptions {
    /// Expected records per bucket at `keys` keys.
    pub const RECORDS_PER_BUCKET: u64 = 4;

    /// Sizes for about `keys` keys of the paper's shape (16-byte keys, 400-byte values).
    pub fn for_keys(keys: u64) -> HashKvOptions {
        let table_blocks = keys.div_ceil(Self::RECORDS_PER_BUCKET).max(16);
        HashKvOptions {
            table_blocks,
            wal_blocks: 16_384,
            overflow_blocks: (table_blocks / 8).max(1024),
            hash_seed: 0x5eed_4b56,
        }
    }

    /// Logical blocks the store needs on its drive.
    pub fn logical_blocks(&self) -> u64 {
        SUPERBLOCK_COPIES + self.wal_blocks + self.overflow_blocks + self.table_blocks
    }
}

/// How an opened store runs; nothing of it is on the drive.
#[derive(Clone, Copy, Debug)]
pub struct HashKvConfig {
    /// Sections, each with its queue and writer thread (seed 001 §3.3.3 used 16).
    pub sections: usize,
}

impl Default for HashKvConfig {
    fn default() -> HashKvConfig {
        HashKvConfig { sections: 16 }
    }
}

/// What the store reports about itself.
#[derive(Clone, Copy, Debug)]
pub struct HashKvStats {
    pub layout: Layout,
    pub overflow_records: u64,
    pub pending_records: u64,
    pub checkpoint_block: u64,
    pub tail_block: u64,
    pub drive: CsdStats,
}

struct Inner {
    drive: Arc<Drive>,
    layout: Layout,
    applier: Arc<Applier>,
    sections: Sections,
    wal: Wal,
    failure: Arc<Failure>,
    /// The durable superblock; its lock also serializes checkpoints.
    superblock: Mutex<Superblock>,
    closed: AtomicBool,
}

/// The table-less hash key-value store on a compressing drive.
pub struct HashKv {
    inner: Arc<Inner>,
    writers: Vec<JoinHandle<()>>,
}

impl HashKv {
    /// Makes an empty store on `drive`: trims everything it will use and writes the superblock.
    pub fn format(drive: &CsdDevice, options: &HashKvOptions) -> Result<()> {
        let layout = Layout::new(
            drive.block_count(),
            options.wal_blocks,
            options.overflow_blocks,
            options.table_blocks,
            options.hash_seed,
        )?;
        drive.trim(Lba(0), layout.end()).map_err(|e| Error::device("trimming the drive before formatting", e))?;
        let superblock = Superblock { layout, sequence: 1, epoch: 1, checkpoint_block: 0 };
        write_superblock(drive, &superblock)
    }

    /// Opens the store on `drive`: replays the log from the checkpoint, then starts a session.
    pub fn open(csd: Arc<CsdDevice>, config: HashKvConfig) -> Result<HashKv> {
        if config.sections == 0 {
            return Err(Error::invalid("a store needs at least one section"));
        }
        let drive = Arc::new(Drive::new(csd));
        let found = read_superblock(drive.as_ref())?;
        let layout = found.layout;
        let overflow = Overflow::open(drive.clone(), Lba(layout.overflow_first), layout.overflow_blocks)?;
        let applier = Arc::new(Applier { drive: drive.clone(), layout, overflow });
        let (mut records, end) = wal::replay(&drive, &layout, found.epoch, found.checkpoint_block)?;
        #[cfg(test)]
        if crate::crash_tests::drop_newest_replayed() {
            records.pop();
        }
        for chunk in records.chunks(REPLAY_BATCH_RECORDS) {
            let chunk: Vec<&WalRecord> = chunk.iter().map(|(_, r)| r).collect();
            applier.apply(&chunk)?;
        }
        records.clear();
        drive.flush().map_err(|e| Error::device("flushing the replayed records", e))?;
        // A new session starts at a fresh block with a new epoch: blocks a crashed session left
        // past the end of the log can then never be read as part of it.
        let superblock =
            Superblock { sequence: found.sequence + 1, epoch: found.epoch + 1, checkpoint_block: end, ..found };
        write_superblock(drive.as_ref(), &superblock)?;
        trim_log(drive.as_ref(), &layout, found.checkpoint_block, end)?;
        let failure = Arc::new(Failure::default());
        let inner = Arc::new(Inner {
            sections: Sections::new(config.sections, applier.clone(), failure.clone()),
            wal: Wal::new(drive.clone(), layout, superblock.epoch, end),
            drive,
            layout,
            applier,
            failure,
            superblock: Mutex::new(superblock),
            closed: AtomicBool::new(false),
        });
        let mut writers = Vec::with_capacity(config.sections);
        for index in 0..config.sections {
            let inner = inner.clone();
            let handle = std::thread::Builder::new()
                .name(format!("hashkv-section-{index}"))
                .spawn(move || inner.sections.run_writer(index))
                .map_err(|e| Error::new(crate::ErrorKind::Io, format!("starting a section writer: {e}")))?;
            writers.push(handle);
        }
        Ok(HashKv { inner, writers })
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let key = Key::new(key)?;
        self.inner.check_open()?;
        let lba = self.inner.layout.lba_of(&key);
        if let Some(pending) = self.inner.sections.pending(lba, &key) {
            return Ok(pending);
        }
        let mut block = vec![0u8; BLOCK_SIZE];
        self.inner.drive.read(lba, &mut block).map_err(|e| Error::device("reading a table block", e))?;
        match bucket::find(lba, &block, &key)? {
            Lookup::Found(value) => Ok(Some(value)),
            Lookup::Missing { overflow: true } => self.inner.applier.overflow.get(lba, &key),
            Lookup::Missing { overflow: false } => Ok(None),
        }
    }

    /// Sets `key` to `value`; durable when it returns. An empty or oversized key, an oversized
    /// value or a full drive is refused and changes nothing.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let key = Key::new(key)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(Error::invalid(format!("a value is at most {MAX_VALUE_BYTES} bytes, not {}", value.len())));
        }
        self.commit(WalRecord { key, value: Some(value.to_vec()) })
    }

    /// Removes `key` (nothing happens if it is absent); durable when it returns.
    pub fn delete(&self, key: &[u8]) -> Result<()> {
        let key = Key::new(key)?;
        self.commit(WalRecord { key, value: None })
    }

    fn commit(&self, record: WalRecord) -> Result<()> {
        self.inner.check_open()?;
        self.inner.failure.check()?;
        self.inner.wal.commit(record, self.inner.as_ref())
    }

    /// Moves the log's checkpoint to the oldest record not yet applied.
    pub fn checkpoint(&self) -> Result<()> {
        self.inner.checkpoint()
    }

    /// Waits until every acknowledged record is applied to the table.
    pub fn drain(&self) -> Result<()> {
        self.inner.sections.drain()
    }

    /// Applies everything, stops the writers and checkpoints, so the next open replays nothing.
    pub fn close(mut self) -> Result<()> {
        let drained = self.inner.sections.drain();
        self.stop_writers();
        drained?;
        // Nothing more is logged in this session, so the checkpoint may pass its last block.
        let past_tail = self.inner.wal.tail_block() + 1;
        self.inner.checkpoint_to(past_tail)?;
        self.inner.closed.store(true, Ordering::SeqCst);
        Ok(())
    }

    pub fn stats(&self) -> Result<HashKvStats> {
        Ok(HashKvStats {
            layout: self.inner.layout,
            overflow_records: self.inner.applier.overflow.record_count()?,
            pending_records: self.inner.sections.pending_count() as u64,
            checkpoint_block: self.inner.wal.checkpoint_block(),
            tail_block: self.inner.wal.tail_block(),
            drive: self.inner.drive.stats(),
        })
    }

    pub fn drive(&self) -> &Arc<CsdDevice> {
        self.inner.drive.csd()
    }

    /// CPU time the store's threads spent inside the drive's calls so far, in nanoseconds
    /// ([`Drive::cpu_ns`]).
    pub fn drive_cpu_ns(&self) -> u64 {
        self.inner.drive.cpu_ns()
    }

    /// Checks, after a drain, that every record sits where its key hashes, that no key is both
    /// in its bucket and in the overflow store, and that every bucket with keys in the overflow
    /// store carries the flag. Reads the whole table: for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.drain().map_err(|e| e.to_string())?;
        let layout = self.inner.layout;
        let mut buckets = std::collections::HashMap::new();
        let mut block = vec![0u8; BLOCK_SIZE];
        for lba in layout.table_first..layout.end() {
            self.inner.drive.read(Lba(lba), &mut block).map_err(|e| e.to_string())?;
            let bucket = Bucket::decode(Lba(lba), &block).map_err(|e| e.to_string())?;
            for key in bucket.keys() {
                if layout.lba_of(key).0 != lba {
                    return Err(format!("{key:?} is in the bucket at LBA {lba}, not where it hashes"));
                }
            }
            buckets.insert(lba, bucket);
        }
        for (lba, key, _) in self.inner.applier.overflow.records().map_err(|e| e.to_string())? {
            if layout.lba_of(&key) != lba {
                return Err(format!("{key:?} is in the overflow store under {lba}, not where it hashes"));
            }
            let bucket = &buckets[&lba.0];
            if !bucket.overflow {
                return Err(format!("{key:?} overflowed from {lba}, whose bucket has no overflow flag"));
            }
            if bucket.get(&key).is_some() {
                return Err(format!("{key:?} is both in its bucket at {lba} and in the overflow store"));
            }
        }
        Ok(())
    }

    fn stop_writers(&mut self) {
        self.inner.sections.stop();
        for writer in self.writers.drain(..) {
            // A panic in a writer is a bug; surface it in the thread that closes the store.
            writer.join().expect("a section writer panicked");
        }
    }
}

impl Drop for HashKv {
    fn drop(&mut self) {
        self.stop_writers();
    }
}

impl Inner {
    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::closed("the store is closed"));
        }
        Ok(())
    }

    /// Moves the checkpoint to the oldest record not yet applied: flushes the applied ones,
    /// writes the superblock, and trims the log blocks behind it.
    fn checkpoint(&self) -> Result<()> {
        // Read the dispatch floor before the sections: a record dispatched after the read lies
        // at or beyond it, and one applied after it is only more applied.
        let dispatched = self.wal.dispatched_floor();
        let floor = self.sections.oldest_unapplied().map_or(dispatched, |oldest| oldest.min(dispatched));
        self.checkpoint_to(floor)
    }

    /// Moves the checkpoint to `floor`, before which every record must be applied.
    fn checkpoint_to(&self, floor: u64) -> Result<()> {
        let mut superblock = self.superblock.lock();
        if floor <= superblock.checkpoint_block {
            return Ok(());
        }
        self.drive.flush().map_err(|e| Error::device("flushing applied records", e))?;
        let next = Superblock { sequence: superblock.sequence + 1, checkpoint_block: floor, ..*superblock };
        write_superblock(self.drive.as_ref(), &next)?;
        trim_log(self.drive.as_ref(), &self.layout, superblock.checkpoint_block, floor)?;
        *superblock = next;
        self.wal.set_checkpoint_block(floor);
        Ok(())
    }
}

impl WalHooks for Inner {
    fn admit(&self, records: usize, puts: bool) -> Result<()> {
        let stats = self.drive.stats();
        let pending = (self.sections.pending_count() + records) as u64;
        // Deletes may use the overflow store's reserve: they are how a full store makes room.
        let reserve = if puts { OVERFLOW_RESERVE_BYTES } else { 0 };
        let need = pending * PHYSICAL_BYTES_PER_PENDING_RECORD + reserve;
        if stats.physical_live_bytes + need > stats.physical_capacity_bytes {
            return Err(Error::full(format!(
                "the drive holds {} of {} physical bytes; {pending} records in flight may need {need} more",
                stats.physical_live_bytes, stats.physical_capacity_bytes
            )));
        }
        Ok(())
    }

    fn make_room(&self, block: u64) -> Result<()> {
        loop {
            if block < self.wal.checkpoint_block() + self.layout.wal_blocks / 2 {
                return Ok(());
            }
            self.checkpoint()?;
            if block < self.wal.checkpoint_block() + self.layout.wal_blocks {
                return Ok(());
            }
            self.failure.check()?;
            self.sections.wait_for_progress(Duration::from_millis(10));
        }
    }

    fn dispatch(&self, records: Vec<Logged>) {
        self.sections.dispatch(records);
    }
}

/// Writes both superblock copies and flushes.
fn write_superblock(drive: &dyn BlockDevice, superblock: &Superblock) -> Result<()> {
    let block = superblock.encode();
    let both = [block.as_slice(), block.as_slice()].concat();
    drive.write(Lba(0), &both).map_err(|e| Error::device("writing the superblock", e))?;
    drive.flush().map_err(|e| Error::device("flushing the superblock", e))
}

/// The newest superblock copy that verifies. A damaged copy is used around if the other one
/// verifies; both damaged, or none written, is an error.
fn read_superblock(drive: &dyn BlockDevice) -> Result<Superblock> {
    let mut blocks = vec![0u8; SUPERBLOCK_COPIES as usize * BLOCK_SIZE];
    drive.read(Lba(0), &mut blocks).map_err(|e| Error::device("reading the superblock", e))?;
    let mut best: Option<Superblock> = None;
    let mut damage = Vec::new();
    for block in blocks.chunks_exact(BLOCK_SIZE) {
        match Superblock::decode(block, drive.block_count()) {
            Ok(Some(found)) if best.is_none_or(|b| found.sequence > b.sequence) => best = Some(found),
            Ok(_) => {}
            Err(error) => damage.push(error.to_string()),
        }
    }
    best.ok_or_else(|| match damage.is_empty() {
        true => Error::invalid("the drive holds no hash KV store (format it first)"),
        false => Error::corrupted(format!("no superblock copy verifies: {}", damage.join("; "))),
    })
}

/// Trims the ring slots of log blocks `from..to`, which the checkpoint no longer needs.
fn trim_log(drive: &dyn BlockDevice, layout: &Layout, from: u64, to: u64) -> Result<()> {
    let mut block = from;
    while block < to {
        let slot = block % layout.wal_blocks;
        let count = (to - block).min(layout.wal_blocks - slot);
        drive
            .trim(Lba(layout.wal_first + slot), count)
            .map_err(|e| Error::device("trimming the write-ahead log", e))?;
        block += count;
    }
    Ok(())
}
