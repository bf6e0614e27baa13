//! Recovery of the store's state: the index from a journal replay, the allocator from the
//! index. An entry that contradicts its own volume or block run (a stored length its run could
//! not hold, a compressed page in a volume never compressed) is kept aside as damaged: its page
//! reads as a corruption error, never as zeros or wrong bytes, until it is rewritten or trimmed,
//! and the rest of the store serves as usual.

use std::collections::{BTreeMap, HashMap};

use tundra_device::BLOCK_SIZE;

use super::state::Chunk;
use super::{StoreCore, Watermarks};
use crate::alloc::ExtentAllocator;
use crate::ids::{BlockRun, ChunkId, PageNo, VolumeId};
use crate::index::{Encoding, PageEntry};
use crate::journal::{Record, Replay};
use crate::volume::{Volume, VolumeMode};
use crate::{Error, Result};

/// A page whose journal record cannot be served: the record, kept so that checkpoints keep it,
/// and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct DamagedEntry {
    pub entry: PageEntry,
    pub why: String,
}

/// Why `entry` cannot be a page of `volume`, if it cannot. Writers allocate exactly the blocks
/// an image needs, so a stored length and its run agree.
pub(super) fn entry_problem(volume: &Volume, entry: &PageEntry) -> Option<String> {
    let len = usize::from(entry.stored_len);
    let blocks = usize::from(entry.run.count);
    let page_size = volume.page_size as usize;
    let fits = len > 0 && len <= page_size && len.div_ceil(BLOCK_SIZE) == blocks;
    let problem = match entry.encoding {
        Encoding::Heavy if volume.mode == VolumeMode::None => "a heavy page in a volume of mode none",
        Encoding::Heavy => return None,
        Encoding::Raw if len != page_size || !fits => {
            "a raw page whose stored length is not the page size its run holds"
        }
        Encoding::Lz4 | Encoding::Zstd if volume.mode == VolumeMode::None => {
            "a compressed page in a volume of mode none"
        }
        Encoding::Lz4 | Encoding::Zstd if !fits => "a stored length its block run cannot hold",
        _ => return None,
    };
    Some(format!(
        "its journal record is damaged: {problem} ({:?}, {len} bytes in {blocks} block(s), {page_size}-byte pages)",
        entry.encoding
    ))
}

/// A page image the log carried ([`Record::PageData`]) for an entry that is still its page's
/// at the end of the replay: the data device may have lost it in a crash, so the store writes
/// it again before it serves.
pub(super) struct Rewrite {
    pub run: BlockRun,
    pub image: Vec<u8>,
}

