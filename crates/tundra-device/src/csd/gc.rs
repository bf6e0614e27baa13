//! Garbage collection and the deferred compression pass: the two kinds of background work that
//! move records between segments.
//!
//! Collecting a segment: pick a victim (greedy or cost-benefit), read it whole, and relocate every
//! record the map still points at into the collector's open segment with a fresh sequence number,
//! all under the state lock so that a concurrent overwrite either happens before (and the record
//! is dead) or after (and wins by its higher sequence number). Trim records newer than the durable
//! checkpoint are still needed by recovery and move with their original sequence number. The
//! emptied segment is reused only after the relocations are flushed and no reader can still be
//! reading it (the reuse gate).

use std::sync::atomic::Ordering;

use crate::{BLOCK_SIZE, BLOCK_SIZE_BYTES, Error, Lba, Result};

use super::deflate::{Stored, compress_block};
use super::layout::{RecordHeader, RecordKind, SEGMENT_HEADER_BYTES, units};
use super::map::MapEntry;
use super::state::{GC_RESERVE_SEGMENTS, HeadKind, SegmentState, State};
use super::{CompressionMode, DeferredBlock, Prepared, Shared, Wanted};

/// Deferred blocks compressed per batch. Their compressed copies fit in the collector's reserve
/// even with the smallest segments.
const DEFERRED_BATCH_BLOCKS: usize = 16;

/// A record found in a victim segment.
struct Found {
    header: RecordHeader,
    location: u64,
    payload: Vec<u8>,
    /// In deferred mode, a raw block compressed before the lock is taken.
    compressed: Option<Vec<u8>>,
}

impl Shared {
    /// Collects one segment. Returns false when no segment would free space.
    pub(crate) fn gc_one(&self) -> Result<bool> {
        let _one_at_a_time = self.gc_lock.lock();
        let victim = {
            let mut state = self.state.lock();
            state.check_failed()?;
            let Some(victim) = state.choose_victim(self.config.gc_policy) else { return Ok(false) };
            state.segments[victim as usize].state = SegmentState::Collecting;
            victim
        };
        match self.collect(victim) {
            Ok(()) => {}
            Err(error) => {
                self.state.lock().segments[victim as usize].state = SegmentState::Sealed;
                return Err(error);
            }
        }
        self.release_pending()?;
        Ok(true)
    }

    fn collect(&self, victim: u32) -> Result<()> {
        let (open_seq, filled) = {
            let state = self.state.lock();
            let segment = state.segments[victim as usize];
            (segment.open_seq, segment.filled_bytes as usize)
        };
        let mut found = self.read_segment_records(victim, open_seq, filled)?;
        if self.config.compression == CompressionMode::Deferred {
            // Compress outside the lock: readers and writers must never wait for it.
            let raw = found.iter().filter(|r| r.header.kind == RecordKind::Raw).count();
            self.cpu.measure(super::cpu::Work::Deflate, raw, || {
                for record in found.iter_mut().filter(|r| r.header.kind == RecordKind::Raw) {
                    if let Stored::Deflate(payload) = compress_block(&record.payload) {
                        record.compressed = Some(payload);
                    }
                }
            });
        }
        let mut state = self.state.lock();
        for record in found {
            self.relocate(&mut state, record)?;
        }
        let segment = &mut state.segments[victim as usize];
        if segment.live_bytes != 0 {
            return Err(Error::corrupted(format!(
                "segment {victim} holds {} live bytes that its records do not account for",
                segment.live_bytes
            )));
        }
        segment.state = SegmentState::PendingFree;
        state.pending_free.push(victim);
        state.counters.gc_segments_collected += 1;
        Ok(())
    }

