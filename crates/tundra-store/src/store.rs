//! The store engine: pages in, pages out, on a data device and a journal (seed 000 §3.2.1).
//!
//! A page write follows the order that keeps the index honest:
//!
//! 1. allocate a run of 4 KiB blocks in the page's chunk (one I/O where possible);
//! 2. write the page image to the run;
//! 3. commit a journal record that points the page at the run; the journal's group commit
//!    flushes the data device first, so the blocks are durable before the record, with one
//!    flush for every writer of the group;
//! 4. install the entry in the index: the page is visible;
//! 5. the page's old run is freed, and trimmed on the data device, only after the record is
//!    durable (it is, after step 3) and no reader can still be reading it (the reuse gate).
//!    Under [`TrimPolicy::Deferred`] the run is reused untrimmed.
//!
//! A small commit of the store's own (a database's WAL page and its fsync) changes step 3: the
//! journal record carries the image, which makes it durable with the record's one flush, so the
//! data device is not flushed for it. With [`Store::with_write_behind`] it changes step 2 too:
//! the run is written later, off the committing thread ([`Unwritten`]), so a commit costs one
//! device write and one flush, the log's. Until its run is written the image is read from
//! memory.
//!
//! Pages stored together (one [`StoreCommand::PutPages`](crate::command::StoreCommand)) take consecutive blocks where they are free,
//! and blocks that follow each other on the device are written with one I/O.
//!
//! The mutating entry point, [`Store::apply_write`], takes an already-encoded image, so that a
//! Raft leader can compress once and every replica stores the same bytes.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tundra_device::buf::BlockBuf;
use tundra_device::{BLOCK_SIZE, BlockDevice, Lba};

use crate::buf::with_scratch;
use crate::ids::{BlockRun, ChunkId, EXTENT_BLOCKS, PageNo, VolumeId};
use crate::index::{Encoding, PageEntry};
use crate::journal::{Journal, JournalPlace, LogDamage};
use crate::volume::{Volume, VolumeMode};
use crate::{Error, Result};

mod apply;
mod invariants;
mod rebuild;
mod repair;
mod replace;
mod state;
pub use apply::Durability;
use rebuild::rebuild;
pub use repair::RepairOutcome;
pub use replace::{ChunkImage, HeavySlot};
pub use state::{StoreCore, Watermarks};

/// An encoded page as the store receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageImage {
    pub encoding: Encoding,
    /// The stored bytes (compressed, or the page itself when raw), not padded.
    pub bytes: Vec<u8>,
    /// crc32c of the uncompressed page, seeded with the page's address ([`page_checksum`]).
    pub checksum: u32,
}

/// The checksum every page carries: crc32c of its uncompressed content, seeded with its address,
/// so that a page returned for the wrong address never verifies.
pub fn page_checksum(chunk: ChunkId, page: PageNo, content: &[u8]) -> u32 {
    let mut address = [0u8; 12];
    address[..8].copy_from_slice(&chunk.0.to_le_bytes());
    address[8..].copy_from_slice(&page.0.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&address), content)
}

/// Bytes before the compressed frame in a heavy segment's blocks: u32 frame length, u16 page
/// count, u16 zero, u64 nonce (names this segment for the cache of decompressed segments).
pub const HEAVY_HEADER_BYTES: usize = 16;

/// Space and index figures of the whole store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub pages: u64,
    /// Bytes of 4 KiB blocks the pages occupy on the data device (after software compression).
    pub stored_bytes: u64,
    pub extents_in_use: u64,
    pub extents_total: u64,
    pub index_memory_bytes: u64,
}

/// Space figures of one volume.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeUsage {
    pub pages: u64,
    /// Bytes of 4 KiB blocks the volume's pages occupy (heavy segments counted once).
    pub stored_bytes: u64,
    /// Bytes the stored pages take at byte granularity (heavy pages: their segments' length).
    pub compressed_bytes: u64,
    pub raw_pages: u64,
    pub lz4_pages: u64,
    pub zstd_pages: u64,
    pub heavy_pages: u64,
}

