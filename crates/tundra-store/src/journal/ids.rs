//! Newtypes for the journal's counters: a place in the log, the epoch a block was written in,
//! a superblock's generation and a checkpoint slot. All four are stored as little-endian u64
//! (docs/format.md, "The store's journal"); as types they cannot be passed for one another, and
//! each has only the arithmetic the journal does with it.

use std::fmt;

/// A place in the log: how many log blocks came before this one since the journal was formatted.
/// Positions only grow; the block of position `p` lives in the ring's block `p % log_blocks`, so
/// a position also tells an earlier lap's block at the same place from this one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogPosition(pub u64);

impl LogPosition {
    /// The position of the block after this one.
    pub fn next(self) -> LogPosition {
        self.after(1)
    }

    /// The position `blocks` blocks later.
    pub fn after(self, blocks: u64) -> LogPosition {
        LogPosition(self.0 + blocks)
    }

    /// The blocks from `earlier` up to this position. Positions only grow, so an `earlier` past
    /// this one is a programmer error.
    pub fn blocks_since(self, earlier: LogPosition) -> u64 {
        assert!(earlier <= self, "log position {earlier} is not at or before {self}");
        self.0 - earlier.0
    }

    /// The block of the ring this position lives in.
    pub fn ring_block(self, log_blocks: u64) -> u64 {
        self.0 % log_blocks
    }
}

impl fmt::Display for LogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A session of the journal: each open takes an epoch higher than any written before, and a
/// log block records the epoch it was written in, so a block left beyond the end of the log by
/// an earlier session is never read as part of a later one's log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Epoch(pub u64);

impl Epoch {
    /// The epoch a freshly formatted journal's superblock holds.
    pub const FIRST: Epoch = Epoch(1);

    pub fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

/// A superblock's generation: each superblock written is one higher than the one before, and
/// goes to the copy its parity names, so the newest copy is the valid one of the higher
/// generation and the other copy is never overwritten while the newest is being written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Generation(pub u64);

impl Generation {
    /// The generation of a freshly formatted journal's superblock.
    pub const FIRST: Generation = Generation(1);

    pub fn next(self) -> Generation {
        Generation(self.0 + 1)
    }

    /// Which superblock copy (0 or 1) a superblock of this generation is written to.
    pub fn copy(self) -> u64 {
        self.0 % 2
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One of the journal's two checkpoint slots: the newest checkpoint is in one, the one before it
/// in the other, and a new checkpoint always replaces the older.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct CheckpointSlot(u8);

impl CheckpointSlot {
    pub const BOTH: [CheckpointSlot; 2] = [CheckpointSlot(0), CheckpointSlot(1)];

    /// The slot a superblock names, or none if the number names no slot.
    pub fn from_stored(number: u64) -> Option<CheckpointSlot> {
        CheckpointSlot::BOTH.into_iter().find(|slot| u64::from(slot.0) == number)
    }

    /// The number the superblock stores for this slot.
    pub fn stored(self) -> u64 {
        u64::from(self.0)
    }

    pub fn other(self) -> CheckpointSlot {
        CheckpointSlot(1 - self.0)
    }

    /// The slot's place in per-slot arrays, and its order on the device.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

impl fmt::Display for CheckpointSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
