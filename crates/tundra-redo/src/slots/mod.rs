//! Per-page log slots (seed 000 §3.3.3, Opt#3, Figure 6): when a page's records leave the
//! memory cache before the page is materialized, they are merged into that page's own 4 KiB
//! slot, so a page rebuilt at an old LSN costs one read of its image and one read of its slot
//! instead of one read per record scattered through the redo log.
//!
//! A [`SlotArea`] is a region of a device with one block per page of a volume: page `i`'s
//! slot is the block `first_lba + i`, a fixed mapping that needs no index. In the node the
//! region is a range of the compressing drive's logical space, which stores an all-zero block
//! for free and compresses the rest, so a slot costs physical space only for the bytes it
//! holds (on a conventional drive the same design would cost a block per page: 25% more space
//! for 16 KiB pages). The block's layout is in [`format`] and docs/format.md.
//!
//! Slots are a cache of the redo log, never the only copy of a record: records reach a slot
//! only once durable in the log, and the log keeps them until their page is materialized (the
//! index counts spilled records as not materialized, so `materialized_through` never passes
//! them). That is why nothing here flushes, and why the owner clears the whole area
//! ([`SlotArea::clear_all`]) when it opens a volume: the index is rebuilt from the log, and a
//! slot written before a crash may hold records the index no longer knows of. It is also why a
//! slot that fails its checks is recoverable: its records are read from the log instead
//! ([`fetch`]).
//!
//! The last eighth of the region holds image cells (`cells.rs`): when a page's slot would
//! overflow and LSN_min keeps the page from being materialized, an extra image of the page
//! and the records its slot held go to a cell, and the slot is emptied for what follows.
//!
//! - `format.rs`: the slot's bytes, encoded and checked.
//! - `cells.rs`: image cells, their bytes encoded and checked.
//! - `fetch.rs`: [`fetch`], the records a read plan's spilled part names, from the slot or the
//!   redo log.

mod cells;
mod fetch;
mod format;
#[cfg(test)]
mod tests;

use std::borrow::Borrow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tundra_device::{BLOCK_SIZE, BlockDevice, Lba};
use tundra_store::ids::Lsn;

use crate::codec::{check_record, encoded_record_len};
use crate::{Error, RedoRecord, Result};
pub use fetch::{Fetched, fetch};
pub use format::SLOT_RECORD_BYTES;
use format::{HEADER_BYTES, SlotContents, decode_slot, encode_records, encode_slot};

use cells::{CELL_SHARE, cell_blocks, decode_cell_image, decode_cell_records, encode_cell};

/// Locks that order read-modify-write operations on one slot; a page's slot takes lock
/// `page % LOCK_STRIPES`, so operations on different pages rarely wait for each other.
const LOCK_STRIPES: usize = 64;

/// What [`SlotArea::merge`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merge {
    /// The slot now holds `records` records in `bytes` bytes of records.
    Merged { records: u32, bytes: u32 },
    /// The records would not fit: the slot would need `needed_bytes` of its
    /// [`SLOT_RECORD_BYTES`]. Nothing was written; the owner materializes the page instead.
    Overflow { needed_bytes: u64 },
}

/// Operations counted since the area was opened, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotStats {
    pub reads: u64,
    pub merges: u64,
    pub overflows: u64,
    pub clears: u64,
    /// Extra images written to image cells.
    pub cells_written: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    merges: AtomicU64,
    overflows: AtomicU64,
    clears: AtomicU64,
    cells_written: AtomicU64,
}

/// The log slots of one volume's pages, one block each, on a region of a device, and the
/// image cells after them.
pub struct SlotArea {
    device: Arc<dyn BlockDevice>,
    first_lba: Lba,
    /// Blocks of the whole region: the slots, then the cells.
    blocks: u64,
    slot_count: u64,
    page_size: u32,
    locks: Vec<Mutex<()>>,
    counters: Counters,
    /// Image cells: how many, the blocks of each, and those free (in memory only: cells are
    /// a cache of the log, emptied when the area is opened).
    cell_count: u32,
    cell_blocks: u64,
    free_cells: Mutex<Vec<u32>>,
}

