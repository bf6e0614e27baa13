//! The read path: a batch of blocks looked up in the map under one lock acquisition, their
//! records read from the media with one read per run of adjacent records (or taken from an open
//! segment's buffer), then each verified (checksum seeded with its segment's incarnation, LBA,
//! kind, length) and expanded. A reader holds the reuse gate, so the segments it reads cannot be
//! freed and rewritten under it.

use crate::{BLOCK_SIZE, BLOCK_SIZE_BYTES, Error, Lba, Result};

use super::Shared;
use super::deflate::decompress_block;
use super::layout::{RecordHeader, RecordKind, units};
use super::map::MapEntry;

/// Blocks looked up under one lock acquisition when reading.
pub(super) const READ_BATCH_BLOCKS: usize = 64;

impl Shared {
    /// Reads consecutive blocks: every map entry under one lock acquisition, then the records
    /// from the media, one read per run of records that lie in adjacent media blocks (blocks
    /// written together usually do), then verification and decompression of each.
    pub(super) fn read_blocks(&self, first_lba: u64, out: &mut [u8]) -> Result<()> {
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
        let compressed = wanted.iter().filter(|w| !w.entry.raw).count();
        self.cpu.measure(super::cpu::Work::Inflate, compressed, || {
            for w in wanted {
                let bytes = w.bytes.as_deref().expect("every record was read");
                let block = &mut out[w.index * BLOCK_SIZE..][..BLOCK_SIZE];
                decode_block(first_lba + w.index as u64, w.entry, w.open_seq, bytes, block)?;
            }
            Ok(())
        })
    }

    /// Fills in the bytes of every wanted record that is not in memory, merging records whose
    /// media blocks touch into one read.
    pub(super) fn read_runs(&self, wanted: &mut [Wanted]) -> Result<()> {
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
}

/// A record a read needs: where it is, and its bytes once read.
pub(super) struct Wanted {
    pub(super) index: usize,
    pub(super) entry: MapEntry,
    pub(super) open_seq: u64,
    pub(super) bytes: Option<Vec<u8>>,
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
