//! One table block, the bucket a key hashes to (seed 001 §3.3.2, Figure 4): a small header and
//! the records packed after it, the rest of the 4 KiB left as zeros so that the compressing
//! drive stores only what is used. A bucket whose records did not all fit carries the overflow
//! flag: some of its keys live in the overflow store, and a lookup that misses in the block
//! must look there.
//!
//! Header (12 bytes, little-endian): magic `u16` 0x4B48, flags `u8` (bit 0: overflow), a zero
//! byte, record count `u16`, record bytes `u16`, CRC32C `u32` of the header (CRC field zeroed)
//! and the record bytes, seeded with the block's LBA so that a block read from the wrong
//! address never verifies. Record: key length `u8`, value length `u16`, key, value.

use tundra_device::{BLOCK_SIZE, Lba};

use crate::layout::Key;
use crate::{Error, MAX_KEY_BYTES, MAX_VALUE_BYTES, Result};

const MAGIC: u16 = 0x4B48;
pub const HEADER_BYTES: usize = 12;
const RECORD_HEADER_BYTES: usize = 3;
const FLAG_OVERFLOW: u8 = 1;

/// Bytes a record of this key and value takes in a block.
pub fn record_bytes(key: &Key, value_len: usize) -> usize {
    RECORD_HEADER_BYTES + key.as_bytes().len() + value_len
}

/// A bucket decoded for changing it; lookups use [`find`] on the raw block instead.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub overflow: bool,
    records: Vec<(Key, Vec<u8>)>,
}

impl Bucket {
    /// Decodes and verifies the block at `lba`. An all-zero block is an empty bucket.
    pub fn decode(lba: Lba, block: &[u8]) -> Result<Bucket> {
        let mut bucket = Bucket::default();
        let Some(view) = View::parse(lba, block)? else { return Ok(bucket) };
        bucket.overflow = view.overflow;
        for record in view.records() {
            let (key, value) = record?;
            bucket.records.push((Key::new(key).expect("length checked by the walk"), value.to_vec()));
        }
        Ok(bucket)
    }

    /// The block holding this bucket: all zeros when it holds nothing and no overflow.
    pub fn encode(&self, lba: Lba) -> Vec<u8> {
        let mut block = vec![0u8; BLOCK_SIZE];
        if self.records.is_empty() && !self.overflow {
            return block;
        }
        let mut at = HEADER_BYTES;
        for (key, value) in &self.records {
            let k = key.as_bytes();
            block[at] = k.len() as u8;
            block[at + 1..at + 3].copy_from_slice(&(value.len() as u16).to_le_bytes());
            block[at + 3..at + 3 + k.len()].copy_from_slice(k);
            block[at + 3 + k.len()..at + 3 + k.len() + value.len()].copy_from_slice(value);
            at += record_bytes(key, value.len());
        }
        assert!(at <= BLOCK_SIZE, "a bucket's records outgrew its block");
        block[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        block[2] = if self.overflow { FLAG_OVERFLOW } else { 0 };
        block[4..6].copy_from_slice(&(self.records.len() as u16).to_le_bytes());
        block[6..8].copy_from_slice(&((at - HEADER_BYTES) as u16).to_le_bytes());
        let crc = block_crc(lba, &block[..at]);
        block[8..12].copy_from_slice(&crc.to_le_bytes());
        block
    }

    pub fn get(&self, key: &Key) -> Option<&[u8]> {
        self.records.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_slice())
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.records.iter().map(|(k, _)| k)
    }

    fn used_bytes(&self) -> usize {
        HEADER_BYTES + self.records.iter().map(|(k, v)| record_bytes(k, v.len())).sum::<usize>()
    }

    /// Sets `key` to `value` in the block if the block has room for it; false (and nothing
    /// changed) when it does not.
    pub fn try_put(&mut self, key: Key, value: &[u8]) -> bool {
        let old = self.records.iter().position(|(k, _)| *k == key);
        let freed = old.map_or(0, |i| record_bytes(&key, self.records[i].1.len()));
        if self.used_bytes() - freed + record_bytes(&key, value.len()) > BLOCK_SIZE {
            return false;
        }
        match old {
            Some(i) => self.records[i].1 = value.to_vec(),
            None => self.records.push((key, value.to_vec())),
        }
        true
    }

    /// Removes `key`; true when it was there.
    pub fn remove(&mut self, key: &Key) -> bool {
        let before = self.records.len();
        self.records.retain(|(k, _)| k != key);
        self.records.len() != before
    }
}

/// Looks `key` up in the raw block at `lba` without decoding the rest: `Found(value)`,
/// or `Missing { overflow }` saying whether the overflow store must be asked.
pub fn find(lba: Lba, block: &[u8], key: &Key) -> Result<Lookup> {
    let Some(view) = View::parse(lba, block)? else { return Ok(Lookup::Missing { overflow: false }) };
    for record in view.records() {
        let (k, value) = record?;
        if k == key.as_bytes() {
            return Ok(Lookup::Found(value.to_vec()));
        }
    }
    Ok(Lookup::Missing { overflow: view.overflow })
}

/// What a block says about a key.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    Found(Vec<u8>),
    Missing { overflow: bool },
}

/// A verified block's header and record bytes.
struct View<'a> {
    lba: Lba,
    overflow: bool,
    count: usize,
    records: &'a [u8],
}

