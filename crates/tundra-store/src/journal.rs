//! The journal (seed 000 §3.2.1): a write-ahead log of index changes on the fast device, with
//! group commit, and checkpoints of the whole index that bound recovery.
//!
//! The fast device holds two superblock slots, two checkpoint slots and a ring of log blocks
//! (framing in [`frame`], docs/format.md "The store's journal"). Every log block carries its position in
//! the log, the epoch it was written in, a checksum of its header and one of its body; replay
//! ([`recovery`]) reads from the checkpoint's position while each block is the next position, of
//! an epoch no older than the one before it, and verifies. Each recovery starts a new epoch, so a
//! block left from before a crash beyond the recovered end can never be read as part of the log
//! once newer blocks are written in front of it. A block that fails its checksum is damage, not
//! the end of the log: recovery refuses rather than roll back acknowledged writes.
//!
//! The previous checkpoint is kept until the next one is durable, and the log ring never reuses
//! a block either checkpoint still needs, so a damaged newest checkpoint is recovered from the
//! one before it.
//!
//! The allocator's state is not journalled: it is a function of the index (the blocks in use are
//! exactly the runs of the mapped pages), rebuilt at recovery. So the two can never disagree.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use tundra_device::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Lba};

mod frame;
mod ids;
mod record;
mod recovery;
#[cfg(test)]
mod tests;

pub use frame::JournalGeometry;
use frame::{CheckpointHeader, LOG_PAYLOAD_BYTES, Superblock, encode_log_block};
pub use ids::LogPosition;
use ids::{CheckpointSlot, Epoch, Generation};
pub(crate) use record::{Cursor, decode_volume, encode_volume, encoding_bits, encoding_from_bits};
pub use record::{MAX_CHUNK_MARK_BYTES, MAX_RECORD_BYTES, PAGE_DATA_MAX_BYTES, PAGE_RECORD_BYTES, Record};
#[cfg(test)]
pub(crate) use recovery::set_damage_ends_log;
#[cfg(test)]
pub(crate) use recovery::set_drop_newest_record;
pub use recovery::{Inspection, JournalPlace, LogDamage, inspect};

use crate::{Error, Result};

/// How many bytes of deferred records may wait before one of them commits them all.
pub const DEFERRED_LIMIT: usize = 64 * 1024;

/// Commits carry their page images in the log until 1/`CARRY_SHARE` of the ring has been
/// written since the newest checkpoint ([`Journal::has_room_for_data`]).
const CARRY_SHARE: u64 = 3;

/// The journal asks for a checkpoint once 1/`CHECKPOINT_SHARE` of the ring has been written since
/// the newest one ([`Journal::wants_checkpoint`]): sooner than commits stop carrying their images,
/// so that a checkpointer that looks now and then takes it while they still do.
const CHECKPOINT_SHARE: u64 = 4;

struct Committer {
    /// Encoded records waiting for the next group commit, with the batch they belong to.
    pending: Vec<u8>,
    pending_batch: u64,
    /// Whether a pending record points at blocks written straight to the data device, so that
    /// the group must flush the barrier device first. Records that carry their pages' images
    /// ([`Journal::commit_with_data`]) do not.
    pending_needs_barrier: bool,
    /// Every batch up to this one is durable.
    durable_batch: u64,
    /// The batch of the newest deferred records ([`Journal::commit_deferred`]): [`Journal::sync`]
    /// waits for it.
    deferred_batch: u64,
    committing: bool,
    /// The position of the block the next commit writes first: the last, partly filled block,
    /// whose records are in `tail`, or a fresh one when `tail` is empty.
    next_position: LogPosition,
    tail: Vec<u8>,
    epoch: Epoch,
    /// The newest checkpoint's position, and the oldest position either checkpoint still needs:
    /// the ring never reuses a block from there on.
    checkpoint_position: LogPosition,
    retain_from: LogPosition,
    failed: Option<String>,
}

