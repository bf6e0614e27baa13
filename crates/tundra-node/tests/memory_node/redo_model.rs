//! The model the redo tests check reads against: every record the writer had acknowledged, so
//! any page can be rebuilt at any LSN.

use std::collections::BTreeMap;

use tundra_redo::{RedoRecord, reconstruct};
use tundra_store::ids::Lsn;

/// The pages of the redo tests' volumes.
pub const PAGE: usize = 8192;

#[derive(Default)]
pub struct Model {
    pub records: BTreeMap<u64, Vec<RedoRecord>>,
}

impl Model {
    /// Notes acknowledged records.
    pub fn add(&mut self, records: impl IntoIterator<Item = RedoRecord>) {
        for record in records {
            self.records.entry(record.page).or_default().push(record);
        }
    }

    /// The page as of `lsn`.
    pub fn page_at(&self, page: u64, lsn: Lsn) -> Vec<u8> {
        let records: Vec<&RedoRecord> =
            self.records.get(&page).map(|r| r.iter().filter(|r| r.lsn <= lsn).collect()).unwrap_or_default();
        reconstruct::<&RedoRecord>(None, &records, lsn, PAGE).expect("acknowledged records apply")
    }

    /// The LSN of the page's last change at or below `lsn` (0: never changed).
    pub fn page_lsn(&self, page: u64, lsn: Lsn) -> Lsn {
        self.records.get(&page).and_then(|r| r.iter().rev().find(|r| r.lsn <= lsn)).map_or(Lsn(0), |r| r.lsn)
    }
}
