//! PageVersions' events one at a time: what a batch may hold, what folding may take, what
//! materializing drops.

use std::sync::Arc;

use tundra_store::ids::Lsn;
use tundra_store::store::Watermarks;

use super::*;
use crate::ErrorKind;
use crate::versions::{GetPage, SpillRead, SpillTo};

const PAGE: usize = 16;

fn delta(lsn: u64, page: u64) -> Arc<RedoRecord> {
    Arc::new(RedoRecord { lsn: Lsn(lsn), page, payload: Payload::Ranges(vec![(0, vec![lsn as u8; 4])]) })
}

fn fresh() -> PageVersions {
    PageVersions::new(PAGE, 10, Watermarks::default())
}

fn fold_all(versions: &mut PageVersions) {
    for task in versions.fold_candidates(usize::MAX) {
        versions.materialized(task.page, task.through_lsn);
    }
}

#[test]
fn a_batch_moves_complete_and_durable_also_without_records() {
    let mut versions = fresh();
    versions.records_durable(vec![delta(2, 1), delta(5, 3)], Lsn(6)).unwrap();
    assert_eq!((versions.complete_lsn(), versions.durable_lsn()), (Lsn(6), Lsn(6)));
    // A heartbeat: nothing for any page, the stream still moves (D5).
    versions.records_durable(vec![], Lsn(9)).unwrap();
    assert_eq!((versions.complete_lsn(), versions.durable_lsn()), (Lsn(9), Lsn(9)));
    // A read of an idle page at 9 is served at once.
    let request = GetPage { request_lsn: Lsn(9), not_modified_since: Lsn(9) };
    assert!(matches!(versions.get_page(7, None, request), Decision::Serve { at_lsn: Lsn(9), .. }));
    assert_eq!(versions.cached_records(), 2);
    assert_eq!(versions.pages_with_records(), 2);
    assert_eq!(versions.records(3).len(), 1);
    assert_eq!(versions.invariant_problem(), None);
}

#[test]
fn a_bad_batch_is_refused_whole_and_changes_nothing() {
    let mut versions = fresh();
    versions.records_durable(vec![delta(3, 1)], Lsn(4)).unwrap();
    let long =
        Arc::new(RedoRecord { lsn: Lsn(6), page: 2, payload: Payload::Ranges(vec![(PAGE as u32 - 1, vec![0; 2])]) });
    let short_image = Arc::new(RedoRecord { lsn: Lsn(6), page: 2, payload: Payload::Image(vec![0; PAGE - 1]) });
    for (what, records, end) in [
        ("an LSN at the complete LSN", vec![delta(5, 1), delta(4, 2)], 8),
        ("LSNs out of order", vec![delta(7, 1), delta(6, 2)], 8),
        ("a repeated LSN", vec![delta(6, 1), delta(6, 2)], 8),
        ("a record past the batch's end", vec![delta(6, 1), delta(9, 2)], 8),
        ("an end below the complete LSN", vec![], 3),
        ("a page outside the volume", vec![delta(5, 1), delta(6, 10)], 8),
        ("a range past the page", vec![delta(5, 1), long], 8),
        ("an image of the wrong size", vec![delta(5, 1), short_image], 8),
    ] {
        let error = versions.records_durable(records, Lsn(end)).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Invalid, "{what}: {error}");
        assert_eq!(versions.complete_lsn(), Lsn(4), "{what}");
        assert_eq!(versions.cached_records(), 1, "{what}");
        assert_eq!(versions.invariant_problem(), None, "{what}");
    }
    // A heartbeat at the complete LSN itself changes nothing and is fine.
    versions.records_durable(vec![], Lsn(4)).unwrap();
    // The volume grows: its new pages take records.
    versions.grow(12);
    versions.records_durable(vec![delta(5, 11)], Lsn(5)).unwrap();
}

