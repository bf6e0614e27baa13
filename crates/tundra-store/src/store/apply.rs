//! The replica side of the store (seed 000 §3.2.1, Figure 4 steps 3.1 to 3.3): a
//! [`StoreCommand`] the leader side decided is applied here, with no compression: allocate the
//! blocks (the core decides where), write them to the data device, journal the change, install
//! it in the index, and release what it replaced. Every other mutating method of [`Store`] is a
//! command built and applied, so there is one path for a local write and, later, for a
//! replicated one.

use std::sync::Arc;

use tundra_device::BLOCK_SIZE;

use super::{HEAVY_HEADER_BYTES, Store, TrimPolicy, Watermarks, check_image};
use crate::buf::with_scratch;
use crate::command::{HeavyPage, PagePut, StoreCommand};
use crate::ids::{BlockRun, ChunkId, EXTENT_BLOCKS, PageNo, VolumeId};
use crate::index::{Encoding, PageEntry};
use crate::journal::{MAX_CHUNK_MARK_BYTES, PAGE_DATA_MAX_BYTES, Record};
use crate::volume::{Volume, VolumeMode};
use crate::{Error, Result};

/// The most image bytes a commit carries in the log instead of flushing the data device before
/// it ([`Journal::commit_with_data`]): a commit's one or two database pages (a WAL page and
/// its fsync, a 16 KiB InnoDB page). Larger commits are the write-back cache's batches, which
/// pay one data flush for many pages and would fill the log's ring.
///
/// [`Journal::commit_with_data`]: crate::journal::Journal::commit_with_data
pub const CARRIED_IMAGES_MAX_BYTES: usize = 16 * 1024;

/// How [`Store::commit_and_install_as`] commits its records.
#[derive(Clone, Copy)]
pub(super) enum CommitAs<'a> {
    /// As the mark's durability says (now, or deferred to the next group commit).
    Plain,
    /// Preceded by a [`Record::Unit`] marker, so that replay takes them all or none even if
    /// the commit spans log blocks.
    Unit,
    /// Each entry's image goes into the log before the entry's record ([`Record::PageData`]),
    /// and the commit does not flush the data device ([`Journal::commit_with_data`]). Under
    /// write-behind the images then wait unwritten for their runs (see `Unwritten`); otherwise
    /// they were written to them already. Only for a commit of the store's own: no mark.
    ///
    /// [`Journal::commit_with_data`]: crate::journal::Journal::commit_with_data
    Carrying(&'a [&'a [u8]]),
}

impl Store {
    /// Applies a command: the one way the store changes. On an error the command had no effect
    /// (a journal or device error in the middle also stops the store, see [`Store::open`]).
    pub fn apply(&self, command: &StoreCommand) -> Result<()> {
        match command {
            StoreCommand::PutPages { chunk, pages } => self.put_pages(*chunk, pages, None),
            StoreCommand::TrimPages { chunk, pages } => self.trim_pages(*chunk, pages, None),
            StoreCommand::PutHeavy { chunk, pages, segment } => self.put_heavy(*chunk, pages, segment, None),
            StoreCommand::CreateVolume(volume) => self.create_volume_now(volume.clone()),
            StoreCommand::ResizeVolume { volume, size_bytes } => self.resize_volume_now(*volume, *size_bytes),
            StoreCommand::DeleteVolume(volume) => self.delete_volume_now(*volume),
            StoreCommand::SetWatermarks { volume, marks } => self.set_watermarks(*volume, *marks),
        }
    }

    /// Applies a command that changes one chunk's pages and journals `mark`, the replication
    /// layer's position in that chunk's log (at most [`MAX_CHUNK_MARK_BYTES`]), in the same
    /// commit as the command's effect: after a crash the chunk's pages reflect exactly the
    /// commands up to the mark [`Store::chunk_mark`] returns, never one more or one fewer. A
    /// command that changes nothing still moves the mark. A command of no chunk is refused.
    pub fn apply_marked(&self, command: &StoreCommand, mark: &[u8]) -> Result<()> {
        self.apply_marked_as(command, mark, Durability::Now)
    }

