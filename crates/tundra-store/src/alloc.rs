//! Space allocation in two levels (seed 000 §3.2.1): the device allocator hands 128 KiB extents
//! to chunks, and each chunk tracks its 4 KiB blocks in a bitmap per extent. Both are I/O-free
//! state machines. Neither is journalled: the blocks in use are exactly the runs of the mapped
//! pages (and the runs freed but not yet reusable), so recovery derives both from the index, and
//! `Store::check_invariants` compares them with that derivation.

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

/// A chunk's blocks: for each extent it owns, a bitmap of the 32 blocks in use, and the extents
/// indexed by the longest run of free blocks each holds, so that an allocation looks only at
/// extents that can take it instead of scanning every extent of a full chunk.
pub struct ChunkBlocks {
    extents: BTreeMap<ExtentId, u32>,
    /// `by_longest[n]`: the extents whose longest free run is `n` blocks (1..=32; full extents
    /// are in none).
    by_longest: [BTreeSet<ExtentId>; EXTENT_BLOCKS as usize + 1],
}

impl Default for ChunkBlocks {
    fn default() -> ChunkBlocks {
        ChunkBlocks { extents: BTreeMap::new(), by_longest: std::array::from_fn(|_| BTreeSet::new()) }
    }
}

impl ChunkBlocks {
    pub fn add_extent(&mut self, extent: ExtentId) {
        let previous = self.extents.insert(extent, 0);
        assert!(previous.is_none(), "{extent:?} added twice");
        self.by_longest[EXTENT_BLOCKS as usize].insert(extent);
    }

    pub fn remove_extent(&mut self, extent: ExtentId) {
        let bits = self.extents.remove(&extent).expect("removing an extent the chunk does not own");
        assert_eq!(bits, 0, "{extent:?} removed while blocks in it are in use");
        self.by_longest[EXTENT_BLOCKS as usize].remove(&extent);
    }

    pub fn owns(&self, extent: ExtentId) -> bool {
        self.extents.contains_key(&extent)
    }

    pub fn extents(&self) -> impl Iterator<Item = (ExtentId, u32)> + '_ {
        self.extents.iter().map(|(&e, &bits)| (e, bits))
    }

    /// Why the index by longest free run disagrees with the bitmaps, if it does.
    pub fn check_index(&self) -> Option<String> {
        for (&extent, &bits) in &self.extents {
            let longest = usize::from(longest_free_run(bits));
            for (n, set) in self.by_longest.iter().enumerate() {
                if set.contains(&extent) != (n == longest && n > 0) {
                    return Some(format!("{extent:?} (bitmap {bits:#010x}) is misfiled under longest free run {n}"));
                }
            }
        }
        let filed: usize = self.by_longest.iter().map(BTreeSet::len).sum();
        let free: usize = self.extents.values().filter(|&&bits| bits != u32::MAX).count();
        (filed != free).then(|| format!("{filed} extents filed by free run, {free} have room"))
    }

    /// Changes an extent's bitmap and keeps the index by longest free run in step.
    fn set_bits(&mut self, extent: ExtentId, bits: u32) {
        let slot = self.extents.get_mut(&extent).expect("an extent of the chunk");
        let (before, after) = (longest_free_run(*slot), longest_free_run(bits));
        *slot = bits;
        if before != after {
            if before > 0 {
                self.by_longest[usize::from(before)].remove(&extent);
            }
            if after > 0 {
                self.by_longest[usize::from(after)].insert(extent);
            }
        }
    }

    /// Finds `count` contiguous free blocks in one extent (first fit: the lowest extent that
    /// has room, at its lowest offset), so that a page is one I/O, and marks them used.
    pub fn allocate(&mut self, count: u8) -> Option<BlockRun> {
        assert!(count >= 1 && u32::from(count) <= EXTENT_BLOCKS);
        let extent = self.by_longest[usize::from(count)..].iter().filter_map(|set| set.first()).min().copied()?;
        let bits = self.extents[&extent];
        let offset = first_fit(bits, count).expect("the extent's longest free run holds `count` blocks");
        let run = BlockRun::new(extent, offset, count);
        self.set_bits(extent, bits | run.mask());
        Some(run)
    }

    /// Takes the `count` blocks that directly follow `previous` on the device, if they are free
    /// and the chunk's (in the same extent, or at the start of the next one), so that pages
    /// written together can go to the device in one I/O.
    pub fn allocate_after(&mut self, previous: BlockRun, count: u8) -> Option<BlockRun> {
        assert!(count >= 1 && u32::from(count) <= EXTENT_BLOCKS);
        let end = u32::from(previous.offset) + u32::from(previous.count);
        let (extent, offset) = if end + u32::from(count) <= EXTENT_BLOCKS {
            (previous.extent, end as u8)
        } else if end == EXTENT_BLOCKS {
            (ExtentId(previous.extent.0.checked_add(1)?), 0)
        } else {
            return None;
        };
        let bits = *self.extents.get(&extent)?;
        let run = BlockRun::new(extent, offset, count);
        if bits & run.mask() != 0 {
            return None;
        }
        self.set_bits(extent, bits | run.mask());
        Some(run)
    }

    /// Marks a run used (when replaying the journal). False if the extent is not the chunk's or
    /// a block of the run is already in use.
    pub fn mark_used(&mut self, run: BlockRun) -> bool {
        match self.extents.get(&run.extent) {
            Some(&bits) if bits & run.mask() == 0 => {
                self.set_bits(run.extent, bits | run.mask());
                true
            }
            _ => false,
        }
    }

    /// Returns a run's blocks to the chunk's free space.
    pub fn free(&mut self, run: BlockRun) {
        let bits = *self.extents.get(&run.extent).expect("freeing blocks of an extent the chunk does not own");
        assert_eq!(bits & run.mask(), run.mask(), "freeing {run} which is not fully in use");
        self.set_bits(run.extent, bits & !run.mask());
    }

    pub fn used_blocks(&self) -> u64 {
        self.extents.values().map(|b| u64::from(b.count_ones())).sum()
    }

    pub fn capacity_blocks(&self) -> u64 {
        self.extents.len() as u64 * u64::from(EXTENT_BLOCKS)
    }

    /// Extents with no block in use, which the chunk can give back.
    pub fn empty_extents(&self) -> Vec<ExtentId> {
        self.by_longest[EXTENT_BLOCKS as usize].iter().copied().collect()
    }
}

