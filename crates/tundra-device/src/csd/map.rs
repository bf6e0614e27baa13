//! The logical-to-physical map: one packed 7-byte entry per LBA (seed 000 §4.1.2: PolarCSD 2.0
//! stores offsets in 16-byte units so that an entry takes 7 bytes instead of 8).
//!
//! An entry holds the 16-byte unit address of the record (40 bits), the payload length in units
//! minus one (8 bits) and flags (mapped, raw). An all-zero entry is an unmapped LBA, which reads
//! as zeros and costs no media.

use crate::{Error, Result};

use super::layout::MAX_PAYLOAD_UNITS;

pub const ENTRY_BYTES: usize = 7;
const FLAG_MAPPED: u64 = 1;
const FLAG_RAW: u64 = 2;
const LOCATION_MASK: u64 = (1 << 40) - 1;

/// Where one LBA's current record lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapEntry {
    /// Unit address of the record header.
    pub location: u64,
    /// Payload length in 16-byte units, 1..=256.
    pub payload_units: u16,
    /// The payload is the block as is, not deflate.
    pub raw: bool,
}

impl MapEntry {
    /// Bytes the record occupies on the media, header included.
    pub fn record_bytes(&self) -> u64 {
        16 * (1 + u64::from(self.payload_units))
    }

    /// Payload bytes after 16-byte rounding: what the drive reports as physically used.
    pub fn payload_bytes(&self) -> u64 {
        16 * u64::from(self.payload_units)
    }

    fn pack(&self) -> u64 {
        assert!(self.location <= LOCATION_MASK);
        assert!((1..=MAX_PAYLOAD_UNITS as u16).contains(&self.payload_units));
        let flags = FLAG_MAPPED | if self.raw { FLAG_RAW } else { 0 };
        self.location | u64::from(self.payload_units - 1) << 40 | flags << 48
    }

    fn unpack(word: u64) -> Result<Option<MapEntry>> {
        let flags = word >> 48;
        if flags == 0 {
            return if word == 0 { Ok(None) } else { Err(Error::corrupted("map entry with data but no mapped flag")) };
        }
        if flags & !(FLAG_MAPPED | FLAG_RAW) != 0 || flags & FLAG_MAPPED == 0 {
            return Err(Error::corrupted(format!("map entry with unknown flags {flags:#x}")));
        }
        Ok(Some(MapEntry {
            location: word & LOCATION_MASK,
            payload_units: ((word >> 40) & 0xff) as u16 + 1,
            raw: flags & FLAG_RAW != 0,
        }))
    }
}

/// The whole map, as one contiguous array of packed entries.
pub struct Map {
    bytes: Vec<u8>,
}

impl Map {
    #[cfg(test)]
    pub fn new(blocks: u64) -> Map {
        Map { bytes: vec![0; blocks as usize * ENTRY_BYTES] }
    }

    /// A map from a checkpoint's bytes, every entry checked.
    pub fn from_bytes(blocks: u64, bytes: Vec<u8>) -> Result<Map> {
        if bytes.len() != blocks as usize * ENTRY_BYTES {
            return Err(Error::corrupted("checkpoint map has the wrong length"));
        }
        let map = Map { bytes };
        for lba in 0..blocks {
            MapEntry::unpack(map.word(lba))?;
        }
        Ok(map)
    }

    pub fn block_count(&self) -> u64 {
        (self.bytes.len() / ENTRY_BYTES) as u64
    }

    fn word(&self, lba: u64) -> u64 {
        let at = lba as usize * ENTRY_BYTES;
        let mut word = [0u8; 8];
        word[..ENTRY_BYTES].copy_from_slice(&self.bytes[at..at + ENTRY_BYTES]);
        u64::from_le_bytes(word)
    }

    pub fn get(&self, lba: u64) -> Option<MapEntry> {
        // Entries are validated when loaded and only ever written by `set`.
        MapEntry::unpack(self.word(lba)).expect("map entries are valid once loaded")
    }

    pub fn set(&mut self, lba: u64, entry: Option<MapEntry>) {
        let word = entry.map_or(0, |e| e.pack());
        let at = lba as usize * ENTRY_BYTES;
        self.bytes[at..at + ENTRY_BYTES].copy_from_slice(&word.to_le_bytes()[..ENTRY_BYTES]);
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn memory_bytes(&self) -> u64 {
        self.bytes.capacity() as u64
    }

    /// Every mapped LBA with its entry.
    pub fn iter(&self) -> impl Iterator<Item = (u64, MapEntry)> + '_ {
        (0..self.block_count()).filter_map(|lba| self.get(lba).map(|e| (lba, e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let mut map = Map::new(10);
        assert_eq!(map.memory_bytes(), 70);
        let a = MapEntry { location: LOCATION_MASK, payload_units: 256, raw: true };
        let b = MapEntry { location: 0, payload_units: 1, raw: false };
        map.set(3, Some(a));
        map.set(4, Some(b));
        assert_eq!(map.get(3), Some(a));
        assert_eq!(map.get(4), Some(b));
        assert_eq!(map.get(5), None);
        map.set(3, None);
        assert_eq!(map.get(3), None);
        assert_eq!(map.iter().count(), 1);
        let copy = Map::from_bytes(10, map.as_bytes().to_vec()).unwrap();
        assert_eq!(copy.get(4), Some(b));
    }

    #[test]
    fn corrupt_checkpoint_bytes_are_rejected() {
        let mut bytes = vec![0u8; 14];
        bytes[6] = 0x80;
        assert!(Map::from_bytes(2, bytes).is_err());
        assert!(Map::from_bytes(3, vec![0u8; 14]).is_err());
    }
}