#[test]
fn folding_never_passes_lsn_min_and_takes_the_oldest_pages_first() {
    let mut versions = fresh();
    versions.records_durable(vec![delta(1, 5), delta(2, 3), delta(3, 5), delta(4, 7), delta(6, 3)], Lsn(8)).unwrap();
    // LSN_min 0: no reader may lose a version, nothing folds.
    assert!(versions.fold_candidates(10).is_empty());
    versions.set_lsn_min(Lsn(3));
    let tasks = versions.fold_candidates(10);
    let got: Vec<(u64, u64, usize)> = tasks.iter().map(|t| (t.page, t.through_lsn.0, t.records.len())).collect();
    assert_eq!(got, [(5, 3, 2), (3, 2, 1)], "oldest record first, records up to LSN_min only");
    assert_eq!(versions.fold_candidates(1).len(), 1);
    // The bound is also the durable LSN: LSN_min past it does not let folding pass it.
    versions.set_lsn_min(Lsn(50));
    assert_eq!(versions.fold_bound(), Lsn(8));
    versions.durable(Lsn(20));
    assert_eq!(versions.fold_bound(), Lsn(20));
    assert_eq!(versions.invariant_problem(), None);
}

#[test]
fn materializing_drops_the_records_the_image_holds() {
    let mut versions = fresh();
    versions.records_durable(vec![delta(1, 5), delta(2, 3), delta(3, 5), delta(4, 5)], Lsn(4)).unwrap();
    let full = versions.cached_bytes();
    assert!(full > 0);
    assert_eq!(versions.materialized_through(), Lsn(0));
    versions.set_lsn_min(Lsn(3));
    versions.materialized(5, Lsn(3));
    assert_eq!(versions.records(5).iter().map(|r| r.lsn.0).collect::<Vec<_>>(), [4]);
    assert_eq!(versions.materialized_through(), Lsn(1), "page 3's record at 2 is not folded");
    // An older report, arriving late, changes nothing.
    versions.materialized(5, Lsn(1));
    assert_eq!(versions.records(5).len(), 1);
    versions.materialized(3, Lsn(2));
    assert_eq!(versions.materialized_through(), Lsn(3));
    versions.set_lsn_min(Lsn(4));
    fold_all(&mut versions);
    assert_eq!((versions.cached_bytes(), versions.cached_records(), versions.pages_with_records()), (0, 0, 0));
    assert_eq!(versions.materialized_through(), Lsn(4));
    // A report for a page with no records is harmless.
    versions.materialized(9, Lsn(4));
    assert_eq!(versions.invariant_problem(), None);
}

#[test]
#[should_panic(expected = "above the fold bound")]
fn materializing_above_the_fold_bound_is_a_bug() {
    let mut versions = fresh();
    versions.records_durable(vec![delta(1, 5), delta(2, 5)], Lsn(2)).unwrap();
    versions.set_lsn_min(Lsn(1));
    versions.materialized(5, Lsn(2));
}

#[test]
#[should_panic(expected = "older than the one materialized")]
fn reading_with_a_stale_store_entry_is_a_bug() {
    let mut versions = fresh();
    versions.records_durable(vec![delta(1, 5), delta(2, 5)], Lsn(2)).unwrap();
    versions.set_lsn_min(Lsn(1));
    versions.materialized(5, Lsn(1));
    let _ = versions.page_state(5, None);
}

#[test]
fn lsn_min_only_moves_forward() {
    let mut versions = PageVersions::new(PAGE, 10, Watermarks { durable_lsn: Lsn(9), min_reader_lsn: Lsn(4) });
    assert_eq!((versions.complete_lsn(), versions.lsn_min()), (Lsn(9), Lsn(4)));
    versions.set_lsn_min(Lsn(2));
    assert_eq!(versions.lsn_min(), Lsn(4));
    versions.set_lsn_min(Lsn(7));
    assert_eq!(versions.lsn_min(), Lsn(7));
    assert_eq!(versions.horizon(), Horizon { complete_lsn: Lsn(9), lsn_min: Lsn(7) });
}

