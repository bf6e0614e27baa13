//! What `tundra stats` and the metrics endpoint report: space by layer (logical, after software
//! compression, on the drive's media) for the node and each volume, the drive's own counters,
//! caches and latencies.

use serde::Serialize;
use tundra_store::volume::VolumeMode;

use crate::histogram::LatencySummary;
use crate::node::{Configuration, Device, Node};

impl Node {
    /// Everything `tundra stats` shows.
    pub fn stats(&self) -> NodeStats {
        let drive = self.drive.stats();
        let mut volumes = Vec::new();
        let mut node = SpaceStats::default();
        for v in self.volumes() {
            let usage = self.store(v.device).volume_usage(v.volume.id);
            let logical = usage.pages * u64::from(v.volume.page_size);
            let space = SpaceStats {
                pages: usage.pages,
                logical_bytes: logical,
                software_bytes: usage.stored_bytes,
                compressed_bytes: usage.compressed_bytes,
                raw_pages: usage.raw_pages,
                lz4_pages: usage.lz4_pages,
                zstd_pages: usage.zstd_pages,
                heavy_pages: usage.heavy_pages,
            };
            if v.device == Device::Drive {
                node.add(&space);
            }
            volumes.push((v, space));
        }
        let redo: Vec<Option<crate::redo::RedoWatermarks>> =
            volumes.iter().map(|(v, _)| self.redo.stream(v.volume.id).and_then(|_| self.redo_status(v).ok())).collect();
        // The log slots' media is the redo streams', not the pages'.
        let slot_physical: u64 = redo.iter().flatten().map(|r| r.slot_physical_bytes).sum();
        let drive_physical = drive.physical_used_bytes.saturating_sub(slot_physical);
        let volumes = volumes
            .into_iter()
            .zip(redo)
            .map(|((v, space), redo)| {
                // The drive does not know volumes: its physical bytes (less the log slots') are
                // shared out in proportion to the blocks each volume's pages take.
                let physical = match v.device {
                    Device::Drive if node.software_bytes > 0 => {
                        (drive_physical as u128 * space.software_bytes as u128 / node.software_bytes as u128) as u64
                    }
                    Device::Drive => 0,
                    Device::Fast => space.software_bytes,
                };
                VolumeStats {
                    id: v.volume.id.0,
                    name: v.volume.name.clone(),
                    size_bytes: v.volume.size_bytes,
                    page_size: v.volume.page_size,
                    mode: mode_name(v.volume.mode),
                    device: v.device,
                    software_ratio: ratio(space.logical_bytes, space.software_bytes),
                    physical_bytes_attributed: physical,
                    ratio: ratio(space.logical_bytes, physical),
                    space,
                    page_read: v.latency.page_read.summary(),
                    page_write: v.latency.page_write.summary(),
                    flush: v.latency.flush.summary(),
                    redo,
                }
            })
            .collect();
        let cache = self.paths.values().map(|p| p.cache_stats()).fold((0, 0), |(h, m), s| (h + s.hits, m + s.misses));
        let store = self.data.stats();
        let (write_back_pieces, write_back_piece_reads) = self.writeback.piece_counts();
        NodeStats {
            uptime_seconds: self.clock.now().saturating_sub(self.started).as_secs_f64(),
            data_dir: self.data_dir.display().to_string(),
            configuration: self.configuration,
            software_ratio: ratio(node.logical_bytes, node.software_bytes),
            drive_ratio: ratio(drive.mapped_bytes, drive.physical_used_bytes),
            ratio: ratio(node.logical_bytes, drive.physical_used_bytes),
            compressed: node,
            drive: DriveStats {
                logical_capacity_bytes: self.layout.drive_logical_bytes,
                redo_slot_logical_bytes: drive.logical_capacity_bytes.saturating_sub(self.layout.drive_logical_bytes),
                physical_capacity_bytes: drive.physical_capacity_bytes,
                mapped_bytes: drive.mapped_bytes,
                physical_used_bytes: drive.physical_used_bytes,
                physical_live_bytes: drive.physical_live_bytes,
                physical_allocated_bytes: drive.physical_allocated_bytes,
                gc_write_amplification: drive.gc_write_amplification(),
                gc_moved_bytes: drive.counters.gc_moved_bytes,
                free_segments: drive.free_segments,
                segments: drive.segments,
                deferred_pending_blocks: drive.deferred_pending_blocks,
                deferred_compressed_blocks: drive.counters.deferred_compressed_blocks,
            },
            cpu: CpuStats::of(&drive.cpu),
            rechoose: RechooseStats::of(self.paths.values().map(|p| p.rechoose_stats())),
            fast_volume_bytes: self.layout.fast_volume_bytes,
            index_memory_bytes: store.index_memory_bytes + self.fast.stats().index_memory_bytes,
            index_bytes_per_page: if store.pages == 0 {
                0.0
            } else {
                store.index_memory_bytes as f64 / store.pages as f64
            },
            cache_hits: cache.0,
            cache_misses: cache.1,
            write_back_dirty_bytes: self.writeback.dirty_bytes(),
            write_back_pieces,
            write_back_piece_reads,
            journals: JournalsStats {
                drive: JournalStats::of(self.data.journal_stats(), self.data.unwritten_images()),
                fast: JournalStats::of(self.fast.journal_stats(), self.fast.unwritten_images()),
            },
            volumes,
            mounts: self.mount_stats(),
        }
    }
}

