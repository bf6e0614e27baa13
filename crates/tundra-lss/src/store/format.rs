//! The store's bytes on the device (docs/lss.md, "On-device format"): a superblock in block 0,
//! then segments of sectors, each sector a row of fixed-size element slots. This is the only
//! module that knows a byte offset of that format.
//!
//! An element slot starts with a 32-byte header whose CRC32C covers the rest of the header, the
//! key and the value, seeded with the slot's address, so that an element read from any other
//! slot (a misdirected write, a stale copy) never verifies. An all-zero slot is empty: never
//! written, zeroed by virtual data trim, or trimmed.

use crate::error::{Error, Result};
use crate::geometry::{LogGeometry, SECTOR_BYTES, SlotAddr};

pub const FORMAT_VERSION: u32 = 1;
const SUPERBLOCK_MAGIC: &[u8; 8] = b"TNDRLSS\0";
/// The first block of the first segment; block 0 is the superblock.
pub const DATA_START_LBA: u64 = 1;

pub const ELEMENT_HEADER_BYTES: usize = 32;
const ELEMENT_MAGIC: u16 = 0x534c;
const KIND_PUT: u8 = 1;
const KIND_TOMBSTONE: u8 = 2;
pub const MAX_KEY_BYTES: usize = u8::MAX as usize;

const _: () = assert!(ELEMENT_HEADER_BYTES + MAX_KEY_BYTES < LogGeometry::MIN_SLOT_BYTES as usize);

/// Encodes the superblock: the geometry, which never changes after format.
pub fn encode_superblock(geometry: &LogGeometry) -> Vec<u8> {
    let mut block = vec![0u8; SECTOR_BYTES as usize];
    block[0..8].copy_from_slice(SUPERBLOCK_MAGIC);
    block[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    block[12..16].copy_from_slice(&geometry.slot_bytes.to_le_bytes());
    block[16..20].copy_from_slice(&geometry.sectors_per_segment.to_le_bytes());
    block[20..24].copy_from_slice(&geometry.segment_count.to_le_bytes());
    let crc = crc32c::crc32c(&block[0..24]);
    block[24..28].copy_from_slice(&crc.to_le_bytes());
    block
}

/// Decodes and checks the superblock.
pub fn decode_superblock(block: &[u8]) -> Result<LogGeometry> {
    if &block[0..8] != SUPERBLOCK_MAGIC {
        return Err(Error::invalid("no store superblock in block 0: this device holds no log-structured store"));
    }
    if crc32c::crc32c(&block[0..24]) != u32_at(block, 24) {
        return Err(Error::corrupted("the store's superblock fails its checksum"));
    }
    let version = u32_at(block, 8);
    if version != FORMAT_VERSION {
        return Err(Error::invalid(format!("store format version {version}; this build reads {FORMAT_VERSION}")));
    }
    LogGeometry::new(u32_at(block, 12), u32_at(block, 16), u32_at(block, 20))
        .map_err(|e| Error::corrupted(format!("the superblock's geometry: {}", e.message())))
}

/// What an element slot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    pub tombstone: bool,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// The version: every put and delete takes the next number; a relocated copy keeps it.
    pub seq: u64,
    /// The opening count of the segment the element was written into.
    pub epoch: u64,
}

/// The largest value that fits a slot beside `key_len` key bytes.
pub fn max_value_bytes(slot_bytes: u32, key_len: usize) -> usize {
    (slot_bytes as usize).saturating_sub(ELEMENT_HEADER_BYTES + key_len)
}

/// Writes `element` into `slot_buf` (exactly one slot) as it must read at `slot`.
pub fn encode_element(element: &Element, slot: SlotAddr, slot_buf: &mut [u8]) {
    let key_len = element.key.len();
    let value_len = element.value.len();
    assert!(key_len <= MAX_KEY_BYTES, "the caller checked the key's length");
    assert!(value_len <= max_value_bytes(slot_buf.len() as u32, key_len), "the caller checked the value's length");
    slot_buf.fill(0);
    slot_buf[4..6].copy_from_slice(&ELEMENT_MAGIC.to_le_bytes());
    slot_buf[6] = if element.tombstone { KIND_TOMBSTONE } else { KIND_PUT };
    slot_buf[7] = key_len as u8;
    slot_buf[8..12].copy_from_slice(&(value_len as u32).to_le_bytes());
    slot_buf[16..24].copy_from_slice(&element.seq.to_le_bytes());
    slot_buf[24..32].copy_from_slice(&element.epoch.to_le_bytes());
    let end = ELEMENT_HEADER_BYTES + key_len + value_len;
    slot_buf[ELEMENT_HEADER_BYTES..ELEMENT_HEADER_BYTES + key_len].copy_from_slice(&element.key);
    slot_buf[ELEMENT_HEADER_BYTES + key_len..end].copy_from_slice(&element.value);
    let crc = element_crc(slot, &slot_buf[4..end]);
    slot_buf[0..4].copy_from_slice(&crc.to_le_bytes());
}

