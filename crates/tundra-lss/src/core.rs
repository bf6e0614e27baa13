//! [`LogCore`], the log's decisions with no I/O: where the next element goes, which slots are
//! live, dead or cleared, which sectors to trim or zero (seed 001 §3.2.2), when to collect
//! garbage and which segment (§3.2.3: greedy, the highest garbage rate), and the counts every
//! figure of Table 1 is made from.
//!
//! The store on the drive and the fast model both drive this one state machine, in the same
//! order of events, so they take the same decisions; the store adds the I/O, the model only
//! counts. The caller runs [`LogCore::next_action`] after every write until it answers `None`,
//! and carries each action out as its doc says (flushes included, so that nothing is trimmed
//! before what replaces it is durable).

use std::collections::VecDeque;

use crate::error::{Error, Result};
use crate::geometry::{LogGeometry, SECTOR_BYTES, SectorNo, SegmentNo, SlotAddr};
use crate::policy::{Mode, Policy};

// A sector's cleared slots travel as a 16-bit mask.
const _: () = assert!(SECTOR_BYTES / LogGeometry::MIN_SLOT_BYTES <= u16::BITS);

/// Free segments the collector keeps for itself: one to relocate into while another is open.
pub const RESERVE_SEGMENTS: u32 = 2;

/// What a slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// Nothing was placed here since the segment was opened.
    Unwritten,
    /// The current version of an element.
    Live,
    /// An older version, still on the media: it costs physical space (C_inval).
    Dead,
    /// A dead version zeroed or trimmed away: logical space only (C_trim of equation 1).
    Cleared,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentState {
    Free,
    /// Receiving elements, user writes and relocations alike (one at a time, as in §3.2.3).
    Open,
    Closed,
    /// Collected and trimmed; reusable once a flush has made the trim durable, so that no
    /// element of its earlier life can reappear among new ones after a crash.
    Freed,
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    state: SegmentState,
    live: u32,
    dead: u32,
    cleared: u32,
    /// Counts segment openings: the newest segment is the one recovery resumes.
    epoch: u64,
}

/// Who placed an element: the counts of write amplification keep them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    User,
    Gc,
}

/// Lifetime counts of the log's work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreCounters {
    pub user_slots: u64,
    pub gc_slots: u64,
    /// Sectors rewritten by read-modify-write to zero their dead elements (virtual data trim).
    pub zeroed_sectors: u64,
    /// Sectors holding nothing live, trimmed whole (no write).
    pub trimmed_sectors: u64,
    pub segments_collected: u64,
    /// Live slots the collector dropped instead of moving (tombstones nothing older needs).
    pub dropped_slots: u64,
}

/// One sector's trim decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SectorWork {
    pub sector: SectorNo,
    pub kind: SectorWorkKind,
    /// Bit i set: the sector's slot i was dead and is now cleared.
    pub cleared_mask: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SectorWorkKind {
    /// Nothing live: trim the whole sector.
    Trim,
    /// Live elements remain: read the sector, zero the cleared slots, write it back.
    Zero,
}

/// What the caller must do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Flush, call [`LogCore::flushed`], then carry out [`LogCore::take_trim_work`].
    Trim,
    /// Collect this segment: flush and [`LogCore::flushed`]; relocate (or discard) each slot of
    /// [`LogCore::live_slots`]; flush and `flushed` again; trim the segment and call
    /// [`LogCore::finish_collect`].
    Collect(SegmentNo),
}

/// The log's state: every slot, every segment, and the running totals.
pub struct LogCore {
    geometry: LogGeometry,
    policy: Policy,
    slots: Vec<SlotState>,
    segments: Vec<Segment>,
    free: VecDeque<SegmentNo>,
    freed: Vec<SegmentNo>,
    /// The open segment and the index of its next slot.
    open: Option<(SegmentNo, u32)>,
    live: u64,
    dead: u64,
    cleared: u64,
    /// Sealed sectors that gained a dead slot since their last trim decision.
    pending: Vec<SectorNo>,
    next_epoch: u64,
    counters: CoreCounters,
}

