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
use crate::ids::{BlockRun, ChunkId, EXTENT_BLOCKS, PageNo, VolumeId};
use crate::index::{ChunkIndex, Encoding, PageEntry};
use crate::journal::{Journal, Record, Replay};
use crate::volume::{Volume, VolumeMode};
use crate::{Error, ErrorKind, Result};

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
    /// The lowest volume id never given out: ids are never reused, so a request bound to a
    /// deleted volume's id can never reach a later volume, nor a chunk id (derived from the
    /// volume id) a later chunk.
    next_volume_id: VolumeId,
    extents: ExtentAllocator,
    chunks: HashMap<ChunkId, Chunk>,
    /// Runs replaced or trimmed whose journal records are durable, waiting for readers to
    /// finish before they are reused.
    pending_free: Vec<(ChunkId, BlockRun)>,
    /// Pages that share each heavy segment's run; the run is freed when the last one leaves.
    heavy_refs: HashMap<(ChunkId, BlockRun), u32>,
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

/// One node's page store.
pub struct Store {
    data: Arc<dyn BlockDevice>,
    trim_policy: TrimPolicy,
    journal: Journal,
    state: Mutex<State>,
    /// Writers hold it shared from their journal commit to their index install; a checkpoint
    /// holds it exclusively, so its snapshot and log position agree.
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
        let (mut journal, replay) = Journal::open(fast)?;
        // Data blocks are flushed by the journal's group commit, once per group of writers.
        journal.set_barrier(data.clone());
        let extent_count = u32::try_from(data.block_count() / u64::from(EXTENT_BLOCKS))
            .map_err(|_| Error::invalid("the data device has more than 2^32 extents"))?;
        let state = rebuild(replay, extent_count)?;
        let store = Store {
            data,
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

    /// The store with another trim policy (the default is [`TrimPolicy::EveryRun`]).
    pub fn with_trim_policy(mut self, policy: TrimPolicy) -> Store {
        self.trim_policy = policy;
        self
    }

    pub fn trim_policy(&self) -> TrimPolicy {
        self.trim_policy
    }

    /// Creates a volume. Its name must be new, and its id at least [`Store::next_volume_id`]:
    /// an id once given out is never given again, even after its volume is deleted.
    pub fn create_volume(&self, volume: Volume) -> Result<()> {
        volume.validate()?;
        let _no_checkpoint = self.checkpoint_gate.read();
        {
            let state = self.state.lock();
            if volume.id < state.next_volume_id {
                return Err(Error::invalid(format!(
                    "volume id {} was given out before (ids are never reused); use {} or higher",
                    volume.id.0, state.next_volume_id.0
                )));
            }
            if volume.id.0 == u32::MAX {
                return Err(Error::invalid("every volume id has been given out"));
            }
            if state.volumes.values().any(|v| v.name == volume.name) {
                return Err(Error::invalid(format!("a volume named {:?} exists", volume.name)));
            }
        }
        self.commit_volume(Record::VolumeSet(volume.clone()))?;
        let mut state = self.state.lock();
        state.next_volume_id = VolumeId(volume.id.0 + 1);
        state.volumes.insert(volume.id, volume);
        Ok(())
    }

    /// The lowest volume id this store has never given out.
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
            let _no_checkpoint = self.checkpoint_gate.read();
            if self.volume(id).is_none() {
                return Err(Error::invalid(format!("no volume {}", id.0)));
            }
            self.commit_volume(Record::VolumeDelete(id))?;
            let mut state = self.state.lock();
            state.volumes.remove(&id);
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
    /// old blocks. `version` is the caller's version of the page (an LSN, later).
    pub fn apply_write(&self, chunk: ChunkId, page: PageNo, image: &PageImage, version: u64) -> Result<()> {
        let volume = self.volume_of(chunk, page)?;
        let blocks = check_image(&volume, image)?;
        let run = self.write_run(chunk, &image.bytes, blocks)?;
        let stored_len = image.bytes.len();
        let entry = PageEntry {
            encoding: image.encoding,
            run,
            stored_len: stored_len as u16,
            checksum: image.checksum,
            version,
        };
        self.commit_and_install(chunk, &[(page, Some(entry))], &[run])
    }

    /// Stores several pages of one chunk with one journal commit: each image is written to its
    /// own blocks, then one group of records installs them all (one data flush and one journal
    /// flush for the lot, where page-at-a-time writes pay both per page). The pages take
    /// consecutive blocks where they are free, and blocks that follow each other on the device
    /// are written with one I/O. Every image is checked before anything is written; on an
    /// error nothing is installed and the blocks taken are freed.
    pub fn apply_writes(&self, chunk: ChunkId, pages: &[(PageNo, PageImage, u64)]) -> Result<()> {
        let mut counts = Vec::with_capacity(pages.len());
        for (page, image, _) in pages {
            counts.push(check_image(&self.volume_of(chunk, *page)?, image)?);
        }
        let runs = self.allocate_many(chunk, &counts)?;
        let images: Vec<&[u8]> = pages.iter().map(|(_, image, _)| image.bytes.as_slice()).collect();
        if let Err(error) = self.write_runs(&runs, &images) {
            // Nothing points at the blocks written: trimmed (so they hold no space on a
            // compressing drive), then allocatable again.
            for &run in &runs {
                self.data.trim(run.first_lba(), u64::from(run.count))?;
            }
            let mut state = self.state.lock();
            for &run in &runs {
                state.chunks.get_mut(&chunk).expect("allocated above").blocks.free(run);
            }
            return Err(error);
        }
        let entries: Vec<(PageNo, Option<PageEntry>)> = pages
            .iter()
            .zip(&runs)
            .map(|((page, image, version), &run)| {
                let entry = PageEntry {
                    encoding: image.encoding,
                    run,
                    stored_len: image.bytes.len() as u16,
                    checksum: image.checksum,
                    version: *version,
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
    /// one extent) holds `pages`, consecutive pages of `chunk` given with their checksums, in
    /// order. Every page's entry points at the segment's run and its position in it.
    pub fn apply_heavy(&self, chunk: ChunkId, pages: &[(PageNo, u32)], segment: &[u8], version: u64) -> Result<()> {
        for &(page, _) in pages {
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
            .map(|(i, &(page, checksum))| {
                (page, Some(PageEntry { encoding: Encoding::Heavy, run, stored_len: i as u16, checksum, version }))
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
        let mapped = self.state.lock().chunks.get(&chunk).is_some_and(|c| c.index.get(page).is_some());
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
        let Some(entry) = self.state.lock().chunks.get(&chunk).and_then(|c| c.index.get(page)) else {
            return Ok(None);
        };
        let blocks = usize::from(entry.run.count) * BLOCK_SIZE;
        // A heavy page's image is its whole segment; its stored length is its place in it.
        let len = if entry.encoding == Encoding::Heavy { blocks } else { usize::from(entry.stored_len) };
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
            volumes.chain(pages).collect()
        };
        let position = self.journal.position();
        self.journal.checkpoint(&records, position)
    }

    /// Takes a checkpoint when the journal's log is half full.
    pub fn maybe_checkpoint(&self) -> Result<()> {
        let (used, total) = self.journal.usage_blocks();
        if used * 2 >= total { self.checkpoint() } else { Ok(()) }
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

/// Rebuilds the index from a journal replay, and the allocator from the index: every run of a
/// mapped page is in use, every extent holding one belongs to that page's chunk. Two pages
/// sharing a block, or two chunks sharing an extent, is corruption.
fn rebuild(replay: Replay, extent_count: u32) -> Result<State> {
    let mut chunks: HashMap<ChunkId, Chunk> = HashMap::new();
    let mut volumes: BTreeMap<VolumeId, Volume> = BTreeMap::new();
    // A journal written before the floor was recorded falls back to one past the highest id it
    // still names.
    let mut next_volume_id = VolumeId(0);
    let raise = |floor: &mut VolumeId, id: VolumeId| *floor = (*floor).max(VolumeId(id.0.saturating_add(1)));
    for record in replay.checkpoint.into_iter().chain(replay.log) {
        match record {
            Record::VolumeSet(volume) => {
                raise(&mut next_volume_id, volume.id);
                volumes.insert(volume.id, volume);
            }
            Record::VolumeDelete(id) => {
                raise(&mut next_volume_id, id);
                volumes.remove(&id);
                chunks.retain(|chunk, _| chunk.volume() != id);
            }
            Record::VolumeIdFloor(floor) => next_volume_id = next_volume_id.max(floor),
            Record::PageSet { chunk, page, entry } => {
                if !volumes.get(&chunk.volume()).is_some_and(|v| v.contains(chunk, page)) {
                    return Err(Error::corrupted(format!(
                        "the journal stores page {} of chunk {} outside every volume",
                        page.0,
                        chunk.index()
                    )));
                }
                chunks.entry(chunk).or_default().index.set(page, Some(entry));
            }
            Record::PageClear { chunk, page } => {
                chunks.entry(chunk).or_default().index.set(page, None);
            }
        }
    }
    let mut extents = ExtentAllocator::new(extent_count);
    let mut heavy_refs: HashMap<(ChunkId, BlockRun), u32> = HashMap::new();
    for (&chunk, c) in chunks.iter_mut() {
        let runs: Vec<(PageNo, PageEntry)> = c.index.iter().collect();
        for (page, entry) in runs {
            let run = entry.run;
            if entry.encoding == Encoding::Heavy {
                let refs = heavy_refs.entry((chunk, run)).or_insert(0);
                *refs += 1;
                if *refs > 1 {
                    continue;
                }
            }
            if run.extent.0 >= extent_count || !extents.assign(run.extent, chunk) {
                return Err(Error::corrupted(format!(
                    "page {} of chunk {} is in {run}, which another chunk owns or which is off the device",
                    page.0, chunk.0
                )));
            }
            if !c.blocks.owns(run.extent) {
                c.blocks.add_extent(run.extent);
            }
            if !c.blocks.mark_used(run) {
                return Err(Error::corrupted(format!(
                    "page {} of chunk {} shares {run} with another page",
                    page.0, chunk.0
                )));
            }
        }
    }
    Ok(State { volumes, next_volume_id, extents, chunks, pending_free: Vec::new(), heavy_refs, failed: None })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use tundra_device::conformance::Rng;
    use tundra_device::fault::FaultyDevice;
    use tundra_device::mem::MemDevice;

    use super::*;
    use crate::journal::JournalGeometry;

    const PAGE: usize = 16384;

    /// Volume 0, big enough for every test: chunk ids 0, 1, 2 ... are its chunks.
    pub(crate) fn test_volume(page_size: usize) -> Volume {
        Volume {
            id: VolumeId(0),
            name: "test".into(),
            size_bytes: 64 << 30,
            page_size: page_size as u32,
            chunk_bytes: 1 << 30,
            mode: VolumeMode::Normal,
        }
    }

    /// Opens a store and makes sure volume 0 exists.
    fn open_store(data: Arc<dyn BlockDevice>, fast: Arc<dyn BlockDevice>) -> Store {
        let store = Store::open(data, fast).unwrap();
        if store.volume(VolumeId(0)).is_none() {
            store.create_volume(test_volume(PAGE)).unwrap();
        }
        store
    }
    const JOURNAL: JournalGeometry = JournalGeometry { checkpoint_blocks: 64, log_blocks: 64 };

    fn raw_image(chunk: ChunkId, page: PageNo, tag: u64) -> PageImage {
        let mut bytes = vec![0u8; PAGE];
        Rng::new(tag).fill(&mut bytes[..64]);
        bytes[..8].copy_from_slice(&tag.to_le_bytes());
        let checksum = page_checksum(chunk, page, &bytes);
        PageImage { encoding: Encoding::Raw, bytes, checksum }
    }

    fn tag_of(store: &Store, chunk: ChunkId, page: PageNo) -> Option<u64> {
        let (entry, bytes) = store.read_image(chunk, page).unwrap()?;
        assert_eq!(entry.encoding, Encoding::Raw);
        assert_eq!(page_checksum(chunk, page, &bytes), entry.checksum, "page {page:?} fails its checksum");
        Some(u64::from_le_bytes(bytes[..8].try_into().unwrap()))
    }

    fn new_store(data_blocks: u64) -> (Arc<MemDevice>, Arc<MemDevice>, Store) {
        let data = Arc::new(MemDevice::new(data_blocks));
        let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
        Journal::format(fast.as_ref(), JOURNAL).unwrap();
        let store = open_store(data.clone(), fast.clone());
        (data, fast, store)
    }

    #[test]
    fn pages_round_trip_overwrite_trim_and_reopen() {
        let (data, fast, store) = new_store(4096);
        let chunk = ChunkId(3);
        for round in 0..5u64 {
            for page in 0..40u32 {
                store
                    .apply_write(
                        chunk,
                        PageNo(page),
                        &raw_image(chunk, PageNo(page), round * 100 + u64::from(page)),
                        round,
                    )
                    .unwrap();
                store.maybe_checkpoint().unwrap();
            }
        }
        store.trim_page(chunk, PageNo(7)).unwrap();
        assert_eq!(tag_of(&store, chunk, PageNo(7)), None);
        assert_eq!(tag_of(&store, chunk, PageNo(8)), Some(408));
        assert_eq!(store.stats().pages, 39);
        store.release_freed().unwrap();
        // 39 live pages of 4 blocks need 5 extents; overwritten runs came back.
        assert!(store.stats().extents_in_use <= 6, "{:?}", store.stats());
        drop(store);
        let store = open_store(data, fast);
        assert_eq!(tag_of(&store, chunk, PageNo(8)), Some(408));
        assert_eq!(tag_of(&store, chunk, PageNo(7)), None);
        assert_eq!(store.stats().pages, 39);
    }

    #[test]
    fn blocks_written_but_never_journalled_are_trimmed_at_open() {
        let (data, fast, store) = new_store(256);
        let chunk = ChunkId(1);
        store.apply_write(chunk, PageNo(0), &raw_image(chunk, PageNo(0), 1), 1).unwrap();
        drop(store);
        let referenced = data.usage().mapped_bytes;
        // As if a crash struck between a page's data write and its journal record.
        data.write(Lba(200), &vec![7u8; 4 * BLOCK_SIZE]).unwrap();
        assert_eq!(data.usage().mapped_bytes, referenced + 4 * BLOCK_SIZE as u64);
        let store = open_store(data.clone(), fast);
        assert_eq!(data.usage().mapped_bytes, referenced, "only page 0's blocks stay");
        assert_eq!(tag_of(&store, chunk, PageNo(0)), Some(1));
    }

    #[test]
    fn bad_images_are_refused_and_change_nothing() {
        let (_, _, store) = new_store(512);
        let chunk = ChunkId(1);
        let mut short = raw_image(chunk, PageNo(0), 1);
        short.bytes.truncate(100);
        assert_eq!(store.apply_write(chunk, PageNo(0), &short, 1).unwrap_err().kind(), ErrorKind::Invalid);
        let too_long = PageImage { encoding: Encoding::Lz4, bytes: vec![1; PAGE + 1], checksum: 0 };
        assert_eq!(store.apply_write(chunk, PageNo(0), &too_long, 1).unwrap_err().kind(), ErrorKind::Invalid);
        assert_eq!(store.stats().pages, 0);
        assert!(Store::open(Arc::new(MemDevice::new(64)), Arc::new(MemDevice::new(64))).is_err(), "no journal");
        let bad = Volume { page_size: 4096, ..test_volume(PAGE) };
        assert_eq!(store.create_volume(bad).unwrap_err().kind(), ErrorKind::Invalid);
        assert_eq!(store.create_volume(test_volume(PAGE)).unwrap_err().kind(), ErrorKind::Invalid, "exists");
        let outside = ChunkId::new(VolumeId(7), 0);
        let image = raw_image(outside, PageNo(0), 1);
        assert_eq!(store.apply_write(outside, PageNo(0), &image, 1).unwrap_err().kind(), ErrorKind::Invalid);
    }

    #[test]
    fn a_full_data_device_is_a_clear_error() {
        let (_, _, store) = new_store(64);
        let chunk = ChunkId(1);
        let mut written = 0;
        let error = loop {
            match store.apply_write(chunk, PageNo(written), &raw_image(chunk, PageNo(written), 1), 1) {
                Ok(()) => written += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(error.kind(), ErrorKind::Full);
        assert_eq!(written, 16, "64 blocks hold 16 pages of 16 KiB");
    }

    /// Power fails at a random write of either device; every acknowledged page write survives
    /// recovery and every page verifies.
    #[test]
    fn crash_points_lose_no_acknowledged_write() {
        let mut rng = Rng::new(7);
        let mut struck = 0;
        for round in 0..150u64 {
            // Both trim policies; under Deferred freed runs are reused untrimmed.
            let policy = if round % 2 == 0 { TrimPolicy::EveryRun } else { TrimPolicy::Deferred };
            let data = Arc::new(FaultyDevice::new(MemDevice::new(1024), round));
            let fast = Arc::new(FaultyDevice::new(MemDevice::new(JOURNAL.total_blocks()), round + 1000));
            Journal::format(fast.as_ref(), JOURNAL).unwrap();
            let chunk = ChunkId(round % 3);
            let mut acknowledged: BTreeMap<u32, u64> = BTreeMap::new();
            let mut attempted: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
            for crash in 0..3u64 {
                let store = open_store(data.clone(), fast.clone()).with_trim_policy(policy);
                for page in 0..12u32 {
                    let got = tag_of(&store, chunk, PageNo(page));
                    // A page holds its acknowledged version or one attempted since (a trim
                    // attempted since is recorded as the tag 0).
                    let possible = |t: u64| attempted.get(&page).is_some_and(|v| v.contains(&t));
                    let allowed = got == acknowledged.get(&page).copied() || possible(got.unwrap_or(0));
                    assert!(allowed, "round {round} crash {crash}: page {page} holds {got:?}");
                    match got {
                        Some(tag) => acknowledged.insert(page, tag),
                        None => acknowledged.remove(&page),
                    };
                }
                attempted.clear();
                if rng.chance(50) {
                    data.crash_after(rng.below(30))
                } else {
                    fast.crash_after(rng.below(30))
                }
                for step in 0..30u64 {
                    let page = rng.below(12) as u32;
                    let tag = round * 10_000 + crash * 100 + step;
                    let result = if rng.chance(15) {
                        attempted.entry(page).or_default().push(0);
                        store.trim_page(chunk, PageNo(page)).map(|()| vec![(page, None)])
                    } else if rng.chance(30) {
                        // A group of distinct pages with one commit, written in few I/Os.
                        let mut group: Vec<u32> = (0..1 + rng.below(4)).map(|i| (page + i as u32 * 5) % 12).collect();
                        group.dedup();
                        let images: Vec<(PageNo, PageImage, u64)> = group
                            .iter()
                            .enumerate()
                            .map(|(i, &p)| {
                                let tag = tag + i as u64 * 1_000_000;
                                attempted.entry(p).or_default().push(tag);
                                (PageNo(p), raw_image(chunk, PageNo(p), tag), tag)
                            })
                            .collect();
                        store
                            .apply_writes(chunk, &images)
                            .map(|()| images.iter().map(|(p, _, tag)| (p.0, Some(*tag))).collect())
                    } else {
                        attempted.entry(page).or_default().push(tag);
                        store
                            .apply_write(chunk, PageNo(page), &raw_image(chunk, PageNo(page), tag), tag)
                            .map(|()| vec![(page, Some(tag))])
                    };
                    let result = result.and_then(|r| store.maybe_checkpoint().map(|()| r));
                    let result =
                        if rng.chance(20) { result.and_then(|r| store.release_freed().map(|()| r)) } else { result };
                    match result {
                        Ok(done) => {
                            for (page, tag) in done {
                                match tag {
                                    Some(tag) => acknowledged.insert(page, tag),
                                    None => acknowledged.remove(&page),
                                };
                            }
                        }
                        Err(_) => {
                            struck += 1;
                            break;
                        }
                    }
                }
                drop(store);
                data.crash();
                fast.crash();
                data.recover().unwrap();
                fast.recover().unwrap();
            }
        }
        assert!(struck > 150, "power should often fail inside an operation: {struck}");
    }

    #[test]
    fn grouped_pages_take_consecutive_blocks_and_deferred_trims_wait() {
        let (data, _fast, store) = new_store(4096);
        let store = store.with_trim_policy(TrimPolicy::Deferred);
        let chunk = ChunkId(0);
        // Every block of every image holds data (the memory device does not map zero blocks).
        let image = |page: PageNo, tag: u64| {
            let mut image = raw_image(chunk, page, tag);
            Rng::new(tag).fill(&mut image.bytes[64..]);
            image.checksum = page_checksum(chunk, page, &image.bytes);
            image
        };
        let images = |pages: std::ops::Range<u32>, tag: u64| -> Vec<(PageNo, PageImage, u64)> {
            pages.map(|p| (PageNo(p), image(PageNo(p), tag + u64::from(p)), tag)).collect()
        };
        store.apply_writes(chunk, &images(0..8, 100)).unwrap();
        let lbas: Vec<u64> = (0..8).map(|p| store.entry(chunk, PageNo(p)).unwrap().run.first_lba().0).collect();
        for pair in lbas.windows(2) {
            assert_eq!(pair[1], pair[0] + 4, "16 KiB raw pages written together lie back to back: {lbas:?}");
        }
        let page_bytes = PAGE as u64;
        assert_eq!(data.usage().mapped_bytes, 8 * page_bytes);
        // The runs a rewrite lets go of stay mapped...
        store.apply_writes(chunk, &images(0..4, 200)).unwrap();
        store.release_freed().unwrap();
        assert_eq!(data.usage().mapped_bytes, 12 * page_bytes);
        // ...and the next rewrite reuses them (first fit). The second extent, empty again, goes
        // back to the device allocator untrimmed.
        store.apply_writes(chunk, &images(0..4, 300)).unwrap();
        assert_eq!(store.entry(chunk, PageNo(0)).unwrap().run.first_lba().0, lbas[0]);
        store.release_freed().unwrap();
        assert_eq!(store.stats().extents_in_use, 1);
        assert_eq!(data.usage().mapped_bytes, 12 * page_bytes);
        for p in 0..8 {
            assert_eq!(tag_of(&store, chunk, PageNo(p)), Some(if p < 4 { 300 } else { 100 } + u64::from(p)));
        }
        // Trimmed pages free their blocks without trimming them; a check's trim of unused
        // blocks, or deleting the volume, does.
        store.trim_page(chunk, PageNo(7)).unwrap();
        store.release_freed().unwrap();
        assert_eq!(data.usage().mapped_bytes, 12 * page_bytes);
        store.trim_unused().unwrap();
        assert_eq!(data.usage().mapped_bytes, 7 * page_bytes);
        store.delete_volume(VolumeId(0)).unwrap();
        assert_eq!(data.usage().mapped_bytes, 0);
        assert_eq!(store.stats().extents_in_use, 0);
    }

    #[test]
    fn volumes_are_created_resized_deleted_and_survive_reopen() {
        let (data, fast, store) = new_store(4096);
        let wal = Volume {
            id: VolumeId(2),
            name: "wal".into(),
            size_bytes: 1 << 20,
            page_size: 16384,
            chunk_bytes: 1 << 20,
            mode: VolumeMode::None,
        };
        store.create_volume(wal.clone()).unwrap();
        let wal_chunk = ChunkId::new(VolumeId(2), 0);
        store.apply_write(wal_chunk, PageNo(5), &raw_image(wal_chunk, PageNo(5), 55), 1).unwrap();
        let compressed = PageImage { encoding: Encoding::Lz4, bytes: vec![1; 100], checksum: 0 };
        assert_eq!(store.apply_write(wal_chunk, PageNo(6), &compressed, 1).unwrap_err().kind(), ErrorKind::Invalid);
        assert_eq!(
            store.apply_write(wal_chunk, PageNo(64), &raw_image(wal_chunk, PageNo(64), 1), 1).unwrap_err().kind(),
            ErrorKind::Invalid,
            "past the end"
        );
        store.resize_volume(VolumeId(2), 2 << 20).unwrap();
        let second = ChunkId::new(VolumeId(2), 1);
        store.apply_write(second, PageNo(0), &raw_image(second, PageNo(0), 66), 1).unwrap();
        assert_eq!(store.resize_volume(VolumeId(2), 1 << 20).unwrap_err().kind(), ErrorKind::Invalid);
        let data_chunk = ChunkId(0);
        store.apply_write(data_chunk, PageNo(1), &raw_image(data_chunk, PageNo(1), 11), 1).unwrap();
        drop(store);
        let store = open_store(data.clone(), fast.clone());
        assert_eq!(store.volume(VolumeId(2)).unwrap().size_bytes, 2 << 20);
        assert_eq!(tag_of(&store, second, PageNo(0)), Some(66));
        assert_eq!(tag_of(&store, wal_chunk, PageNo(5)), Some(55));
        let extents_before = store.stats().extents_in_use;
        store.delete_volume(VolumeId(2)).unwrap();
        assert!(store.stats().extents_in_use < extents_before, "the volume's extents came back");
        assert_eq!(store.stats().pages, 1);
        assert!(store.read_image(wal_chunk, PageNo(5)).unwrap().is_none());
        drop(store);
        let store = open_store(data, fast);
        assert!(store.volume(VolumeId(2)).is_none());
        assert_eq!(tag_of(&store, data_chunk, PageNo(1)), Some(11));
        assert_eq!(store.volumes().len(), 1);
    }

    #[test]
    fn volume_ids_are_never_reused_across_deletes_checkpoints_and_reopens() {
        let (data, fast, store) = new_store(4096);
        let volume = |id: u32, name: &str| Volume { id: VolumeId(id), name: name.into(), ..test_volume(PAGE) };
        assert_eq!(store.next_volume_id(), VolumeId(1), "test volume 0 exists");
        store.create_volume(volume(5, "victim")).unwrap();
        store.delete_volume(VolumeId(5)).unwrap();
        assert_eq!(store.next_volume_id(), VolumeId(6));
        let reused = store.create_volume(volume(5, "secret")).unwrap_err();
        assert!(reused.message().contains("never reused"), "{reused}");
        // The checkpoint no longer names volume 5: only the floor remembers it.
        store.checkpoint().unwrap();
        drop(store);
        let store = open_store(data.clone(), fast.clone());
        assert_eq!(store.next_volume_id(), VolumeId(6), "the floor survives a checkpoint and reopen");
        assert!(store.create_volume(volume(5, "secret")).is_err());
        store.create_volume(volume(6, "secret")).unwrap();
        // The log alone (no checkpoint since) raises the floor too.
        store.create_volume(volume(9, "third")).unwrap();
        store.delete_volume(VolumeId(9)).unwrap();
        drop(store);
        let store = open_store(data, fast);
        assert_eq!(store.next_volume_id(), VolumeId(10));
    }

    #[test]
    fn a_journal_without_a_floor_falls_back_to_one_past_its_highest_id() {
        let fast = Arc::new(MemDevice::new(JOURNAL.total_blocks()));
        Journal::format(fast.as_ref(), JOURNAL).unwrap();
        {
            let (journal, _) = Journal::open(fast.clone()).unwrap();
            let old = Volume { id: VolumeId(7), name: "old".into(), ..test_volume(PAGE) };
            journal.commit(&[Record::VolumeSet(old)]).unwrap();
        }
        let store = Store::open(Arc::new(MemDevice::new(4096)), fast).unwrap();
        assert_eq!(store.next_volume_id(), VolumeId(8));
    }
}
