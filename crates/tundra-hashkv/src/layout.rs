//! Where everything lives on the drive, and how a key finds its block: the [`Key`] newtype, the
//! stable hash from a key to an LBA of the table region (seed 001 §3.3.2: f_K→L, with no table
//! in between), the regions ([`Layout`]) and the superblock that records them with the
//! write-ahead log's checkpoint. docs/format.md gives the byte layouts.
//!
//! The drive's logical space is carved into four regions, in this order:
//! `[superblock copies | write-ahead log ring | overflow store | table]`. Only the table is
//! large, and most of it stays sparse: a block holds about four records of the nine it could,
//! and the zeros in the rest cost the compressing drive nothing.

use tundra_device::{BLOCK_SIZE, Lba};

use crate::{Error, MAX_KEY_BYTES, Result};

/// The version of every on-drive format of this store; docs/format.md describes version 1.
pub const FORMAT_VERSION: u32 = 1;

/// Blocks at the start of the drive holding the superblock: two identical copies.
pub const SUPERBLOCK_COPIES: u64 = 2;

const SUPERBLOCK_MAGIC: [u8; 8] = *b"TNDHKV01";
/// Superblock fields after the magic, version and checksum: eleven u64 values.
const SUPERBLOCK_BYTES: usize = 16 + 11 * 8;

/// A key: 1 to 16 bytes. Fixed-size so that keys are `Copy` and hash without allocating.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    len: u8,
    bytes: [u8; MAX_KEY_BYTES],
}

