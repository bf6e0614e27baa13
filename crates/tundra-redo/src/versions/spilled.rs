//! Records that left memory before their page was materialized (seed 000 §3.3.3): where they
//! went, what the index keeps of each, and how a read or a fold names the ones it needs.
//!
//! With slots on ([`SpillTo::Slots`]) a page's spilled records sit together in its log slot
//! (`crate::slots`), and a rebuild fetches all of them with one read. A whole-page record too
//! large for a slot (an 8 or 16 KiB image) leaves memory for the redo log alone: a rebuild
//! starts from the newest whole-page record, so it reads that one record from the log and the
//! records after it from the slot, two reads, and needs no stored image. With slots off
//! ([`SpillTo::Log`], the paper's baseline) they are only in the redo log, and a rebuild reads
//! them back range by range, record by record in the worst case (Figure 6a). Either way the
//! index keeps a small stub of each spilled record (its LSN, whether it is a whole page, its
//! encoded length), so it still knows each page's exact history: the page LSN of any version,
//! whether a read needs the spilled records at all, and how full the slot is.

use tundra_store::ids::Lsn;

use crate::record::RedoRecord;
use crate::{Error, Result};

/// Where records go when they leave memory: a volume's choice, made when its index is built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpillTo {
    /// Into the page's log slot: one device read brings all of them back.
    #[default]
    Slots,
    /// Nowhere: they stay only in the redo log and are read back from it (slots off).
    Log,
}

/// What the index keeps of a record that left memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpilledRecord {
    pub lsn: Lsn,
    /// The record is a whole page image: a rebuild needs nothing before it.
    pub will_init: bool,
    /// Its encoded length ([`crate::codec::encoded_record_len`]): what it takes in a slot.
    pub encoded_bytes: u32,
    /// It left memory for the redo log alone, even with slots on ([`spills_to_log`]).
    pub in_log: bool,
}

impl SpilledRecord {
    pub fn of(to: SpillTo, record: &RedoRecord) -> SpilledRecord {
        let encoded_bytes = crate::codec::encoded_record_len(record);
        SpilledRecord {
            lsn: record.lsn,
            will_init: record.will_init(),
            encoded_bytes: u32::try_from(encoded_bytes).expect("a checked record's encoding fits 32 bits"),
            in_log: spills_to_log(to, record),
        }
    }
}

/// Whether `record`, leaving memory, goes to the redo log alone rather than to its page's slot:
/// always with slots off; with slots on, a whole-page record larger than a slot holds.
pub fn spills_to_log(to: SpillTo, record: &RedoRecord) -> bool {
    to == SpillTo::Log
        || (record.will_init() && crate::codec::encoded_record_len(record) > crate::slots::SLOT_RECORD_BYTES)
}

/// The LSNs `(after, through]` of a volume's redo stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LsnRange {
    pub after: Lsn,
    pub through: Lsn,
}

/// The spilled records a rebuild needs, and where to read them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpillRead {
    /// One read of `page`'s log slot and, when `from_log` names a whole-page record kept only
    /// in the redo log, one read of its batch; the records at `lsns` (`from_log` among them)
    /// are taken from what they give. A rebuild starts at its newest whole-page record, so at
    /// most one record of its window is in the log alone.
    Slot { page: u64, lsns: Vec<Lsn>, from_log: Option<Lsn> },
    /// Reads of the redo log, one per range (each range the batches that hold it), taking
    /// `page`'s records at `lsns`: the baseline without slots.
    Log { page: u64, ranges: Vec<LsnRange>, lsns: Vec<Lsn> },
}

impl SpillRead {
    /// The read of `records` (strictly increasing LSNs, at least one) of `page`: from the log
    /// when every one of them is there, else from the slot and the log for those in it.
    pub(crate) fn new(page: u64, records: &[SpilledRecord]) -> SpillRead {
        assert!(!records.is_empty(), "a spill read of no record");
        assert!(records.windows(2).all(|pair| pair[0].lsn < pair[1].lsn), "spilled LSNs out of order");
        let lsns: Vec<Lsn> = records.iter().map(|s| s.lsn).collect();
        if records.iter().all(|s| s.in_log) {
            return SpillRead::Log { page, ranges: log_ranges(&lsns), lsns };
        }
        let in_log: Vec<&SpilledRecord> = records.iter().filter(|s| s.in_log).collect();
        assert!(
            in_log.len() <= 1 && in_log.first().is_none_or(|s| s.will_init && s.lsn == lsns[0]),
            "a slot read takes from the log only the whole page it starts from"
        );
        SpillRead::Slot { page, lsns, from_log: in_log.first().map(|s| s.lsn) }
    }

    /// The record of a slot read kept in the log alone, read with the slot.
    pub fn from_log(&self) -> Option<Lsn> {
        match self {
            SpillRead::Slot { from_log, .. } => *from_log,
            SpillRead::Log { .. } => None,
        }
    }

    pub fn page(&self) -> u64 {
        match self {
            SpillRead::Slot { page, .. } | SpillRead::Log { page, .. } => *page,
        }
    }