impl LogCore {
    /// An empty log: every segment free.
    pub fn new(geometry: LogGeometry, policy: Policy) -> Result<LogCore> {
        policy.validate()?;
        let segment_count = geometry.segment_count as usize;
        Ok(LogCore {
            geometry,
            policy,
            slots: vec![SlotState::Unwritten; geometry.total_slots() as usize],
            segments: vec![
                Segment { state: SegmentState::Free, live: 0, dead: 0, cleared: 0, epoch: 0 };
                segment_count
            ],
            free: (0..geometry.segment_count).map(SegmentNo).collect(),
            freed: Vec::new(),
            open: None,
            live: 0,
            dead: 0,
            cleared: 0,
            pending: Vec::new(),
            next_epoch: 1,
            counters: CoreCounters::default(),
        })
    }

    /// A log as recovery found it: each slot live, dead or empty, and the epoch of each segment
    /// that holds anything. The newest segment is resumed after its last written slot; empty
    /// slots before that, and in every other used segment, count as cleared. Under trim-assisted
    /// mode every sector with a dead slot waits for a trim decision.
    pub fn recovered(
        geometry: LogGeometry,
        policy: Policy,
        slots: Vec<SlotState>,
        epochs: Vec<Option<u64>>,
    ) -> Result<LogCore> {
        let mut core = LogCore::new(geometry, policy)?;
        assert_eq!(slots.len(), core.slots.len());
        assert_eq!(epochs.len(), core.segments.len());
        assert!(slots.iter().all(|&s| s != SlotState::Cleared), "recovery reports cleared slots as unwritten");
        core.slots = slots;
        core.free.clear();
        let newest =
            (0..geometry.segment_count).filter(|&s| epochs[s as usize].is_some()).max_by_key(|&s| epochs[s as usize]);
        let sps = geometry.slots_per_segment();
        for s in 0..geometry.segment_count {
            let segment = SegmentNo(s);
            let Some(epoch) = epochs[s as usize] else {
                core.free.push_back(segment);
                continue;
            };
            let first = geometry.first_slot_of_segment(segment).0 as usize;
            let range = first..first + sps as usize;
            let end = if Some(s) == newest {
                range.clone().rev().find(|&i| core.slots[i] != SlotState::Unwritten).map_or(first, |i| i + 1)
            } else {
                range.end
            };
            let mut info = Segment { state: SegmentState::Closed, live: 0, dead: 0, cleared: 0, epoch };
            for i in first..end {
                match core.slots[i] {
                    SlotState::Live => info.live += 1,
                    SlotState::Dead => info.dead += 1,
                    _ => {
                        core.slots[i] = SlotState::Cleared;
                        info.cleared += 1;
                    }
                }
            }
            if Some(s) == newest && end < range.end {
                info.state = SegmentState::Open;
                core.open = Some((segment, (end - first) as u32));
            }
            core.live += u64::from(info.live);
            core.dead += u64::from(info.dead);
            core.cleared += u64::from(info.cleared);
            core.next_epoch = core.next_epoch.max(epoch + 1);
            core.segments[s as usize] = info;
        }
        if policy.mode == Mode::TrimAssisted {
            for sector in 0..geometry.total_sectors() {
                let sector = SectorNo(sector);
                if core.sealed(sector) && core.sector_slots(sector).any(|i| core.slots[i] == SlotState::Dead) {
                    core.pending.push(sector);
                }
            }
        }
        Ok(core)
    }

