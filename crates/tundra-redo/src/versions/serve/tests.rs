//! Each serve rule alone, on hand-made page states.

use std::sync::Arc;

use tundra_store::ids::Lsn;

use super::*;
use crate::record::{Payload, RedoRecord};
use crate::versions::{Held, SpillRead, SpillTo, SpilledRecord};

fn delta(lsn: u64, byte: u8) -> Arc<RedoRecord> {
    Arc::new(RedoRecord { lsn: Lsn(lsn), page: 0, payload: Payload::Ranges(vec![(0, vec![byte])]) })
}

fn image(lsn: u64, byte: u8) -> Arc<RedoRecord> {
    Arc::new(RedoRecord { lsn: Lsn(lsn), page: 0, payload: Payload::Image(vec![byte; 4]) })
}

fn read(request_lsn: u64, not_modified_since: u64) -> GetPage {
    GetPage { request_lsn: Lsn(request_lsn), not_modified_since: Lsn(not_modified_since) }
}

fn horizon(complete_lsn: u64, lsn_min: u64) -> Horizon {
    Horizon { complete_lsn: Lsn(complete_lsn), lsn_min: Lsn(lsn_min) }
}

fn served(decision: &Decision) -> (Lsn, Lsn, ReadPlan) {
    match decision {
        Decision::Serve { at_lsn, page_lsn, plan } => (*at_lsn, *page_lsn, plan.clone()),
        other => panic!("not served: {other:?}"),
    }
}

fn lsns(plan: &ReadPlan) -> Vec<u64> {
    plan.records.iter().map(|r| r.lsn.0).collect()
}

#[test]
fn a_read_at_lsn_zero_or_below_its_promise_is_a_bad_request() {
    let page = PageState { image_lsn: None, records: &[], ..Default::default() };
    assert!(matches!(decide(read(0, 0), horizon(10, 0), page), Decision::BadRequest { .. }));
    assert!(matches!(decide(read(5, 6), horizon(10, 0), page), Decision::BadRequest { .. }));
    // A bad request is bad even when the stream is behind.
    assert!(matches!(decide(read(5, 6), horizon(1, 0), page), Decision::BadRequest { .. }));
}

#[test]
fn the_server_waits_for_not_modified_since_not_for_request_lsn() {
    let records = [delta(3, b'a')];
    let page = PageState { image_lsn: None, records: &records, ..Default::default() };
    // The stream is complete to 8; the reader reads at 20 but promises no change after 5.
    let decision = decide(read(20, 5), horizon(8, 0), page);
    let (at_lsn, page_lsn, plan) = served(&decision);
    assert_eq!((at_lsn, page_lsn), (Lsn(8), Lsn(3)));
    assert_eq!(lsns(&plan), [3]);
    // A promise above the complete LSN: not yet.
    assert_eq!(decide(read(20, 9), horizon(8, 0), page), Decision::NotYet { complete_lsn: Lsn(8) });
    // The newest version ("latest", the writer's own reads).
    assert_eq!(served(&decide(read(u64::MAX, 0), horizon(8, 0), page)).0, Lsn(8));
    // A read below the complete LSN is served at its own LSN.
    let (at_lsn, page_lsn, plan) = served(&decide(read(2, 0), horizon(8, 0), page));
    assert_eq!((at_lsn, page_lsn, plan.image_lsn), (Lsn(2), Lsn(0), None));
    assert!(plan.records.is_empty(), "a page before its first change is zeros");
}

#[test]
fn page_lsn_is_the_last_change_at_or_below_the_read_point() {
    let records = [delta(4, b'a'), delta(6, b'b'), delta(9, b'c')];
    let page = PageState { image_lsn: Some(Lsn(2)), records: &records, ..Default::default() };
    for (request, page_lsn, plan) in [(3, 2, vec![]), (4, 4, vec![4]), (8, 6, vec![4, 6]), (12, 9, vec![4, 6, 9])] {
        let decision = decide(read(request, 0), horizon(12, 0), page);
        let (at_lsn, got_lsn, got_plan) = served(&decision);
        assert_eq!((at_lsn, got_lsn), (Lsn(request), Lsn(page_lsn)), "read at {request}");
        assert_eq!(lsns(&got_plan), plan, "read at {request}");
        assert_eq!(got_plan.image_lsn, Some(Lsn(2)));
        assert_eq!(got_plan.image_reads(), 1);
    }
}

