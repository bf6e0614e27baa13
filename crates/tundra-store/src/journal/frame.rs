//! The journal's on-disk framing (docs/format.md, "The journal"): the superblock, the header of a
//! checkpoint slot and the log block, each with its own checksum, so that recovery can tell a
//! block that was never written (zeros), a block left from before (valid, but of another
//! position or an older epoch) and a damaged block apart.

use tundra_device::{BLOCK_SIZE, Lba};

use super::ids::{CheckpointSlot, Epoch, Generation, LogPosition};

/// The journal format this build writes. Version 1 had one checksum per log block and one
/// checkpoint position in the superblock; version 2 is version 3 without the Watermarks record,
/// version 3 is version 4 without the ChunkMark record, and version 4 is version 5 without the
/// PageData record.
pub(super) const VERSION: u32 = 5;
/// The oldest version this build reads: a version 2 to 4 journal is a version 5 journal that
/// holds no record its version lacks, so it replays as it is, and the checkpoint taken when the
/// store opens carries it to version 5. A build that reads only older versions refuses a newer
/// journal by its superblock, before it could meet a record it does not know.
pub(super) const OLDEST_READABLE: u32 = 2;

/// The versions this build reads, for messages.
pub(super) const READABLE: &str = "versions 2 to 5";

fn readable(version: u32) -> bool {
    (OLDEST_READABLE..=VERSION).contains(&version)
}

/// The version this build writes; tests make journals of the version before.
fn written_version() -> u32 {
    #[cfg(test)]
    {
        let forced = WRITE_VERSION.with(|v| v.get());
        if forced != 0 {
            return forced;
        }
    }
    VERSION
}

#[cfg(test)]
thread_local! {
    static WRITE_VERSION: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Makes this thread's journals write `version` (0: the build's own), to test reading older ones.
#[cfg(test)]
pub(crate) fn set_write_version(version: u32) {
    WRITE_VERSION.with(|v| v.set(version));
}
const SUPERBLOCK_MAGIC: &[u8; 8] = b"TNDRJRNL";
/// Version 1's superblock magic, recognised only to name the version in the error.
const SUPERBLOCK_MAGIC_V1: &[u8; 8] = b"TNDRJNL1";
const CHECKPOINT_MAGIC: &[u8; 8] = b"TNDRJCKP";
const LOG_MAGIC: u32 = 0x544a_4c42; // "TJLB"
pub(super) const LOG_HEADER_BYTES: usize = 40;
/// The largest log position, epoch or generation a verified structure may hold. Counters grow
/// by one per block, session or checkpoint and never come near it; a checksummed value above it
/// is damage, refused before any arithmetic on it could overflow.
pub(super) const MAX_COUNTER: u64 = 1 << 62;
/// Records packed per log block.
pub(super) const LOG_PAYLOAD_BYTES: usize = BLOCK_SIZE - LOG_HEADER_BYTES;

/// Where the journal's parts are on the fast device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalGeometry {
    pub checkpoint_blocks: u64,
    pub log_blocks: u64,
}

impl JournalGeometry {
    pub(super) fn checkpoint_lba(&self, slot: CheckpointSlot) -> Lba {
        Lba(2 + slot.index() as u64 * self.checkpoint_blocks)
    }

    pub(super) fn log_lba(&self, position: LogPosition) -> Lba {
        Lba(2 + 2 * self.checkpoint_blocks + position.ring_block(self.log_blocks))
    }

    /// Blocks the journal takes; saturates for geometries no device could hold.
    pub fn total_blocks(&self) -> u64 {
        self.checkpoint_blocks.saturating_mul(2).saturating_add(self.log_blocks).saturating_add(2)
    }
}

/// The journal superblock: geometry, both checkpoints, and the epoch. Two copies alternate by
/// generation (LBA `generation % 2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Superblock {
    pub geometry: JournalGeometry,
    pub generation: Generation,
    pub epoch: Epoch,
    /// The slot of the newest checkpoint; the other slot holds the one before it.
    pub current: CheckpointSlot,
    /// The log position each slot's checkpoint reflects (the first block it does not), by
    /// [`CheckpointSlot::index`].
    pub positions: [LogPosition; 2],
}

/// What a superblock copy holds.
pub(super) enum SuperblockRead {
    Valid(Superblock),
    /// A verified superblock of another journal format version.
    Version(u32),
    Invalid,
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(BLOCK_SIZE);
        b.extend_from_slice(SUPERBLOCK_MAGIC);
        b.extend_from_slice(&written_version().to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        for v in [
            self.geometry.checkpoint_blocks,
            self.geometry.log_blocks,
            self.generation.0,
            self.epoch.0,
            self.current.stored(),
            self.positions[0].0,
            self.positions[1].0,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        seal_block(b)
    }

    pub fn decode(block: &[u8]) -> SuperblockRead {
        let Some(body) = verified_block(block) else { return SuperblockRead::Invalid };
        if &body[..8] == SUPERBLOCK_MAGIC_V1 {
            return SuperblockRead::Version(1);
        }
        if &body[..8] != SUPERBLOCK_MAGIC {
            return SuperblockRead::Invalid;
        }
        let version = u32_at(body, 8);
        if !readable(version) {
            return SuperblockRead::Version(version);
        }
        let field = |i: usize| u64_at(body, 16 + 8 * i);
        let Some(current) = CheckpointSlot::from_stored(field(4)) else { return SuperblockRead::Invalid };
        let superblock = Superblock {
            geometry: JournalGeometry { checkpoint_blocks: field(0), log_blocks: field(1) },
            generation: Generation(field(2)),
            epoch: Epoch(field(3)),
            current,
            positions: [LogPosition(field(5)), LogPosition(field(6))],
        };
        let sane = superblock.geometry.log_blocks >= 2
            && superblock.geometry.checkpoint_blocks >= 1
            && superblock.geometry.total_blocks() < u64::MAX
            && [field(2), field(3), field(5), field(6)].iter().all(|&counter| counter <= MAX_COUNTER);
        if sane { SuperblockRead::Valid(superblock) } else { SuperblockRead::Invalid }
    }
}

/// The first block of a checkpoint slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CheckpointHeader {
    pub position: LogPosition,
    pub record_bytes: u64,
    pub record_count: u64,
    pub crc: u32,
}