/// When the store trims data-device blocks it no longer uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TrimPolicy {
    /// Every run a page lets go of is trimmed before it is reused: on a compressing drive a
    /// block holds physical space until it is trimmed or overwritten.
    #[default]
    EveryRun,
    /// Blocks let go of are reused as they are, untrimmed; free blocks are trimmed when the
    /// store opens, when it is checked and when a volume is deleted. For a device where a trim
    /// only hands space back to a filesystem underneath (a plain file): punching a hole for
    /// every rewritten page costs more than writing the page, and the next write into the
    /// hole costs more again (the filesystem allocates, and a data sync then writes its
    /// metadata too). The device holds at most the blocks in use at the busiest moment since
    /// the last trim.
    Deferred,
}

/// How to open a store: the name and place of its journal for messages, and whether damage in
/// the journal's log may be truncated away (`tundra repair --accept-loss`).
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    pub place: JournalPlace,
    pub accept_loss: bool,
}

/// What recovery found and dealt with when the store opened.
#[derive(Clone, Debug, Default)]
pub struct Recovery {
    /// One line for each damage recovered from, or a truncation made, for the open's output.
    pub notes: Vec<String>,
    /// The log damage a repair truncated the journal at: what was dropped.
    pub lost: Option<LogDamage>,
}

/// One chunk's space (see [`Store::chunk_usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkUsage {
    pub pages: u64,
    /// Bytes of the 4 KiB blocks the chunk's pages take on the data device.
    pub stored_bytes: u64,
    /// The device's media bytes under those blocks, if it can tell.
    pub physical_bytes: Option<u64>,
}

/// One node's page store.
pub struct Store {
    data: Arc<dyn BlockDevice>,
    recovery: Recovery,
    trim_policy: TrimPolicy,
    journal: Journal,
    state: Mutex<StoreCore>,
    /// Writers hold it shared from their journal commit to their index install; a checkpoint
    /// holds it exclusively, so its snapshot and log position agree, and so does a volume's
    /// delete, so no page of the volume is journalled after it.
    checkpoint_gate: RwLock<()>,
    /// Readers hold it shared while they read blocks; freed runs become reusable only under it
    /// exclusively.
    reuse_gate: RwLock<()>,
    /// Images carried in the log whose runs are not written yet, by the run's first LBA.
    unwritten: Mutex<BTreeMap<u64, Unwritten>>,
    /// Held while a batch of unwritten images is written, so that batches do not overlap.
    writing_unwritten: Mutex<()>,
    /// How many images wait before a commit writes them ([`UNWRITTEN_BATCH`]).
    unwritten_batch: usize,
    /// Whether small commits leave their carried images unwritten ([`Store::with_write_behind`]).
    write_behind: bool,
}

/// A page image a small commit carried in the journal's log ([`Journal::commit_with_data`]),
/// not yet written to its run. The log holds it durably until the next checkpoint, which
/// writes every unwritten image and flushes the data device first; after a crash, replay
/// writes it again (store/rebuild.rs). Images wait until [`Store::write_unwritten`] is called
/// or [`UNWRITTEN_BATCH`] of them wait, then go to the device together, where runs that follow
/// each other take one I/O.
///
/// A run stays allocated while its image waits, since the page's entry points at it. When
/// the page is rewritten or trimmed the run is freed, and [`Store::release_freed`] drops the
/// image under the reuse gate, before the run can be reused; a batch holds that gate shared
/// while it writes, so it never writes over a run given to another page.
#[derive(Clone)]
struct Unwritten {
    run: BlockRun,
    image: Arc<Vec<u8>>,
}

/// How many images may wait unwritten before a commit writes them all itself: a bound on the
/// memory they take (at most 16 MiB) when nothing else writes them.
pub const UNWRITTEN_BATCH: usize = 1024;

impl Store {
    /// Opens a store on a data device and a fast device holding a formatted journal, rebuilding
    /// the index from the journal and the allocator from the index.
    pub fn open(data: Arc<dyn BlockDevice>, fast: Arc<dyn BlockDevice>) -> Result<Store> {
        Store::open_with(data, fast, &OpenOptions::default())
    }

