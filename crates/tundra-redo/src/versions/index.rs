//! [`PageVersions`]: one volume's redo as the pages see it. For each page with records the
//! store's image does not hold yet, those records in LSN order: the newer ones held in memory
//! (shared references to the records of the batches; the byte count tells the owner when to
//! spill them or slow the writer down), the older ones spilled to the page's log slot, or left
//! only in the redo log when slots are off (a stub of each stays here: spilled.rs). And the
//! volume's watermarks:
//!
//! - the durable LSN: every record at or below it is durable in the redo stream (D2);
//! - the complete LSN: every record at or below it has been handed to this index, so any
//!   version up to it can be built. It advances with every batch, also for pages that get no
//!   records (D5), so a read of an idle page never waits for a change that will not come;
//! - LSN_min: the oldest LSN a reader may still read at (from the reader leases).
//!
//! Events and decisions, each a method:
//!
//! | event or question           | what it does or answers                                     |
//! |-----------------------------|-------------------------------------------------------------|
//! | `records_durable(rs, end)`  | a batch is durable: its records join their pages, complete  |
//! |                             | and durable move to `end`                                   |
//! | `durable(lsn)`              | the stream is durable further than this index has records   |
//! | `set_lsn_min(lsn)`          | LSN_min moves (forward only)                                |
//! | `fold_candidates(limit)`    | pages to materialize, oldest record first, up to the fold   |
//! |                             | bound min(LSN_min, durable) and never above it (D6)         |
//! | `materialized(page, lsn)`   | the store holds the page as of `lsn`: records up to it drop |
//! |                             | (answering what to clear of the page's slot)                |
//! | `spill_candidates(bytes)`   | pages whose oldest records leave memory, until the cache    |
//! |                             | holds at most `bytes` (spill.rs)                            |
//! | `spilled(page, lsn)`        | the page's records up to `lsn` are in its slot (or left to  |
//! |                             | the log): dropped from memory, a stub of each kept          |
//! | `slot_full(page)`           | a merge into the page's slot did not fit: spill it no more  |
//! |                             | until it is materialized or gets an extra image             |
//! | `pages_to_relieve(bytes)`   | pages whose records cannot leave memory for their slot      |
//! | `extra_image_task(page)`    | an extra image above LSN_min for a page whose slot is full  |
//! | `extra_image_written(..)`   | it is in an image cell with the slot's records: the record  |
//! |                             | it stands for leaves memory, the slot is free again         |
//! | `get_page(page, img, req)`  | the GetPage@LSN decision (serve.rs) on this page's state    |
//!
//! Folding never passes LSN_min, so every version a live reader may ask for stays buildable
//! from the stored image, the spilled records and the records here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tundra_store::ids::Lsn;
use tundra_store::store::Watermarks;

use super::apply::check_payload;
use super::serve::{Decision, GetPage, Horizon, PageState, Spilled, combine, decide, decide_many, plan_through};
use super::spilled::{SpillRead, SpillTo, SpilledRecord};
use super::{Bug, injected};
use crate::record::{Payload, RedoRecord};
use crate::{Error, Result};

/// The memory a record held here costs, in bytes: the record, its reference count and the
/// slot in its page's list, plus its payload's bytes and range headers. What the cache bound
/// and backpressure count.
pub fn record_cost_bytes(record: &RedoRecord) -> u64 {
    const FIXED: usize =
        std::mem::size_of::<RedoRecord>() + 2 * std::mem::size_of::<usize>() + std::mem::size_of::<Arc<RedoRecord>>();
    let payload = match &record.payload {
        Payload::Image(bytes) => bytes.len(),
        Payload::Ranges(ranges) => {
            ranges.iter().map(|(_, bytes)| std::mem::size_of::<(u32, Vec<u8>)>() + bytes.len()).sum()
        }
    };
    (FIXED + payload) as u64
}

/// A page to materialize: read the spilled records `spilled` names (if any), apply them and
/// `records` (all at or below `through_lsn`) to the image the store holds
/// ([`FoldTask::rebuild`]), store the result as the page at `through_lsn`, then report
/// [`PageVersions::materialized`]. Records the stored image already holds are skipped by
/// [`super::reconstruct`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldTask {
    pub page: u64,
    /// The LSN of the last record folded: the new image's page LSN.
    pub through_lsn: Lsn,
    /// The records held in memory to fold, after the spilled ones.
    pub records: Vec<Arc<RedoRecord>>,
    /// The spilled records to fold, and where to read them; `None` when the fold needs none.
    pub spilled: Option<SpillRead>,
}