impl Committer {
    /// The position after the log's last written block (the partly filled one included).
    fn end(&self) -> LogPosition {
        self.next_position.after(u64::from(!self.tail.is_empty()))
    }
}

/// The superblock's view of the checkpoints: its generation, the newest checkpoint's slot and
/// each slot's log position.
#[derive(Clone, Copy)]
struct Checkpoints {
    generation: Generation,
    current: CheckpointSlot,
    positions: [LogPosition; 2],
}

/// What a journal has done since it opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Group commits written (each one log write and one flush of the log).
    pub group_commits: u64,
    /// Of those, the ones that flushed the data device first: a record of the group pointed at
    /// blocks written straight there. The others carried their images in the log.
    pub data_flushes: u64,
    /// Page images commits carried in the log ([`Record::PageData`] pieces' pages).
    pub carried_images: u64,
    pub checkpoints: u64,
}

/// The journal on a fast device.
pub struct Journal {
    device: Arc<dyn BlockDevice>,
    geometry: JournalGeometry,
    committer: Mutex<Committer>,
    committed: Condvar,
    checkpoints: Mutex<Checkpoints>,
    /// A device flushed before every group of records is written: the data device, whose blocks
    /// the records point at. One flush then covers every writer of the group.
    barrier: Option<Arc<dyn BlockDevice>>,
    stats: Mutex<JournalStats>,
}

/// What recovery found: the checkpoint's records, then the log's, in order.
pub struct Replay {
    pub checkpoint: Vec<Record>,
    pub log: Vec<Record>,
    /// Damage recovered from without loss (a superblock copy, the newest checkpoint), and the
    /// truncation a repair made, one line each, for the open's progress output.
    pub notes: Vec<String>,
    /// The damage a repair truncated the log at: what was dropped.
    pub lost: Option<LogDamage>,
}

impl Journal {
    /// Lays an empty journal on `device` with a log of `log_blocks` and checkpoint slots of
    /// `checkpoint_blocks`. The whole journal is trimmed first: a trimmed block reads as zeros
    /// (the `BlockDevice::trim` contract; the file device punches a hole or writes zeros), which
    /// recovery reads as a log block never written.
    pub fn format(device: &dyn BlockDevice, geometry: JournalGeometry) -> Result<()> {
        if device.block_count() < geometry.total_blocks() || geometry.log_blocks < 2 || geometry.checkpoint_blocks < 1 {
            return Err(Error::invalid(format!(
                "the fast device has {} blocks; the journal needs {} with at least 2 log blocks",
                device.block_count(),
                geometry.total_blocks()
            )));
        }
        device.trim(Lba(0), geometry.total_blocks())?;
        // Both slots hold the empty checkpoint, so either can be fallen back to.
        for slot in CheckpointSlot::BOTH {
            device.write(geometry.checkpoint_lba(slot), &encode_checkpoint(&[], LogPosition::default(), 0)?)?;
        }
        device.flush()?;
        let superblock = Superblock {
            geometry,
            generation: Generation::FIRST,
            epoch: Epoch::FIRST,
            current: CheckpointSlot::BOTH[0],
            positions: [LogPosition::default(); 2],
        };
        device.write(Lba(superblock.generation.copy()), &superblock.encode())?;
        device.flush()?;
        Ok(())
    }

    /// Opens the journal, returning it with everything to replay. A new epoch starts. Damage in
    /// the log is a `Corrupted` error naming the block.
    pub fn open(device: Arc<dyn BlockDevice>) -> Result<(Journal, Replay)> {
        Journal::open_with(device, &JournalPlace::default(), false)
    }

