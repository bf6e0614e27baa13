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
//! Pages stored together ([`Store::apply_writes`]) take consecutive blocks where they are free,
//! and blocks that follow each other on the device are written with one I/O.
//!
//! The mutating entry point, [`Store::apply_write`], takes an already-encoded image, so that a
//! Raft leader can compress once and every replica stores the same bytes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tundra_device::{BLOCK_SIZE, BlockDevice, Lba};

use crate::alloc::{ChunkBlocks, ExtentAllocator};
use crate::buf::with_scratch;
use crate::ids::{BlockRun, ChunkId, EXTENT_BLOCKS, Lsn, PageNo, VolumeId};
use crate::index::{ChunkIndex, Encoding, PageEntry};
use crate::journal::{Journal, JournalPlace, LogDamage, Record};
use crate::volume::{Volume, VolumeMode};
use crate::{Error, ErrorKind, Result};

mod invariants;
mod rebuild;
use rebuild::{DamagedEntry, rebuild};

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

#[derive(Default)]
struct Chunk {
    index: ChunkIndex,
    blocks: ChunkBlocks,
}

struct State {
    volumes: BTreeMap<VolumeId, Volume>,
    /// Every id below this one was given to a volume once; a new volume takes this one or
    /// higher, never a deleted volume's.
    next_volume_id: VolumeId,
    extents: ExtentAllocator,
    /// Ordered, so that everything iterated (checkpoints, release, statistics) goes in one
    /// order on every run and replica.
    chunks: BTreeMap<ChunkId, Chunk>,
    /// Runs replaced or trimmed whose journal records are durable, waiting for readers to
    /// finish before they are reused.
    pending_free: Vec<(ChunkId, BlockRun)>,
    /// Pages that share each heavy segment's run; the run is freed when the last one leaves.
    heavy_refs: HashMap<(ChunkId, BlockRun), u32>,
    /// Pages whose journal record cannot be served (see `rebuild`): they read as corruption
    /// errors until rewritten or trimmed, and every checkpoint keeps their records.
    damaged: BTreeMap<(ChunkId, PageNo), DamagedEntry>,
    failed: Option<String>,
}

impl State {
    /// Lets go of an entry's blocks: freed at once, or for a heavy segment when no other page
    /// of it remains.
    fn release_entry(&mut self, chunk: ChunkId, entry: PageEntry) {
        if entry.encoding == Encoding::Heavy {
            let refs = self.heavy_refs.get_mut(&(chunk, entry.run)).expect("a heavy page's segment is counted");
            *refs -= 1;
            if *refs > 0 {
                return;
            }
            self.heavy_refs.remove(&(chunk, entry.run));
        }
        self.pending_free.push((chunk, entry.run));
    }

