//! The drive's in-memory state and the operations on it that do no I/O of their own: the map and
//! its accounting, the segment table, the open segments' buffers, victim choice.
//!
//! Everything here runs under the drive's state lock. Appending a record only copies it into an
//! open segment's buffer; the buffer reaches the media when the segment is sealed or flushed
//! ([`State::write_head`]), which is the one place this module touches the media.

use std::collections::VecDeque;

use crate::{BlockDevice, Error, Lba, Result};

use super::layout::{
    Geometry, MAX_PAYLOAD_BYTES, RECORD_HEADER_BYTES, RecordHeader, RecordKind, SEGMENT_HEADER_BYTES, SegmentHeader,
};
use super::map::{Map, MapEntry};
use super::{Counters, DeferredBlock, GcPolicy};

/// Free segments that user writes may not take: garbage collection relocates into them.
pub const GC_RESERVE_SEGMENTS: usize = 2;
/// An open segment is replaced after this many sequence numbers, far below the 2^39 that the
/// 40-bit sequence field of its records can tell apart.
const ROTATE_AFTER_SEQS: u64 = 1 << 30;
/// An open segment's buffer is written to the media once this much of it is unwritten.
const WRITE_BEHIND_BYTES: usize = 128 * 1024;
/// The largest record: a raw block behind its header.
pub const MAX_RECORD_BYTES: usize = RECORD_HEADER_BYTES + MAX_PAYLOAD_BYTES;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentState {
    /// Holds nothing anyone needs; may be opened.
    Free,
    /// An open head appends to it.
    Open,
    /// Full (or left behind by recovery); its records stay until collected.
    Sealed,
    /// Garbage collection is relocating its live records.
    Collecting,
    /// Emptied by garbage collection; reusable once the relocations are durable and no reader
    /// can still be reading it.
    PendingFree,
}

#[derive(Clone, Copy, Debug)]
pub struct Segment {
    pub state: SegmentState,
    /// The incarnation: seeds the checksums of the records written since it was opened.
    pub open_seq: u64,
    /// Bytes of live records (header and padding included).
    pub live_bytes: u64,
    /// Bytes filled, segment header included.
    pub filled_bytes: u64,
    /// Sequence number when sealed, the age used by cost-benefit victim choice.
    pub sealed_seq: u64,
}

/// Which open segment a record goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadKind {
    User = 0,
    Gc = 1,
}

/// An open segment: its whole content in memory, and how much of it the media has.
pub struct Head {
    pub segment: u32,
    pub open_seq: u64,
    pub buf: Vec<u8>,
    pub filled: usize,
    /// Bytes already written to the media (not necessarily flushed).
    pub written: usize,
}

pub struct State {
    pub geometry: Geometry,
    pub map: Map,
    pub segments: Vec<Segment>,
    pub free: Vec<u32>,
    pub pending_free: Vec<u32>,
    pub heads: [Option<Head>; 2],
    pub next_seq: u64,
    /// The checkpoint the superblock names: records up to this sequence are reflected in it.
    pub durable_checkpoint_seq: u64,
    /// The checkpoint before it, which recovery falls back to if the newest is damaged: trim
    /// records newer than this must survive garbage collection.
    pub retained_checkpoint_seq: u64,
    pub live_bytes: u64,
    pub payload_bytes: u64,
    pub mapped_blocks: u64,
    /// Physical bytes promised to admitted writes that are still appending.
    pub reserved_bytes: u64,
    pub sealed_since_checkpoint: u32,
    /// Raw records waiting for background compression: (LBA, location).
    pub deferred: VecDeque<DeferredBlock>,
    /// Blocks taken off `deferred` by a compression pass that has not installed their
    /// compressed copies yet: still raw on the media, so still pending for anyone who waits for
    /// the drive to settle.
    pub deferred_in_flight: u64,
    /// Set when a media write failed part-way: memory may be ahead of the media, so the drive
    /// refuses everything until it is reopened and recovered.
    pub failed: Option<String>,
    pub counters: Counters,
}