impl Key {
    /// The key `bytes`; refused when empty or longer than [`MAX_KEY_BYTES`].
    pub fn new(bytes: &[u8]) -> Result<Key> {
        if bytes.is_empty() || bytes.len() > MAX_KEY_BYTES {
            return Err(Error::invalid(format!("a key is 1 to {MAX_KEY_BYTES} bytes, not {}", bytes.len())));
        }
        let mut key = Key { len: bytes.len() as u8, bytes: [0; MAX_KEY_BYTES] };
        key.bytes[..bytes.len()].copy_from_slice(bytes);
        Ok(key)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key(")?;
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// The regions of the drive, in blocks. Fixed at format time and recorded in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub wal_first: u64,
    pub wal_blocks: u64,
    pub overflow_first: u64,
    pub overflow_blocks: u64,
    pub table_first: u64,
    pub table_blocks: u64,
    /// Mixed into every key's hash, so two stores do not collide on the same keys alike.
    pub hash_seed: u64,
}

impl Layout {
    /// The regions for a drive of `drive_blocks` blocks: the log and overflow sizes asked for,
    /// the table taking `table_blocks`; refused when they do not fit.
    pub fn new(
        drive_blocks: u64,
        wal_blocks: u64,
        overflow_blocks: u64,
        table_blocks: u64,
        seed: u64,
    ) -> Result<Layout> {
        if wal_blocks < 4 || overflow_blocks < 16 || table_blocks == 0 {
            return Err(Error::invalid(format!(
                "regions too small: {wal_blocks} log blocks (at least 4), {overflow_blocks} overflow blocks (at \
                 least 16), {table_blocks} table blocks"
            )));
        }
        let layout = Layout {
            wal_first: SUPERBLOCK_COPIES,
            wal_blocks,
            overflow_first: SUPERBLOCK_COPIES + wal_blocks,
            overflow_blocks,
            table_first: SUPERBLOCK_COPIES + wal_blocks + overflow_blocks,
            table_blocks,
            hash_seed: seed,
        };
        if layout.end() > drive_blocks {
            return Err(Error::invalid(format!(
                "the store needs {} logical blocks; the drive has {drive_blocks}",
                layout.end()
            )));
        }
        Ok(layout)
    }

    /// One past the last block the store uses.
    pub fn end(&self) -> u64 {
        self.table_first + self.table_blocks
    }

    /// The table block `key` hashes to.
    pub fn lba_of(&self, key: &Key) -> Lba {
        let hash = key_hash(self.hash_seed, key);
        // Lemire's multiply-shift maps the hash onto the table without a division.
        Lba(self.table_first + ((u128::from(hash) * u128::from(self.table_blocks)) >> 64) as u64)
    }

    /// The slot of log block `log_block` in the ring.
    pub fn wal_lba(&self, log_block: u64) -> Lba {
        Lba(self.wal_first + log_block % self.wal_blocks)
    }
}

/// A stable 64-bit hash of a key: the on-drive placement depends on it, so it is written out
/// here (two rounds of the SplitMix64 finalizer over the padded key and its length) rather
/// than taken from the standard library, whose hasher may change between releases.
pub fn key_hash(seed: u64, key: &Key) -> u64 {
    let a = u64::from_le_bytes(key.bytes[..8].try_into().expect("8 bytes"));
    let b = u64::from_le_bytes(key.bytes[8..].try_into().expect("8 bytes"));
    mix(mix(a ^ seed ^ (u64::from(key.len) << 59)) ^ b)
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// What the superblock records: the layout, and the write-ahead log's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub layout: Layout,
    /// Incremented on every superblock write; the copy with the highest valid one wins.
    pub sequence: u64,
    /// The session: incremented at every open. Log blocks carry it, so blocks a crashed session
    /// left beyond the end of the log are never mistaken for a later session's.
    pub epoch: u64,
    /// Log block from which recovery replays: every record before it is applied and durable.
    pub checkpoint_block: u64,
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut block = vec![0u8; BLOCK_SIZE];
        block[..8].copy_from_slice(&SUPERBLOCK_MAGIC);
        block[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        let l = &self.layout;
        let fields = [
            l.wal_first,
            l.wal_blocks,
            l.overflow_first,
            l.overflow_blocks,
            l.table_first,
            l.table_blocks,
            l.hash_seed,
            self.sequence,
            self.epoch,
            self.checkpoint_block,
            0,
        ];
        for (i, value) in fields.iter().enumerate() {
            block[16 + i * 8..][..8].copy_from_slice(&value.to_le_bytes());
        }
        let crc = superblock_crc(&block);
        block[12..16].copy_from_slice(&crc.to_le_bytes());
        block
    }

    /// Decodes one copy. `Ok(None)` for a block never written (all zeros); an error for a
    /// written block that does not verify.
    pub fn decode(block: &[u8], drive_blocks: u64) -> Result<Option<Superblock>> {
        assert_eq!(block.len(), BLOCK_SIZE);
        if tundra_device::is_zero(block) {
            return Ok(None);
        }
        if block[..8] != SUPERBLOCK_MAGIC {
            return Err(Error::corrupted("the superblock's magic is not a hash KV store's"));
        }
        let version = u32::from_le_bytes(block[8..12].try_into().expect("4 bytes"));
        if version != FORMAT_VERSION {
            return Err(Error::corrupted(format!(
                "superblock format version {version}, this build reads {FORMAT_VERSION}"
            )));
        }
        let stored = u32::from_le_bytes(block[12..16].try_into().expect("4 bytes"));
        if stored != superblock_crc(block) {
            return Err(Error::corrupted("the superblock fails its checksum"));
        }
        let field = |i: usize| u64::from_le_bytes(block[16 + i * 8..][..8].try_into().expect("8 bytes"));
        let layout = Layout {
            wal_first: field(0),
            wal_blocks: field(1),
            overflow_first: field(2),
            overflow_blocks: field(3),
            table_first: field(4),
            table_blocks: field(5),
            hash_seed: field(6),
        };
        // The recorded layout must be one `Layout::new` could have made for this drive.
        let remade =
            Layout::new(drive_blocks, layout.wal_blocks, layout.overflow_blocks, layout.table_blocks, layout.hash_seed);
        if remade.ok() != Some(layout) {
            return Err(Error::corrupted(format!(
                "the superblock's layout {layout:?} does not fit a drive of {drive_blocks} blocks"
            )));
        }
        Ok(Some(Superblock { layout, sequence: field(7), epoch: field(8), checkpoint_block: field(9) }))
    }
}

fn superblock_crc(block: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&block[..12]), &block[16..SUPERBLOCK_BYTES])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_over_the_table_and_are_checked() {
        let layout = Layout::new(10_000, 8, 16, 1000, 7).unwrap();
        let mut hits = vec![0u32; 1000];
        for i in 0..100_000u64 {
            let lba = layout.lba_of(&Key::new(&i.to_be_bytes()).unwrap());
            assert!(lba.0 >= layout.table_first && lba.0 < layout.end());
            hits[(lba.0 - layout.table_first) as usize] += 1;
        }
        // Uniform: 100 a block on average; a Poisson spread stays well inside 40..200.
        assert!(hits.iter().all(|&h| (40..200).contains(&h)), "{:?}", hits.iter().min());
        assert_eq!(Key::new(&[]).unwrap_err().kind(), crate::ErrorKind::Invalid);
        assert_eq!(Key::new(&[1; 17]).unwrap_err().kind(), crate::ErrorKind::Invalid);
        assert_ne!(Key::new(b"a").unwrap(), Key::new(b"a\0").unwrap());
    }

    #[test]
    fn superblock_round_trips_and_damage_is_refused() {
        let layout = Layout::new(10_000, 8, 16, 1000, 7).unwrap();
        let sb = Superblock { layout, sequence: 3, epoch: 2, checkpoint_block: 99 };
        let mut block = sb.encode();
        assert_eq!(Superblock::decode(&block, 10_000).unwrap(), Some(sb));
        assert_eq!(Superblock::decode(&vec![0; BLOCK_SIZE], 10_000).unwrap(), None);
        assert!(Superblock::decode(&block, 1000).is_err(), "a layout larger than the drive");
        block[40] ^= 1;
        assert_eq!(Superblock::decode(&block, 10_000).unwrap_err().kind(), crate::ErrorKind::Corrupted);
    }
}
