//! Recovery: which superblock copy, and how far the log goes from the retained start.
//!
//! The scan reads the ring from the superblock's start and classifies every block
//! (docs/format.md, "The redo log", Recovery). Zeros, a verified block of another position or
//! of a session older than the block before it, a block that follows a partly filled block of
//! its own session, and a newer session's block that is not that session's first block all end
//! the log: that is what a crash leaves. A block whose header verifies but whose body does not,
//! a block that is neither zeros nor verified, and a frame that fails its checksum or does not
//! decode inside verified blocks are damage. A single 4 KiB write is atomic, so damage is never
//! a torn write, and ending the log there would silently roll back acknowledged batches:
//! recovery refuses, naming the block and how many blocks of the log follow it. A frame cut
//! short at the end of a session's blocks is the batch a crash interrupted, which was never
//! acknowledged: it is dropped whole.

use std::collections::VecDeque;

use tundra_device::{BLOCK_SIZE, BlockDevice, Lba};
use tundra_store::ids::Lsn;

use super::BatchEntry;
use super::frame::{
    BlockRead, FRAME_HEADER_BYTES, PAYLOAD_BYTES, Position, Session, StreamOffset, Superblock, SuperblockRead, VERSION,
    frame_header, read_block,
};
use crate::{Error, RedoBatch, Result, WriterEpoch, codec};

/// What a read-only look at a log found; nothing is written.
pub(super) struct Inspection {
    pub superblock: Superblock,
    /// The session the next open takes.
    pub next_session: Session,
    /// The retained batches, in order.
    pub entries: VecDeque<BatchEntry>,
    pub durable_lsn: Lsn,
    /// The highest writer epoch of the superblock and of every retained batch.
    pub fence: WriterEpoch,
    /// Where the next session's first block goes: after every block the scan read as the log's.
    pub session_start: Position,
    /// Damage recovered from without loss (a superblock copy), one line each.
    pub notes: Vec<String>,
}

/// Reads a log without changing it: the newest valid superblock, then the log from its start
/// to its end. Damage is a `Corrupted` error naming the block.
pub(super) fn inspect(device: &dyn BlockDevice) -> Result<Inspection> {
    let mut notes = Vec::new();
    let (superblock, copy_lost) = read_superblock(device, &mut notes)?;
    let geometry = superblock.geometry;
    if device.block_count() < geometry.total_blocks() {
        return Err(Error::corrupted(format!(
            "the device has {} blocks but its redo log needs {}",
            device.block_count(),
            geometry.total_blocks()
        )));
    }
    let mut scan = Scan::new(&superblock);
    scan.run(device)?;
    if drop_newest_batch() {
        scan.entries.pop_back();
    }
    // A lost copy may have been one update newer; skipping one more session keeps every session
    // number used by one open only.
    let newest = superblock.session.max(scan.max_session);
    let next_session = Session(newest.0 + if copy_lost { 2 } else { 1 });
    let end = scan.entries.back().map_or(superblock.start, |e| e.start.plus(e.frame_bytes));
    let session_start = end.next_block().max(scan.last_block.map_or(superblock.start.position(), Position::next));
    Ok(Inspection {
        superblock,
        next_session,
        durable_lsn: scan.entries.back().map_or(superblock.start_lsn, |e| e.end_lsn),
        entries: scan.entries,
        fence: scan.fence,
        session_start,
        notes,
    })
}

/// The newest superblock copy that verifies, and whether the other copy is unreadable.
fn read_superblock(device: &dyn BlockDevice, notes: &mut Vec<String>) -> Result<(Superblock, bool)> {
    let mut blocks = vec![0u8; 2 * BLOCK_SIZE];
    device.read(Lba(0), &mut blocks)?;
    let copies = [&blocks[..BLOCK_SIZE], &blocks[BLOCK_SIZE..]];
    let reads = copies.map(Superblock::decode);
    for read in &reads {
        if let SuperblockRead::Version(version) = read {
            return Err(Error::invalid(format!(
                "a redo log of format version {version}; this build reads version {VERSION}"
            )));
        }
    }
    let valid: Vec<Superblock> =
        reads.iter().filter_map(|r| if let SuperblockRead::Valid(s) = r { Some(*s) } else { None }).collect();
    let Some(newest) = valid.iter().max_by_key(|s| s.generation).copied() else {
        return Err(Error::invalid(
            "no valid redo log superblock at LBA 0 or 1: the device holds no redo log, or both copies are damaged",
        ));
    };
    if valid.len() == 2 {
        return Ok((newest, false));
    }
    for (i, copy) in copies.iter().enumerate() {
        if matches!(reads[i], SuperblockRead::Invalid) && copy.iter().any(|&b| b != 0) {
            notes.push(format!(
                "the redo log superblock copy at LBA {i} is damaged; recovered from the copy at LBA {} (generation {})",
                1 - i,
                newest.generation
            ));
        }
    }
    Ok((newest, true))
}