    /// Installs an entry (or removes the page) and lets go of the entry it replaces.
    fn install(&mut self, chunk: ChunkId, page: PageNo, entry: Option<PageEntry>) {
        self.damaged.remove(&(chunk, page));
        if let Some(new) = entry.filter(|e| e.encoding == Encoding::Heavy) {
            *self.heavy_refs.entry((chunk, new.run)).or_insert(0) += 1;
        }
        if let Some(old) = self.chunks.entry(chunk).or_default().index.set(page, entry) {
            self.release_entry(chunk, old);
        }
    }
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

/// One node's page store.
pub struct Store {
    data: Arc<dyn BlockDevice>,
    recovery: Recovery,
    trim_policy: TrimPolicy,
    journal: Journal,
    state: Mutex<State>,
    /// Writers hold it shared from their journal commit to their index install; a checkpoint
    /// holds it exclusively, so its snapshot and log position agree, and so does a volume's
    /// delete, so no page of the volume is journalled after it.
    checkpoint_gate: RwLock<()>,
    /// Readers hold it shared while they read blocks; freed runs become reusable only under it
    /// exclusively.
    reuse_gate: RwLock<()>,
}

/// Freed runs are released in batches, so that the reuse gate is taken rarely.
const RELEASE_BATCH: usize = 64;

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
        let state = rebuild(replay, extent_count)?;
        let store = Store {
            data,
            recovery,
            trim_policy: TrimPolicy::default(),
            journal,
            state: Mutex::new(state),
            checkpoint_gate: RwLock::new(()),
            reuse_gate: RwLock::new(()),
        };
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
        self.state.lock().damaged.iter().map(|(&(chunk, page), d)| (chunk, page, d.why.clone())).collect()
    }

    /// The store with another trim policy (the default is [`TrimPolicy::EveryRun`]).
    pub fn with_trim_policy(mut self, policy: TrimPolicy) -> Store {
        self.trim_policy = policy;
        self
    }

    pub fn trim_policy(&self) -> TrimPolicy {
        self.trim_policy
    }

    /// Creates a volume. Its name must be new, and its id never given before (at least
    /// [`Store::next_volume_id`]).
    pub fn create_volume(&self, volume: Volume) -> Result<()> {
        volume.validate()?;
        let _no_checkpoint = self.checkpoint_gate.read();
        {
            let state = self.state.lock();
            if volume.id.0 == u32::MAX {
                return Err(Error::invalid("this store has given out every volume id"));
            }
            if volume.id < state.next_volume_id {
                return Err(Error::invalid(format!(
                    "volume id {} was given out before; ids are never reused (the next free one is {})",
                    volume.id.0, state.next_volume_id.0
                )));
            }
            if state.volumes.values().any(|v| v.name == volume.name) {
                return Err(Error::invalid(format!("a volume named {:?} exists", volume.name)));
            }
        }
        self.commit_volume(Record::VolumeSet(volume.clone()))?;
        let mut state = self.state.lock();
        state.next_volume_id = state.next_volume_id.max(volume.id.next());
        state.volumes.insert(volume.id, volume);
        Ok(())
    }

    /// The lowest id a new volume may take: every id below it was given out before, to a
    /// volume that may since have been deleted.
    pub fn next_volume_id(&self) -> VolumeId {
        self.state.lock().next_volume_id
    }

    /// Grows a volume to `size_bytes`. Shrinking would drop pages, which is not offered.
    pub fn resize_volume(&self, id: VolumeId, size_bytes: u64) -> Result<()> {
        let _no_checkpoint = self.checkpoint_gate.read();
        let mut volume = self.volume(id).ok_or_else(|| Error::invalid(format!("no volume {}", id.0)))?;
        if size_bytes < volume.size_bytes {
            return Err(Error::invalid("volumes only grow: shrinking would drop pages"));
        }
        volume.size_bytes = size_bytes;
        volume.validate()?;
        self.commit_volume(Record::VolumeSet(volume.clone()))?;
        self.state.lock().volumes.insert(id, volume);
        Ok(())
    }

    /// Deletes a volume: its pages are gone and their blocks freed and trimmed.
    pub fn delete_volume(&self, id: VolumeId) -> Result<()> {
        {
            // Exclusive: no write of the volume commits between its delete and the removal of
            // its pages (a record of a deleted volume's page would make the journal unreadable).
            let _no_commit = self.checkpoint_gate.write();
            if self.volume(id).is_none() {
                return Err(Error::invalid(format!("no volume {}", id.0)));
            }
            self.commit_volume(Record::VolumeDelete(id))?;
            let mut state = self.state.lock();
            state.volumes.remove(&id);
            state.damaged.retain(|(chunk, _), _| chunk.volume() != id);
            let chunks: Vec<ChunkId> = state.chunks.keys().copied().filter(|c| c.volume() == id).collect();
            for chunk in chunks {
                let pages: Vec<PageNo> = state.chunks[&chunk].index.iter().map(|(p, _)| p).collect();
                for page in pages {
                    state.install(chunk, page, None);
                }
            }
        }
        self.release_freed()?;
        if self.trim_policy == TrimPolicy::Deferred {
            self.trim_unused()?;
        }
        Ok(())
    }

    fn commit_volume(&self, record: Record) -> Result<()> {
        self.journal.commit(std::slice::from_ref(&record)).inspect_err(|error| {
            self.state.lock().failed.get_or_insert_with(|| error.to_string());
        })
    }

    pub fn volume(&self, id: VolumeId) -> Option<Volume> {
        self.state.lock().volumes.get(&id).cloned()
    }

    pub fn volumes(&self) -> Vec<Volume> {
        self.state.lock().volumes.values().cloned().collect()
    }

    /// The volume a page belongs to, if the page lies inside one.
    fn volume_of(&self, chunk: ChunkId, page: PageNo) -> Result<Volume> {
        match self.state.lock().volumes.get(&chunk.volume()) {
            Some(volume) if volume.contains(chunk, page) => Ok(volume.clone()),
            Some(volume) => Err(Error::invalid(format!(
                "page {} of chunk {} is outside volume {:?}",
                page.0,
                chunk.index(),
                volume.name
            ))),
            None => Err(Error::invalid(format!("no volume {}", chunk.volume().0))),
        }
    }

    /// Stores an encoded page: allocate, write and flush its blocks, journal, install, free the
    /// old blocks. `lsn` is the LSN of the change the image carries.
    pub fn apply_write(&self, chunk: ChunkId, page: PageNo, image: &PageImage, lsn: Lsn) -> Result<()> {
        let volume = self.volume_of(chunk, page)?;
        let blocks = check_image(&volume, image)?;
        let run = self.write_run(chunk, &image.bytes, blocks)?;
        let stored_len = image.bytes.len();
        let entry =
            PageEntry { encoding: image.encoding, run, stored_len: stored_len as u16, checksum: image.checksum, lsn };
        self.commit_and_install(chunk, &[(page, Some(entry))], &[run])
    }

    /// Stores several pages of one chunk with one journal commit: each image is written to its
    /// own blocks, then one group of records installs them all (one data flush and one journal
    /// flush for the lot, where page-at-a-time writes pay both per page). The pages take
    /// consecutive blocks where they are free, and blocks that follow each other on the device
    /// are written with one I/O. Every image is checked before anything is written; on an
    /// error nothing is installed and the blocks taken are freed.
    pub fn apply_writes(&self, chunk: ChunkId, pages: &[(PageNo, PageImage, Lsn)]) -> Result<()> {
        let mut counts = Vec::with_capacity(pages.len());
        for (page, image, _) in pages {
            counts.push(check_image(&self.volume_of(chunk, *page)?, image)?);
        }
        let runs = self.allocate_many(chunk, &counts)?;
        let images: Vec<&[u8]> = pages.iter().map(|(_, image, _)| image.bytes.as_slice()).collect();
        if let Err(error) = self.write_runs(&runs, &images) {
            self.abandon_runs(chunk, &runs)?;
            return Err(error);
        }
        let entries: Vec<(PageNo, Option<PageEntry>)> = pages
            .iter()
            .zip(&runs)
            .map(|((page, image, lsn), &run)| {
                let entry = PageEntry {
                    encoding: image.encoding,
                    run,
                    stored_len: image.bytes.len() as u16,
                    checksum: image.checksum,
                    lsn: *lsn,
                };
                (*page, Some(entry))
            })
            .collect();
        self.commit_and_install(chunk, &entries, &runs)
    }

    /// Writes each image to its run, zero-padded, with one device write for every group of
    /// runs that follow each other on the device. Not flushed (see [`Store::write_run`]).
    fn write_runs(&self, runs: &[BlockRun], images: &[&[u8]]) -> Result<()> {
        let mut order: Vec<usize> = (0..runs.len()).collect();
        order.sort_unstable_by_key(|&i| runs[i].first_lba().0);
        let mut i = 0;
        while i < order.len() {
            let first = runs[order[i]].first_lba();
            let mut end = i + 1;
            while end < order.len()
                && runs[order[end]].first_lba().0
                    == runs[order[end - 1]].first_lba().0 + u64::from(runs[order[end - 1]].count)
            {
                end += 1;
            }
            let group = &order[i..end];
            let blocks: usize = group.iter().map(|&j| usize::from(runs[j].count)).sum();
            with_scratch(blocks * BLOCK_SIZE, |buffer| {
                let mut at = 0;
                for &j in group {
                    let len = usize::from(runs[j].count) * BLOCK_SIZE;
                    buffer[at..at + images[j].len()].copy_from_slice(images[j]);
                    buffer[at + images[j].len()..at + len].fill(0);
                    at += len;
                }
                self.data.write(first, buffer)
            })?;
            i = end;
        }
        Ok(())
    }

    /// Stores a heavy segment (seed 000 §3.2.3): `segment` (header and compressed frame, at most
    /// one extent) holds `pages`, consecutive pages of `chunk` given with their checksums and
    /// LSNs, in order. Every page's entry points at the segment's run and its position in it,
    /// and keeps the page's LSN: archiving changes no page.
    pub fn apply_heavy(&self, chunk: ChunkId, pages: &[(PageNo, u32, Lsn)], segment: &[u8]) -> Result<()> {
        for &(page, _, _) in pages {
            let volume = self.volume_of(chunk, page)?;
            if volume.mode != VolumeMode::Normal {
                return Err(Error::invalid(format!("volume {:?} is never compressed", volume.name)));
            }
        }
        let max = EXTENT_BLOCKS as usize * BLOCK_SIZE;
        if pages.is_empty()
            || pages.len() > usize::from(u16::MAX)
            || segment.len() > max
            || segment.len() <= HEAVY_HEADER_BYTES
        {
            return Err(Error::invalid(format!(
                "a heavy segment of {} pages in {} bytes (at most {max})",
                pages.len(),
                segment.len()
            )));
        }
        let run = self.write_run(chunk, segment, segment.len().div_ceil(BLOCK_SIZE) as u8)?;
        let entries: Vec<(PageNo, Option<PageEntry>)> = pages
            .iter()
            .enumerate()
            .map(|(i, &(page, checksum, lsn))| {
                (page, Some(PageEntry { encoding: Encoding::Heavy, run, stored_len: i as u16, checksum, lsn }))
            })
            .collect();
        self.commit_and_install(chunk, &entries, &[run])
    }

    /// Allocates `blocks` blocks in `chunk` and writes `bytes` there, zero-padded. Not flushed:
    /// the journal flushes the data device before it writes the record that points here.
    fn write_run(&self, chunk: ChunkId, bytes: &[u8], blocks: u8) -> Result<BlockRun> {
        let run = self.allocate_many(chunk, &[blocks])?[0];
        if let Err(error) = self.write_runs(&[run], &[bytes]) {
            self.state.lock().chunks.get_mut(&chunk).expect("allocated above").blocks.free(run);
            return Err(error);
        }
        Ok(run)
    }

    /// Removes a page: it reads as absent, and its blocks are freed and trimmed.
    pub fn trim_page(&self, chunk: ChunkId, page: PageNo) -> Result<()> {
        self.volume_of(chunk, page)?;
        let mapped = {
            let state = self.state.lock();
            state.chunks.get(&chunk).is_some_and(|c| c.index.get(page).is_some())
                || state.damaged.contains_key(&(chunk, page))
        };
        if !mapped {
            return Ok(());
        }
        self.commit_and_install(chunk, &[(page, None)], &[])
    }

    /// Takes a run of `counts[i]` contiguous blocks for each page of a group, each directly
    /// after the previous one where those blocks are free (so that the group goes to the device
    /// in few I/Os), otherwise the chunk's first fit, granting the chunk a new extent if
    /// needed. All or nothing.
    fn allocate_many(&self, chunk: ChunkId, counts: &[u8]) -> Result<Vec<BlockRun>> {
        let mut state = self.state.lock();
        if let Some(reason) = &state.failed {
            return Err(Error::closed(format!("the store stopped after an error ({reason})")));
        }
        let state = &mut *state;
        let blocks = &mut state.chunks.entry(chunk).or_default().blocks;
        let mut runs: Vec<BlockRun> = Vec::with_capacity(counts.len());
        for &count in counts {
            let mut run = runs.last().and_then(|&previous| blocks.allocate_after(previous, count));
            if run.is_none() {
                run = blocks.allocate(count);
            }
            if run.is_none()
                && let Some(extent) = state.extents.grant(chunk)
            {
                blocks.add_extent(extent);
                run = blocks.allocate(count);
            }
            match run {
                Some(run) => runs.push(run),
                None => {
                    for &run in &runs {
                        blocks.free(run);
                    }
                    return Err(Error::new(ErrorKind::Full, "the data device has no free extent"));
                }
            }
        }
        Ok(runs)
    }

    /// Journals new entries (or removals) of pages of `chunk` as one group, then installs them
    /// and lets go of the blocks they replace. On a journal error `new_runs`, the blocks the
    /// entries point at, is freed and the store stops.
    fn commit_and_install(
        &self,
        chunk: ChunkId,
        entries: &[(PageNo, Option<PageEntry>)],
        new_runs: &[BlockRun],
    ) -> Result<()> {
        let records: Vec<Record> = entries
            .iter()
            .map(|&(page, entry)| match entry {
                Some(entry) => Record::PageSet { chunk, page, entry },
                None => Record::PageClear { chunk, page },
            })
            .collect();
        let _no_checkpoint = self.checkpoint_gate.read();
        // A volume deleted since the write began takes nothing more: its delete holds the gate
        // exclusively, so it is either journalled before this check or after this commit.
        if !self.state.lock().volumes.contains_key(&chunk.volume()) {
            self.abandon_runs(chunk, new_runs)?;
            return Err(Error::invalid(format!("volume {} was deleted", chunk.volume().0)));
        }
        if let Err(error) = self.journal.commit(&records) {
            let mut state = self.state.lock();
            for &run in new_runs {
                state.chunks.get_mut(&chunk).expect("allocated").blocks.free(run);
            }
            state.failed.get_or_insert_with(|| error.to_string());
            return Err(error);
        }
        let release = {
            let mut state = self.state.lock();
            for &(page, entry) in entries {
                state.install(chunk, page, entry);
            }
            state.pending_free.len() >= RELEASE_BATCH
        };
        drop(_no_checkpoint);
        if release {
            self.release_freed()?;
        }
        Ok(())
    }

    /// Gives back runs written but never journalled: nothing points at them, so they are
    /// trimmed (they hold no space on a compressing drive), then allocatable again.
    fn abandon_runs(&self, chunk: ChunkId, runs: &[BlockRun]) -> Result<()> {
        for &run in runs {
            self.data.trim(run.first_lba(), u64::from(run.count))?;
        }
        let mut state = self.state.lock();
        for &run in runs {
            state.chunks.get_mut(&chunk).expect("allocated to this chunk").blocks.free(run);
        }
        Ok(())
    }

    /// Makes freed runs reusable once no reader can hold them, trims them on the data device
    /// (under [`TrimPolicy::EveryRun`]), and gives empty extents back to the device allocator.
    pub fn release_freed(&self) -> Result<()> {
        let _no_readers = self.reuse_gate.write();
        let mut freed = std::mem::take(&mut self.state.lock().pending_free);
        let mut result = Ok(());
        if self.trim_policy == TrimPolicy::EveryRun {
            // The runs are trimmed while they are in neither the pending list nor the
            // allocator, and only then become allocatable: a run freed first and trimmed after
            // could be handed to a concurrent writer in between, and the trim would then punch
            // out that writer's new page.
            for (i, &(_, run)) in freed.iter().enumerate() {
                if let Err(error) = self.data.trim(run.first_lba(), u64::from(run.count)) {
                    // Not trimmed, so not reusable yet: back to the pending list for the next pass.
                    self.state.lock().pending_free.extend_from_slice(&freed[i..]);
                    freed.truncate(i);
                    result = Err(error.into());
                    break;
                }
            }
        }
        let mut state = self.state.lock();
        for &(chunk, run) in &freed {
            state.chunks.get_mut(&chunk).expect("a chunk with freed blocks").blocks.free(run);
        }
        let state = &mut *state;
        for (&chunk, c) in state.chunks.iter_mut() {
            for extent in c.blocks.empty_extents() {
                c.blocks.remove_extent(extent);
                state.extents.release(extent, chunk);
            }
        }
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
        self.state.lock().chunks.get(&chunk).and_then(|c| c.index.get(page))
    }

    /// Trims every block no page references. A crash between a page's data write and its
    /// journal record leaves blocks written but unreferenced; on a compressing drive they would
    /// hold physical space until reused. Under [`TrimPolicy::Deferred`] it also trims the
    /// runs reused untrimmed, so the device then maps exactly the blocks pages reference. Holds
    /// the state lock throughout, so that no writer takes a block while it is being trimmed:
    /// for opening and checking, not for the I/O path.
    pub fn trim_unused(&self) -> Result<()> {
        let state = self.state.lock();
        let mut used = vec![0u32; state.extents.extent_count() as usize];
        for c in state.chunks.values() {
            for (extent, bits) in c.blocks.extents() {
                used[extent.0 as usize] = bits;
            }
        }
        let mut start: Option<u64> = None;
        let total = used.len() as u64 * u64::from(EXTENT_BLOCKS);
        for block in 0..=total {
            let free = block < total && {
                let bits = used[(block / u64::from(EXTENT_BLOCKS)) as usize];
                bits & (1 << (block % u64::from(EXTENT_BLOCKS))) == 0
            };
            match (free, start) {
                (true, None) => start = Some(block),
                (false, Some(first)) => {
                    self.data.trim(Lba(first), block - first)?;
                    start = None;
                }
                _ => {}
            }
        }
        drop(state);
        self.data.flush()?;
        Ok(())
    }

    /// The stored image of a page, verified against its entry's length; `None` if the page does
    /// not exist.
    pub fn read_image(&self, chunk: ChunkId, page: PageNo) -> Result<Option<(PageEntry, Vec<u8>)>> {
        let _reading = self.reuse_gate.read();
        let entry = {
            let state = self.state.lock();
            if let Some(damaged) = state.damaged.get(&(chunk, page)) {
                return Err(Error::corrupted(format!(
                    "page {} of chunk {}: {}; rewrite or trim the page",
                    page.0, chunk.0, damaged.why
                )));
            }
            state.chunks.get(&chunk).and_then(|c| c.index.get(page))
        };
        let Some(entry) = entry else { return Ok(None) };
        let blocks = usize::from(entry.run.count) * BLOCK_SIZE;
        // A heavy page's image is its whole segment; its stored length is its place in it.
        let len = if entry.encoding == Encoding::Heavy { blocks } else { usize::from(entry.stored_len) };
        if len > blocks {
            return Err(Error::corrupted(format!(
                "page {} of chunk {}: a stored length of {len} bytes in {} block(s)",
                page.0, chunk.0, entry.run.count
            )));
        }
        let bytes = with_scratch(blocks, |buffer| {
            self.data.read(entry.run.first_lba(), buffer).map(|()| buffer[..len].to_vec())
        })?;
        Ok(Some((entry, bytes)))
    }

    /// Writes a checkpoint of the whole index, so that recovery replays only what follows.
    pub fn checkpoint(&self) -> Result<()> {
        let _quiet = self.checkpoint_gate.write();
        let records: Vec<Record> = {
            let state = self.state.lock();
            let floor = std::iter::once(Record::VolumeIdFloor(state.next_volume_id));
            let volumes = floor.chain(state.volumes.values().map(|v| Record::VolumeSet(v.clone())));
            let pages = state.chunks.iter().flat_map(|(&chunk, c)| {
                c.index.iter().map(move |(page, entry)| Record::PageSet { chunk, page, entry })
            });
            // Damaged records are kept as they are, so the next recovery finds them damaged
            // again rather than reading the pages as absent.
            let damaged =
                state.damaged.iter().map(|(&(chunk, page), d)| Record::PageSet { chunk, page, entry: d.entry });
            volumes.chain(pages).chain(damaged).collect()
        };
        let position = self.journal.position();
        self.journal.checkpoint(&records, position)
    }

    /// Takes a checkpoint when the journal asks for one (see [`Journal::wants_checkpoint`]).
    pub fn maybe_checkpoint(&self) -> Result<()> {
        if self.journal.wants_checkpoint() { self.checkpoint() } else { Ok(()) }
    }

    pub fn stats(&self) -> StoreStats {
        let state = self.state.lock();
        let mut stats = StoreStats {
            extents_total: u64::from(state.extents.extent_count()),
            extents_in_use: u64::from(state.extents.extent_count() - state.extents.free_count()),
            ..StoreStats::default()
        };
        for c in state.chunks.values() {
            stats.pages += c.index.mapped_pages();
            stats.stored_bytes += c
                .index
                .iter()
                .filter(|(_, e)| e.encoding != Encoding::Heavy)
                .map(|(_, e)| u64::from(e.run.count) * BLOCK_SIZE as u64)
                .sum::<u64>();
            stats.index_memory_bytes += c.index.memory_bytes();
        }
        stats.stored_bytes +=
            state.heavy_refs.keys().map(|(_, run)| u64::from(run.count) * BLOCK_SIZE as u64).sum::<u64>();
        stats
    }

    /// Space figures of volume `id` (zero for an unknown volume).
    pub fn volume_usage(&self, id: VolumeId) -> VolumeUsage {
        let state = self.state.lock();
        let mut usage = VolumeUsage::default();
        for (&chunk, c) in state.chunks.iter().filter(|(chunk, _)| chunk.volume() == id) {
            for (_, entry) in c.index.iter() {
                usage.pages += 1;
                let bytes = u64::from(entry.run.count) * BLOCK_SIZE as u64;
                match entry.encoding {
                    Encoding::Heavy => usage.heavy_pages += 1,
                    Encoding::Raw => usage.raw_pages += 1,
                    Encoding::Lz4 => usage.lz4_pages += 1,
                    Encoding::Zstd => usage.zstd_pages += 1,
                }
                if entry.encoding != Encoding::Heavy {
                    usage.stored_bytes += bytes;
                    usage.compressed_bytes += u64::from(entry.stored_len);
                }
            }
            for (_, run) in state.heavy_refs.keys().filter(|(c, _)| *c == chunk) {
                let bytes = u64::from(run.count) * BLOCK_SIZE as u64;
                usage.stored_bytes += bytes;
                usage.compressed_bytes += bytes;
            }
        }
        usage
    }

    /// Every page's entry, for checks.
    pub fn entries(&self) -> Vec<(ChunkId, PageNo, PageEntry)> {
        let state = self.state.lock();
        let mut all: Vec<_> =
            state.chunks.iter().flat_map(|(&chunk, c)| c.index.iter().map(move |(p, e)| (chunk, p, e))).collect();
        all.sort_by_key(|&(c, p, _)| (c, p));
        all
    }

    /// The data device, for tools that inspect it.
    pub fn data_device(&self) -> &dyn BlockDevice {
        self.data.as_ref()
    }

    /// Reads `count` raw blocks of the data device at `lba`.
    pub fn read_blocks(&self, lba: Lba, count: usize) -> Result<Vec<u8>> {
        let mut bytes = vec![0u8; count * BLOCK_SIZE];
        self.data.read(lba, &mut bytes)?;
        Ok(bytes)
    }
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

#[cfg(test)]
pub(crate) mod tests;
