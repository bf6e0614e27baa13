//! Records applied to pages: one payload to a page buffer ([`apply`]), and a page rebuilt as of
//! an LSN from the newest image at or below it and the records above that image
//! ([`reconstruct`]).
//!
//! A payload's ranges come from a writer over the network, so each is checked against the page
//! size before a byte is written: a range past the page's end is an error, never a panic, and
//! leaves the page as it was.

use std::borrow::Borrow;

use tundra_store::ids::Lsn;

use super::{Bug, injected};
use crate::record::{Payload, RedoRecord};
use crate::{Error, Result};

/// Checks that `payload` fits a page of `page_size` bytes: an image is exactly one page, every
/// range lies inside the page. What [`apply`] would refuse, refused without a page at hand (the
/// append path checks every record this way before the batch is accepted).
pub fn check_payload(payload: &Payload, page_size: usize) -> Result<()> {
    match payload {
        Payload::Image(bytes) if bytes.len() == page_size => Ok(()),
        Payload::Image(bytes) => {
            Err(Error::invalid(format!("a page image of {} bytes for a page of {page_size} bytes", bytes.len())))
        }
        Payload::Ranges(ranges) => {
            for (i, (offset, bytes)) in ranges.iter().enumerate() {
                // u64: an offset near u32::MAX plus a long range must not wrap.
                let end = u64::from(*offset) + bytes.len() as u64;
                if end > page_size as u64 {
                    return Err(Error::invalid(format!(
                        "range {i} ({offset}..{end}) is past the end of a page of {page_size} bytes"
                    )));
                }
            }
            Ok(())
        }
    }
}

/// Applies `payload` to `page`: an image replaces it, ranges overwrite it in order (a later
/// range wins where two overlap). Checks the whole payload first, so an error changes nothing.
pub fn apply(page: &mut [u8], payload: &Payload) -> Result<()> {
    check_payload(payload, page.len())?;
    match payload {
        Payload::Image(bytes) => page.copy_from_slice(bytes),
        Payload::Ranges(ranges) => {
            for (offset, bytes) in ranges {
                let start = *offset as usize;
                page[start..start + bytes.len()].copy_from_slice(bytes);
            }
        }
    }
    Ok(())
}

/// The records of `records` (sorted by LSN) in `(after, through]`; `after` of `None` means from
/// the first. The one place that cuts a page's records at an LSN, for rebuilding and for
/// serving alike.
pub(crate) fn window<R: Borrow<RedoRecord>>(records: &[R], after: Option<Lsn>, through: Lsn) -> &[R] {
    window_by(records, |r| r.borrow().lsn, after, through)
}

/// [`window`] over anything sorted by an LSN: records, or what the index keeps of spilled ones.
pub(crate) fn window_by<T>(items: &[T], lsn: impl Fn(&T) -> Lsn, after: Option<Lsn>, through: Lsn) -> &[T] {
    let start = match after {
        Some(after) => items.partition_point(|item| lsn(item) <= after),
        None => 0,
    };
    let end =
        if injected(Bug::ApplyPastLsn) { items.len() } else { items.partition_point(|item| lsn(item) <= through) };
    &items[start..end.max(start)]
}

/// The index in `records` of the last record that needs nothing of the page before it.
pub(crate) fn last_will_init<R: Borrow<RedoRecord>>(records: &[R]) -> Option<usize> {
    records.iter().rposition(|r| r.borrow().will_init())
}

/// The page as of `lsn`, `page_size` bytes: `base` is the newest image at or below `lsn` (its
/// LSN and bytes), `records` the page's records sorted by LSN (those at or below the image's
/// LSN and those above `lsn` are skipped). The rebuild starts from the newest `will_init`
/// record in `(image LSN, lsn]` when there is one (the image is then not needed), else from
/// the image, else from zeros: a page never written reads as zeros.
///
/// An image of the wrong size or a record that does not fit the page is a corruption error:
/// both were checked when they were accepted, so the bytes changed since.
pub fn reconstruct<R: Borrow<RedoRecord>>(
    base: Option<(Lsn, &[u8])>,
    records: &[R],
    lsn: Lsn,
    page_size: usize,
) -> Result<Vec<u8>> {
    check_sorted_one_page(records);
    if let Some((image_lsn, bytes)) = base {
        assert!(image_lsn <= lsn, "the image at LSN {image_lsn} is newer than the version asked for, {lsn}");
        if bytes.len() != page_size {
            return Err(Error::corrupted(format!(
                "the page image at LSN {image_lsn} has {} bytes, not {page_size}",
                bytes.len()
            )));
        }
    }
    let window = window(records, base.map(|(image_lsn, _)| image_lsn), lsn);
    let (mut page, from) = match last_will_init(window) {
        Some(i) => (vec![0u8; page_size], i),
        None => (base.map_or_else(|| vec![0u8; page_size], |(_, bytes)| bytes.to_vec()), 0),
    };
    for record in &window[from..] {
        let record = record.borrow();
        apply(&mut page, &record.payload).map_err(|e| {
            Error::corrupted(format!(
                "page {}: the record at LSN {} cannot be applied: {}",
                record.page,
                record.lsn,
                e.message()
            ))
        })?;
    }
    Ok(page)
}