#[test]
fn reads_outside_the_volume_are_bad_requests() {
    let versions = fresh();
    let request = GetPage { request_lsn: Lsn(1), not_modified_since: Lsn(0) };
    assert!(matches!(versions.get_page(10, None, request), Decision::BadRequest { .. }));
    assert!(matches!(versions.get_pages(&[(0, None), (10, None)], request), Err(Decision::BadRequest { .. })));
}

#[test]
fn record_cost_counts_payload_bytes() {
    let small = delta(1, 0);
    let image = RedoRecord { lsn: Lsn(1), page: 0, payload: Payload::Image(vec![0; 8192]) };
    assert!(record_cost_bytes(&image) >= 8192);
    assert!(record_cost_bytes(&image) > record_cost_bytes(&small));
}

fn sized(lsn: u64, page: u64, len: usize) -> Arc<RedoRecord> {
    Arc::new(RedoRecord { lsn: Lsn(lsn), page, payload: Payload::Ranges(vec![(0, vec![lsn as u8; len])]) })
}

fn cost(records: &[Arc<RedoRecord>]) -> u64 {
    records.iter().map(|r| record_cost_bytes(r)).sum()
}

#[test]
fn nothing_spills_while_the_cache_is_within_its_bound() {
    let mut versions = fresh();
    versions.records_durable(vec![delta(1, 5), delta(2, 3)], Lsn(2)).unwrap();
    assert!(versions.spill_candidates(versions.cached_bytes()).is_empty());
    assert!(!versions.spill_candidates(versions.cached_bytes() - 1).is_empty());
}

#[test]
fn pages_spill_by_their_oldest_record_in_memory_until_the_cache_is_under_its_bound() {
    let mut versions = fresh();
    versions.records_durable(vec![delta(1, 5), delta(2, 3), delta(3, 5), delta(4, 7), delta(6, 3)], Lsn(8)).unwrap();
    let total = versions.cached_bytes();
    let page_5 = cost(versions.records(5));
    // Just under: the page with the oldest record (5) spills whole, which is enough.
    let tasks = versions.spill_candidates(total - 1);
    let got: Vec<(u64, u64, usize)> = tasks.iter().map(|t| (t.page, t.through_lsn.0, t.records.len())).collect();
    assert_eq!(got, [(5, 3, 2)]);
    // Bound at zero: every page, oldest first.
    let pages: Vec<u64> = versions.spill_candidates(0).iter().map(|t| t.page).collect();
    assert_eq!(pages, [5, 3, 7]);
    versions.spilled(5, Lsn(3));
    assert_eq!(versions.cached_bytes(), total - page_5, "spilled records leave the cache's count");
    assert_eq!((versions.records(5).len(), versions.spilled_of(5).len(), versions.spilled_records()), (0, 2, 2));
    // Page 5 has nothing left in memory: next comes page 3.
    assert_eq!(versions.spill_candidates(0).iter().map(|t| t.page).collect::<Vec<_>>(), [3, 7]);
    // The flush list still starts at page 5's record at 1: it is not materialized.
    assert_eq!(versions.materialized_through(), Lsn(0));
    // A new record of page 5 lands in memory after the spilled ones, and spills after them.
    versions.records_durable(vec![delta(9, 5)], Lsn(9)).unwrap();
    assert_eq!(versions.spill_candidates(0).iter().map(|t| t.page).collect::<Vec<_>>(), [3, 7, 5]);
    assert_eq!(versions.invariant_problem(), None);
}