    /// [`Store::open`] with options. Damage in the journal is a `Corrupted` error naming it,
    /// unless `options.accept_loss`; [`Store::recovery`] then says what was recovered or lost.
    pub fn open_with(data: Arc<dyn BlockDevice>, fast: Arc<dyn BlockDevice>, options: &OpenOptions) -> Result<Store> {
        let (mut journal, mut replay) = Journal::open_with(fast, &options.place, options.accept_loss)?;
        let recovery = Recovery { notes: std::mem::take(&mut replay.notes), lost: replay.lost.take() };
        // Data blocks are flushed by the journal's group commit, once per group of writers.
        journal.set_barrier(data.clone());
        let extent_count = u32::try_from(data.block_count() / u64::from(EXTENT_BLOCKS))
            .map_err(|_| Error::invalid("the data device has more than 2^32 extents"))?;
        let (state, rewrites) = rebuild(replay, extent_count)?;
        let store = Store {
            data,
            recovery,
            trim_policy: TrimPolicy::default(),
            journal,
            state: Mutex::new(state),
            checkpoint_gate: RwLock::new(()),
            reuse_gate: RwLock::new(()),
            unwritten: Mutex::new(BTreeMap::new()),
            writing_unwritten: Mutex::new(()),
            unwritten_batch: UNWRITTEN_BATCH,
            write_behind: false,
        };
        // Images the log carried, for entries still mapped: the data device may have lost
        // them. The checkpoint below flushes them before it ends their replay.
        let runs: Vec<BlockRun> = rewrites.iter().map(|r| r.run).collect();
        let images: Vec<&[u8]> = rewrites.iter().map(|r| r.image.as_slice()).collect();
        store.write_runs(&runs, &images)?;
        // A checkpoint now makes the replayed state the starting point of the next recovery.
        store.checkpoint()?;
        store.trim_unused()?;
        Ok(store)
    }

    /// What recovery found and dealt with when the store opened.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// Pages whose journal record is damaged, with why: they read as corruption errors until
    /// rewritten or trimmed.
    pub fn damaged_pages(&self) -> Vec<(ChunkId, PageNo, String)> {
        self.state.lock().damaged_pages()
    }

    /// The store with another trim policy (the default is [`TrimPolicy::EveryRun`]).
    pub fn with_trim_policy(mut self, policy: TrimPolicy) -> Store {
        self.trim_policy = policy;
        self
    }

    /// The store with small commits' carried images written behind them (see [`Unwritten`]):
    /// a commit then makes one device write, the log's, and the images go to their runs
    /// when [`Store::write_unwritten`] is called (a node's background thread does so every
    /// 50 ms), when [`UNWRITTEN_BATCH`] of them wait, or at a checkpoint. Off by default: the
    /// run is written before the commit, and a device's space figures follow every commit.
    pub fn with_write_behind(mut self, on: bool) -> Store {
        self.write_behind = on;
        self
    }

    /// The store writing carried images to their runs once `images` wait (tests try small
    /// batches; the default is [`UNWRITTEN_BATCH`]).
    #[cfg(test)]
    pub(crate) fn with_unwritten_batch(mut self, images: usize) -> Store {
        self.unwritten_batch = images.max(1);
        self
    }

    pub fn trim_policy(&self) -> TrimPolicy {
        self.trim_policy
    }

    /// The lowest id a new volume may take: every id below it was given out before, to a
    /// volume that may since have been deleted.
    pub fn next_volume_id(&self) -> VolumeId {
        self.state.lock().next_volume_id
    }

    pub fn volume(&self, id: VolumeId) -> Option<Volume> {
        self.state.lock().volume(id).cloned()
    }

    pub fn volumes(&self) -> Vec<Volume> {
        self.state.lock().volumes.values().cloned().collect()
    }

    /// The volume a page belongs to, if the page lies inside one.
    fn volume_of(&self, chunk: ChunkId, page: PageNo) -> Result<Volume> {
        self.state.lock().volume_of(chunk, page).cloned()
    }

