//! Records leaving memory before their page is materialized (seed 000 §3.3.3): which pages'
//! records leave when the cache passes its bound ([`PageVersions::spill_candidates`]), and the
//! events that say where they went ([`PageVersions::spilled`], [`PageVersions::slot_full`]).

use std::sync::Arc;

use tundra_store::ids::Lsn;

use super::{FoldTask, PageRecords, PageVersions, record_cost_bytes};
use crate::codec::encoded_record_len;
use crate::record::RedoRecord;
use crate::slots::SLOT_RECORD_BYTES;
use crate::versions::serve::plan_through;
use crate::versions::spilled::{Held, SpillTo, SpilledRecord, spills_to_log};
use crate::versions::{Bug, injected};

/// A page's oldest records in memory, to move out of it. With slots on, merge `records` into
/// the page's slot (`SlotArea::merge`), all but the whole-page ones that go to the log alone
/// ([`SpillTask::slot_records`]), then report [`PageVersions::spilled`] with `through_lsn`, or
/// [`PageVersions::slot_full`] if the merge overflowed. With slots off the
/// records are already in the redo log: report `spilled` at once. The owner does a page's slot
/// I/O and its reports here in order (one lock per page), so the index never names a record
/// its slot does not hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpillTask {
    pub page: u64,
    /// The LSN of the last record that leaves memory.
    pub through_lsn: Lsn,
    pub records: Vec<Arc<RedoRecord>>,
    /// Where the stream's records spill.
    pub to: SpillTo,
}

impl SpillTask {
    /// The records that go into the page's slot: all but those the log alone keeps.
    pub fn slot_records(&self) -> Vec<&RedoRecord> {
        self.records.iter().filter(|r| !spills_to_log(self.to, r)).map(|r| r.as_ref()).collect()
    }
}

impl PageVersions {
    /// The records to move out of memory so the cache holds at most `max_bytes` (none while it
    /// does): for page after page, its oldest records in memory, as many as its slot has room
    /// for (all of them with slots off). A page whose slot is full, or whose oldest record in
    /// memory does not fit what is left of its slot, is passed over: folding it is what frees
    /// memory, and until then the writer's backpressure (D8) bounds the cache. Pages may be
    /// passed over until no task is left, so the bound is a target, not a promise.
    ///
    /// Pages go in the order of their oldest record in memory, oldest first, rather than the
    /// largest first. The newest records are what readers near the head read (the writer and
    /// readers that keep up), and keeping them in memory keeps their reads free of slot reads;
    /// the oldest are needed only by lagging readers and by the next fold, which read the slot
    /// once either way. Within a page, only a prefix of its records can spill, since the slot
    /// and the memory list each hold an LSN-ordered run of them; taking the oldest pages first
    /// follows that grain. And the order is kept as records arrive, so a call costs the pages it
    /// looks at, not a sort of every page. Largest first would bring the cache under its bound
    /// with fewer slot writes, but it picks the hottest pages, whose slots fill soonest and
    /// whose newest versions are read most.
    pub fn spill_candidates(&self, max_bytes: u64) -> Vec<SpillTask> {
        let mut projected = self.cached_bytes;
        let mut tasks = Vec::new();
        for &(_, page) in &self.oldest_in_memory {
            if projected <= max_bytes {
                break;
            }
            let entry = &self.pages[&page];
            let take = if entry.slot_full { 0 } else { self.spillable(entry) };
            if take == 0 {
                continue;
            }
            let records = &entry.records[..take];
            projected -= records.iter().map(|r| record_cost_bytes(r)).sum::<u64>();
            tasks.push(SpillTask {
                page,
                through_lsn: records[take - 1].lsn,
                records: records.to_vec(),
                to: self.spill_to,
            });
        }
        tasks
    }

    /// How many of the page's oldest records in memory may leave it: all of them with slots
    /// off; with slots on, as many as fit what its slot has left, whole-page records too large
    /// for a slot going to the log alone and taking no room.
    fn spillable(&self, entry: &PageRecords) -> usize {
        if self.spill_to == SpillTo::Log {
            return entry.records.len();
        }
        let mut room = (SLOT_RECORD_BYTES as u64).saturating_sub(entry.slot_bytes());
        let mut take = 0;
        for record in &entry.records {
            if !spills_to_log(self.spill_to, record) {
                let len = encoded_record_len(record) as u64;
                if len > room {
                    break;
                }
                room -= len;
            }
            take += 1;
        }
        take
    }

    /// The page's records in memory up to `through_lsn` are now in its slot (or, with slots
    /// off, left to the redo log): they leave memory, so the cache's byte count falls, and a
    /// stub of each is kept so reads know when they need them. Records already materialized
    /// meanwhile are gone and simply not moved; a report for records no longer in memory
    /// changes nothing.
    pub fn spilled(&mut self, page: u64, through_lsn: Lsn) {
        let Some(entry) = self.pages.get_mut(&page) else { return };
        let moved = entry.records.partition_point(|r| r.lsn <= through_lsn);
        if moved == 0 {
            return;
        }
        let oldest_before = entry.oldest().expect("a page entry holds records");
        self.oldest.remove(&(oldest_before, page));
        self.oldest_in_memory.remove(&(entry.records[0].lsn, page));
        for record in entry.records.drain(..moved) {
            self.cached_bytes -= record_cost_bytes(&record);
            self.cached_records -= 1;
            if !injected(Bug::SpillForgetsRecords) {
                entry.spilled.push(SpilledRecord::of(self.spill_to, &record));
                self.spilled_records += 1;
            }
        }
        if let Some(first) = entry.records.first() {
            self.oldest_in_memory.insert((first.lsn, page));
        }
        match entry.oldest() {
            Some(oldest) => {
                self.oldest.insert((oldest, page));
            }
            None => {
                self.pages.remove(&page);
            }
        }
    }