    /// [`Store::apply_marked`] with the journal commit of `durability`: a replica applying a
    /// committed Raft entry defers it (the entry is in its durable Raft log, which replays it
    /// past the chunk's durable mark after a crash), and makes it durable with [`Store::sync`]
    /// before its log may forget the entry.
    pub fn apply_marked_as(&self, command: &StoreCommand, mark: &[u8], durability: Durability) -> Result<()> {
        check_mark(mark)?;
        let marked = Some((mark, durability));
        match command {
            StoreCommand::PutPages { chunk, pages } => self.put_pages(*chunk, pages, marked),
            StoreCommand::TrimPages { chunk, pages } => self.trim_pages(*chunk, pages, marked),
            StoreCommand::PutHeavy { chunk, pages, segment } => self.put_heavy(*chunk, pages, segment, marked),
            _ => Err(Error::invalid("a marked command must change one chunk's pages")),
        }
    }

    /// Journals a chunk's mark alone: the replication layer passed a command it refused (every
    /// replica refuses it the same way), or one that is not the store's.
    pub fn set_chunk_mark(&self, chunk: ChunkId, mark: &[u8]) -> Result<()> {
        self.set_chunk_mark_as(chunk, mark, Durability::Now)
    }

    /// [`Store::set_chunk_mark`] with the journal commit of `durability`.
    pub fn set_chunk_mark_as(&self, chunk: ChunkId, mark: &[u8], durability: Durability) -> Result<()> {
        check_mark(mark)?;
        let _no_checkpoint = self.checkpoint_gate.read();
        let record = Record::ChunkMark { chunk, mark: mark.to_vec() };
        match durability {
            Durability::Now => self.commit_volume(record)?,
            Durability::Deferred => self.commit_deferred(std::slice::from_ref(&record))?,
        }
        self.state.lock().chunk_marks.insert(chunk, mark.to_vec());
        Ok(())
    }

    /// Makes every deferred journal record durable, so that each chunk's mark as
    /// [`Store::chunk_mark`] reads it now survives a crash. Cheap when nothing is deferred.
    pub fn sync(&self) -> Result<()> {
        self.journal.sync().inspect_err(|error| {
            self.state.lock().failed.get_or_insert_with(|| error.to_string());
        })
    }

    /// The chunk's latest journalled mark, if it has one.
    pub fn chunk_mark(&self, chunk: ChunkId) -> Option<Vec<u8>> {
        self.state.lock().chunk_marks.get(&chunk).cloned()
    }

    /// Makes a chunk hold exactly `pages` (images a replica sent whole: a snapshot) and `mark`,
    /// all or nothing ([`Store::replace_chunk_images`]). Pages not named are removed.
    pub fn replace_chunk(&self, chunk: ChunkId, pages: &[PagePut], mark: &[u8]) -> Result<()> {
        let mut images = pages.iter().map(|put| Ok(super::ChunkImage::Page(put.clone())));
        self.replace_chunk_images(chunk, &mut images, mark)
    }

    /// Every page entry of one chunk, in page order.
    pub fn chunk_entries(&self, chunk: ChunkId) -> Vec<(PageNo, PageEntry)> {
        self.state.lock().chunks.get(&chunk).map(|c| c.index.iter().collect()).unwrap_or_default()
    }

    /// Creates a volume. Its name must be new, and its id never given before (at least
    /// [`Store::next_volume_id`]).
    pub fn create_volume(&self, volume: Volume) -> Result<()> {
        self.apply(&StoreCommand::CreateVolume(volume))
    }

    /// Grows a volume to `size_bytes`. Shrinking would drop pages, which is not offered.
    pub fn resize_volume(&self, id: VolumeId, size_bytes: u64) -> Result<()> {
        self.apply(&StoreCommand::ResizeVolume { volume: id, size_bytes })
    }