impl State {
    pub fn new(geometry: Geometry, map: Map, segments: Vec<Segment>, next_seq: u64, checkpoint_seq: u64) -> State {
        let mut state = State {
            geometry,
            map,
            free: Vec::new(),
            pending_free: Vec::new(),
            heads: [None, None],
            next_seq,
            durable_checkpoint_seq: checkpoint_seq,
            retained_checkpoint_seq: checkpoint_seq,
            live_bytes: 0,
            payload_bytes: 0,
            mapped_blocks: 0,
            reserved_bytes: 0,
            sealed_since_checkpoint: 0,
            deferred: VecDeque::new(),
            deferred_in_flight: 0,
            failed: None,
            counters: Counters::default(),
            segments,
        };
        state.rebuild_accounting();
        state
    }

    /// Recomputes every derived count from the map and segment table.
    fn rebuild_accounting(&mut self) {
        for segment in &mut self.segments {
            segment.live_bytes = 0;
        }
        let (mut live, mut payload, mut mapped) = (0, 0, 0);
        for (_, entry) in self.map.iter() {
            let (segment, _) = self.geometry.split_location(entry.location);
            self.segments[segment as usize].live_bytes += entry.record_bytes();
            live += entry.record_bytes();
            payload += entry.payload_bytes();
            mapped += 1;
        }
        (self.live_bytes, self.payload_bytes, self.mapped_blocks) = (live, payload, mapped);
        self.free.clear();
        for (index, segment) in self.segments.iter_mut().enumerate().rev() {
            if segment.live_bytes == 0 {
                segment.state = SegmentState::Free;
                self.free.push(index as u32);
            } else {
                segment.state = SegmentState::Sealed;
                segment.filled_bytes = self.geometry.segment_bytes;
                segment.sealed_seq = segment.open_seq;
            }
        }
    }

    pub fn check_failed(&self) -> Result<()> {
        match &self.failed {
            Some(reason) => Err(Error::closed(format!("the drive stopped after a media error ({reason}); reopen it"))),
            None => Ok(()),
        }
    }

    pub fn take_seq(&mut self) -> Result<u64> {
        self.next_seq += 1;
        Ok(self.next_seq - 1)
    }

    /// Points `lba` at `entry` (or unmaps it), keeping every count in step.
    pub fn replace(&mut self, lba: u64, entry: Option<MapEntry>) {
        if let Some(old) = self.map.get(lba) {
            let (segment, _) = self.geometry.split_location(old.location);
            let segment = &mut self.segments[segment as usize];
            assert!(segment.live_bytes >= old.record_bytes());
            segment.live_bytes -= old.record_bytes();
            self.live_bytes -= old.record_bytes();
            self.payload_bytes -= old.payload_bytes();
            self.mapped_blocks -= 1;
        }
        if let Some(new) = entry {
            let (segment, _) = self.geometry.split_location(new.location);
            self.segments[segment as usize].live_bytes += new.record_bytes();
            self.live_bytes += new.record_bytes();
            self.payload_bytes += new.payload_bytes();
            self.mapped_blocks += 1;
        }
        self.map.set(lba, entry);
    }

    /// Bytes the user head can still take without garbage collection, counting whole free
    /// segments beyond the collector's reserve.
    pub fn user_room(&self) -> u64 {
        let head = self.heads[HeadKind::User as usize].as_ref().map_or(0, |h| (h.buf.len() - h.filled) as u64);
        let spare = self.free.len().saturating_sub(GC_RESERVE_SEGMENTS) as u64;
        head + spare * (self.geometry.segment_payload_bytes() - MAX_RECORD_BYTES as u64)
    }

