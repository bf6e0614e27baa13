//! Newtypes for the store's addresses, so that a page number, a block address and an extent
//! number can never be confused.

use std::fmt;

/// Blocks in one extent: the device allocator's unit is 128 KiB (seed 000 §3.2.1).
pub const EXTENT_BLOCKS: u32 = 32;
pub const EXTENT_BYTES: u64 = EXTENT_BLOCKS as u64 * tundra_device::BLOCK_SIZE_BYTES;

/// A chunk: an independent unit of a volume's logical space, with its own index, bitmaps and
/// journal stream, and later its own Raft group. The high 32 bits name the volume, the low 32
/// bits the chunk's index in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkId(pub u64);

impl ChunkId {
    pub fn new(volume: VolumeId, index: u32) -> ChunkId {
        ChunkId(u64::from(volume.0) << 32 | u64::from(index))
    }

    pub fn volume(self) -> VolumeId {
        VolumeId((self.0 >> 32) as u32)
    }

    pub fn index(self) -> u32 {
        self.0 as u32
    }
}

/// A log sequence number (seed 000 §2.1): the place of a change in a volume's redo stream.
/// Every page records the LSN of its last change, and nothing that moves a page without
/// changing it (heavy compression, re-compression) changes its LSN. Until volumes have redo
/// streams, the node numbers writes in the order it stores them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl std::fmt::Display for Lsn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A volume: the logical space a database sees, cut into chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VolumeId(pub u32);

impl VolumeId {
    /// The id after this one, or the last id itself: ids are never reused, so once
    /// `u32::MAX` was given out no new volume can be created (a journal may claim it, so this
    /// never panics).
    pub fn next(self) -> VolumeId {
        VolumeId(self.0.saturating_add(1))
    }
}

/// A page's number inside its chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageNo(pub u32);

/// An extent of the data device: blocks `extent * 32 .. extent * 32 + 32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExtentId(pub u32);

impl ExtentId {
    pub fn first_block(self) -> u64 {
        u64::from(self.0) * u64::from(EXTENT_BLOCKS)
    }
}

/// A run of consecutive 4 KiB blocks on the data device, inside one extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockRun {
    pub extent: ExtentId,
    /// First block inside the extent, 0..32.
    pub offset: u8,
    /// Number of blocks, 1..=32, within the extent.
    pub count: u8,
}

impl BlockRun {
    pub fn new(extent: ExtentId, offset: u8, count: u8) -> BlockRun {
        assert!(count >= 1);
        assert!(u32::from(offset) + u32::from(count) <= EXTENT_BLOCKS);
        BlockRun { extent, offset, count }
    }

    /// The device address of the run's first block.
    pub fn first_lba(&self) -> tundra_device::Lba {
        tundra_device::Lba(self.extent.first_block() + u64::from(self.offset))
    }

    /// The run's blocks as bits of its extent's bitmap.
    pub fn mask(&self) -> u32 {
        let ones = if self.count as u32 == EXTENT_BLOCKS { u32::MAX } else { (1u32 << self.count) - 1 };
        ones << self.offset
    }
}

impl fmt::Display for BlockRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "blocks {}..+{}", self.first_lba().0, self.count)
    }
}