impl CheckpointHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(BLOCK_SIZE);
        b.extend_from_slice(CHECKPOINT_MAGIC);
        b.extend_from_slice(&written_version().to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.position.0.to_le_bytes());
        b.extend_from_slice(&self.record_bytes.to_le_bytes());
        b.extend_from_slice(&self.record_count.to_le_bytes());
        b.extend_from_slice(&self.crc.to_le_bytes());
        seal_block(b)
    }

    /// The header, or why the block is not one.
    pub fn decode(block: &[u8]) -> Result<CheckpointHeader, String> {
        let body = verified_block(block).ok_or("its header block fails its checksum")?;
        if &body[..8] != CHECKPOINT_MAGIC {
            return Err("its header block is not a checkpoint header".into());
        }
        let version = u32_at(body, 8);
        if !readable(version) {
            return Err(format!("its header is of journal format version {version}; this build reads {READABLE}"));
        }
        if u64_at(body, 16) > MAX_COUNTER {
            return Err(format!("its header names log position {}, beyond any real log", u64_at(body, 16)));
        }
        Ok(CheckpointHeader {
            position: LogPosition(u64_at(body, 16)),
            record_bytes: u64_at(body, 24),
            record_count: u64_at(body, 32),
            crc: u32_at(body, 40),
        })
    }
}

/// A log block: a header with its own checksum (magic, version, position, epoch, record bytes,
/// the body's checksum), then the records, zero-padded.
pub(super) fn encode_log_block(position: LogPosition, epoch: Epoch, records: &[u8]) -> Vec<u8> {
    assert!(records.len() <= LOG_PAYLOAD_BYTES);
    let mut b = vec![0u8; BLOCK_SIZE];
    b[LOG_HEADER_BYTES..LOG_HEADER_BYTES + records.len()].copy_from_slice(records);
    let body_crc = crc32c::crc32c(&b[LOG_HEADER_BYTES..]);
    b[0..4].copy_from_slice(&LOG_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&written_version().to_le_bytes());
    b[8..16].copy_from_slice(&position.0.to_le_bytes());
    b[16..24].copy_from_slice(&epoch.0.to_le_bytes());
    b[24..28].copy_from_slice(&(records.len() as u32).to_le_bytes());
    b[28..32].copy_from_slice(&body_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&b[..36]);
    b[36..40].copy_from_slice(&header_crc.to_le_bytes());
    b
}

/// What a block read where the log expects position `position` is.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum LogBlock<'a> {
    /// The block at this position, of an epoch no older than the block before it: its records.
    Valid { epoch: Epoch, records: &'a [u8] },
    /// Never written (all zeros), or a verified block of another position or an older epoch:
    /// left from an earlier lap of the ring or from before a crash. The log ends before it.
    End,
    /// The header verifies and names this position and a current epoch, but the body fails its
    /// checksum. A single block write is atomic, so this is damage, never a torn write.
    BodyDamaged { epoch: Epoch },
    /// Neither zeros nor a verified header: damage.
    HeaderDamaged,
}

/// Classifies `block` for the log position `position`, after a block of epoch `min_epoch`.
pub(super) fn classify_log_block(block: &[u8], position: LogPosition, min_epoch: Epoch) -> LogBlock<'_> {
    let header_ok = crc32c::crc32c(&block[..36]) == u32_at(block, 36)
        && u32_at(block, 0) == LOG_MAGIC
        && readable(u32_at(block, 4))
        && u32_at(block, 32) == 0
        && u32_at(block, 24) as usize <= LOG_PAYLOAD_BYTES
        && u64_at(block, 8) <= MAX_COUNTER
        && u64_at(block, 16) <= MAX_COUNTER;
    if !header_ok {
        return if block.iter().all(|&b| b == 0) { LogBlock::End } else { LogBlock::HeaderDamaged };
    }
    let epoch = Epoch(u64_at(block, 16));
    if LogPosition(u64_at(block, 8)) != position || epoch < min_epoch {
        return LogBlock::End;
    }
    if crc32c::crc32c(&block[LOG_HEADER_BYTES..]) != u32_at(block, 28) {
        return LogBlock::BodyDamaged { epoch };
    }
    let length = u32_at(block, 24) as usize;
    LogBlock::Valid { epoch, records: &block[LOG_HEADER_BYTES..LOG_HEADER_BYTES + length] }
}

/// Pads a block body to 4092 bytes and appends its crc32c.
pub(super) fn seal_block(mut body: Vec<u8>) -> Vec<u8> {
    assert!(body.len() <= BLOCK_SIZE - 4);
    body.resize(BLOCK_SIZE - 4, 0);
    let crc = crc32c::crc32c(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}

fn verified_block(block: &[u8]) -> Option<&[u8]> {
    let (body, crc) = block.split_at(BLOCK_SIZE - 4);
    (crc32c::crc32c(body) == u32_at(crc, 0)).then_some(body)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes inside a block"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes inside a block"))
}
