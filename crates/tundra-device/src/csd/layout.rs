//! Byte layouts of everything the emulated drive keeps on its media: superblocks, checkpoint
//! slots, segment headers and record headers. docs/format.md describes the same layouts in
//! prose; a change here is a change there, with a new format version.
//!
//! The media is a [`BlockDevice`](crate::BlockDevice) of 4 KiB blocks laid out as
//!
//! ```text
//! block 0        superblock slot 0
//! block 1        superblock slot 1
//! 2 ..           checkpoint slot 0 (header block + 7-byte map entries)
//! ..             checkpoint slot 1
//! ..             segment 0, segment 1, ... each `segment_bytes` long
//! ```

use super::Counters;
use crate::{BLOCK_SIZE, BLOCK_SIZE_BYTES, Error, Result};

pub const FORMAT_VERSION: u32 = 1;
const SUPERBLOCK_MAGIC: &[u8; 8] = b"TNDRCSD1";
const CHECKPOINT_MAGIC: &[u8; 8] = b"TNDRCKP1";
const SEGMENT_MAGIC: &[u8; 4] = b"TSEG";

/// Records are packed at this granularity (seed 000 §4.1.2: PolarCSD 2.0 coarsens the physical
/// offset to 16 bytes so that an L2P entry fits in 7 bytes).
pub const UNIT_BYTES: usize = 16;
/// Every record starts with a header of this size.
pub const RECORD_HEADER_BYTES: usize = 16;
/// The segment header occupies the first bytes of every segment.
pub const SEGMENT_HEADER_BYTES: usize = 64;
/// The largest payload: a block stored raw.
pub const MAX_PAYLOAD_BYTES: usize = BLOCK_SIZE;
/// A payload in 16-byte units is 1..=256 units.
pub const MAX_PAYLOAD_UNITS: usize = MAX_PAYLOAD_BYTES / UNIT_BYTES;
/// A record stores the low 40 bits of its sequence number; the full number is the one nearest
/// to its segment's incarnation ([`widen_seq`]). Open segments are rotated long before their
/// records' sequence numbers could drift 2^39 away from the incarnation.
pub const SEQ_FIELD_MASK: u64 = (1 << 40) - 1;
/// LBAs are 40-bit fields.
pub const MAX_LBA_COUNT: u64 = 1 << 40;

/// The full sequence number whose low 40 bits are `low`, nearest to `open_seq`.
pub fn widen_seq(low: u64, open_seq: u64) -> u64 {
    let span = SEQ_FIELD_MASK + 1;
    let base = (open_seq & !SEQ_FIELD_MASK) | low;
    [base.wrapping_sub(span), base, base.wrapping_add(span)]
        .into_iter()
        .filter(|c| c.abs_diff(open_seq) < span)
        .min_by_key(|c| c.abs_diff(open_seq))
        .unwrap_or(base)
}

const _: () = assert!(BLOCK_SIZE.is_multiple_of(UNIT_BYTES));
const _: () = assert!(SEGMENT_HEADER_BYTES.is_multiple_of(UNIT_BYTES));
const _: () = assert!(RECORD_HEADER_BYTES == UNIT_BYTES);
const _: () = assert!(MAX_PAYLOAD_UNITS == 256);

/// Rounds a byte count up to whole 16-byte units.
pub fn units(bytes: usize) -> usize {
    bytes.div_ceil(UNIT_BYTES)
}

/// Where everything lives on the media, derived from the format parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub logical_blocks: u64,
    pub segment_bytes: u64,
    pub segment_count: u32,
    /// Segments whose space counts as physical capacity; the rest are the over-provisioning
    /// reserve that lets garbage collection always make progress.
    pub usable_segments: u32,
}

impl Geometry {
    pub fn checkpoint_blocks(&self) -> u64 {
        1 + (self.logical_blocks * 7).div_ceil(BLOCK_SIZE_BYTES)
    }

    pub fn checkpoint_offset(&self, slot: u32) -> u64 {
        assert!(slot < 2);
        2 * BLOCK_SIZE_BYTES + u64::from(slot) * self.checkpoint_blocks() * BLOCK_SIZE_BYTES
    }