/// One chunk's space, counted as [`Node::stats`] counts the node's: logical bytes are live
/// pages times the page size (as `compressed.logical_bytes`), physical bytes are the drive's
/// media bytes under the chunk's blocks (as `drive.physical_used_bytes`). A node's usage less
/// the sum of its chunks is what no chunk accounts for (metadata, redo log slots).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ChunkSpace {
    pub pages: u64,
    pub logical_bytes: u64,
    pub physical_bytes: u64,
}

impl Node {
    /// The space of chunk `chunk` here (zero for a chunk of an unknown volume or with no page).
    pub fn chunk_space(&self, chunk: tundra_store::ids::ChunkId) -> ChunkSpace {
        let Ok(v) = self.volume(chunk.volume()) else {
            return ChunkSpace::default();
        };
        let usage = self.store(v.device).chunk_usage(chunk);
        let physical_bytes = match v.device {
            Device::Drive => usage.physical_bytes.unwrap_or(usage.stored_bytes),
            Device::Fast => usage.stored_bytes,
        };
        ChunkSpace { pages: usage.pages, logical_bytes: usage.pages * u64::from(v.volume.page_size), physical_bytes }
    }
}

fn mode_name(mode: VolumeMode) -> &'static str {
    match mode {
        VolumeMode::Normal => "normal",
        VolumeMode::None => "none",
    }
}

fn ratio(logical: u64, physical: u64) -> f64 {
    if physical == 0 { 0.0 } else { logical as f64 / physical as f64 }
}

/// Space of a set of pages, by layer.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct SpaceStats {
    pub pages: u64,
    /// Pages times the page size.
    pub logical_bytes: u64,
    /// What the pages take after software compression, in 4 KiB blocks.
    pub software_bytes: u64,
    /// What they take at byte granularity.
    pub compressed_bytes: u64,
    pub raw_pages: u64,
    pub lz4_pages: u64,
    pub zstd_pages: u64,
    pub heavy_pages: u64,
}

impl SpaceStats {
    fn add(&mut self, o: &SpaceStats) {
        self.pages += o.pages;
        self.logical_bytes += o.logical_bytes;
        self.software_bytes += o.software_bytes;
        self.compressed_bytes += o.compressed_bytes;
        self.raw_pages += o.raw_pages;
        self.lz4_pages += o.lz4_pages;
        self.zstd_pages += o.zstd_pages;
        self.heavy_pages += o.heavy_pages;
    }
}

/// What a store's journal has done since the node started (tundra-store's `JournalStats`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct JournalStats {
    /// Group commits written: one log write and one flush of the log each.
    pub group_commits: u64,
    /// Group commits that flushed the data device first (a record pointed at blocks written
    /// straight there); the rest carried their page images in the log (docs/format.md, "Small
    /// commits carry their images") and cost one host flush.
    pub data_flushes: u64,
    /// Page images carried in the log.
    pub carried_images: u64,
    /// Of those, the images waiting now to be written to their blocks (a store that writes
    /// behind, docs/format.md "Write-behind"; at most 1,024).
    pub waiting_images: u64,
    pub checkpoints: u64,
}

impl JournalStats {
    fn of(s: tundra_store::journal::JournalStats, waiting_images: usize) -> JournalStats {
        JournalStats {
            group_commits: s.group_commits,
            data_flushes: s.data_flushes,
            carried_images: s.carried_images,
            waiting_images: waiting_images as u64,
            checkpoints: s.checkpoints,
        }
    }
}

/// The journals of the node's two stores.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct JournalsStats {
    /// The compressed store's (volumes on the drive).
    pub drive: JournalStats,
    /// The uncompressed store's (volumes of mode none on the fast device).
    pub fast: JournalStats,
}

/// What the pass that chooses again the pages written on a busy host has done since the node
/// started (tundra-store's `RechooseStats`, summed over the page paths).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RechooseStats {
    /// Pages waiting for an idle host.
    pub pending_pages: u64,
    /// Pages not remembered because the set was full.
    pub dropped_pages: u64,
    pub examined_pages: u64,
    /// Pages stored again with the encoding the comparison chose.
    pub rewritten_pages: u64,
    /// 4 KiB-rounded bytes the rewritten pages took before and take now: software space won back.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Passes that found the host busy and did nothing.
    pub busy_passes: u64,
}

impl RechooseStats {
    fn of(paths: impl Iterator<Item = tundra_store::pages::RechooseStats>) -> RechooseStats {
        let mut sum = RechooseStats::default();
        for s in paths {
            sum.pending_pages += s.pending_pages;
            sum.dropped_pages += s.dropped_pages;
            sum.examined_pages += s.examined_pages;
            sum.rewritten_pages += s.rewritten_pages;
            sum.bytes_before += s.bytes_before;
            sum.bytes_after += s.bytes_after;
            sum.busy_passes += s.busy_passes;
        }
        sum
    }
}