/// Rebuilds the index from a journal replay, and the allocator from the index: every run of a
/// mapped page is in use, every extent holding one belongs to that page's chunk. Two pages
/// sharing a block, or two chunks sharing an extent, is corruption. Also returns the images
/// the log carried for entries that are still their pages' (see [`Rewrite`]).
pub(super) fn rebuild(replay: Replay, extent_count: u32) -> Result<(StoreCore, Vec<Rewrite>)> {
    let mut chunks: BTreeMap<ChunkId, Chunk> = BTreeMap::new();
    let mut volumes: BTreeMap<VolumeId, Volume> = BTreeMap::new();
    let mut damaged: BTreeMap<(ChunkId, PageNo), DamagedEntry> = BTreeMap::new();
    let mut next_volume_id = VolumeId(0);
    let mut watermarks: BTreeMap<VolumeId, Watermarks> = BTreeMap::new();
    let mut chunk_marks: BTreeMap<ChunkId, Vec<u8>> = BTreeMap::new();
    // Image pieces waiting for their page's PageSet, which follows them in the same commit; and
    // the images of entries installed with them (kept only if the entry is still the page's at
    // the end, below).
    let mut pieces: HashMap<(ChunkId, PageNo), Vec<u8>> = HashMap::new();
    let mut carried: HashMap<(ChunkId, PageNo), (PageEntry, Vec<u8>)> = HashMap::new();
    for record in replay.checkpoint.into_iter().chain(replay.log) {
        match record {
            Record::PageData { chunk, page, offset, bytes } => {
                let image = pieces.entry((chunk, page)).or_default();
                // Pieces come in order; one out of order leaves the image incomplete, and it is
                // then not written again (the entry reads as its blocks hold it).
                if image.len() == usize::from(offset) {
                    image.extend_from_slice(&bytes);
                } else {
                    image.clear();
                }
            }
            Record::VolumeSet(volume) => {
                next_volume_id = next_volume_id.max(volume.id.next());
                volumes.insert(volume.id, volume);
            }
            Record::VolumeIdFloor(floor) => next_volume_id = next_volume_id.max(floor),
            Record::Watermarks { volume, marks } => {
                let kept = watermarks.entry(volume).or_default();
                kept.durable_lsn = kept.durable_lsn.max(marks.durable_lsn);
                kept.min_reader_lsn = kept.min_reader_lsn.max(marks.min_reader_lsn);
            }
            Record::VolumeDelete(id) => {
                next_volume_id = next_volume_id.max(id.next());
                volumes.remove(&id);
                watermarks.remove(&id);
                chunks.retain(|chunk, _| chunk.volume() != id);
                chunk_marks.retain(|chunk, _| chunk.volume() != id);
                damaged.retain(|(chunk, _), _| chunk.volume() != id);
            }
            Record::PageSet { chunk, page, entry } => {
                let Some(volume) = volumes.get(&chunk.volume()).filter(|v| v.contains(chunk, page)) else {
                    return Err(Error::corrupted(format!(
                        "the journal stores page {} of chunk {} outside every volume",
                        page.0,
                        chunk.index()
                    )));
                };
                let problem = entry_problem(volume, &entry);
                if let Some(image) = pieces.remove(&(chunk, page))
                    && problem.is_none()
                    && image.len() == usize::from(entry.stored_len)
                {
                    carried.insert((chunk, page), (entry, image));
                }
                let index = &mut chunks.entry(chunk).or_default().index;
                match problem {
                    Some(why) => {
                        index.set(page, None);
                        damaged.insert((chunk, page), DamagedEntry { entry, why });
                    }
                    None => {
                        index.set(page, Some(entry));
                        damaged.remove(&(chunk, page));
                    }
                }
            }
            Record::PageClear { chunk, page } => {
                chunks.entry(chunk).or_default().index.set(page, None);
                damaged.remove(&(chunk, page));
            }
            Record::ChunkMark { chunk, mark } => {
                chunk_marks.insert(chunk, mark);
            }
            // Replay keeps only whole units, without their markers.
            Record::Unit { .. } => {}
        }
    }
    // Only images of entries still mapped at the end: a page rewritten or trimmed since, or a
    // volume deleted, has nothing to write again (its blocks may belong to another page now).
    let mut rewrites: Vec<Rewrite> = carried
        .into_iter()
        .filter(|((chunk, page), (entry, _))| {
            chunks.get(chunk).and_then(|c| c.index.get(*page)) == Some(*entry) && !replay_skips_carried_images()
        })
        .map(|(_, (entry, image))| Rewrite { run: entry.run, image })
        .collect();
    rewrites.sort_unstable_by_key(|r| r.run.first_lba().0);
    let (extents, heavy_refs) = rebuild_allocator(&mut chunks, extent_count)?;
    let mut core = StoreCore::new(extent_count);
    (core.volumes, core.next_volume_id, core.extents, core.chunks) = (volumes, next_volume_id, extents, chunks);
    (core.heavy_refs, core.damaged, core.watermarks) = (heavy_refs, damaged, watermarks);
    core.chunk_marks = chunk_marks;
    Ok((core, rewrites))
}

/// The twin of the carried images' oracle (tests only): replay then writes no image again, so
/// a page whose image the data device lost in a crash reads as a corruption error, and the
/// store's crash test must fail.
fn replay_skips_carried_images() -> bool {
    #[cfg(test)]
    return SKIP_CARRIED.with(|flag| flag.get());
    #[cfg(not(test))]
    false
}

#[cfg(test)]
thread_local! {
    static SKIP_CARRIED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes this thread's replays skip the images the log carried (the twin above).
#[cfg(test)]
pub(crate) fn set_replay_skips_carried_images(on: bool) {
    SKIP_CARRIED.with(|flag| flag.set(on));
}

type HeavyRefs = HashMap<(ChunkId, BlockRun), u32>;

/// Marks every mapped page's run in use, granting each extent to the chunk that holds it.
fn rebuild_allocator(chunks: &mut BTreeMap<ChunkId, Chunk>, extent_count: u32) -> Result<(ExtentAllocator, HeavyRefs)> {
    let mut extents = ExtentAllocator::new(extent_count);
    let mut heavy_refs: HeavyRefs = HashMap::new();
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
    Ok((extents, heavy_refs))
}
