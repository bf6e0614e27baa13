//! The emulated compressing drive: a faithful, measurable model of PolarCSD (seed 000 §3.2.2,
//! §4.1.2), built on any [`BlockDevice`] as its "NAND".
//!
//! Each 4 KiB logical block is compressed on its own with raw deflate level 5 ([`deflate`]),
//! stored raw when that saves nothing, and not stored at all when it is all zeros (seed 001 §2).
//! Compression is a runtime setting ([`CompressionMode`]), not part of the media: with it off,
//! every block is stored as is, and a drive reads whatever records it finds either way.
//! Payloads are packed at 16-byte granularity as records in a log of fixed-size segments
//! ([`layout`]); an in-memory map of 7 bytes per LBA says where each block's record is ([`map`]).
//! Overwrites and TRIM leave dead records behind; garbage collection ([`gc`]) relocates the live
//! records of the emptiest segments and returns them to the free pool, drawing on an
//! over-provisioning reserve so that it can always make progress. The logical capacity is larger
//! than the physical one (the paper provisions 2.4x), and a write that needs physical space the
//! drive does not have fails with [`ErrorKind::DriveFull`](crate::ErrorKind::DriveFull) and changes
//! nothing (seed 000 §4.2.1: physical space is what operators must watch).
//!
//! Crash consistency ([`recovery`]): writes are durable after a flush; every record carries its
//! LBA, a sequence number and a checksum, so the map can be rebuilt from a periodic map checkpoint
//! plus a scan of the segments written since.

mod deflate;
mod gc;
pub mod layout;
mod map;
mod recovery;
mod state;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

use crate::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Error, Lba, Result, Usage, check_io, check_range};

pub use deflate::{DEFLATE_LEVEL, stored_payload_bytes};
use deflate::{Stored, compress_block, decompress_block};
use layout::{Geometry, RecordHeader, RecordKind, units};
use map::MapEntry;
pub use recovery::FormatOptions;
use state::{HeadKind, State};

/// How garbage collection picks the segment to empty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GcPolicy {
    /// The segment with the fewest live bytes.
    #[default]
    Greedy,
    /// The best (1 - u) * age / (1 + u), which leaves recently written segments time to die.
    CostBenefit,
}

/// Where the drive spends the host CPU that a real drive's engine would spend for free.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompressionMode {
    /// Compress in the writing thread before the write returns.
    #[default]
    Inline,
    /// Store blocks raw at once and compress them in a background pass: writes return sooner
    /// on a busy host, and physical usage drops once the pass catches up.
    Deferred,
    /// Never compress: every block written is stored as is, all-zero blocks included, as a
    /// drive without compression stores them, so physical usage equals the blocks written.
    /// Records written compressed earlier stay readable and stay compressed (garbage
    /// collection moves them as they are); the "software only" configuration of seed 000
    /// §5.3 (Figure 13).
    Off,
}

/// How an opened drive behaves; none of it is part of the on-media format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CsdConfig {
    pub gc_policy: GcPolicy,
    pub compression: CompressionMode,
    /// Run garbage collection, deferred compression and checkpoints on a background thread.
    /// Without it, writers do that work themselves when they must.
    pub background: bool,
    /// Write a map checkpoint after this many segments were sealed; 0 picks a default that keeps
    /// checkpoint traffic near a tenth of the data written.
    pub checkpoint_interval_segments: u32,
}

impl Default for CsdConfig {
    fn default() -> CsdConfig {
        CsdConfig {
            gc_policy: GcPolicy::Greedy,
            compression: CompressionMode::Inline,
            background: true,
            checkpoint_interval_segments: 0,
        }
    }
}

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

/// What the writing thread prepared for one block before taking the lock.
enum Prepared<'a> {
    Zero,
    Deflate(Vec<u8>),
    Raw(&'a [u8]),
}