/// The state of a scan of the log.
struct Scan {
    superblock: Superblock,
    entries: VecDeque<BatchEntry>,
    fence: WriterEpoch,
    /// The epoch of the newest batch read: epochs never decrease along the log. The superblock's
    /// fence may be above the first retained batches' (it is written at a truncation, from
    /// every durable batch then).
    newest_epoch: WriterEpoch,
    max_session: Session,
    last_block: Option<Position>,
    /// The session of the last block read as the log's, its first block, and whether it was full.
    previous: Option<(Session, Position, bool)>,
    /// Stream bytes of the current session not yet framed, and the offset of the first.
    pending: Vec<u8>,
    pending_start: StreamOffset,
}

/// Where a scan stopped reading blocks, other than at the end of the window.
enum Stop {
    /// The log ends before this block.
    End,
    /// This block is damaged.
    Damage(String),
}

impl Scan {
    fn new(superblock: &Superblock) -> Scan {
        Scan {
            superblock: *superblock,
            entries: VecDeque::new(),
            fence: superblock.fence,
            newest_epoch: WriterEpoch::default(),
            max_session: superblock.session,
            last_block: None,
            previous: None,
            pending: Vec::new(),
            pending_start: superblock.start,
        }
    }

    /// Reads the window of one lap from the start, to the end of the log or to damage.
    fn run(&mut self, device: &dyn BlockDevice) -> Result<()> {
        let geometry = self.superblock.geometry;
        let first = self.superblock.start.position();
        let window_end = first.after(geometry.log_blocks);
        let mut block = vec![0u8; BLOCK_SIZE];
        let mut position = first;
        while position < window_end {
            device.read(geometry.lba(position), &mut block)?;
            let what = match self.take_block(&block, position) {
                Ok(()) => {
                    position = position.next();
                    continue;
                }
                Err(Stop::End) => return Ok(()),
                Err(Stop::Damage(what)) => what,
            };
            if damage_ends_log() {
                return Ok(());
            }
            let min_session = self.previous.map_or(self.superblock.start_session, |p| p.0);
            let later = look_ahead(device, &self.superblock, position.next(), window_end, min_session)?;
            return Err(Error::corrupted(describe_damage(position, geometry.lba(position), &what, later)));
        }
        Ok(())
    }

    /// Takes the block at `position` into the log, or says why the log stops there.
    fn take_block(&mut self, block: &[u8], position: Position) -> std::result::Result<(), Stop> {
        let min_session = self.previous.map_or(self.superblock.start_session, |p| p.0);
        let (header, payload) = match read_block(block) {
            BlockRead::Zeros => return Err(Stop::End),
            BlockRead::Damaged => {
                return Err(Stop::Damage("it is neither zeros nor a block whose header verifies".into()));
            }
            BlockRead::Verified { header, .. } if header.position != position || header.session < min_session => {
                return Err(Stop::End);
            }
            BlockRead::Verified { body_ok: false, .. } => {
                return Err(Stop::Damage("its header verifies but its body fails its checksum".into()));
            }
            BlockRead::Verified { header, payload, body_ok: true } => (header, payload),
        };
        let volume = self.superblock.geometry.volume;
        if header.volume != volume {
            return Err(Stop::Damage(format!(
                "it is a block of volume {}'s redo log, not volume {}'s",
                header.volume.0, volume.0
            )));
        }
        match self.previous {
            None => {
                let skip = self.superblock.start.in_block();
                if payload.len() < skip {
                    return Err(Stop::Damage(format!(
                        "it holds {} bytes but the log's retained start lies at byte {skip} of it",
                        payload.len()
                    )));
                }
                self.pending.extend_from_slice(&payload[skip..]);
            }
            Some((session, session_start, full)) if session == header.session => {
                // Within a session every block is filled before the next is written, so a
                // block after a partly filled one is from a group whose flush never returned.
                if !full {
                    return Err(Stop::End);
                }
                if header.session_start != session_start {
                    return Err(Stop::Damage(format!(
                        "it names position {} as its session's first block where the block before it names {session_start}",
                        header.session_start
                    )));
                }
                self.pending.extend_from_slice(payload);
            }
            Some(_) => {
                // A newer session starts at its first block; a later block of its first group
                // whose first block did not land is beyond the end.
                if header.session_start != position {
                    return Err(Stop::End);
                }
                // Bytes left of the older session are the frame a crash cut short.
                self.pending.clear();
                self.pending.extend_from_slice(payload);
                self.pending_start = position.start();
            }
        }
        self.take_frames(header.session).map_err(Stop::Damage)?;
        self.previous = Some((header.session, header.session_start, payload.len() == PAYLOAD_BYTES));
        self.max_session = self.max_session.max(header.session);
        self.last_block = Some(position);
        Ok(())
    }

