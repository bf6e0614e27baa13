//! Volumes (seed 000 §3.2.1): the logical space a database sees, cut into chunks of 1 GiB by
//! default, with a page size of 8 or 16 KiB chosen per volume. A volume created in mode none is
//! never compressed (the place for redo/WAL, seed 000 §3.3.1).

use crate::ids::{ChunkId, PageNo, VolumeId};
use crate::{Error, Result};

/// Whether a volume's pages are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeMode {
    Normal,
    /// Never compressed.
    None,
}

/// Longest volume name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
pub const DEFAULT_CHUNK_BYTES: u64 = 1 << 30;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    pub id: VolumeId,
    pub name: String,
    pub size_bytes: u64,
    pub page_size: u32,
    pub chunk_bytes: u64,
    pub mode: VolumeMode,
}

/// Checks a name for a new volume: 1 to [`MAX_NAME_BYTES`] bytes of printable UTF-8. A name
/// is printed by listings and used as an NBD export name, so a tab, newline or terminal escape
/// in it would break both. (Checked when a volume is created, not when a journal is replayed,
/// so that volumes named before the rule stay readable.)
pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(Error::invalid(format!(
            "volume name {name:?} is {} bytes; names are 1 to {MAX_NAME_BYTES} bytes",
            name.len()
        )));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(Error::invalid(format!(
            "volume name {name:?} holds the control character {c:?}; use printable characters only"
        )));
    }
    Ok(())
}

/// `name` with every control character escaped (`\t`, `\u{1b}`), safe to print to a terminal.
pub fn printable(name: &str) -> String {
    name.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

impl Volume {
    /// Checks the relations the store relies on; the error says what to change.
    pub fn validate(&self) -> Result<()> {
        if self.name.is_empty() || self.name.len() > MAX_NAME_BYTES {
            return Err(Error::invalid(format!("volume names are 1 to {MAX_NAME_BYTES} bytes")));
        }
        if self.page_size != 8192 && self.page_size != 16384 {
            return Err(Error::invalid(format!("page size {}: pages are 8 KiB or 16 KiB", self.page_size)));
        }
        let page = u64::from(self.page_size);
        if self.chunk_bytes < page
            || !self.chunk_bytes.is_multiple_of(page)
            || self.chunk_bytes / page > u64::from(u32::MAX)
        {
            return Err(Error::invalid(format!("chunk size {} is not a whole number of pages", self.chunk_bytes)));
        }
        if self.size_bytes == 0 || !self.size_bytes.is_multiple_of(page) {
            return Err(Error::invalid(format!(
                "volume size {} is not a non-zero multiple of the page size",
                self.size_bytes
            )));
        }
        if self.size_bytes.div_ceil(self.chunk_bytes) > u64::from(u32::MAX) {
            return Err(Error::invalid("the volume has more than 2^32 chunks"));
        }
        Ok(())
    }

    pub fn pages_per_chunk(&self) -> u64 {
        self.chunk_bytes / u64::from(self.page_size)
    }

    pub fn page_count(&self) -> u64 {
        self.size_bytes / u64::from(self.page_size)
    }

    /// The chunk and page of the volume's `index`-th page.
    pub fn locate(&self, index: u64) -> Result<(ChunkId, PageNo)> {
        if index >= self.page_count() {
            return Err(Error::invalid(format!(
                "page {index} is past the end of volume {:?} ({} pages)",
                self.name,
                self.page_count()
            )));
        }
        let per_chunk = self.pages_per_chunk();
        Ok((ChunkId::new(self.id, (index / per_chunk) as u32), PageNo((index % per_chunk) as u32)))
    }

    /// True when `page` of `chunk` lies inside the volume.
    pub fn contains(&self, chunk: ChunkId, page: PageNo) -> bool {
        chunk.volume() == self.id
            && u64::from(page.0) < self.pages_per_chunk()
            && u64::from(chunk.index()) * self.pages_per_chunk() + u64::from(page.0) < self.page_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume() -> Volume {
        Volume {
            id: VolumeId(3),
            name: "pgdata".into(),
            size_bytes: 3 << 20,
            page_size: 16384,
            chunk_bytes: 1 << 20,
            mode: VolumeMode::Normal,
        }
    }

    #[test]
    fn pages_map_to_chunks() {
        let v = volume();
        v.validate().unwrap();
        assert_eq!(v.locate(0).unwrap(), (ChunkId::new(VolumeId(3), 0), PageNo(0)));
        assert_eq!(v.locate(64).unwrap(), (ChunkId::new(VolumeId(3), 1), PageNo(0)));
        assert_eq!(v.locate(191).unwrap(), (ChunkId::new(VolumeId(3), 2), PageNo(63)));
        assert!(v.locate(192).is_err());
        assert!(v.contains(ChunkId::new(VolumeId(3), 2), PageNo(63)));
        assert!(!v.contains(ChunkId::new(VolumeId(3), 3), PageNo(0)));
        assert!(!v.contains(ChunkId::new(VolumeId(4), 0), PageNo(0)));
    }

    #[test]
    fn bad_volumes_are_refused() {
        for bad in [
            Volume { page_size: 4096, ..volume() },
            Volume { size_bytes: 1000, ..volume() },
            Volume { chunk_bytes: 10_000, ..volume() },
            Volume { name: String::new(), ..volume() },
            Volume { name: "x".repeat(65), ..volume() },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_with_control_characters_are_refused_and_printed_escaped() {
        for bad in ["a\tb", "line\n", "\u{1b}[31mred", "del\u{7f}", "c1\u{9b}", ""] {
            let error = validate_name(bad).unwrap_err();
            assert!(!error.message().chars().any(|c| c.is_control()), "{error}");
        }
        validate_name("pg-data_01 ümlaut").unwrap();
        assert_eq!(printable("a\tb\u{1b}"), "a\\tb\\u{1b}");
    }
}
