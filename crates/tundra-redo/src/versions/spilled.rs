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
//!
//! A slot that would overflow while LSN_min keeps its page from being materialized gets an
//! extra image (§3.3.3: "writes an extra image above LSN_min for lagging readers"): the page as
//! of its oldest record in memory, written to an image cell (`crate::slots`, "cells") with the
//! records its slot held, which the slot then lets go of. The index keeps the image as a
//! whole-page stub at that record's LSN ([`Held::CellImage`]) and the slot's records as stubs
//! held by the cell ([`Held::CellRecords`]). A read from the image takes the records after it
//! from the next cell or the slot, and a read below the image takes the stored image and the
//! records from the cell: two device reads either way.

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

/// Where a record that left memory is read back from (besides the redo log, which keeps every
/// record until its page is materialized).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// The page's log slot.
    Slot,
    /// The redo log alone: slots off, or a whole page too large for a slot.
    Log,
    /// The records block of image cell `n`: the slot held it when the cell was written.
    CellRecords(u32),
    /// Not a record but the page's extra image as of this LSN, in image cell `n`: a rebuild
    /// starts from it as from a whole-page record (it stands for every record up to its LSN).
    CellImage(u32),
}

/// What the index keeps of a record that left memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpilledRecord {
    pub lsn: Lsn,
    /// The record is a whole page image: a rebuild needs nothing before it.
    pub will_init: bool,
    /// Its encoded length ([`crate::codec::encoded_record_len`]): what it takes in a slot
    /// (0 for an extra image, which takes none).
    pub encoded_bytes: u32,
    pub held: Held,
}

impl SpilledRecord {
    pub fn of(to: SpillTo, record: &RedoRecord) -> SpilledRecord {
        let encoded_bytes = crate::codec::encoded_record_len(record);
        SpilledRecord {
            lsn: record.lsn,
            will_init: record.will_init(),
            encoded_bytes: u32::try_from(encoded_bytes).expect("a checked record's encoding fits 32 bits"),
            held: if spills_to_log(to, record) { Held::Log } else { Held::Slot },
        }
    }

    /// The stub of an extra image of the page as of `lsn`, in image cell `cell`.
    pub fn extra_image(lsn: Lsn, cell: u32) -> SpilledRecord {
        SpilledRecord { lsn, will_init: true, encoded_bytes: 0, held: Held::CellImage(cell) }
    }

    /// It is in the page's log slot (and takes room there).
    pub fn in_slot(&self) -> bool {
        self.held == Held::Slot
    }

    /// The image cell that holds it, if any.
    pub fn cell(&self) -> Option<u32> {
        match self.held {
            Held::CellRecords(cell) | Held::CellImage(cell) => Some(cell),
            Held::Slot | Held::Log => None,
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
    /// Reads of at most two places: where the rebuild starts, when it starts from a whole page
    /// that is not in the slot (`from_log`: a record kept only in the redo log, read from its
    /// batch; `image`: the extra image in that cell, at `lsns[0]`), and where the records after
    /// that start are (`records_cell`: the records block of that cell; `None`: the page's log
    /// slot). The records at `lsns` are taken from what they give. A rebuild starts at its
    /// newest whole page, so at most one record of its window is elsewhere, and every record
    /// after it is in the one place.
    Slot { page: u64, lsns: Vec<Lsn>, from_log: Option<Lsn>, image: Option<u32>, records_cell: Option<u32> },
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
        if records.iter().all(|s| s.held == Held::Log) {
            return SpillRead::Log { page, ranges: log_ranges(&lsns), lsns };
        }
        let (from_log, image) = match records[0].held {
            Held::Log => (Some(records[0].lsn), None),
            Held::CellImage(cell) => (None, Some(cell)),
            Held::Slot | Held::CellRecords(_) => (None, None),
        };
        assert!(
            (from_log.is_none() && image.is_none()) || records[0].will_init,
            "a rebuild starts from a record outside the slot only when it is a whole page"
        );
        let rest = &records[usize::from(from_log.is_some() || image.is_some())..];
        let records_cell = match rest.first().map(|s| s.held) {
            Some(Held::CellRecords(cell)) => Some(cell),
            _ => None,
        };
        let place = records_cell.map_or(Held::Slot, Held::CellRecords);
        assert!(
            rest.iter().all(|s| s.held == place),
            "the records after a rebuild's start are all in one place (its slot, or one cell)"
        );
        SpillRead::Slot { page, lsns, from_log, image, records_cell }
    }

    /// The record of a slot read kept in the log alone, read with the slot.
    pub fn from_log(&self) -> Option<Lsn> {
        match self {
            SpillRead::Slot { from_log, .. } => *from_log,
            SpillRead::Log { .. } => None,
        }
    }

    /// The image cell a slot read starts from, and the image's LSN.
    pub fn image(&self) -> Option<(u32, Lsn)> {
        match self {
            SpillRead::Slot { image: Some(cell), lsns, .. } => Some((*cell, lsns[0])),
            _ => None,
        }
    }

    /// The LSNs of the records after a slot read's start (those read from the slot or a cell's
    /// records block); all of a log read's.
    pub fn rest_lsns(&self) -> &[Lsn] {
        match self {
            SpillRead::Slot { lsns, from_log, image, .. } => {
                &lsns[usize::from(from_log.is_some() || image.is_some())..]
            }
            SpillRead::Log { lsns, .. } => lsns,
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
    /// read that fails its checks finds the same records. An extra image is not in the log (the
    /// records it stands for are, but not as one record): it is left out.
    pub fn log_ranges(&self) -> Vec<LsnRange> {
        match self {
            SpillRead::Slot { lsns, image: None, .. } => log_ranges(lsns),
            SpillRead::Slot { lsns, image: Some(_), .. } => log_ranges(&lsns[1..]),
            SpillRead::Log { ranges, .. } => ranges.clone(),
        }
    }

    /// Device reads the plan names: one for where a slot read starts when that is not the slot
    /// (a log batch, or an image cell), one for the slot or cell holding the records after it;
    /// at least one per log range (a range spans one batch or more, and a batch one block or
    /// more).
    pub fn device_reads(&self) -> u32 {
        match self {
            SpillRead::Slot { from_log, image, .. } => {
                u32::from(from_log.is_some() || image.is_some()) + u32::from(!self.rest_lsns().is_empty())
            }
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
                SpillRead::Slot { image: Some(_), .. } | SpillRead::Slot { records_cell: Some(_), .. } => {
                    "its log slot or image cell"
                }
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
            let held = if in_log { Held::Log } else { Held::Slot };
            lsns.iter().map(|&lsn| SpilledRecord { lsn: Lsn(lsn), will_init: false, encoded_bytes: 30, held }).collect()
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
        let read =
            SpillRead::Slot { page: 4, lsns: vec![Lsn(3), Lsn(7)], from_log: None, image: None, records_cell: None };
        let fetched = [record(2, 4), record(7, 4), record(3, 5), record(3, 4), record(7, 4)];
        let picked = read.pick(&fetched).unwrap();
        assert_eq!(picked.iter().map(|r| (r.lsn.0, r.page)).collect::<Vec<_>>(), [(3, 4), (7, 4)]);
        let error = read.pick(&fetched[..2]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Corrupted);
        assert!(error.message().contains("LSN 3") && error.message().contains("log slot"), "{error}");
    }
}