    /// Takes every whole frame out of the pending bytes; `session` wrote them.
    fn take_frames(&mut self, session: Session) -> std::result::Result<(), String> {
        let capacity = self.superblock.geometry.capacity_bytes();
        let mut at = 0;
        while self.pending.len() - at >= FRAME_HEADER_BYTES {
            let start = self.pending_start.plus(at as u64);
            let (len, crc) = frame_header(&self.pending[at..]);
            if (len + FRAME_HEADER_BYTES) as u64 > capacity {
                return Err(format!(
                    "the frame at stream byte {} claims {len} bytes, more than the ring holds",
                    start.0
                ));
            }
            let Some(bytes) = self.pending.get(at + FRAME_HEADER_BYTES..at + FRAME_HEADER_BYTES + len) else {
                break;
            };
            if crc32c::crc32c(bytes) != crc {
                return Err(format!("the frame at stream byte {} fails its checksum", start.0));
            }
            let batch = codec::decode_batch(bytes, self.superblock.geometry.page_size)
                .map_err(|e| format!("the batch framed at stream byte {} does not decode: {}", start.0, e.message()))?;
            self.take_batch(&batch, start)?;
            let frame_bytes = (FRAME_HEADER_BYTES + len) as u64;
            self.entries.push_back(BatchEntry { start, frame_bytes, end_lsn: batch.end_lsn, session });
            at += FRAME_HEADER_BYTES + len;
        }
        self.pending.drain(..at);
        self.pending_start = self.pending_start.plus(at as u64);
        Ok(())
    }

    /// Checks a batch read back against the ones before it, as its append did.
    fn take_batch(&mut self, batch: &RedoBatch, start: StreamOffset) -> std::result::Result<(), String> {
        let expected = self.entries.back().map_or(self.superblock.start_lsn, |e| e.end_lsn);
        let volume = self.superblock.geometry.volume;
        let problem = if batch.volume != volume {
            format!("it is a batch of volume {}, not {}", batch.volume.0, volume.0)
        } else if batch.prev_lsn != expected {
            format!("its prev_lsn {} is not the end of the batch before it, {expected}", batch.prev_lsn)
        } else if batch.epoch < self.newest_epoch {
            format!("its writer epoch {} is below epoch {} of a batch before it", batch.epoch.0, self.newest_epoch.0)
        } else {
            self.newest_epoch = batch.epoch;
            self.fence = self.fence.max(batch.epoch);
            return Ok(());
        };
        Err(format!("the batch framed at stream byte {} contradicts the log: {problem}", start.0))
    }
}

/// Counts the blocks in `from..to` that are blocks of this log (their expected position, a
/// session no older than `min_session`), verified or not in their body.
fn look_ahead(
    device: &dyn BlockDevice,
    superblock: &Superblock,
    from: Position,
    to: Position,
    min_session: Session,
) -> Result<u64> {
    let mut count = 0;
    let mut block = vec![0u8; BLOCK_SIZE];
    let mut position = from;
    while position < to {
        device.read(superblock.geometry.lba(position), &mut block)?;
        if let BlockRead::Verified { header, .. } = read_block(&block)
            && header.position == position
            && header.session >= min_session
        {
            count += 1;
        }
        position = position.next();
    }
    Ok(count)
}

fn describe_damage(position: Position, lba: Lba, what: &str, later_blocks: u64) -> String {
    let found = if later_blocks > 0 {
        format!(
            "the redo log block at position {position} ({lba}) is damaged ({what}) and {later_blocks} later block(s) \
             of the log follow it: the batches from position {position} on would be lost"
        )
    } else {
        format!(
            "the redo log block at position {position} ({lba}) is damaged ({what}); no later block of the log \
             follows it, so whether it held acknowledged batches cannot be known"
        )
    };
    format!("{found}. Recovery stops rather than silently roll back acknowledged redo")
}

#[cfg(test)]
thread_local! {
    /// The bug the corruption tests guard against, for showing that they catch it.
    static DAMAGE_ENDS_LOG: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// A rollback bug for the crash tests to catch: recovery loses the newest batch it found.
    static DROP_NEWEST_BATCH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Test-only: makes recovery on this thread take damage for the end of the log.
#[cfg(test)]
pub(super) fn set_damage_ends_log(on: bool) {
    DAMAGE_ENDS_LOG.with(|flag| flag.set(on));
}

/// Test-only: makes recovery on this thread drop the newest batch it found, the loss of an
/// acknowledged batch that the crash oracle must notice.
#[cfg(test)]
pub(super) fn set_drop_newest_batch(on: bool) {
    DROP_NEWEST_BATCH.with(|flag| flag.set(on));
}

fn damage_ends_log() -> bool {
    #[cfg(test)]
    return DAMAGE_ENDS_LOG.with(|flag| flag.get());
    #[cfg(not(test))]
    false
}

fn drop_newest_batch() -> bool {
    #[cfg(test)]
    return DROP_NEWEST_BATCH.with(|flag| flag.get());
    #[cfg(not(test))]
    false
}