    /// Appends a record to a head, opening a new segment when the head is full. The user head
    /// never takes the collector's reserve: the caller checked [`State::user_room`].
    pub fn append(
        &mut self,
        media: &dyn BlockDevice,
        head: HeadKind,
        header: RecordHeader,
        payload: &[u8],
    ) -> Result<u64> {
        let bytes = header.record_bytes();
        let reserve = if head == HeadKind::User { GC_RESERVE_SEGMENTS } else { 0 };
        let (fits, stale) = match self.heads[head as usize].as_ref() {
            Some(h) => (h.filled + bytes <= h.buf.len(), h.open_seq + ROTATE_AFTER_SEQS < self.next_seq),
            None => (false, false),
        };
        // A segment open for very long is rotated, so that its records' 40-bit sequence fields
        // stay near its incarnation; if no segment is free the rotation waits.
        if !fits || (stale && self.free.len() > reserve) {
            self.open_head(media, head)?;
        }
        let geometry = self.geometry;
        let h = self.heads[head as usize].as_mut().expect("opened above");
        let offset = h.filled;
        header.encode_into(h.open_seq, payload, &mut h.buf[offset..offset + bytes]);
        h.filled += bytes;
        let behind = h.filled - h.written;
        let location = geometry.location(h.segment, offset);
        self.segments[h.segment as usize].filled_bytes = h.filled as u64;
        self.counters.media_appended_bytes += bytes as u64;
        if behind >= WRITE_BEHIND_BYTES {
            // Write the buffer out in steps rather than all at sealing, so that no single
            // append pays for writing a whole segment.
            self.write_head(media, head)?;
        }
        Ok(location)
    }

    fn open_head(&mut self, media: &dyn BlockDevice, head: HeadKind) -> Result<()> {
        self.seal_head(media, head)?;
        let reserve = if head == HeadKind::User { GC_RESERVE_SEGMENTS } else { 0 };
        if self.free.len() <= reserve {
            return Err(Error::drive_full("no free segment for an open head"));
        }
        let segment = self.free.pop().expect("checked non-empty");
        let open_seq = self.take_seq()?;
        let mut buf = vec![0u8; self.geometry.segment_bytes as usize];
        buf[..SEGMENT_HEADER_BYTES].copy_from_slice(&SegmentHeader { segment, open_seq }.encode());
        let info = &mut self.segments[segment as usize];
        assert_eq!(info.state, SegmentState::Free);
        *info = Segment {
            state: SegmentState::Open,
            open_seq,
            live_bytes: 0,
            filled_bytes: SEGMENT_HEADER_BYTES as u64,
            sealed_seq: 0,
        };
        self.heads[head as usize] = Some(Head { segment, open_seq, buf, filled: SEGMENT_HEADER_BYTES, written: 0 });
        Ok(())
    }

    /// Makes a segment found by recovery an open head again, appending after `content`, the
    /// bytes of its valid records.
    pub fn resume_head(&mut self, head: HeadKind, open_seq: u64, segment: u32, content: Vec<u8>) {
        assert!(self.heads[head as usize].is_none());
        let filled = content.len();
        let mut buf = content;
        buf.resize(self.geometry.segment_bytes as usize, 0);
        let info = &mut self.segments[segment as usize];
        assert!(matches!(info.state, SegmentState::Free | SegmentState::Sealed));
        if info.state == SegmentState::Free {
            self.free.retain(|&s| s != segment);
        }
        *info = Segment { state: SegmentState::Open, open_seq, filled_bytes: filled as u64, sealed_seq: 0, ..*info };
        self.heads[head as usize] = Some(Head { segment, open_seq, buf, filled, written: filled });
    }

    /// Writes a head's remaining bytes and closes it.
    pub fn seal_head(&mut self, media: &dyn BlockDevice, head: HeadKind) -> Result<()> {
        if self.heads[head as usize].is_none() {
            return Ok(());
        }
        self.write_head(media, head)?;
        let h = self.heads[head as usize].take().expect("checked above");
        let seq = self.next_seq;
        let info = &mut self.segments[h.segment as usize];
        info.state = SegmentState::Sealed;
        info.sealed_seq = seq;
        self.sealed_since_checkpoint += 1;
        Ok(())
    }