impl SlotArea {
    /// The area on the `blocks` blocks of `device` from `first_lba`, for pages of `page_size`
    /// bytes: the last eighth holds image cells (none when that is too small for one), the
    /// rest the slots of pages `0..slot_count()`. Refused when the region does not lie inside
    /// the device.
    pub fn new(device: Arc<dyn BlockDevice>, first_lba: Lba, blocks: u64, page_size: u32) -> Result<SlotArea> {
        if page_size == 0 {
            return Err(Error::invalid("log slots for pages of zero bytes"));
        }
        tundra_device::check_range(device.block_count(), first_lba, blocks)?;
        let locks = (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect();
        let cell_blocks = cell_blocks(page_size);
        let cell_count = u32::try_from(blocks / CELL_SHARE / cell_blocks).unwrap_or(u32::MAX);
        let slot_count = blocks - u64::from(cell_count) * cell_blocks;
        Ok(SlotArea {
            device,
            first_lba,
            blocks,
            slot_count,
            page_size,
            locks,
            counters: Counters::default(),
            cell_count,
            cell_blocks,
            free_cells: Mutex::new(all_cells(cell_count)),
        })
    }

    /// Pages `0..slot_count()` have a slot.
    pub fn slot_count(&self) -> u64 {
        self.slot_count
    }

    /// The area's first block on its device and its block count (slots and cells).
    pub fn region(&self) -> (Lba, u64) {
        (self.first_lba, self.blocks)
    }

    /// Image cells the area holds, and those in use.
    pub fn cells(&self) -> (u32, u32) {
        let free = self.free_cells.lock().len() as u32;
        (self.cell_count, self.cell_count - free)
    }

    /// The first block of image cell `cell`.
    fn cell_lba(&self, cell: u32) -> Result<Lba> {
        if cell >= self.cell_count {
            return Err(Error::invalid(format!("image cell {cell}: the area holds {}", self.cell_count)));
        }
        Ok(self.first_lba.offset_by(self.slot_count + u64::from(cell) * self.cell_blocks))
    }

    /// Writes an extra image of `page` as of `lsn` (`image`, a whole page) and `records` (the
    /// records its slot holds, all below `lsn`) to a free image cell: one write. Answers the
    /// cell, or `None` when every cell is in use. The cell is the caller's until it frees it.
    pub fn write_cell(&self, page: u64, records: &[RedoRecord], lsn: Lsn, image: &[u8]) -> Result<Option<u32>> {
        if image.len() != self.page_size as usize {
            return Err(Error::invalid(format!(
                "an extra image of {} bytes for pages of {}",
                image.len(),
                self.page_size
            )));
        }
        self.check_new(page, records)?;
        if records.last().is_some_and(|r| r.lsn >= lsn) {
            return Err(Error::invalid(format!("an image cell's records must be below its image at LSN {lsn}")));
        }
        if records.iter().map(encoded_record_len).sum::<usize>() > SLOT_RECORD_BYTES {
            return Err(Error::invalid("an image cell's records are more than a slot holds"));
        }
        let Some(cell) = self.free_cells.lock().pop() else { return Ok(None) };
        let lba = self.cell_lba(cell)?;
        let written = self.device.write(lba, &encode_cell(lba, page, records, lsn, image));
        if let Err(error) = written {
            self.free_cells.lock().push(cell);
            return Err(error.into());
        }
        self.counters.cells_written.fetch_add(1, Ordering::Relaxed);
        Ok(Some(cell))
    }

    /// The records block of image cell `cell`, written for `page`: one read, every check passed.
    pub fn read_cell_records(&self, cell: u32, page: u64) -> Result<Vec<RedoRecord>> {
        let lba = self.cell_lba(cell)?;
        let mut block = vec![0u8; BLOCK_SIZE];
        self.device.read(lba, &mut block)?;
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        decode_cell_records(&block, lba, page, self.page_size)
    }

    /// The extra image of `page` as of `lsn` in image cell `cell`: one read, every check passed.
    pub fn read_cell_image(&self, cell: u32, page: u64, lsn: Lsn) -> Result<Vec<u8>> {
        let header = self.cell_lba(cell)?.offset_by(1);
        let mut body = vec![0u8; (self.cell_blocks as usize - 1) * BLOCK_SIZE];
        self.device.read(header, &mut body)?;
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        decode_cell_image(&body, header, page, lsn, self.page_size)
    }

    /// Frees image cell `cell`: a trim (it costs the drive nothing again), then it may be
    /// written anew. The caller makes sure no read still names it.
    pub fn free_cell(&self, cell: u32) -> Result<()> {
        let lba = self.cell_lba(cell)?;
        self.device.trim(lba, self.cell_blocks)?;
        let mut free = self.free_cells.lock();
        assert!(!free.contains(&cell), "image cell {cell} freed twice");
        free.push(cell);
        Ok(())
    }

    /// The block holding `page`'s slot.
    pub fn lba(&self, page: u64) -> Result<Lba> {
        if page >= self.slot_count {
            return Err(Error::invalid(format!("page {page} has no log slot: the area holds {}", self.slot_count)));
        }
        Ok(self.first_lba.offset_by(page))
    }

    /// The records in `page`'s slot, in LSN order (none for an empty slot), every check passed:
    /// a block that fails one is `Corrupted`, naming its LBA.
    pub fn read(&self, page: u64) -> Result<Vec<RedoRecord>> {
        Ok(self.read_contents(page)?.records)
    }

    fn read_contents(&self, page: u64) -> Result<SlotContents> {
        let lba = self.lba(page)?;
        let mut block = vec![0u8; BLOCK_SIZE];
        self.device.read(lba, &mut block)?;
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        decode_slot(&block, lba, page, self.page_size)
    }

    /// Appends `records` (all of `page`, strictly increasing LSNs above those the slot holds,
    /// each well formed for the page size) to `page`'s slot: one read and one write, or
    /// `Overflow` with nothing written when they would not fit. Records that break a rule are
    /// `Invalid` and nothing is written. An empty `records` writes nothing.
    pub fn merge<R: Borrow<RedoRecord>>(&self, page: u64, records: &[R]) -> Result<Merge> {
        let lba = self.lba(page)?;
        self.check_new(page, records)?;
        let _slot = self.lock(page);
        let mut contents = self.read_contents(page)?;
        if let (Some(last), Some(first_new)) = (contents.last_lsn(), records.first()) {
            let first_new = first_new.borrow().lsn;
            if first_new <= last {
                return Err(Error::invalid(format!(
                    "merging the record at LSN {first_new} into page {page}'s log slot, which holds records up to {last}"
                )));
            }
        }
        if records.is_empty() {
            return Ok(merged(&contents));
        }
        let new_bytes: usize = records.iter().map(|r| encoded_record_len(r.borrow())).sum();
        let needed = contents.encoded.len() + new_bytes;
        if needed > SLOT_RECORD_BYTES {
            self.counters.overflows.fetch_add(1, Ordering::Relaxed);
            return Ok(Merge::Overflow { needed_bytes: needed as u64 });
        }
        let added: Vec<&RedoRecord> = records.iter().map(|r| r.borrow()).collect();
        contents.encoded.extend_from_slice(&encode_records(&added));
        contents.records.extend(added.into_iter().cloned());
        self.write(lba, page, &contents)?;
        self.counters.merges.fetch_add(1, Ordering::Relaxed);
        Ok(merged(&contents))
    }

    fn check_new<R: Borrow<RedoRecord>>(&self, page: u64, records: &[R]) -> Result<()> {
        let mut previous: Option<Lsn> = None;
        for record in records {
            let record = record.borrow();
            if record.page != page {
                return Err(Error::invalid(format!(
                    "the record at LSN {} is for page {}, not for page {page}'s log slot",
                    record.lsn, record.page
                )));
            }
            if previous.is_some_and(|p| p >= record.lsn) {
                return Err(Error::invalid(format!("records for a log slot out of LSN order at LSN {}", record.lsn)));
            }
            check_record(record, self.page_size)?;
            previous = Some(record.lsn);
        }
        Ok(())
    }

    /// Writes `contents` to the slot, checked right before: the block must read back as them.
    fn write(&self, lba: Lba, page: u64, contents: &SlotContents) -> Result<()> {
        let block = encode_slot(lba, page, &contents.records, &contents.encoded);
        debug_assert_eq!(
            decode_slot(&block, lba, page, self.page_size).map(|c| c.records.len()).ok(),
            Some(contents.records.len()),
            "a slot this build encodes decodes"
        );
        self.device.write(lba, &block)?;
        Ok(())
    }

    /// Empties `page`'s slot (a trim: the block reads as zeros and costs no media space), once
    /// the page is materialized past every record it held.
    pub fn clear(&self, page: u64) -> Result<()> {
        let lba = self.lba(page)?;
        let _slot = self.lock(page);
        self.device.trim(lba, 1)?;
        self.counters.clears.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Drops the records at or below `lsn` from `page`'s slot and keeps those above it (the
    /// page was materialized at `lsn`): a rewrite, a trim when none are left, nothing when none
    /// are dropped. Answers how many records the slot keeps.
    pub fn clear_through(&self, page: u64, lsn: Lsn) -> Result<usize> {
        let lba = self.lba(page)?;
        let _slot = self.lock(page);
        let contents = self.read_contents(page)?;
        let dropped = contents.records.partition_point(|r| r.lsn <= lsn);
        if dropped == 0 {
            return Ok(contents.records.len());
        }
        if dropped == contents.records.len() {
            self.device.trim(lba, 1)?;
        } else {
            let kept: Vec<&RedoRecord> = contents.records[dropped..].iter().collect();
            let encoded = encode_records(&kept);
            let records: Vec<RedoRecord> = kept.into_iter().cloned().collect();
            self.write(lba, page, &SlotContents { encoded, records })?;
        }
        self.counters.clears.fetch_add(1, Ordering::Relaxed);
        Ok(contents.records.len() - dropped)
    }

    /// Empties every slot: one trim of the whole area. The owner does this when it opens the
    /// volume, before the index spills anything (see the module's paragraph on why).
    pub fn clear_all(&self) -> Result<()> {
        if self.blocks > 0 {
            self.device.trim(self.first_lba, self.blocks)?;
        }
        *self.free_cells.lock() = all_cells(self.cell_count);
        Ok(())
    }

    pub fn stats(&self) -> SlotStats {
        let c = &self.counters;
        SlotStats {
            reads: c.reads.load(Ordering::Relaxed),
            merges: c.merges.load(Ordering::Relaxed),
            overflows: c.overflows.load(Ordering::Relaxed),
            clears: c.clears.load(Ordering::Relaxed),
            cells_written: c.cells_written.load(Ordering::Relaxed),
        }
    }

    fn lock(&self, page: u64) -> parking_lot::MutexGuard<'_, ()> {
        self.locks[(page % LOCK_STRIPES as u64) as usize].lock()
    }
}

/// Every cell free, the lowest handed out first.
fn all_cells(count: u32) -> Vec<u32> {
    (0..count).rev().collect()
}

fn merged(contents: &SlotContents) -> Merge {
    let records = u32::try_from(contents.records.len()).expect("a slot's records fit its block");
    let bytes = u32::try_from(contents.encoded.len()).expect("a slot's bytes fit its block");
    Merge::Merged { records, bytes }
}

const _: () = assert!(HEADER_BYTES + SLOT_RECORD_BYTES == BLOCK_SIZE);
