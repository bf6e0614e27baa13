//! [`CsdDevice`], the drive as a [`BlockDevice`]: format and open (recovery, then a checkpoint
//! that makes the recovered map durable), the background thread's start and stop, the operator's
//! calls (garbage collection, draining deferred compression, checkpoints, statistics) and the
//! trait's read, write, trim, flush and usage, which check the request and hand it to the read,
//! write and trim paths.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Error, Lba, Result, Usage, check_io, check_range};

use super::layout::Geometry;
use super::read::READ_BATCH_BLOCKS;
use super::write::Prepared;
use super::{CsdConfig, CsdStats, FormatOptions, Shared, recovery};

/// The emulated compressing drive. Dropping it stops its background thread; call
/// [`CsdDevice::close`] to also write a final checkpoint.
pub struct CsdDevice {
    pub(super) shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
    /// What the open recovered around (a damaged superblock or checkpoint), for the operator.
    recovery_notes: Vec<String>,
}

impl CsdDevice {
    /// Formats `media` as an empty drive and opens it.
    pub fn format(media: Arc<dyn BlockDevice>, options: &FormatOptions, config: CsdConfig) -> Result<CsdDevice> {
        recovery::format(media.as_ref(), options)?;
        CsdDevice::open(media, config)
    }

    /// Opens a formatted drive, recovering its map after a crash.
    pub fn open(media: Arc<dyn BlockDevice>, config: CsdConfig) -> Result<CsdDevice> {
        let (geometry, state, cursor, notes) = recovery::recover(media.as_ref())?;
        let shared = Arc::new(Shared {
            media,
            geometry,
            config,
            state: Mutex::new(state),
            reuse_gate: RwLock::new(()),
            gc_lock: Mutex::new(()),
            checkpoint: Mutex::new(cursor),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            cpu: Default::default(),
        });
        // A checkpoint right away makes the recovered map durable, so nothing older is needed.
        shared.write_checkpoint()?;
        if config.compression == super::CompressionMode::Deferred {
            shared.queue_raw_blocks();
        }
        let worker = if config.background {
            let shared = shared.clone();
            Some(
                std::thread::Builder::new()
                    .name("tundra-csd".into())
                    .spawn(move || shared.background())
                    .map_err(|e| Error::io("starting the drive's background thread", e))?,
            )
        } else {
            None
        };
        Ok(CsdDevice { shared, worker, recovery_notes: notes.0 })
    }

    /// What opening the drive recovered around: a damaged superblock slot, or a damaged newest
    /// checkpoint replaced by the one before it (with the longer replay). Empty normally.
    pub fn recovery_notes(&self) -> &[String] {
        &self.recovery_notes
    }

    pub fn geometry(&self) -> Geometry {
        self.shared.geometry
    }

    /// How this drive was opened.
    pub fn config(&self) -> CsdConfig {
        self.shared.config
    }

    pub fn stats(&self) -> CsdStats {
        self.shared.stats()
    }

    /// What the `count` blocks at `lba` hold: their mapped bytes (4 KiB per block holding
    /// data) and the payload bytes those take on the media, counted as
    /// [`CsdStats::physical_used_bytes`] counts them. A walk of the range's map entries, for
    /// statistics: how much of the drive a region of its logical space really costs.
    pub fn range_usage(&self, lba: Lba, count: u64) -> Result<RangeUsage> {
        check_range(self.shared.geometry.logical_blocks, lba, count)?;
        let state = self.shared.state.lock();
        let mut usage = RangeUsage::default();
        for block in lba.0..lba.0 + count {
            if let Some(entry) = state.map.get(block) {
                usage.mapped_bytes += BLOCK_SIZE_BYTES;
                usage.physical_bytes += entry.payload_bytes();
            }
        }
        Ok(usage)
    }

    /// Runs garbage collection until no segment would free space or `max_segments` were
    /// collected; returns how many were.
    pub fn collect_garbage(&self, max_segments: usize) -> Result<usize> {
        let mut collected = 0;
        while collected < max_segments && self.shared.gc_one()? {
            collected += 1;
        }
        Ok(collected)
    }

    /// Compresses every block waiting in the deferred queue.
    pub fn drain_deferred(&self) -> Result<()> {
        while self.shared.compress_deferred(usize::MAX)? > 0 {}
        Ok(())
    }