#[test]
fn a_will_init_record_makes_the_image_unneeded() {
    let records = [delta(4, b'a'), image(6, b'i'), delta(9, b'c')];
    let page = PageState { image_lsn: Some(Lsn(2)), records: &records, ..Default::default() };
    let decision = decide(read(10, 0), horizon(12, 0), page);
    let (_, page_lsn, plan) = served(&decision);
    assert_eq!(page_lsn, Lsn(9));
    assert_eq!((plan.image_lsn, lsns(&plan)), (None, vec![6, 9]));
    assert_eq!(plan.image_reads(), 0);
    assert_eq!(plan.rebuild(None, 4).unwrap(), b"ciii");
}

#[test]
fn records_the_stored_image_already_holds_are_not_planned_again() {
    // The store wrote the page at 6 before the index dropped the records it folded.
    let records = [delta(4, b'a'), delta(6, b'b'), delta(9, b'c')];
    let page = PageState { image_lsn: Some(Lsn(6)), records: &records, ..Default::default() };
    let (_, page_lsn, plan) = served(&decide(read(12, 0), horizon(12, 0), page));
    assert_eq!((page_lsn, lsns(&plan)), (Lsn(9), vec![9]));
    let (_, page_lsn, plan) = served(&decide(read(7, 0), horizon(12, 0), page));
    assert_eq!((page_lsn, lsns(&plan)), (Lsn(6), vec![]));
}

#[test]
fn a_read_below_the_horizon_of_an_unchanged_page_is_served() {
    let page = PageState { image_lsn: Some(Lsn(3)), records: &[], ..Default::default() };
    let (at_lsn, page_lsn, plan) = served(&decide(read(5, 0), horizon(20, 10), page));
    assert_eq!((at_lsn, page_lsn, plan.image_lsn), (Lsn(5), Lsn(3), Some(Lsn(3))));
    // Unchanged since exactly the LSN asked for.
    let page = PageState { image_lsn: Some(Lsn(5)), records: &[], ..Default::default() };
    assert_eq!(served(&decide(read(5, 0), horizon(20, 10), page)).1, Lsn(5));
}

#[test]
fn a_read_below_the_horizon_of_a_changed_page_is_too_old_even_when_buildable() {
    // The records above the image are still in memory, so the version at 5 could be built, but
    // whether it is must not depend on how far folding got: the page changed at 7, after 5.
    let records = [delta(7, b'a')];
    let page = PageState { image_lsn: Some(Lsn(3)), records: &records, ..Default::default() };
    assert_eq!(decide(read(5, 0), horizon(20, 10), page), Decision::TooOld { lsn_min: Lsn(10) });
    // Same with the promise set as high as it can be.
    assert_eq!(decide(read(5, 5), horizon(20, 10), page), Decision::TooOld { lsn_min: Lsn(10) });
}

#[test]
fn a_read_below_the_horizon_of_a_page_folded_past_it_is_too_old_never_the_newer_page() {
    // The page was folded to 8; a reader at 5 would get the version of 8 (neon #567, #7692).
    let page = PageState { image_lsn: Some(Lsn(8)), records: &[], ..Default::default() };
    assert_eq!(decide(read(5, 0), horizon(20, 10), page), Decision::TooOld { lsn_min: Lsn(10) });
    assert_eq!(decide(read(5, 4), horizon(20, 10), page), Decision::TooOld { lsn_min: Lsn(10) });
}

#[test]
fn an_image_newer_than_the_read_point_is_too_old_even_above_the_horizon() {
    // Folding never passes LSN_min, so this state is an index's bug; the read still never gets
    // the newer page.
    let page = PageState { image_lsn: Some(Lsn(15)), records: &[], ..Default::default() };
    assert_eq!(decide(read(12, 0), horizon(20, 10), page), Decision::TooOld { lsn_min: Lsn(10) });
}

#[test]
fn the_vectored_form_serves_every_page_at_one_lsn() {
    let a = [delta(4, b'a'), delta(9, b'b')];
    let b = [delta(12, b'c')];
    let pages = [
        PageState { image_lsn: None, records: &a, ..Default::default() },
        PageState { image_lsn: Some(Lsn(2)), records: &b, ..Default::default() },
        PageState { image_lsn: Some(Lsn(11)), records: &[], ..Default::default() },
        PageState { image_lsn: Some(Lsn(3)), records: &[], ..Default::default() },
    ];
    // Complete to 10: every page is served at 10, the reader asked for 30 with no promise
    // beyond 10.
    let (at_lsn, decisions) = decide_many(read(30, 10), horizon(10, 0), pages).unwrap();
    assert_eq!(at_lsn, Lsn(10));
    assert_eq!(decisions.len(), 4);
    assert_eq!(served(&decisions[0]).1, Lsn(9));
    assert_eq!(served(&decisions[1]).1, Lsn(2));
    assert_eq!(decisions[2], Decision::TooOld { lsn_min: Lsn(0) }, "an image past the read point");
    assert_eq!(served(&decisions[3]).1, Lsn(3));
    // Below the horizon, page by page.
    let (at_lsn, decisions) = decide_many(read(5, 0), horizon(20, 6), pages).unwrap();
    assert_eq!(at_lsn, Lsn(5));
    assert_eq!(decisions[0], Decision::TooOld { lsn_min: Lsn(6) }, "changed at 9");
    assert_eq!(decisions[1], Decision::TooOld { lsn_min: Lsn(6) }, "changed at 12");
    assert_eq!(decisions[2], Decision::TooOld { lsn_min: Lsn(6) }, "folded to 11");
    assert_eq!(served(&decisions[3]).1, Lsn(3), "unchanged since 3");
    // A refusal of the request is one answer for all pages.
    assert_eq!(decide_many(read(30, 25), horizon(20, 0), pages), Err(Decision::NotYet { complete_lsn: Lsn(20) }));
    assert!(matches!(decide_many(read(0, 0), horizon(20, 0), pages), Err(Decision::BadRequest { .. })));
}

