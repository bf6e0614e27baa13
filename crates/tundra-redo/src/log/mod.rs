//! The redo log: one volume's redo stream made durable on a slice of the fast device, never
//! compressed (seed 000 §3.3.1, Opt#1), with group commit, fencing of stale writers, reads of
//! the records back, and a ring whose space returns once the records are persisted elsewhere.
//!
//! The device holds two superblock copies and a ring of log blocks (framing in [`frame`],
//! docs/format.md "The redo log"). Batches are encoded ([`crate::codec`]), wrapped in a frame
//! (length and checksum) and appended to a byte stream that fills the blocks' payloads one after
//! the other, so a large batch spans blocks and a small one shares its block with others. A
//! group commit writes the pending frames from the last, partly filled block on (rewriting it:
//! a single block write is atomic, so its earlier frames survive a torn rewrite) and flushes;
//! only then are its batches answered. A batch is durable as a whole or not at all: recovery
//! ([`recovery`]) takes a frame only when all its bytes are there and its checksum verifies.
//!
//! Each open starts a new session at a fresh block; blocks record their session and the first
//! block of it, so blocks a crashed session left beyond the end are never read as the log's.
//! The superblock records the fence (the highest writer epoch of truncated batches; the log's
//! batches carry the rest) and the retained start: `truncate_through` moves it, writing both
//! superblock copies before any block it frees is reused.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};
use tundra_device::{BlockDevice, Lba};
use tundra_store::ids::Lsn;

use crate::{AppendOutcome, Error, ErrorKind, RedoBatch, Result, WriterEpoch, codec};

#[cfg(test)]
mod crash_tests;
mod frame;
mod read;
mod recovery;
#[cfg(test)]
mod tests;

use frame::{BlockHeader, PAYLOAD_BYTES, Superblock, encode_block, encode_frame};
pub use frame::{LogGeometry, Position, Session, StreamOffset};
pub use read::BatchReader;

/// A retained batch: where its frame starts in the stream and how long it is, the end of the
/// LSNs it claims, and the session of the block it starts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BatchEntry {
    start: StreamOffset,
    frame_bytes: u64,
    end_lsn: Lsn,
    session: Session,
}

/// What the open found in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovered {
    /// Batches ending at or before this LSN were truncated; the log holds the ones after it.
    pub start_lsn: Lsn,
    /// The end of the last durable batch: the `prev_lsn` the next batch must carry.
    pub durable_lsn: Lsn,
    /// The highest writer epoch seen: batches of a lower one are fenced.
    pub fence: WriterEpoch,
    /// Batches retained in the log.
    pub batches: usize,
    /// Damage recovered from without loss (a superblock copy), one line each.
    pub notes: Vec<String>,
}

/// A batch accepted into the next group commit; [`RedoLog::wait`] returns once it is durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a submitted batch is durable only once waited for"]
pub struct Ticket {
    group: u64,
    end_lsn: Lsn,
}

impl Ticket {
    /// The end of the accepted batch.
    pub fn end_lsn(&self) -> Lsn {
        self.end_lsn
    }
}

/// What [`RedoLog::submit`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submitted {
    /// Accepted: the stream's end is now the batch's end; durable once waited for.
    Accepted(Ticket),
    /// Refused with `Gap` or `Fenced`, as [`RedoLog::append`] answers; nothing changed.
    Refused(AppendOutcome),
}

struct Committer {
    /// The highest writer epoch accepted, the end of the last accepted batch and the stream
    /// offset after its frame: batches pending or in flight included.
    fence: WriterEpoch,
    accepted_lsn: Lsn,
    accepted_end: StreamOffset,
    /// Frames accepted but not yet handed to a group commit, and their entries.
    pending: Vec<u8>,
    pending_entries: Vec<BatchEntry>,
    /// The group the pending frames will go out in; every group up to `durable_group` is durable.
    pending_group: u64,
    durable_group: u64,
    committing: bool,
    /// The end of the durable stream, and the durable bytes of its partly filled last block
    /// (empty at a block boundary): the next group rewrites that block with them.
    durable_lsn: Lsn,
    durable_end: StreamOffset,
    durable_fence: WriterEpoch,
    tail: Vec<u8>,
    /// The durable batches retained, and the retained start both superblock copies name.
    entries: VecDeque<BatchEntry>,
    start: StreamOffset,
    start_lsn: Lsn,
    failed: Option<String>,
}

/// One volume's redo log on its device.
pub struct RedoLog {
    device: Arc<dyn BlockDevice>,
    geometry: LogGeometry,
    session: Session,
    session_start: Position,
    committer: Mutex<Committer>,
    committed: Condvar,
    /// The superblock last written; held while one is written, so updates never interleave.
    superblock: Mutex<Superblock>,
    /// Held shared by readers and exclusively while a group's blocks are written, so a reader
    /// never sees the partly filled block in the middle of its rewrite.
    io_gate: RwLock<()>,
}