impl<'a> Prepared<'a> {
    fn of(block: &'a [u8], mode: CompressionMode) -> Prepared<'a> {
        match mode {
            CompressionMode::Off => Prepared::Raw(block),
            _ if crate::is_zero(block) => Prepared::Zero,
            CompressionMode::Deferred => Prepared::Raw(block),
            CompressionMode::Inline => match compress_block(block) {
                Stored::Deflate(payload) => Prepared::Deflate(payload),
                Stored::Raw => Prepared::Raw(block),
            },
        }
    }

    fn payload_len(&self) -> usize {
        match self {
            Prepared::Zero => 0,
            Prepared::Deflate(p) => p.len(),
            Prepared::Raw(_) => BLOCK_SIZE,
        }
    }

    fn record_bytes(&self) -> u64 {
        match self {
            Prepared::Zero => 0,
            _ => 16 * (1 + units(self.payload_len()) as u64),
        }
    }
}

/// A trim record's payload is the block count.
const TRIM_PAYLOAD_BYTES: usize = 8;
/// A trim record on the media: header and the padded count.
const TRIM_RECORD_BYTES: u64 = 32;
/// Blocks looked up under one lock acquisition when reading.
const READ_BATCH_BLOCKS: usize = 64;
/// Blocks appended under one lock acquisition.
const WRITE_PIECE_BLOCKS: usize = 32;

pub(crate) struct Shared {
    media: Arc<dyn BlockDevice>,
    geometry: Geometry,
    config: CsdConfig,
    state: Mutex<State>,
    /// Readers hold it shared while they read a record from the media; a segment returns to the
    /// free pool only under it exclusively, so no reader ever reads a reused segment.
    reuse_gate: RwLock<()>,
    gc_lock: Mutex<()>,
    checkpoint: Mutex<recovery::CheckpointCursor>,
    wake: Condvar,
    shutdown: AtomicBool,
}

/// The emulated compressing drive. Dropping it stops its background thread; call
/// [`CsdDevice::close`] to also write a final checkpoint.
pub struct CsdDevice {
    shared: Arc<Shared>,
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
        });
        // A checkpoint right away makes the recovered map durable, so nothing older is needed.
        shared.write_checkpoint()?;
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

    pub fn stats(&self) -> CsdStats {
        self.shared.stats()
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

    fn write(&self, lba: Lba, data: &[u8]) -> Result<()> {
        check_io(self.block_count(), lba, data.len())?;
        let mode = self.shared.config.compression;
        let prepared: Vec<Prepared> = data.chunks_exact(BLOCK_SIZE).map(|b| Prepared::of(b, mode)).collect();
        self.shared.write_prepared(lba.0, prepared)
    }

    fn trim(&self, lba: Lba, block_count: u64) -> Result<()> {
        check_range(self.block_count(), lba, block_count)?;
        if block_count == 0 {
            return Ok(());
        }
        let mut state = self.shared.lock_for_append(TRIM_RECORD_BYTES)?;
        self.shared.append_trim(&mut state, lba.0, block_count)?;
        state.counters.host_trimmed_blocks += block_count;
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.shared.flush()
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

impl Shared {
    fn stats(&self) -> CsdStats {
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
            deferred_pending_blocks: state.deferred.len() as u64,
            counters: state.counters,
        }
    }

    /// Reads consecutive blocks: every map entry under one lock acquisition, then the records
    /// from the media, one read per run of records that lie in adjacent media blocks (blocks
    /// written together usually do), then verification and decompression of each.
    fn read_blocks(&self, first_lba: u64, out: &mut [u8]) -> Result<()> {
        let _gate = self.reuse_gate.read();
        let mut wanted: Vec<Wanted> = Vec::with_capacity(out.len() / BLOCK_SIZE);
        {
            let state = self.state.lock();
            for i in 0..(out.len() / BLOCK_SIZE) as u64 {
                let Some(entry) = state.map.get(first_lba + i) else { continue };
                let (segment, _) = self.geometry.split_location(entry.location);
                let in_head = state.record_in_head(entry.location, entry.record_bytes() as usize);
                let (open_seq, bytes) = match in_head {
                    Some((open_seq, bytes)) => (open_seq, Some(bytes)),
                    None => (state.segments[segment as usize].open_seq, None),
                };
                wanted.push(Wanted { index: i as usize, entry, open_seq, bytes });
            }
        }
        out.fill(0);
        self.read_runs(&mut wanted)?;
        for w in wanted {
            let bytes = w.bytes.as_deref().expect("every record was read");
            let block = &mut out[w.index * BLOCK_SIZE..][..BLOCK_SIZE];
            decode_block(first_lba + w.index as u64, w.entry, w.open_seq, bytes, block)?;
        }
        Ok(())
    }

    /// Fills in the bytes of every wanted record that is not in memory, merging records whose
    /// media blocks touch into one read.
    fn read_runs(&self, wanted: &mut [Wanted]) -> Result<()> {
        let span = |w: &Wanted| {
            let (segment, offset) = self.geometry.split_location(w.entry.location);
            let start = self.geometry.segment_offset(segment) + offset as u64;
            (start, start + w.entry.record_bytes())
        };
        let mut order: Vec<usize> = (0..wanted.len()).filter(|&i| wanted[i].bytes.is_none()).collect();
        order.sort_unstable_by_key(|&i| span(&wanted[i]).0);
        let mut at = 0;
        while at < order.len() {
            let first_block = span(&wanted[order[at]]).0 / BLOCK_SIZE_BYTES;
            let mut end_block = span(&wanted[order[at]]).1.div_ceil(BLOCK_SIZE_BYTES);
            let mut next = at + 1;
            while next < order.len() && span(&wanted[order[next]]).0 / BLOCK_SIZE_BYTES <= end_block {
                end_block = end_block.max(span(&wanted[order[next]]).1.div_ceil(BLOCK_SIZE_BYTES));
                next += 1;
            }
            let mut run = vec![0u8; ((end_block - first_block) * BLOCK_SIZE_BYTES) as usize];
            self.media.read(Lba(first_block), &mut run)?;
            for &i in &order[at..next] {
                let (start, end) = span(&wanted[i]);
                let from = (start - first_block * BLOCK_SIZE_BYTES) as usize;
                wanted[i].bytes = Some(run[from..from + (end - start) as usize].to_vec());
            }
            at = next;
        }
        Ok(())
    }

    /// Takes the state lock once the user head has room for `bytes`, collecting garbage first
    /// if it must.
    fn lock_for_append(&self, bytes: u64) -> Result<MutexGuard<'_, State>> {
        loop {
            let state = self.state.lock();
            state.check_failed()?;
            if state.user_room() >= bytes {
                return Ok(state);
            }
            drop(state);
            self.wake.notify_all();
            if !self.gc_one()? {
                return Err(Error::drive_full("no physical space left and nothing to collect"));
            }
        }
    }

    fn write_prepared(&self, first_lba: u64, prepared: Vec<Prepared<'_>>) -> Result<()> {
        let reserved = self.admit(first_lba, &prepared)?;
        let mut lba = first_lba;
        let mut pieces = prepared.into_iter().peekable();
        let mut result = Ok(());
        while result.is_ok() && pieces.peek().is_some() {
            let piece: Vec<Prepared<'_>> = pieces.by_ref().take(WRITE_PIECE_BLOCKS).collect();
            let count = piece.len() as u64;
            result = self.append_piece(lba, piece);
            lba += count;
        }
        self.state.lock().reserved_bytes -= reserved;
        result?;
        self.after_append()
    }

    /// Refuses a write the physical capacity cannot hold, before anything changes, and reserves
    /// the physical bytes it needs so that concurrent writers cannot be admitted into the same
    /// space. Returns the reservation, which the caller releases when the write is done. Blocks
    /// waiting for deferred compression are compressed first when that would make room.
    fn admit(&self, first_lba: u64, prepared: &[Prepared<'_>]) -> Result<u64> {
        let result = self.check_capacity(first_lba, prepared);
        let deferred = !self.state.lock().deferred.is_empty();
        match result {
            Err(e) if e.kind() == crate::ErrorKind::DriveFull && deferred => {
                while self.compress_deferred(usize::MAX)? > 0 {}
                self.check_capacity(first_lba, prepared)
            }
            other => other,
        }
    }

    fn check_capacity(&self, first_lba: u64, prepared: &[Prepared<'_>]) -> Result<u64> {
        let mut state = self.state.lock();
        state.check_failed()?;
        let mut need: i64 = 0;
        for (i, block) in prepared.iter().enumerate() {
            need += block.record_bytes() as i64;
            need -= state.map.get(first_lba + i as u64).map_or(0, |e| e.record_bytes() as i64);
        }
        let capacity = self.geometry.physical_capacity_bytes() as i64;
        let committed = (state.live_bytes + state.reserved_bytes) as i64;
        if need > 0 && committed + need > capacity {
            return Err(Error::drive_full(format!(
                "writing {} blocks needs {need} more physical bytes; {committed} of {capacity} are in use or promised",
                prepared.len(),
            )));
        }
        let reserved = need.max(0) as u64;
        state.reserved_bytes += reserved;
        Ok(reserved)
    }

    fn append_piece(&self, first_lba: u64, piece: Vec<Prepared<'_>>) -> Result<()> {
        let bytes: u64 = piece.iter().map(|p| p.record_bytes().max(TRIM_RECORD_BYTES)).sum();
        let blocks = piece.len() as u64;
        let mut state = self.lock_for_append(bytes)?;
        let mut zero_run: Option<(u64, u64)> = None;
        for (i, block) in piece.into_iter().enumerate() {
            let lba = first_lba + i as u64;
            if let Prepared::Zero = block {
                zero_run = Some(zero_run.map_or((lba, 1), |(start, n)| (start, n + 1)));
                continue;
            }
            if let Some((start, n)) = zero_run.take() {
                self.append_trim(&mut state, start, n)?;
            }
            self.append_block(&mut state, HeadKind::User, lba, block)?;
        }
        if let Some((start, n)) = zero_run {
            self.append_trim(&mut state, start, n)?;
        }
        state.counters.host_written_blocks += blocks;
        Ok(())
    }

    /// Appends one block's record and points the map at it.
    fn append_block(&self, state: &mut State, head: HeadKind, lba: u64, block: Prepared<'_>) -> Result<()> {
        let (kind, payload) = match &block {
            Prepared::Deflate(p) => (RecordKind::Deflate, p.as_slice()),
            Prepared::Raw(b) => (RecordKind::Raw, *b),
            Prepared::Zero => unreachable!("zero blocks are appended as trims"),
        };
        let header = state.header(kind, lba, payload.len())?;
        let location = state.append(self.media.as_ref(), head, header, payload)?;
        let raw = kind == RecordKind::Raw;
        state.replace(lba, Some(MapEntry { location, payload_units: units(payload.len()) as u16, raw }));
        if raw && head == HeadKind::User && self.config.compression == CompressionMode::Deferred {
            let (segment, _) = self.geometry.split_location(location);
            let open_seq = state.segments[segment as usize].open_seq;
            state.deferred.push_back(DeferredBlock { lba, location, open_seq });
        }
        Ok(())
    }

    fn append_trim(&self, state: &mut State, lba: u64, count: u64) -> Result<()> {
        let header = state.header(RecordKind::Trim, lba, TRIM_PAYLOAD_BYTES)?;
        state.append(self.media.as_ref(), HeadKind::User, header, &count.to_le_bytes())?;
        for key in lba..lba + count {
            if state.map.get(key).is_some() {
                state.replace(key, None);
            }
        }
        Ok(())
    }

    /// Wakes the background thread when there is work for it, or does the work that cannot
    /// wait itself when there is no background thread.
    fn after_append(&self) -> Result<()> {
        let (checkpoint_due, deferred) = {
            let state = self.state.lock();
            (state.sealed_since_checkpoint >= self.checkpoint_interval(), !state.deferred.is_empty())
        };
        if self.config.background {
            if checkpoint_due || deferred {
                self.wake.notify_all();
            }
            return Ok(());
        }
        if checkpoint_due {
            self.write_checkpoint()?;
        }
        Ok(())
    }

    /// Segments sealed between checkpoints: enough that checkpoint writes stay near a tenth of
    /// the segment writes, and the recovery scan stays bounded by the same number.
    fn checkpoint_interval(&self) -> u32 {
        if self.config.checkpoint_interval_segments > 0 {
            return self.config.checkpoint_interval_segments;
        }
        let checkpoint_bytes = self.geometry.checkpoint_blocks() * BLOCK_SIZE_BYTES;
        (10 * checkpoint_bytes / self.geometry.segment_bytes).clamp(16, 1024) as u32
    }

    fn flush(&self) -> Result<()> {
        {
            let mut state = self.state.lock();
            state.check_failed()?;
            state.write_head(self.media.as_ref(), HeadKind::User)?;
            state.write_head(self.media.as_ref(), HeadKind::Gc)?;
        }
        if let Err(error) = self.media.flush() {
            // After a failed flush the media may have dropped writes it had accepted; a later
            // flush that succeeds would not bring them back, so nothing may be called durable
            // again until the drive is reopened and recovered.
            self.state.lock().failed.get_or_insert_with(|| format!("flush failed: {error}"));
            return Err(error);
        }
        Ok(())
    }

    /// The background thread: keeps free segments above a low watermark, compresses deferred
    /// blocks, and writes checkpoints when due. It stops at the first error, which the drive
    /// then reports to every caller.
    fn background(&self) {
        while !self.shutdown.load(Ordering::SeqCst) {
            {
                let mut state = self.state.lock();
                let idle = state.free.len() >= self.free_low_watermark()
                    && state.deferred.is_empty()
                    && state.sealed_since_checkpoint < self.checkpoint_interval();
                if idle {
                    self.wake.wait_for(&mut state, Duration::from_millis(50));
                }
            }
            if let Err(error) = self.background_pass() {
                let mut state = self.state.lock();
                state.failed.get_or_insert_with(|| format!("background work failed: {error}"));
                return;
            }
        }
    }

    fn background_pass(&self) -> Result<()> {
        while self.state.lock().free.len() < self.free_low_watermark() && !self.shutdown.load(Ordering::SeqCst) {
            if !self.gc_one()? {
                break;
            }
        }
        self.compress_deferred(256)?;
        if self.state.lock().sealed_since_checkpoint >= self.checkpoint_interval() {
            self.write_checkpoint()?;
        }
        Ok(())
    }

    /// Garbage collection starts in the background below this many free segments.
    fn free_low_watermark(&self) -> usize {
        let reserve = (self.geometry.segment_count - self.geometry.usable_segments) as usize;
        state::GC_RESERVE_SEGMENTS + reserve.div_ceil(2)
    }
}

/// A record a read needs: where it is, and its bytes once read.
pub(crate) struct Wanted {
    index: usize,
    entry: MapEntry,
    open_seq: u64,
    bytes: Option<Vec<u8>>,
}

/// A raw block waiting for the background compression pass.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DeferredBlock {
    lba: u64,
    location: u64,
    /// The incarnation of the record's segment, so that a reused location is never mistaken
    /// for the record queued.
    open_seq: u64,
}

/// Verifies a record read for `lba` and expands it into `out`.
fn decode_block(lba: u64, entry: MapEntry, open_seq: u64, bytes: &[u8], out: &mut [u8]) -> Result<()> {
    let Some((header, payload)) = RecordHeader::decode(open_seq, bytes) else {
        return Err(Error::corrupted(format!("record of LBA {lba} at unit {} fails its checksum", entry.location)));
    };
    if header.lba != lba || units(header.payload_len) != usize::from(entry.payload_units) {
        return Err(Error::corrupted(format!(
            "record at unit {} belongs to LBA {} ({} bytes), not LBA {lba}",
            entry.location, header.lba, header.payload_len
        )));
    }
    match header.kind {
        RecordKind::Raw if entry.raw && payload.len() == BLOCK_SIZE => {
            out.copy_from_slice(payload);
            Ok(())
        }
        RecordKind::Deflate if !entry.raw => decompress_block(payload, out),
        kind => Err(Error::corrupted(format!("record of LBA {lba} has kind {kind:?}, raw flag {}", entry.raw))),
    }
}

#[cfg(test)]
mod fallback_tests;
#[cfg(test)]
mod tests;
