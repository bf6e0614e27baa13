//! What the drive reports about itself: lifetime [`Counters`] (saved with every checkpoint) and
//! the [`CsdStats`] snapshot that `tundra drive stats`, the node's metrics and the benchmarks
//! read, with the ratios derived from it.

use crate::BLOCK_SIZE_BYTES;

use super::Shared;

/// Lifetime counters, saved with every checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub host_written_blocks: u64,
    pub host_trimmed_blocks: u64,
    /// Record bytes appended to segments, for host writes and relocations alike.
    pub media_appended_bytes: u64,
    /// Bytes written to the media, rewritten partial blocks and checkpoints included.
    pub media_written_bytes: u64,
    pub gc_moved_bytes: u64,
    pub gc_segments_collected: u64,
    pub deferred_compressed_blocks: u64,
    pub checkpoints: u64,
}

impl Counters {
    pub const COUNT: usize = 8;

    pub fn to_array(&self) -> [u64; Self::COUNT] {
        [
            self.host_written_blocks,
            self.host_trimmed_blocks,
            self.media_appended_bytes,
            self.media_written_bytes,
            self.gc_moved_bytes,
            self.gc_segments_collected,
            self.deferred_compressed_blocks,
            self.checkpoints,
        ]
    }

    pub fn from_array(values: [u64; Self::COUNT]) -> Counters {
        let [
            host_written_blocks,
            host_trimmed_blocks,
            media_appended_bytes,
            media_written_bytes,
            gc_moved_bytes,
            gc_segments_collected,
            deferred_compressed_blocks,
            checkpoints,
        ] = values;
        Counters {
            host_written_blocks,
            host_trimmed_blocks,
            media_appended_bytes,
            media_written_bytes,
            gc_moved_bytes,
            gc_segments_collected,
            deferred_compressed_blocks,
            checkpoints,
        }
    }

    /// What happened between `earlier` and these counters.
    pub fn since(&self, earlier: &Counters) -> Counters {
        let now = self.to_array();
        let then = earlier.to_array();
        Counters::from_array(std::array::from_fn(|i| now[i].saturating_sub(then[i])))
    }
}

/// Everything the drive reports about itself. docs/cli.md and docs/glossary.md explain each.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CsdStats {
    pub logical_capacity_bytes: u64,
    pub mapped_bytes: u64,
    /// Live payload after 16-byte rounding: the compressed size of the mapped data.
    pub physical_used_bytes: u64,
    /// Live records including their 16-byte headers.
    pub physical_live_bytes: u64,
    /// Media held by segments that are not free: live and dead records alike.
    pub physical_allocated_bytes: u64,
    /// Physical space for data, over-provisioning excluded.
    pub physical_capacity_bytes: u64,
    /// All segment space, over-provisioning included.
    pub media_bytes: u64,
    pub map_memory_bytes: u64,
    pub map_entries: u64,
    pub segment_bytes: u64,
    pub segments: u64,
    pub free_segments: u64,
    pub deferred_pending_blocks: u64,
    pub counters: Counters,
    /// The host CPU the emulation cost since the drive was opened (not saved on the media).
    pub cpu: super::DriveCpu,
}

impl CsdStats {
    /// Mapped bytes over physically used bytes.
    pub fn compression_ratio(&self) -> f64 {
        if self.physical_used_bytes == 0 { 0.0 } else { self.mapped_bytes as f64 / self.physical_used_bytes as f64 }
    }

    /// Record bytes appended per record byte the host caused: 1.0 with no garbage collection.
    pub fn gc_write_amplification(&self) -> f64 {
        let host = self.counters.media_appended_bytes.saturating_sub(self.counters.gc_moved_bytes);
        if host == 0 { 1.0 } else { self.counters.media_appended_bytes as f64 / host as f64 }
    }

    /// Media held over media the live data needs.
    pub fn space_amplification(&self) -> f64 {
        if self.physical_live_bytes == 0 {
            0.0
        } else {
            self.physical_allocated_bytes as f64 / self.physical_live_bytes as f64
        }
    }

    pub fn map_bytes_per_lba(&self) -> f64 {
        self.map_memory_bytes as f64 / self.map_entries.max(1) as f64
    }
}

impl Shared {
    pub(super) fn stats(&self) -> CsdStats {
        let state = self.state.lock();
        let g = self.geometry;
        let free = state.free.len() as u64;
        CsdStats {
            logical_capacity_bytes: g.logical_blocks * BLOCK_SIZE_BYTES,
            mapped_bytes: state.mapped_blocks * BLOCK_SIZE_BYTES,
            physical_used_bytes: state.payload_bytes,
            physical_live_bytes: state.live_bytes,
            physical_allocated_bytes: (u64::from(g.segment_count) - free) * g.segment_bytes,
            physical_capacity_bytes: g.physical_capacity_bytes(),
            media_bytes: u64::from(g.segment_count) * g.segment_bytes,
            map_memory_bytes: state.map.memory_bytes(),
            map_entries: g.logical_blocks,
            segment_bytes: g.segment_bytes,
            segments: u64::from(g.segment_count),
            free_segments: free,
            deferred_pending_blocks: state.deferred.len() as u64 + state.deferred_in_flight,
            counters: state.counters,
            cpu: self.cpu.snapshot(),
        }
    }
}
