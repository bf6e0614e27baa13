//! Image cells (seed 000 §3.3.3: "a slot that would overflow makes the page materialize, or
//! writes an extra image above LSN_min for lagging readers"). A page whose slot is full and
//! whose records LSN_min keeps from being folded gets an extra image: the page as of its oldest
//! record still in memory, written to a cell together with the records its slot held. The slot
//! is then emptied for the records that follow, and the records the image stands for leave
//! memory. Every version a reader may ask for stays two device reads away:
//!
//! - below the image: the store's image (or the previous cell's image) and this cell's
//!   records block;
//! - at or above it: this cell's image and the records after it (the slot, or the next cell's
//!   records block once that page overflows again).
//!
//! A cell is `1 + image blocks` consecutive blocks at the top of a stream's slot region (docs/
//! format.md, "Image cells"): block 0 is a records block in the slot's own format (seeded with
//! the cell's LBA), the next blocks an image header and the page's bytes. Cells are a cache of
//! the redo log like slots: the owner clears them with the slots when it opens a volume, so
//! which cells are in use is kept in memory only. A cell is freed (trimmed: it costs the drive
//! nothing again) once a fold has materialized its page past every record and image it holds.

use tundra_device::{BLOCK_SIZE, Lba};
use tundra_store::ids::Lsn;

use super::format::{decode_slot, encode_records, encode_slot};
use crate::{Error, RedoRecord, Result};

const MAGIC: &[u8; 8] = b"TNDRXIMG";
/// The image format this build writes and reads.
const VERSION: u32 = 1;
const IMAGE_HEADER_BYTES: usize = 48;
const IMAGE_CRC_AT: usize = 44;

/// The share of a slot region set aside for cells: its last eighth.
pub(super) const CELL_SHARE: u64 = 8;

/// Blocks a cell takes for pages of `page_size` bytes: the records block, then the image
/// header and the page.
pub(super) fn cell_blocks(page_size: u32) -> u64 {
    1 + (IMAGE_HEADER_BYTES as u64 + u64::from(page_size)).div_ceil(BLOCK_SIZE as u64)
}

/// The blocks of a cell whose records block is at `lba`: `records` (the slot's, strictly
/// increasing LSNs, all of `page`; a zero block when there are none) and the image of `page`
/// as of `lsn`.
pub(super) fn encode_cell(lba: Lba, page: u64, records: &[RedoRecord], lsn: Lsn, image: &[u8]) -> Vec<u8> {
    let page_size = u32::try_from(image.len()).expect("a page's size fits 32 bits");
    let mut run = vec![0u8; cell_blocks(page_size) as usize * BLOCK_SIZE];
    if !records.is_empty() {
        let refs: Vec<&RedoRecord> = records.iter().collect();
        let block = encode_slot(lba, page, records, &encode_records(&refs));
        run[..BLOCK_SIZE].copy_from_slice(&block);
    }
    let header_lba = lba.offset_by(1);
    let body = &mut run[BLOCK_SIZE..];
    body[0..8].copy_from_slice(MAGIC);
    body[8..12].copy_from_slice(&VERSION.to_le_bytes());
    body[12..16].copy_from_slice(&page_size.to_le_bytes());
    body[16..24].copy_from_slice(&page.to_le_bytes());
    body[24..32].copy_from_slice(&lsn.0.to_le_bytes());
    body[IMAGE_HEADER_BYTES..IMAGE_HEADER_BYTES + image.len()].copy_from_slice(image);
    let crc = image_checksum(body, header_lba, page);
    body[IMAGE_CRC_AT..IMAGE_HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    run
}

/// The checksum of an image's blocks, seeded with where they belong: the header's LBA and
/// the page.
fn image_checksum(body: &[u8], header_lba: Lba, page: u64) -> u32 {
    let mut seed = [0u8; 16];
    seed[0..8].copy_from_slice(&header_lba.0.to_le_bytes());
    seed[8..16].copy_from_slice(&page.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&seed), &body[..IMAGE_CRC_AT]);
    crc32c::crc32c_append(crc, &body[IMAGE_HEADER_BYTES..])
}

/// The records of a cell's records block at `lba`, every check of a slot passed.
pub(super) fn decode_cell_records(block: &[u8], lba: Lba, page: u64, page_size: u32) -> Result<Vec<RedoRecord>> {
    decode_slot(block, lba, page, page_size)
        .map(|contents| contents.records)
        .map_err(|e| Error::corrupted(format!("the image cell at {lba}: {}", e.message())))
}

/// The image of `page` as of `lsn` from a cell's image blocks (`body`, read from `header_lba`
/// on): every field checked, and anything else is `Corrupted`, naming the LBA.
pub(super) fn decode_cell_image(body: &[u8], header_lba: Lba, page: u64, lsn: Lsn, page_size: u32) -> Result<Vec<u8>> {
    let damaged = |what: String| {
        Error::corrupted(format!("the extra image of page {page} at LSN {lsn} in the cell at {header_lba} {what}"))
    };
    let end = IMAGE_HEADER_BYTES + page_size as usize;
    if body.len() < end {
        return Err(damaged(format!("is {} bytes, short of a header and a page of {page_size}", body.len())));
    }
    if tundra_device::is_zero(body) {
        return Err(damaged("holds no image".into()));
    }
    if &body[0..8] != MAGIC {
        return Err(damaged("is not an image: its magic is wrong".into()));
    }
    let stored_crc = u32::from_le_bytes(body[IMAGE_CRC_AT..IMAGE_HEADER_BYTES].try_into().expect("4 bytes"));
    if image_checksum(body, header_lba, page) != stored_crc {
        return Err(damaged("fails its checksum".into()));
    }
    let field32 = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes"));
    let field64 = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
    if field32(8) != VERSION {
        return Err(damaged(format!("is of image format {}; this build reads format {VERSION}", field32(8))));
    }
    if field32(12) != page_size || field64(16) != page || field64(24) != lsn.0 {
        return Err(damaged(format!(
            "holds the image of page {} at LSN {}, {} bytes",
            field64(16),
            field64(24),
            field32(12)
        )));
    }
    Ok(body[IMAGE_HEADER_BYTES..end].to_vec())
}
