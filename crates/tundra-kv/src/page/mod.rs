//! The page format (docs/kv.md, "Pages"): every page of the database is 8 KiB with a 32-byte
//! header, little-endian:
//!
//! | bytes  | field                                                              |
//! |--------|--------------------------------------------------------------------|
//! | 0..4   | CRC32C of bytes 4..8192                                            |
//! | 4..12  | page LSN: the LSN of the record that last changed the page         |
//! | 12..14 | magic `0x4B56`                                                     |
//! | 14     | format version (1)                                                 |
//! | 15     | kind: 1 meta, 2 internal, 3 leaf                                   |
//! | 16..18 | cell count                                                         |
//! | 18..20 | cell start: cells occupy `cell start..8192`                        |
//! | 20..22 | garbage: bytes of removed cells inside that area                   |
//! | 22..24 | zero                                                               |
//! | 24..32 | link: a leaf's right sibling (0: none), an internal page's leftmost |
//! |        | child                                                              |
//!
//! A slot array of u16 cell offsets, sorted by key, follows the header; cells grow down from
//! the page's end ([`node`]). The meta page (page 0) holds the root and the next free page
//! ([`meta`]). Every record rewrites the first 12 bytes (checksum and LSN), so the page is
//! checksummed as of every LSN storage can serve, and a node applying redo can tell whether a
//! record is already in a page by comparing LSNs.
//!
//! A page from storage or one a node applied redo to is checked whole before its cells are
//! read ([`Page::decode`]): checksum, magic, version, kind, bounds of every cell, the byte
//! accounting of the cell area and the keys' order. The accessors then index a checked page
//! directly; a page that fails is a `Corrupted` error, never a panic.

mod meta;
mod node;

use tundra_store::ids::Lsn;

pub use meta::Meta;
pub(crate) use node::{cell_key, internal_cell, leaf_cell};

use crate::{Error, Result};

/// Bytes of every page.
pub const PAGE_SIZE: usize = 8192;
/// The longest key.
pub const MAX_KEY_BYTES: usize = 64;
/// The longest value.
pub const MAX_VALUE_BYTES: usize = 512;
/// Bytes of the header.
pub const HEADER_BYTES: usize = 32;
/// Bytes every record rewrites: the checksum and the page LSN.
pub const STAMP_BYTES: usize = 12;
/// The format this build writes and reads.
pub const FORMAT_VERSION: u8 = 1;
const MAGIC: u16 = 0x4B56;

const _: () = assert!(PAGE_SIZE <= u16::MAX as usize + 1, "cell offsets are u16");
const _: () = assert!(STAMP_BYTES <= HEADER_BYTES);
// A leaf holds at least four of the largest cells, so a split always leaves both halves room
// for one more.
const _: () = assert!(4 * (node::LEAF_CELL_HEADER + MAX_KEY_BYTES + MAX_VALUE_BYTES + 2) < PAGE_SIZE - HEADER_BYTES);

const CHECKSUM: usize = 0;
const LSN: usize = 4;
const MAGIC_AT: usize = 12;
const VERSION_AT: usize = 14;
const KIND: usize = 15;
const COUNT: usize = 16;
const CELL_START: usize = 18;
const GARBAGE: usize = 20;
const RESERVED: usize = 22;
const LINK: usize = 24;

/// What a page holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageKind {
    Meta = 1,
    Internal = 2,
    Leaf = 3,
}

impl PageKind {
    fn from_byte(byte: u8) -> Option<PageKind> {
        match byte {
            1 => Some(PageKind::Meta),
            2 => Some(PageKind::Internal),
            3 => Some(PageKind::Leaf),
            _ => None,
        }
    }
}

/// One page's bytes, always [`PAGE_SIZE`] of them, checked when they came from outside.
#[derive(Clone, PartialEq, Eq)]
pub struct Page {
    bytes: Vec<u8>,
}

impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Page({:?} at LSN {}, {} cells)", self.kind(), self.lsn(), self.count())
    }
}

impl Page {
    /// An empty page of `kind` linked to `link`, not yet stamped.
    pub fn new(kind: PageKind, link: u64) -> Page {
        let mut page = Page { bytes: vec![0; PAGE_SIZE] };
        page.put_u16(MAGIC_AT, MAGIC);
        page.bytes[VERSION_AT] = FORMAT_VERSION;
        page.bytes[KIND] = kind as u8;
        page.set_cell_start(PAGE_SIZE);
        page.set_link(link);
        page
    }

    /// Checks bytes from storage (or a page redo was applied to) and takes them as a page;
    /// `None` for a page never written (all zeros). `number` names the page in errors.
    pub fn decode(bytes: Vec<u8>, number: u64) -> Result<Option<Page>> {
        if bytes.len() != PAGE_SIZE {
            return Err(Error::corrupted(format!("page {number} has {} bytes, not {PAGE_SIZE}", bytes.len())));
        }
        if bytes.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let page = Page { bytes };
        page.problem().map_or(Ok(Some(page)), |problem| Err(Error::corrupted(format!("page {number}: {problem}"))))
    }