#[test]
fn a_page_spills_only_what_its_slot_has_room_for_and_none_once_full() {
    let mut versions = fresh_large();
    // Records of about 1 KiB: three fit a slot's 4048 bytes, a fourth does not.
    let records: Vec<Arc<RedoRecord>> = (1..=5).map(|lsn| sized(lsn, 2, 1000)).collect();
    versions.records_durable(records, Lsn(5)).unwrap();
    let tasks = versions.spill_candidates(0);
    assert_eq!(tasks.iter().map(|t| (t.page, t.records.len())).collect::<Vec<_>>(), [(2, 3)]);
    versions.spilled(2, tasks[0].through_lsn);
    assert!(versions.spill_candidates(0).is_empty(), "the slot has no room for the next record");
    // The owner's merge overflowed for some other reason (a slot not cleared): no more asks.
    versions.records_durable(vec![sized(6, 4, 10)], Lsn(6)).unwrap();
    versions.slot_full(4);
    assert!(versions.spill_candidates(0).is_empty());
    assert_eq!(versions.pages_with_full_slots().collect::<Vec<_>>(), [4]);
    // A fold frees the slot: the page may spill again.
    versions.set_lsn_min(Lsn(6));
    for task in versions.fold_candidates(10) {
        let _ = versions.materialized(task.page, task.through_lsn);
    }
    versions.records_durable(vec![sized(7, 4, 10)], Lsn(7)).unwrap();
    assert_eq!(versions.spill_candidates(0).iter().map(|t| t.page).collect::<Vec<_>>(), [4]);
    assert_eq!(versions.invariant_problem(), None);
}

fn fresh_large() -> PageVersions {
    PageVersions::new(8192, 10, Watermarks::default())
}

#[test]
fn with_slots_off_a_page_spills_all_its_records() {
    let mut versions = fresh_large().spilling_to(SpillTo::Log);
    let records: Vec<Arc<RedoRecord>> = (1..=5).map(|lsn| sized(lsn, 2, 1000)).collect();
    versions.records_durable(records, Lsn(5)).unwrap();
    let tasks = versions.spill_candidates(0);
    assert_eq!(tasks.iter().map(|t| (t.page, t.records.len())).collect::<Vec<_>>(), [(2, 5)]);
    versions.spilled(2, Lsn(5));
    assert_eq!((versions.cached_bytes(), versions.spilled_records()), (0, 5));
    // A fold with slots off leaves no slot to clean.
    versions.set_lsn_min(Lsn(5));
    let task = versions.fold_candidates(1).remove(0);
    assert!(matches!(task.spilled, Some(crate::versions::SpillRead::Log { .. })));
    assert_eq!(versions.materialized(2, Lsn(5)), SlotCleanup::Keep);
    assert_eq!(versions.pages_with_records(), 0);
}

#[test]
fn materializing_answers_what_to_clear_of_the_slot() {
    let mut versions = fresh();
    versions.records_durable(vec![delta(1, 5), delta(2, 5), delta(3, 5), delta(4, 5)], Lsn(4)).unwrap();
    versions.spilled(5, Lsn(3));
    versions.set_lsn_min(Lsn(4));
    assert_eq!(versions.materialized(5, Lsn(2)), SlotCleanup::ClearThrough(Lsn(2)));
    assert_eq!(versions.spilled_of(5).iter().map(|s| s.lsn.0).collect::<Vec<_>>(), [3]);
    assert_eq!(versions.materialized_through(), Lsn(2));
    assert_eq!(versions.materialized(5, Lsn(4)), SlotCleanup::Clear);
    assert_eq!((versions.pages_with_records(), versions.spilled_records()), (0, 0));
    // A page that never spilled has no slot to clean.
    versions.records_durable(vec![delta(5, 6)], Lsn(5)).unwrap();
    versions.set_lsn_min(Lsn(5));
    assert_eq!(versions.materialized(6, Lsn(5)), SlotCleanup::Keep);
    assert_eq!(versions.invariant_problem(), None);
}