impl FoldTask {
    /// The page as of `through_lsn` from `base` (the store's image: its LSN and bytes, `None`
    /// for a page it does not hold) and `fetched`, what was read as `spilled` says.
    pub fn rebuild(&self, base: Option<(Lsn, &[u8])>, fetched: &[RedoRecord], page_size: usize) -> Result<Vec<u8>> {
        let records = combine(self.spilled.as_ref(), fetched, &self.records)?;
        super::reconstruct(base, &records, self.through_lsn, page_size)
    }
}

/// What the owner does to a page's log slot once the page is materialized: nothing (the slot
/// held none of the records dropped, or slots are off), empty it, or drop its records up to
/// an LSN. A slot left holding folded records is harmless to reads (they skip records at or
/// below the image) but fills up, and a full slot takes no more spills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotCleanup {
    Keep,
    Clear,
    ClearThrough(Lsn),
}

/// One page's records not yet in the store's image.
#[derive(Debug, Default)]
struct PageRecords {
    /// The LSN of the last image this index was told of (`None`: the store's image predates
    /// the records, or there is none).
    materialized: Option<Lsn>,
    /// What is kept of the records that left memory, strictly increasing LSNs, all below the
    /// first record in memory.
    spilled: Vec<SpilledRecord>,
    /// The records in memory, strictly increasing LSNs. `spilled` and `records` are never both
    /// empty: a page without records has no entry.
    records: Vec<Arc<RedoRecord>>,
    /// A merge into the page's slot found no room: no spill is asked for until a fold frees it.
    slot_full: bool,
}

impl PageRecords {
    /// The LSN of the page's oldest record not materialized, spilled or in memory.
    fn oldest(&self) -> Option<Lsn> {
        self.spilled.first().map(|s| s.lsn).or(self.records.first().map(|r| r.lsn))
    }

    /// Bytes of records the page's slot holds, as far as this index knows.
    fn slot_bytes(&self) -> u64 {
        self.spilled.iter().filter(|s| s.in_slot()).map(|s| u64::from(s.encoded_bytes)).sum()
    }
}

/// One volume's page versions (see the module's table).
#[derive(Debug)]
pub struct PageVersions {
    page_size: usize,
    page_count: u64,
    pages: BTreeMap<u64, PageRecords>,
    /// `(oldest record's LSN, page)` of every page with records, spilled ones included: the
    /// flush list, which gives the oldest page to fold and the LSN up to which everything is
    /// materialized.
    oldest: BTreeSet<(Lsn, u64)>,
    /// `(oldest LSN in memory, page)` of every page with records in memory: the order in which
    /// pages spill.
    oldest_in_memory: BTreeSet<(Lsn, u64)>,
    spill_to: SpillTo,
    cached_bytes: u64,
    cached_records: u64,
    spilled_records: u64,
    durable_lsn: Lsn,
    complete_lsn: Lsn,
    lsn_min: Lsn,
    /// Image cells no record or image of the index names any more, since folds dropped them:
    /// the owner frees them ([`PageVersions::take_freed_cells`]).
    freed_cells: Vec<u32>,
}

impl PageVersions {
    /// An index with no records over a volume of `page_count` pages of `page_size` bytes,
    /// whose stream is complete and durable to `marks.durable_lsn` (everything before is in the
    /// store's images) and whose readers read at or above `marks.min_reader_lsn`.
    pub fn new(page_size: usize, page_count: u64, marks: Watermarks) -> PageVersions {
        assert!(page_size > 0, "pages have bytes");
        PageVersions {
            page_size,
            page_count,
            pages: BTreeMap::new(),
            oldest: BTreeSet::new(),
            oldest_in_memory: BTreeSet::new(),
            spill_to: SpillTo::default(),
            cached_bytes: 0,
            cached_records: 0,
            spilled_records: 0,
            durable_lsn: marks.durable_lsn,
            complete_lsn: marks.durable_lsn,
            lsn_min: marks.min_reader_lsn,
            freed_cells: Vec::new(),
        }
    }

