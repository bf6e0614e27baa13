//! Formatting, map checkpoints and crash recovery.
//!
//! A checkpoint is a copy of the whole map written to the inactive checkpoint slot, made durable,
//! and then named by a new superblock written to the inactive superblock slot. Every record with
//! a sequence number up to the checkpoint's is reflected in it. Recovery loads the newest valid
//! superblock's checkpoint, then scans only the segments that can hold newer records (opened
//! after the checkpoint, or open when it was taken) and applies their records in sequence order.
//! docs/format.md argues each crash case.

use crate::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Error, Lba, Result};

use super::layout::{
    CheckpointHeader, Geometry, MIN_RESERVE_SEGMENTS, RecordHeader, RecordKind, SEGMENT_HEADER_BYTES, SegmentHeader,
    Superblock, units,
};
use super::map::{ENTRY_BYTES, Map, MapEntry};
use super::state::{GC_RESERVE_SEGMENTS, HeadKind, MAX_RECORD_BYTES, Segment, SegmentState, State};
use super::{Counters, Shared};

/// The sizes a drive is formatted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatOptions {
    /// The address space the drive exposes.
    pub logical_bytes: u64,
    /// Physical space for data: what the drive can hold after compression.
    pub physical_bytes: u64,
    pub segment_bytes: u64,
    /// Extra media, as a percentage of the physical space, kept free for garbage collection
    /// (seed 000 §4.1.2: PolarCSD 2.0 keeps 4%).
    pub over_provisioning_percent: u32,
}

impl FormatOptions {
    pub const DEFAULT_SEGMENT_BYTES: u64 = 1 << 20;
    pub const DEFAULT_OVER_PROVISIONING_PERCENT: u32 = 4;

    pub fn new(logical_bytes: u64, physical_bytes: u64) -> FormatOptions {
        FormatOptions {
            logical_bytes,
            physical_bytes,
            segment_bytes: Self::DEFAULT_SEGMENT_BYTES,
            over_provisioning_percent: Self::DEFAULT_OVER_PROVISIONING_PERCENT,
        }
    }

    pub fn geometry(&self) -> Result<Geometry> {
        if self.logical_bytes == 0 || !self.logical_bytes.is_multiple_of(BLOCK_SIZE_BYTES) {
            return Err(Error::invalid(format!(
                "logical size {} is not a non-zero multiple of 4 KiB",
                self.logical_bytes
            )));
        }
        if self.physical_bytes == 0 {
            return Err(Error::invalid("physical size must not be zero"));
        }
        if self.segment_bytes < 64 * 1024 || !self.segment_bytes.is_multiple_of(BLOCK_SIZE_BYTES) {
            return Err(Error::invalid(format!(
                "segment size {} must be a multiple of 4 KiB and at least 64 KiB",
                self.segment_bytes
            )));
        }
        let payload = self.segment_bytes - SEGMENT_HEADER_BYTES as u64;
        let usable = self.physical_bytes.div_ceil(payload);
        // Beyond the over-provisioning: the collector's own reserve, and the space lost where a
        // record does not fit at a segment's end.
        let over_provisioning = (usable * u64::from(self.over_provisioning_percent)).div_ceil(100);
        let fragmentation = (usable * MAX_RECORD_BYTES as u64).div_ceil(payload);
        let reserve =
            over_provisioning.max(u64::from(MIN_RESERVE_SEGMENTS)) + fragmentation + GC_RESERVE_SEGMENTS as u64;
        let segment_count = u32::try_from(usable + reserve)
            .map_err(|_| Error::invalid("too many segments: use a larger segment size"))?;
        let geometry = Geometry {
            logical_blocks: self.logical_bytes / BLOCK_SIZE_BYTES,
            segment_bytes: self.segment_bytes,
            segment_count,
            usable_segments: usable as u32,
        };
        geometry.validate()?;
        Ok(geometry)
    }
}

/// Which checkpoint slot and generation are current.
#[derive(Clone, Copy, Debug)]
pub struct CheckpointCursor {
    generation: u64,
    slot: u32,
}

