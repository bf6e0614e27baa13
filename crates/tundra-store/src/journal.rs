//! The journal (seed 000 §3.2.1): a write-ahead log of index changes on the fast device, with
//! group commit, and checkpoints of the whole index that bound recovery.
//!
//! The fast device holds two superblock slots, two checkpoint slots and a ring of log blocks.
//! Every log block carries its position in the log, the epoch it was written in and a checksum;
//! replay reads from the checkpoint's position while each block is the next position, of an
//! epoch no older than the one before it, and verifies. Each recovery starts a new epoch, so a
//! block left from before a crash beyond the recovered end can never be read as part of the log
//! once newer blocks are written in front of it.
//!
//! The allocator's state is not journalled: it is a function of the index (the blocks in use are
//! exactly the runs of the mapped pages), rebuilt at recovery. So the two can never disagree.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use tundra_device::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Lba};

use crate::ids::VolumeId;
use crate::ids::{BlockRun, ChunkId, ExtentId, PageNo};
use crate::index::{Encoding, PageEntry};
use crate::volume::{MAX_NAME_BYTES, Volume, VolumeMode};
use crate::{Error, Result};

const SUPERBLOCK_MAGIC: &[u8; 8] = b"TNDRJNL1";
const CHECKPOINT_MAGIC: &[u8; 8] = b"TNDRJCK1";
const LOG_MAGIC: u32 = 0x544a_4c42; // "TJLB"
const LOG_HEADER_BYTES: usize = 32;

/// One change to a chunk's index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// The page is now stored in `entry`'s blocks, which were durable before this record.
    PageSet { chunk: ChunkId, page: PageNo, entry: PageEntry },
    /// The page no longer exists (trimmed); it reads as zeros.
    PageClear { chunk: ChunkId, page: PageNo },
    /// A volume was created or changed.
    VolumeSet(Volume),
    /// A volume and all its pages are gone.
    VolumeDelete(VolumeId),
    /// Every volume id below this one has been given out, and is never given again (even after
    /// its volume is deleted): written in every checkpoint, so the mark outlives the records of
    /// the volumes that raised it.
    VolumeIdFloor(VolumeId),
}

const TAG_PAGE_SET: u8 = 1;
const TAG_PAGE_CLEAR: u8 = 2;
const TAG_VOLUME_SET: u8 = 3;
const TAG_VOLUME_DELETE: u8 = 4;
const TAG_VOLUME_ID_FLOOR: u8 = 5;
/// The largest encoded record: a volume with the longest name.
pub const MAX_RECORD_BYTES: usize = 1 + 4 + 8 + 4 + 8 + 1 + 1 + MAX_NAME_BYTES;
/// The bytes of a page record, the most common kind.
pub const PAGE_RECORD_BYTES: usize = 34;

