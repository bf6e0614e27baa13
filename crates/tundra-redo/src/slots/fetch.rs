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
    /// The records read: the slot's, or the page's records in the log ranges. Give them to
    /// `ReadPlan::rebuild_with` or `FoldTask::rebuild`, which take the ones the plan names.
    pub records: Vec<RedoRecord>,
    /// Slot reads done (one, or none for a log read).
    pub slot_reads: u32,
    /// Batches read back from the redo log, each one or more block reads.
    pub log_batches: u32,
    /// Why the slot could not be used, when its records came from the log instead.
    pub slot_error: Option<Error>,
}

/// Reads what `read` names: from `slots` for a slot read (falling back on the log's ranges
/// when the slot fails its checks), from `log` for a log read. An owner without slots (`None`)
/// only ever plans log reads; a slot read then is a caller's bug, answered `Invalid`.
pub fn fetch(read: &SpillRead, slots: Option<&SlotArea>, log: &RedoLog) -> Result<Fetched> {
    match read {
        SpillRead::Slot { page, from_log: in_log, .. } => match slots
            .ok_or_else(|| Error::invalid(format!("a read of page {page}'s log slot, but the stream has no slots")))?
            .read(*page)
        {
            Ok(records) => {
                // Whole pages too large for the slot come from the log, beside it.
                let in_log: Vec<_> = in_log.iter().copied().collect();
                let mut fetched = from_log(*page, &log_ranges(&in_log), log)?;
                fetched.records.extend(records);
                fetched.slot_reads = 1;
                Ok(fetched)
            }
            Err(error) => {
                let mut fetched = from_log(*page, &read.log_ranges(), log)?;
                fetched.slot_reads = 1;
                fetched.slot_error = Some(error);
                Ok(fetched)
            }
        },
        SpillRead::Log { page, ranges, .. } => from_log(*page, ranges, log),
    }
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