/// Reads one slot: `None` when it is all zeros, the element when it verifies, and `Corrupted`
/// (naming the slot) for anything else.
pub fn decode_element(slot_buf: &[u8], slot: SlotAddr) -> Result<Option<Element>> {
    if tundra_device::is_zero(slot_buf) {
        return Ok(None);
    }
    let bad = |what: &str| Error::corrupted(format!("element slot {}: {what}", slot.0));
    if u16::from_le_bytes([slot_buf[4], slot_buf[5]]) != ELEMENT_MAGIC {
        return Err(bad("no element header"));
    }
    let tombstone = match slot_buf[6] {
        KIND_PUT => false,
        KIND_TOMBSTONE => true,
        other => return Err(bad(&format!("unknown element kind {other}"))),
    };
    let key_len = usize::from(slot_buf[7]);
    let value_len = u32_at(slot_buf, 8) as usize;
    if value_len > max_value_bytes(slot_buf.len() as u32, key_len) {
        return Err(bad(&format!("a {value_len}-byte value with a {key_len}-byte key does not fit the slot")));
    }
    let end = ELEMENT_HEADER_BYTES + key_len + value_len;
    if element_crc(slot, &slot_buf[4..end]) != u32_at(slot_buf, 0) {
        return Err(bad("checksum mismatch"));
    }
    if u32_at(slot_buf, 12) != 0 || !tundra_device::is_zero(&slot_buf[end..]) {
        return Err(bad("bytes outside the element are not zero"));
    }
    Ok(Some(Element {
        tombstone,
        key: slot_buf[ELEMENT_HEADER_BYTES..ELEMENT_HEADER_BYTES + key_len].to_vec(),
        value: slot_buf[ELEMENT_HEADER_BYTES + key_len..end].to_vec(),
        seq: u64_at(slot_buf, 16),
        epoch: u64_at(slot_buf, 24),
    }))
}

fn element_crc(slot: SlotAddr, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&slot.0.to_le_bytes()), bytes)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("four bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("eight bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn element() -> Element {
        Element { tombstone: false, key: b"key".to_vec(), value: vec![7; 100], seq: 42, epoch: 3 }
    }

    #[test]
    fn an_element_round_trips_and_binds_to_its_slot() {
        let mut buf = vec![0u8; 2048];
        encode_element(&element(), SlotAddr(9), &mut buf);
        assert_eq!(decode_element(&buf, SlotAddr(9)).unwrap(), Some(element()));
        let error = decode_element(&buf, SlotAddr(10)).unwrap_err();
        assert_eq!(error.kind(), crate::ErrorKind::Corrupted);
        assert_eq!(decode_element(&[0u8; 2048], SlotAddr(9)).unwrap(), None);
    }

    #[test]
    fn every_bit_flip_is_refused() {
        let mut buf = vec![0u8; 512];
        encode_element(&element(), SlotAddr(1), &mut buf);
        for bit in 0..buf.len() * 8 {
            let mut damaged = buf.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            let result = decode_element(&damaged, SlotAddr(1));
            assert!(result.is_err(), "bit {bit} flipped and the slot still decoded: {result:?}");
        }
    }

    #[test]
    fn the_superblock_round_trips_and_refuses_damage() {
        let geometry = LogGeometry::new(2048, 16, 10).unwrap();
        let mut block = encode_superblock(&geometry);
        assert_eq!(decode_superblock(&block).unwrap(), geometry);
        block[13] ^= 1;
        assert_eq!(decode_superblock(&block).unwrap_err().kind(), crate::ErrorKind::Corrupted);
        assert_eq!(decode_superblock(&[0u8; 4096]).unwrap_err().kind(), crate::ErrorKind::Invalid);
    }
}