/// Lays an empty drive on `media`: everything trimmed, an empty checkpoint, a superblock.
pub fn format(media: &dyn BlockDevice, options: &FormatOptions) -> Result<()> {
    let geometry = options.geometry()?;
    let needed_blocks = geometry.total_bytes() / BLOCK_SIZE_BYTES;
    if media.block_count() < needed_blocks {
        return Err(Error::invalid(format!(
            "the media has {} blocks; this geometry needs {needed_blocks}",
            media.block_count()
        )));
    }
    // Trimmed blocks read as zeros: no segment header from an earlier use survives.
    media.trim(Lba(0), needed_blocks)?;
    let mut map_crc = 0;
    let zeros = vec![0u8; 1 << 20];
    let mut left = geometry.logical_blocks as usize * ENTRY_BYTES;
    while left > 0 {
        let n = left.min(zeros.len());
        map_crc = crc32c::crc32c_append(map_crc, &zeros[..n]);
        left -= n;
    }
    let header =
        CheckpointHeader { generation: 1, checkpoint_seq: 0, logical_blocks: geometry.logical_blocks, map_crc };
    media.write(Lba(geometry.checkpoint_offset(0) / BLOCK_SIZE_BYTES), &header.encode())?;
    // The checkpoint must be durable before the superblock that names it.
    media.flush()?;
    let superblock = Superblock {
        geometry,
        generation: 1,
        checkpoint_slot: 0,
        checkpoint_seq: 0,
        next_seq: 1,
        open_segments: vec![],
        counters: Counters::default(),
    };
    media.write(Lba(superblock_slot(1)), &superblock.encode())?;
    media.flush()
}

fn superblock_slot(generation: u64) -> u64 {
    generation % 2
}

fn read_blocks(media: &dyn BlockDevice, byte_offset: u64, length: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; length.div_ceil(BLOCK_SIZE) * BLOCK_SIZE];
    media.read(Lba(byte_offset / BLOCK_SIZE_BYTES), &mut buf)?;
    Ok(buf)
}

/// What one superblock slot holds.
enum Slot {
    Valid(Superblock),
    /// All zeros: never written (a drive formatted and not yet checkpointed twice).
    Empty,
    /// Not a superblock: no magic (other data, or a superblock whose magic was hit).
    Foreign,
    /// A superblock that fails its checksum or its fields' checks.
    Damaged(String),
}

fn read_slot(block: &[u8]) -> Result<Slot> {
    match Superblock::decode(block) {
        Ok(Some(superblock)) => Ok(Slot::Valid(superblock)),
        // A version this build does not read is no damage: it is said as it is.
        Err(error) if error.kind() != crate::ErrorKind::Corrupted => Err(error),
        Err(error) => Ok(Slot::Damaged(error.message().to_string())),
        Ok(None) if Superblock::has_magic(block) => Ok(Slot::Damaged("its checksum fails".into())),
        Ok(None) if block.iter().all(|&b| b == 0) => Ok(Slot::Empty),
        Ok(None) => Ok(Slot::Foreign),
    }
}

/// The valid superblocks, newest first; an error naming both slots when there is none.
fn superblocks(media: &dyn BlockDevice) -> Result<(Vec<Superblock>, Vec<String>)> {
    if media.block_count() < 2 {
        return Err(Error::invalid("the media is too small to hold a drive"));
    }
    let blocks = read_blocks(media, 0, 2 * BLOCK_SIZE)?;
    let slots = [read_slot(&blocks[..BLOCK_SIZE])?, read_slot(&blocks[BLOCK_SIZE..])?];
    let mut notes = Vec::new();
    let mut valid = Vec::new();
    for (index, slot) in slots.iter().enumerate() {
        match slot {
            Slot::Valid(superblock) => valid.push(superblock.clone()),
            Slot::Damaged(why) => notes.push(format!("superblock slot {index} is damaged ({why})")),
            Slot::Empty | Slot::Foreign => {}
        }
    }
    valid.sort_unstable_by_key(|s| std::cmp::Reverse(s.generation));
    if !valid.is_empty() {
        return Ok((valid, notes));
    }
    let describe = |slot: &Slot| match slot {
        Slot::Valid(_) => unreachable!("no slot is valid here"),
        Slot::Empty => "empty".to_string(),
        Slot::Foreign => "not a superblock".to_string(),
        Slot::Damaged(why) => format!("damaged: {why}"),
    };
    let both = format!("slot 0 {}, slot 1 {}", describe(&slots[0]), describe(&slots[1]));
    if slots.iter().any(|s| matches!(s, Slot::Damaged(_))) {
        return Err(Error::corrupted(format!(
            "both superblocks of the drive are unusable ({both}): the drive cannot be opened; \
             restore its image from a copy"
        )));
    }
    Err(Error::invalid(format!("no valid superblock: this is not a formatted Tundra drive ({both})")))
}

