//! Records leaving memory before their page is materialized (seed 000 §3.3.3, Opt#3): when a
//! stream holds more record bytes than `[redo] cache`, the oldest pages' oldest records are
//! merged into those pages' log slots on the drive (one read and one write of a 4 KiB block
//! each), or, with slots off, simply dropped from memory since the redo log still holds them.
//!
//! A slot that would overflow makes its page materialize, as far as LSN_min allows, through
//! the compressed page path (`fold.rs`); where LSN_min keeps its records from folding, the
//! page gets an extra image above LSN_min: the page as of its oldest record in memory, written
//! to an image cell with the records its slot held, after which the slot is empty and takes
//! the records that follow (`tundra_redo::slots`, "cells"). Either way the page's records can
//! leave memory while a reader lags, and every version a reader may ask for stays two device
//! reads away. A page past the stream's slot region, or a stream whose cells are all in use,
//! keeps its records in memory; the writer's backpressure (`io.rs`) bounds them.

use std::sync::atomic::Ordering;

use tundra_redo::{Merge, SpillRead, fetch};

use super::{Stream, StreamCounters, redo_error, stored_lsn};
use crate::node::{Node, VolumeRef};
use crate::{Error, Result};

/// Rounds of spilling and relieving stuck pages one spill does at most: a page relieved by an
/// extra image spills its newer records in the next round.
const RELIEF_ROUNDS: usize = 4;

impl Node {
    /// Spills on every stream whose cache is past its bound; returns the records moved.
    pub fn spill_redo(&self) -> Result<u64> {
        let mut moved = 0;
        for stream in self.redo.streams() {
            moved += self.spill_stream(&stream, true)?;
        }
        Ok(moved)
    }

    /// Once the stream's cache holds more than `[redo] cache` bytes, moves its oldest records
    /// out of memory until it holds three quarters of that, relieving pages whose slots are
    /// full on the way; returns how many records moved. Spilling to below the bound, not just
    /// to it, lets records gather before they go: each slot merge (a read and a write of the
    /// slot's block) then carries several of a page's records rather than one. Without
    /// `wait`, a stream whose fold or spill is under way is left alone (the writer's call: it
    /// must not queue behind a fold that waits for readers).
    pub(crate) fn spill_stream(&self, stream: &Stream, wait: bool) -> Result<u64> {
        let bound = self.redo.options().cache_bytes;
        if stream.state.lock().versions.cached_bytes() <= bound {
            return Ok(0);
        }
        let _upkeep = match wait {
            true => stream.upkeep.lock(),
            false => match stream.upkeep.try_lock() {
                Some(guard) => guard,
                None => return Ok(0),
            },
        };
        let target = bound / 4 * 3;
        let volume = self.volume(stream.volume).ok();
        let mut moved = 0;
        for _ in 0..RELIEF_ROUNDS {
            moved += self.spill_once(stream, target)?;
            let Some(volume) = &volume else { break };
            let pages = stream.state.lock().versions.pages_to_relieve(target);
            let mut relieved = 0;
            for page in pages {
                if self.relieve_page(stream, volume, page)? {
                    relieved += 1;
                }
            }
            if relieved == 0 {
                break;
            }
        }
        stream.counters.spilled_records.fetch_add(moved, Ordering::Relaxed);
        Ok(moved)
    }

