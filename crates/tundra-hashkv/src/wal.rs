//! The write-ahead log (seed 001 §3.3.3: "after recording the PUT requests in the WAL, client
//! threads submit PUT requests to a queue"): a ring of blocks on the drive, written with group
//! commit, replayed at open from the superblock's checkpoint.
//!
//! A PUT is acknowledged once its record is durable here; the sections apply it to its table
//! block later. Concurrent writers share one drive write and one flush: the first waiting writer
//! becomes the leader, takes every record queued so far, writes them, flushes, hands them to
//! their sections and wakes the others. Records never span blocks; the last, partly filled block
//! is rewritten by the next group (a block write is atomic, so it holds its old records or all
//! of them).
//!
//! Block (little-endian): magic `HKWL`, CRC32C of bytes 8..32 (`u32`), log block number `u64`,
//! session epoch `u64`, record bytes `u16`, record count `u16`, CRC32C of the record bytes
//! `u32`, then the records: kind `u8` (1 put, 2 delete), key length `u8`, value length `u16`,
//! key, value. The log ends at the first block that is zeros or holds another log block number
//! or epoch (a slot not yet reached in this lap, or left by a crashed session); a block whose
//! checksums fail is damage and stops the open, never an end.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::drive::Drive;
use parking_lot::{Condvar, Mutex};
use tundra_device::{BLOCK_SIZE, BlockDevice, Lba};

use crate::layout::{Key, Layout};
use crate::{Error, ErrorKind, MAX_KEY_BYTES, MAX_VALUE_BYTES, Result};

const MAGIC: [u8; 4] = *b"HKWL";
const HEADER_BYTES: usize = 32;
const RECORD_HEADER_BYTES: usize = 4;
const KIND_PUT: u8 = 1;
const KIND_DELETE: u8 = 2;
/// Blocks read at once when replaying.
const REPLAY_BATCH_BLOCKS: u64 = 64;

/// One logged change: a put of `value`, or a delete when `value` is None.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalRecord {
    pub key: Key,
    pub value: Option<Vec<u8>>,
}

impl WalRecord {
    fn encoded_len(&self) -> usize {
        RECORD_HEADER_BYTES + self.key.as_bytes().len() + self.value.as_ref().map_or(0, Vec::len)
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        let key = self.key.as_bytes();
        let value = self.value.as_deref().unwrap_or(&[]);
        out.push(if self.value.is_some() { KIND_PUT } else { KIND_DELETE });
        out.push(key.len() as u8);
        out.extend_from_slice(&(value.len() as u16).to_le_bytes());
        out.extend_from_slice(key);
        out.extend_from_slice(value);
    }
}

// The largest record must fit an empty log block.
const _: () = assert!(HEADER_BYTES + RECORD_HEADER_BYTES + MAX_KEY_BYTES + MAX_VALUE_BYTES <= BLOCK_SIZE);

/// A record durable in the log, as handed to its section.
#[derive(Clone, Debug)]
pub struct Logged {
    /// The order of acknowledgement: a later ticket for the same key is the newer value.
    pub ticket: u64,
    pub log_block: u64,
    pub record: WalRecord,
}

/// What the log asks of the store around a group commit.
pub trait WalHooks: Send + Sync {
    /// Refuses a group of `records` records whose application the drive might not hold;
    /// `puts` says whether any of them is a put (a group of deletes only frees space).
    fn admit(&self, records: usize, puts: bool) -> Result<()>;
    /// Returns once the ring may hold log block `block` (checkpointing, waiting for the
    /// sections to apply older records if it must).
    fn make_room(&self, block: u64) -> Result<()>;
    /// Hands durable records to their sections; called before they are acknowledged.
    fn dispatch(&self, records: Vec<Logged>);
}

/// The open, partly filled block at the end of the log.
#[derive(Clone)]
struct Tail {
    block: u64,
    body: Vec<u8>,
    count: u16,
}

struct GroupState {
    next_ticket: u64,
    queue: Vec<(u64, WalRecord)>,
    leader: bool,
    /// Every ticket below this one has its outcome.
    decided_below: u64,
    failures: HashMap<u64, (ErrorKind, String)>,
    failed: Option<String>,
}