    /// Writes the part of a head the media does not have yet, rewriting its last partial block
    /// (a single block write is atomic, docs/format.md). Not flushed.
    pub fn write_head(&mut self, media: &dyn BlockDevice, head: HeadKind) -> Result<()> {
        let segment_offset;
        let (from, to);
        {
            let Some(h) = self.heads[head as usize].as_ref() else { return Ok(()) };
            if h.written == h.filled {
                return Ok(());
            }
            from = h.written / crate::BLOCK_SIZE * crate::BLOCK_SIZE;
            to = h.filled.div_ceil(crate::BLOCK_SIZE) * crate::BLOCK_SIZE;
            segment_offset = self.geometry.segment_offset(h.segment);
            let lba = Lba((segment_offset + from as u64) / crate::BLOCK_SIZE_BYTES);
            if let Err(e) = media.write(lba, &h.buf[from..to]) {
                self.failed = Some(e.to_string());
                return Err(e);
            }
        }
        let h = self.heads[head as usize].as_mut().expect("checked above");
        h.written = h.filled;
        self.counters.media_written_bytes += (to - from) as u64;
        Ok(())
    }

    /// The bytes of a record if it sits in an open head's buffer.
    pub fn record_in_head(&self, location: u64, record_bytes: usize) -> Option<(u64, Vec<u8>)> {
        let (segment, offset) = self.geometry.split_location(location);
        self.heads
            .iter()
            .flatten()
            .find(|h| h.segment == segment)
            .map(|h| (h.open_seq, h.buf[offset..offset + record_bytes].to_vec()))
    }

    /// The segment garbage collection should empty next, if any would free space. With no free
    /// segment left, only a victim whose live records fit in the collector's open head will do.
    pub fn choose_victim(&self, policy: GcPolicy) -> Option<u32> {
        let capacity = self.geometry.segment_payload_bytes() as f64;
        let min_gain = MAX_RECORD_BYTES as u64;
        let max_live = if self.free.is_empty() {
            self.heads[HeadKind::Gc as usize].as_ref().map_or(0, |h| (h.buf.len() - h.filled) as u64)
        } else {
            u64::MAX
        };
        let candidates = self.segments.iter().enumerate().filter(|(_, s)| {
            s.state == SegmentState::Sealed
                && s.live_bytes + min_gain <= self.geometry.segment_payload_bytes()
                && s.live_bytes <= max_live
        });
        let score = |s: &Segment| -> f64 {
            let used = s.live_bytes as f64 / capacity;
            match policy {
                GcPolicy::Greedy => -used,
                GcPolicy::CostBenefit => {
                    let age = (self.next_seq - s.sealed_seq.min(self.next_seq)) as f64 + 1.0;
                    (1.0 - used) * age / (1.0 + used)
                }
            }
        };
        candidates.max_by(|a, b| score(a.1).total_cmp(&score(b.1))).map(|(index, _)| index as u32)
    }

    /// Expensive consistency checks for tests: every count matches a recount from the map.
    pub fn check_invariants(&self) {
        let mut live = vec![0u64; self.segments.len()];
        let mut payload = 0;
        for (_, entry) in self.map.iter() {
            let (segment, offset) = self.geometry.split_location(entry.location);
            assert!(offset >= SEGMENT_HEADER_BYTES);
            let state = self.segments[segment as usize].state;
            assert!(
                matches!(state, SegmentState::Open | SegmentState::Sealed | SegmentState::Collecting),
                "a live record in a {state:?} segment"
            );
            live[segment as usize] += entry.record_bytes();
            payload += entry.payload_bytes();
        }
        for (index, segment) in self.segments.iter().enumerate() {
            assert_eq!(segment.live_bytes, live[index], "live bytes of segment {index}");
        }
        assert_eq!(self.live_bytes, live.iter().sum::<u64>());
        assert_eq!(self.payload_bytes, payload);
        for &segment in &self.free {
            assert_eq!(self.segments[segment as usize].state, SegmentState::Free);
        }
        let free_count = self.segments.iter().filter(|s| s.state == SegmentState::Free).count();
        assert_eq!(free_count, self.free.len());
    }

    /// Records a header for `kind` at `lba` with the next sequence number.
    pub fn header(&mut self, kind: RecordKind, lba: u64, payload_len: usize) -> Result<RecordHeader> {
        Ok(RecordHeader { lba, seq: self.take_seq()?, kind, payload_len })
    }
}