    pub fn segment_area_offset(&self) -> u64 {
        self.checkpoint_offset(1) + self.checkpoint_blocks() * BLOCK_SIZE_BYTES
    }

    pub fn segment_offset(&self, segment: u32) -> u64 {
        assert!(segment < self.segment_count);
        self.segment_area_offset() + u64::from(segment) * self.segment_bytes
    }

    pub fn total_bytes(&self) -> u64 {
        self.segment_area_offset() + u64::from(self.segment_count) * self.segment_bytes
    }

    /// Bytes of records one segment can hold.
    pub fn segment_payload_bytes(&self) -> u64 {
        self.segment_bytes - SEGMENT_HEADER_BYTES as u64
    }

    pub fn physical_capacity_bytes(&self) -> u64 {
        u64::from(self.usable_segments) * self.segment_payload_bytes()
    }

    /// The 16-byte unit address of byte `offset` of `segment`, as stored in map entries.
    pub fn location(&self, segment: u32, offset: usize) -> u64 {
        (u64::from(segment) * self.segment_bytes + offset as u64) / UNIT_BYTES as u64
    }

    /// The segment and byte offset inside it of a unit address.
    pub fn split_location(&self, location: u64) -> (u32, usize) {
        let byte = location * UNIT_BYTES as u64;
        ((byte / self.segment_bytes) as u32, (byte % self.segment_bytes) as usize)
    }

    /// Checks the relations the rest of the drive relies on.
    pub fn validate(&self) -> Result<()> {
        if self.logical_blocks == 0 || self.logical_blocks > MAX_LBA_COUNT {
            return Err(Error::invalid(format!("logical block count {} out of range", self.logical_blocks)));
        }
        if self.segment_bytes < 64 * 1024 || !self.segment_bytes.is_multiple_of(BLOCK_SIZE_BYTES) {
            return Err(Error::invalid(format!(
                "segment size {} must be a multiple of 4 KiB and at least 64 KiB",
                self.segment_bytes
            )));
        }
        if self.usable_segments == 0 || self.segment_count < self.usable_segments.saturating_add(MIN_RESERVE_SEGMENTS) {
            return Err(Error::invalid(format!(
                "{} segments with {} usable leave less than the {MIN_RESERVE_SEGMENTS}-segment reserve",
                self.segment_count, self.usable_segments
            )));
        }
        // A map entry addresses 2^40 units of 16 bytes. Checked arithmetic: a decoded segment
        // size may be anything up to 2^64.
        let segments = u64::from(self.segment_count).checked_mul(self.segment_bytes);
        if segments
            .and_then(|b| b.checked_add(self.segment_area_offset()))
            .is_none_or(|t| t / UNIT_BYTES as u64 >= 1 << 40)
        {
            return Err(Error::invalid("the media is larger than a map entry can address (16 TiB)"));
        }
        Ok(())
    }
}

/// Garbage collection needs free segments of its own to relocate into.
pub const MIN_RESERVE_SEGMENTS: u32 = 4;

/// The superblock: geometry and the pointer to the current checkpoint. Two slots alternate so
/// that a torn superblock write leaves the previous one intact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub geometry: Geometry,
    pub generation: u64,
    pub checkpoint_slot: u32,
    /// Every record with a sequence number up to this one is reflected in the checkpoint.
    pub checkpoint_seq: u64,
    pub next_seq: u64,
    /// Segments open for appending when the checkpoint was taken, with their incarnation.
    pub open_segments: Vec<(u32, u64)>,
    /// Lifetime counters as of the checkpoint (what happened after it is lost in a crash).
    pub counters: Counters,
}

