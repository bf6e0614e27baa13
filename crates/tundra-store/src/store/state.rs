//! The store's I/O-free core: the volumes, every chunk's index and block bitmaps, the device's
//! extent allocator, the runs waiting to be freed and the heavy segments' page counts, as a
//! state machine. Each method is an event; what it returns is the action the runtime
//! ([`super::Store`]) carries out on the devices:
//!
//! | event                         | action returned                                        |
//! |-------------------------------|--------------------------------------------------------|
//! | `allocate(chunk, counts)`     | the runs to write the images to                        |
//! | `unallocate(chunk, runs)`     | none (runs never journalled, already trimmed)          |
//! | `install(chunk, entries)`     | whether enough runs wait to be released                |
//! | `delete_volume(id)`           | none: the volume's runs join those waiting             |
//! | `take_pending()`              | the runs to trim before they are reused                |
//! | `release(runs)`               | none: the runs are allocatable, empty extents returned |
//! | `unused_ranges()`             | the block ranges no page references, to trim           |
//! | `checkpoint_records()`        | the records of a checkpoint                            |
//!
//! Nothing here reads a device, the clock or a random source, so the same events give the
//! same state and the same block placement on every run; [`StoreCore::invariant_problem`]
//! (store/invariants.rs) checks the allocator against its derivation from the index after
//! any sequence of events. The decisions made here are local to one replica: two replicas
//! applying the same commands place blocks each in its own way.

use std::collections::{BTreeMap, HashMap};

use tundra_device::{BLOCK_SIZE, Lba};

use super::rebuild::DamagedEntry;
use super::{StoreStats, VolumeUsage};
use crate::alloc::{ChunkBlocks, ExtentAllocator};
use crate::ids::{BlockRun, ChunkId, EXTENT_BLOCKS, Lsn, PageNo, VolumeId};
use crate::index::{ChunkIndex, Encoding, PageEntry};
use crate::journal::Record;
use crate::volume::Volume;
use crate::{Error, ErrorKind, Result};

/// Freed runs are released in batches, so that the reuse gate is taken rarely.
pub(super) const RELEASE_BATCH: usize = 64;

#[derive(Default)]
pub(super) struct Chunk {
    pub index: ChunkIndex,
    pub blocks: ChunkBlocks,
}

/// The redo watermarks of a volume (seed 000 §2.1): the highest LSN made durable and the lowest
/// LSN a reader may still ask for. The store keeps and journals them; redo uses them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Watermarks {
    pub durable_lsn: Lsn,
    pub min_reader_lsn: Lsn,
}

/// The store's state, changed only by events (see the module's table).
pub struct StoreCore {
    pub(super) volumes: BTreeMap<VolumeId, Volume>,
    /// Every id below this one was given to a volume once; a new volume takes this one or
    /// higher, never a deleted volume's.
    pub(super) next_volume_id: VolumeId,
    pub(super) extents: ExtentAllocator,
    /// Ordered, so that everything iterated (checkpoints, release, statistics) goes in one
    /// order on every run and replica.
    pub(super) chunks: BTreeMap<ChunkId, Chunk>,
    /// Runs replaced or trimmed whose journal records are durable, waiting for readers to
    /// finish before they are reused.
    pub(super) pending_free: Vec<(ChunkId, BlockRun)>,
    /// Pages that share each heavy segment's run; the run is freed when the last one leaves.
    pub(super) heavy_refs: HashMap<(ChunkId, BlockRun), u32>,
    /// Pages whose journal record cannot be served (see `rebuild`): they read as corruption
    /// errors until rewritten or trimmed, and every checkpoint keeps their records.
    pub(super) damaged: BTreeMap<(ChunkId, PageNo), DamagedEntry>,
    pub(super) watermarks: BTreeMap<VolumeId, Watermarks>,
    /// Each chunk's replication mark ([`Record::ChunkMark`]), the latest journalled.
    pub(super) chunk_marks: BTreeMap<ChunkId, Vec<u8>>,
    /// Set by the runtime when a device or journal error left memory ahead of the media.
    pub(super) failed: Option<String>,
}

impl StoreCore {
    /// An empty store over a data device of `extent_count` extents.
    pub fn new(extent_count: u32) -> StoreCore {
        StoreCore {
            volumes: BTreeMap::new(),
            next_volume_id: VolumeId(0),
            extents: ExtentAllocator::new(extent_count),
            chunks: BTreeMap::new(),
            pending_free: Vec::new(),
            heavy_refs: HashMap::new(),
            damaged: BTreeMap::new(),
            watermarks: BTreeMap::new(),
            chunk_marks: BTreeMap::new(),
            failed: None,
        }
    }

    /// Refuses a new volume whose id was given out before or whose name is taken.
    pub fn check_new_volume(&self, volume: &Volume) -> Result<()> {
        if volume.id.0 == u32::MAX {
            return Err(Error::invalid("this store has given out every volume id"));
        }
        if volume.id < self.next_volume_id {
            return Err(Error::invalid(format!(
                "volume id {} was given out before; ids are never reused (the next free one is {})",
                volume.id.0, self.next_volume_id.0
            )));
        }
        if self.volumes.values().any(|v| v.name == volume.name) {
            return Err(Error::invalid(format!("a volume named {:?} exists", volume.name)));
        }
        Ok(())
    }

