//! A chunk replaced whole by the images a replica sent (a Raft snapshot, seed 000 §3.2.1: a
//! replica that fell behind, or a new one, receives the chunk's stored images and never
//! compresses them again). The images arrive one at a time, so memory stays bounded by a batch
//! of them, not the chunk: each batch is checked, then written to fresh runs (nothing points at
//! them yet), and only once every image is on the device is the index change journalled, as one
//! [`crate::journal::Record::Unit`] (the old entries cleared, the new set, the chunk's mark), and installed.
//! A crash before that commit leaves the chunk as it was (the runs are free by derivation); a
//! crash inside it leaves a unit the log ends inside of, which replay drops; after it the chunk
//! is as sent. Never a mix.

use std::collections::BTreeSet;

use tundra_device::BLOCK_SIZE;

use super::apply::{CommitAs, new_entry};
use super::{HEAVY_HEADER_BYTES, Store, check_image};
use crate::command::PagePut;
use crate::ids::{BlockRun, ChunkId, EXTENT_BLOCKS, Lsn, PageNo};
use crate::index::{Encoding, PageEntry};
use crate::journal::PAGE_RECORD_BYTES;
use crate::volume::VolumeMode;
use crate::{Error, Result};

/// One stored image of a chunk, as a snapshot carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChunkImage {
    /// A page's own image (raw, LZ4 or zstd), exactly as stored.
    Page(PagePut),
    /// A heavy segment (seed 000 §3.2.3), header and frame exactly as stored, with the pages
    /// that still point into it.
    Heavy { segment: Vec<u8>, pages: Vec<HeavySlot> },
}

/// A page of a heavy segment: its place in the segment (pages of the segment written since
/// leave gaps), its checksum and LSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeavySlot {
    pub page: PageNo,
    pub position: u16,
    pub checksum: u32,
    pub lsn: Lsn,
}

/// Images written to the device per batch before the next are taken.
const BATCH_BYTES: usize = 1 << 20;

/// Journal blocks a unit of `records` page records takes, at most.
fn unit_blocks(records: usize) -> u64 {
    let per_block = (BLOCK_SIZE - 64 - crate::journal::MAX_RECORD_BYTES) / PAGE_RECORD_BYTES;
    (records / per_block + 2) as u64
}

impl Store {
    /// Makes `chunk` hold exactly the images `images` yields, and `mark`, all or nothing (see
    /// the module's comment). Pages not named are removed. An image that does not fit its
    /// volume, a page named twice, or an error from `images` leaves the chunk unchanged, its
    /// runs given back.
    pub fn replace_chunk_images(
        &self,
        chunk: ChunkId,
        images: &mut dyn Iterator<Item = Result<ChunkImage>>,
        mark: &[u8],
    ) -> Result<()> {
        super::apply::check_mark(mark)?;
        let mut written: Vec<BlockRun> = Vec::new();
        let mut entries: Vec<(PageNo, PageEntry)> = Vec::new();
        let result = self.write_images(chunk, images, &mut written, &mut entries);
        if let Err(error) = result {
            self.abandon_runs(chunk, &written)?;
            return Err(error);
        }
        let named: BTreeSet<PageNo> = entries.iter().map(|&(page, _)| page).collect();
        if named.len() != entries.len() {
            self.abandon_runs(chunk, &written)?;
            return Err(Error::invalid("a snapshot names a page twice"));
        }
        let mut all: Vec<(PageNo, Option<PageEntry>)> = self
            .chunk_entries(chunk)
            .into_iter()
            .filter(|(page, _)| !named.contains(page))
            .map(|(page, _)| (page, None))
            .collect();
        all.extend(entries.into_iter().map(|(page, entry)| (page, Some(entry))));
        // Room in the journal's ring for the whole unit: two checkpoints free all but what
        // they need; a unit larger than a third of the ring is refused before it is journalled
        // (a commit the ring cannot hold would stop the store).
        let needed = unit_blocks(all.len() + 2);
        let (used, ring) = self.journal.usage_blocks();
        if used + needed > ring * 2 / 3 {
            self.checkpoint()?;
            self.checkpoint()?;
        }
        if needed > ring / 3 {
            self.abandon_runs(chunk, &written)?;
            return Err(Error::invalid(format!(
                "a snapshot of {} pages needs {needed} journal blocks; the journal's ring has {ring}",
                all.len()
            )));
        }
        let how = if replace_without_unit() { CommitAs::Plain } else { CommitAs::Unit };
        self.commit_and_install_as(chunk, &all, &written, Some((mark, super::Durability::Now)), how)
    }