const MAX_OPEN_SEGMENTS: usize = 8;

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        assert!(self.open_segments.len() <= MAX_OPEN_SEGMENTS);
        let mut b = Vec::with_capacity(BLOCK_SIZE);
        b.extend_from_slice(SUPERBLOCK_MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.geometry.logical_blocks.to_le_bytes());
        b.extend_from_slice(&self.geometry.segment_bytes.to_le_bytes());
        b.extend_from_slice(&self.geometry.segment_count.to_le_bytes());
        b.extend_from_slice(&self.geometry.usable_segments.to_le_bytes());
        b.extend_from_slice(&self.checkpoint_slot.to_le_bytes());
        b.extend_from_slice(&self.checkpoint_seq.to_le_bytes());
        b.extend_from_slice(&self.next_seq.to_le_bytes());
        for value in self.counters.to_array() {
            b.extend_from_slice(&value.to_le_bytes());
        }
        b.extend_from_slice(&(self.open_segments.len() as u32).to_le_bytes());
        for &(segment, open_seq) in &self.open_segments {
            b.extend_from_slice(&segment.to_le_bytes());
            b.extend_from_slice(&open_seq.to_le_bytes());
        }
        b.resize(BLOCK_SIZE - 4, 0);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Whether a slot starts with the superblock's magic: a slot that has it and does not
    /// decode was a superblock once and is damaged; one without it never was one (or lost its
    /// magic too).
    pub fn has_magic(block: &[u8]) -> bool {
        block.len() >= SUPERBLOCK_MAGIC.len() && &block[..SUPERBLOCK_MAGIC.len()] == SUPERBLOCK_MAGIC
    }

    /// Decodes a superblock slot; `Ok(None)` when the slot holds no valid superblock.
    pub fn decode(block: &[u8]) -> Result<Option<Superblock>> {
        assert_eq!(block.len(), BLOCK_SIZE);
        let stored_crc = u32::from_le_bytes(block[BLOCK_SIZE - 4..].try_into().expect("4 bytes"));
        if &block[..8] != SUPERBLOCK_MAGIC || crc32c::crc32c(&block[..BLOCK_SIZE - 4]) != stored_crc {
            return Ok(None);
        }
        let mut r = Reader::new(&block[8..]);
        let version = r.u32();
        if version != FORMAT_VERSION {
            return Err(Error::invalid(format!("drive format version {version}; this build reads {FORMAT_VERSION}")));
        }
        let generation = r.u64();
        let geometry = Geometry {
            logical_blocks: r.u64(),
            segment_bytes: r.u64(),
            segment_count: r.u32(),
            usable_segments: r.u32(),
        };
        let checkpoint_slot = r.u32();
        let checkpoint_seq = r.u64();
        let next_seq = r.u64();
        let counters = Counters::from_array(std::array::from_fn(|_| r.u64()));
        let open_count = r.u32() as usize;
        if open_count > MAX_OPEN_SEGMENTS || checkpoint_slot > 1 {
            return Err(Error::corrupted("superblock fields out of range"));
        }
        let open_segments = (0..open_count).map(|_| (r.u32(), r.u64())).collect();
        geometry.validate().map_err(|e| Error::corrupted(format!("superblock geometry: {}", e.message())))?;
        Ok(Some(Superblock {
            geometry,
            generation,
            checkpoint_slot,
            checkpoint_seq,
            next_seq,
            open_segments,
            counters,
        }))
    }
}

/// The header block of a checkpoint slot; the map's packed entries follow it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointHeader {
    pub generation: u64,
    pub checkpoint_seq: u64,
    pub logical_blocks: u64,
    pub map_crc: u32,
}

impl CheckpointHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(BLOCK_SIZE);
        b.extend_from_slice(CHECKPOINT_MAGIC);
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.checkpoint_seq.to_le_bytes());
        b.extend_from_slice(&self.logical_blocks.to_le_bytes());
        b.extend_from_slice(&self.map_crc.to_le_bytes());
        b.resize(BLOCK_SIZE - 4, 0);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(block: &[u8]) -> Option<CheckpointHeader> {
        assert_eq!(block.len(), BLOCK_SIZE);
        let stored_crc = u32::from_le_bytes(block[BLOCK_SIZE - 4..].try_into().expect("4 bytes"));
        if &block[..8] != CHECKPOINT_MAGIC || crc32c::crc32c(&block[..BLOCK_SIZE - 4]) != stored_crc {
            return None;
        }
        let mut r = Reader::new(&block[8..]);
        Some(CheckpointHeader {
            generation: r.u64(),
            checkpoint_seq: r.u64(),
            logical_blocks: r.u64(),
            map_crc: r.u32(),
        })
    }
}