    /// A volume was created or changed (its record is durable).
    pub fn set_volume(&mut self, volume: Volume) {
        self.next_volume_id = self.next_volume_id.max(volume.id.next());
        self.volumes.insert(volume.id, volume);
    }

    /// A volume was deleted (its record is durable): its pages are gone and their runs wait to
    /// be released.
    pub fn delete_volume(&mut self, id: VolumeId) {
        self.volumes.remove(&id);
        self.watermarks.remove(&id);
        self.chunk_marks.retain(|chunk, _| chunk.volume() != id);
        self.damaged.retain(|(chunk, _), _| chunk.volume() != id);
        let chunks: Vec<ChunkId> = self.chunks.keys().copied().filter(|c| c.volume() == id).collect();
        for chunk in chunks {
            let pages: Vec<PageNo> = self.chunks[&chunk].index.iter().map(|(p, _)| p).collect();
            for page in pages {
                self.install_one(chunk, page, None);
            }
        }
    }

    /// A volume's redo watermarks advanced (its record is durable). They only move forward.
    pub fn set_watermarks(&mut self, volume: VolumeId, marks: Watermarks) {
        let kept = self.watermarks.entry(volume).or_default();
        kept.durable_lsn = kept.durable_lsn.max(marks.durable_lsn);
        kept.min_reader_lsn = kept.min_reader_lsn.max(marks.min_reader_lsn);
    }

    pub fn watermarks(&self, volume: VolumeId) -> Option<Watermarks> {
        self.watermarks.get(&volume).copied()
    }

    pub fn volume(&self, id: VolumeId) -> Option<&Volume> {
        self.volumes.get(&id)
    }

    /// The volume a page belongs to, if the page lies inside one.
    pub fn volume_of(&self, chunk: ChunkId, page: PageNo) -> Result<&Volume> {
        match self.volumes.get(&chunk.volume()) {
            Some(volume) if volume.contains(chunk, page) => Ok(volume),
            Some(volume) => Err(Error::invalid(format!(
                "page {} of chunk {} is outside volume {:?}",
                page.0,
                chunk.index(),
                volume.name
            ))),
            None => Err(Error::invalid(format!("no volume {}", chunk.volume().0))),
        }
    }