impl<'a> View<'a> {
    /// Verifies the header and checksum. `None` for an all-zero (never written) block.
    fn parse(lba: Lba, block: &'a [u8]) -> Result<Option<View<'a>>> {
        assert_eq!(block.len(), BLOCK_SIZE);
        let magic = u16::from_le_bytes([block[0], block[1]]);
        if magic == 0 && tundra_device::is_zero(&block[..HEADER_BYTES]) {
            return Ok(None);
        }
        let bad = |what: &str| Error::corrupted(format!("table block at {lba}: {what}"));
        if magic != MAGIC {
            return Err(bad("not a bucket (bad magic)"));
        }
        if block[2] & !FLAG_OVERFLOW != 0 || block[3] != 0 {
            return Err(bad("unknown flags"));
        }
        let count = usize::from(u16::from_le_bytes([block[4], block[5]]));
        let used = usize::from(u16::from_le_bytes([block[6], block[7]]));
        if HEADER_BYTES + used > BLOCK_SIZE {
            return Err(bad("record bytes run past the block"));
        }
        let stored = u32::from_le_bytes(block[8..12].try_into().expect("4 bytes"));
        if stored != block_crc(lba, &block[..HEADER_BYTES + used]) {
            return Err(bad("checksum mismatch"));
        }
        let records = &block[HEADER_BYTES..HEADER_BYTES + used];
        Ok(Some(View { lba, overflow: block[2] & FLAG_OVERFLOW != 0, count, records }))
    }

    /// The records, each checked to lie inside the record bytes; exactly `count` of them must
    /// fill the record bytes.
    fn records(&self) -> impl Iterator<Item = Result<(&'a [u8], &'a [u8])>> + '_ {
        let mut at = 0usize;
        let mut seen = 0usize;
        let lba = self.lba;
        std::iter::from_fn(move || {
            if seen == self.count {
                return (at != self.records.len())
                    .then(|| Err(Error::corrupted(format!("table block at {lba}: bytes after its last record"))));
            }
            seen += 1;
            let rest = &self.records[at..];
            let bad = || Error::corrupted(format!("table block at {lba}: record {} is malformed", seen - 1));
            if rest.len() < RECORD_HEADER_BYTES {
                return Some(Err(bad()));
            }
            let key_len = usize::from(rest[0]);
            let value_len = usize::from(u16::from_le_bytes([rest[1], rest[2]]));
            let end = RECORD_HEADER_BYTES + key_len + value_len;
            if key_len == 0 || key_len > MAX_KEY_BYTES || value_len > MAX_VALUE_BYTES || end > rest.len() {
                return Some(Err(bad()));
            }
            at += end;
            Some(Ok((&rest[3..3 + key_len], &rest[3 + key_len..end])))
        })
    }
}

fn block_crc(lba: Lba, bytes: &[u8]) -> u32 {
    let seeded = crc32c::crc32c(&lba.0.to_le_bytes());
    let header = crc32c::crc32c_append(seeded, &bytes[..8]);
    crc32c::crc32c_append(header, &bytes[HEADER_BYTES..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> Key {
        Key::new(&[i.to_be_bytes(), (!i).to_be_bytes()].concat()).unwrap()
    }

    #[test]
    fn nine_paper_sized_records_fit_and_a_tenth_does_not() {
        let mut bucket = Bucket::default();
        for i in 0..9 {
            assert!(bucket.try_put(key(i), &[i as u8; 400]), "record {i} should fit");
        }
        assert!(!bucket.try_put(key(9), &[9; 400]));
        assert!(bucket.try_put(key(3), &[33; 400]), "replacing in place needs no new room");
        let lba = Lba(77);
        let block = bucket.encode(lba);
        assert_eq!(Bucket::decode(lba, &block).unwrap(), bucket);
        assert_eq!(find(lba, &block, &key(3)).unwrap(), Lookup::Found(vec![33; 400]));
        assert_eq!(find(lba, &block, &key(9)).unwrap(), Lookup::Missing { overflow: false });
        // Read from the wrong address, or damaged anywhere in its records: refused.
        assert_eq!(find(Lba(78), &block, &key(3)).unwrap_err().kind(), crate::ErrorKind::Corrupted);
        let mut damaged = block.clone();
        damaged[HEADER_BYTES + 500] ^= 1;
        assert!(Bucket::decode(lba, &damaged).is_err());
    }

    #[test]
    fn an_empty_bucket_is_zeros_and_the_overflow_flag_is_kept() {
        let lba = Lba(5);
        let mut bucket = Bucket::default();
        assert!(tundra_device::is_zero(&bucket.encode(lba)));
        assert_eq!(Bucket::decode(lba, &vec![0; BLOCK_SIZE]).unwrap(), bucket);
        bucket.overflow = true;
        let block = bucket.encode(lba);
        assert!(!tundra_device::is_zero(&block));
        assert_eq!(find(lba, &block, &key(1)).unwrap(), Lookup::Missing { overflow: true });
        bucket.try_put(key(1), b"v");
        assert!(bucket.remove(&key(1)));
        assert!(!bucket.remove(&key(1)));
    }

    #[test]
    fn malformed_records_under_a_valid_checksum_are_refused() {
        let lba = Lba(9);
        let mut bucket = Bucket::default();
        bucket.try_put(key(1), b"value");
        let mut block = bucket.encode(lba);
        // A key length of zero, re-signed so that only the record walk can catch it.
        block[HEADER_BYTES] = 0;
        let crc = block_crc(lba, &block[..HEADER_BYTES + 3 + 16 + 5]);
        block[8..12].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(Bucket::decode(lba, &block).unwrap_err().kind(), crate::ErrorKind::Corrupted);
    }
}
