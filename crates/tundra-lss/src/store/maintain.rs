//! The store's side of [`LogCore`]'s actions: virtual data trim (§3.2.2: read-modify-write of a
//! sector to zero its dead elements, or a trim of a sector with nothing live) and garbage
//! collection of a segment, each with the flushes that order it after what it depends on.

use tundra_device::buf::BlockBuf;

use crate::core::{Action, SectorWorkKind};
use crate::error::{Error, Result};
use crate::geometry::{SECTOR_BYTES, SectorNo, SegmentNo, SlotAddr};

use super::{Lss, sector_lba};

impl Lss {
    /// Carries out the core's actions until it has none.
    pub(super) fn maintain(&mut self) -> Result<()> {
        while let Some(action) = self.core.next_action() {
            match action {
                Action::Trim => self.run_trims()?,
                Action::Collect(victim) => self.collect(victim)?,
            }
        }
        Ok(())
    }

    /// Zeroes or trims the dead elements of the sectors the core decided on.
    fn run_trims(&mut self) -> Result<()> {
        // A dead version may be cleared only once the version that replaced it is durable: a
        // crash must not leave neither.
        if !bugs::trim_before_flush() {
            self.sync()?;
        }
        let slot_bytes = self.geometry.slot_bytes as usize;
        for work in self.core.take_trim_work() {
            let lba = sector_lba(work.sector);
            match work.kind {
                SectorWorkKind::Trim => {
                    self.device.trim(lba, 1)?;
                    self.io.sector_trims += 1;
                }
                SectorWorkKind::Zero => {
                    let mut buf = BlockBuf::zeroed(SECTOR_BYTES as usize);
                    self.device.read(lba, &mut buf)?;
                    self.io.sector_reads += 1;
                    for i in cleared(work.cleared_mask) {
                        buf[i * slot_bytes..(i + 1) * slot_bytes].fill(0);
                    }
                    self.device.write(lba, &buf)?;
                    self.io.sector_writes += 1;
                }
            }
            let first = self.geometry.first_slot_of_sector(work.sector);
            for i in cleared(work.cleared_mask) {
                self.destroy(SlotAddr(first.0 + i as u64));
            }
        }
        Ok(())
    }

    /// Collects a segment: its live elements move to the open segment (a tombstone nothing
    /// older needs is dropped), the copies are made durable, and the segment is trimmed.
    fn collect(&mut self, victim: SegmentNo) -> Result<()> {
        // Makes earlier collections' trims durable, so their segments may be reused.
        self.sync()?;
        let mut sector_buf = BlockBuf::zeroed(SECTOR_BYTES as usize);
        let mut buffered: Option<SectorNo> = None;
        let slot_bytes = self.geometry.slot_bytes as usize;
        for from in self.core.live_slots(victim) {
            let sector = self.geometry.sector_of(from);
            if buffered != Some(sector) {
                self.device.read(sector_lba(sector), &mut sector_buf)?;
                self.io.sector_reads += 1;
                buffered = Some(sector);
            }
            let at = self.geometry.slot_in_sector(from) * slot_bytes;
            let element = super::decode_element(&sector_buf[at..at + slot_bytes], from)?;
            let handle = self.owner[from.0 as usize];
            let entry = &self.entries[handle as usize];
            let Some(element) = element.filter(|e| e.seq == entry.seq && e.key == entry.key) else {
                return Err(Error::corrupted(format!(
                    "element slot {} should hold version {} of its key for garbage collection",
                    from.0, entry.seq
                )));
            };
            let droppable = element.tombstone && entry.versions == 1;
            if droppable || bugs::gc_loses(&element) {
                self.core.discard(from);
                let entry = &mut self.entries[handle as usize];
                entry.current = None;
                self.live_elements -= u64::from(!element.tombstone);
                continue;
            }
            let to = self.core.relocate(from)?;
            self.write_slot(to, element)?;
            let entry = &mut self.entries[handle as usize];
            entry.current = Some(to);
            entry.versions += 1;
            self.owner[to.0 as usize] = handle;
        }
        // The copies must be durable before the originals go.
        self.sync()?;
        // The peak of this collection: the copies and the originals are both on the device.
        if self.meters.is_some() {
            let (device, slots) = self.space();
            if let Some(meters) = self.meters.as_mut() {
                meters.device.sample_gc_peak(device.0, device.1, device.2);
                meters.slots.sample_gc_peak(slots.0, slots.1, slots.2);
            }
        }
        let first = self.geometry.first_sector_of_segment(victim);
        self.device.trim(sector_lba(first), u64::from(self.geometry.sectors_per_segment))?;
        self.io.sector_trims += u64::from(self.geometry.sectors_per_segment);
        let mut gone = Vec::new();
        self.core.finish_collect(victim, |slot| gone.push(slot));
        for slot in gone {
            self.destroy(slot);
        }
        Ok(())
    }
}

/// The positions of the set bits of a sector's cleared mask.
fn cleared(mask: u16) -> impl Iterator<Item = usize> {
    (0..u16::BITS as usize).filter(move |i| mask & (1 << i) != 0)
}

/// Bugs the crash tests inject to show their oracle catches them; off outside tests.
pub(super) mod bugs {
    use super::super::format::Element;

    #[cfg(test)]
    thread_local! {
        static TRIM_BEFORE_FLUSH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        static GC_LOSES_ELEMENTS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Test-only: clear dead versions without first making their replacements durable.
    #[cfg(test)]
    pub fn set_trim_before_flush(on: bool) {
        TRIM_BEFORE_FLUSH.with(|flag| flag.set(on));
    }

    /// Test-only: garbage collection drops the live elements whose key ends in 7 instead of
    /// moving them.
    #[cfg(test)]
    pub fn set_gc_loses_elements(on: bool) {
        GC_LOSES_ELEMENTS.with(|flag| flag.set(on));
    }

    pub fn trim_before_flush() -> bool {
        #[cfg(test)]
        return TRIM_BEFORE_FLUSH.with(|flag| flag.get());
        #[cfg(not(test))]
        false
    }

    pub fn gc_loses(element: &Element) -> bool {
        #[cfg(test)]
        return !element.tombstone && element.key.last() == Some(&b'7') && GC_LOSES_ELEMENTS.with(|flag| flag.get());
        #[cfg(not(test))]
        {
            let _ = element;
            false
        }
    }
}
