//! Space allocation in two levels (seed 000 §3.2.1): the device allocator hands 128 KiB extents
//! to chunks, and each chunk tracks its 4 KiB blocks in a bitmap per extent. Both are I/O-free
//! state machines; the store journals every change they make.

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::{BlockRun, ChunkId, EXTENT_BLOCKS, ExtentId};

/// Which chunk owns each extent of the data device.
pub struct ExtentAllocator {
    owners: Vec<Option<ChunkId>>,
    free: BTreeSet<u32>,
}

impl ExtentAllocator {
    pub fn new(extent_count: u32) -> ExtentAllocator {
        ExtentAllocator { owners: vec![None; extent_count as usize], free: (0..extent_count).collect() }
    }

    pub fn extent_count(&self) -> u32 {
        self.owners.len() as u32
    }

    pub fn free_count(&self) -> u32 {
        self.free.len() as u32
    }

    pub fn owner(&self, extent: ExtentId) -> Option<ChunkId> {
        self.owners.get(extent.0 as usize).copied().flatten()
    }

    /// Gives the lowest free extent to `chunk`.
    pub fn grant(&mut self, chunk: ChunkId) -> Option<ExtentId> {
        let extent = self.free.pop_first()?;
        self.owners[extent as usize] = Some(chunk);
        Some(ExtentId(extent))
    }

    /// Records that `chunk` owns `extent` (when replaying the journal). False if the extent does
    /// not exist or another chunk owns it.
    pub fn assign(&mut self, extent: ExtentId, chunk: ChunkId) -> bool {
        match self.owners.get(extent.0 as usize) {
            Some(None) => {
                self.owners[extent.0 as usize] = Some(chunk);
                self.free.remove(&extent.0);
                true
            }
            Some(Some(owner)) => *owner == chunk,
            None => false,
        }
    }

    /// Takes an extent back from the chunk that owns it.
    pub fn release(&mut self, extent: ExtentId, chunk: ChunkId) {
        assert_eq!(self.owner(extent), Some(chunk), "{extent:?} released by a chunk that does not own it");
        self.owners[extent.0 as usize] = None;
        self.free.insert(extent.0);
    }
}

/// A chunk's blocks: for each extent it owns, a bitmap of the 32 blocks in use.
#[derive(Default)]
pub struct ChunkBlocks {
    extents: BTreeMap<ExtentId, u32>,
}

impl ChunkBlocks {
    pub fn add_extent(&mut self, extent: ExtentId) {
        let previous = self.extents.insert(extent, 0);
        assert!(previous.is_none(), "{extent:?} added twice");
    }

    pub fn remove_extent(&mut self, extent: ExtentId) {
        let bits = self.extents.remove(&extent).expect("removing an extent the chunk does not own");
        assert_eq!(bits, 0, "{extent:?} removed while blocks in it are in use");
    }

    pub fn owns(&self, extent: ExtentId) -> bool {
        self.extents.contains_key(&extent)
    }

    pub fn extents(&self) -> impl Iterator<Item = (ExtentId, u32)> + '_ {
        self.extents.iter().map(|(&e, &bits)| (e, bits))
    }

    /// Finds `count` contiguous free blocks in one extent (first fit), so that a page is one I/O,
    /// and marks them used.
    pub fn allocate(&mut self, count: u8) -> Option<BlockRun> {
        assert!(count >= 1 && u32::from(count) <= EXTENT_BLOCKS);
        for (&extent, bits) in self.extents.iter_mut() {
            if let Some(offset) = first_fit(*bits, count) {
                let run = BlockRun::new(extent, offset, count);
                *bits |= run.mask();
                return Some(run);
            }
        }
        None
    }

    /// Marks a run used (when replaying the journal). False if the extent is not the chunk's or
    /// a block of the run is already in use.
    pub fn mark_used(&mut self, run: BlockRun) -> bool {
        match self.extents.get_mut(&run.extent) {
            Some(bits) if *bits & run.mask() == 0 => {
                *bits |= run.mask();
                true
            }
            _ => false,
        }
    }

    /// Returns a run's blocks to the chunk's free space.
    pub fn free(&mut self, run: BlockRun) {
        let bits = self.extents.get_mut(&run.extent).expect("freeing blocks of an extent the chunk does not own");
        assert_eq!(*bits & run.mask(), run.mask(), "freeing {run} which is not fully in use");
        *bits &= !run.mask();
    }

    pub fn used_blocks(&self) -> u64 {
        self.extents.values().map(|b| u64::from(b.count_ones())).sum()
    }

    pub fn capacity_blocks(&self) -> u64 {
        self.extents.len() as u64 * u64::from(EXTENT_BLOCKS)
    }

    /// Extents with no block in use, which the chunk can give back.
    pub fn empty_extents(&self) -> Vec<ExtentId> {
        self.extents.iter().filter(|&(_, &bits)| bits == 0).map(|(&e, _)| e).collect()
    }
}