    /// The same index with records leaving memory to `to`: slots (the default), or only the
    /// redo log (slots off). Chosen before any record arrives, since a page's spilled records
    /// must all be in the one place.
    pub fn spilling_to(mut self, to: SpillTo) -> PageVersions {
        assert!(self.pages.is_empty(), "where records spill is chosen before they arrive");
        self.spill_to = to;
        self
    }

    pub fn spill_to(&self) -> SpillTo {
        self.spill_to
    }

    /// The volume grew to `page_count` pages (volumes never shrink while they have a stream).
    pub fn grow(&mut self, page_count: u64) {
        assert!(page_count >= self.page_count, "a volume with a redo stream shrank");
        self.page_count = page_count;
    }

    /// A batch is durable: `records` (strictly increasing LSNs, all above the complete LSN and
    /// at or below `end_lsn`) join their pages, and the complete and durable LSNs move to
    /// `end_lsn`, with or without records. A record that breaks a rule refuses the whole batch
    /// and changes nothing.
    pub fn records_durable(&mut self, records: Vec<Arc<RedoRecord>>, end_lsn: Lsn) -> Result<()> {
        self.check_batch(&records, end_lsn)?;
        for record in records {
            self.cached_bytes += record_cost_bytes(&record);
            self.cached_records += 1;
            let entry = self.pages.entry(record.page).or_default();
            if entry.records.is_empty() {
                self.oldest_in_memory.insert((record.lsn, record.page));
                if entry.spilled.is_empty() {
                    self.oldest.insert((record.lsn, record.page));
                }
            }
            entry.records.push(record);
        }
        self.complete_lsn = end_lsn;
        self.durable_lsn = self.durable_lsn.max(end_lsn);
        Ok(())
    }

    fn check_batch(&self, records: &[Arc<RedoRecord>], end_lsn: Lsn) -> Result<()> {
        if end_lsn < self.complete_lsn {
            return Err(Error::invalid(format!(
                "a batch ending at LSN {end_lsn}, below the complete LSN {}",
                self.complete_lsn
            )));
        }
        let mut previous = self.complete_lsn;
        for record in records {
            if record.lsn <= previous || record.lsn > end_lsn {
                return Err(Error::invalid(format!(
                    "a record at LSN {} after LSN {previous} in a batch ending at {end_lsn}",
                    record.lsn
                )));
            }
            if record.page >= self.page_count {
                return Err(Error::invalid(format!(
                    "the record at LSN {} is for page {}, outside the volume's {} pages",
                    record.lsn, record.page, self.page_count
                )));
            }
            check_payload(&record.payload, self.page_size)
                .map_err(|e| Error::invalid(format!("the record at LSN {}: {}", record.lsn, e.message())))?;
            previous = record.lsn;
        }
        Ok(())
    }

    /// The redo stream is durable to `lsn`, further than the records handed here (recovery
    /// learns the stream's end before it has re-read the tail). Forward only.
    pub fn durable(&mut self, lsn: Lsn) {
        self.durable_lsn = self.durable_lsn.max(lsn);
    }

    /// LSN_min moved to `lsn`. It only moves forward: an older value is ignored.
    pub fn set_lsn_min(&mut self, lsn: Lsn) {
        self.lsn_min = self.lsn_min.max(lsn);
    }

    /// The highest LSN a page may be folded to: min(LSN_min, durable) (D3, D6).
    pub fn fold_bound(&self) -> Lsn {
        if injected(Bug::FoldAboveLsnMin) {
            return self.durable_lsn;
        }
        self.lsn_min.min(self.durable_lsn)
    }

    /// Up to `limit` pages to materialize, those holding the oldest records first, each with
    /// its records at or below the fold bound (and, when it needs spilled ones, where to read
    /// them). Pages whose records are all above the bound are not candidates: their versions
    /// are still readable by some reader.
    pub fn fold_candidates(&self, limit: usize) -> Vec<FoldTask> {
        self.fold_pages(limit).into_iter().filter_map(|page| self.fold_task(page)).collect()
    }

    /// The pages [`PageVersions::fold_candidates`] would fold, without building their tasks:
    /// for an owner that asks [`PageVersions::fold_task`] page by page.
    pub fn fold_pages(&self, limit: usize) -> Vec<u64> {
        let bound = self.fold_bound();
        self.oldest.iter().take_while(|&&(oldest, _)| oldest <= bound).take(limit).map(|&(_, page)| page).collect()
    }