/// The node process's CPU, the emulated drive's part apart: PolarCSD compresses in hardware
/// (seed 000 §3.2.2), so what a real drive would take off the host is reported on its own.
#[derive(Clone, Debug, Serialize)]
pub struct CpuStats {
    /// The process's CPU time (user and system) since it started.
    pub process_seconds: f64,
    /// Of it, the emulated drive's: its background thread, deflate in the writing threads and
    /// inflate in the reading threads.
    pub drive_seconds: f64,
    pub drive_background_seconds: f64,
    pub drive_deflate_seconds: f64,
    pub drive_inflate_seconds: f64,
    /// The rest: the node's own software (protocols, software compression, the store, redo).
    pub host_seconds: f64,
    /// Blocks the drive compressed and decompressed since it was opened.
    pub drive_deflated_blocks: u64,
    pub drive_inflated_blocks: u64,
}

impl CpuStats {
    fn of(drive: &tundra_device::csd::DriveCpu) -> CpuStats {
        let seconds = |ns: u64| ns as f64 / 1e9;
        let process = process_cpu_seconds();
        let drive_seconds = seconds(drive.total_ns());
        CpuStats {
            process_seconds: process,
            drive_seconds,
            drive_background_seconds: seconds(drive.background_thread_ns),
            drive_deflate_seconds: seconds(drive.host_deflate_ns),
            drive_inflate_seconds: seconds(drive.host_inflate_ns),
            host_seconds: (process - drive_seconds).max(0.0),
            drive_deflated_blocks: drive.deflated_blocks,
            drive_inflated_blocks: drive.inflated_blocks,
        }
    }
}

/// This process's user and system CPU time, in seconds.
fn process_cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is valid and writable for the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[derive(Clone, Debug, Serialize)]
pub struct DriveStats {
    /// The drive's logical space for volumes' pages (`drive.logical`).
    pub logical_capacity_bytes: u64,
    /// The drive's logical space after it that holds the redo streams' per-page log slots.
    pub redo_slot_logical_bytes: u64,
    pub physical_capacity_bytes: u64,
    pub mapped_bytes: u64,
    pub physical_used_bytes: u64,
    /// The live records with their 16-byte headers: what the data takes on the media.
    pub physical_live_bytes: u64,
    /// Media held by segments that are not free, garbage not yet collected included.
    pub physical_allocated_bytes: u64,
    pub gc_write_amplification: f64,
    pub gc_moved_bytes: u64,
    pub free_segments: u64,
    pub segments: u64,
    /// Blocks stored raw, waiting for the drive's background compression (deferred mode).
    pub deferred_pending_blocks: u64,
    /// Blocks the background compression has compressed since the drive was formatted.
    pub deferred_compressed_blocks: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct VolumeStats {
    pub id: u32,
    pub name: String,
    pub size_bytes: u64,
    pub page_size: u32,
    pub mode: &'static str,
    pub device: Device,
    #[serde(flatten)]
    pub space: SpaceStats,
    pub software_ratio: f64,
    /// The drive's physical bytes shared out by software bytes (the drive does not know
    /// volumes); for the fast device, the software bytes.
    pub physical_bytes_attributed: u64,
    pub ratio: f64,
    pub page_read: LatencySummary,
    pub page_write: LatencySummary,
    pub flush: LatencySummary,
    /// The volume's redo stream, if its writer sends redo: writer epoch, durable, complete and
    /// minimum reader LSN, unfolded record bytes, live reader leases.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redo: Option<crate::redo::RedoWatermarks>,
}

#[derive(Clone, Debug, Serialize)]
pub struct NodeStats {
    pub uptime_seconds: f64,
    pub data_dir: String,
    /// Which layers compress.
    pub configuration: Configuration,
    /// The compressed volumes' pages (mode none volumes excluded).
    pub compressed: SpaceStats,
    /// Logical over software bytes.
    pub software_ratio: f64,
    /// The drive's own ratio: mapped over physical bytes.
    pub drive_ratio: f64,
    /// Both layers: logical over physical bytes.
    pub ratio: f64,
    pub drive: DriveStats,
    /// The process's CPU, the emulated drive's apart.
    pub cpu: CpuStats,
    /// The background pass that compares again pages written while the host was busy.
    pub rechoose: RechooseStats,
    /// The fast device's space for uncompressed volumes (mode none).
    pub fast_volume_bytes: u64,
    pub index_memory_bytes: u64,
    pub index_bytes_per_page: f64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Block-device writes acknowledged and held in the write-back cache until the next flush.
    pub write_back_dirty_bytes: u64,
    /// Block-device writes of less than a page, merged into their page in the write-back cache.
    pub write_back_pieces: u64,
    /// Of those, the ones whose page was not in the write-back cache and was read from the store
    /// first (a read-modify-write; from the page cache when it held the page).
    pub write_back_piece_reads: u64,
    pub journals: JournalsStats,
    pub volumes: Vec<VolumeStats>,
    /// Volumes served as files through FUSE in the node's process.
    pub mounts: Vec<crate::mount::MountStats>,
}