impl Record {
    pub fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Record::PageSet { chunk, page, entry } => {
                out.push(TAG_PAGE_SET);
                out.extend_from_slice(&chunk.0.to_le_bytes());
                out.extend_from_slice(&page.0.to_le_bytes());
                out.push(encoding_bits(entry.encoding));
                out.extend_from_slice(&entry.run.extent.0.to_le_bytes());
                out.push(entry.run.offset);
                out.push(entry.run.count);
                out.extend_from_slice(&entry.stored_len.to_le_bytes());
                out.extend_from_slice(&entry.checksum.to_le_bytes());
                out.extend_from_slice(&entry.version.to_le_bytes());
            }
            Record::PageClear { chunk, page } => {
                out.push(TAG_PAGE_CLEAR);
                out.extend_from_slice(&chunk.0.to_le_bytes());
                out.extend_from_slice(&page.0.to_le_bytes());
            }
            Record::VolumeSet(ref volume) => {
                assert!(volume.name.len() <= MAX_NAME_BYTES);
                out.push(TAG_VOLUME_SET);
                out.extend_from_slice(&volume.id.0.to_le_bytes());
                out.extend_from_slice(&volume.size_bytes.to_le_bytes());
                out.extend_from_slice(&volume.page_size.to_le_bytes());
                out.extend_from_slice(&volume.chunk_bytes.to_le_bytes());
                out.push(match volume.mode {
                    VolumeMode::Normal => 0,
                    VolumeMode::None => 1,
                });
                out.push(volume.name.len() as u8);
                out.extend_from_slice(volume.name.as_bytes());
            }
            Record::VolumeDelete(id) => {
                out.push(TAG_VOLUME_DELETE);
                out.extend_from_slice(&id.0.to_le_bytes());
            }
            Record::VolumeIdFloor(next) => {
                out.push(TAG_VOLUME_ID_FLOOR);
                out.extend_from_slice(&next.0.to_le_bytes());
            }
        }
    }

    /// Decodes one record from the front of `bytes`, returning it and its length.
    pub fn decode(bytes: &[u8]) -> Result<(Record, usize)> {
        let mut r = Cursor { bytes, at: 0 };
        let tag = r.u8()?;
        match tag {
            TAG_VOLUME_SET => return Ok((Record::VolumeSet(decode_volume(&mut r)?), r.at)),
            TAG_VOLUME_DELETE => return Ok((Record::VolumeDelete(VolumeId(r.u32()?)), r.at)),
            TAG_VOLUME_ID_FLOOR => return Ok((Record::VolumeIdFloor(VolumeId(r.u32()?)), r.at)),
            _ => {}
        }
        let chunk = ChunkId(r.u64()?);
        let page = PageNo(r.u32()?);
        let record = match tag {
            TAG_PAGE_SET => {
                let encoding = encoding_from_bits(r.u8()?)?;
                let extent = ExtentId(r.u32()?);
                let (offset, count) = (r.u8()?, r.u8()?);
                if count == 0 || u32::from(offset) + u32::from(count) > crate::ids::EXTENT_BLOCKS {
                    return Err(Error::corrupted(format!("journal record with a bad block run {offset}+{count}")));
                }
                let entry = PageEntry {
                    encoding,
                    run: BlockRun::new(extent, offset, count),
                    stored_len: r.u16()?,
                    checksum: r.u32()?,
                    version: r.u64()?,
                };
                Record::PageSet { chunk, page, entry }
            }
            TAG_PAGE_CLEAR => Record::PageClear { chunk, page },
            other => return Err(Error::corrupted(format!("journal record with unknown tag {other}"))),
        };
        Ok((record, r.at))
    }
}

fn decode_volume(r: &mut Cursor<'_>) -> Result<Volume> {
    let id = VolumeId(r.u32()?);
    let size_bytes = r.u64()?;
    let page_size = r.u32()?;
    let chunk_bytes = r.u64()?;
    let mode = match r.u8()? {
        0 => VolumeMode::Normal,
        1 => VolumeMode::None,
        other => return Err(Error::corrupted(format!("journal record with unknown volume mode {other}"))),
    };
    let name_len = usize::from(r.u8()?);
    let mut name = Vec::with_capacity(name_len);
    for _ in 0..name_len {
        name.push(r.u8()?);
    }
    let name = String::from_utf8(name).map_err(|_| Error::corrupted("a volume name that is not UTF-8"))?;
    let volume = Volume { id, name, size_bytes, page_size, chunk_bytes, mode };
    volume.validate().map_err(|e| Error::corrupted(format!("journal volume record: {}", e.message())))?;
    Ok(volume)
}

fn encoding_bits(encoding: Encoding) -> u8 {
    match encoding {
        Encoding::Raw => 1,
        Encoding::Lz4 => 2,
        Encoding::Zstd => 3,
        Encoding::Heavy => 4,
    }
}

fn encoding_from_bits(bits: u8) -> Result<Encoding> {
    match bits {
        1 => Ok(Encoding::Raw),
        2 => Ok(Encoding::Lz4),
        3 => Ok(Encoding::Zstd),
        4 => Ok(Encoding::Heavy),
        other => Err(Error::corrupted(format!("journal record with unknown encoding {other}"))),
    }
}

/// Reads little-endian fields, failing cleanly at the end of the bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        let slice = self.bytes.get(self.at..self.at + N).ok_or_else(|| Error::corrupted("journal record cut short"))?;
        self.at += N;
        Ok(slice.try_into().expect("slice of N bytes"))
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take()?))
    }
}

/// Where the journal's parts are on the fast device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalGeometry {
    pub checkpoint_blocks: u64,
    pub log_blocks: u64,
}

impl JournalGeometry {
    fn checkpoint_lba(&self, slot: u64) -> Lba {
        Lba(2 + slot * self.checkpoint_blocks)
    }