impl RedoLog {
    /// Lays an empty log on `device`: the blocks it takes are trimmed (a trimmed block reads as
    /// zeros, which recovery reads as never written), then both superblock copies are written.
    /// The stream starts at LSN 0.
    pub fn format(device: &dyn BlockDevice, geometry: LogGeometry) -> Result<()> {
        RedoLog::format_at(device, geometry, Lsn(0))
    }

    /// [`RedoLog::format`] for a stream whose batches through `start_lsn` are elsewhere (a
    /// replica's stream installed from another's copy: the records before are in its pages):
    /// the first batch appended must carry `prev_lsn == start_lsn`.
    pub fn format_at(device: &dyn BlockDevice, geometry: LogGeometry, start_lsn: Lsn) -> Result<()> {
        if let Some(problem) = geometry.problem() {
            return Err(Error::invalid(format!("a redo log with {problem}")));
        }
        if device.block_count() < geometry.total_blocks() {
            return Err(Error::invalid(format!(
                "the device has {} blocks; a redo log of {} log blocks needs {}",
                device.block_count(),
                geometry.log_blocks,
                geometry.total_blocks()
            )));
        }
        device.trim(Lba(0), geometry.total_blocks())?;
        device.flush()?;
        let superblock = Superblock {
            geometry,
            generation: 0,
            session: Session(0),
            fence: WriterEpoch(0),
            start: StreamOffset(0),
            start_lsn,
            start_session: Session(0),
        };
        write_superblock_pair(device, &superblock)?;
        Ok(())
    }

    /// Opens the log and recovers it; a new session starts. Damage is a `Corrupted` error
    /// naming the block; nothing is written then.
    pub fn open(device: Arc<dyn BlockDevice>) -> Result<(RedoLog, Recovered)> {
        let found = recovery::inspect(device.as_ref())?;
        let superblock = Superblock { session: found.next_session, fence: found.fence, ..found.superblock };
        // The new session is in both copies before any block of it is written.
        let superblock = write_superblock_pair(device.as_ref(), &superblock)?;
        let recovered = Recovered {
            start_lsn: superblock.start_lsn,
            durable_lsn: found.durable_lsn,
            fence: found.fence,
            batches: found.entries.len(),
            notes: found.notes,
        };
        let session_end = found.session_start.start();
        let committer = Committer {
            fence: found.fence,
            accepted_lsn: found.durable_lsn,
            accepted_end: session_end,
            pending: Vec::new(),
            pending_entries: Vec::new(),
            pending_group: 1,
            durable_group: 0,
            committing: false,
            durable_lsn: found.durable_lsn,
            durable_end: session_end,
            durable_fence: found.fence,
            tail: Vec::new(),
            entries: found.entries,
            start: superblock.start,
            start_lsn: superblock.start_lsn,
            failed: None,
        };
        let log = RedoLog {
            device,
            geometry: superblock.geometry,
            session: superblock.session,
            session_start: found.session_start,
            committer: Mutex::new(committer),
            committed: Condvar::new(),
            superblock: Mutex::new(superblock),
            io_gate: RwLock::new(()),
        };
        Ok((log, recovered))
    }

    pub fn geometry(&self) -> LogGeometry {
        self.geometry
    }

    /// Appends a batch and answers once it is durable (written and flushed), sharing the flush
    /// with whatever other threads append at the same time. `Gap` and `Fenced` change nothing;
    /// a malformed batch or one of another volume is an `Invalid` error and a batch that does
    /// not fit the ring's free space a `Full` one, both changing nothing.
    pub fn append(&self, batch: &RedoBatch) -> Result<AppendOutcome> {
        match self.submit(batch)? {
            Submitted::Accepted(ticket) => Ok(AppendOutcome::Ok { durable_lsn: self.wait(ticket)? }),
            Submitted::Refused(outcome) => Ok(outcome),
        }
    }