    /// Reads a sealed segment and parses its records up to the first that does not verify.
    fn read_segment_records(&self, segment: u32, open_seq: u64, filled: usize) -> Result<Vec<Found>> {
        let length = filled.div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        let mut bytes = vec![0u8; length];
        let offset = self.geometry.segment_offset(segment);
        self.media.read(Lba(offset / BLOCK_SIZE_BYTES), &mut bytes)?;
        let mut found = Vec::new();
        let mut at = SEGMENT_HEADER_BYTES;
        while let Some((header, payload)) = RecordHeader::decode(open_seq, &bytes[at..filled.min(length)]) {
            let location = self.geometry.location(segment, at);
            found.push(Found { header, location, payload: payload.to_vec(), compressed: None });
            at += header.record_bytes();
        }
        Ok(found)
    }

    fn relocate(&self, state: &mut State, record: Found) -> Result<()> {
        let header = record.header;
        if header.kind == RecordKind::Trim {
            // A trim record is dropped only once both checkpoints recovery may start from
            // reflect it: the newest, and the one before, kept in case the newest is damaged.
            // Dropped earlier, a fallback to the older checkpoint would bring the trimmed
            // block's old data back.
            if header.seq > trims_needed_after(state) {
                state.append(self.media.as_ref(), HeadKind::Gc, header, &record.payload)?;
                state.counters.gc_moved_bytes += header.record_bytes() as u64;
            }
            return Ok(());
        }
        let live = state.map.get(header.lba).is_some_and(|e| e.location == record.location);
        if !live {
            return Ok(());
        }
        let compressed = record.compressed.is_some();
        let prepared = match (header.kind, record.compressed) {
            (_, Some(payload)) => Prepared::Deflate(payload),
            (RecordKind::Raw, None) => Prepared::Raw(&record.payload),
            _ => Prepared::Deflate(record.payload.clone()),
        };
        let moved = header.record_bytes() as u64;
        self.append_block(state, HeadKind::Gc, header.lba, prepared)?;
        state.counters.gc_moved_bytes += moved;
        if compressed {
            state.counters.deferred_compressed_blocks += 1;
        }
        Ok(())
    }

    /// Returns emptied segments to the free pool once their relocations are durable and no
    /// reader still holds a location inside them.
    pub(crate) fn release_pending(&self) -> Result<()> {
        self.flush()?;
        let _no_readers = self.reuse_gate.write();
        let mut state = self.state.lock();
        let pending = std::mem::take(&mut state.pending_free);
        for segment in pending {
            state.segments[segment as usize].state = SegmentState::Free;
            state.free.push(segment);
        }
        Ok(())
    }

    /// Compresses up to `max_blocks` blocks that deferred writes stored raw. Returns how many
    /// queued blocks it took off the queue.
    pub(crate) fn compress_deferred(&self, max_blocks: usize) -> Result<usize> {
        let mut taken = 0;
        while taken < max_blocks && !self.shutdown.load(Ordering::Relaxed) {
            let batch: Vec<DeferredBlock> = {
                let mut state = self.state.lock();
                state.check_failed()?;
                if state.free.len() <= GC_RESERVE_SEGMENTS {
                    // Compressed copies go to the collector's head; leave its reserve alone.
                    drop(state);
                    if !self.gc_one()? {
                        break;
                    }
                    continue;
                }
                let n = DEFERRED_BATCH_BLOCKS.min(max_blocks - taken).min(state.deferred.len());
                state.deferred_in_flight += n as u64;
                state.deferred.drain(..n).collect()
            };
            if batch.is_empty() {
                break;
            }
            taken += batch.len();
            self.compress_batch(batch)?;
        }
        Ok(taken)
    }

    /// Compresses a batch of deferred blocks: one lookup under the lock, one media read per run
    /// of adjacent records, compression outside the lock, one installation under it.
    fn compress_batch(&self, batch: Vec<DeferredBlock>) -> Result<()> {
        let _gate = self.reuse_gate.read();
        let compressed = self.compress_batch_outside_lock(&batch);
        let mut state = self.state.lock();
        // The batch is settled once this lock is released, whatever happened to it: its blocks
        // are compressed, or stay raw (they do not compress, changed meanwhile, or the pass
        // failed and the drive refuses everything until it is reopened).
        state.deferred_in_flight = state.deferred_in_flight.saturating_sub(batch.len() as u64);
        for (block, payload) in compressed? {
            // The block may have been overwritten, trimmed or relocated while we compressed.
            if !state.map.get(block.lba).is_some_and(|e| self.still_queued(&state, block, e)) {
                continue;
            }
            debug_assert!(units(payload.len()) < units(BLOCK_SIZE));
            self.append_block(&mut state, HeadKind::Gc, block.lba, Prepared::Deflate(payload))?;
            state.counters.deferred_compressed_blocks += 1;
        }
        Ok(())
    }