    /// A merge into the page's slot overflowed: its records stay in memory, and it is not asked
    /// to spill again until a fold frees room in its slot. The owner folds it when the fold
    /// bound allows.
    pub fn slot_full(&mut self, page: u64) {
        if let Some(entry) = self.pages.get_mut(&page) {
            entry.slot_full = true;
        }
    }

    /// Pages whose slot overflowed and that still hold records in memory: the ones a fold, or
    /// an extra image above LSN_min for lagging readers, would relieve.
    pub fn pages_with_full_slots(&self) -> impl Iterator<Item = u64> + '_ {
        self.pages.iter().filter(|(_, e)| e.slot_full && !e.records.is_empty()).map(|(&page, _)| page)
    }

    /// With slots on, the pages whose records cannot leave memory for their slot (it is full,
    /// or has no room for the oldest record in memory), in the order pages spill, as many as
    /// it takes for the cache to hold at most `max_bytes` if each let all of its records go:
    /// each is to be materialized as far as the fold bound allows and, if that leaves it
    /// stuck, to get an extra image ([`PageVersions::extra_image_task`]). None with slots off:
    /// records then always leave memory.
    pub fn pages_to_relieve(&self, max_bytes: u64) -> Vec<u64> {
        if self.spill_to == SpillTo::Log {
            return Vec::new();
        }
        let mut projected = self.cached_bytes;
        let mut pages = Vec::new();
        for &(_, page) in &self.oldest_in_memory {
            if projected <= max_bytes {
                break;
            }
            let entry = &self.pages[&page];
            if entry.slot_full || self.spillable(entry) == 0 {
                pages.push(page);
                projected = projected.saturating_sub(entry.records.iter().map(|r| record_cost_bytes(r)).sum());
            }
        }
        pages
    }

    /// Whether `page` has records in memory that cannot leave it for its slot (slots on): its
    /// slot is full, or has no room for the oldest of them.
    pub fn slot_stuck(&self, page: u64) -> bool {
        self.spill_to == SpillTo::Slots
            && self.pages.get(&page).is_some_and(|e| !e.records.is_empty() && (e.slot_full || self.spillable(e) == 0))
    }

    /// The extra image that relieves `page` (seed 000 §3.3.3, the overflow rule): the page as
    /// of its oldest record in memory, which is above the fold bound (a fold would do
    /// otherwise), with the records its slot holds. `None` when it has no record in memory, or
    /// its oldest one is at or below the fold bound: fold it instead.
    pub fn extra_image_task(&self, page: u64) -> Option<ExtraImageTask> {
        let entry = self.pages.get(&page)?;
        let lsn = entry.records.first()?.lsn;
        if lsn <= self.fold_bound() {
            return None;
        }
        // The image is built as a fold to `lsn` would build it, from the store's image.
        let through = if injected(Bug::ExtraImageAtWrongLsn) { entry.records.last()?.lsn } else { lsn };
        let plan = plan_through(self.page_state_of(page, entry), through);
        let memory = &entry.records[..entry.records.partition_point(|r| r.lsn <= through)];
        let build = FoldTask { page, through_lsn: through, records: memory.to_vec(), spilled: plan.spilled };
        let slot_lsns = entry.spilled.iter().filter(|s| s.in_slot()).map(|s| s.lsn).collect();
        Some(ExtraImageTask { page, lsn, build, slot_lsns })
    }

    /// The extra image of `task` is in image cell `cell`, with the records its slot held: those
    /// are now the cell's, the record at the image's LSN leaves memory (the image stands for
    /// it), and the slot takes spills again. The owner then empties the slot. False, and
    /// nothing changes, when the page's oldest record in memory is no longer the image's (a
    /// fold got there first): the owner frees the cell.
    pub fn extra_image_written(&mut self, task: &ExtraImageTask, cell: u32) -> bool {
        let page = task.page;
        let Some(entry) = self.pages.get_mut(&page) else { return false };
        if entry.records.first().map(|r| r.lsn) != Some(task.lsn)
            || entry.spilled.iter().filter(|s| s.in_slot()).map(|s| s.lsn).ne(task.slot_lsns.iter().copied())
        {
            return false;
        }
        let oldest_before = entry.oldest().expect("a page entry holds records");
        self.oldest.remove(&(oldest_before, page));
        self.oldest_in_memory.remove(&(task.lsn, page));
        for stub in entry.spilled.iter_mut().filter(|s| s.in_slot()) {
            stub.held = Held::CellRecords(cell);
        }
        let record = entry.records.remove(0);
        self.cached_bytes -= record_cost_bytes(&record);
        self.cached_records -= 1;
        entry.spilled.push(SpilledRecord::extra_image(task.lsn, cell));
        self.spilled_records += 1;
        entry.slot_full = false;
        if let Some(first) = entry.records.first() {
            self.oldest_in_memory.insert((first.lsn, page));
        }
        self.oldest.insert((entry.oldest().expect("the image's stub"), page));
        true
    }
}

/// An extra image to write (seed 000 §3.3.3): build the page as `build` says (a fold's task
/// to `lsn`, rebuilt the same way), read the records at `slot_lsns` from the page's slot, write
/// both to a free image cell (`SlotArea::write_cell`), report
/// [`PageVersions::extra_image_written`], then empty the slot. The owner does this under the
/// same lock as its spills and folds, and tells the index while it holds its readers off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtraImageTask {
    pub page: u64,
    /// The image's LSN: the page's oldest record in memory, above LSN_min.
    pub lsn: Lsn,
    pub build: FoldTask,
    /// The records the page's slot holds, which move to the cell.
    pub slot_lsns: Vec<Lsn>,
}