fn stub(lsn: u64, will_init: bool) -> SpilledRecord {
    SpilledRecord { lsn: Lsn(lsn), will_init, encoded_bytes: 30, held: Held::Slot }
}

fn spilled_lsns(plan: &ReadPlan) -> Vec<u64> {
    plan.spilled.as_ref().map_or(vec![], |s| s.lsns().iter().map(|l| l.0).collect())
}

/// The page with an image at 2, records at 3 and 5 spilled `to` where they go, 8 and 9 in memory.
fn partly_spilled<'a>(spilled: &'a [SpilledRecord], records: &'a [Arc<RedoRecord>], to: SpillTo) -> PageState<'a> {
    PageState { image_lsn: Some(Lsn(2)), records, spilled: Spilled { page: 0, to, records: spilled } }
}

#[test]
fn a_read_that_needs_spilled_records_names_one_slot_read() {
    let spilled = [stub(3, false), stub(5, false)];
    let records = [delta(8, b'c'), delta(9, b'd')];
    let page = partly_spilled(&spilled, &records, SpillTo::Slots);
    // Between the spilled records: the slot, for the one at 3; the page LSN is the spilled 3.
    let (_, page_lsn, plan) = served(&decide(read(4, 0), horizon(12, 0), page));
    assert_eq!((page_lsn, plan.image_lsn, spilled_lsns(&plan), lsns(&plan)), (Lsn(3), Some(Lsn(2)), vec![3], vec![]));
    assert_eq!(
        plan.spilled,
        Some(SpillRead::Slot { page: 0, lsns: vec![Lsn(3)], from_log: None, image: None, records_cell: None })
    );
    // Above them all: both spilled, then the ones in memory; the image and the slot are the
    // only device reads, two.
    let (_, page_lsn, plan) = served(&decide(read(12, 0), horizon(12, 0), page));
    assert_eq!((page_lsn, spilled_lsns(&plan), lsns(&plan)), (Lsn(9), vec![3, 5], vec![8, 9]));
    assert_eq!((plan.image_reads(), plan.device_reads()), (1, 2));
    // At the image: nothing to read but the image.
    let (_, page_lsn, plan) = served(&decide(read(2, 0), horizon(12, 0), page));
    assert_eq!((page_lsn, plan.spilled.clone(), plan.device_reads()), (Lsn(2), None, 1));
    // A newer image than the index knows of holds the spilled records: no slot read.
    let newer = PageState { image_lsn: Some(Lsn(5)), ..page };
    let (_, page_lsn, plan) = served(&decide(read(12, 0), horizon(12, 0), newer));
    assert_eq!((page_lsn, plan.spilled.clone(), lsns(&plan)), (Lsn(9), None, vec![8, 9]));
}

#[test]
fn a_plan_with_spilled_records_rebuilds_from_what_was_read_and_refuses_what_is_missing() {
    let spilled = [stub(3, false), stub(5, false)];
    let records = [delta(8, b'c')];
    let page = partly_spilled(&spilled, &records, SpillTo::Slots);
    let (_, _, plan) = served(&decide(read(12, 0), horizon(12, 0), page));
    let ranges = |lsn: u64, at: u32, byte: u8| RedoRecord {
        lsn: Lsn(lsn),
        page: 0,
        payload: crate::record::Payload::Ranges(vec![(at, vec![byte])]),
    };
    // What the slot gave: an older record (already in the image) and the two named.
    let fetched = [ranges(1, 0, b'x'), ranges(3, 1, b'a'), ranges(5, 2, b'b')];
    let image = b"....";
    assert_eq!(plan.rebuild_with(Some(image), &fetched, 4).unwrap(), b"cab.");
    let error = plan.rebuild_with(Some(image), &fetched[..2], 4).unwrap_err();
    assert_eq!(error.kind(), crate::ErrorKind::Corrupted);
    assert!(error.message().contains("LSN 5"), "{error}");
}