    fn log_lba(&self, position: u64) -> Lba {
        Lba(2 + 2 * self.checkpoint_blocks + position % self.log_blocks)
    }

    pub fn total_blocks(&self) -> u64 {
        2 + 2 * self.checkpoint_blocks + self.log_blocks
    }
}

/// The journal superblock: geometry, the current checkpoint, and the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Superblock {
    geometry: JournalGeometry,
    generation: u64,
    checkpoint_slot: u64,
    /// Log position of the first block the checkpoint does not reflect.
    checkpoint_position: u64,
    epoch: u64,
}

impl Superblock {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(BLOCK_SIZE);
        b.extend_from_slice(SUPERBLOCK_MAGIC);
        for v in [
            self.geometry.checkpoint_blocks,
            self.geometry.log_blocks,
            self.generation,
            self.checkpoint_slot,
            self.checkpoint_position,
            self.epoch,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        seal_block(b)
    }

    fn decode(block: &[u8]) -> Option<Superblock> {
        let body = verified_block(block)?;
        if &body[..8] != SUPERBLOCK_MAGIC {
            return None;
        }
        let field = |i: usize| u64::from_le_bytes(body[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes"));
        let superblock = Superblock {
            geometry: JournalGeometry { checkpoint_blocks: field(0), log_blocks: field(1) },
            generation: field(2),
            checkpoint_slot: field(3),
            checkpoint_position: field(4),
            epoch: field(5),
        };
        (superblock.checkpoint_slot < 2 && superblock.geometry.log_blocks > 0).then_some(superblock)
    }
}

/// Pads a block body to 4092 bytes and appends its crc32c.
fn seal_block(mut body: Vec<u8>) -> Vec<u8> {
    assert!(body.len() <= BLOCK_SIZE - 4);
    body.resize(BLOCK_SIZE - 4, 0);
    let crc = crc32c::crc32c(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}

fn verified_block(block: &[u8]) -> Option<&[u8]> {
    let (body, crc) = block.split_at(BLOCK_SIZE - 4);
    (crc32c::crc32c(body) == u32::from_le_bytes(crc.try_into().expect("4 bytes"))).then_some(body)
}

/// A log block: header (magic, position, epoch, payload length) then records.
fn encode_log_block(position: u64, epoch: u64, records: &[u8]) -> Vec<u8> {
    assert!(records.len() <= BLOCK_SIZE - 4 - LOG_HEADER_BYTES);
    let mut b = Vec::with_capacity(BLOCK_SIZE);
    b.extend_from_slice(&LOG_MAGIC.to_le_bytes());
    b.extend_from_slice(&(records.len() as u32).to_le_bytes());
    b.extend_from_slice(&position.to_le_bytes());
    b.extend_from_slice(&epoch.to_le_bytes());
    b.resize(LOG_HEADER_BYTES, 0);
    b.extend_from_slice(records);
    seal_block(b)
}

/// The records of a log block if it is the block at `position`, of an epoch not older than
/// `min_epoch`; with its epoch.
fn decode_log_block(block: &[u8], position: u64, min_epoch: u64) -> Option<(u64, &[u8])> {
    let body = verified_block(block)?;
    let magic = u32::from_le_bytes(body[..4].try_into().expect("4 bytes"));
    let length = u32::from_le_bytes(body[4..8].try_into().expect("4 bytes")) as usize;
    let at = u64::from_le_bytes(body[8..16].try_into().expect("8 bytes"));
    let epoch = u64::from_le_bytes(body[16..24].try_into().expect("8 bytes"));
    let fits = LOG_HEADER_BYTES + length <= body.len();
    (magic == LOG_MAGIC && at == position && epoch >= min_epoch && fits)
        .then(|| (epoch, &body[LOG_HEADER_BYTES..LOG_HEADER_BYTES + length]))
}

/// Records packed per log block.
const LOG_PAYLOAD_BYTES: usize = BLOCK_SIZE - 4 - LOG_HEADER_BYTES;

struct Committer {
    /// Encoded records waiting for the next group commit, with the batch they belong to.
    pending: Vec<u8>,
    pending_batch: u64,
    /// Every batch up to this one is durable.
    durable_batch: u64,
    committing: bool,
    /// The position of the block the next commit writes first: the last, partly filled block,
    /// whose records are in `tail`, or a fresh one when `tail` is empty.
    next_position: u64,
    tail: Vec<u8>,
    epoch: u64,
    checkpoint_position: u64,
    failed: Option<String>,
}

/// The journal on a fast device.
pub struct Journal {
    device: Arc<dyn BlockDevice>,
    geometry: JournalGeometry,
    committer: Mutex<Committer>,
    committed: Condvar,
    checkpoint: Mutex<(u64, u64)>,
    /// A device flushed before every group of records is written: the data device, whose blocks
    /// the records point at. One flush then covers every writer of the group.
    barrier: Option<Arc<dyn BlockDevice>>,
}

/// What recovery found: the checkpoint's records, then the log's, in order.
pub struct Replay {
    pub checkpoint: Vec<Record>,
    pub log: Vec<Record>,
}

impl Journal {
    /// Lays an empty journal on `device` with a log of `log_blocks` and checkpoint slots of
    /// `checkpoint_blocks`.
    pub fn format(device: &dyn BlockDevice, geometry: JournalGeometry) -> Result<()> {
        if device.block_count() < geometry.total_blocks() || geometry.log_blocks < 2 || geometry.checkpoint_blocks < 1 {
            return Err(Error::invalid(format!(
                "the fast device has {} blocks; the journal needs {} with at least 2 log blocks",
                device.block_count(),
                geometry.total_blocks()
            )));
        }
        device.trim(Lba(0), geometry.total_blocks())?;
        device.write(geometry.checkpoint_lba(0), &encode_checkpoint(&[], 0)?)?;
        device.flush()?;
        let superblock = Superblock { geometry, generation: 1, checkpoint_slot: 0, checkpoint_position: 0, epoch: 1 };
        device.write(Lba(1), &superblock.encode())?;
        device.flush()?;
        Ok(())
    }

    /// Opens the journal, returning it with everything to replay. A new epoch starts.
    pub fn open(device: Arc<dyn BlockDevice>) -> Result<(Journal, Replay)> {
        let mut blocks = vec![0u8; 2 * BLOCK_SIZE];
        device.read(Lba(0), &mut blocks)?;
        let superblock = [Superblock::decode(&blocks[..BLOCK_SIZE]), Superblock::decode(&blocks[BLOCK_SIZE..])]
            .into_iter()
            .flatten()
            .max_by_key(|s| s.generation)
            .ok_or_else(|| Error::invalid("no valid journal superblock: the fast device holds no Tundra journal"))?;
        let geometry = superblock.geometry;
        if device.block_count() < geometry.total_blocks() {
            return Err(Error::corrupted("the fast device is smaller than its journal"));
        }
        let checkpoint = read_checkpoint(device.as_ref(), geometry, superblock.checkpoint_slot)?;
        let (log, end) = read_log(device.as_ref(), geometry, superblock.checkpoint_position)?;
        let epoch = superblock.epoch + 1;
        let journal = Journal {
            device,
            geometry,
            committer: Mutex::new(Committer {
                pending: Vec::new(),
                pending_batch: 1,
                durable_batch: 0,
                committing: false,
                next_position: end,
                tail: Vec::new(),
                epoch,
                checkpoint_position: superblock.checkpoint_position,
                failed: None,
            }),
            committed: Condvar::new(),
            checkpoint: Mutex::new((superblock.generation, superblock.checkpoint_slot)),
            barrier: None,
        };
        // The new epoch must be durable before any block of it is written.
        let mut cursor = journal.checkpoint.lock();
        journal.write_superblock(&mut cursor, superblock.checkpoint_slot, superblock.checkpoint_position, epoch)?;
        drop(cursor);
        Ok((journal, Replay { checkpoint, log }))
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
        let mut c = self.committer.lock();
        if let Some(reason) = &c.failed {
            return Err(Error::closed(format!("the journal stopped after an error ({reason})")));
        }
        for record in records {
            record.encode(&mut c.pending);
        }
        let my_batch = c.pending_batch;
        loop {
            if c.durable_batch >= my_batch {
                return Ok(());
            }
            if let Some(reason) = &c.failed {
                return Err(Error::closed(format!("the journal stopped after an error ({reason})")));
            }
            if !c.committing {
                c.committing = true;
                let mut batch = c.tail.clone();
                batch.append(&mut c.pending);
                let batch_id = c.pending_batch;
                c.pending_batch += 1;
                let (position, epoch, checkpoint_position) = (c.next_position, c.epoch, c.checkpoint_position);
                drop(c);
                let written = self.write_batch(&batch, position, epoch, checkpoint_position);
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

    /// Writes a group of encoded records as log blocks from `position`, and flushes. The first
    /// block rewrites the previous commit's partly filled block, whose records `records` starts
    /// with (a single block write is atomic, so they are never lost). Returns the position of
    /// the new last block if it has room left, with its records, or of the next block.
    fn write_batch(
        &self,
        records: &[u8],
        position: u64,
        epoch: u64,
        checkpoint_position: u64,
    ) -> Result<(u64, Vec<u8>)> {
        if let Some(barrier) = &self.barrier {
            barrier.flush()?;
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
            blocks.push(encode_log_block(position + blocks.len() as u64, epoch, &records[at..end]));
            at = end;
        }
        let next = position + blocks.len() as u64;
        let last_used = records.len() - last_start;
        let (tail_position, tail) = if last_used + MAX_RECORD_BYTES <= LOG_PAYLOAD_BYTES {
            (next - 1, records[last_start..].to_vec())
        } else {
            (next, Vec::new())
        };
        if next - checkpoint_position > self.geometry.log_blocks {
            return Err(Error::invalid("the journal is full: a checkpoint must be taken before more commits"));
        }
        // Write contiguous pieces: the ring may wrap inside the group.
        let mut i = 0;
        while i < blocks.len() {
            let first = position + i as u64;
            let room = (self.geometry.log_blocks - first % self.geometry.log_blocks) as usize;
            let n = room.min(blocks.len() - i);
            self.device.write(self.geometry.log_lba(first), &blocks[i..i + n].concat())?;
            i += n;
        }
        self.device.flush()?;
        Ok((tail_position, tail))
    }

    /// Log blocks in use since the last checkpoint, and the ring's size.
    pub fn usage_blocks(&self) -> (u64, u64) {
        let c = self.committer.lock();
        let partly = u64::from(!c.tail.is_empty());
        (c.next_position + partly - c.checkpoint_position, self.geometry.log_blocks)
    }

    /// Writes `records` (the whole index, as of log position `position`) as the new checkpoint
    /// and makes the log before `position` reusable. The caller guarantees that every record
    /// committed before `position` is reflected in `records`.
    pub fn checkpoint(&self, records: &[Record], position: u64) -> Result<()> {
        let mut cursor = self.checkpoint.lock();
        let slot = 1 - cursor.1;
        let image = encode_checkpoint(records, self.geometry.checkpoint_blocks)?;
        self.device.write(self.geometry.checkpoint_lba(slot), &image)?;
        self.device.flush()?;
        let epoch = self.committer.lock().epoch;
        self.write_superblock(&mut cursor, slot, position, epoch)?;
        self.committer.lock().checkpoint_position = position;
        Ok(())
    }

    /// The log position the next commit will write at: a checkpoint taken now reflects every
    /// record before it.
    /// The caller must hold off commits while it takes a checkpoint at this position.
    pub fn position(&self) -> u64 {
        let mut c = self.committer.lock();
        assert!(!c.committing && c.pending.is_empty(), "a checkpoint position taken while commits are in flight");
        // The checkpoint will reflect the records of the partly filled block too, so later
        // commits start a fresh block at the checkpoint's position.
        if !c.tail.is_empty() {
            c.tail.clear();
            c.next_position += 1;
        }
        c.next_position
    }

    /// Writes and flushes the next superblock, naming checkpoint `slot`, and advances `cursor`
    /// (the current generation and slot) to it.
    fn write_superblock(&self, cursor: &mut (u64, u64), slot: u64, position: u64, epoch: u64) -> Result<()> {
        let generation = cursor.0 + 1;
        let superblock = Superblock {
            geometry: self.geometry,
            generation,
            checkpoint_slot: slot,
            checkpoint_position: position,
            epoch,
        };
        self.device.write(Lba(generation % 2), &superblock.encode())?;
        self.device.flush()?;
        *cursor = (generation, slot);
        Ok(())
    }
}

/// A checkpoint image: a header block (magic, record bytes, crc of the records) then the
/// records, padded to whole blocks.
fn encode_checkpoint(records: &[Record], slot_blocks: u64) -> Result<Vec<u8>> {
    let mut body = Vec::with_capacity(records.len() * MAX_RECORD_BYTES);
    for record in records {
        record.encode(&mut body);
    }
    let mut header = Vec::with_capacity(BLOCK_SIZE);
    header.extend_from_slice(CHECKPOINT_MAGIC);
    header.extend_from_slice(&(body.len() as u64).to_le_bytes());
    header.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    let mut image = seal_block(header);
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

fn read_checkpoint(device: &dyn BlockDevice, geometry: JournalGeometry, slot: u64) -> Result<Vec<Record>> {
    let mut header = vec![0u8; BLOCK_SIZE];
    device.read(geometry.checkpoint_lba(slot), &mut header)?;
    let body = verified_block(&header).filter(|b| &b[..8] == CHECKPOINT_MAGIC);
    let body = body.ok_or_else(|| Error::corrupted("the journal checkpoint header does not verify"))?;
    let length = u64::from_le_bytes(body[8..16].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(body[16..20].try_into().expect("4 bytes"));
    let blocks = length.div_ceil(BLOCK_SIZE_BYTES);
    if 1 + blocks > geometry.checkpoint_blocks {
        return Err(Error::corrupted("the journal checkpoint is longer than its slot"));
    }
    let mut bytes = vec![0u8; (blocks * BLOCK_SIZE_BYTES) as usize];
    if blocks > 0 {
        device.read(Lba(geometry.checkpoint_lba(slot).0 + 1), &mut bytes)?;
    }
    bytes.truncate(length as usize);
    if crc32c::crc32c(&bytes) != crc {
        return Err(Error::corrupted("the journal checkpoint fails its checksum"));
    }
    decode_all(&bytes)
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

/// Reads the log from `position` to its end; returns the records and the end position.
fn read_log(device: &dyn BlockDevice, geometry: JournalGeometry, mut position: u64) -> Result<(Vec<Record>, u64)> {
    let start = position;
    let mut records = Vec::new();
    let mut block = vec![0u8; BLOCK_SIZE];
    let mut min_epoch = 0;
    while position - start < geometry.log_blocks {
        device.read(geometry.log_lba(position), &mut block)?;
        let Some((epoch, payload)) = decode_log_block(&block, position, min_epoch) else { break };
        records.extend(decode_all(payload)?);
        min_epoch = epoch;
        position += 1;
    }
    Ok((records, position))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tundra_device::conformance::Rng;
    use tundra_device::fault::FaultyDevice;
    use tundra_device::mem::MemDevice;

    use super::*;

    const GEOMETRY: JournalGeometry = JournalGeometry { checkpoint_blocks: 4, log_blocks: 8 };

    fn set(page: u32, version: u64) -> Record {
        let entry = PageEntry {
            encoding: Encoding::Lz4,
            run: BlockRun::new(ExtentId(page / 4), (page % 4) as u8 * 8, 3),
            stored_len: 1234,
            checksum: page ^ 0x5555,
            version,
        };
        Record::PageSet { chunk: ChunkId(7), page: PageNo(page), entry }
    }

    /// Applies records to a model index: what replay must reproduce.
    fn apply(model: &mut BTreeMap<u32, Record>, records: &[Record]) {
        for record in records {
            match *record {
                Record::PageSet { page, .. } => {
                    model.insert(page.0, record.clone());
                }
                Record::PageClear { page, .. } => {
                    model.remove(&page.0);
                }
                Record::VolumeSet(_) | Record::VolumeDelete(_) | Record::VolumeIdFloor(_) => {}
            }
        }
    }

    fn replayed(replay: &Replay) -> BTreeMap<u32, Record> {
        let mut model = BTreeMap::new();
        apply(&mut model, &replay.checkpoint);
        apply(&mut model, &replay.log);
        model
    }

    #[test]
    fn records_round_trip_and_garbage_is_an_error() {
        let volume = Volume {
            id: VolumeId(9),
            name: "wal-01".into(),
            size_bytes: 1 << 30,
            page_size: 8192,
            chunk_bytes: 1 << 30,
            mode: VolumeMode::None,
        };
        let records = [
            set(3, 9),
            Record::PageClear { chunk: ChunkId(1), page: PageNo(2) },
            Record::VolumeSet(volume),
            Record::VolumeDelete(VolumeId(4)),
            Record::VolumeIdFloor(VolumeId(10)),
        ];
        let mut bytes = Vec::new();
        for r in &records {
            r.encode(&mut bytes);
        }
        assert_eq!(decode_all(&bytes).unwrap(), records);
        assert!(Record::decode(&bytes[..10]).is_err());
        assert!(Record::decode(&[9u8; 40]).is_err());
    }

    #[test]
    fn commits_survive_reopen_through_checkpoints_and_ring_wraps() {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(GEOMETRY.total_blocks()));
        Journal::format(device.as_ref(), GEOMETRY).unwrap();
        let mut model = BTreeMap::new();
        let (mut journal, _) = Journal::open(device.clone()).unwrap();
        for round in 0..40u64 {
            let records: Vec<Record> = (0..30).map(|i| set(((round * 7 + i) % 50) as u32, round)).collect();
            journal.commit(&records).unwrap();
            apply(&mut model, &records);
            if journal.usage_blocks().0 * 2 >= journal.usage_blocks().1 {
                let snapshot: Vec<Record> = model.values().cloned().collect();
                journal.checkpoint(&snapshot, journal.position()).unwrap();
            }
            if round % 9 == 0 {
                let (reopened, replay) = Journal::open(device.clone()).unwrap();
                assert_eq!(replayed(&replay), model, "round {round}");
                journal = reopened;
            }
        }
    }

    #[test]
    fn group_commit_from_many_threads() {
        let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(GeometryBig::G.total_blocks()));
        Journal::format(device.as_ref(), GeometryBig::G).unwrap();
        let (journal, _) = Journal::open(device.clone()).unwrap();
        std::thread::scope(|scope| {
            for t in 0..4u32 {
                let journal = &journal;
                scope.spawn(move || {
                    for i in 0..200u32 {
                        journal.commit(&[set(t * 1000 + i, 1)]).unwrap();
                    }
                });
            }
        });
        let (_, replay) = Journal::open(device).unwrap();
        assert_eq!(replayed(&replay).len(), 800);
    }

    struct GeometryBig;
    impl GeometryBig {
        const G: JournalGeometry = JournalGeometry { checkpoint_blocks: 4, log_blocks: 512 };
    }

    /// Crashes at random media writes: every acknowledged commit survives, nothing that was not
    /// committed appears, and a record from before a crash never reappears after a later one.
    #[test]
    fn crash_points_lose_no_acknowledged_commit() {
        let mut rng = Rng::new(42);
        let mut interrupted = 0;
        for round in 0..400u64 {
            let media = Arc::new(FaultyDevice::new(MemDevice::new(GEOMETRY.total_blocks()), round));
            Journal::format(media.as_ref(), GEOMETRY).unwrap();
            let mut acknowledged: BTreeMap<u32, Record> = BTreeMap::new();
            let mut attempted: Vec<Record> = Vec::new();
            for _crash in 0..4 {
                let (journal, replay) = match Journal::open(media.clone()) {
                    Ok(opened) => opened,
                    Err(e) => panic!("round {round}: reopen failed: {e}"),
                };
                let state = replayed(&replay);
                for (page, record) in &acknowledged {
                    let got = state.get(page);
                    let newer = got.is_some_and(|g| attempted.contains(g));
                    assert!(got == Some(record) || newer, "round {round}: lost page {page}");
                }
                for record in state.values() {
                    assert!(attempted.contains(record), "round {round}: a record never committed: {record:?}");
                }
                acknowledged = state;
                media.crash_after(rng.below(12));
                for step in 0..20u64 {
                    let record = set(rng.below(12) as u32, round * 100 + step);
                    attempted.push(record.clone());
                    if journal.commit(std::slice::from_ref(&record)).is_err() {
                        interrupted += 1;
                        break;
                    }
                    apply(&mut acknowledged, std::slice::from_ref(&record));
                    let nearly_full = journal.usage_blocks().0 + 1 >= journal.usage_blocks().1;
                    if rng.chance(20) || nearly_full {
                        let snapshot: Vec<Record> = acknowledged.values().cloned().collect();
                        if journal.checkpoint(&snapshot, journal.position()).is_err() {
                            break;
                        }
                    }
                }
                drop(journal);
                media.recover().unwrap();
            }
        }
        assert!(interrupted > 400, "power should often fail inside a commit: {interrupted}");
    }
}
