//! The regions of a data directory's two image files, found by parsing a pristine image.
//!
//! The drive's structures are decoded with `tundra_device::csd::layout`, which is public. The
//! journals' superblocks, checkpoint headers and log blocks are private to tundra-store's
//! journal.rs, so they are parsed here from their documented format (docs/format.md, "The
//! store's journal"); the journals' places on the fast device come from the node's public
//! `Layout::fast_slices` and `JournalGeometry`.

use tundra_device::csd::layout::{CheckpointHeader, Geometry, RecordHeader, SegmentHeader, Superblock};
use tundra_env::Rng;
use tundra_node::Layout;
use tundra_store::journal::JournalGeometry;

use super::{BLOCK, Flip, Image};

const DRIVE: &str = "drive.img";
const FAST: &str = "fast.img";

/// Which part of the campaign a test runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionGroup {
    Drive,
    Journals,
    FastData,
}

/// Byte ranges of one file that hold one kind of structure.
pub struct Region {
    pub name: String,
    file: &'static str,
    ranges: Vec<(u64, u64)>,
}

impl Region {
    fn new(name: impl Into<String>, file: &'static str, ranges: Vec<(u64, u64)>) -> Region {
        Region { name: name.into(), file, ranges }
    }

    /// A seeded byte of the region and a seeded bit of it.
    pub fn pick(&self, rng: &mut Rng) -> Flip {
        let total: u64 = self.ranges.iter().map(|(a, b)| b - a).sum();
        let mut at = rng.below(total);
        let bit = rng.below(8) as u8;
        for &(start, end) in &self.ranges {
            if at < end - start {
                return Flip { file: self.file.to_string(), offset: start + at, bit };
            }
            at -= end - start;
        }
        unreachable!("the offset lies inside the ranges")
    }
}

/// Every non-empty region of `group` in `image`.
pub fn regions(image: &Image, layout: &Layout, group: RegionGroup) -> Vec<Region> {
    let regions = match group {
        RegionGroup::Drive => drive_regions(image, layout),
        RegionGroup::Journals => {
            let slices = layout.fast_slices();
            let mut r = journal_regions(image, "data journal", slices.data_journal.0, layout.data_journal_geometry());
            r.extend(journal_regions(image, "fast journal", slices.fast_journal.0, layout.fast_journal_geometry()));
            r
        }
        RegionGroup::FastData => {
            let (first, count) = layout.fast_slices().fast_data;
            vec![Region::new("fast store data blocks", FAST, written_blocks(image, FAST, first, count))]
        }
    };
    regions.into_iter().filter(|r| !r.ranges.is_empty()).collect()
}

fn block_range(block: u64) -> (u64, u64) {
    (block * BLOCK as u64, (block + 1) * BLOCK as u64)
}

/// The non-zero blocks of `file` among `count` from `first`.
fn written_blocks(image: &Image, file: &str, first: u64, count: u64) -> Vec<(u64, u64)> {
    image.files[file].1.range(first..first + count).map(|(&b, _)| block_range(b)).collect()
}

fn drive_regions(image: &Image, layout: &Layout) -> Vec<Region> {
    let g = layout.drive_format().geometry().expect("drive geometry");
    let slots: Vec<Option<Superblock>> =
        (0..2).map(|s| Superblock::decode(&image.read(DRIVE, s * BLOCK as u64, BLOCK)).ok().flatten()).collect();
    let current = slots.iter().flatten().max_by_key(|s| s.generation).expect("a valid drive superblock").clone();
    let current_slot = slots.iter().position(|s| s.as_ref() == Some(&current)).expect("current slot") as u64;
    let mut out = Vec::new();
    for slot in 0..2u64 {
        let which = if slot == current_slot { "current" } else { "older" };
        out.push(Region::new(format!("drive superblock slot {slot} ({which})"), DRIVE, vec![block_range(slot)]));
    }
    for slot in 0..2u32 {
        let which = if slot == current.checkpoint_slot { "current" } else { "older" };
        let start = g.checkpoint_offset(slot);
        let header = CheckpointHeader::decode(&image.read(DRIVE, start, BLOCK));
        out.push(Region::new(
            format!("drive checkpoint slot {slot} ({which}) header"),
            DRIVE,
            vec![(start, start + 4096)],
        ));
        if let Some(header) = header {
            let map = (start + BLOCK as u64, start + BLOCK as u64 + header.logical_blocks * 7);
            let used = used_prefix(image, map);
            out.push(Region::new(format!("drive checkpoint slot {slot} ({which}) map entries"), DRIVE, vec![used]));
        }
    }
    out.extend(segment_regions(image, &g, current.checkpoint_seq));
    out
}

/// The part of `range` up to its last non-zero byte: the map entries of LBAs ever used (a flip
/// among the all-zero entries after them is tried too, by the flips that land on zeros before).
fn used_prefix(image: &Image, (start, end): (u64, u64)) -> (u64, u64) {
    let bytes = image.read(DRIVE, start, (end - start) as usize);
    let last = bytes.iter().rposition(|&b| b != 0).map_or(7 * 64, |i| (i / 7 + 1) * 7);
    (start, start + last as u64)
}