/// The map of the checkpoint `superblock` names, or why it cannot be used.
fn load_checkpoint(media: &dyn BlockDevice, superblock: &Superblock) -> Result<std::result::Result<Map, String>> {
    let g = superblock.geometry;
    let slot = read_blocks(
        media,
        g.checkpoint_offset(superblock.checkpoint_slot),
        (g.checkpoint_blocks() * BLOCK_SIZE_BYTES) as usize,
    )?;
    let Some(header) = CheckpointHeader::decode(&slot[..BLOCK_SIZE]) else {
        return Ok(Err("its header does not verify".into()));
    };
    if header.checkpoint_seq != superblock.checkpoint_seq || header.logical_blocks != g.logical_blocks {
        return Ok(Err("its header does not match the superblock that names it".into()));
    }
    let map_bytes = &slot[BLOCK_SIZE..][..g.logical_blocks as usize * ENTRY_BYTES];
    if crc32c::crc32c(map_bytes) != header.map_crc {
        return Ok(Err("its map fails its checksum".into()));
    }
    Ok(match Map::from_bytes(g.logical_blocks, map_bytes.to_vec()) {
        Ok(map) => Ok(map),
        Err(error) => Err(error.message().to_string()),
    })
}

/// The newest superblock whose checkpoint verifies, with its map, and notes on what was
/// damaged on the way: a damaged newest checkpoint (or superblock) falls back to the previous
/// one, which the drive keeps usable until the next is durable (see gc.rs on trim records).
fn newest_usable(media: &dyn BlockDevice) -> Result<(Superblock, Map, Vec<String>)> {
    let (candidates, mut notes) = superblocks(media)?;
    let mut refusals = Vec::new();
    for superblock in candidates {
        let g = superblock.geometry;
        if media.block_count() < g.total_bytes() / BLOCK_SIZE_BYTES {
            return Err(Error::invalid("the media is smaller than the drive's geometry"));
        }
        match load_checkpoint(media, &superblock)? {
            Ok(map) => {
                if !refusals.is_empty() {
                    notes.push(format!(
                        "{}; recovered from the checkpoint of generation {} (slot {}) and the records written since",
                        refusals.join("; "),
                        superblock.generation,
                        superblock.checkpoint_slot
                    ));
                }
                return Ok((superblock, map, notes));
            }
            Err(why) => refusals.push(format!(
                "the checkpoint of generation {} (slot {}) is damaged: {why}",
                superblock.generation, superblock.checkpoint_slot
            )),
        }
    }
    Err(Error::corrupted(format!(
        "no checkpoint of the drive verifies: {}; the drive cannot be opened",
        refusals.join("; ")
    )))
}

/// A record to replay: (sequence, record header, unit address).
type Replayed = (u64, RecordHeader, u64, u64);

/// What recovery found and did beyond the usual: damaged superblocks or checkpoints it
/// recovered around.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryNotes(pub Vec<String>);

/// Reopens a drive: the newest superblock whose checkpoint verifies, that checkpoint, then the
/// records written since.
pub fn recover(media: &dyn BlockDevice) -> Result<(Geometry, State, CheckpointCursor, RecoveryNotes)> {
    let (superblock, mut map, notes) = newest_usable(media)?;
    let g = superblock.geometry;
    let headers = read_segment_headers(media, &g)?;
    let mut replay: Vec<Replayed> = Vec::new();
    let mut tails: Vec<Tail> = Vec::new();
    for (index, header) in headers.iter().enumerate() {
        let Some(header) = header else { continue };
        let was_open = superblock.open_segments.contains(&(index as u32, header.open_seq));
        if header.open_seq > superblock.checkpoint_seq || was_open {
            tails.push(scan_segment(media, &g, *header, superblock.checkpoint_seq, &mut replay)?);
        }
    }
    replay.sort_unstable_by_key(|r| r.0);
    let mut max_seq = superblock.next_seq.saturating_sub(1);
    for &(seq, header, location, trim_count) in &replay {
        max_seq = max_seq.max(seq);
        apply(&mut map, &g, header, location, trim_count)?;
    }
    for header in headers.iter().flatten() {
        max_seq = max_seq.max(header.open_seq);
    }
    let mut segments =
        vec![
            Segment { state: SegmentState::Free, open_seq: 0, live_bytes: 0, filled_bytes: 0, sealed_seq: 0 };
            g.segment_count as usize
        ];
    for (index, header) in headers.iter().enumerate() {
        segments[index].open_seq = header.map_or(0, |h| h.open_seq);
    }
    for (lba, entry) in map.iter() {
        let (segment, offset) = g.split_location(entry.location);
        let inside = segment < g.segment_count
            && offset >= SEGMENT_HEADER_BYTES
            && offset as u64 + entry.record_bytes() <= g.segment_bytes;
        if !inside {
            return Err(Error::corrupted(format!("LBA {lba} maps outside every segment: {entry:?}")));
        }
        if headers[segment as usize].is_none() {
            return Err(Error::corrupted(format!("LBA {lba} maps into segment {segment}, which has no valid header")));
        }
    }
    let mut state = State::new(g, map, segments, max_seq + 1, superblock.checkpoint_seq);
    // Until the next checkpoint is durable, recovery must still work from this one: no trim
    // record newer than it may be collected (gc.rs).
    state.retained_checkpoint_seq = superblock.checkpoint_seq;
    state.counters = superblock.counters;
    resume_heads(media, &mut state, tails)?;
    let cursor = CheckpointCursor { generation: superblock.generation, slot: superblock.checkpoint_slot };
    Ok((g, state, cursor, RecoveryNotes(notes)))
}

