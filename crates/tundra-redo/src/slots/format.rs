//! The bytes of one per-page log slot (docs/format.md, "Per-page log slots"): a 48-byte header
//! and the page's records in the codec's record encoding, zero-padded to one 4 KiB block. An
//! all-zero block is an empty slot (never written, or trimmed), so an empty slot costs a
//! compressing drive nothing.
//!
//! The checksum covers the whole block but its own field, seeded with the slot's LBA and its
//! page: a block that lands at another LBA (a misdirected write, or a slot of another area) or
//! that holds another page's records never verifies where it is read. Decoding trusts nothing
//! and panics on no input: every field is checked before it is used, and every failure is an
//! error naming the slot's LBA.

use tundra_device::{BLOCK_SIZE, Lba};
use tundra_store::ids::Lsn;

use crate::codec::{self, encode_record};
use crate::{Error, RedoRecord, Result};

/// The slot format this build writes and reads.
pub(super) const VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"TNDRSLOT";
pub(super) const HEADER_BYTES: usize = 48;
/// Where the checksum lies in the header.
pub(super) const CRC_AT: usize = 44;
/// Bytes of records one slot holds.
pub const SLOT_RECORD_BYTES: usize = BLOCK_SIZE - HEADER_BYTES;

const _: () = assert!(HEADER_BYTES < BLOCK_SIZE);
const _: () = assert!(CRC_AT + 4 == HEADER_BYTES);

/// A slot read back: its records' bytes as stored (so a merge appends without re-encoding)
/// and the records they decode to.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct SlotContents {
    pub encoded: Vec<u8>,
    pub records: Vec<RedoRecord>,
}

impl SlotContents {
    pub fn last_lsn(&self) -> Option<Lsn> {
        self.records.last().map(|r| r.lsn)
    }
}

/// The block for `page`'s slot at `lba` holding `encoded`, the encoding of `records` (at least
/// one, strictly increasing LSNs, all of `page`, fitting [`SLOT_RECORD_BYTES`]).
pub(super) fn encode_slot(lba: Lba, page: u64, records: &[RedoRecord], encoded: &[u8]) -> Vec<u8> {
    let (first, last) = match (records.first(), records.last()) {
        (Some(first), Some(last)) => (first.lsn, last.lsn),
        _ => panic!("a slot is written with at least one record"),
    };
    assert!(encoded.len() <= SLOT_RECORD_BYTES, "a slot of {} record bytes", encoded.len());
    let count = u32::try_from(records.len()).expect("a slot's records fit its block");
    let mut block = vec![0u8; BLOCK_SIZE];
    block[0..8].copy_from_slice(MAGIC);
    block[8..12].copy_from_slice(&VERSION.to_le_bytes());
    block[12..16].copy_from_slice(&count.to_le_bytes());
    block[16..24].copy_from_slice(&page.to_le_bytes());
    block[24..32].copy_from_slice(&first.0.to_le_bytes());
    block[32..40].copy_from_slice(&last.0.to_le_bytes());
    block[40..44].copy_from_slice(&(encoded.len() as u32).to_le_bytes());
    block[HEADER_BYTES..HEADER_BYTES + encoded.len()].copy_from_slice(encoded);
    let crc = checksum(&block, lba, page);
    block[CRC_AT..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    block
}

/// The encoding of `records`, back to back.
pub(super) fn encode_records(records: &[&RedoRecord]) -> Vec<u8> {
    let mut out = Vec::with_capacity(records.iter().map(|r| codec::encoded_record_len(r)).sum());
    for record in records {
        encode_record(record, &mut out);
    }
    out
}

/// The block's checksum, seeded with where it belongs: its LBA and its page.
fn checksum(block: &[u8], lba: Lba, page: u64) -> u32 {
    let mut seed = [0u8; 16];
    seed[0..8].copy_from_slice(&lba.0.to_le_bytes());
    seed[8..16].copy_from_slice(&page.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&seed), &block[..CRC_AT]);
    crc32c::crc32c_append(crc, &block[HEADER_BYTES..])
}

/// Reads the slot of `page` from its block at `lba`, for pages of `page_size` bytes: the empty
/// slot for an all-zero block, else the records, each check passed. A block that fails a check
/// is `Corrupted`, and the message names the LBA and what failed.
pub(super) fn decode_slot(block: &[u8], lba: Lba, page: u64, page_size: u32) -> Result<SlotContents> {
    assert_eq!(block.len(), BLOCK_SIZE, "a slot is one block");
    if tundra_device::is_zero(block) {
        return Ok(SlotContents::default());
    }
    let damaged = |what: String| Error::corrupted(format!("the log slot of page {page} at {lba} {what}"));
    if &block[0..8] != MAGIC {
        return Err(damaged("is not a slot: its magic is wrong".into()));
    }
    let stored_crc = u32_at(block, CRC_AT);
    let header_page = u64_at(block, 16);
    if checksum(block, lba, page) != stored_crc {
        return Err(damaged(misplaced_or_damaged(block, lba, page, header_page, stored_crc)));
    }
    let version = u32_at(block, 8);
    if version != VERSION {
        return Err(damaged(format!("is of slot format {version}; this build reads format {VERSION}")));
    }
    if header_page != page {
        return Err(damaged(format!("holds the slot of page {header_page}")));
    }
    let count = u32_at(block, 12);
    let (first, last) = (Lsn(u64_at(block, 24)), Lsn(u64_at(block, 32)));
    let len = u32_at(block, 40) as usize;
    if count == 0 || len > SLOT_RECORD_BYTES || first > last {
        return Err(damaged(format!(
            "has a header that cannot be: {count} records, {len} bytes, LSNs {first}..{last}"
        )));
    }
    let encoded = &block[HEADER_BYTES..HEADER_BYTES + len];
    let records = codec::decode_records(encoded, count, page_size).map_err(|e| damaged(e.message().to_string()))?;
    check_records(&records, page, first, last).map_err(damaged)?;
    Ok(SlotContents { encoded: encoded.to_vec(), records })
}

/// Why a block whose checksum fails where it was read fails: it may verify as the slot of the
/// page its header names, at the LBA that page's slot would have if `lba` is `page`'s, which
/// is a write that landed in the wrong block.
fn misplaced_or_damaged(block: &[u8], lba: Lba, page: u64, header_page: u64, stored_crc: u32) -> String {
    let home = lba.0.checked_sub(page).and_then(|first| first.checked_add(header_page)).map(Lba);
    match home {
        Some(home) if header_page != page && checksum(block, home, header_page) == stored_crc => {
            format!("holds the slot of page {header_page}, written for {home}: a misdirected write")
        }
        _ => "fails its checksum".to_string(),
    }
}

/// The decoded records against the header: all of `page`, LSNs strictly increasing from
/// `first` to `last`.
fn check_records(records: &[RedoRecord], page: u64, first: Lsn, last: Lsn) -> std::result::Result<(), String> {
    if let Some(other) = records.iter().find(|r| r.page != page) {
        return Err(format!("holds a record of page {} at LSN {}", other.page, other.lsn));
    }
    if records.windows(2).any(|pair| pair[0].lsn >= pair[1].lsn) {
        return Err("holds records out of LSN order".into());
    }
    let (got_first, got_last) = (records[0].lsn, records[records.len() - 1].lsn);
    if (got_first, got_last) != (first, last) {
        return Err(format!("says LSNs {first}..{last} but holds {got_first}..{got_last}"));
    }
    Ok(())
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut array = [0u8; 4];
    array.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(array)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut array = [0u8; 8];
    array.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(array)
}