/// Segment headers, and the headers and payloads of the records each segment's scan verifies,
/// split by whether the current checkpoint reflects them or recovery replays them.
fn segment_regions(image: &Image, g: &Geometry, checkpoint_seq: u64) -> Vec<Region> {
    let [mut headers, mut old_heads, mut new_heads, mut old_payloads, mut new_payloads]: [Vec<(u64, u64)>; 5] =
        Default::default();
    for index in 0..g.segment_count {
        let start = g.segment_offset(index);
        let Some(header) = SegmentHeader::decode(&image.read(DRIVE, start, 64)).filter(|h| h.segment == index) else {
            continue;
        };
        headers.push((start, start + 64));
        let bytes = image.read(DRIVE, start, g.segment_bytes as usize);
        let mut at = 64usize;
        while let Some((record, _)) = RecordHeader::decode(header.open_seq, &bytes[at..]) {
            let head = (start + at as u64, start + at as u64 + 16);
            let payload = (head.1, head.1 + record.payload_len as u64);
            if record.seq <= checkpoint_seq {
                old_heads.push(head);
                old_payloads.push(payload);
            } else {
                new_heads.push(head);
                new_payloads.push(payload);
            }
            at += record.record_bytes();
        }
    }
    vec![
        Region::new("drive segment headers", DRIVE, headers),
        Region::new("drive record headers, in the checkpoint", DRIVE, old_heads),
        Region::new("drive record payloads, in the checkpoint", DRIVE, old_payloads),
        Region::new("drive record headers, replayed after it", DRIVE, new_heads),
        Region::new("drive record payloads, replayed after it", DRIVE, new_payloads),
    ]
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// A block whose crc32c (of its first 4092 bytes, stored in the last 4) verifies.
fn sealed(block: &[u8]) -> bool {
    crc32c::crc32c(&block[..BLOCK - 4]) == u32_at(block, BLOCK - 4)
}

/// A journal superblock (format 2, docs/format.md): generation, the newest checkpoint's slot,
/// and that checkpoint's log position.
fn journal_superblock(block: &[u8]) -> Option<(u64, u64, u64)> {
    (sealed(block) && &block[..8] == b"TNDRJRNL").then(|| {
        let current = u64_at(block, 48);
        (u64_at(block, 32), current, u64_at(block, if current == 0 { 56 } else { 64 }))
    })
}

/// One journal's regions: superblocks, checkpoint headers and records, and the log blocks
/// before the checkpoint position (never replayed), replayed in the middle, and the newest.
fn journal_regions(image: &Image, name: &str, first_block: u64, g: JournalGeometry) -> Vec<Region> {
    let block_at = |b: u64| image.read(FAST, (first_block + b) * BLOCK as u64, BLOCK);
    let supers: Vec<_> = (0..2).map(|s| journal_superblock(&block_at(s))).collect();
    let current = supers.iter().flatten().max_by_key(|s| s.0).copied().expect("a valid journal superblock");
    let mut out = Vec::new();
    for slot in 0..2u64 {
        let which = if supers[slot as usize] == Some(current) { "current" } else { "older" };
        out.push(Region::new(
            format!("{name} superblock slot {slot} ({which})"),
            FAST,
            vec![block_range(first_block + slot)],
        ));
    }
    for slot in 0..2u64 {
        let which = if slot == current.1 { "current" } else { "older" };
        let header_block = 2 + slot * g.checkpoint_blocks;
        let header = block_at(header_block);
        let start = (first_block + header_block) * BLOCK as u64;
        out.push(Region::new(
            format!("{name} checkpoint slot {slot} ({which}) header"),
            FAST,
            vec![(start, start + 4096)],
        ));
        if sealed(&header) && &header[..8] == b"TNDRJCKP" {
            let records = (start + 4096, start + 4096 + u64_at(&header, 24));
            out.push(Region::new(format!("{name} checkpoint slot {slot} ({which}) records"), FAST, vec![records]));
        }
    }
    out.extend(log_regions(image, name, first_block, g, current.2));
    out
}

/// Log blocks by position: before `checkpoint_position`, and the chain replay reads from it.
fn log_regions(image: &Image, name: &str, first_block: u64, g: JournalGeometry, checkpoint: u64) -> Vec<Region> {
    let log_start = first_block + 2 + 2 * g.checkpoint_blocks;
    let mut by_position = std::collections::BTreeMap::new();
    for (&b, block) in image.files[FAST].1.range(log_start..log_start + g.log_blocks) {
        if crc32c::crc32c(&block[..36]) == u32_at(block, 36) && u32_at(block, 0) == 0x544a_4c42 {
            let used = 40 + u64::from(u32_at(block, 24));
            by_position.insert(u64_at(block, 8), (u64_at(block, 16), (b * BLOCK as u64, b * BLOCK as u64 + used)));
        }
    }
    let before: Vec<_> = by_position.range(..checkpoint).map(|(_, &(_, r))| r).collect();
    let mut chain = Vec::new();
    let (mut position, mut epoch) = (checkpoint, 0);
    while let Some(&(e, range)) = by_position.get(&position).filter(|(e, _)| *e >= epoch) {
        chain.push(range);
        (position, epoch) = (position + 1, e);
    }
    let newest = chain.pop().into_iter().collect();
    vec![
        Region::new(format!("{name} log blocks before the checkpoint"), FAST, before),
        Region::new(format!("{name} log blocks replayed, not the newest"), FAST, chain),
        Region::new(format!("{name} log block replayed, the newest"), FAST, newest),
    ]
}