/// Records handed to a rebuild come from one page's sorted list; anything else is a caller's
/// bug, not bad input.
fn check_sorted_one_page<R: Borrow<RedoRecord>>(records: &[R]) {
    for pair in records.windows(2) {
        let (a, b) = (pair[0].borrow(), pair[1].borrow());
        assert!(a.lsn < b.lsn, "records out of LSN order: {} then {}", a.lsn, b.lsn);
        assert_eq!(a.page, b.page, "records of two pages in one rebuild");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn ranges(lsn: u64, pieces: &[(u32, &[u8])]) -> RedoRecord {
        let pieces = pieces.iter().map(|(o, b)| (*o, b.to_vec())).collect();
        RedoRecord { lsn: Lsn(lsn), page: 3, payload: Payload::Ranges(pieces) }
    }

    fn image(lsn: u64, fill: u8) -> RedoRecord {
        RedoRecord { lsn: Lsn(lsn), page: 3, payload: Payload::Image(vec![fill; 8]) }
    }

    #[test]
    fn ranges_overwrite_in_order_and_an_image_replaces_the_page() {
        let mut page = vec![0u8; 8];
        apply(&mut page, &ranges(1, &[(0, b"abcd"), (2, b"XY")]).payload).unwrap();
        assert_eq!(page, b"abXY\0\0\0\0");
        apply(&mut page, &ranges(2, &[(6, b"zz"), (0, b"")]).payload).unwrap();
        assert_eq!(page, b"abXY\0\0zz");
        apply(&mut page, &image(3, 7).payload).unwrap();
        assert_eq!(page, vec![7u8; 8]);
    }

    #[test]
    fn a_range_past_the_page_is_an_error_and_changes_nothing() {
        let mut page = vec![1u8; 8];
        for bad in [
            ranges(1, &[(0, b"ok"), (7, b"no")]),
            ranges(1, &[(8, b"x")]),
            ranges(1, &[(u32::MAX, b"wrap")]),
            RedoRecord { lsn: Lsn(1), page: 3, payload: Payload::Image(vec![0; 9]) },
            RedoRecord { lsn: Lsn(1), page: 3, payload: Payload::Image(vec![0; 7]) },
        ] {
            let error = apply(&mut page, &bad.payload).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
            assert_eq!(page, vec![1u8; 8], "{bad:?} changed the page");
            assert!(check_payload(&bad.payload, 8).is_err());
        }
        // A range that ends exactly at the page's end fits.
        apply(&mut page, &ranges(1, &[(6, b"ab")]).payload).unwrap();
        assert_eq!(&page[6..], b"ab");
    }

    #[test]
    fn reconstruct_takes_records_above_the_image_and_up_to_the_lsn() {
        let records = vec![ranges(5, &[(0, b"a")]), ranges(7, &[(1, b"b")]), ranges(9, &[(2, b"c")])];
        let base = vec![b'.'; 8];
        let at = |image_lsn: u64, lsn: u64| reconstruct(Some((Lsn(image_lsn), &base)), &records, Lsn(lsn), 8).unwrap();
        assert_eq!(at(0, 4), b"........");
        assert_eq!(at(0, 5), b"a.......");
        assert_eq!(at(0, 8), b"ab......");
        assert_eq!(at(0, 100), b"abc.....");
        // The image already holds records up to its LSN: they are not applied twice.
        assert_eq!(at(7, 9), b"..c.....");
        // No image: a new page starts from zeros.
        assert_eq!(reconstruct(None, &records, Lsn(7), 8).unwrap(), b"ab\0\0\0\0\0\0");
        assert_eq!(reconstruct::<RedoRecord>(None, &[], Lsn(7), 8).unwrap(), vec![0u8; 8]);
    }

    #[test]
    fn reconstruct_starts_from_the_newest_will_init_record() {
        let records = vec![ranges(2, &[(0, b"x")]), image(4, b'i'), ranges(6, &[(7, b"y")]), image(8, b'j')];
        let base = vec![b'.'; 8];
        let got = reconstruct(Some((Lsn(1), &base)), &records, Lsn(7), 8).unwrap();
        assert_eq!(got, b"iiiiiiiy");
        assert_eq!(reconstruct(Some((Lsn(1), &base)), &records, Lsn(3), 8).unwrap(), b"x.......");
        assert_eq!(reconstruct(None, &records, Lsn(9), 8).unwrap(), vec![b'j'; 8]);
    }

    #[test]
    fn reconstruct_reports_damage_as_corruption() {
        let records = vec![ranges(5, &[(7, b"too long")])];
        let error = reconstruct(None, &records, Lsn(5), 8).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Corrupted);
        assert!(error.message().contains("page 3") && error.message().contains("LSN 5"), "{error}");
        let short = vec![0u8; 4];
        let error = reconstruct::<RedoRecord>(Some((Lsn(1), &short)), &[], Lsn(5), 8).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Corrupted);
    }

    #[test]
    #[should_panic(expected = "out of LSN order")]
    fn unsorted_records_are_a_callers_bug() {
        let records = vec![ranges(5, &[]), ranges(4, &[])];
        let _ = reconstruct(None, &records, Lsn(9), 8);
    }
}