    /// Checks and writes every image to fresh runs, in batches, recording the runs written and
    /// the entries to install.
    fn write_images(
        &self,
        chunk: ChunkId,
        images: &mut dyn Iterator<Item = Result<ChunkImage>>,
        written: &mut Vec<BlockRun>,
        entries: &mut Vec<(PageNo, PageEntry)>,
    ) -> Result<()> {
        let mut batch: Vec<ChunkImage> = Vec::new();
        let mut batch_bytes = 0;
        loop {
            let next = images.next().transpose()?;
            let done = next.is_none();
            if let Some(image) = next {
                batch_bytes += match &image {
                    ChunkImage::Page(put) => put.image.bytes.len(),
                    ChunkImage::Heavy { segment, .. } => segment.len(),
                };
                batch.push(image);
                if batch_bytes < BATCH_BYTES {
                    continue;
                }
            }
            if batch.is_empty() {
                return Ok(());
            }
            let counts = batch.iter().map(|image| self.check_chunk_image(chunk, image)).collect::<Result<Vec<u8>>>()?;
            let runs = self.allocate_many(chunk, &counts)?;
            written.extend_from_slice(&runs);
            let bytes: Vec<&[u8]> = batch
                .iter()
                .map(|image| match image {
                    ChunkImage::Page(put) => put.image.bytes.as_slice(),
                    ChunkImage::Heavy { segment, .. } => segment.as_slice(),
                })
                .collect();
            self.write_runs(&runs, &bytes)?;
            for (image, &run) in batch.iter().zip(&runs) {
                match image {
                    ChunkImage::Page(put) => entries.push((put.page, new_entry(put, run))),
                    ChunkImage::Heavy { pages, .. } => entries.extend(pages.iter().map(|slot| {
                        let entry = PageEntry {
                            encoding: Encoding::Heavy,
                            run,
                            stored_len: slot.position,
                            checksum: slot.checksum,
                            lsn: slot.lsn,
                        };
                        (slot.page, entry)
                    })),
                }
            }
            if done {
                return Ok(());
            }
            batch.clear();
            batch_bytes = 0;
        }
    }

    /// The blocks an image takes, once it is known to fit its volume: a page's image as a
    /// write's is checked; a heavy segment must be of a compressing volume, hold a header whose
    /// frame fits it, fit one extent, and every page's position must lie among the header's.
    fn check_chunk_image(&self, chunk: ChunkId, image: &ChunkImage) -> Result<u8> {
        match image {
            ChunkImage::Page(put) => check_image(&self.volume_of(chunk, put.page)?, &put.image),
            ChunkImage::Heavy { segment, pages } => {
                let max = EXTENT_BLOCKS as usize * BLOCK_SIZE;
                if pages.is_empty() || segment.len() <= HEAVY_HEADER_BYTES || segment.len() > max {
                    return Err(Error::invalid(format!(
                        "a heavy segment of {} bytes for {} pages (at most {max} bytes)",
                        segment.len(),
                        pages.len()
                    )));
                }
                let frame = u32::from_le_bytes([segment[0], segment[1], segment[2], segment[3]]) as usize;
                let count = u16::from_le_bytes([segment[4], segment[5]]);
                if frame + HEAVY_HEADER_BYTES > segment.len() {
                    return Err(Error::invalid(format!(
                        "a heavy segment of {} bytes whose header names a frame of {frame}",
                        segment.len()
                    )));
                }
                for slot in pages {
                    let volume = self.volume_of(chunk, slot.page)?;
                    if volume.mode != VolumeMode::Normal {
                        return Err(Error::invalid(format!("volume {:?} is never compressed", volume.name)));
                    }
                    if slot.position >= count {
                        return Err(Error::invalid(format!(
                            "page {} at position {} of a heavy segment of {count} pages",
                            slot.page.0, slot.position
                        )));
                    }
                }
                Ok(segment.len().div_ceil(BLOCK_SIZE) as u8)
            }
        }
    }