    /// One pass of slot merges toward `target` bytes in memory; returns the records moved.
    fn spill_once(&self, stream: &Stream, target: u64) -> Result<u64> {
        let tasks = stream.state.lock().versions.spill_candidates(target);
        // Records leave memory only once the log holds them durably (a replicated stream's
        // appends are deferred, io.rs): with slots off the log is where they are read back
        // from, and a slot must never hold records a crash takes from the log.
        if !tasks.is_empty() {
            stream.log.sync().map_err(redo_error)?;
        }
        let mut moved = 0;
        for task in &tasks {
            let merged = match &stream.slots {
                None => true,
                Some(slots) if task.page >= slots.slot_count() => false,
                Some(slots) => match slots.merge(task.page, &task.slot_records()).map_err(redo_error)? {
                    Merge::Merged { .. } => true,
                    Merge::Overflow { .. } => false,
                },
            };
            let mut state = stream.state.lock();
            if merged {
                state.versions.spilled(task.page, task.through_lsn);
                moved += task.records.len() as u64;
            } else {
                // Counted when the page is relieved.
                state.versions.slot_full(task.page);
            }
        }
        Ok(moved)
    }

    /// The overflow rule for one page whose records cannot leave memory for its slot: it is
    /// materialized as far as the fold bound allows, and if that leaves it stuck, it gets an
    /// extra image above LSN_min. True if either happened. The caller holds `upkeep`.
    fn relieve_page(&self, stream: &Stream, volume: &VolumeRef, page: u64) -> Result<bool> {
        if stream.slots.as_ref().is_some_and(|slots| page < slots.slot_count()) {
            StreamCounters::add(&stream.counters.slot_overflows, 1);
        }
        let folded = self.fold_page(stream, volume, page)?;
        if !stream.state.lock().versions.slot_stuck(page) {
            return Ok(folded);
        }
        Ok(self.extra_image(stream, volume, page)? || folded)
    }

    /// Writes an extra image of `page` above LSN_min (seed 000 §3.3.3) to an image cell with
    /// the records its slot holds, then empties the slot; false when the page has no slot or
    /// nothing to image, or every cell is in use. The caller holds `upkeep`, so no fold or
    /// other spill changes the page meanwhile; readers are held off only while the index
    /// learns of the cell and the slot is emptied.
    fn extra_image(&self, stream: &Stream, volume: &VolumeRef, page: u64) -> Result<bool> {
        let Some(slots) = &stream.slots else { return Ok(false) };
        if page >= slots.slot_count() {
            return Ok(false);
        }
        let Some(task) = stream.state.lock().versions.extra_image_task(page) else { return Ok(false) };
        // The image's records are durable in the log before it is (as a fold's, fold.rs).
        stream.log.sync().map_err(redo_error)?;
        // The page as of the image's LSN, built as a fold would build it.
        let (chunk, page_no) = volume.volume.locate(page)?;
        let stored = stored_lsn(volume, chunk, page_no);
        let image = match stored {
            Some(_) => volume.pages.read_page(chunk, page_no).map_err(Error::from)?,
            None => None,
        };
        let fetched = match &task.build.spilled {
            Some(read) => fetch(read, Some(slots), &stream.log).map_err(redo_error)?.records,
            None => Vec::new(),
        };
        let content =
            task.build.rebuild(stored.zip(image.as_deref()), &fetched, volume.page_size()).map_err(redo_error)?;
        // The records the slot holds go with it (from the log, if the slot fails its checks).
        let slot_records = if task.slot_lsns.is_empty() {
            Vec::new()
        } else {
            let read =
                SpillRead::Slot { page, lsns: task.slot_lsns.clone(), from_log: None, image: None, records_cell: None };
            let fetched = fetch(&read, Some(slots), &stream.log).map_err(redo_error)?;
            read.pick(&fetched.records).map_err(redo_error)?.into_iter().cloned().collect()
        };
        let Some(cell) = slots.write_cell(page, &slot_records, task.lsn, &content).map_err(redo_error)? else {
            return Ok(false);
        };
        let _exclusive = stream.fold_gate.write();
        if !stream.state.lock().versions.extra_image_written(&task, cell) {
            slots.free_cell(cell).map_err(redo_error)?;
            return Ok(false);
        }
        if !task.slot_lsns.is_empty() {
            slots.clear(page).map_err(redo_error)?;
        }
        StreamCounters::add(&stream.counters.extra_images, 1);
        Ok(true)
    }
}
