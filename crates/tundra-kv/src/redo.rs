//! Page changes as redo (docs/kv.md, "Redo"): a transaction's changed pages become one batch
//! of records, one record per page, with LSNs that count bytes of redo.
//!
//! - A page the transaction created or rewrote whole (a split's two halves, a new root, a
//!   compacted page, the pages of a new database) is an image record (`will_init`): the page
//!   as it is, needing nothing of what was there.
//! - Any other page is a record of byte ranges: the stamp (checksum and page LSN, bytes 0..12)
//!   and every run of bytes that differs from the page before the transaction, runs closer
//!   than a range header merged. If the ranges would cost more than half a page, the record
//!   is an image instead.
//!
//! A record's LSN is the batch's `prev_lsn` plus the encoded bytes of every record up to and
//! including it, so a reader's lag in LSNs is a lag in bytes of redo. A record's length does
//! not depend on the LSN it carries, which is why the LSNs can be fixed before the pages are
//! stamped with them.

use tundra_redo::codec::{RANGE_HEADER_BYTES, RECORD_HEADER_BYTES, encoded_record_len};
use tundra_redo::{Payload, RedoBatch, RedoRecord, WriterEpoch};
use tundra_store::ids::{Lsn, VolumeId};

use crate::page::{PAGE_SIZE, Page, STAMP_BYTES};

/// One page a transaction changed: its number, the page before (`None` when the record must be
/// an image: the page is new or was rewritten whole) and after.
pub struct PageChange<'a> {
    pub page: u64,
    pub before: Option<&'a Page>,
    pub after: &'a mut Page,
}

/// How a change is logged, before its LSN is known.
enum Shape {
    Image,
    /// Runs of the page's body (after the stamp) that changed: `(offset, length)`.
    Ranges(Vec<(usize, usize)>),
}

/// The runs of `after` that differ from `before` past the stamp, runs separated by fewer than
/// a range header's bytes merged (a range header costs more than the bytes it would skip).
fn changed_runs(before: &[u8], after: &[u8]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut at = STAMP_BYTES;
    while at < after.len() {
        if before[at] == after[at] {
            at += 1;
            continue;
        }
        let start = at;
        while at < after.len() && before[at] != after[at] {
            at += 1;
        }
        match runs.last_mut() {
            Some((run_start, run_len)) if start - (*run_start + *run_len) <= RANGE_HEADER_BYTES => {
                *run_len = at - *run_start;
            }
            _ => runs.push((start, at - start)),
        }
    }
    runs
}

fn shape(change: &PageChange<'_>) -> Option<Shape> {
    let Some(before) = change.before else { return Some(Shape::Image) };
    let runs = changed_runs(before.bytes(), change.after.bytes());
    if runs.is_empty() {
        return None;
    }
    let bytes: usize = runs.iter().map(|(_, len)| RANGE_HEADER_BYTES + len).sum();
    if bytes > PAGE_SIZE / 2 { Some(Shape::Image) } else { Some(Shape::Ranges(runs)) }
}

/// The encoded length of a record of this shape.
fn record_len(shape: &Shape) -> u64 {
    let payload = match shape {
        Shape::Image => PAGE_SIZE,
        Shape::Ranges(runs) => {
            RANGE_HEADER_BYTES + STAMP_BYTES + runs.iter().map(|(_, len)| RANGE_HEADER_BYTES + len).sum::<usize>()
        }
    };
    (RECORD_HEADER_BYTES + payload) as u64
}

/// The batch that commits `changes` after `prev_lsn`, or `None` if no page changed. Stamps
/// each changed page with its record's LSN. Pages whose bytes did not change get no record
/// and keep their stamp.
pub fn build_batch(
    volume: VolumeId,
    epoch: WriterEpoch,
    prev_lsn: Lsn,
    changes: &mut [PageChange<'_>],
) -> Option<RedoBatch> {
    let mut records = Vec::new();
    let mut lsn = prev_lsn;
    for change in changes.iter_mut() {
        let Some(shape) = shape(change) else { continue };
        lsn = Lsn(lsn.0 + record_len(&shape));
        change.after.stamp(lsn);
        let after = change.after.bytes();
        let payload = match shape {
            Shape::Image => Payload::Image(after.to_vec()),
            Shape::Ranges(runs) => {
                let mut ranges = vec![(0u32, after[..STAMP_BYTES].to_vec())];
                ranges.extend(runs.iter().map(|&(start, len)| (start as u32, after[start..start + len].to_vec())));
                Payload::Ranges(ranges)
            }
        };
        let record = RedoRecord { lsn, page: change.page, payload };
        assert_eq!(
            encoded_record_len(&record) as u64,
            lsn.0 - records.last().map_or(prev_lsn, |r: &RedoRecord| r.lsn).0,
            "a record's LSN counts its encoded bytes"
        );
        records.push(record);
    }
    if records.is_empty() {
        return None;
    }
    Some(RedoBatch { volume, epoch, prev_lsn, end_lsn: lsn, records })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::{PageKind, leaf_cell};

    fn stamped(mut page: Page, lsn: u64) -> Page {
        page.stamp(Lsn(lsn));
        page
    }

    #[test]
    fn a_small_change_is_ranges_and_rebuilds_the_page_exactly() {
        let before = stamped(Page::from_cells(PageKind::Leaf, 0, &[leaf_cell(b"a", b"1")]), 40);
        let mut after = before.clone();
        assert!(after.insert_cell(1, &leaf_cell(b"b", b"2")));
        let mut changes = [PageChange { page: 7, before: Some(&before), after: &mut after }];
        let batch = build_batch(VolumeId(1), WriterEpoch(1), Lsn(100), &mut changes).unwrap();
        assert_eq!(batch.records.len(), 1);
        let record = &batch.records[0];
        let Payload::Ranges(ranges) = &record.payload else { panic!("an insert is logged as ranges") };
        assert_eq!(ranges[0].0, 0, "the stamp comes first");
        assert!(ranges.iter().map(|(_, b)| b.len()).sum::<usize>() < 64, "{ranges:?}");
        assert_eq!(batch.end_lsn, record.lsn);
        assert_eq!(after.lsn(), record.lsn);
        let mut rebuilt = before.bytes().to_vec();
        tundra_redo::versions::apply(&mut rebuilt, &record.payload).unwrap();
        assert_eq!(rebuilt, after.bytes());
        Page::decode(rebuilt, 7).unwrap().unwrap();
    }

    #[test]
    fn new_pages_are_images_and_unchanged_pages_get_no_record() {
        let same = stamped(Page::new(PageKind::Leaf, 0), 9);
        let mut unchanged = same.clone();
        let mut fresh = Page::new(PageKind::Leaf, 0);
        let mut changes = [
            PageChange { page: 1, before: Some(&same), after: &mut unchanged },
            PageChange { page: 2, before: None, after: &mut fresh },
        ];
        let batch = build_batch(VolumeId(1), WriterEpoch(1), Lsn(0), &mut changes).unwrap();
        assert_eq!(batch.records.len(), 1);
        assert!(batch.records[0].will_init());
        assert_eq!(batch.records[0].page, 2);
        assert_eq!(unchanged.lsn(), Lsn(9), "an unchanged page keeps its stamp");
        let mut none = [PageChange { page: 1, before: Some(&same), after: &mut unchanged }];
        assert!(build_batch(VolumeId(1), WriterEpoch(1), Lsn(0), &mut none).is_none());
    }
}