/// The length of the longest run of zero bits (free blocks) in `bits`.
fn longest_free_run(bits: u32) -> u8 {
    // Each step shortens every run of ones in `free` by one.
    let mut free = !bits;
    let mut longest = 0;
    while free != 0 {
        free &= free << 1;
        longest += 1;
    }
    longest
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

    #[test]
    fn longest_free_run_counts_zero_bits() {
        assert_eq!(longest_free_run(0), 32);
        assert_eq!(longest_free_run(u32::MAX), 0);
        assert_eq!(longest_free_run(!(1 << 31)), 1);
        assert_eq!(longest_free_run(0b1000_0001), 24);
        assert_eq!(longest_free_run(0xffff_00f0), 8);
    }

    #[test]
    fn allocate_after_continues_a_run_into_the_next_extent() {
        let mut blocks = ChunkBlocks::default();
        blocks.add_extent(ExtentId(4));
        blocks.add_extent(ExtentId(5));
        let first = blocks.allocate(30).unwrap();
        let second = blocks.allocate_after(first, 2).unwrap();
        assert_eq!(second.first_lba().0, first.first_lba().0 + 30);
        let third = blocks.allocate_after(second, 4).unwrap();
        assert_eq!((third.extent, third.offset), (ExtentId(5), 0));
        // Straddling an extent boundary, or landing on used blocks, is refused.
        let straddle = BlockRun::new(ExtentId(5), 4, 26);
        assert!(blocks.mark_used(straddle));
        assert_eq!(blocks.allocate_after(straddle, 4), None);
        blocks.free(first);
        assert_eq!(blocks.allocate_after(BlockRun::new(ExtentId(4), 28, 1), 2), None);
        assert_eq!(blocks.allocate(2), Some(BlockRun::new(ExtentId(4), 0, 2)));
    }

    /// The first fit of the naive allocator: the lowest extent with room, its lowest offset.
    fn naive_first_fit(used: &HashSet<u64>, extents: &[u64], count: u8) -> Option<(u64, u8)> {
        extents.iter().find_map(|&extent| {
            let bits = (0..32u64).fold(0u32, |b, i| b | u32::from(used.contains(&(extent * 32 + i))) << i);
            first_fit(bits, count).map(|offset| (extent, offset))
        })
    }

    proptest! {
        /// Allocations never overlap, frees return exactly what was allocated, the counts match
        /// a model set of used blocks, and every allocation is the naive first fit (or, after a
        /// previous run, the blocks right after it when those are free).
        #[test]
        fn chunk_blocks_match_a_model(ops in proptest::collection::vec((0u8..3, 1u8..=8, any::<prop::sample::Index>()), 1..300)) {
            let mut blocks = ChunkBlocks::default();
            let owned = [4u64, 5, 9];
            for extent in owned {
                blocks.add_extent(ExtentId(extent as u32));
            }
            let mut live: Vec<BlockRun> = Vec::new();
            let mut used: HashSet<u64> = HashSet::new();
            for (op, count, pick) in ops {
                if op < 2 || live.is_empty() {
                    let previous = (op == 1 && !live.is_empty()).then(|| live[pick.index(live.len())]);
                    let after = previous.and_then(|p| {
                        let lba = p.first_lba().0 + u64::from(p.count);
                        let fits = u32::from(p.offset) + u32::from(p.count) + u32::from(count) <= 32
                            || u32::from(p.offset) + u32::from(p.count) == 32;
                        let free = (lba..lba + u64::from(count)).all(|b| !used.contains(&b) && owned.contains(&(b / 32)));
                        (fits && free).then_some(lba)
                    });
                    let run = match previous {
                        Some(p) => blocks.allocate_after(p, count),
                        None => blocks.allocate(count),
                    };
                    match (previous, run) {
                        (Some(_), run) => prop_assert_eq!(run.map(|r| r.first_lba().0), after),
                        (None, Some(run)) => {
                            let want = naive_first_fit(&used, &owned, count);
                            prop_assert_eq!(Some((u64::from(run.extent.0), run.offset)), want);
                        }
                        (None, None) => prop_assert!(naive_first_fit(&used, &owned, count).is_none()),
                    }
                    if let Some(run) = run {
                        for b in 0..u64::from(run.count) {
                            prop_assert!(used.insert(run.first_lba().0 + b), "overlap at {}", run);
                        }
                        live.push(run);
                    }
                } else {
                    let run = live.swap_remove(pick.index(live.len()));
                    blocks.free(run);
                    for b in 0..u64::from(run.count) {
                        used.remove(&(run.first_lba().0 + b));
                    }
                }
                prop_assert_eq!(blocks.used_blocks(), used.len() as u64);
                let empty: Vec<ExtentId> = owned
                    .iter()
                    .filter(|&&e| (0..32).all(|i| !used.contains(&(e * 32 + i))))
                    .map(|&e| ExtentId(e as u32))
                    .collect();
                prop_assert_eq!(blocks.empty_extents(), empty);
            }
        }
    }
}