fn read_segment_headers(media: &dyn BlockDevice, g: &Geometry) -> Result<Vec<Option<SegmentHeader>>> {
    let mut headers = Vec::with_capacity(g.segment_count as usize);
    let mut block = vec![0u8; BLOCK_SIZE];
    for index in 0..g.segment_count {
        media.read(Lba(g.segment_offset(index) / BLOCK_SIZE_BYTES), &mut block)?;
        headers.push(SegmentHeader::decode(&block[..SEGMENT_HEADER_BYTES]).filter(|h| h.segment == index));
    }
    Ok(headers)
}

/// Where the valid records of a scanned segment end, and its bytes up to there.
struct Tail {
    header: SegmentHeader,
    filled: usize,
    bytes: Vec<u8>,
}

/// Collects the records of one segment newer than the checkpoint, up to the first record that
/// does not verify: the end of what reached the media.
fn scan_segment(
    media: &dyn BlockDevice,
    g: &Geometry,
    header: SegmentHeader,
    checkpoint_seq: u64,
    replay: &mut Vec<Replayed>,
) -> Result<Tail> {
    let bytes = read_blocks(media, g.segment_offset(header.segment), g.segment_bytes as usize)?;
    let mut at = SEGMENT_HEADER_BYTES;
    while let Some((record, payload)) = RecordHeader::decode(header.open_seq, &bytes[at..]) {
        if record.seq > checkpoint_seq {
            let trim_count = match record.kind {
                RecordKind::Trim => trim_count(payload)?,
                _ => 0,
            };
            replay.push((record.seq, record, g.location(header.segment, at), trim_count));
        }
        at += record.record_bytes();
    }
    let mut bytes = bytes;
    bytes.truncate(at);
    Ok(Tail { header, filled: at, bytes })
}

/// Reopens the most recently opened segments that still have room as the two heads, instead of
/// abandoning them: without this every crash would strand two partly filled segments, and after
/// enough crashes live data could sit in every segment with none free for garbage collection.
/// The media past each tail is zeroed first, so that no record left there from before the
/// crash can ever be parsed as part of the resumed segment; the checkpoint that follows
/// recovery makes that durable before anything new is written.
fn resume_heads(media: &dyn BlockDevice, state: &mut State, mut tails: Vec<Tail>) -> Result<()> {
    let g = state.geometry;
    tails.retain(|t| t.filled + MAX_RECORD_BYTES <= g.segment_bytes as usize);
    tails.sort_unstable_by_key(|t| std::cmp::Reverse(t.header.open_seq));
    for (tail, head) in tails.into_iter().zip([HeadKind::User, HeadKind::Gc]) {
        let segment = tail.header.segment;
        let first = g.segment_offset(segment) / BLOCK_SIZE_BYTES;
        let tail_block = (tail.filled / BLOCK_SIZE) as u64;
        let segment_blocks = g.segment_bytes / BLOCK_SIZE_BYTES;
        // First zero what follows the tail inside its block, durably: the record that failed to
        // verify there could otherwise verify again once the blocks after it read as zeros.
        let mut block = tail.bytes[tail_block as usize * BLOCK_SIZE..].to_vec();
        block.resize(BLOCK_SIZE, 0);
        media.write(Lba(first + tail_block), &block)?;
        media.flush()?;
        if tail_block + 1 < segment_blocks {
            media.trim(Lba(first + tail_block + 1), segment_blocks - tail_block - 1)?;
        }
        state.resume_head(head, tail.header.open_seq, segment, tail.bytes);
    }
    Ok(())
}