    pub fn geometry(&self) -> LogGeometry {
        self.geometry
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn counters(&self) -> CoreCounters {
        self.counters
    }

    pub fn slot_state(&self, slot: SlotAddr) -> SlotState {
        self.slots[slot.0 as usize]
    }

    pub fn segment_state(&self, segment: SegmentNo) -> SegmentState {
        self.segments[segment.0 as usize].state
    }

    pub fn segment_epoch(&self, segment: SegmentNo) -> u64 {
        self.segments[segment.0 as usize].epoch
    }

    /// The open segment and its next slot, if one is open.
    pub fn open(&self) -> Option<(SegmentNo, u32)> {
        self.open
    }

    pub fn live_slots_total(&self) -> u64 {
        self.live
    }

    /// Slots whose bytes are on the media: live and dead, not cleared. Physical space in slots.
    pub fn physical_slots(&self) -> u64 {
        self.live + self.dead
    }

    /// Slots the log occupies logically: live, dead and cleared.
    pub fn footprint_slots(&self) -> u64 {
        self.live + self.dead + self.cleared
    }

    /// γ of §3.2.1: the logical footprint over the live data.
    pub fn gamma(&self) -> f64 {
        ratio(self.footprint_slots(), self.live)
    }

    /// γ_t of equation 1: the footprint less what was trimmed, over the live data.
    pub fn gamma_t(&self) -> f64 {
        ratio(self.physical_slots(), self.live)
    }

    /// The most live elements the log accepts: its segments less the reserve, at γ_th. A log
    /// fuller than that could not bring γ down to γ_th.
    pub fn live_limit(&self) -> u64 {
        let usable = u64::from(self.geometry.segment_count - RESERVE_SEGMENTS - 1);
        (usable as f64 * f64::from(self.geometry.slots_per_segment()) / self.policy.gamma_th) as u64
    }

    /// The most live slots that fit at all (tombstones may use the room up to it, so that a full
    /// log can still delete).
    pub fn hard_limit(&self) -> u64 {
        u64::from(self.geometry.segment_count - RESERVE_SEGMENTS - 1) * u64::from(self.geometry.slots_per_segment())
    }

    /// Places one element in the open segment (opening the next free one when it is full).
    pub fn place(&mut self, kind: WriteKind) -> Result<SlotAddr> {
        let sps = self.geometry.slots_per_segment();
        let (segment, index) = match self.open {
            Some((segment, index)) if index < sps => (segment, index),
            _ => self.open_next()?,
        };
        let slot = SlotAddr(self.geometry.first_slot_of_segment(segment).0 + u64::from(index));
        assert_eq!(self.slots[slot.0 as usize], SlotState::Unwritten);
        self.slots[slot.0 as usize] = SlotState::Live;
        self.segments[segment.0 as usize].live += 1;
        self.live += 1;
        self.open = Some((segment, index + 1));
        match kind {
            WriteKind::User => self.counters.user_slots += 1,
            WriteKind::Gc => self.counters.gc_slots += 1,
        }
        // A sector sealed with dead slots in it (elements replaced while it was filling) now
        // waits for its trim decision like any other.
        let sector = self.geometry.sector_of(slot);
        let last_in_sector = self.geometry.slot_in_sector(slot) + 1 == self.geometry.slots_per_sector() as usize;
        if last_in_sector
            && self.policy.mode == Mode::TrimAssisted
            && self.sector_slots(sector).any(|i| self.slots[i] == SlotState::Dead)
        {
            self.pending.push(sector);
        }
        Ok(slot)
    }

    fn open_next(&mut self) -> Result<(SegmentNo, u32)> {
        if let Some((segment, _)) = self.open.take() {
            self.segments[segment.0 as usize].state = SegmentState::Closed;
        }
        let segment = self.free.pop_front().ok_or_else(|| Error::full("the log has no free segment left"))?;
        let info = &mut self.segments[segment.0 as usize];
        assert_eq!(info.state, SegmentState::Free);
        assert_eq!((info.live, info.dead, info.cleared), (0, 0, 0));
        info.state = SegmentState::Open;
        info.epoch = self.next_epoch;
        self.next_epoch += 1;
        Ok((segment, 0))
    }

    /// An element was replaced or deleted: its slot is dead. Under trim-assisted mode its sector,
    /// once sealed, waits for a trim decision.
    pub fn kill(&mut self, slot: SlotAddr) {
        self.mark_dead(slot);
        let sector = self.geometry.sector_of(slot);
        if self.policy.mode == Mode::TrimAssisted && self.sealed(sector) {
            self.pending.push(sector);
        }
    }

    fn mark_dead(&mut self, slot: SlotAddr) {
        let state = &mut self.slots[slot.0 as usize];
        assert_eq!(*state, SlotState::Live, "only a live slot dies");
        *state = SlotState::Dead;
        let segment = &mut self.segments[self.geometry.segment_of(slot).0 as usize];
        segment.live -= 1;
        segment.dead += 1;
        self.live -= 1;
        self.dead += 1;
    }

    /// True once no more slots will be placed in the sector.
    fn sealed(&self, sector: SectorNo) -> bool {
        let segment = self.geometry.segment_of_sector(sector);
        match self.segments[segment.0 as usize].state {
            SegmentState::Closed => true,
            SegmentState::Open => {
                let index = (sector.0 - self.geometry.first_sector_of_segment(segment).0) + 1;
                let cursor = self.open.map_or(0, |(_, c)| u64::from(c));
                index * u64::from(self.geometry.slots_per_sector()) <= cursor
            }
            SegmentState::Free | SegmentState::Freed => false,
        }
    }

    fn sector_slots(&self, sector: SectorNo) -> std::ops::Range<usize> {
        let first = self.geometry.first_slot_of_sector(sector).0 as usize;
        first..first + self.geometry.slots_per_sector() as usize
    }

    /// What to do next, or `None` when the log is within its policy.
    pub fn next_action(&self) -> Option<Action> {
        // At most one segment's worth of sectors waits, however small the log.
        let batch = self.policy.trim_batch_sectors.min(self.geometry.sectors_per_segment as usize);
        if self.policy.mode == Mode::TrimAssisted && self.pending.len() >= batch {
            return Some(Action::Trim);
        }
        if self.gc_due() {
            return self.pick_victim().map(Action::Collect);
        }
        None
    }

    /// Whether garbage collection should run: free segments short, or the policy's factor over
    /// its threshold (γ for current practice; γ_t or the logical cap for trim-assisted).
    pub fn gc_due(&self) -> bool {
        if self.free.len() + self.freed.len() < RESERVE_SEGMENTS as usize {
            return true;
        }
        if self.live == 0 {
            return false;
        }
        match self.policy.mode {
            Mode::CurrentPractice => self.gamma() > self.policy.gamma_th,
            Mode::TrimAssisted => self.gamma_t() > self.policy.gamma_th || self.gamma() > self.policy.logical_cap,
        }
    }

    /// The closed segment with the fewest live slots (the highest garbage rate, §3.2.3), the
    /// lowest numbered among equals; `None` when no closed segment has anything to give back.
    pub fn pick_victim(&self) -> Option<SegmentNo> {
        let sps = self.geometry.slots_per_segment();
        self.segments
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state == SegmentState::Closed && s.live < sps)
            .min_by_key(|(i, s)| (s.live, *i))
            .map(|(i, _)| SegmentNo(i as u32))
    }