/// The log of one session.
pub struct Wal {
    drive: Arc<Drive>,
    layout: Layout,
    epoch: u64,
    group: Mutex<GroupState>,
    decided: Condvar,
    tail: Mutex<Tail>,
    /// The superblock's checkpoint: the ring must not reuse the slot of any block from here on.
    checkpoint_block: AtomicU64,
    /// Every record in a block below this one has been dispatched to its section.
    dispatched_floor: AtomicU64,
}

impl Wal {
    /// A log whose session `epoch` starts writing at `start_block`, with the checkpoint there.
    pub fn new(drive: Arc<Drive>, layout: Layout, epoch: u64, start_block: u64) -> Wal {
        let group = GroupState {
            next_ticket: 1,
            queue: Vec::new(),
            leader: false,
            decided_below: 1,
            failures: HashMap::new(),
            failed: None,
        };
        Wal {
            drive,
            layout,
            epoch,
            group: Mutex::new(group),
            decided: Condvar::new(),
            tail: Mutex::new(Tail { block: start_block, body: Vec::new(), count: 0 }),
            checkpoint_block: AtomicU64::new(start_block),
            dispatched_floor: AtomicU64::new(start_block),
        }
    }

    pub fn checkpoint_block(&self) -> u64 {
        self.checkpoint_block.load(Ordering::SeqCst)
    }

    pub fn set_checkpoint_block(&self, block: u64) {
        self.checkpoint_block.fetch_max(block, Ordering::SeqCst);
    }

    pub fn dispatched_floor(&self) -> u64 {
        self.dispatched_floor.load(Ordering::SeqCst)
    }

    /// The block the next record goes to.
    pub fn tail_block(&self) -> u64 {
        self.tail.lock().block
    }

    /// Logs `record` and returns once it is durable (and dispatched), or with the error that
    /// kept its group from being written, in which case nothing of it is on the drive.
    pub fn commit(&self, record: WalRecord, hooks: &dyn WalHooks) -> Result<()> {
        let mut group = self.group.lock();
        if let Some(why) = &group.failed {
            return Err(Error::closed(format!("the write-ahead log failed earlier: {why}")));
        }
        let ticket = group.next_ticket;
        group.next_ticket += 1;
        group.queue.push((ticket, record));
        loop {
            if group.decided_below > ticket {
                return match group.failures.remove(&ticket) {
                    Some((kind, message)) => Err(Error::new(kind, message)),
                    None => Ok(()),
                };
            }
            if group.leader {
                self.decided.wait(&mut group);
                continue;
            }
            group.leader = true;
            let records = std::mem::take(&mut group.queue);
            let (first, last) = (records[0].0, records.last().expect("our own record is queued").0);
            drop(group);
            let outcome = self.write_group(records, hooks);
            group = self.group.lock();
            group.leader = false;
            group.decided_below = last + 1;
            if let Err(error) = outcome {
                if error.kind() != ErrorKind::Full {
                    group.failed.get_or_insert_with(|| error.message().to_string());
                }
                // A group's tickets are consecutive: they were queued in order under the lock.
                for t in first..=last {
                    group.failures.insert(t, (error.kind(), error.message().to_string()));
                }
            }
            self.decided.notify_all();
        }
    }

    /// Writes one group and flushes; on success hands its records to their sections. On a
    /// `Full` error nothing reached the drive and the tail is as before.
    fn write_group(&self, records: Vec<(u64, WalRecord)>, hooks: &dyn WalHooks) -> Result<()> {
        hooks.admit(records.len(), records.iter().any(|(_, r)| r.value.is_some()))?;
        let mut tail = self.tail.lock();
        let before = tail.clone();
        let mut blocks: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut logged = Vec::with_capacity(records.len());
        for (ticket, record) in records {
            if HEADER_BYTES + tail.body.len() + record.encoded_len() > BLOCK_SIZE {
                blocks.push((tail.block, self.encode_block(&tail)));
                *tail = Tail { block: tail.block + 1, body: Vec::new(), count: 0 };
            }
            record.encode_into(&mut tail.body);
            tail.count += 1;
            logged.push(Logged { ticket, log_block: tail.block, record });
        }
        blocks.push((tail.block, self.encode_block(&tail)));
        let result = hooks.make_room(tail.block).and_then(|()| self.write_blocks(&blocks));
        if let Err(error) = result {
            *tail = before;
            return Err(error);
        }
        hooks.dispatch(logged);
        self.dispatched_floor.store(tail.block, Ordering::SeqCst);
        Ok(())
    }

