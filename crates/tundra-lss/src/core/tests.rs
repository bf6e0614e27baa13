//! The core's decisions one by one on small logs, and its totals under a random workload.

use super::*;
use crate::model::run_model;
use crate::workload::Scale;

fn core(slot_bytes: u32, policy: Policy) -> LogCore {
    LogCore::new(LogGeometry::new(slot_bytes, 2, 8).unwrap(), policy).unwrap()
}

#[test]
fn a_dead_slot_beside_a_live_one_is_zeroed_and_a_dead_sector_trimmed() {
    let mut log = core(2048, Policy { trim_batch_sectors: 1, ..Policy::trim_assisted(1.2, 2.5) });
    let slots: Vec<SlotAddr> = (0..4).map(|_| log.place(WriteKind::User).unwrap()).collect();
    log.kill(slots[0]);
    assert_eq!(log.next_action(), Some(Action::Trim));
    let work = log.take_trim_work();
    // γ_s = 4096 / 2048 = 2 > 1.2: the dead half is zeroed by read-modify-write.
    assert_eq!(work, vec![SectorWork { sector: SectorNo(0), kind: SectorWorkKind::Zero, cleared_mask: 0b01 }]);
    assert_eq!(log.slot_state(slots[0]), SlotState::Cleared);
    log.kill(slots[1]);
    let work = log.take_trim_work();
    assert_eq!(work, vec![SectorWork { sector: SectorNo(0), kind: SectorWorkKind::Trim, cleared_mask: 0b10 }]);
    assert_eq!((log.counters().zeroed_sectors, log.counters().trimmed_sectors), (1, 1));
    assert_eq!(log.physical_slots(), 2);
    assert_eq!(log.footprint_slots(), 4);
    log.check_invariants();
}

#[test]
fn a_sector_mostly_live_waits_below_gamma_th() {
    // Eight 512-byte slots: one dead leaves γ_s = 4096 / 3584 ≈ 1.14, below 1.2.
    let mut log = core(512, Policy { trim_batch_sectors: 1, ..Policy::trim_assisted(1.2, 2.5) });
    let slots: Vec<SlotAddr> = (0..8).map(|_| log.place(WriteKind::User).unwrap()).collect();
    log.kill(slots[3]);
    assert!(log.take_trim_work().is_empty());
    assert_eq!(log.slot_state(slots[3]), SlotState::Dead);
    // A second dead slot: γ_s = 4096 / 3072 ≈ 1.33, so both are zeroed.
    log.kill(slots[5]);
    let work = log.take_trim_work();
    assert_eq!(work[0].kind, SectorWorkKind::Zero);
    assert_eq!(work[0].cleared_mask, 1 << 3 | 1 << 5);
    log.check_invariants();
}

#[test]
fn a_sector_still_filling_is_decided_once_sealed() {
    let mut log = core(2048, Policy { trim_batch_sectors: 1, ..Policy::trim_assisted(1.2, 2.5) });
    let first = log.place(WriteKind::User).unwrap();
    log.kill(first);
    assert_eq!(log.next_action(), None, "the open sector is not decided while it fills");
    log.place(WriteKind::User).unwrap();
    assert_eq!(log.next_action(), Some(Action::Trim));
    assert_eq!(log.take_trim_work()[0].kind, SectorWorkKind::Zero);
}

#[test]
fn current_practice_never_trims_and_collects_above_gamma_th() {
    let mut log = core(2048, Policy::current_practice(1.2));
    // Two segments of four slots each, then overwrite three elements of the first.
    let slots: Vec<SlotAddr> = (0..8).map(|_| log.place(WriteKind::User).unwrap()).collect();
    for &slot in &slots[..3] {
        log.place(WriteKind::User).unwrap();
        log.kill(slot);
    }
    // 11 placed, 8 live: γ = 1.375 > 1.2.
    assert!(log.gamma() > 1.2);
    let Some(Action::Collect(victim)) = log.next_action() else { panic!("collection is due") };
    assert_eq!(victim, SegmentNo(0), "the segment with the fewest live slots");
    let live = log.live_slots(victim);
    assert_eq!(live, vec![slots[3]]);
    log.flushed();
    log.relocate(live[0]).unwrap();
    let mut destroyed = Vec::new();
    log.finish_collect(victim, |slot| destroyed.push(slot));
    assert_eq!(destroyed, vec![slots[0], slots[1], slots[2], slots[3]]);
    assert_eq!(log.segment_state(victim), SegmentState::Freed);
    log.flushed();
    assert_eq!(log.segment_state(victim), SegmentState::Free);
    assert_eq!(log.counters().zeroed_sectors + log.counters().trimmed_sectors, 0);
    log.check_invariants();
}

#[test]
fn recovery_resumes_the_newest_segment_and_clears_holes() {
    let geometry = LogGeometry::new(2048, 2, 4).unwrap();
    let mut slots = vec![SlotState::Unwritten; 16];
    // Segment 1 (epoch 3): full, with a hole at slot 5. Segment 2 (epoch 4): two slots written.
    for (i, state) in
        [(4, SlotState::Live), (6, SlotState::Dead), (7, SlotState::Live), (8, SlotState::Live), (9, SlotState::Live)]
    {
        slots[i] = state;
    }
    let epochs = vec![None, Some(3), Some(4), None];
    let log = LogCore::recovered(geometry, Policy::trim_assisted(1.2, 2.5), slots, epochs).unwrap();
    assert_eq!(log.open(), Some((SegmentNo(2), 2)));
    assert_eq!(log.slot_state(SlotAddr(5)), SlotState::Cleared);
    assert_eq!(log.slot_state(SlotAddr(10)), SlotState::Unwritten);
    assert_eq!((log.live_slots_total(), log.physical_slots(), log.footprint_slots()), (4, 5, 6));
    assert_eq!(log.pending, vec![SectorNo(3)], "the sector with a dead slot waits for its decision");
    log.check_invariants();
}

#[test]
fn the_totals_hold_under_a_random_workload() {
    for mode in [Mode::CurrentPractice, Mode::TrimAssisted] {
        let policy = Policy { mode, ..Policy::trim_assisted(1.2, 2.5) };
        let config = Scale::Tiny.run(policy, 5);
        let figures = run_model(&config).unwrap();
        assert!(figures.write_amplification > 1.0, "{mode:?}: {figures:?}");
        assert!(figures.segments_collected > 0, "{mode:?}: {figures:?}");
    }
}
