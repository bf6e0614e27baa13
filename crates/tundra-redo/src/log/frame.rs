//! The redo log's on-media framing (docs/format.md, "The redo log"): the superblock, the log
//! block with a checksum of its header and one of its body, and the frame that wraps each
//! batch in the log's byte stream. Also the counters that say where things are: a block's
//! `Position` in the log, a byte's `StreamOffset`, the `Session` a block was written in.

use std::fmt;

use tundra_device::{BLOCK_SIZE, Lba};
use tundra_store::ids::{Lsn, VolumeId};

use crate::WriterEpoch;

/// The log format this build writes and reads: superblock and log blocks alike.
pub(super) const VERSION: u32 = 1;
const SUPERBLOCK_MAGIC: &[u8; 8] = b"TNDRREDO";
const BLOCK_MAGIC: u32 = 0x5452_4c42; // "TRLB"
pub(super) const BLOCK_HEADER_BYTES: usize = 48;
/// Stream bytes each log block carries.
pub(super) const PAYLOAD_BYTES: usize = BLOCK_SIZE - BLOCK_HEADER_BYTES;
const PAYLOAD: u64 = PAYLOAD_BYTES as u64;
/// A frame's header: the batch's length and its checksum.
pub(super) const FRAME_HEADER_BYTES: usize = 8;
/// Blocks before the ring: the two superblock copies.
pub(super) const SUPERBLOCK_COPIES: u64 = 2;

const _: () = assert!(BLOCK_HEADER_BYTES < BLOCK_SIZE);

/// A place in the log: the number of log blocks before this one since the log was formatted.
/// Positions only grow; position `p` lives in the ring's block `p % log_blocks`, so the position
/// in a block's header tells an earlier lap's block apart from this one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position(pub u64);

impl Position {
    pub fn next(self) -> Position {
        Position(self.0 + 1)
    }

    pub fn after(self, blocks: u64) -> Position {
        Position(self.0 + blocks)
    }

    /// The stream offset of this block's first payload byte.
    pub fn start(self) -> StreamOffset {
        StreamOffset(self.0 * PAYLOAD)
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A byte of the log's stream: the payloads of its blocks, one after the other. Byte `o` lives
/// in the block of position `o / 4048`, at `o % 4048` in its payload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamOffset(pub u64);

impl StreamOffset {
    /// The block holding this byte.
    pub fn position(self) -> Position {
        Position(self.0 / PAYLOAD)
    }

    /// Where this byte lies in its block's payload.
    pub fn in_block(self) -> usize {
        (self.0 % PAYLOAD) as usize
    }

    /// The first block boundary at or after this byte.
    pub fn next_block(self) -> Position {
        Position(self.0.div_ceil(PAYLOAD))
    }

    pub fn plus(self, bytes: u64) -> StreamOffset {
        StreamOffset(self.0 + bytes)
    }
}

/// A session of the log: every open takes a number above any used before and writes it into
/// the superblock before any block; each block records its session, so a block a crashed
/// session left beyond the end is never read as part of a later session's log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Session(pub u64);

impl fmt::Display for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What one volume's redo log is for, and the size of its ring. Recorded in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogGeometry {
    pub volume: VolumeId,
    /// The volume's page size: images are exactly this long, ranges lie inside it.
    pub page_size: u32,
    /// Blocks in the ring of log blocks, after the two superblock copies.
    pub log_blocks: u64,
}

impl LogGeometry {
    /// Blocks the log takes on its device; saturates for geometries no device could hold.
    pub fn total_blocks(&self) -> u64 {
        self.log_blocks.saturating_add(SUPERBLOCK_COPIES)
    }

    /// Stream bytes the ring holds.
    pub fn capacity_bytes(&self) -> u64 {
        self.log_blocks.saturating_mul(PAYLOAD)
    }

    pub(super) fn lba(&self, position: Position) -> Lba {
        Lba(SUPERBLOCK_COPIES + position.0 % self.log_blocks)
    }

    /// Why the geometry cannot be a log's, if it cannot.
    pub(super) fn problem(&self) -> Option<String> {
        if !self.page_size.is_power_of_two() || !(512..=65536).contains(&self.page_size) {
            return Some(format!("a page size of {} bytes (a power of two from 512 to 65536)", self.page_size));
        }
        if self.log_blocks < 2 || self.log_blocks > u64::MAX / PAYLOAD / 4 {
            return Some(format!("a ring of {} log blocks (at least 2)", self.log_blocks));
        }
        None
    }
}

/// The superblock: geometry, the session, the fence and where the retained log begins. Two
/// copies; an update writes both in turn, each flushed, the newer generation last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Superblock {
    pub geometry: LogGeometry,
    pub generation: u64,
    pub session: Session,
    /// The highest writer epoch of every batch durable when it was written: it covers the
    /// truncated batches (the retained ones carry their own).
    pub fence: WriterEpoch,
    /// The first retained frame (or, with none retained, where the next frame goes), the end of
    /// the last truncated batch, and the oldest session a block at `start` may have.
    pub start: StreamOffset,
    pub start_lsn: Lsn,
    pub start_session: Session,
}

