//! [`PageVersions::invariant_problem`]: every relation between the index's parts, checked the
//! slow way, for tests and simulation to call after every event.

use std::collections::BTreeSet;

use tundra_store::ids::Lsn;

use super::{PageRecords, PageVersions, record_cost_bytes};
use crate::slots::SLOT_RECORD_BYTES;
use crate::versions::SpillTo;

impl PageVersions {
    /// What is wrong with the index, if anything.
    pub fn invariant_problem(&self) -> Option<String> {
        if self.complete_lsn > self.durable_lsn {
            return Some(format!("complete LSN {} above durable {}", self.complete_lsn, self.durable_lsn));
        }
        let (mut bytes, mut count, mut spilled) = (0u64, 0u64, 0u64);
        for (&page, entry) in &self.pages {
            if let Some(problem) = self.page_problem(page, entry) {
                return Some(problem);
            }
            bytes += entry.records.iter().map(|r| record_cost_bytes(r)).sum::<u64>();
            count += entry.records.len() as u64;
            spilled += entry.spilled.len() as u64;
        }
        let oldest: BTreeSet<(Lsn, u64)> =
            self.pages.iter().filter_map(|(&page, e)| e.oldest().map(|lsn| (lsn, page))).collect();
        if oldest != self.oldest {
            return Some(format!("the flush list {:?} is not the pages' oldest records {oldest:?}", self.oldest));
        }
        let in_memory: BTreeSet<(Lsn, u64)> =
            self.pages.iter().filter_map(|(&page, e)| e.records.first().map(|r| (r.lsn, page))).collect();
        if in_memory != self.oldest_in_memory {
            return Some(format!(
                "the spill order {:?} is not the pages' oldest records in memory {in_memory:?}",
                self.oldest_in_memory
            ));
        }
        if (bytes, count, spilled) != (self.cached_bytes, self.cached_records, self.spilled_records) {
            return Some(format!(
                "counted {} records of {} bytes and {} spilled, hold {count} of {bytes} and {spilled}",
                self.cached_records, self.cached_bytes, self.spilled_records
            ));
        }
        None
    }

    fn page_problem(&self, page: u64, entry: &PageRecords) -> Option<String> {
        let Some(first) = entry.oldest() else {
            return Some(format!("page {page} has an entry and no records"));
        };
        let spilled_lsns = entry.spilled.iter().map(|s| s.lsn);
        let lsns: Vec<Lsn> = spilled_lsns.chain(entry.records.iter().map(|r| r.lsn)).collect();
        if lsns.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Some(format!("page {page}: records out of LSN order, or spilled ones newer than those in memory"));
        }
        if let Some(bad) = entry.records.iter().find(|r| r.page != page) {
            return Some(format!("page {page} holds a record of page {}", bad.page));
        }
        if entry.materialized.is_some_and(|m| first <= m) {
            return Some(format!("page {page}: a record at {first} is already in its image"));
        }
        let last = lsns[lsns.len() - 1];
        if last > self.complete_lsn || page >= self.page_count {
            return Some(format!("page {page}: a record at {last} past the stream or the volume"));
        }
        if self.spill_to == SpillTo::Slots && entry.slot_bytes() > SLOT_RECORD_BYTES as u64 {
            return Some(format!("page {page}: {} bytes of spilled records cannot fit its slot", entry.slot_bytes()));
        }
        None
    }
}