    /// [`Journal::open`] with the place to name in messages; with `accept_loss`, damage in the
    /// log truncates it there instead (the log's blocks from the damage on are trimmed) and the
    /// replay says what was dropped.
    pub fn open_with(
        device: Arc<dyn BlockDevice>,
        place: &JournalPlace,
        accept_loss: bool,
    ) -> Result<(Journal, Replay)> {
        let found = inspect(device.as_ref(), place)?;
        let geometry = found.superblock.geometry;
        let mut notes = found.notes;
        if let Some(damage) = &found.damage {
            if !accept_loss {
                return Err(Error::corrupted(damage.describe(place)));
            }
            // Up to one lap past the older checkpoint's position, not the recovered one's: the
            // blocks that checkpoint's replay needs stay (later positions would reuse them).
            let keep_from = found.superblock.positions[0].min(found.superblock.positions[1]);
            recovery::truncate(device.as_ref(), geometry, damage.position, keep_from.after(geometry.log_blocks))?;
            notes.push(format!("{}: truncated the log, dropping {}", place.name, damage.dropped()));
        }
        let mut checkpoints = Checkpoints {
            generation: found.superblock.generation,
            current: found.slot,
            positions: found.superblock.positions,
        };
        let journal = Journal {
            device,
            geometry,
            committer: Mutex::new(Committer {
                pending: Vec::new(),
                pending_batch: 1,
                pending_needs_barrier: false,
                durable_batch: 0,
                deferred_batch: 0,
                committing: false,
                next_position: found.end,
                tail: Vec::new(),
                epoch: found.next_epoch,
                checkpoint_position: found.start,
                retain_from: checkpoints.positions[0].min(checkpoints.positions[1]),
                failed: None,
            }),
            committed: Condvar::new(),
            checkpoints: Mutex::new(checkpoints),
            barrier: None,
            stats: Mutex::new(JournalStats::default()),
        };
        // The new epoch must be durable before any block of it is written.
        journal.write_superblock(&mut checkpoints, found.next_epoch)?;
        *journal.checkpoints.lock() = checkpoints;
        let mut log = found.log;
        if let Some(dropped) = drop_torn_unit(&mut log) {
            notes.push(format!("{}: dropped a unit of {dropped} records the log ends inside of", place.name));
        }
        let replay = Replay { checkpoint: found.checkpoint, log, notes, lost: found.damage };
        Ok((journal, replay))
    }

    /// Flushes `device` before writing each group of records, so that callers may write their
    /// data blocks without flushing them: the group's one flush makes all of them durable before
    /// any record that points at them.
    pub fn set_barrier(&mut self, device: Arc<dyn BlockDevice>) {
        self.barrier = Some(device);
    }

    /// Makes `records` durable, together with whatever other threads commit at the same time
    /// (group commit: one device write and one flush for the whole group).
    pub fn commit(&self, records: &[Record]) -> Result<()> {
        self.commit_from(records, false, true)
    }

    /// [`Journal::commit`] of records that carry the images of the pages they install
    /// ([`Record::PageData`] before each [`Record::PageSet`]): they do not need the data device
    /// flushed before them, so a group of only such records pays one flush, the log's. Replay
    /// writes the images again (the data device may lose them in a crash), and a checkpoint
    /// flushes the data device before it stops the log from being replayed.
    pub fn commit_with_data(&self, records: &[Record]) -> Result<()> {
        let images = records.iter().filter(|r| matches!(r, Record::PageData { offset: 0, .. })).count();
        self.commit_from(records, false, false)?;
        self.stats.lock().carried_images += images as u64;
        Ok(())
    }

    /// What the journal has done since it opened.
    pub fn stats(&self) -> JournalStats {
        *self.stats.lock()
    }

    /// Whether the log has room for `bytes` more of page images in the commits before the next
    /// checkpoint: at most a third of the ring written since the newest checkpoint, with them
    /// ([`CARRY_SHARE`]; [`Journal::wants_checkpoint`] asks for the next one at a quarter).
    /// Images take many log blocks; past this, commits flush the data device instead, so that
    /// images alone never take the ring further than checkpoints keep up with.
    pub fn has_room_for_data(&self, bytes: usize) -> bool {
        let c = self.committer.lock();
        let since_newest = c.end().blocks_since(c.checkpoint_position);
        let queued = (c.pending.len() + bytes).div_ceil(frame::LOG_PAYLOAD_BYTES) as u64 + 1;
        (since_newest + queued) * CARRY_SHARE <= self.geometry.log_blocks
    }