/// What a superblock copy holds.
pub(super) enum SuperblockRead {
    Valid(Superblock),
    /// A verified superblock of another format version.
    Version(u32),
    Invalid,
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(BLOCK_SIZE);
        b.extend_from_slice(SUPERBLOCK_MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.geometry.volume.0.to_le_bytes());
        b.extend_from_slice(&self.geometry.page_size.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        for v in [
            self.geometry.log_blocks,
            self.generation,
            self.session.0,
            self.fence.0,
            self.start.0,
            self.start_lsn.0,
            self.start_session.0,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(b.len(), 80);
        b.resize(BLOCK_SIZE - 4, 0);
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(block: &[u8]) -> SuperblockRead {
        assert_eq!(block.len(), BLOCK_SIZE);
        if crc32c::crc32c(&block[..BLOCK_SIZE - 4]) != u32_at(block, BLOCK_SIZE - 4) || &block[..8] != SUPERBLOCK_MAGIC
        {
            return SuperblockRead::Invalid;
        }
        let version = u32_at(block, 8);
        if version != VERSION {
            return SuperblockRead::Version(version);
        }
        let field = |i: usize| u64_at(block, 24 + 8 * i);
        let superblock = Superblock {
            geometry: LogGeometry {
                volume: VolumeId(u32_at(block, 12)),
                page_size: u32_at(block, 16),
                log_blocks: field(0),
            },
            generation: field(1),
            session: Session(field(2)),
            fence: WriterEpoch(field(3)),
            start: StreamOffset(field(4)),
            start_lsn: Lsn(field(5)),
            start_session: Session(field(6)),
        };
        let sane = u32_at(block, 20) == 0
            && superblock.geometry.problem().is_none()
            && superblock.start_session <= superblock.session
            && block[80..BLOCK_SIZE - 4].iter().all(|&b| b == 0);
        if sane { SuperblockRead::Valid(superblock) } else { SuperblockRead::Invalid }
    }

    /// The copy this generation is written to.
    pub fn lba(generation: u64) -> Lba {
        Lba(generation % SUPERBLOCK_COPIES)
    }
}

/// What a log block's header says about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BlockHeader {
    pub position: Position,
    pub session: Session,
    /// The position of the first block its session wrote: a session starts at a block
    /// boundary, with a frame, so a block of a newer session than the block before it continues
    /// the log only if it is that first block.
    pub session_start: Position,
    pub volume: VolumeId,
    pub payload_bytes: usize,
}

/// A log block: the header (with the checksum of the body and its own), then `payload`, zeros.
pub(super) fn encode_block(header: &BlockHeader, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() <= PAYLOAD_BYTES);
    assert_eq!(header.payload_bytes, payload.len());
    assert!(header.session_start <= header.position);
    let mut b = vec![0u8; BLOCK_SIZE];
    b[BLOCK_HEADER_BYTES..BLOCK_HEADER_BYTES + payload.len()].copy_from_slice(payload);
    let body_crc = crc32c::crc32c(&b[BLOCK_HEADER_BYTES..]);
    b[0..4].copy_from_slice(&BLOCK_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&VERSION.to_le_bytes());
    b[8..16].copy_from_slice(&header.position.0.to_le_bytes());
    b[16..24].copy_from_slice(&header.session.0.to_le_bytes());
    b[24..32].copy_from_slice(&header.session_start.0.to_le_bytes());
    b[32..36].copy_from_slice(&header.volume.0.to_le_bytes());
    b[36..40].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    b[40..44].copy_from_slice(&body_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&b[..44]);
    b[44..48].copy_from_slice(&header_crc.to_le_bytes());
    b
}

/// What a block read at some position of the ring is.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum BlockRead<'a> {
    /// Its header verifies: the header, its payload, and whether the body verifies too.
    Verified { header: BlockHeader, payload: &'a [u8], body_ok: bool },
    /// Never written, or trimmed.
    Zeros,
    /// Neither zeros nor a header that verifies.
    Damaged,
}

/// Reads a block's header and checks both checksums; says nothing yet of where the block
/// belongs, which depends on where the log expects it.
pub(super) fn read_block(block: &[u8]) -> BlockRead<'_> {
    assert_eq!(block.len(), BLOCK_SIZE);
    let payload_bytes = u32_at(block, 36) as usize;
    let header_ok = crc32c::crc32c(&block[..44]) == u32_at(block, 44)
        && u32_at(block, 0) == BLOCK_MAGIC
        && u32_at(block, 4) == VERSION
        && payload_bytes <= PAYLOAD_BYTES
        && u64_at(block, 24) <= u64_at(block, 8);
    if !header_ok {
        return if block.iter().all(|&b| b == 0) { BlockRead::Zeros } else { BlockRead::Damaged };
    }
    let header = BlockHeader {
        position: Position(u64_at(block, 8)),
        session: Session(u64_at(block, 16)),
        session_start: Position(u64_at(block, 24)),
        volume: VolumeId(u32_at(block, 32)),
        payload_bytes,
    };
    let body_ok = crc32c::crc32c(&block[BLOCK_HEADER_BYTES..]) == u32_at(block, 40);
    let payload = &block[BLOCK_HEADER_BYTES..BLOCK_HEADER_BYTES + payload_bytes];
    BlockRead::Verified { header, payload, body_ok }
}

/// Appends a frame to `out`: the batch's encoded length and crc32c, then the batch.
pub(super) fn encode_frame(batch_bytes: &[u8], out: &mut Vec<u8>) {
    let len = u32::try_from(batch_bytes.len()).expect("a batch's length is checked against the ring");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(batch_bytes).to_le_bytes());
    out.extend_from_slice(batch_bytes);
}

/// A frame's header: the length of the batch that follows it, and its checksum.
pub(super) fn frame_header(bytes: &[u8]) -> (usize, u32) {
    (u32_at(bytes, 0) as usize, u32_at(bytes, 4))
}

pub(super) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes inside the buffer"))
}

pub(super) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes inside the buffer"))
}