#[test]
#[should_panic(expected = "rebuilt with what was read of them")]
fn rebuilding_a_plan_with_spilled_records_without_them_is_a_bug() {
    let spilled = [stub(3, false)];
    let page = partly_spilled(&spilled, &[], SpillTo::Slots);
    let (_, _, plan) = served(&decide(read(12, 0), horizon(12, 0), page));
    let _ = plan.rebuild(Some(b"...."), 4);
}

#[test]
fn whole_page_records_cut_the_plan_in_memory_and_in_the_slot() {
    // A whole page in memory after the spilled records: neither the slot nor the image.
    let spilled = [stub(3, false), stub(5, false)];
    let records = [image(8, b'i'), delta(9, b'd')];
    let page = partly_spilled(&spilled, &records, SpillTo::Slots);
    let (_, _, plan) = served(&decide(read(12, 0), horizon(12, 0), page));
    assert_eq!((plan.image_lsn, plan.spilled.clone(), lsns(&plan), plan.device_reads()), (None, None, vec![8, 9], 0));
    // A whole page among the spilled records: the slot from it on, not the image.
    let spilled = [stub(3, false), stub(4, true), stub(5, false)];
    let page = partly_spilled(&spilled, &records, SpillTo::Slots);
    let (_, page_lsn, plan) = served(&decide(read(6, 0), horizon(12, 0), page));
    assert_eq!((page_lsn, plan.image_lsn, spilled_lsns(&plan)), (Lsn(5), None, vec![4, 5]));
    assert_eq!(plan.device_reads(), 1);
}

#[test]
fn a_whole_page_kept_in_the_log_and_the_slot_after_it_cost_two_reads() {
    // With slots on, a spilled image too large for the slot is in the log alone; a rebuild
    // starts from it (no stored image), reading it and the slot's later records.
    let spilled = [stub(3, false), SpilledRecord { held: Held::Log, ..stub(4, true) }, stub(5, false), stub(6, false)];
    let records = [delta(8, b'c')];
    let page = partly_spilled(&spilled, &records, SpillTo::Slots);
    let (_, page_lsn, plan) = served(&decide(read(12, 0), horizon(12, 0), page));
    assert_eq!((page_lsn, plan.image_lsn, spilled_lsns(&plan), lsns(&plan)), (Lsn(8), None, vec![4, 5, 6], vec![8]));
    assert_eq!(plan.spilled.as_ref().and_then(|s| s.from_log()), Some(Lsn(4)));
    assert_eq!(plan.device_reads(), 2);
    // Just the image: one log read.
    let (_, _, plan) = served(&decide(read(4, 0), horizon(12, 0), page));
    assert!(matches!(plan.spilled, Some(SpillRead::Log { .. })), "{plan:?}");
    assert_eq!(plan.device_reads(), 1);
}

#[test]
fn with_slots_off_a_plan_names_the_log_ranges_of_the_spilled_records() {
    let spilled = [stub(3, false), stub(4, false), stub(6, false)].map(|s| SpilledRecord { held: Held::Log, ..s });
    let records = [delta(8, b'c')];
    let page = partly_spilled(&spilled, &records, SpillTo::Log);
    let (_, _, plan) = served(&decide(read(12, 0), horizon(12, 0), page));
    let Some(SpillRead::Log { page, ranges, lsns }) = plan.spilled.clone() else { panic!("{plan:?}") };
    assert_eq!((page, lsns), (0, vec![Lsn(3), Lsn(4), Lsn(6)]));
    let ranges: Vec<(u64, u64)> = ranges.iter().map(|r| (r.after.0, r.through.0)).collect();
    assert_eq!(ranges, [(2, 4), (5, 6)]);
    assert_eq!(plan.device_reads(), 1 + 2);
}

#[test]
fn a_spilled_change_counts_for_the_horizon_rule() {
    // The page's only change after the image was spilled: a read below the horizon before it
    // is too old, as it would be were the record in memory.
    let spilled = [stub(7, false)];
    let page = partly_spilled(&spilled, &[], SpillTo::Slots);
    assert_eq!(decide(read(5, 0), horizon(20, 10), page), Decision::TooOld { lsn_min: Lsn(10) });
    let (_, page_lsn, _) = served(&decide(read(7, 0), horizon(20, 6), page));
    assert_eq!(page_lsn, Lsn(7));
}
