//! [`PageVersions`]: one volume's redo as the pages see it. For each page with records the
//! store's image does not hold yet, those records in LSN order (shared references to the
//! records of the batches, held in memory; the byte count tells the owner when to spill them
//! to per-page slots or slow the writer down), and the volume's watermarks:
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
//! | `get_page(page, img, req)`  | the GetPage@LSN decision (serve.rs) on this page's state    |
//!
//! Folding never passes LSN_min, so every version a live reader may ask for stays buildable
//! from the stored image and the records here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tundra_store::ids::Lsn;
use tundra_store::store::Watermarks;

use super::apply::check_payload;
use super::serve::{Decision, GetPage, Horizon, PageState, decide, decide_many};
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

/// A page to materialize: apply `records` (all at or below `through_lsn`) to the image the
/// store holds, store the result as the page at `through_lsn`, then report
/// [`PageVersions::materialized`]. Records the stored image already holds are skipped by
/// [`super::reconstruct`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldTask {
    pub page: u64,
    /// The LSN of the last record folded: the new image's page LSN.
    pub through_lsn: Lsn,
    pub records: Vec<Arc<RedoRecord>>,
}

/// One page's records not yet in the store's image.
#[derive(Debug, Default)]
struct PageRecords {
    /// The LSN of the last image this index was told of (`None`: the store's image predates
    /// the records, or there is none).
    materialized: Option<Lsn>,
    /// Never empty (a page without records has no entry), strictly increasing LSNs.
    records: Vec<Arc<RedoRecord>>,
}

/// One volume's page versions (see the module's table).
#[derive(Debug)]
pub struct PageVersions {
    page_size: usize,
    page_count: u64,
    pages: BTreeMap<u64, PageRecords>,
    /// `(oldest record's LSN, page)` of every page with records: the flush list, which gives
    /// the oldest page to fold and the LSN up to which everything is materialized.
    oldest: BTreeSet<(Lsn, u64)>,
    cached_bytes: u64,
    cached_records: u64,
    durable_lsn: Lsn,
    complete_lsn: Lsn,
    lsn_min: Lsn,
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
            cached_bytes: 0,
            cached_records: 0,
            durable_lsn: marks.durable_lsn,
            complete_lsn: marks.durable_lsn,
            lsn_min: marks.min_reader_lsn,
        }
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
                self.oldest.insert((record.lsn, record.page));
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
    /// its records at or below the fold bound. Pages whose records are all above the bound are
    /// not candidates: their versions are still readable by some reader.
    pub fn fold_candidates(&self, limit: usize) -> Vec<FoldTask> {
        let bound = self.fold_bound();
        let mut tasks = Vec::new();
        for &(oldest, page) in &self.oldest {
            if oldest > bound || tasks.len() == limit {
                break;
            }
            let records = &self.pages[&page].records;
            let foldable = &records[..records.partition_point(|r| r.lsn <= bound)];
            let through_lsn = foldable.last().expect("the oldest record is foldable").lsn;
            tasks.push(FoldTask { page, through_lsn, records: foldable.to_vec() });
        }
        tasks
    }

    /// The store now holds `page` as of `lsn` (durably: the records are dropped, and only the
    /// image keeps their effect). `lsn` is at most the fold bound. A report older than one
    /// already made is ignored, so reports may arrive out of order.
    pub fn materialized(&mut self, page: u64, lsn: Lsn) {
        let bound = self.fold_bound();
        assert!(lsn <= bound, "page {page} materialized at LSN {lsn}, above the fold bound {bound}");
        let Some(entry) = self.pages.get_mut(&page) else { return };
        if entry.materialized.is_some_and(|known| known >= lsn) {
            return;
        }
        entry.materialized = Some(lsn);
        let folded = entry.records.partition_point(|r| r.lsn <= lsn);
        if folded == 0 {
            return;
        }
        self.oldest.remove(&(entry.records[0].lsn, page));
        for record in entry.records.drain(..folded) {
            self.cached_bytes -= record_cost_bytes(&record);
            self.cached_records -= 1;
        }
        match entry.records.first() {
            Some(first) => {
                self.oldest.insert((first.lsn, page));
            }
            None => {
                self.pages.remove(&page);
            }
        }
    }

    /// Every record at or below this LSN is in a materialized image: the stream is no longer
    /// needed up to it for this index's pages (D6: truncation also waits for every replica).
    pub fn materialized_through(&self) -> Lsn {
        match self.oldest.first() {
            Some(&(oldest, _)) => Lsn(oldest.0 - 1),
            None => self.complete_lsn,
        }
    }

    /// The page's records not in the store's image, sorted by LSN (empty for most pages).
    pub fn records(&self, page: u64) -> &[Arc<RedoRecord>] {
        self.pages.get(&page).map_or(&[], |entry| &entry.records)
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
        PageState { image_lsn: stored_image_lsn, records: self.records(page) }
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

    /// Pages that have records not yet materialized.
    pub fn pages_with_records(&self) -> usize {
        self.pages.len()
    }

    /// What is wrong with the index, if anything: every relation between its parts, checked
    /// the slow way (tests and simulation call it after every event).
    pub fn invariant_problem(&self) -> Option<String> {
        if self.complete_lsn > self.durable_lsn {
            return Some(format!("complete LSN {} above durable {}", self.complete_lsn, self.durable_lsn));
        }
        let (mut bytes, mut count) = (0u64, 0u64);
        for (&page, entry) in &self.pages {
            if let Some(problem) = self.page_problem(page, entry) {
                return Some(problem);
            }
            bytes += entry.records.iter().map(|r| record_cost_bytes(r)).sum::<u64>();
            count += entry.records.len() as u64;
        }
        let expected: BTreeSet<(Lsn, u64)> = self.pages.iter().map(|(&page, e)| (e.records[0].lsn, page)).collect();
        if expected != self.oldest {
            return Some(format!("the flush list {:?} is not the pages' oldest records {expected:?}", self.oldest));
        }
        if (bytes, count) != (self.cached_bytes, self.cached_records) {
            return Some(format!(
                "counted {} records of {} bytes, hold {count} of {bytes}",
                self.cached_records, self.cached_bytes
            ));
        }
        None
    }

    fn page_problem(&self, page: u64, entry: &PageRecords) -> Option<String> {
        let (Some(first), Some(last)) = (entry.records.first(), entry.records.last()) else {
            return Some(format!("page {page} has an entry and no records"));
        };
        if entry.records.windows(2).any(|pair| pair[0].lsn >= pair[1].lsn) {
            return Some(format!("page {page}: records out of LSN order"));
        }
        if let Some(bad) = entry.records.iter().find(|r| r.page != page) {
            return Some(format!("page {page} holds a record of page {}", bad.page));
        }
        if entry.materialized.is_some_and(|m| first.lsn <= m) {
            return Some(format!("page {page}: a record at {} is already in its image", first.lsn));
        }
        if last.lsn > self.complete_lsn || page >= self.page_count {
            return Some(format!("page {page}: a record at {} past the stream or the volume", last.lsn));
        }
        None
    }
}

#[cfg(test)]
mod tests;