    /// The part of a compression pass done outside the drive's lock: the records looked up,
    /// read and deflated. Returns the blocks that compressed, with their payloads.
    fn compress_batch_outside_lock(&self, batch: &[DeferredBlock]) -> Result<Vec<(DeferredBlock, Vec<u8>)>> {
        let mut wanted = Vec::with_capacity(batch.len());
        {
            let state = self.state.lock();
            for (index, block) in batch.iter().enumerate() {
                let Some(entry) = state.map.get(block.lba).filter(|&e| self.still_queued(&state, *block, e)) else {
                    continue;
                };
                let bytes = state.record_in_head(entry.location, entry.record_bytes() as usize).map(|(_, b)| b);
                wanted.push(Wanted { range: 0, index, entry, open_seq: block.open_seq, bytes });
            }
        }
        self.read_runs(&mut wanted)?;
        let mut compressed = Vec::with_capacity(wanted.len());
        let cpu_started = super::cpu::thread_cpu_ns();
        for w in &wanted {
            let block = batch[w.index];
            let bytes = w.bytes.as_deref().expect("every record was read");
            let Some((header, payload)) = RecordHeader::decode(block.open_seq, bytes) else {
                return Err(Error::corrupted(format!("deferred block of LBA {} fails its checksum", block.lba)));
            };
            if header.kind != RecordKind::Raw || header.lba != block.lba {
                return Err(Error::corrupted(format!("deferred block of LBA {} is not its raw record", block.lba)));
            }
            if let Stored::Deflate(payload) = compress_block(payload) {
                compressed.push((block, payload));
            }
        }
        self.cpu.measured(super::cpu::Work::Deflate, wanted.len(), cpu_started);
        Ok(compressed)
    }

    /// Queues every block stored raw for the deferred pass: the queue lives in memory, so
    /// blocks a closed or crashed drive had not compressed yet would otherwise stay raw until
    /// garbage collection moved them. Blocks that do not compress are tried once per open.
    pub(crate) fn queue_raw_blocks(&self) {
        let mut state = self.state.lock();
        let queued: Vec<DeferredBlock> = state
            .map
            .iter()
            .filter(|(_, entry)| entry.raw)
            .map(|(lba, entry)| {
                let (segment, _) = self.geometry.split_location(entry.location);
                DeferredBlock { lba, location: entry.location, open_seq: state.segments[segment as usize].open_seq }
            })
            .collect();
        state.deferred.extend(queued);
    }

    fn still_queued(&self, state: &State, block: DeferredBlock, entry: MapEntry) -> bool {
        let (segment, _) = self.geometry.split_location(entry.location);
        entry.location == block.location && entry.raw && state.segments[segment as usize].open_seq == block.open_seq
    }
}

#[cfg(test)]
thread_local! {
    /// The bug the fallback tests guard against, for showing they catch it: trim records
    /// dropped as soon as the newest checkpoint reflects them.
    static DROP_TRIMS_AT_NEWEST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Test-only: makes garbage collection on this thread drop trim records the older checkpoint
/// still needs, as the drive's first format did.
#[cfg(test)]
pub(crate) fn set_drop_trims_at_newest(on: bool) {
    DROP_TRIMS_AT_NEWEST.with(|flag| flag.set(on));
}

/// The sequence number at and below which a trim record is reflected in every checkpoint
/// recovery may start from.
fn trims_needed_after(state: &State) -> u64 {
    #[cfg(test)]
    if DROP_TRIMS_AT_NEWEST.with(|flag| flag.get()) {
        return state.durable_checkpoint_seq;
    }
    state.retained_checkpoint_seq.min(state.durable_checkpoint_seq)
}