    /// Makes freed runs reusable once no reader can hold them, trims them on the data device
    /// (under [`TrimPolicy::EveryRun`]), and gives empty extents back to the device allocator.
    pub fn release_freed(&self) -> Result<()> {
        let _no_readers = self.reuse_gate.write();
        let mut freed = self.state.lock().take_pending();
        // A run freed by a deferred record is still a page's in the durable index: it is
        // reused (or trimmed) only once that record is durable.
        if let Err(error) = self.sync() {
            self.state.lock().keep_pending(&freed);
            return Err(error);
        }
        // Images of freed runs that were never written are not written now: the run may go
        // to another page as soon as it is released below.
        if !release_keeps_unwritten_images() {
            let mut unwritten = self.unwritten.lock();
            for &(_, run) in &freed {
                if unwritten.get(&run.first_lba().0).is_some_and(|u| u.run == run) {
                    unwritten.remove(&run.first_lba().0);
                }
            }
        }
        let mut result = Ok(());
        if self.trim_policy == TrimPolicy::EveryRun {
            // The runs are trimmed while they are in neither the pending list nor the
            // allocator, and only then become allocatable: a run freed first and trimmed after
            // could be handed to a concurrent writer in between, and the trim would then punch
            // out that writer's new page.
            for (i, &(_, run)) in freed.iter().enumerate() {
                if let Err(error) = self.data.trim(run.first_lba(), u64::from(run.count)) {
                    // Not trimmed, so not reusable yet: back to the pending list for the next pass.
                    self.state.lock().keep_pending(&freed[i..]);
                    freed.truncate(i);
                    result = Err(error.into());
                    break;
                }
            }
        }
        self.state.lock().release(&freed);
        result
    }

