//! Records leaving memory before their page is materialized (seed 000 §3.3.3, Opt#3): when a
//! stream holds more record bytes than `[redo] cache`, the oldest pages' oldest records are
//! merged into those pages' log slots on the drive (one read and one write of a 4 KiB block
//! each), or, with slots off, simply dropped from memory since the redo log still holds them.
//! A slot with no room keeps its page's records in memory until a fold frees it; a page past
//! the stream's slot region is treated the same way.

use std::sync::atomic::Ordering;

use tundra_redo::Merge;

use super::{Stream, StreamCounters, redo_error};
use crate::Result;
use crate::node::Node;

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
    /// out of memory until it holds three quarters of that, as far as slots have room; returns
    /// how many records moved. Spilling to below the bound, not just to it, lets records
    /// gather before they go: each slot merge (a read and a write of the slot's block) then
    /// carries several of a page's records rather than one. Without `wait`, a stream whose
    /// fold or spill is under way is left alone (the writer's call: it must not queue behind a
    /// fold that waits for readers).
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
        let tasks = stream.state.lock().versions.spill_candidates(bound / 4 * 3);
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
                state.versions.slot_full(task.page);
                StreamCounters::add(&stream.counters.slot_overflows, 1);
            }
        }
        stream.counters.spilled_records.fetch_add(moved, Ordering::Relaxed);
        Ok(moved)
    }
}