    /// The fold of one page as things stand now: `None` when it has no record at or below the
    /// fold bound (nothing to fold, or another fold did it meanwhile). An owner that folds
    /// pages one at a time while others may fold or spill asks again for each page, so a task
    /// never names spilled records a fold has since dropped.
    pub fn fold_task(&self, page: u64) -> Option<FoldTask> {
        let bound = self.fold_bound();
        let entry = self.pages.get(&page)?;
        if entry.oldest().is_none_or(|oldest| oldest > bound) {
            return None;
        }
        let plan = plan_through(self.page_state_of(page, entry), bound);
        let through_lsn = match entry.records.iter().rev().find(|r| r.lsn <= bound) {
            Some(record) => record.lsn,
            None => entry.spilled.iter().rev().find(|s| s.lsn <= bound).expect("the oldest record is foldable").lsn,
        };
        let memory = &entry.records[..entry.records.partition_point(|r| r.lsn <= bound)];
        Some(FoldTask { page, through_lsn, records: memory.to_vec(), spilled: plan.spilled })
    }

    /// The store now holds `page` as of `lsn` (durably: the records are dropped, and only the
    /// image keeps their effect). `lsn` is at most the fold bound. A report older than one
    /// already made is ignored, so reports may arrive out of order. Answers what to do with
    /// the page's slot: the spilled records folded leave it.
    pub fn materialized(&mut self, page: u64, lsn: Lsn) -> SlotCleanup {
        let bound = self.fold_bound();
        assert!(lsn <= bound, "page {page} materialized at LSN {lsn}, above the fold bound {bound}");
        let Some(entry) = self.pages.get_mut(&page) else { return SlotCleanup::Keep };
        if entry.materialized.is_some_and(|known| known >= lsn) {
            return SlotCleanup::Keep;
        }
        entry.materialized = Some(lsn);
        let spilled_folded = entry.spilled.partition_point(|s| s.lsn <= lsn);
        let folded = entry.records.partition_point(|r| r.lsn <= lsn);
        if spilled_folded == 0 && folded == 0 {
            return SlotCleanup::Keep;
        }
        let oldest_before = entry.oldest().expect("a page entry holds records");
        self.oldest.remove(&(oldest_before, page));
        if folded > 0 {
            self.oldest_in_memory.remove(&(entry.records[0].lsn, page));
        }
        let dropped_cells: BTreeSet<u32> = entry.spilled.drain(..spilled_folded).filter_map(|s| s.cell()).collect();
        let kept_cells: BTreeSet<u32> = entry.spilled.iter().filter_map(|s| s.cell()).collect();
        self.freed_cells.extend(dropped_cells.difference(&kept_cells));
        self.spilled_records -= spilled_folded as u64;
        for record in entry.records.drain(..folded) {
            self.cached_bytes -= record_cost_bytes(&record);
            self.cached_records -= 1;
        }
        if folded > 0
            && let Some(first) = entry.records.first()
        {
            self.oldest_in_memory.insert((first.lsn, page));
        }
        let cleanup = match (self.spill_to, spilled_folded, entry.spilled.is_empty()) {
            (SpillTo::Log, _, _) | (SpillTo::Slots, 0, _) => SlotCleanup::Keep,
            (SpillTo::Slots, _, true) => SlotCleanup::Clear,
            (SpillTo::Slots, _, false) => SlotCleanup::ClearThrough(lsn),
        };
        if spilled_folded > 0 {
            entry.slot_full = false;
        }
        match entry.oldest() {
            Some(oldest) => {
                self.oldest.insert((oldest, page));
            }
            None => {
                self.pages.remove(&page);
            }
        }
        cleanup
    }

