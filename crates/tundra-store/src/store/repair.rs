//! Repair of a page whose stored image fails its checksum (seed 000 §3.2.1: three copies, so a
//! page one replica cannot read is rewritten from another's). The replication layer finds a
//! good copy on a peer; here the copy is written over this replica's as a local rewrite of the
//! same content: same encoding, length, checksum and LSN, new blocks, one journal commit.
//!
//! Why a repair never puts an older image over a newer one: the rewrite is installed only if
//! the page's entry is still exactly the one found bad (same blocks, same LSN), and that check,
//! the journal commit and the install happen while the checkpoint gate is held exclusively.
//! Every other writer holds that gate shared from its journal commit to its index install, so
//! no write of the page is between the two steps: a write journalled before the repair was
//! installed before it too (so the entry changed and the repair is dropped), and a write that
//! commits after the repair comes after it in the journal as well, so replay ends with the
//! write, as memory does.

use super::apply::new_entry;
use super::{HEAVY_HEADER_BYTES, Store, check_image};
use crate::command::PagePut;
use crate::ids::{ChunkId, EXTENT_BLOCKS, PageNo};
use crate::index::{Encoding, PageEntry};
use crate::journal::Record;
use crate::{Error, Result};

/// What [`Store::repair_page`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepairOutcome {
    /// The good image now stands in place of the bad one.
    Repaired,
    /// The page changed since it was found bad (a newer write, a trim): nothing was written,
    /// the page's current version stands.
    Superseded,
}

impl Store {
    /// Rewrites page `put.page` of `chunk` with `put`, a verified copy of the same version a
    /// peer holds, if the page's entry is still `bad` (the entry whose image failed). The copy
    /// must match `bad` in everything but its blocks: encoding, stored length, checksum and
    /// LSN, so every replica keeps the same content. The caller verified that the copy's
    /// content matches its checksum (`Pages::verify_image`).
    pub fn repair_page(&self, chunk: ChunkId, bad: PageEntry, put: &PagePut) -> Result<RepairOutcome> {
        if bad.encoding == Encoding::Heavy {
            return Err(Error::invalid("repair of a page of a heavy segment is not built yet"));
        }
        let same = put.image.encoding == bad.encoding
            && put.image.bytes.len() == usize::from(bad.stored_len)
            && put.image.checksum == bad.checksum
            && put.lsn == bad.lsn;
        if !same {
            return Err(Error::invalid(format!(
                "page {} of chunk {}: the copy is another version than the bad image (LSN {} against {})",
                put.page.0, chunk.0, put.lsn.0, bad.lsn.0
            )));
        }
        let count = check_image(&self.volume_of(chunk, put.page)?, &put.image)?;
        if self.entry(chunk, put.page) != Some(bad) {
            return Ok(RepairOutcome::Superseded);
        }
        let runs = self.allocate_many(chunk, &[count])?;
        if let Err(error) = self.write_runs(&runs, &[put.image.bytes.as_slice()]) {
            self.abandon_runs(chunk, &runs)?;
            return Err(error);
        }
        let entry = new_entry(put, runs[0]);
        let release = {
            let _alone = self.checkpoint_gate.write();
            if self.entry(chunk, put.page) != Some(bad) {
                drop(_alone);
                self.abandon_runs(chunk, &runs)?;
                return Ok(RepairOutcome::Superseded);
            }
            let record = Record::PageSet { chunk, page: put.page, entry };
            if let Err(error) = self.journal.commit(std::slice::from_ref(&record)) {
                let mut state = self.state.lock();
                state.unallocate(chunk, &runs);
                state.failed.get_or_insert_with(|| error.to_string());
                return Err(error);
            }
            self.state.lock().install(chunk, &[(put.page, Some(entry))])
        };
        if release {
            self.release_freed()?;
        }
        Ok(RepairOutcome::Repaired)
    }

    /// Rewrites a heavy segment that fails on this replica with `segment`, a peer's copy of the
    /// same segment (the leader shipped every replica the same bytes), for the pages in `bad`:
    /// the entries of the pages that point into the bad segment and whose content the caller
    /// verified in the copy at their own positions (`Pages::check_segment_copy`). Each page
    /// whose entry is still the one found bad points at the new blocks, at the same position,
    /// checksum and LSN; the others changed meanwhile and are left. One journal commit, under
    /// the checkpoint gate held exclusively, as for a page (module doc). Answers how many
    /// pages now point at the copy.
    pub fn repair_segment(&self, chunk: ChunkId, bad: &[(PageNo, PageEntry)], segment: &[u8]) -> Result<usize> {
        if bad.iter().any(|(_, entry)| entry.encoding != Encoding::Heavy) {
            return Err(Error::invalid("a segment's repair names a page that is not in a heavy segment"));
        }
        let max = EXTENT_BLOCKS as usize * tundra_device::BLOCK_SIZE;
        if bad.is_empty() || segment.len() <= HEAVY_HEADER_BYTES || segment.len() > max {
            return Err(Error::invalid(format!("a heavy segment of {} bytes for {} pages", segment.len(), bad.len())));
        }
        let current = |store: &Store| -> Vec<(PageNo, PageEntry)> {
            bad.iter().filter(|&&(page, entry)| store.entry(chunk, page) == Some(entry)).copied().collect()
        };
        if current(self).is_empty() {
            return Ok(0);
        }
        let runs = self.allocate_many(chunk, &[segment.len().div_ceil(tundra_device::BLOCK_SIZE) as u8])?;
        if let Err(error) = self.write_runs(&runs, &[segment]) {
            self.abandon_runs(chunk, &runs)?;
            return Err(error);
        }
        let (release, repaired) = {
            let _alone = self.checkpoint_gate.write();
            let still = current(self);
            if still.is_empty() {
                drop(_alone);
                self.abandon_runs(chunk, &runs)?;
                return Ok(0);
            }
            let moved: Vec<(PageNo, PageEntry)> =
                still.iter().map(|&(page, entry)| (page, PageEntry { run: runs[0], ..entry })).collect();
            let records: Vec<Record> =
                moved.iter().map(|&(page, entry)| Record::PageSet { chunk, page, entry }).collect();
            let entries: Vec<(PageNo, Option<PageEntry>)> =
                moved.iter().map(|&(page, entry)| (page, Some(entry))).collect();
            if let Err(error) = self.journal.commit(&records) {
                let mut state = self.state.lock();
                state.unallocate(chunk, &runs);
                state.failed.get_or_insert_with(|| error.to_string());
                return Err(error);
            }
            (self.state.lock().install(chunk, &entries), still.len())
        };
        if release {
            self.release_freed()?;
        }
        Ok(repaired)
    }
}
