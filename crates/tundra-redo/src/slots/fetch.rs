//! [`fetch`]: the records a plan's spilled part names, read from where the plan says: the
//! page's log slot (one read), or the redo log's ranges (the baseline without slots). A slot
//! that fails its checks is not the end of the read: its records are still in the redo log
//! (it keeps every record until its page is materialized), so they are read from there.

use crate::log::RedoLog;
use crate::versions::{LsnRange, SpillRead, log_ranges};
use crate::{Error, RedoRecord, Result};

use super::SlotArea;

/// What [`fetch`] read.
#[derive(Debug, Default)]
pub struct Fetched {
    /// The records read: the slot's, a cell's, the page's records in the log ranges, and an
    /// extra image as a whole-page record at its LSN. Give them to `ReadPlan::rebuild_with` or
    /// `FoldTask::rebuild`, which take the ones the plan names.
    pub records: Vec<RedoRecord>,
    /// Slot reads done (one, or none for a log read).
    pub slot_reads: u32,
    /// Image cell reads done: an extra image, a cell's records block.
    pub cell_reads: u32,
    /// Batches read back from the redo log, each one or more block reads.
    pub log_batches: u32,
    /// Why the slot (or a cell's records block) could not be used, when its records came from
    /// the log instead.
    pub slot_error: Option<Error>,
}

impl Fetched {
    /// Device reads this took: slots, cells and log batches.
    pub fn device_reads(&self) -> u32 {
        self.slot_reads + self.cell_reads + self.log_batches
    }
}

/// Reads what `read` names: from `slots` for a slot read (its start from the log or an image
/// cell, the records after it from the slot or a cell's records block, falling back on the
/// log's ranges when those fail their checks), from `log` for a log read. An owner without
/// slots (`None`) only ever plans log reads; a slot read then is a caller's bug, answered
/// `Invalid`. An extra image that fails its checks is `Corrupted`: the log holds the records it
/// stands for, but not as one record a rebuild could start from.
pub fn fetch(read: &SpillRead, slots: Option<&SlotArea>, log: &RedoLog) -> Result<Fetched> {
    let (page, from_log_lsn, records_cell) = match read {
        SpillRead::Slot { page, from_log, records_cell, .. } => (*page, *from_log, *records_cell),
        SpillRead::Log { page, ranges, .. } => return from_log(*page, ranges, log),
    };
    let slots = slots
        .ok_or_else(|| Error::invalid(format!("a read of page {page}'s log slot, but the stream has no slots")))?;
    // Where the rebuild starts, when that is not in the slot: a whole page kept in the log, or
    // an extra image.
    let mut fetched = match from_log_lsn {
        Some(lsn) => from_log(page, &log_ranges(&[lsn]), log)?,
        None => Fetched::default(),
    };
    if let Some((cell, lsn)) = read.image() {
        let bytes = slots.read_cell_image(cell, page, lsn)?;
        fetched.cell_reads += 1;
        fetched.records.push(RedoRecord { lsn, page, payload: crate::Payload::Image(bytes) });
    }
    // The records after it, from their one place.
    let rest = read.rest_lsns();
    if rest.is_empty() {
        return Ok(fetched);
    }
    let records = match records_cell {
        Some(cell) => {
            fetched.cell_reads += 1;
            slots.read_cell_records(cell, page)
        }
        None => {
            fetched.slot_reads += 1;
            slots.read(page)
        }
    };
    match records {
        Ok(records) => fetched.records.extend(records),
        Err(error) => {
            // Every record after the start is still in the redo log.
            let again = from_log(page, &log_ranges(rest), log)?;
            fetched.records.extend(again.records);
            fetched.log_batches += again.log_batches;
            fetched.slot_error = Some(error);
        }
    }
    Ok(fetched)
}

/// `page`'s records in each range, read back from the log batch by batch.
fn from_log(page: u64, ranges: &[LsnRange], log: &RedoLog) -> Result<Fetched> {
    let mut fetched = Fetched::default();
    for range in ranges {
        for batch in log.read_after(range.after)? {
            let batch = batch?;
            fetched.log_batches += 1;
            let records = batch.records.into_iter().filter(|r| r.page == page && r.lsn <= range.through);
            fetched.records.extend(records);
            if batch.end_lsn >= range.through {
                break;
            }
        }
    }
    Ok(fetched)
}