    /// Checks the store's invariants (see store/invariants.rs): the allocator equals the one
    /// derived from the index, no two pages share a block, every page is inside its volume.
    /// Expensive; for tests and simulation, on a store with no write in progress.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        match self.state.lock().invariant_problem() {
            Some(problem) => Err(problem),
            None => Ok(()),
        }
    }

    /// The index entry of a page, if it exists.
    pub fn entry(&self, chunk: ChunkId, page: PageNo) -> Option<PageEntry> {
        self.state.lock().entry(chunk, page)
    }

    /// Trims every block no page references. A crash between a page's data write and its
    /// journal record leaves blocks written but unreferenced; on a compressing drive they would
    /// hold physical space until reused. Under [`TrimPolicy::Deferred`] it also trims the
    /// runs reused untrimmed, so the device then maps exactly the blocks pages reference. Holds
    /// the state lock throughout, so that no writer takes a block while it is being trimmed:
    /// for opening and checking, not for the I/O path.
    pub fn trim_unused(&self) -> Result<()> {
        let state = self.state.lock();
        for (first, count) in state.unused_ranges() {
            self.data.trim(first, count)?;
        }
        drop(state);
        self.data.flush()?;
        Ok(())
    }

    /// The stored image of a page, verified against its entry's length; `None` if the page does
    /// not exist.
    pub fn read_image(&self, chunk: ChunkId, page: PageNo) -> Result<Option<(PageEntry, Vec<u8>)>> {
        Ok(self.read_images(chunk, &[page])?.pop().flatten())
    }

    /// The stored images of `pages` of one chunk, in their order, each as [`Store::read_image`]
    /// reads it. Images whose runs follow one another on the data device are read with one
    /// device read of at most [`READ_SPAN_BLOCKS`] blocks: a block device's read-ahead asks
    /// for several pages at once, and pages written together take consecutive runs, so a read
    /// of N such pages costs one device read, not N in a row.
    pub fn read_images(&self, chunk: ChunkId, pages: &[PageNo]) -> Result<Vec<Option<StoredImage>>> {
        let _reading = self.reuse_gate.read();
        let entries: Vec<Option<PageEntry>> = {
            let state = self.state.lock();
            pages.iter().map(|&page| state.readable_entry(chunk, page)).collect::<Result<_>>()?
        };
        let mut images: Vec<Option<StoredImage>> = (0..pages.len()).map(|_| None).collect();
        // (index in `pages`, entry, image length) of the images to read from the device.
        let mut from_device: Vec<(usize, PageEntry, usize)> = Vec::with_capacity(pages.len());
        for (i, (entry, &page)) in entries.into_iter().zip(pages).enumerate() {
            let Some(entry) = entry else { continue };
            let len = image_len(chunk, page, &entry)?;
            if entry.run.count == 0 {
                // No block to read (an image of no bytes: `image_len` allows nothing more).
                images[i] = Some((entry, Vec::new()));
                continue;
            }
            let waiting = if reads_skip_unwritten_images() {
                None
            } else {
                self.unwritten.lock().get(&entry.run.first_lba().0).filter(|u| u.run == entry.run).cloned()
            };
            match waiting {
                // The image's run is not written yet (see `Unwritten`); its bytes are the run's.
                Some(waiting) => {
                    let mut bytes = waiting.image.as_ref().clone();
                    bytes.resize(len, 0);
                    images[i] = Some((entry, bytes));
                }
                None => from_device.push((i, entry, len)),
            }
        }
        from_device.sort_unstable_by_key(|&(_, entry, _)| entry.run.first_lba().0);
        // Spans of runs that follow one another: (first block, blocks, entries as a range of
        // `from_device`).
        let mut spans: Vec<(u64, usize, std::ops::Range<usize>)> = Vec::new();
        let mut at = 0;
        while at < from_device.len() {
            let first = from_device[at].1.run.first_lba().0;
            let mut end = first + u64::from(from_device[at].1.run.count);
            let mut next = at + 1;
            while let Some(&(_, entry, _)) = from_device.get(next) {
                let start = entry.run.first_lba().0;
                let run_end = start + u64::from(entry.run.count);
                if start != end || run_end - first > READ_SPAN_BLOCKS {
                    break;
                }
                end = run_end;
                next += 1;
            }
            spans.push((first, (end - first) as usize, at..next));
            at = next;
        }
        let mut fill = |first: u64, entries: &std::ops::Range<usize>, buffer: &[u8]| {
            for &(i, entry, len) in &from_device[entries.clone()] {
                let offset = (entry.run.first_lba().0 - first) as usize * BLOCK_SIZE;
                images[i] = Some((entry, buffer[offset..offset + len].to_vec()));
            }
        };
        match spans.as_slice() {
            [] => {}
            // One span (a page alone, the usual read): this thread's scratch buffer.
            [(first, blocks, entries)] => with_scratch(blocks * BLOCK_SIZE, |buffer| -> Result<()> {
                self.data.read(Lba(*first), buffer)?;
                fill(*first, entries, buffer);
                Ok(())
            })?,
            // Several: their reads go to the device together.
            spans => {
                let mut buffers: Vec<BlockBuf> =
                    spans.iter().map(|&(_, blocks, _)| BlockBuf::zeroed(blocks * BLOCK_SIZE)).collect();
                let mut reads: Vec<(Lba, &mut [u8])> = spans
                    .iter()
                    .zip(buffers.iter_mut())
                    .map(|(&(first, _, _), buffer)| (Lba(first), &mut **buffer))
                    .collect();
                self.data.read_many(&mut reads)?;
                for ((first, _, entries), buffer) in spans.iter().zip(&buffers) {
                    fill(*first, entries, buffer);
                }
            }
        }
        Ok(images)
    }

    /// Writes a checkpoint of the whole index, so that recovery replays only what follows.
    pub fn checkpoint(&self) -> Result<()> {
        let _quiet = self.checkpoint_gate.write();
        // Deferred records are installed already: the checkpoint reflects them, so they must
        // be in the log before its position.
        self.sync()?;
        // Images that commits carried in the log (Journal::commit_with_data) may still be
        // unwritten, or only in the data device's cache: the log stops being replayed at this
        // checkpoint, so they must be written and durable first.
        if !checkpoint_skips_unwritten_images() {
            self.write_unwritten()?;
        }
        if !checkpoint_skips_data_flush() {
            self.data.flush()?;
        }
        let records = self.state.lock().checkpoint_records();
        let position = self.journal.position();
        self.journal.checkpoint(&records, position)
    }

    /// Takes a checkpoint when the journal asks for one (see [`Journal::wants_checkpoint`]).
    pub fn maybe_checkpoint(&self) -> Result<()> {
        if self.journal.wants_checkpoint() { self.checkpoint() } else { Ok(()) }
    }

    pub fn stats(&self) -> StoreStats {
        self.state.lock().stats()
    }

    /// What the store's journal has done since the store opened: group commits, the data
    /// flushes among them, the page images commits carried in the log, checkpoints.
    pub fn journal_stats(&self) -> crate::journal::JournalStats {
        self.journal.stats()
    }

    /// Space figures of volume `id` (zero for an unknown volume).
    pub fn volume_usage(&self, id: VolumeId) -> VolumeUsage {
        self.state.lock().volume_usage(id)
    }

    /// Space figures of one chunk: its pages, the blocks they take after software compression,
    /// and the data device's media bytes under those blocks (after the drive's compression,
    /// counted as the device counts its physical usage; None when the device cannot tell a
    /// range's share). Seed 000 §4.2.2 schedules by these per-chunk ratios. Pages sharing a
    /// run (heavy segments) count the run once.
    pub fn chunk_usage(&self, chunk: ChunkId) -> ChunkUsage {
        let entries = self.chunk_entries(chunk);
        let mut runs = std::collections::BTreeSet::new();
        for (_, entry) in &entries {
            runs.insert((entry.run.extent.0, entry.run.offset, entry.run.count));
        }
        let mut physical = Some(0u64);
        let mut stored_bytes = 0u64;
        for &(extent, offset, count) in &runs {
            let run = BlockRun::new(crate::ids::ExtentId(extent), offset, count);
            stored_bytes += u64::from(count) * BLOCK_SIZE as u64;
            physical = match (physical, self.data.physical_bytes_in(run.first_lba(), u64::from(count))) {
                (Some(sum), Some(bytes)) => Some(sum + bytes),
                _ => None,
            };
        }
        ChunkUsage { pages: entries.len() as u64, stored_bytes, physical_bytes: physical }
    }

    /// Every page's entry, in (chunk, page) order, for checks.
    pub fn entries(&self) -> Vec<(ChunkId, PageNo, PageEntry)> {
        self.state.lock().entries()
    }

    /// A volume's redo watermarks, if it has any.
    pub fn watermarks(&self, volume: VolumeId) -> Option<Watermarks> {
        self.state.lock().watermarks(volume)
    }

    /// The data device, for tools that inspect it.
    pub fn data_device(&self) -> &dyn BlockDevice {
        self.data.as_ref()
    }

    /// Writes every image small commits carried in the log that still waits for its run (see
    /// [`Unwritten`]), not flushed. A node's background thread calls it every 50 ms, a commit
    /// when [`UNWRITTEN_BATCH`] images wait, a checkpoint before it ends their replay, and a
    /// check before it reads the device.
    pub fn write_unwritten(&self) -> Result<()> {
        let _one_batch = self.writing_unwritten.lock();
        // No run of the batch is freed and reused while it is written (see `Unwritten`).
        let _no_reuse = self.reuse_gate.read();
        let batch: Vec<Unwritten> = self.unwritten.lock().values().cloned().collect();
        if batch.is_empty() {
            return Ok(());
        }
        let runs: Vec<BlockRun> = batch.iter().map(|u| u.run).collect();
        let images: Vec<&[u8]> = batch.iter().map(|u| u.image.as_slice()).collect();
        self.write_runs(&runs, &images).inspect_err(|error| {
            self.state.lock().failed.get_or_insert_with(|| error.to_string());
        })?;
        let mut unwritten = self.unwritten.lock();
        for written in &batch {
            let key = written.run.first_lba().0;
            if unwritten.get(&key).is_some_and(|u| Arc::ptr_eq(&u.image, &written.image)) {
                unwritten.remove(&key);
            }
        }
        Ok(())
    }

    /// How many carried images wait for their runs (see [`Unwritten`]).
    pub fn unwritten_images(&self) -> usize {
        self.unwritten.lock().len()
    }

    /// Reads `count` raw blocks of the data device at `lba`, after writing the images that wait
    /// for their runs.
    pub fn read_blocks(&self, lba: Lba, count: usize) -> Result<Vec<u8>> {
        self.write_unwritten()?;
        let mut bytes = vec![0u8; count * BLOCK_SIZE];
        self.data.read(lba, &mut bytes)?;
        Ok(bytes)
    }
}

