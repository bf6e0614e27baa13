//! The shape of the log: fixed-size element slots packed into 4 KiB sectors, sectors into
//! segments. Every address the policy and the store exchange is a [`SlotAddr`], a slot's index
//! counted from the first slot of the first segment, so that its sector and segment follow by
//! division.

use crate::error::{Error, Result};

/// The drive's sector: the unit of a trim and of a read-modify-write (seed 001 §3.2.2).
pub const SECTOR_BYTES: u32 = 4096;

/// A slot's index across the whole log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotAddr(pub u64);

/// A sector's index across the whole log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SectorNo(pub u64);

/// A segment's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentNo(pub u32);

/// How the log is cut: slots of `slot_bytes` (a power of two dividing a sector), sectors, and
/// `segment_count` segments of `sectors_per_segment` sectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogGeometry {
    pub slot_bytes: u32,
    pub sectors_per_segment: u32,
    pub segment_count: u32,
}

impl LogGeometry {
    pub const MIN_SLOT_BYTES: u32 = 512;

    /// A geometry after checking it: slots a power of two between 512 bytes and a sector, at
    /// least two sectors per segment, at least four segments (two are the collector's reserve).
    pub fn new(slot_bytes: u32, sectors_per_segment: u32, segment_count: u32) -> Result<LogGeometry> {
        if !slot_bytes.is_power_of_two() || !(Self::MIN_SLOT_BYTES..=SECTOR_BYTES).contains(&slot_bytes) {
            return Err(Error::invalid(format!(
                "element slots of {slot_bytes} bytes: a power of two from {} to {SECTOR_BYTES} is needed",
                Self::MIN_SLOT_BYTES
            )));
        }
        if sectors_per_segment < 2 {
            return Err(Error::invalid(format!("{sectors_per_segment} sectors per segment: at least 2 are needed")));
        }
        if segment_count < 4 {
            return Err(Error::invalid(format!("{segment_count} segments: at least 4 are needed")));
        }
        let geometry = LogGeometry { slot_bytes, sectors_per_segment, segment_count };
        if geometry.total_slots() > u64::from(u32::MAX) {
            return Err(Error::invalid("more than 2^32 slots: use larger slots or fewer segments"));
        }
        Ok(geometry)
    }

    pub fn slots_per_sector(&self) -> u32 {
        SECTOR_BYTES / self.slot_bytes
    }

    pub fn slots_per_segment(&self) -> u32 {
        self.slots_per_sector() * self.sectors_per_segment
    }

    pub fn segment_bytes(&self) -> u64 {
        u64::from(self.sectors_per_segment) * u64::from(SECTOR_BYTES)
    }

    pub fn total_slots(&self) -> u64 {
        u64::from(self.slots_per_segment()) * u64::from(self.segment_count)
    }

    pub fn total_sectors(&self) -> u64 {
        u64::from(self.sectors_per_segment) * u64::from(self.segment_count)
    }

    pub fn sector_of(&self, slot: SlotAddr) -> SectorNo {
        SectorNo(slot.0 / u64::from(self.slots_per_sector()))
    }

    pub fn segment_of(&self, slot: SlotAddr) -> SegmentNo {
        SegmentNo((slot.0 / u64::from(self.slots_per_segment())) as u32)
    }

    pub fn segment_of_sector(&self, sector: SectorNo) -> SegmentNo {
        SegmentNo((sector.0 / u64::from(self.sectors_per_segment)) as u32)
    }

    /// The slot's position inside its sector.
    pub fn slot_in_sector(&self, slot: SlotAddr) -> usize {
        (slot.0 % u64::from(self.slots_per_sector())) as usize
    }

    pub fn first_slot_of_sector(&self, sector: SectorNo) -> SlotAddr {
        SlotAddr(sector.0 * u64::from(self.slots_per_sector()))
    }

    pub fn first_slot_of_segment(&self, segment: SegmentNo) -> SlotAddr {
        SlotAddr(u64::from(segment.0) * u64::from(self.slots_per_segment()))
    }

    pub fn first_sector_of_segment(&self, segment: SegmentNo) -> SectorNo {
        SectorNo(u64::from(segment.0) * u64::from(self.sectors_per_segment))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_divide_into_sectors_and_segments() {
        let g = LogGeometry::new(2048, 4, 8).unwrap();
        assert_eq!(g.slots_per_sector(), 2);
        assert_eq!(g.slots_per_segment(), 8);
        assert_eq!(g.sector_of(SlotAddr(9)), SectorNo(4));
        assert_eq!(g.segment_of(SlotAddr(9)), SegmentNo(1));
        assert_eq!(g.slot_in_sector(SlotAddr(9)), 1);
        assert_eq!(g.first_slot_of_segment(SegmentNo(2)), SlotAddr(16));
        assert_eq!(g.segment_of_sector(SectorNo(7)), SegmentNo(1));
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(LogGeometry::new(3000, 4, 8).is_err());
        assert!(LogGeometry::new(128, 4, 8).is_err());
        assert!(LogGeometry::new(8192, 4, 8).is_err());
        assert!(LogGeometry::new(2048, 1, 8).is_err());
        assert!(LogGeometry::new(2048, 4, 3).is_err());
    }
}