    /// [`Journal::commit`] of records that must start a fresh log block: a [`Record::Unit`]'s.
    /// The group's first block otherwise rewrites the partly filled block of the previous
    /// commit, and a crash that keeps that block's old version but lets a later block of the
    /// group land would replay the unit's later records without its marker. A fresh block's old
    /// content is of another position or zeros, so a torn unit is always cut at its end.
    pub fn commit_unit(&self, records: &[Record]) -> Result<()> {
        self.commit_from(records, true, true)
    }

    fn commit_from(&self, records: &[Record], fresh: bool, needs_barrier: bool) -> Result<()> {
        let mut c = self.committer.lock();
        if let Some(reason) = &c.failed {
            return Err(Error::closed(format!("the journal stopped after an error ({reason})")));
        }
        // No records is nothing to make durable, and a group of none would have no last block
        // to hold the tail: every group commit below carries at least one record.
        if records.is_empty() {
            return Ok(());
        }
        if fresh {
            // Alone at the front of the next group: nothing in flight or queued before it.
            // Queued records (deferred ones wait for a commit to carry them) are committed first.
            loop {
                if let Some(reason) = &c.failed {
                    return Err(Error::closed(format!("the journal stopped after an error ({reason})")));
                }
                if c.committing {
                    self.committed.wait(&mut c);
                } else if !c.pending.is_empty() {
                    let queued = c.pending_batch;
                    self.wait_durable(c, queued)?;
                    c = self.committer.lock();
                } else {
                    break;
                }
            }
            if !c.tail.is_empty() {
                c.tail.clear();
                c.next_position = c.next_position.next();
            }
        }
        for record in records {
            record.encode(&mut c.pending);
        }
        c.pending_needs_barrier |= needs_barrier;
        let my_batch = c.pending_batch;
        self.wait_durable(c, my_batch)
    }

    /// Queues `records` for the next group commit without waiting for it: they go to the log,
    /// in order with every other record, with whatever commit comes next, or at the latest
    /// with [`Journal::sync`]. For records a crash may lose because they can be made again: a
    /// replica's applies, which its Raft log holds and replays past the chunk's durable mark
    /// (seed 000 §3.2.1: the replicated log is the write-ahead log). More than
    /// [`DEFERRED_LIMIT`] bytes waiting are committed at once.
    pub fn commit_deferred(&self, records: &[Record]) -> Result<()> {
        let mut c = self.committer.lock();
        if let Some(reason) = &c.failed {
            return Err(Error::closed(format!("the journal stopped after an error ({reason})")));
        }
        if records.is_empty() {
            return Ok(());
        }
        for record in records {
            record.encode(&mut c.pending);
        }
        c.pending_needs_barrier = true;
        c.deferred_batch = c.pending_batch;
        if c.pending.len() > DEFERRED_LIMIT {
            let my_batch = c.pending_batch;
            return self.wait_durable(c, my_batch);
        }
        Ok(())
    }

    /// Makes every deferred record durable (a no-op when none waits).
    pub fn sync(&self) -> Result<()> {
        let c = self.committer.lock();
        let my_batch = c.deferred_batch;
        self.wait_durable(c, my_batch)
    }

    /// Whether deferred records wait for a commit.
    pub fn has_deferred(&self) -> bool {
        let c = self.committer.lock();
        c.deferred_batch > c.durable_batch
    }