    /// Checks the page again after redo was applied to it in place.
    pub fn check(&self, number: u64) -> Result<()> {
        match self.problem() {
            None => Ok(()),
            Some(problem) => Err(Error::corrupted(format!("page {number} at LSN {}: {problem}", self.lsn()))),
        }
    }

    /// What is wrong with the page, if anything.
    fn problem(&self) -> Option<String> {
        let stored = self.u32_at(CHECKSUM);
        let computed = self.checksum();
        if stored != computed {
            return Some(format!("checksum {stored:#010x} does not match the bytes' {computed:#010x}"));
        }
        if self.u16_at(MAGIC_AT) != MAGIC || self.bytes[VERSION_AT] != FORMAT_VERSION {
            return Some(format!(
                "magic {:#06x} and version {} are not this format's",
                self.u16_at(MAGIC_AT),
                self.bytes[VERSION_AT]
            ));
        }
        let Some(kind) = PageKind::from_byte(self.bytes[KIND]) else {
            return Some(format!("unknown page kind {}", self.bytes[KIND]));
        };
        if self.u16_at(RESERVED) != 0 {
            return Some("reserved header bytes are not zero".into());
        }
        let (count, start) = (self.count(), self.cell_start());
        if HEADER_BYTES + 2 * count > start || start > PAGE_SIZE {
            return Some(format!("{count} slots and cells from byte {start} do not fit the page"));
        }
        match kind {
            PageKind::Meta if count != 0 || start != PAGE_SIZE => Some("a meta page with cells".into()),
            PageKind::Meta => None,
            PageKind::Internal if count == 0 || self.link() == 0 => Some("an internal page without children".into()),
            PageKind::Internal | PageKind::Leaf => self.cells_problem(kind),
        }
    }

    fn checksum(&self) -> u32 {
        crc32c::crc32c(&self.bytes[LSN..])
    }

    /// Sets the page's LSN and its checksum: the page as of `lsn`.
    pub fn stamp(&mut self, lsn: Lsn) {
        self.bytes[LSN..LSN + 8].copy_from_slice(&lsn.0.to_le_bytes());
        let checksum = self.checksum();
        self.bytes[CHECKSUM..CHECKSUM + 4].copy_from_slice(&checksum.to_le_bytes());
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The bytes, for applying redo in place; the caller checks the page afterwards.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    pub fn lsn(&self) -> Lsn {
        Lsn(self.u64_at(LSN))
    }

    pub fn kind(&self) -> PageKind {
        PageKind::from_byte(self.bytes[KIND]).expect("a page's kind was checked")
    }

    /// The page as `kind`, or a corruption error naming what was found where.
    pub fn expect_kind(&self, kind: PageKind, number: u64) -> Result<()> {
        if self.kind() == kind {
            return Ok(());
        }
        Err(Error::corrupted(format!("page {number} is a {:?} page where a {kind:?} page belongs", self.kind())))
    }

    pub fn count(&self) -> usize {
        self.u16_at(COUNT) as usize
    }

    fn set_count(&mut self, count: usize) {
        self.put_u16(COUNT, u16::try_from(count).expect("slots fit a page"));
    }

    fn cell_start(&self) -> usize {
        // A cell start of PAGE_SIZE is stored as 0 when PAGE_SIZE is 65536; here it fits.
        self.u16_at(CELL_START) as usize
    }

    fn set_cell_start(&mut self, start: usize) {
        self.put_u16(CELL_START, u16::try_from(start).expect("offsets fit u16"));
    }

    fn garbage(&self) -> usize {
        self.u16_at(GARBAGE) as usize
    }

    fn set_garbage(&mut self, garbage: usize) {
        self.put_u16(GARBAGE, u16::try_from(garbage).expect("garbage fits a page"));
    }

    /// A leaf's right sibling (0: none) or an internal page's leftmost child.
    pub fn link(&self) -> u64 {
        self.u64_at(LINK)
    }

    pub fn set_link(&mut self, link: u64) {
        self.bytes[LINK..LINK + 8].copy_from_slice(&link.to_le_bytes());
    }

    fn u16_at(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]])
    }

    fn put_u16(&mut self, at: usize, value: u16) {
        self.bytes[at..at + 2].copy_from_slice(&value.to_le_bytes());
    }

    fn u32_at(&self, at: usize) -> u32 {
        let mut word = [0u8; 4];
        word.copy_from_slice(&self.bytes[at..at + 4]);
        u32::from_le_bytes(word)
    }

    fn u64_at(&self, at: usize) -> u64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.bytes[at..at + 8]);
        u64::from_le_bytes(word)
    }
}

#[cfg(test)]
mod tests;