    /// Deletes a volume: its pages are gone and their blocks freed and trimmed.
    pub fn delete_volume(&self, id: VolumeId) -> Result<()> {
        self.apply(&StoreCommand::DeleteVolume(id))
    }

    /// Stores an encoded page (a [`StoreCommand::PutPages`] of one page). `lsn` is the LSN of
    /// the change the image carries. For tests: the product builds commands.
    #[cfg(test)]
    pub(crate) fn apply_write(
        &self,
        chunk: ChunkId,
        page: PageNo,
        image: &super::PageImage,
        lsn: crate::ids::Lsn,
    ) -> Result<()> {
        self.put_pages(chunk, &[PagePut { page, image: image.clone(), lsn }], None)
    }

    /// Removes a page: it reads as absent, and its blocks are freed and trimmed. For tests: the
    /// product builds commands.
    #[cfg(test)]
    pub(crate) fn trim_page(&self, chunk: ChunkId, page: PageNo) -> Result<()> {
        self.trim_pages(chunk, &[page], None)
    }

    /// Stores pages of one chunk with one journal commit: each image is written to its own
    /// blocks, then one group of records installs them all (one data flush and one journal
    /// flush for the lot, where page-at-a-time writes pay both per page). The pages take
    /// consecutive blocks where they are free, and blocks that follow each other on the device
    /// are written with one I/O. Every image is checked before anything is written; on an
    /// error nothing is installed and the blocks taken are freed.
    fn put_pages(&self, chunk: ChunkId, pages: &[PagePut], mark: Option<(&[u8], Durability)>) -> Result<()> {
        if pages.is_empty() {
            return mark.map_or(Ok(()), |(mark, durability)| self.set_chunk_mark_as(chunk, mark, durability));
        }
        let mut counts = Vec::with_capacity(pages.len());
        for put in pages {
            counts.push(check_image(&self.volume_of(chunk, put.page)?, &put.image)?);
        }
        let runs = self.allocate_many(chunk, &counts)?;
        let images: Vec<&[u8]> = pages.iter().map(|put| put.image.bytes.as_slice()).collect();
        let entries: Vec<(PageNo, Option<PageEntry>)> =
            pages.iter().zip(&runs).map(|(put, &run)| (put.page, Some(new_entry(put, run)))).collect();
        // A small commit of the store's own (no replicated log holds it) carries its images in
        // the log: one flush, the log's, instead of the data device's and then the log's. With
        // write-behind its runs are written later, off this thread (see `Unwritten`).
        let bytes: usize = images.iter().map(|image| image.len()).sum();
        let carry = mark.is_none() && bytes <= CARRIED_IMAGES_MAX_BYTES && self.journal.has_room_for_data(bytes);
        if !(carry && self.write_behind)
            && let Err(error) = self.write_runs(&runs, &images)
        {
            self.abandon_runs(chunk, &runs)?;
            return Err(error);
        }
        if carry {
            return self.commit_and_install_as(chunk, &entries, &runs, None, CommitAs::Carrying(&images));
        }
        self.commit_and_install(chunk, &entries, &runs, mark)
    }

    /// Removes pages of one chunk with one journal commit; pages that do not exist are skipped.
    /// Every page must lie inside its volume.
    fn trim_pages(&self, chunk: ChunkId, pages: &[PageNo], mark: Option<(&[u8], Durability)>) -> Result<()> {
        for &page in pages {
            self.volume_of(chunk, page)?;
        }
        let entries: Vec<(PageNo, Option<PageEntry>)> = {
            let state = self.state.lock();
            pages.iter().filter(|&&page| state.is_mapped(chunk, page)).map(|&page| (page, None)).collect()
        };
        if entries.is_empty() {
            return mark.map_or(Ok(()), |(mark, durability)| self.set_chunk_mark_as(chunk, mark, durability));
        }
        self.commit_and_install(chunk, &entries, &[], mark)
    }