    /// What a snapshot of `chunk` carries, in page order, as the index stands now: each page
    /// with its entry, except that the pages of a heavy segment come once, at the segment's
    /// first page, with every page of the chunk that points into it.
    pub fn snapshot_plan(&self, chunk: ChunkId) -> Vec<(PageNo, PageEntry, Vec<HeavySlot>)> {
        let entries = self.chunk_entries(chunk);
        let mut segments: std::collections::HashMap<BlockRun, Vec<HeavySlot>> = std::collections::HashMap::new();
        for &(page, e) in entries.iter().filter(|(_, e)| e.encoding == Encoding::Heavy) {
            let slot = HeavySlot { page, position: e.stored_len, checksum: e.checksum, lsn: e.lsn };
            segments.entry(e.run).or_default().push(slot);
        }
        let mut plan = Vec::with_capacity(entries.len());
        for (page, entry) in entries {
            if entry.encoding != Encoding::Heavy {
                plan.push((page, entry, Vec::new()));
            } else if let Some(slots) = segments.remove(&entry.run) {
                plan.push((page, entry, slots));
            }
        }
        plan
    }

    /// The image of one step of [`Store::snapshot_plan`], exactly as stored (a heavy segment
    /// trimmed to its header and frame), or `None` if the page is gone. Refused if the page's
    /// entry is no longer the one planned: a snapshot is read between two applies.
    pub fn snapshot_image(
        &self,
        chunk: ChunkId,
        page: PageNo,
        entry: &PageEntry,
        slots: Vec<HeavySlot>,
    ) -> Result<Option<ChunkImage>> {
        let Some((now, bytes)) = self.read_image(chunk, page)? else { return Ok(None) };
        if now != *entry {
            return Err(Error::invalid(format!("page {} of chunk {} changed while it was read", page.0, chunk.0)));
        }
        if entry.encoding != Encoding::Heavy {
            let image = super::PageImage { encoding: entry.encoding, bytes, checksum: entry.checksum };
            return Ok(Some(ChunkImage::Page(PagePut { page, image, lsn: entry.lsn })));
        }
        let mut segment = bytes;
        if segment.len() >= HEAVY_HEADER_BYTES {
            let frame = u32::from_le_bytes([segment[0], segment[1], segment[2], segment[3]]) as usize;
            if frame + HEAVY_HEADER_BYTES <= segment.len() {
                segment.truncate(frame + HEAVY_HEADER_BYTES);
            }
        }
        Ok(Some(ChunkImage::Heavy { segment, pages: slots }))
    }
}

thread_local! {
    /// A bug for the crash tests to catch: a chunk replaced without its unit marker, so that a
    /// commit torn at a block boundary installs part of the snapshot.
    static WITHOUT_UNIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Test-only: makes replacements on this thread journal their records without the unit marker.
#[cfg(test)]
pub(crate) fn set_replace_without_unit(on: bool) {
    WITHOUT_UNIT.with(|flag| flag.set(on));
}

fn replace_without_unit() -> bool {
    #[cfg(test)]
    return WITHOUT_UNIT.with(|flag| flag.get());
    #[cfg(not(test))]
    false
}