    /// Waits until batch `my_batch` is durable, committing the pending records itself when no
    /// other thread is.
    fn wait_durable<'a>(&'a self, mut c: parking_lot::MutexGuard<'a, Committer>, my_batch: u64) -> Result<()> {
        loop {
            if c.durable_batch >= my_batch {
                return Ok(());
            }
            if let Some(reason) = &c.failed {
                return Err(Error::closed(format!("the journal stopped after an error ({reason})")));
            }
            if !c.committing {
                c.committing = true;
                // A group that does not fit in the partly filled block with its records starts
                // a fresh block. A torn write of several blocks may keep the rewritten block's
                // previous version (valid, at its position) while a later block lands, and
                // replay would then take the group's later records without its earlier ones; a
                // fresh block's old content is zeros or of another position, so a torn group
                // always loses a suffix (a command's mark comes last, and is replayed again).
                if !c.tail.is_empty() && c.tail.len() + c.pending.len() > LOG_PAYLOAD_BYTES && !share_tail_always() {
                    c.tail.clear();
                    c.next_position = c.next_position.next();
                }
                let mut batch = c.tail.clone();
                batch.append(&mut c.pending);
                let barrier = std::mem::take(&mut c.pending_needs_barrier);
                let batch_id = c.pending_batch;
                c.pending_batch += 1;
                let (position, epoch, retain_from) = (c.next_position, c.epoch, c.retain_from);
                drop(c);
                let written = self.write_batch(&batch, position, epoch, retain_from, barrier);
                c = self.committer.lock();
                c.committing = false;
                match written {
                    Ok((next, tail)) => {
                        c.next_position = next;
                        c.tail = tail;
                        c.durable_batch = batch_id;
                    }
                    Err(error) => {
                        c.failed = Some(error.to_string());
                    }
                }
                self.committed.notify_all();
                continue;
            }
            self.committed.wait(&mut c);
        }
    }

    /// Writes a group of encoded records as log blocks from `position`, and flushes; first
    /// flushes the barrier device when `barrier` (a record of the group points at blocks
    /// written straight to it). The first
    /// block rewrites the previous commit's partly filled block, whose records `records` starts
    /// with (a single block write is atomic, so they are never lost). Returns the position of
    /// the new last block if it has room left, with its records, or of the next block. Refuses
    /// to reuse a block from `retain_from` on: the older checkpoint's replay needs it.
    fn write_batch(
        &self,
        records: &[u8],
        position: LogPosition,
        epoch: Epoch,
        retain_from: LogPosition,
        barrier: bool,
    ) -> Result<(LogPosition, Vec<u8>)> {
        assert!(!records.is_empty(), "a group commit of no records");
        if let Some(device) = self.barrier.as_ref().filter(|_| barrier) {
            device.flush()?;
            self.stats.lock().data_flushes += 1;
        }
        let mut blocks: Vec<Vec<u8>> = Vec::new();
        let mut at = 0;
        let mut last_start = 0;
        while at < records.len() {
            last_start = at;
            let mut end = at;
            while end < records.len() {
                let (_, len) = Record::decode(&records[end..]).expect("records we encoded decode");
                if end + len - at > LOG_PAYLOAD_BYTES {
                    break;
                }
                end += len;
            }
            blocks.push(encode_log_block(position.after(blocks.len() as u64), epoch, &records[at..end]));
            at = end;
        }
        let last = position.after(blocks.len() as u64 - 1);
        let last_used = records.len() - last_start;
        let (tail_position, tail) = if last_used + MAX_RECORD_BYTES <= LOG_PAYLOAD_BYTES {
            (last, records[last_start..].to_vec())
        } else {
            (last.next(), Vec::new())
        };
        if last.next().blocks_since(retain_from) > self.geometry.log_blocks {
            return Err(Error::invalid("the journal is full: checkpoints must be taken before more commits"));
        }
        // Write contiguous pieces: the ring may wrap inside the group.
        let mut i = 0;
        while i < blocks.len() {
            let first = position.after(i as u64);
            let room = (self.geometry.log_blocks - first.ring_block(self.geometry.log_blocks)) as usize;
            let n = room.min(blocks.len() - i);
            self.device.write(self.geometry.log_lba(first), &blocks[i..i + n].concat())?;
            i += n;
        }
        self.device.flush()?;
        self.stats.lock().group_commits += 1;
        Ok((tail_position, tail))
    }

    /// Log blocks the ring holds for recovery (from the older checkpoint's position), and the
    /// ring's size. A commit that would need more than the ring fails: the journal is full.
    pub fn usage_blocks(&self) -> (u64, u64) {
        let c = self.committer.lock();
        (c.end().blocks_since(c.retain_from), self.geometry.log_blocks)
    }

    /// Whether a checkpoint is due: a quarter of the ring written since the newest checkpoint,
    /// or two thirds held since the older one. Checkpoints then come about every quarter of the
    /// ring, so the blocks both checkpoints need stay within about half of it.
    ///
    /// A quarter, not the third where [`Journal::has_room_for_data`] stops commits from
    /// carrying their images: the background thread that takes checkpoints asks every 50 ms,
    /// and between the two thresholds commits keep their one flush while it catches up. With
    /// both at a third, commits that could no longer carry their images (and write a fraction
    /// of a block each) took hundreds of commits to reach the checkpoint's threshold, each
    /// paying a second flush (42% of a mount's 8 KiB commits, bench/results/
    /// 2026-11-30-checkpoint-early/).
    pub fn wants_checkpoint(&self) -> bool {
        let c = self.committer.lock();
        let end = c.end();
        let since_newest = end.blocks_since(c.checkpoint_position);
        let held = end.blocks_since(c.retain_from);
        let ring = self.geometry.log_blocks;
        let share = if checkpoint_at_a_third() { CARRY_SHARE } else { CHECKPOINT_SHARE };
        since_newest > 0 && (since_newest * share >= ring || held * 3 >= ring * 2)
    }

    /// Writes `records` (the whole index, as of log position `position`) as the new checkpoint
    /// into the slot of the older one, then names it in the superblock. The checkpoint it
    /// replaces stays, as the fallback, and the log is kept from its position on. The caller
    /// guarantees that every record committed before `position` is reflected in `records`.
    pub fn checkpoint(&self, records: &[Record], position: LogPosition) -> Result<()> {
        let mut checkpoints = self.checkpoints.lock();
        let slot = checkpoints.current.other();
        let image = encode_checkpoint(records, position, self.geometry.checkpoint_blocks)?;
        self.device.write(self.geometry.checkpoint_lba(slot), &image)?;
        self.device.flush()?;
        let epoch = self.committer.lock().epoch;
        let mut next = *checkpoints;
        let previous = next.positions[next.current.index()];
        next.current = slot;
        next.positions[slot.index()] = position;
        self.write_superblock(&mut next, epoch)?;
        *checkpoints = next;
        let mut c = self.committer.lock();
        c.checkpoint_position = position;
        c.retain_from = previous.min(position);
        self.stats.lock().checkpoints += 1;
        Ok(())
    }

    /// The log position the next commit will write at: a checkpoint taken now reflects every
    /// record before it.
    /// The caller must hold off commits while it takes a checkpoint at this position.
    pub fn position(&self) -> LogPosition {
        let mut c = self.committer.lock();
        assert!(!c.committing && c.pending.is_empty(), "a checkpoint position taken while commits are in flight");
        // The checkpoint will reflect the records of the partly filled block too, so later
        // commits start a fresh block at the checkpoint's position.
        if !c.tail.is_empty() {
            c.tail.clear();
            c.next_position = c.next_position.next();
        }
        c.next_position
    }

    /// Writes and flushes the next superblock (generation one higher, in the other copy) with
    /// `checkpoints` and `epoch`, and advances `checkpoints` to that generation.
    fn write_superblock(&self, checkpoints: &mut Checkpoints, epoch: Epoch) -> Result<()> {
        let generation = checkpoints.generation.next();
        let superblock = Superblock {
            geometry: self.geometry,
            generation,
            epoch,
            current: checkpoints.current,
            positions: checkpoints.positions,
        };
        self.device.write(Lba(generation.copy()), &superblock.encode())?;
        self.device.flush()?;
        checkpoints.generation = generation;
        Ok(())
    }
}