#[test]
fn a_late_spill_report_moves_only_what_is_still_in_memory() {
    let mut versions = fresh();
    versions.records_durable(vec![delta(1, 5), delta(2, 5), delta(3, 5)], Lsn(3)).unwrap();
    let task = versions.spill_candidates(0).remove(0);
    // The page is materialized at 2 before the spill is reported.
    versions.set_lsn_min(Lsn(2));
    let _ = versions.materialized(5, Lsn(2));
    versions.spilled(5, task.through_lsn);
    assert_eq!(versions.spilled_of(5).iter().map(|s| s.lsn.0).collect::<Vec<_>>(), [3]);
    assert_eq!(versions.cached_records(), 0);
    // Reported twice, or for a page with nothing in memory: nothing changes.
    versions.spilled(5, task.through_lsn);
    versions.spilled(8, Lsn(3));
    assert_eq!(versions.spilled_records(), 1);
    assert_eq!(versions.invariant_problem(), None);
}

#[test]
#[should_panic(expected = "chosen before they arrive")]
fn where_records_spill_is_chosen_before_any_arrives() {
    let mut versions = fresh();
    versions.records_durable(vec![delta(1, 5)], Lsn(1)).unwrap();
    let _ = versions.spilling_to(SpillTo::Log);
}

/// Seed 000 §3.3.3's overflow rule in the index: a page whose slot is full and whose records
/// LSN_min keeps from folding gets an extra image at its oldest record in memory; the slot's
/// records become the cell's, that record leaves memory, and reads on either side of the image
/// name at most two places. A fold past everything frees the cell.
#[test]
fn an_extra_image_relieves_a_full_slot_and_reads_stay_two_places_away() {
    let mut versions = PageVersions::new(PAGE, 10, Watermarks { durable_lsn: Lsn(1), min_reader_lsn: Lsn(1) });
    versions.records_durable(vec![delta(2, 4), delta(3, 4), delta(5, 4), delta(7, 4)], Lsn(8)).unwrap();
    // 2 and 3 went to the slot; then it was full.
    versions.spilled(4, Lsn(3));
    versions.slot_full(4);
    assert!(versions.slot_stuck(4));
    assert_eq!(versions.pages_to_relieve(0), vec![4]);
    assert!(versions.fold_task(4).is_none(), "LSN_min 1 keeps every record from folding");
    let task = versions.extra_image_task(4).expect("an extra image above LSN_min");
    assert_eq!((task.lsn, task.slot_lsns.clone(), task.build.through_lsn), (Lsn(5), vec![Lsn(2), Lsn(3)], Lsn(5)));
    let before = versions.cached_bytes();
    assert!(versions.extra_image_written(&task, 9));
    assert_eq!(versions.invariant_problem(), None);
    assert!(versions.cached_bytes() < before && !versions.slot_stuck(4));
    assert_eq!(versions.records(4).len(), 1, "only the record above the image stays in memory");
    // Below the image: the stored image (none here) and the cell's records.
    let at = |lsn: u64| match versions.get_page(4, None, GetPage { request_lsn: Lsn(lsn), not_modified_since: Lsn(0) })
    {
        Decision::Serve { plan, .. } => plan,
        other => panic!("{other:?}"),
    };
    let below = at(4);
    assert_eq!(
        below.spilled,
        Some(SpillRead::Slot {
            page: 4,
            lsns: vec![Lsn(2), Lsn(3)],
            from_log: None,
            image: None,
            records_cell: Some(9)
        })
    );
    assert!(below.device_reads() <= 2);
    // At and above it: the image, then memory (and later the slot).
    let above = at(7);
    assert_eq!(above.spilled.as_ref().and_then(SpillRead::image), Some((9, Lsn(5))));
    assert_eq!(above.records.len(), 1);
    assert!(above.device_reads() <= 2);
    // A stale report (another record is now the oldest in memory) changes nothing.
    assert!(!versions.extra_image_written(&task, 10));
    // The reader moves past everything: the fold starts from the image and frees its cell.
    versions.set_lsn_min(Lsn(8));
    let fold = versions.fold_task(4).unwrap();
    assert_eq!(fold.spilled.as_ref().and_then(SpillRead::image), Some((9, Lsn(5))));
    versions.materialized(4, fold.through_lsn);
    assert_eq!(versions.take_freed_cells(), vec![9]);
    assert_eq!(versions.pages_with_records(), 0);
}