    /// The live slots of a segment, in address order.
    pub fn live_slots(&self, segment: SegmentNo) -> Vec<SlotAddr> {
        let first = self.geometry.first_slot_of_segment(segment).0;
        let sps = u64::from(self.geometry.slots_per_segment());
        (first..first + sps).filter(|&i| self.slots[i as usize] == SlotState::Live).map(SlotAddr).collect()
    }

    /// Moves a live element of the segment being collected: a new slot for it, the old one dead.
    pub fn relocate(&mut self, from: SlotAddr) -> Result<SlotAddr> {
        let to = self.place(WriteKind::Gc)?;
        self.mark_dead(from);
        Ok(to)
    }

    /// Drops a live element of the segment being collected instead of moving it.
    pub fn discard(&mut self, slot: SlotAddr) {
        self.mark_dead(slot);
        self.counters.dropped_slots += 1;
    }

    /// The collected segment was trimmed: every slot of it is gone. `on_dead` hears each slot that
    /// still held a dead version, which the trim destroys. The segment is reusable after the
    /// next flush.
    pub fn finish_collect(&mut self, segment: SegmentNo, mut on_dead: impl FnMut(SlotAddr)) {
        let info = self.segments[segment.0 as usize];
        assert_eq!(info.state, SegmentState::Closed, "only a closed segment is collected");
        assert_eq!(info.live, 0, "every live element was relocated or discarded first");
        let first = self.geometry.first_slot_of_segment(segment).0;
        for i in first..first + u64::from(self.geometry.slots_per_segment()) {
            if self.slots[i as usize] == SlotState::Dead {
                on_dead(SlotAddr(i));
            }
            self.slots[i as usize] = SlotState::Unwritten;
        }
        self.dead -= u64::from(info.dead);
        self.cleared -= u64::from(info.cleared);
        self.segments[segment.0 as usize] =
            Segment { state: SegmentState::Freed, live: 0, dead: 0, cleared: 0, epoch: 0 };
        self.freed.push(segment);
        self.counters.segments_collected += 1;
    }