    /// Takes a run of `counts[i]` contiguous blocks for each page of a group, each directly
    /// after the previous one where those blocks are free (so that the group goes to the device
    /// in few I/Os), otherwise the chunk's first fit, granting the chunk a new extent if
    /// needed. All or nothing. The action: write the images to the runs returned.
    pub fn allocate(&mut self, chunk: ChunkId, counts: &[u8]) -> Result<Vec<BlockRun>> {
        if let Some(reason) = &self.failed {
            return Err(Error::closed(format!("the store stopped after an error ({reason})")));
        }
        let blocks = &mut self.chunks.entry(chunk).or_default().blocks;
        let mut runs: Vec<BlockRun> = Vec::with_capacity(counts.len());
        for &count in counts {
            let mut run = runs.last().and_then(|&previous| blocks.allocate_after(previous, count));
            if run.is_none() {
                run = blocks.allocate(count);
            }
            if run.is_none()
                && let Some(extent) = self.extents.grant(chunk)
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

    /// Runs allocated but never journalled are given back at once: nothing points at them.
    pub fn unallocate(&mut self, chunk: ChunkId, runs: &[BlockRun]) {
        let blocks = &mut self.chunks.get_mut(&chunk).expect("runs were allocated to this chunk").blocks;
        for &run in runs {
            blocks.free(run);
        }
    }

    /// Entries (or removals) of pages of `chunk` whose journal records are durable: they are
    /// installed, and the runs they replace wait to be released. Returns true when enough runs
    /// wait that the runtime should release them now.
    pub fn install(&mut self, chunk: ChunkId, entries: &[(PageNo, Option<PageEntry>)]) -> bool {
        for &(page, entry) in entries {
            self.install_one(chunk, page, entry);
        }
        self.pending_free.len() >= RELEASE_BATCH
    }

    /// Installs an entry (or removes the page) and lets go of the entry it replaces.
    fn install_one(&mut self, chunk: ChunkId, page: PageNo, entry: Option<PageEntry>) {
        self.damaged.remove(&(chunk, page));
        if let Some(new) = entry.filter(|e| e.encoding == Encoding::Heavy) {
            *self.heavy_refs.entry((chunk, new.run)).or_insert(0) += 1;
        }
        if let Some(old) = self.chunks.entry(chunk).or_default().index.set(page, entry) {
            self.release_entry(chunk, old);
        }
    }

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

    /// The runs waiting to be released, taken out of the waiting list. The action: trim them
    /// (where the trim policy says so) while no reader can hold them, then `release` them;
    /// runs that could not be trimmed go back with `keep_pending`.
    pub fn take_pending(&mut self) -> Vec<(ChunkId, BlockRun)> {
        std::mem::take(&mut self.pending_free)
    }

    /// Runs taken by `take_pending` that must wait for another release.
    pub fn keep_pending(&mut self, runs: &[(ChunkId, BlockRun)]) {
        self.pending_free.extend_from_slice(runs);
    }

    /// Runs no reader can hold any more become allocatable, and extents left empty go back to
    /// the device allocator.
    pub fn release(&mut self, runs: &[(ChunkId, BlockRun)]) {
        for &(chunk, run) in runs {
            self.chunks.get_mut(&chunk).expect("a chunk with freed blocks").blocks.free(run);
        }
        for (&chunk, c) in self.chunks.iter_mut() {
            for extent in c.blocks.empty_extents() {
                c.blocks.remove_extent(extent);
                self.extents.release(extent, chunk);
            }
        }
    }

    /// The ranges of blocks (first LBA, count) no page, freed run or write in progress holds,
    /// in device order. The action: trim them.
    pub fn unused_ranges(&self) -> Vec<(Lba, u64)> {
        let mut used = vec![0u32; self.extents.extent_count() as usize];
        for c in self.chunks.values() {
            for (extent, bits) in c.blocks.extents() {
                used[extent.0 as usize] = bits;
            }
        }
        let mut ranges = Vec::new();
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
                    ranges.push((Lba(first), block - first));
                    start = None;
                }
                _ => {}
            }
        }
        ranges
    }

    /// A page's entry: `Err` when its journal record is damaged, `None` when it does not exist.
    pub fn readable_entry(&self, chunk: ChunkId, page: PageNo) -> Result<Option<PageEntry>> {
        if let Some(damaged) = self.damaged.get(&(chunk, page)) {
            return Err(Error::corrupted(format!(
                "page {} of chunk {}: {}; rewrite or trim the page",
                page.0, chunk.0, damaged.why
            )));
        }
        Ok(self.entry(chunk, page))
    }

    pub fn entry(&self, chunk: ChunkId, page: PageNo) -> Option<PageEntry> {
        self.chunks.get(&chunk).and_then(|c| c.index.get(page))
    }

    /// True when the page exists or its record is damaged: a trim has something to remove.
    pub fn is_mapped(&self, chunk: ChunkId, page: PageNo) -> bool {
        self.entry(chunk, page).is_some() || self.damaged.contains_key(&(chunk, page))
    }

    /// The records of a checkpoint of the whole state, in a fixed order.
    pub fn checkpoint_records(&self) -> Vec<Record> {
        let floor = std::iter::once(Record::VolumeIdFloor(self.next_volume_id));
        let volumes = floor.chain(self.volumes.values().map(|v| Record::VolumeSet(v.clone())));
        let marks = self.watermarks.iter().map(|(&volume, &marks)| Record::Watermarks { volume, marks });
        let chunk_marks = self.chunk_marks.iter().map(|(&chunk, mark)| Record::ChunkMark { chunk, mark: mark.clone() });
        let marks = marks.chain(chunk_marks);
        let pages = self
            .chunks
            .iter()
            .flat_map(|(&chunk, c)| c.index.iter().map(move |(page, entry)| Record::PageSet { chunk, page, entry }));
        // Damaged records are kept as they are, so the next recovery finds them damaged again
        // rather than reading the pages as absent.
        let damaged = self.damaged.iter().map(|(&(chunk, page), d)| Record::PageSet { chunk, page, entry: d.entry });
        volumes.chain(marks).chain(pages).chain(damaged).collect()
    }

    pub fn stats(&self) -> StoreStats {
        let mut stats = StoreStats {
            extents_total: u64::from(self.extents.extent_count()),
            extents_in_use: u64::from(self.extents.extent_count() - self.extents.free_count()),
            ..StoreStats::default()
        };
        for c in self.chunks.values() {
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
            self.heavy_refs.keys().map(|(_, run)| u64::from(run.count) * BLOCK_SIZE as u64).sum::<u64>();
        stats
    }

    /// Space figures of volume `id` (zero for an unknown volume).
    pub fn volume_usage(&self, id: VolumeId) -> VolumeUsage {
        let mut usage = VolumeUsage::default();
        for (&chunk, c) in self.chunks.iter().filter(|(chunk, _)| chunk.volume() == id) {
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
            for (_, run) in self.heavy_refs.keys().filter(|(c, _)| *c == chunk) {
                let bytes = u64::from(run.count) * BLOCK_SIZE as u64;
                usage.stored_bytes += bytes;
                usage.compressed_bytes += bytes;
            }
        }
        usage
    }

    /// Every page's entry, in (chunk, page) order.
    pub fn entries(&self) -> Vec<(ChunkId, PageNo, PageEntry)> {
        self.chunks.iter().flat_map(|(&chunk, c)| c.index.iter().map(move |(p, e)| (chunk, p, e))).collect()
    }

    pub fn damaged_pages(&self) -> Vec<(ChunkId, PageNo, String)> {
        self.damaged.iter().map(|(&(chunk, page), d)| (chunk, page, d.why.clone())).collect()
    }
}