/// The header at the start of every segment. `open_seq` names the segment's incarnation: it
/// seeds every record checksum in the segment, so records left over from an earlier use of the
/// same space never verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub segment: u32,
    pub open_seq: u64,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut b = [0u8; SEGMENT_HEADER_BYTES];
        b[..4].copy_from_slice(SEGMENT_MAGIC);
        b[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&self.segment.to_le_bytes());
        b[12..20].copy_from_slice(&self.open_seq.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(bytes: &[u8]) -> Option<SegmentHeader> {
        let stored_crc = u32::from_le_bytes(bytes[60..64].try_into().expect("4 bytes"));
        if &bytes[..4] != SEGMENT_MAGIC || crc32c::crc32c(&bytes[..60]) != stored_crc {
            return None;
        }
        let mut r = Reader::new(&bytes[4..]);
        if r.u32() != FORMAT_VERSION {
            return None;
        }
        Some(SegmentHeader { segment: r.u32(), open_seq: r.u64() })
    }
}

/// What a record holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// One block compressed with raw deflate.
    Deflate = 0,
    /// One block stored as is: compression did not save a 16-byte unit.
    Raw = 1,
    /// A range of blocks trimmed (or written as zeros); the payload is the block count.
    Trim = 2,
}

impl RecordKind {
    fn from_bits(bits: u16) -> Option<RecordKind> {
        match bits {
            0 => Some(RecordKind::Deflate),
            1 => Some(RecordKind::Raw),
            2 => Some(RecordKind::Trim),
            _ => None,
        }
    }
}

/// The 16-byte header before every record's payload:
///
/// ```text
/// 0..4   crc32c of (segment open_seq, bytes 4..16, payload)
/// 4..9   LBA (40 bits, little endian)
/// 9..14  sequence number, low 40 bits
/// 14..16 payload length in bytes (13 bits) | kind << 13
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub lba: u64,
    pub seq: u64,
    pub kind: RecordKind,
    pub payload_len: usize,
}

impl RecordHeader {
    /// Total bytes the record occupies, header and padding included.
    pub fn record_bytes(&self) -> usize {
        RECORD_HEADER_BYTES + units(self.payload_len) * UNIT_BYTES
    }

    /// Writes header and payload into `out`, which is exactly `record_bytes()` long.
    pub fn encode_into(&self, open_seq: u64, payload: &[u8], out: &mut [u8]) {
        assert_eq!(payload.len(), self.payload_len);
        assert!(self.payload_len <= MAX_PAYLOAD_BYTES);
        assert!(self.lba < MAX_LBA_COUNT);
        assert_eq!(out.len(), self.record_bytes());
        out[4..9].copy_from_slice(&self.lba.to_le_bytes()[..5]);
        out[9..14].copy_from_slice(&self.seq.to_le_bytes()[..5]);
        let len_kind = self.payload_len as u16 | (self.kind as u16) << 13;
        out[14..16].copy_from_slice(&len_kind.to_le_bytes());
        out[RECORD_HEADER_BYTES..][..payload.len()].copy_from_slice(payload);
        out[RECORD_HEADER_BYTES + payload.len()..].fill(0);
        let crc = record_crc(open_seq, &out[4..RECORD_HEADER_BYTES], payload);
        out[..4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes and verifies the record at the start of `bytes`. `None` when the bytes are not a
    /// valid record of the segment incarnation `open_seq` (end of the written part, a torn
    /// write, or a record from an earlier incarnation).
    pub fn decode(open_seq: u64, bytes: &[u8]) -> Option<(RecordHeader, &[u8])> {
        if bytes.len() < RECORD_HEADER_BYTES {
            return None;
        }
        let mut word = [0u8; 8];
        word[..5].copy_from_slice(&bytes[4..9]);
        let lba = u64::from_le_bytes(word);
        word[..5].copy_from_slice(&bytes[9..14]);
        let seq = widen_seq(u64::from_le_bytes(word), open_seq);
        let len_kind = u16::from_le_bytes([bytes[14], bytes[15]]);
        let kind = RecordKind::from_bits(len_kind >> 13)?;
        let payload_len = usize::from(len_kind & 0x1fff);
        if payload_len > MAX_PAYLOAD_BYTES || RECORD_HEADER_BYTES + payload_len > bytes.len() {
            return None;
        }
        let payload = &bytes[RECORD_HEADER_BYTES..][..payload_len];
        let stored_crc = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
        if record_crc(open_seq, &bytes[4..RECORD_HEADER_BYTES], payload) != stored_crc {
            return None;
        }
        Some((RecordHeader { lba, seq, kind, payload_len }, payload))
    }
}

fn record_crc(open_seq: u64, header_tail: &[u8], payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&open_seq.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, header_tail);
    crc32c::crc32c_append(crc, payload)
}

/// Little-endian field reader over a buffer whose length the caller has checked.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    fn take<const N: usize>(&mut self) -> [u8; N] {
        let (head, rest) = self.bytes.split_at(N);
        self.bytes = rest;
        head.try_into().expect("split_at gave N bytes")
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry() -> Geometry {
        Geometry { logical_blocks: 1000, segment_bytes: 64 * 1024, segment_count: 20, usable_segments: 16 }
    }

