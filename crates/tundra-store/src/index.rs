//! The page index (seed 000 §3.2.1, §3.2.3): for each page of a chunk, how it is stored (mode and
//! algorithm), where (a run of 4 KiB blocks), how long its compressed image is, the checksum of
//! its uncompressed content bound to its address, and its version.
//!
//! Page numbers inside a chunk are dense, so the "hash" is the identity: each chunk keeps a
//! vector of 24-byte entries indexed by page number, grown to the highest page written. That
//! costs 24 bytes per page of the written range and needs no hashing on the read path.

use crate::ids::{BlockRun, ExtentId, Lsn, PageNo};

/// How a page is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// Stored as is (mode none, or a compressed page that saved no block).
    Raw,
    /// Compressed on its own with lz4.
    Lz4,
    /// Compressed on its own with zstd.
    Zstd,
    /// Part of a heavily compressed segment; `BlockRun` is the segment's first run and the
    /// compressed length field holds the page's position in the segment.
    Heavy,
}

impl Encoding {
    pub fn to_bits(self) -> u8 {
        match self {
            Encoding::Raw => 1,
            Encoding::Lz4 => 2,
            Encoding::Zstd => 3,
            Encoding::Heavy => 4,
        }
    }

    pub fn from_bits(bits: u8) -> Option<Encoding> {
        match bits {
            1 => Some(Encoding::Raw),
            2 => Some(Encoding::Lz4),
            3 => Some(Encoding::Zstd),
            4 => Some(Encoding::Heavy),
            _ => None,
        }
    }
}

/// One page's entry, as the store uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageEntry {
    pub encoding: Encoding,
    pub run: BlockRun,
    /// Bytes of the compressed image (the page size when raw); for heavy pages, the page's index
    /// in its segment.
    pub stored_len: u16,
    /// crc32c of the uncompressed page, seeded with the page's address.
    pub checksum: u32,
    /// The LSN of the page's last change.
    pub lsn: Lsn,
}

/// The packed form kept in memory: 24 bytes, a zero `encoding` meaning "no page".
#[derive(Clone, Copy, Default)]
struct Slot {
    lsn: u64,
    extent: u32,
    checksum: u32,
    stored_len: u16,
    offset: u8,
    count: u8,
    encoding: u8,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 24);

/// The entries of one chunk's pages.
#[derive(Default)]
pub struct ChunkIndex {
    slots: Vec<Slot>,
    mapped: u64,
}

impl ChunkIndex {
    pub fn get(&self, page: PageNo) -> Option<PageEntry> {
        let slot = self.slots.get(page.0 as usize)?;
        let encoding = Encoding::from_bits(slot.encoding)?;
        Some(PageEntry {
            encoding,
            run: BlockRun::new(ExtentId(slot.extent), slot.offset, slot.count),
            stored_len: slot.stored_len,
            checksum: slot.checksum,
            lsn: Lsn(slot.lsn),
        })
    }

    /// Installs or removes a page's entry and returns the one it replaces.
    pub fn set(&mut self, page: PageNo, entry: Option<PageEntry>) -> Option<PageEntry> {
        let old = self.get(page);
        let index = page.0 as usize;
        match entry {
            Some(e) => {
                if index >= self.slots.len() {
                    self.slots.resize(index + 1, Slot::default());
                }
                self.slots[index] = Slot {
                    lsn: e.lsn.0,
                    extent: e.run.extent.0,
                    checksum: e.checksum,
                    stored_len: e.stored_len,
                    offset: e.run.offset,
                    count: e.run.count,
                    encoding: e.encoding.to_bits(),
                };
            }
            None => {
                if let Some(slot) = self.slots.get_mut(index) {
                    *slot = Slot::default();
                }
            }
        }
        self.mapped = self.mapped + u64::from(entry.is_some()) - u64::from(old.is_some());
        old
    }

    pub fn mapped_pages(&self) -> u64 {
        self.mapped
    }

    pub fn memory_bytes(&self) -> u64 {
        (self.slots.capacity() * std::mem::size_of::<Slot>()) as u64
    }

    pub fn iter(&self) -> impl Iterator<Item = (PageNo, PageEntry)> + '_ {
        (0..self.slots.len() as u32).filter_map(|p| self.get(PageNo(p)).map(|e| (PageNo(p), e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(extent: u32, version: u64) -> PageEntry {
        PageEntry {
            encoding: Encoding::Zstd,
            run: BlockRun::new(ExtentId(extent), 3, 2),
            stored_len: 5000,
            checksum: 0xdead_beef,
            lsn: Lsn(version),
        }
    }

    #[test]
    fn entries_round_trip_and_count() {
        let mut index = ChunkIndex::default();
        assert_eq!(index.get(PageNo(5)), None);
        assert_eq!(index.set(PageNo(5), Some(entry(1, 7))), None);
        assert_eq!(index.get(PageNo(5)), Some(entry(1, 7)));
        assert_eq!(index.set(PageNo(5), Some(entry(2, 8))), Some(entry(1, 7)));
        assert_eq!(index.mapped_pages(), 1);
        index.set(PageNo(0), Some(entry(3, 1)));
        assert_eq!(index.iter().count(), 2);
        assert_eq!(index.set(PageNo(5), None), Some(entry(2, 8)));
        assert_eq!(index.mapped_pages(), 1);
        assert_eq!(index.set(PageNo(99), None), None);
    }

    #[test]
    fn a_dense_chunk_costs_24_bytes_per_page() {
        let mut index = ChunkIndex::default();
        for page in 0..65_536 {
            index.set(PageNo(page), Some(entry(page / 8, 1)));
        }
        let per_page = index.memory_bytes() as f64 / index.mapped_pages() as f64;
        assert!(per_page <= 32.0, "{per_page} bytes per page");
    }
}