/// A page's entry and its stored image, as [`Store::read_image`] returns them.
pub type StoredImage = (PageEntry, Vec<u8>);

/// The most blocks [`Store::read_images`] reads with one device read: 1 MiB.
pub const READ_SPAN_BLOCKS: u64 = 256;

/// The length of a page's stored image, checked against the blocks its entry names: a heavy
/// page's image is its whole segment (its stored length is its place in it).
fn image_len(chunk: ChunkId, page: PageNo, entry: &PageEntry) -> Result<usize> {
    let blocks = usize::from(entry.run.count) * BLOCK_SIZE;
    let len = if entry.encoding == Encoding::Heavy { blocks } else { usize::from(entry.stored_len) };
    if len > blocks {
        return Err(Error::corrupted(format!(
            "page {} of chunk {}: a stored length of {len} bytes in {} block(s)",
            page.0, chunk.0, entry.run.count
        )));
    }
    Ok(len)
}

/// Checks that an image fits its volume: the page size, and no compression in a volume of mode
/// none. Returns the blocks it takes.
fn check_image(volume: &Volume, image: &PageImage) -> Result<u8> {
    let len = image.bytes.len();
    let page_size = volume.page_size as usize;
    let valid = match image.encoding {
        Encoding::Raw => len == page_size,
        Encoding::Lz4 | Encoding::Zstd => len > 0 && len <= page_size && volume.mode == VolumeMode::Normal,
        Encoding::Heavy => false,
    };
    if !valid {
        return Err(Error::invalid(format!(
            "a {:?} image of {len} bytes does not fit volume {:?} ({page_size}-byte pages, mode {:?})",
            image.encoding, volume.name, volume.mode
        )));
    }
    Ok(len.div_ceil(BLOCK_SIZE) as u8)
}

