//! The store's invariants, checked against a derivation from first principles: the allocator
//! is rebuilt from the index (and the runs waiting to be freed) and must equal the one kept
//! step by step. Expensive (it walks every page), so it runs in tests and simulation, after
//! every step of the model and crash tests, never on the I/O path.

use std::collections::{BTreeMap, HashMap};

use super::StoreCore;
use crate::ids::{BlockRun, ChunkId, ExtentId};
use crate::index::Encoding;

impl StoreCore {
    /// Why the state is inconsistent, if it is. Valid only when no write is between its
    /// allocation and its install (a quiescent store): such a write's blocks are in use but in
    /// no index entry yet.
    pub fn invariant_problem(&self) -> Option<String> {
        let mut heavy: HashMap<(ChunkId, BlockRun), u32> = HashMap::new();
        let mut expected: BTreeMap<(ChunkId, ExtentId), u32> = BTreeMap::new();
        let mut mark = |chunk: ChunkId, run: BlockRun, what: &str| -> Option<String> {
            let bits = expected.entry((chunk, run.extent)).or_insert(0);
            if *bits & run.mask() != 0 {
                return Some(format!("{what} {run} of chunk {} overlaps blocks already in use", chunk.0));
            }
            *bits |= run.mask();
            None
        };
        let chunks: Vec<(&ChunkId, &super::state::Chunk)> = self.chunks.iter().collect();
        for &(&chunk, c) in &chunks {
            for (page, entry) in c.index.iter() {
                if self.volumes.get(&chunk.volume()).is_none_or(|v| !v.contains(chunk, page)) {
                    return Some(format!("page {} of chunk {} is outside every volume", page.0, chunk.0));
                }
                if entry.encoding == Encoding::Heavy {
                    let refs = heavy.entry((chunk, entry.run)).or_insert(0);
                    *refs += 1;
                    if *refs > 1 {
                        continue;
                    }
                }
                if let Some(problem) = mark(chunk, entry.run, &format!("page {}'s run", page.0)) {
                    return Some(problem);
                }
            }
        }
        for &(chunk, run) in &self.pending_free {
            if let Some(problem) = mark(chunk, run, "the freed run") {
                return Some(problem);
            }
        }
        if heavy != self.heavy_refs {
            return Some(format!("heavy segment counts {:?} where the index holds {heavy:?}", self.heavy_refs));
        }
        self.allocator_problem(&chunks, &expected)
    }

    /// Compares every chunk's bitmaps and the device allocator's owners with `expected`.
    fn allocator_problem(
        &self,
        chunks: &[(&ChunkId, &super::state::Chunk)],
        expected: &BTreeMap<(ChunkId, ExtentId), u32>,
    ) -> Option<String> {
        let mut owned = 0u32;
        for &(&chunk, c) in chunks {
            if let Some(problem) = c.blocks.check_index() {
                return Some(format!("chunk {}: {problem}", chunk.0));
            }
            for (extent, bits) in c.blocks.extents() {
                owned += 1;
                if self.extents.owner(extent) != Some(chunk) {
                    return Some(format!(
                        "chunk {} uses {extent:?}, owned by {:?}",
                        chunk.0,
                        self.extents.owner(extent)
                    ));
                }
                let want = expected.get(&(chunk, extent)).copied().unwrap_or(0);
                if bits != want {
                    return Some(format!(
                        "chunk {} {extent:?}: blocks in use {bits:#010x}, the index and freed runs use {want:#010x}",
                        chunk.0
                    ));
                }
            }
        }
        if let Some((&(chunk, extent), _)) =
            expected.iter().find(|((chunk, extent), _)| self.chunks.get(chunk).is_none_or(|c| !c.blocks.owns(*extent)))
        {
            return Some(format!("chunk {} has pages in {extent:?}, which it does not own", chunk.0));
        }
        let free = self.extents.free_count();
        (owned + free != self.extents.extent_count())
            .then(|| format!("{owned} extents owned and {free} free of {}", self.extents.extent_count()))
    }
}