    /// Records a volume's redo watermarks; they only move forward.
    fn set_watermarks(&self, volume: VolumeId, marks: Watermarks) -> Result<()> {
        let _no_checkpoint = self.checkpoint_gate.read();
        if self.volume(volume).is_none() {
            return Err(Error::invalid(format!("no volume {}", volume.0)));
        }
        self.commit_volume(Record::Watermarks { volume, marks })?;
        self.state.lock().set_watermarks(volume, marks);
        Ok(())
    }

    /// Stores a heavy segment (seed 000 §3.2.3): `segment` (header and compressed frame, at most
    /// one extent) holds `pages`, consecutive pages of `chunk` given with their checksums and
    /// LSNs, in order. Every page's entry points at the segment's run and its position in it,
    /// and keeps the page's LSN: archiving changes no page.
    ///
    /// Only pages still at the version the segment was made from are pointed at it: a page
    /// whose entry's checksum or LSN differs (written, or trimmed, after the leader read it and
    /// before this command's turn in the log) keeps its entry, and a segment no page takes is
    /// not written at all. Every replica decides the same, as it applies the same commands in
    /// the same order; the caller keeps other changes of the chunk's pages out meanwhile (a
    /// chunk's state machine applies one command at a time; a node alone holds the pages'
    /// locks from their read to here, so every page is taken).
    fn put_heavy(
        &self,
        chunk: ChunkId,
        pages: &[HeavyPage],
        segment: &[u8],
        mark: Option<(&[u8], Durability)>,
    ) -> Result<()> {
        for &HeavyPage { page, .. } in pages {
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
        let current: Vec<bool> = pages
            .iter()
            .map(|heavy| {
                self.entry(chunk, heavy.page).is_some_and(|now| now.checksum == heavy.checksum && now.lsn == heavy.lsn)
            })
            .collect();
        if !current.contains(&true) {
            return match mark {
                Some(_) => self.commit_and_install(chunk, &[], &[], mark),
                None => Ok(()),
            };
        }
        let run = self.write_run(chunk, segment, segment.len().div_ceil(BLOCK_SIZE) as u8)?;
        let entries: Vec<(PageNo, Option<PageEntry>)> = pages
            .iter()
            .enumerate()
            .filter(|&(i, _)| current[i])
            .map(|(i, &HeavyPage { page, checksum, lsn })| {
                (page, Some(PageEntry { encoding: Encoding::Heavy, run, stored_len: i as u16, checksum, lsn }))
            })
            .collect();
        self.commit_and_install(chunk, &entries, &[run], mark)
    }

    /// Creates a volume. Its name must be new, and its id never given before (at least
    /// [`Store::next_volume_id`]).
    fn create_volume_now(&self, volume: Volume) -> Result<()> {
        volume.validate()?;
        let _no_checkpoint = self.checkpoint_gate.read();
        self.state.lock().check_new_volume(&volume)?;
        self.commit_volume(Record::VolumeSet(volume.clone()))?;
        self.state.lock().set_volume(volume);
        Ok(())
    }

    /// Grows a volume to `size_bytes`. Shrinking would drop pages, which is not offered.
    fn resize_volume_now(&self, id: VolumeId, size_bytes: u64) -> Result<()> {
        let _no_checkpoint = self.checkpoint_gate.read();
        let mut volume = self.volume(id).ok_or_else(|| Error::invalid(format!("no volume {}", id.0)))?;
        if size_bytes < volume.size_bytes {
            return Err(Error::invalid("volumes only grow: shrinking would drop pages"));
        }
        volume.size_bytes = size_bytes;
        volume.validate()?;
        self.commit_volume(Record::VolumeSet(volume.clone()))?;
        self.state.lock().set_volume(volume);
        Ok(())
    }

    /// Deletes a volume: its pages are gone and their blocks freed and trimmed.
    fn delete_volume_now(&self, id: VolumeId) -> Result<()> {
        {
            // Exclusive: no write of the volume commits between its delete and the removal of
            // its pages (a record of a deleted volume's page would make the journal unreadable).
            let _no_commit = self.checkpoint_gate.write();
            if self.volume(id).is_none() {
                return Err(Error::invalid(format!("no volume {}", id.0)));
            }
            self.commit_volume(Record::VolumeDelete(id))?;
            self.state.lock().delete_volume(id);
        }
        self.release_freed()?;
        if self.trim_policy == TrimPolicy::Deferred {
            self.trim_unused()?;
        }
        Ok(())
    }

    fn commit_deferred(&self, records: &[Record]) -> Result<()> {
        self.journal.commit_deferred(records).inspect_err(|error| {
            self.state.lock().failed.get_or_insert_with(|| error.to_string());
        })
    }

    fn commit_volume(&self, record: Record) -> Result<()> {
        self.journal.commit(std::slice::from_ref(&record)).inspect_err(|error| {
            self.state.lock().failed.get_or_insert_with(|| error.to_string());
        })
    }

    /// Writes each image to its run, zero-padded, with one device write for every group of
    /// runs that follow each other on the device. Not flushed (see [`Store::write_run`]).
    pub(super) fn write_runs(&self, runs: &[BlockRun], images: &[&[u8]]) -> Result<()> {
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

    /// Allocates `blocks` blocks in `chunk` and writes `bytes` there, zero-padded. Not flushed:
    /// the journal flushes the data device before it writes the record that points here.
    fn write_run(&self, chunk: ChunkId, bytes: &[u8], blocks: u8) -> Result<BlockRun> {
        let run = self.allocate_many(chunk, &[blocks])?[0];
        if let Err(error) = self.write_runs(&[run], &[bytes]) {
            self.state.lock().unallocate(chunk, &[run]);
            return Err(error);
        }
        Ok(run)
    }

    /// Takes a run of blocks for each page of a group (see [`StoreCore::allocate`]).
    pub(super) fn allocate_many(&self, chunk: ChunkId, counts: &[u8]) -> Result<Vec<BlockRun>> {
        let first = self.state.lock().allocate(chunk, counts);
        match first {
            // Runs that earlier writes freed wait for a batch of them before they are released
            // (state.rs's RELEASE_BATCH): on a full device they are released now and the
            // allocation tried once more, so a write that fits is not refused.
            Err(error) if error.kind() == crate::ErrorKind::Full && !self.state.lock().pending_free.is_empty() => {
                self.release_freed()?;
                self.state.lock().allocate(chunk, counts)
            }
            other => other,
        }
    }

    /// Journals new entries (or removals) of pages of `chunk` as one group, then installs them
    /// and lets go of the blocks they replace. On a journal error `new_runs`, the blocks the
    /// entries point at, is freed and the store stops.
    fn commit_and_install(
        &self,
        chunk: ChunkId,
        entries: &[(PageNo, Option<PageEntry>)],
        new_runs: &[BlockRun],
        mark: Option<(&[u8], Durability)>,
    ) -> Result<()> {
        self.commit_and_install_as(chunk, entries, new_runs, mark, CommitAs::Plain)
    }

    /// [`Store::commit_and_install`], committed as `how` says.
    pub(super) fn commit_and_install_as(
        &self,
        chunk: ChunkId,
        entries: &[(PageNo, Option<PageEntry>)],
        new_runs: &[BlockRun],
        mark: Option<(&[u8], Durability)>,
        how: CommitAs<'_>,
    ) -> Result<()> {
        let carried: &[&[u8]] = match how {
            CommitAs::Carrying(images) => {
                assert!(images.len() == entries.len() && mark.is_none(), "carried images are one per entry, unmarked");
                images
            }
            _ => &[],
        };
        let pieces: usize = carried.iter().map(|image| image.len().div_ceil(PAGE_DATA_MAX_BYTES)).sum();
        let mut records: Vec<Record> = Vec::with_capacity(entries.len() + pieces + 2);
        if let CommitAs::Unit = how {
            let count = entries.len() + usize::from(mark.is_some());
            let count = u32::try_from(count).map_err(|_| Error::invalid("a unit of more than 2^32 records"))?;
            records.push(Record::Unit { records: count });
        }
        for (i, &(page, entry)) in entries.iter().enumerate() {
            if let Some(image) = carried.get(i) {
                for (n, piece) in image.chunks(PAGE_DATA_MAX_BYTES).enumerate() {
                    let offset = (n * PAGE_DATA_MAX_BYTES) as u16;
                    records.push(Record::PageData { chunk, page, offset, bytes: piece.to_vec() });
                }
            }
            records.push(match entry {
                Some(entry) => Record::PageSet { chunk, page, entry },
                None => Record::PageClear { chunk, page },
            });
        }
        if let Some((mark, _)) = mark {
            records.push(Record::ChunkMark { chunk, mark: mark.to_vec() });
        }
        let _no_checkpoint = self.checkpoint_gate.read();
        // A volume deleted since the write began takes nothing more: its delete holds the gate
        // exclusively, so it is either journalled before this check or after this commit.
        if self.state.lock().volume(chunk.volume()).is_none() {
            self.abandon_runs(chunk, new_runs)?;
            return Err(Error::invalid(format!("volume {} was deleted", chunk.volume().0)));
        }
        let committed = match (how, mark) {
            (CommitAs::Carrying(_), _) => self.journal.commit_with_data(&records),
            (CommitAs::Unit, _) => self.journal.commit_unit(&records),
            (CommitAs::Plain, Some((_, Durability::Deferred))) => self.journal.commit_deferred(&records),
            (CommitAs::Plain, _) => self.journal.commit(&records),
        };
        if let Err(error) = committed {
            let mut state = self.state.lock();
            state.unallocate(chunk, new_runs);
            state.failed.get_or_insert_with(|| error.to_string());
            return Err(error);
        }
        // Carried images wait for their runs; they are found there before the entries that
        // point at the runs are installed.
        let waiting = if carried.is_empty() || !self.write_behind {
            0
        } else {
            let mut unwritten = self.unwritten.lock();
            for (&run, image) in new_runs.iter().zip(carried) {
                unwritten.insert(run.first_lba().0, super::Unwritten { run, image: Arc::new(image.to_vec()) });
            }
            unwritten.len()
        };
        let release = {
            let mut state = self.state.lock();
            if let Some((mark, _)) = mark {
                state.chunk_marks.insert(chunk, mark.to_vec());
            }
            state.install(chunk, entries)
        };
        drop(_no_checkpoint);
        if release {
            self.release_freed()?;
        }
        if waiting >= self.unwritten_batch {
            self.write_unwritten()?;
        }
        Ok(())
    }

    /// Gives back runs written but never journalled: nothing points at them, so they are
    /// trimmed (they hold no space on a compressing drive), then allocatable again.
    pub(super) fn abandon_runs(&self, chunk: ChunkId, runs: &[BlockRun]) -> Result<()> {
        for &run in runs {
            self.data.trim(run.first_lba(), u64::from(run.count))?;
        }
        self.state.lock().unallocate(chunk, runs);
        Ok(())
    }
}

/// When a command's journal records are durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Before the call returns: the store's own write-ahead log is the only copy of the change.
    Now,
    /// With the journal's next group commit, or [`Store::sync`]: the caller's replicated log
    /// holds the change and replays it after a crash (seed 000 §3.2.1).
    Deferred,
}

/// The index entry of a page put into `run`.
pub(super) fn new_entry(put: &PagePut, run: BlockRun) -> PageEntry {
    PageEntry {
        encoding: put.image.encoding,
        run,
        stored_len: put.image.bytes.len() as u16,
        checksum: put.image.checksum,
        lsn: put.lsn,
    }
}

pub(super) fn check_mark(mark: &[u8]) -> Result<()> {
    if mark.len() > MAX_CHUNK_MARK_BYTES {
        return Err(Error::invalid(format!("a chunk mark of {} bytes (at most {MAX_CHUNK_MARK_BYTES})", mark.len())));
    }
    Ok(())
}