    /// Everything issued so far is durable: collected segments become free.
    pub fn flushed(&mut self) {
        for segment in self.freed.drain(..) {
            self.segments[segment.0 as usize].state = SegmentState::Free;
            self.free.push_back(segment);
        }
    }

    /// The trim decisions for every sector waiting (§3.2.2): a sector with nothing live is
    /// trimmed; one whose γ_s = 4 KiB / S_val exceeds γ_th has its dead slots zeroed; others
    /// stay as they are until more of them dies. The decided slots count as cleared from now on.
    pub fn take_trim_work(&mut self) -> Vec<SectorWork> {
        let mut pending = std::mem::take(&mut self.pending);
        pending.sort_unstable();
        pending.dedup();
        let mut work = Vec::new();
        for sector in pending {
            let segment = self.geometry.segment_of_sector(sector);
            if !matches!(self.segments[segment.0 as usize].state, SegmentState::Open | SegmentState::Closed) {
                continue;
            }
            let first = self.geometry.first_slot_of_sector(sector).0 as usize;
            let states = &self.slots[self.sector_slots(sector)];
            let live = states.iter().filter(|&&s| s == SlotState::Live).count() as u32;
            let dead_mask =
                states.iter().enumerate().filter(|(_, s)| **s == SlotState::Dead).fold(0u16, |m, (i, _)| m | 1 << i);
            if dead_mask == 0 {
                continue;
            }
            let kind = if live == 0 {
                SectorWorkKind::Trim
            } else if f64::from(SECTOR_BYTES) / f64::from(live * self.geometry.slot_bytes) > self.policy.gamma_th {
                SectorWorkKind::Zero
            } else {
                continue;
            };
            let cleared = dead_mask.count_ones();
            for i in 0..self.geometry.slots_per_sector() as usize {
                if dead_mask & (1 << i) != 0 {
                    self.slots[first + i] = SlotState::Cleared;
                }
            }
            let info = &mut self.segments[segment.0 as usize];
            info.dead -= cleared;
            info.cleared += cleared;
            self.dead -= u64::from(cleared);
            self.cleared += u64::from(cleared);
            match kind {
                SectorWorkKind::Trim => self.counters.trimmed_sectors += 1,
                SectorWorkKind::Zero => self.counters.zeroed_sectors += 1,
            }
            work.push(SectorWork { sector, kind, cleared_mask: dead_mask });
        }
        work
    }

    /// Recounts every total from the slots; panics on a mismatch. For tests.
    pub fn check_invariants(&self) {
        let (mut live, mut dead, mut cleared) = (0u64, 0u64, 0u64);
        let sps = self.geometry.slots_per_segment() as usize;
        for (s, info) in self.segments.iter().enumerate() {
            let slots = &self.slots[s * sps..(s + 1) * sps];
            let count = |want| slots.iter().filter(|&&x| x == want).count() as u32;
            assert_eq!(info.live, count(SlotState::Live), "segment {s} live count");
            assert_eq!(info.dead, count(SlotState::Dead), "segment {s} dead count");
            assert_eq!(info.cleared, count(SlotState::Cleared), "segment {s} cleared count");
            if matches!(info.state, SegmentState::Free | SegmentState::Freed) {
                assert_eq!(count(SlotState::Unwritten) as usize, sps, "segment {s} is free but holds slots");
            }
            live += u64::from(info.live);
            dead += u64::from(info.dead);
            cleared += u64::from(info.cleared);
        }
        assert_eq!((live, dead, cleared), (self.live, self.dead, self.cleared), "log totals");
        let free = self.segments.iter().filter(|s| s.state == SegmentState::Free).count();
        assert_eq!(free, self.free.len(), "free list");
        assert_eq!(
            self.segments.iter().filter(|s| s.state == SegmentState::Open).count(),
            usize::from(self.open.is_some())
        );
    }
}

fn ratio(numerator: u64, denominator: u64) -> f64 {
    if denominator == 0 { 1.0 } else { numerator as f64 / denominator as f64 }
}

#[cfg(test)]
mod tests;