    /// Writes consecutive log blocks (split where the ring wraps) and flushes the drive.
    fn write_blocks(&self, blocks: &[(u64, Vec<u8>)]) -> Result<()> {
        let mut at = 0;
        while at < blocks.len() {
            let first = self.layout.wal_lba(blocks[at].0);
            let mut end = at + 1;
            while end < blocks.len() && self.layout.wal_lba(blocks[end].0).0 == first.0 + (end - at) as u64 {
                end += 1;
            }
            let write = |data: &[u8]| {
                self.drive.write(first, data).map_err(|e| Error::device("writing the write-ahead log", e))
            };
            if end == at + 1 {
                write(&blocks[at].1)?;
            } else {
                let mut data = Vec::with_capacity((end - at) * BLOCK_SIZE);
                blocks[at..end].iter().for_each(|(_, block)| data.extend_from_slice(block));
                write(&data)?;
            }
            at = end;
        }
        self.drive.flush().map_err(|e| Error::device("flushing the write-ahead log", e))
    }

    fn encode_block(&self, tail: &Tail) -> Vec<u8> {
        encode_block(tail.block, self.epoch, tail.count, &tail.body)
    }
}

fn encode_block(log_block: u64, epoch: u64, count: u16, body: &[u8]) -> Vec<u8> {
    let mut block = vec![0u8; BLOCK_SIZE];
    block[..4].copy_from_slice(&MAGIC);
    block[8..16].copy_from_slice(&log_block.to_le_bytes());
    block[16..24].copy_from_slice(&epoch.to_le_bytes());
    block[24..26].copy_from_slice(&(body.len() as u16).to_le_bytes());
    block[26..28].copy_from_slice(&count.to_le_bytes());
    block[28..32].copy_from_slice(&crc32c::crc32c(body).to_le_bytes());
    let header_crc = crc32c::crc32c(&block[8..32]);
    block[4..8].copy_from_slice(&header_crc.to_le_bytes());
    block[HEADER_BYTES..HEADER_BYTES + body.len()].copy_from_slice(body);
    block
}

/// What one slot of the ring holds, for the replay.
enum Slot {
    /// The expected block, with its records.
    Block(Vec<WalRecord>),
    /// Not the expected block: the log ends before it.
    End,
}