/// A checkpoint image: a header block (magic, version, position, record bytes and count, crc of
/// the records) then the records, padded to whole blocks.
fn encode_checkpoint(records: &[Record], position: LogPosition, slot_blocks: u64) -> Result<Vec<u8>> {
    let mut body = Vec::with_capacity(records.len() * MAX_RECORD_BYTES);
    for record in records {
        record.encode(&mut body);
    }
    let header = CheckpointHeader {
        position,
        record_bytes: body.len() as u64,
        record_count: records.len() as u64,
        crc: crc32c::crc32c(&body),
    };
    let mut image = header.encode();
    image.extend_from_slice(&body);
    image.resize(image.len().div_ceil(BLOCK_SIZE) * BLOCK_SIZE, 0);
    if slot_blocks > 0 && image.len() as u64 > slot_blocks * BLOCK_SIZE_BYTES {
        return Err(Error::invalid(format!(
            "the index needs a {}-block checkpoint but the slot has {slot_blocks} blocks",
            image.len() / BLOCK_SIZE
        )));
    }
    Ok(image)
}

/// Drops the records of a [`Record::Unit`] the log ends inside of, with its marker, and says
/// how many records followed the marker. Such a unit is always at the end: the records of one
/// commit are contiguous, a torn group ends the log, and every open takes a checkpoint past it
/// before the next commit. The markers of whole units are dropped too (they change nothing).
fn drop_torn_unit(log: &mut Vec<Record>) -> Option<usize> {
    let mut kept = Vec::with_capacity(log.len());
    let mut torn = None;
    let records = std::mem::take(log);
    let mut left = records.len();
    for record in records {
        left -= 1;
        match record {
            Record::Unit { records: n } if n as usize > left => {
                torn = Some(left);
                break;
            }
            Record::Unit { .. } => {}
            other => kept.push(other),
        }
    }
    *log = kept;
    torn
}

