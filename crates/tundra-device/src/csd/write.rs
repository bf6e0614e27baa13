//! The write path: each block is prepared (compressed, found to be zeros, or kept raw) in the
//! writing thread before any lock is taken, the write is admitted against the physical capacity
//! (a write the drive cannot hold fails with `DriveFull` before anything changes), and its
//! records are appended to the user head in pieces, each under one acquisition of the state
//! lock; runs of zero blocks become trim records. Flush writes both open heads and flushes the
//! media.

use parking_lot::MutexGuard;

use crate::{BLOCK_SIZE, Error, Result};

use super::deflate::{Stored, compress_block};
use super::layout::{RecordKind, units};
use super::map::MapEntry;
use super::state::{HeadKind, State};
use super::trim::TRIM_RECORD_BYTES;
use super::{CompressionMode, Shared};

/// Blocks appended under one lock acquisition.
const WRITE_PIECE_BLOCKS: usize = 32;

/// What the writing thread prepared for one block before taking the lock.
pub(super) enum Prepared<'a> {
    Zero,
    Deflate(Vec<u8>),
    Raw(&'a [u8]),
}

impl<'a> Prepared<'a> {
    pub(super) fn of(block: &'a [u8], mode: CompressionMode) -> Prepared<'a> {
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

impl Shared {
    /// Takes the state lock once the user head has room for `bytes`, collecting garbage first
    /// if it must.
    pub(super) fn lock_for_append(&self, bytes: u64) -> Result<MutexGuard<'_, State>> {
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

    pub(super) fn write_prepared(&self, first_lba: u64, prepared: Vec<Prepared<'_>>) -> Result<()> {
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
    pub(super) fn append_block(&self, state: &mut State, head: HeadKind, lba: u64, block: Prepared<'_>) -> Result<()> {
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

    pub(super) fn flush(&self) -> Result<()> {
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
}

/// A raw block waiting for the background compression pass.
#[derive(Clone, Copy, Debug)]
pub(super) struct DeferredBlock {
    pub(super) lba: u64,
    pub(super) location: u64,
    /// The incarnation of the record's segment, so that a reused location is never mistaken
    /// for the record queued.
    pub(super) open_seq: u64,
}