fn decode_block(layout: &Layout, block: &[u8], log_block: u64, epoch: u64) -> Result<Slot> {
    if tundra_device::is_zero(block) {
        return Ok(Slot::End);
    }
    let lba = layout.wal_lba(log_block);
    let bad = |what: &str| Error::corrupted(format!("write-ahead log block at {lba} (log block {log_block}): {what}"));
    if block[..4] != MAGIC {
        return Err(bad("not a log block (bad magic)"));
    }
    let header_crc = u32::from_le_bytes(block[4..8].try_into().expect("4 bytes"));
    if header_crc != crc32c::crc32c(&block[8..32]) {
        return Err(bad("header checksum mismatch"));
    }
    let number = u64::from_le_bytes(block[8..16].try_into().expect("8 bytes"));
    let block_epoch = u64::from_le_bytes(block[16..24].try_into().expect("8 bytes"));
    if number != log_block || block_epoch != epoch {
        return Ok(Slot::End);
    }
    let used = usize::from(u16::from_le_bytes([block[24], block[25]]));
    let count = usize::from(u16::from_le_bytes([block[26], block[27]]));
    if HEADER_BYTES + used > BLOCK_SIZE {
        return Err(bad("record bytes run past the block"));
    }
    let body = &block[HEADER_BYTES..HEADER_BYTES + used];
    if u32::from_le_bytes(block[28..32].try_into().expect("4 bytes")) != crc32c::crc32c(body) {
        return Err(bad("record checksum mismatch"));
    }
    let mut records = Vec::with_capacity(count);
    let mut at = 0;
    while at < body.len() {
        let rest = &body[at..];
        if rest.len() < RECORD_HEADER_BYTES {
            return Err(bad("a truncated record"));
        }
        let (kind, key_len) = (rest[0], usize::from(rest[1]));
        let value_len = usize::from(u16::from_le_bytes([rest[2], rest[3]]));
        let end = RECORD_HEADER_BYTES + key_len + value_len;
        let valid_kind = kind == KIND_PUT || (kind == KIND_DELETE && value_len == 0);
        if !valid_kind || key_len == 0 || key_len > MAX_KEY_BYTES || value_len > MAX_VALUE_BYTES || end > rest.len() {
            return Err(bad("a malformed record"));
        }
        let key = Key::new(&rest[4..4 + key_len]).expect("length checked");
        let value = (kind == KIND_PUT).then(|| rest[4 + key_len..end].to_vec());
        records.push(WalRecord { key, value });
        at += end;
    }
    if records.len() != count {
        return Err(bad("record count mismatch"));
    }
    Ok(Slot::Block(records))
}

/// Reads the log of session `epoch` from `checkpoint_block`: its records in order, each with
/// its log block, and the first block past the end.
pub fn replay(
    drive: &Drive,
    layout: &Layout,
    epoch: u64,
    checkpoint_block: u64,
) -> Result<(Vec<(u64, WalRecord)>, u64)> {
    let mut records = Vec::new();
    let mut next = checkpoint_block;
    let limit = checkpoint_block + layout.wal_blocks;
    while next < limit {
        // Read up to the ring's wrap point or the batch size, whichever comes first.
        let slot = next % layout.wal_blocks;
        let count = REPLAY_BATCH_BLOCKS.min(layout.wal_blocks - slot).min(limit - next);
        let mut buf = vec![0u8; count as usize * BLOCK_SIZE];
        drive
            .read(Lba(layout.wal_first + slot), &mut buf)
            .map_err(|e| Error::device("reading the write-ahead log", e))?;
        for block in buf.chunks_exact(BLOCK_SIZE) {
            match decode_block(layout, block, next, epoch)? {
                Slot::Block(found) => records.extend(found.into_iter().map(|r| (next, r))),
                Slot::End => return Ok((records, next)),
            }
            next += 1;
        }
    }
    Ok((records, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new(1000, 8, 16, 100, 1).unwrap()
    }

    #[test]
    fn blocks_round_trip_and_other_epochs_or_numbers_end_the_log() {
        let layout = layout();
        let records = vec![
            WalRecord { key: Key::new(b"k1").unwrap(), value: Some(vec![7; 400]) },
            WalRecord { key: Key::new(b"k2").unwrap(), value: None },
        ];
        let mut body = Vec::new();
        records.iter().for_each(|r| r.encode_into(&mut body));
        let block = encode_block(12, 3, 2, &body);
        assert!(matches!(decode_block(&layout, &block, 12, 3).unwrap(), Slot::Block(r) if r == records));
        assert!(matches!(decode_block(&layout, &block, 4, 3).unwrap(), Slot::End), "a slot from the last lap");
        assert!(matches!(decode_block(&layout, &block, 12, 4).unwrap(), Slot::End), "a crashed session's block");
        let mut damaged = block.clone();
        damaged[HEADER_BYTES + 10] ^= 1;
        assert_eq!(decode_block(&layout, &damaged, 12, 3).err().map(|e| e.kind()), Some(ErrorKind::Corrupted));
        let mut damaged = block;
        damaged[20] ^= 1;
        assert_eq!(decode_block(&layout, &damaged, 12, 3).err().map(|e| e.kind()), Some(ErrorKind::Corrupted));
    }
}