#[cfg(test)]
thread_local! {
    /// The bug the torn-group test must catch: every group rewrites the partly filled block.
    static SHARE_TAIL_ALWAYS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Test only: makes this thread's groups share the partly filled block whatever their size.
#[cfg(test)]
pub(crate) fn set_share_tail_always(on: bool) {
    SHARE_TAIL_ALWAYS.with(|flag| flag.set(on));
}

fn share_tail_always() -> bool {
    #[cfg(test)]
    return SHARE_TAIL_ALWAYS.with(|flag| flag.get());
    #[cfg(not(test))]
    false
}

fn decode_all(mut bytes: &[u8]) -> Result<Vec<Record>> {
    let mut records = Vec::new();
    while !bytes.is_empty() {
        let (record, len) = Record::decode(bytes)?;
        records.push(record);
        bytes = &bytes[len..];
    }
    Ok(records)
}

/// The twin of the early checkpoint (tests only): the journal asks for its checkpoint at the
/// third of the ring where commits stop carrying their images, as it once did, and the test of
/// carried commits under a lagging checkpointer must fail.
fn checkpoint_at_a_third() -> bool {
    #[cfg(test)]
    return CHECKPOINT_AT_A_THIRD.with(|flag| flag.get());
    #[cfg(not(test))]
    false
}

#[cfg(test)]
thread_local! {
    static CHECKPOINT_AT_A_THIRD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Test only: makes this thread's journals ask for checkpoints at a third of the ring (the twin
/// above).
#[cfg(test)]
pub(crate) fn set_checkpoint_at_a_third(on: bool) {
    CHECKPOINT_AT_A_THIRD.with(|flag| flag.set(on));
}