    /// Accepts a batch into the next group commit without waiting for it, so a writer's
    /// connection can pass batch after batch in order while earlier ones are being flushed.
    /// The checks are `append`'s, in this order: the volume and the batch's form (`Invalid`),
    /// the epoch (`Fenced`), `prev_lsn` (`Gap`), room in the ring (`Full`). A higher epoch
    /// becomes the fence.
    pub fn submit(&self, batch: &RedoBatch) -> Result<Submitted> {
        let volume = self.geometry.volume;
        if batch.volume != volume {
            return Err(Error::invalid(format!(
                "a batch for volume {} sent to volume {}'s redo log",
                batch.volume.0, volume.0
            )));
        }
        codec::check_batch(batch, self.geometry.page_size)?;
        let mut bytes = Vec::new();
        codec::encode_batch(batch, &mut bytes);
        let mut frame = Vec::with_capacity(bytes.len() + frame::FRAME_HEADER_BYTES);
        if bytes.len() as u64 + frame::FRAME_HEADER_BYTES as u64 > self.geometry.capacity_bytes() {
            return Err(Error::invalid(format!(
                "a batch of {} bytes can never fit a redo log of {} bytes",
                bytes.len(),
                self.geometry.capacity_bytes()
            )));
        }
        encode_frame(&bytes, &mut frame);
        let mut c = self.committer.lock();
        if let Some(reason) = &c.failed {
            return Err(Error::new(ErrorKind::Closed, format!("the redo log stopped after an error ({reason})")));
        }
        if batch.epoch < c.fence {
            return Ok(Submitted::Refused(AppendOutcome::Fenced { epoch: c.fence }));
        }
        if batch.prev_lsn != c.accepted_lsn {
            return Ok(Submitted::Refused(AppendOutcome::Gap { expected_prev_lsn: c.accepted_lsn }));
        }
        let end = c.accepted_end.plus(frame.len() as u64);
        let limit = c.start.position().after(self.geometry.log_blocks).start();
        if end > limit {
            return Err(Error::new(
                ErrorKind::Full,
                format!(
                    "the redo log holds no room for a batch of {} bytes: {} of its {} bytes are retained or \
                     pending; truncate it once its records are persisted",
                    frame.len(),
                    c.accepted_end.0 - c.start.position().start().0,
                    self.geometry.capacity_bytes()
                ),
            ));
        }
        let entry = BatchEntry {
            start: c.accepted_end,
            frame_bytes: frame.len() as u64,
            end_lsn: batch.end_lsn,
            session: self.session,
        };
        c.pending_entries.push(entry);
        c.pending.extend_from_slice(&frame);
        c.accepted_end = end;
        c.accepted_lsn = batch.end_lsn;
        c.fence = batch.epoch;
        Ok(Submitted::Accepted(Ticket { group: c.pending_group, end_lsn: batch.end_lsn }))
    }

    /// Waits until the ticket's batch is durable, writing a group commit when no other thread
    /// is; returns the durable LSN then (at least the batch's end).
    pub fn wait(&self, ticket: Ticket) -> Result<Lsn> {
        let mut c = self.committer.lock();
        loop {
            if c.durable_group >= ticket.group {
                return Ok(c.durable_lsn);
            }
            if let Some(reason) = &c.failed {
                return Err(Error::new(ErrorKind::Closed, format!("the redo log stopped after an error ({reason})")));
            }
            if c.committing {
                self.committed.wait(&mut c);
                continue;
            }
            // This thread writes the pending group, its own batch's among them.
            c.committing = true;
            let group = c.pending_group;
            c.pending_group += 1;
            let first = c.durable_end.position();
            assert_eq!(c.tail.len(), c.durable_end.in_block(), "the tail is the durable part of the last block");
            let mut bytes = c.tail.clone();
            bytes.append(&mut c.pending);
            let entries = std::mem::take(&mut c.pending_entries);
            let (end_lsn, end, fence) = (c.accepted_lsn, c.accepted_end, c.fence);
            drop(c);
            let written = self.write_group(first, &bytes);
            c = self.committer.lock();
            c.committing = false;
            match written {
                Ok(tail) => {
                    c.tail = tail;
                    c.durable_end = end;
                    c.durable_lsn = end_lsn;
                    c.durable_fence = fence;
                    c.entries.extend(entries);
                    c.durable_group = group;
                }
                Err(error) => c.failed = Some(error.to_string()),
            }
            self.committed.notify_all();
        }
    }

    /// Makes every batch accepted so far durable (a group commit of the pending ones, or a wait
    /// for the one in flight); returns the durable LSN then. Nothing accepted and not durable:
    /// returns at once, writing nothing.
    pub fn sync(&self) -> Result<Lsn> {
        let ticket = {
            let c = self.committer.lock();
            // The pending frames go out in `pending_group`; with none pending, the last group
            // started (perhaps still in flight) holds everything accepted.
            let group = if c.pending_entries.is_empty() { c.pending_group - 1 } else { c.pending_group };
            Ticket { group, end_lsn: c.accepted_lsn }
        };
        self.wait(ticket)
    }