    #[test]
    fn superblock_round_trip_and_corruption() {
        let sb = Superblock {
            geometry: geometry(),
            generation: 7,
            checkpoint_slot: 1,
            checkpoint_seq: 99,
            next_seq: 120,
            open_segments: vec![(3, 100), (5, 110)],
            counters: Counters { gc_moved_bytes: 12345, checkpoints: 3, ..Counters::default() },
        };
        let mut block = sb.encode();
        assert_eq!(Superblock::decode(&block).unwrap(), Some(sb));
        block[40] ^= 1;
        assert_eq!(Superblock::decode(&block).unwrap(), None);
        assert_eq!(Superblock::decode(&vec![0u8; BLOCK_SIZE]).unwrap(), None);
    }

    #[test]
    fn record_round_trip_and_incarnation() {
        let payload = b"hello, compressed world";
        let seq = (5 << 40) + 17;
        let header = RecordHeader { lba: (1 << 40) - 1, seq, kind: RecordKind::Deflate, payload_len: payload.len() };
        let open_seq = (5 << 40) - 3;
        let mut out = vec![0u8; header.record_bytes()];
        header.encode_into(open_seq, payload, &mut out);
        assert_eq!(out.len(), 16 + 32);
        let (decoded, body) = RecordHeader::decode(open_seq, &out).unwrap();
        assert_eq!(decoded, header, "the sequence number is widened across a 40-bit boundary");
        assert_eq!(body, payload);
        // The same bytes do not verify as a record of another incarnation of the segment.
        assert!(RecordHeader::decode(open_seq + 1, &out).is_none());
        out[20] ^= 0x10;
        assert!(RecordHeader::decode(open_seq, &out).is_none());
        assert!(RecordHeader::decode(42, &[0u8; 64]).is_none());
    }

    #[test]
    fn sequence_numbers_widen_to_the_nearest() {
        assert_eq!(widen_seq(5, 3), 5);
        assert_eq!(widen_seq(SEQ_FIELD_MASK, 1 << 40), (1 << 40) - 1);
        assert_eq!(widen_seq(2, (1 << 40) - 2), (1 << 40) + 2);
        assert_eq!(widen_seq(7, (3 << 40) + 9), (3 << 40) + 7);
    }

    #[test]
    fn geometry_locations() {
        let g = geometry();
        g.validate().unwrap();
        assert_eq!(g.checkpoint_blocks(), 1 + 2);
        let loc = g.location(3, 4096 + 32);
        assert_eq!(g.split_location(loc), (3, 4096 + 32));
        assert_eq!(g.physical_capacity_bytes(), 16 * (64 * 1024 - 64));
        let bad = Geometry { segment_count: 18, ..g };
        assert!(bad.validate().is_err());
    }
}