/// Declares a twin (tests only): `$get()` says whether this thread injects the bug it names,
/// and is always false outside tests; `$set(on)` turns it on or off for this thread.
macro_rules! twin {
    ($(#[$doc:meta])* $get:ident, $set:ident, $flag:ident) => {
        $(#[$doc])*
        fn $get() -> bool {
            #[cfg(test)]
            return $flag.with(|flag| flag.get());
            #[cfg(not(test))]
            false
        }

        #[cfg(test)]
        thread_local! {
            static $flag: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        }

        /// Turns the twin on or off for this thread.
        #[cfg(test)]
        pub(crate) fn $set(on: bool) {
            $flag.with(|flag| flag.set(on));
        }
    };
}

twin!(
    /// The twin of the checkpoint's data flush: a checkpoint then ends the replay of images the
    /// data device may not hold yet, and the store's crash test must fail.
    checkpoint_skips_data_flush,
    set_checkpoint_skips_data_flush,
    SKIP_CHECKPOINT_DATA_FLUSH
);

twin!(
    /// The twin of the checkpoint's writing of unwritten images: a checkpoint then ends the
    /// replay of images whose runs were never written, and the store's crash test must fail.
    checkpoint_skips_unwritten_images,
    set_checkpoint_skips_unwritten_images,
    SKIP_CHECKPOINT_UNWRITTEN
);

twin!(
    /// The twin of reads served from waiting images: a read then takes the run's blocks even
    /// while the image waits for them, and the store's concurrent test must fail.
    reads_skip_unwritten_images,
    set_reads_skip_unwritten_images,
    SKIP_READ_UNWRITTEN
);

twin!(
    /// The twin of the release's dropping of freed runs' unwritten images: a batch then writes
    /// a page's old image over the run after it went to another page, and the store's crash
    /// test must fail.
    release_keeps_unwritten_images,
    set_release_keeps_unwritten_images,
    KEEP_FREED_UNWRITTEN
);

#[cfg(test)]
mod replace_tests;
#[cfg(test)]
mod replica_tests;
#[cfg(test)]
pub(crate) mod tests;