    /// Writes a group's stream bytes as log blocks from `first` (the first block holds the
    /// durable tail the bytes start with), then flushes. Returns the new tail: the last block's
    /// bytes if it is partly filled.
    fn write_group(&self, first: Position, bytes: &[u8]) -> Result<Vec<u8>> {
        assert!(!bytes.is_empty(), "a group commit of no frames");
        let header = |i: usize, payload: &[u8]| BlockHeader {
            position: first.after(i as u64),
            session: self.session,
            session_start: self.session_start,
            volume: self.geometry.volume,
            payload_bytes: payload.len(),
        };
        let blocks: Vec<Vec<u8>> = bytes
            .chunks(PAYLOAD_BYTES)
            .enumerate()
            .map(|(i, payload)| encode_block(&header(i, payload), payload))
            .collect();
        {
            let _writing = self.io_gate.write();
            // Contiguous pieces: the ring may wrap inside the group.
            let mut i = 0;
            while i < blocks.len() {
                let position = first.after(i as u64);
                let room = (self.geometry.log_blocks - position.0 % self.geometry.log_blocks) as usize;
                let count = room.min(blocks.len() - i);
                self.device.write(self.geometry.lba(position), &blocks[i..i + count].concat())?;
                i += count;
            }
        }
        self.device.flush()?;
        let last = bytes.chunks(PAYLOAD_BYTES).last().expect("a group has bytes");
        Ok(if last.len() < PAYLOAD_BYTES { last.to_vec() } else { Vec::new() })
    }

    /// The end of the last durable batch.
    pub fn durable_lsn(&self) -> Lsn {
        self.committer.lock().durable_lsn
    }

    /// The highest writer epoch accepted: batches of a lower one are fenced.
    pub fn fence(&self) -> WriterEpoch {
        self.committer.lock().fence
    }

    /// Batches ending at or before this LSN were truncated.
    pub fn start_lsn(&self) -> Lsn {
        self.committer.lock().start_lsn
    }

    /// Log blocks held (retained, durable or accepted) and the ring's size: appends are `Full`
    /// when a batch does not fit the difference.
    pub fn usage_blocks(&self) -> (u64, u64) {
        let c = self.committer.lock();
        (c.accepted_end.next_block().0 - c.start.position().0, self.geometry.log_blocks)
    }

    /// Drops the batches ending at or before `lsn` (their records are persisted elsewhere): the
    /// ring reuses their blocks once both superblock copies name the new start. A batch that
    /// ends after `lsn` is kept whole, so its records at or before `lsn` stay readable too.
    /// `lsn` past the durable LSN is `Invalid`.
    pub fn truncate_through(&self, lsn: Lsn) -> Result<()> {
        let mut superblock = self.superblock.lock();
        let (count, next) = {
            let c = self.committer.lock();
            if lsn > c.durable_lsn {
                return Err(Error::invalid(format!(
                    "truncating the redo log through LSN {lsn}, past its durable LSN {}",
                    c.durable_lsn
                )));
            }
            let count = c.entries.partition_point(|e| e.end_lsn <= lsn);
            if count == 0 {
                return Ok(());
            }
            // The new start: the first batch kept, or where the next frame goes. A block at the
            // start holds nothing older than the session that wrote the batch there; with no
            // batch kept, nothing older than this session.
            let (start, start_session) = match c.entries.get(count) {
                Some(kept) => (kept.start, kept.session),
                None => (c.durable_end, self.session),
            };
            let next = Superblock {
                fence: c.durable_fence,
                start,
                start_lsn: c.entries[count - 1].end_lsn,
                start_session,
                ..*superblock
            };
            (count, next)
        };
        *superblock = write_superblock_pair(self.device.as_ref(), &next)?;
        let mut c = self.committer.lock();
        c.entries.drain(..count);
        c.start = next.start;
        c.start_lsn = next.start_lsn;
        Ok(())
    }

    /// Reads the durable batches that end after `lsn`, in order, each with only its records
    /// after `lsn` (the first may hold earlier ones). Batches that become durable while the
    /// reader runs are read too; a batch that claims no LSN (`end_lsn == prev_lsn`, which
    /// carries nothing but its epoch) is not. `Invalid` if records after `lsn` were truncated.
    pub fn read_after(&self, lsn: Lsn) -> Result<BatchReader<'_>> {
        BatchReader::new(self, lsn)
    }
}

/// Writes `superblock` into both copies, one generation each, each flushed before the next:
/// at every moment one copy verifies and the newer holds the update or the one before.
fn write_superblock_pair(device: &dyn BlockDevice, superblock: &Superblock) -> Result<Superblock> {
    let mut next = *superblock;
    for _ in 0..2 {
        next.generation += 1;
        device.write(Superblock::lba(next.generation), &next.encode())?;
        device.flush()?;
    }
    Ok(next)
}