    /// The LSNs of the records the rebuild takes, in order.
    pub fn lsns(&self) -> &[Lsn] {
        match self {
            SpillRead::Slot { lsns, .. } | SpillRead::Log { lsns, .. } => lsns,
        }
    }

    /// The log ranges that hold the records: the plan's own for a log read, and where a slot
    /// read that fails its checks finds the same records.
    pub fn log_ranges(&self) -> Vec<LsnRange> {
        match self {
            SpillRead::Slot { lsns, .. } => log_ranges(lsns),
            SpillRead::Log { ranges, .. } => ranges.clone(),
        }
    }

    /// Device reads the plan names: one for a slot and one per record it takes from the log;
    /// at least one per log range (a range spans one batch or more, and a batch one block or
    /// more).
    pub fn device_reads(&self) -> u32 {
        match self {
            SpillRead::Slot { from_log, .. } => 1 + u32::from(from_log.is_some()),
            SpillRead::Log { ranges, .. } => u32::try_from(ranges.len()).unwrap_or(u32::MAX),
        }
    }

    /// From `fetched` (what the slot or the log ranges gave; other pages' records and other
    /// LSNs are passed over), the records this read names, in LSN order. A record missing from
    /// them is `Corrupted`: the slot or the log lost it.
    pub fn pick<'a>(&self, fetched: &'a [RedoRecord]) -> Result<Vec<&'a RedoRecord>> {
        let lsns = self.lsns();
        let mut picked: Vec<&RedoRecord> =
            fetched.iter().filter(|r| r.page == self.page() && lsns.binary_search(&r.lsn).is_ok()).collect();
        picked.sort_by_key(|r| r.lsn);
        picked.dedup_by_key(|r| r.lsn);
        if picked.len() != lsns.len() {
            let missing = lsns.iter().find(|lsn| picked.binary_search_by_key(lsn, |r| &r.lsn).is_err());
            let source = match self {
                SpillRead::Slot { .. } => "its log slot",
                SpillRead::Log { .. } => "the redo log",
            };
            return Err(Error::corrupted(format!(
                "page {}: the record at LSN {} is not in {source}",
                self.page(),
                missing.copied().unwrap_or_default()
            )));
        }
        Ok(picked)
    }
}

/// Runs of consecutive LSNs as ranges: a record at `l` is the one record of `(l - 1, l]`, and
/// records at consecutive LSNs share a range, since reading one range reads the batches
/// between them anyway. Records further apart get ranges of their own: a range spanning
/// them would read every batch in between.
pub(crate) fn log_ranges(lsns: &[Lsn]) -> Vec<LsnRange> {
    let mut ranges: Vec<LsnRange> = Vec::new();
    for &lsn in lsns {
        match ranges.last_mut() {
            Some(last) if last.through.0 + 1 == lsn.0 => last.through = lsn,
            _ => ranges.push(LsnRange { after: Lsn(lsn.0.saturating_sub(1)), through: lsn }),
        }
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use crate::record::Payload;

    fn record(lsn: u64, page: u64) -> RedoRecord {
        RedoRecord { lsn: Lsn(lsn), page, payload: Payload::Ranges(vec![(0, vec![lsn as u8])]) }
    }

    #[test]
    fn a_log_read_names_one_range_per_run_of_consecutive_lsns() {
        let stubs = |lsns: &[u64], in_log: bool| -> Vec<SpilledRecord> {
            lsns.iter()
                .map(|&lsn| SpilledRecord { lsn: Lsn(lsn), will_init: false, encoded_bytes: 30, in_log })
                .collect()
        };
        let read = SpillRead::new(4, &stubs(&[3, 4, 5, 9, 12, 13], true));
        let ranges: Vec<(u64, u64)> = read.log_ranges().iter().map(|r| (r.after.0, r.through.0)).collect();
        assert_eq!(ranges, [(2, 5), (8, 9), (11, 13)]);
        assert_eq!(read.device_reads(), 3);
        let slot = SpillRead::new(4, &stubs(&[3, 9], false));
        assert_eq!(slot.device_reads(), 1);
        assert_eq!(slot.log_ranges().len(), 2, "a failed slot falls back on the same records' ranges");
        // A whole page kept in the log, then records in the slot: two reads.
        let mut mixed = stubs(&[3], true);
        mixed[0].will_init = true;
        mixed.extend(stubs(&[7, 9], false));
        let read = SpillRead::new(4, &mixed);
        assert_eq!(read.from_log(), Some(Lsn(3)));
        assert_eq!(read.device_reads(), 2);
    }

    #[test]
    fn pick_takes_the_named_records_and_refuses_a_missing_one() {
        let read = SpillRead::Slot { page: 4, lsns: vec![Lsn(3), Lsn(7)], from_log: None };
        let fetched = [record(2, 4), record(7, 4), record(3, 5), record(3, 4), record(7, 4)];
        let picked = read.pick(&fetched).unwrap();
        assert_eq!(picked.iter().map(|r| (r.lsn.0, r.page)).collect::<Vec<_>>(), [(3, 4), (7, 4)]);
        let error = read.pick(&fetched[..2]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Corrupted);
        assert!(error.message().contains("LSN 3") && error.message().contains("log slot"), "{error}");
    }
}