    /// The image cells folds have left unnamed since the last call: the owner frees them once
    /// no read can still be using them (it holds its readers off while it folds).
    pub fn take_freed_cells(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.freed_cells)
    }

    /// Every record at or below this LSN is in a materialized image: the stream is no longer
    /// needed up to it for this index's pages (D6: truncation also waits for every replica).
    pub fn materialized_through(&self) -> Lsn {
        // Spilled records count: a slot is a cache of the stream, never the only copy.
        let flush_list = if injected(Bug::TruncatePastSpilled) { &self.oldest_in_memory } else { &self.oldest };
        match flush_list.first() {
            Some(&(oldest, _)) => Lsn(oldest.0 - 1),
            None => self.complete_lsn,
        }
    }

    /// The page's records not in the store's image held in memory, sorted by LSN (empty for
    /// most pages).
    pub fn records(&self, page: u64) -> &[Arc<RedoRecord>] {
        self.pages.get(&page).map_or(&[], |entry| &entry.records)
    }

    /// What is kept of the page's records that left memory, sorted by LSN.
    pub fn spilled_of(&self, page: u64) -> &[SpilledRecord] {
        self.pages.get(&page).map_or(&[], |entry| &entry.spilled)
    }

    /// The page as this index alone knows it: from the last image it was told of.
    fn page_state_of<'a>(&'a self, page: u64, entry: &'a PageRecords) -> PageState<'a> {
        PageState {
            image_lsn: entry.materialized,
            records: &entry.records,
            spilled: Spilled { page, to: self.spill_to, records: &entry.spilled },
        }
    }

    /// The page as reads see it: the store's image, at `stored_image_lsn` (the page's LSN in
    /// the store's index, `None` when it holds none), and the records here. The owner reads the
    /// store's entry and this index together (one lock, or a pin): once this index hears of a
    /// newer image it drops the records an older image would need.
    pub fn page_state(&self, page: u64, stored_image_lsn: Option<Lsn>) -> PageState<'_> {
        if let Some(known) = self.pages.get(&page).and_then(|entry| entry.materialized) {
            assert!(
                stored_image_lsn >= Some(known),
                "page {page}: the store's image at {stored_image_lsn:?} is older than the one materialized at {known}"
            );
        }
        match self.pages.get(&page) {
            Some(entry) => PageState { image_lsn: stored_image_lsn, ..self.page_state_of(page, entry) },
            None => PageState { image_lsn: stored_image_lsn, ..PageState::default() },
        }
    }

    /// The watermarks reads are decided against.
    pub fn horizon(&self) -> Horizon {
        Horizon { complete_lsn: self.complete_lsn, lsn_min: self.lsn_min }
    }

    /// GetPage@LSN on one page (serve.rs); a page outside the volume is a bad request.
    pub fn get_page(&self, page: u64, stored_image_lsn: Option<Lsn>, request: GetPage) -> Decision {
        if page >= self.page_count {
            return Decision::BadRequest { reason: "a page outside the volume" };
        }
        decide(request, self.horizon(), self.page_state(page, stored_image_lsn))
    }

    /// GetPage@LSN on many pages at one read point: `pages` are `(page, stored image LSN)`.
    // A refusal is a `Decision` by value, as a served read is: a read's answer is built once and
    // moved once, and boxing it would cost an allocation per read for the sake of the rare refusal.
    #[allow(clippy::result_large_err)]
    pub fn get_pages(
        &self,
        pages: &[(u64, Option<Lsn>)],
        request: GetPage,
    ) -> std::result::Result<(Lsn, Vec<Decision>), Decision> {
        if pages.iter().any(|&(page, _)| page >= self.page_count) {
            return Err(Decision::BadRequest { reason: "a page outside the volume" });
        }
        decide_many(request, self.horizon(), pages.iter().map(|&(page, stored)| self.page_state(page, stored)))
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn page_count(&self) -> u64 {
        self.page_count
    }

    pub fn durable_lsn(&self) -> Lsn {
        self.durable_lsn
    }

    pub fn complete_lsn(&self) -> Lsn {
        self.complete_lsn
    }

    pub fn lsn_min(&self) -> Lsn {
        self.lsn_min
    }

    /// Bytes of memory the records held here cost ([`record_cost_bytes`]): the unapplied redo
    /// that backpressure bounds (D8).
    pub fn cached_bytes(&self) -> u64 {
        self.cached_bytes
    }

    pub fn cached_records(&self) -> u64 {
        self.cached_records
    }

    /// Records that left memory and are not materialized yet (a stub of each is kept here).
    pub fn spilled_records(&self) -> u64 {
        self.spilled_records
    }

    /// Pages that have records not yet materialized.
    pub fn pages_with_records(&self) -> usize {
        self.pages.len()
    }
}

mod check;
mod spill;

pub use spill::{ExtraImageTask, SpillTask};
#[cfg(test)]
mod tests;
