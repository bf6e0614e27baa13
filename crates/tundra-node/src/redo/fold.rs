//! Folding redo into pages (rule D6 of the design notes): the oldest pages with records at or
//! below min(LSN_min, durable) are rebuilt from the store's image and their records, stored
//! through the compressed page path (Algorithm 1, both layers) as the page at the last record's
//! LSN, and only then dropped from memory (and from the page's log slot); the log is truncated
//! behind every page's image.

use tundra_redo::{SlotCleanup, fetch};

use super::{Stream, redo_error, stored_lsn};
use crate::node::{Node, VolumeRef};
use crate::{Error, Result};

/// Pages one background pass folds per stream at most.
pub const FOLD_PAGES_PER_PASS: usize = 1024;

/// Bugs for the tests to catch in a fold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FoldBug {
    #[default]
    None,
    /// A page is written before the log holding its records is synced.
    PageBeforeSync,
}

impl Node {
    /// Folds redo into pages on every stream, up to `limit` pages each; returns how many pages
    /// were stored.
    pub fn fold_redo(&self, limit: usize) -> Result<usize> {
        let mut folded = 0;
        for stream in self.redo.streams() {
            let Ok(volume) = self.volume(stream.volume) else { continue };
            folded += self.fold_stream(&stream, &volume, limit)?;
        }
        Ok(folded)
    }

    /// For the crash tests: folds up to `limit` pages of every stream, with `bug`, and stops
    /// as a crash right after the last page's write would, before the log's truncation (and
    /// the sync that comes with it). Returns how many pages were stored.
    #[doc(hidden)]
    pub fn fold_pages_then_stop(&self, limit: usize, bug: FoldBug) -> Result<usize> {
        let mut folded = 0;
        for stream in self.redo.streams() {
            let Ok(volume) = self.volume(stream.volume) else { continue };
            let tasks = fold_tasks(&stream, limit);
            for &page in &tasks {
                let _upkeep = stream.upkeep.lock();
                folded += usize::from(self.fold_page_with(&stream, &volume, page, bug)?);
            }
        }
        Ok(folded)
    }

    /// Expires leases, then folds up to `limit` of the stream's oldest pages and truncates the
    /// log behind them.
    ///
    /// Each page's fold holds the stream's `upkeep` lock on its own, not the whole pass: a
    /// fold waits for readers (`fold_gate`), and the writer's spills must not wait for a whole
    /// pass of those. A spill that runs between two pages only moves records the tasks still
    /// hold, and the page's `materialized` drops whatever of them it folded.
    pub(crate) fn fold_stream(&self, stream: &Stream, volume: &VolumeRef, limit: usize) -> Result<usize> {
        let tasks = fold_tasks(stream, limit);
        let mut folded = 0;
        for &page in &tasks {
            let _upkeep = stream.upkeep.lock();
            if self.fold_page(stream, volume, page)? {
                folded += 1;
            }
        }
        // Under the upkeep lock, so a copy of the stream (image.rs) sees one truncation point.
        let _upkeep = stream.upkeep.lock();
        let through = stream.state.lock().versions.materialized_through();
        if through > stream.log.durable_lsn() {
            // Deferred appends (io.rs) not synced yet: the log truncates only what it holds.
            stream.log.sync().map_err(redo_error)?;
        }
        stream.log.truncate_through(through).map_err(redo_error)?;
        Ok(folded)
    }

    /// Folds `page` as far as the fold bound allows, through the compressed page path; false
    /// when it has nothing at or below the bound. The caller holds the stream's `upkeep` lock.
    /// The image cells the fold leaves unnamed are freed while readers are held off, so no
    /// read's plan still names one.
    pub(super) fn fold_page(&self, stream: &Stream, volume: &VolumeRef, page: u64) -> Result<bool> {
        self.fold_page_with(stream, volume, page, FoldBug::None)
    }

    fn fold_page_with(&self, stream: &Stream, volume: &VolumeRef, page: u64, bug: FoldBug) -> Result<bool> {
        // Asked under the lock: another fold may have done part of it meanwhile.
        let Some(task) = stream.state.lock().versions.fold_task(page) else { return Ok(false) };
        let task = &task;
        let (chunk, page_no) = volume.volume.locate(task.page)?;
        // Readers of this stream wait from the image's write to the versions' update.
        let _exclusive = stream.fold_gate.write();
        let stored = stored_lsn(volume, chunk, page_no);
        let image = match stored {
            Some(_) => volume.pages.read_page(chunk, page_no).map_err(Error::from)?,
            None => None,
        };
        let base = stored.zip(image.as_deref());
        let fetched = match &task.spilled {
            Some(read) => fetch(read, stream.slots.as_ref(), &stream.log).map_err(redo_error)?.records,
            None => Vec::new(),
        };
        let content = task.rebuild(base, &fetched, volume.page_size()).map_err(redo_error)?;
        // The records folded are durable in the log before the page that holds them is: a
        // replicated stream's deferred appends (io.rs) would otherwise let a crash keep the
        // page and lose its records, which the redo group then applies again on top of it.
        if bug != FoldBug::PageBeforeSync {
            stream.log.sync().map_err(redo_error)?;
        }
        volume.pages.write_page(chunk, page_no, &content, task.through_lsn, None).map_err(Error::from)?;
        let (cleanup, freed) = {
            let mut state = stream.state.lock();
            let cleanup = state.versions.materialized(task.page, task.through_lsn);
            (cleanup, state.versions.take_freed_cells())
        };
        if let Some(slots) = &stream.slots {
            match cleanup {
                SlotCleanup::Keep => {}
                SlotCleanup::Clear => slots.clear(task.page).map_err(redo_error)?,
                SlotCleanup::ClearThrough(lsn) => {
                    slots.clear_through(task.page, lsn).map_err(redo_error)?;
                }
            }
            for cell in freed {
                slots.free_cell(cell).map_err(redo_error)?;
            }
        }
        Ok(true)
    }
}

/// Expires the stream's leases and answers up to `limit` of its oldest pages to fold.
fn fold_tasks(stream: &Stream, limit: usize) -> Vec<u64> {
    let mut state = stream.state.lock();
    state.leases.expire();
    let lsn_min = state.leases.lsn_min();
    state.versions.set_lsn_min(lsn_min);
    state.versions.fold_pages(limit)
}