/// The lowest offset of `count` consecutive zero bits in `bits`.
fn first_fit(bits: u32, count: u8) -> Option<u8> {
    let mask = if u32::from(count) == EXTENT_BLOCKS { u32::MAX } else { (1u32 << count) - 1 };
    (0..=(EXTENT_BLOCKS - u32::from(count))).find(|&offset| bits & (mask << offset) == 0).map(|o| o as u8)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn extents_are_granted_and_returned() {
        let mut extents = ExtentAllocator::new(3);
        let a = extents.grant(ChunkId(1)).unwrap();
        let b = extents.grant(ChunkId(2)).unwrap();
        assert_ne!(a, b);
        assert_eq!(extents.owner(a), Some(ChunkId(1)));
        assert_eq!(extents.free_count(), 1);
        extents.release(a, ChunkId(1));
        assert_eq!(extents.grant(ChunkId(3)), Some(a));
        assert!(extents.grant(ChunkId(3)).is_some());
        assert_eq!(extents.grant(ChunkId(3)), None);
        assert!(!extents.assign(b, ChunkId(9)), "another chunk's extent");
        assert!(!extents.assign(ExtentId(7), ChunkId(1)), "no such extent");
    }

    #[test]
    fn first_fit_finds_contiguous_runs() {
        assert_eq!(first_fit(0, 32), Some(0));
        assert_eq!(first_fit(0b1, 4), Some(1));
        assert_eq!(first_fit(0b1011, 2), Some(4));
        assert_eq!(first_fit(u32::MAX, 1), None);
        assert_eq!(first_fit(!(0b111 << 29), 3), Some(29));
    }

    proptest! {
        /// Allocations never overlap, frees return exactly what was allocated, and the counts
        /// match a model set of used blocks.
        #[test]
        fn chunk_blocks_match_a_model(ops in proptest::collection::vec((any::<bool>(), 1u8..=8, any::<prop::sample::Index>()), 1..300)) {
            let mut blocks = ChunkBlocks::default();
            blocks.add_extent(ExtentId(4));
            blocks.add_extent(ExtentId(9));
            let mut live: Vec<BlockRun> = Vec::new();
            let mut used: HashSet<u64> = HashSet::new();
            for (alloc, count, pick) in ops {
                if alloc || live.is_empty() {
                    if let Some(run) = blocks.allocate(count) {
                        for b in 0..u64::from(run.count) {
                            prop_assert!(used.insert(run.first_lba().0 + b), "overlap at {}", run);
                        }
                        live.push(run);
                    } else {
                        // Refused only when no extent has `count` free blocks in a row.
                        for extent in [4u64, 9] {
                            let bits = (0..32u64).fold(0u32, |b, i| b | u32::from(used.contains(&(extent * 32 + i))) << i);
                            prop_assert!(first_fit(bits, count).is_none());
                        }
                    }
                } else {
                    let run = live.swap_remove(pick.index(live.len()));
                    blocks.free(run);
                    for b in 0..u64::from(run.count) {
                        used.remove(&(run.first_lba().0 + b));
                    }
                }
                prop_assert_eq!(blocks.used_blocks(), used.len() as u64);
            }
        }
    }
}