    /// Writes a map checkpoint now.
    pub fn checkpoint(&self) -> Result<()> {
        self.shared.write_checkpoint()
    }

    /// Stops the background thread and writes a final checkpoint, so the next open scans nothing.
    pub fn close(mut self) -> Result<()> {
        self.stop_worker();
        self.shared.write_checkpoint()
    }

    /// Checks every derived count against a recount; for tests.
    pub fn check_invariants(&self) {
        self.shared.state.lock().check_invariants();
    }

    fn stop_worker(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        if let Some(worker) = self.worker.take() {
            // A panic in the worker is a bug; surface it in the thread that closes the drive.
            worker.join().expect("the drive's background thread panicked");
        }
    }
}

impl Drop for CsdDevice {
    fn drop(&mut self) {
        self.stop_worker();
    }
}

/// What a range of the drive's logical space holds ([`CsdDevice::range_usage`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RangeUsage {
    pub mapped_bytes: u64,
    pub physical_bytes: u64,
}

impl BlockDevice for CsdDevice {
    fn block_count(&self) -> u64 {
        self.shared.geometry.logical_blocks
    }

    fn read(&self, lba: Lba, buf: &mut [u8]) -> Result<()> {
        check_io(self.block_count(), lba, buf.len())?;
        // Bounded batches keep the memory of one read small; each batch is one map lookup under
        // the lock and one media read per run of adjacent records.
        for (i, chunk) in buf.chunks_mut(READ_BATCH_BLOCKS * BLOCK_SIZE).enumerate() {
            self.shared.read_blocks(lba.0 + (i * READ_BATCH_BLOCKS) as u64, chunk)?;
        }
        Ok(())
    }

    fn read_many(&self, reads: &mut [(Lba, &mut [u8])]) -> Result<()> {
        let mut blocks = 0;
        for (lba, buf) in reads.iter() {
            check_io(self.block_count(), *lba, buf.len())?;
            blocks += buf.len() / BLOCK_SIZE;
        }
        if blocks > READ_BATCH_BLOCKS {
            // Bounded memory, as `read`.
            return reads.iter_mut().try_for_each(|(lba, buf)| self.read(*lba, buf));
        }
        // One map lookup under the lock for every range, then the records of all of them
        // from the media together.
        self.shared.read_ranges(reads)
    }

    fn write(&self, lba: Lba, data: &[u8]) -> Result<()> {
        check_io(self.block_count(), lba, data.len())?;
        let mode = self.shared.config.compression;
        let blocks = data.len() / BLOCK_SIZE;
        let compresses = if mode == super::CompressionMode::Inline { blocks } else { 0 };
        let prepared: Vec<Prepared> = self.shared.cpu.measure(super::cpu::Work::Deflate, compresses, || {
            data.chunks_exact(BLOCK_SIZE).map(|b| Prepared::of(b, mode)).collect()
        });
        self.shared.write_prepared(lba.0, prepared)
    }

    fn trim(&self, lba: Lba, block_count: u64) -> Result<()> {
        check_range(self.block_count(), lba, block_count)?;
        if block_count == 0 {
            return Ok(());
        }
        self.shared.trim(lba.0, block_count)
    }

    fn flush(&self) -> Result<()> {
        self.shared.flush()
    }

    fn mapped_bytes_in(&self, lba: Lba, count: u64) -> Option<u64> {
        self.range_usage(lba, count).ok().map(|usage| usage.mapped_bytes)
    }

    /// Seed 000 §4.2.2 needs each chunk's physical bytes: the payloads of the range's map
    /// entries, as the drive's `physical_used_bytes` counts them.
    fn physical_bytes_in(&self, lba: Lba, count: u64) -> Option<u64> {
        self.range_usage(lba, count).ok().map(|usage| usage.physical_bytes)
    }

    fn usage(&self) -> Usage {
        let stats = self.stats();
        Usage {
            logical_capacity_bytes: stats.logical_capacity_bytes,
            mapped_bytes: stats.mapped_bytes,
            physical_used_bytes: stats.physical_used_bytes,
            physical_capacity_bytes: stats.physical_capacity_bytes,
        }
    }
}
