//! The read path: a batch of blocks looked up in the map under one lock acquisition, their
//! records read from the media with one read per run of adjacent records (or taken from an open
//! segment's buffer), then each verified (checksum seeded with its segment's incarnation, LBA,
//! kind, length) and expanded. A reader holds the reuse gate, so the segments it reads cannot be
//! freed and rewritten under it.

use crate::buf::BlockBuf;
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
        self.read_ranges(&mut [(Lba(first_lba), out)])
    }

    /// [`Shared::read_blocks`] of several ranges at once, each `(first LBA, buffer)`: their
    /// map entries under one lock acquisition, and the records of all of them read together,
    /// so that records adjacent on the media take one read whichever range they belong to.
    pub(super) fn read_ranges(&self, ranges: &mut [(Lba, &mut [u8])]) -> Result<()> {
        let _gate = self.reuse_gate.read();
        let blocks: usize = ranges.iter().map(|(_, out)| out.len() / BLOCK_SIZE).sum();
        let mut wanted: Vec<Wanted> = Vec::with_capacity(blocks);
        {
            let state = self.state.lock();
            for (range, (first_lba, out)) in ranges.iter().enumerate() {
                for i in 0..(out.len() / BLOCK_SIZE) as u64 {
                    let Some(entry) = state.map.get(first_lba.0 + i) else { continue };
                    let (segment, _) = self.geometry.split_location(entry.location);
                    let in_head = state.record_in_head(entry.location, entry.record_bytes() as usize);
                    let (open_seq, bytes) = match in_head {
                        Some((open_seq, bytes)) => (open_seq, Some(bytes)),
                        None => (state.segments[segment as usize].open_seq, None),
                    };
                    wanted.push(Wanted { range, index: i as usize, entry, open_seq, bytes });
                }
            }
        }
        for (_, out) in ranges.iter_mut() {
            out.fill(0);
        }
        self.read_runs(&mut wanted)?;
        let compressed = wanted.iter().filter(|w| !w.entry.raw).count();
        self.cpu.measure(super::cpu::Work::Inflate, compressed, || {
            for w in wanted {
                let bytes = w.bytes.as_deref().expect("every record was read");
                let (first_lba, out) = &mut ranges[w.range];
                let block = &mut out[w.index * BLOCK_SIZE..][..BLOCK_SIZE];
                decode_block(first_lba.0 + w.index as u64, w.entry, w.open_seq, bytes, block)?;
            }
            Ok(())
        })
    }

    /// Fills in the bytes of every wanted record that is not in memory, merging records whose
    /// media blocks touch into one read; the reads of all the runs go to the media together
    /// ([`crate::BlockDevice::read_many`]), into block-aligned memory.
    pub(super) fn read_runs(&self, wanted: &mut [Wanted]) -> Result<()> {
        let span = |w: &Wanted| {
            let (segment, offset) = self.geometry.split_location(w.entry.location);
            let start = self.geometry.segment_offset(segment) + offset as u64;
            (start, start + w.entry.record_bytes())
        };
        let mut order: Vec<usize> = (0..wanted.len()).filter(|&i| wanted[i].bytes.is_none()).collect();
        order.sort_unstable_by_key(|&i| span(&wanted[i]).0);
        // (first media block, the run's records as a range of `order`) of each run.
        let mut runs: Vec<(u64, std::ops::Range<usize>, BlockBuf)> = Vec::new();
        let mut at = 0;
        while at < order.len() {
            let first_block = span(&wanted[order[at]]).0 / BLOCK_SIZE_BYTES;
            let mut end_block = span(&wanted[order[at]]).1.div_ceil(BLOCK_SIZE_BYTES);
            let mut next = at + 1;
            while next < order.len() && span(&wanted[order[next]]).0 / BLOCK_SIZE_BYTES <= end_block {
                end_block = end_block.max(span(&wanted[order[next]]).1.div_ceil(BLOCK_SIZE_BYTES));
                next += 1;
            }
            let buffer = BlockBuf::zeroed(((end_block - first_block) * BLOCK_SIZE_BYTES) as usize);
            runs.push((first_block, at..next, buffer));
            at = next;
        }
        let mut reads: Vec<(Lba, &mut [u8])> =
            runs.iter_mut().map(|(first_block, _, buffer)| (Lba(*first_block), &mut **buffer)).collect();
        self.media.read_many(&mut reads)?;
        drop(reads);
        for (first_block, records, buffer) in &runs {
            for &i in &order[records.clone()] {
                let (start, end) = span(&wanted[i]);
                let from = (start - first_block * BLOCK_SIZE_BYTES) as usize;
                wanted[i].bytes = Some(buffer[from..from + (end - start) as usize].to_vec());
            }
        }
        Ok(())
    }
}

/// A record a read needs: where it is, and its bytes once read.
pub(super) struct Wanted {
    /// The range of a [`Shared::read_ranges`] the block belongs to (0 for other readers).
    pub(super) range: usize,
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