fn trim_count(payload: &[u8]) -> Result<u64> {
    let bytes: [u8; 8] = payload.try_into().map_err(|_| Error::corrupted("a trim record without its count"))?;
    Ok(u64::from_le_bytes(bytes))
}

fn apply(map: &mut Map, g: &Geometry, header: RecordHeader, location: u64, trim_count: u64) -> Result<()> {
    let in_range = |lba: u64, count: u64| lba.checked_add(count).is_some_and(|end| end <= g.logical_blocks);
    match header.kind {
        RecordKind::Trim => {
            if !in_range(header.lba, trim_count) {
                return Err(Error::corrupted(format!("a trim record covers blocks past the end: {header:?}")));
            }
            for lba in header.lba..header.lba + trim_count {
                map.set(lba, None);
            }
        }
        RecordKind::Deflate | RecordKind::Raw => {
            if !in_range(header.lba, 1) {
                return Err(Error::corrupted(format!("a record for an LBA past the end: {header:?}")));
            }
            let payload_units = units(header.payload_len) as u16;
            if payload_units == 0 {
                return Err(Error::corrupted(format!("a data record without payload: {header:?}")));
            }
            let raw = header.kind == RecordKind::Raw;
            map.set(header.lba, Some(MapEntry { location, payload_units, raw }));
        }
    }
    Ok(())
}

impl Shared {
    /// Writes a checkpoint of the map as of now and makes it the one recovery starts from.
    pub(crate) fn write_checkpoint(&self) -> Result<()> {
        let mut cursor = self.checkpoint.lock();
        let (map_bytes, checkpoint_seq, next_seq, open_segments, mut counters) = {
            let state = self.state.lock();
            state.check_failed()?;
            let open = [HeadKind::User, HeadKind::Gc]
                .iter()
                .filter_map(|&h| state.heads[h as usize].as_ref().map(|h| (h.segment, h.open_seq)))
                .collect::<Vec<_>>();
            (state.map.as_bytes().to_vec(), state.next_seq - 1, state.next_seq, open, state.counters)
        };
        // Every record the snapshot reflects must be durable before the checkpoint names it.
        self.flush()?;
        let g = self.geometry;
        let generation = cursor.generation + 1;
        let slot = 1 - cursor.slot;
        let header = CheckpointHeader {
            generation,
            checkpoint_seq,
            logical_blocks: g.logical_blocks,
            map_crc: crc32c::crc32c(&map_bytes),
        };
        let mut image = header.encode();
        image.extend_from_slice(&map_bytes);
        image.resize(image.len().div_ceil(BLOCK_SIZE) * BLOCK_SIZE, 0);
        counters.checkpoints += 1;
        counters.media_written_bytes += (image.len() + BLOCK_SIZE) as u64;
        let superblock = Superblock {
            geometry: g,
            generation,
            checkpoint_slot: slot,
            checkpoint_seq,
            next_seq,
            open_segments,
            counters,
        };
        let result = self
            .media
            .write(Lba(g.checkpoint_offset(slot) / BLOCK_SIZE_BYTES), &image)
            .and_then(|()| self.media.flush())
            .and_then(|()| self.media.write(Lba(superblock_slot(generation)), &superblock.encode()))
            .and_then(|()| self.media.flush());
        let mut state = self.state.lock();
        if let Err(error) = result {
            state.failed.get_or_insert_with(|| error.to_string());
            return Err(error);
        }
        *cursor = CheckpointCursor { generation, slot };
        // The checkpoint before this one stays the fallback should this one be damaged: its
        // trim records stay until the next checkpoint (gc.rs).
        state.retained_checkpoint_seq = state.durable_checkpoint_seq;
        state.durable_checkpoint_seq = checkpoint_seq;
        state.sealed_since_checkpoint = 0;
        state.counters.checkpoints += 1;
        state.counters.media_written_bytes += (image.len() + BLOCK_SIZE) as u64;
        Ok(())
    }
}
