//! Database page sizes: the unit the codec compresses.

use std::fmt;

use crate::{BLOCK_BYTES, Error, Result};

/// The size of a database page: 8 KiB (PostgreSQL) or 16 KiB (InnoDB, PolarDB).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageSize {
    Kib8,
    Kib16,
}

// A page is a whole number of blocks, so that a raw page fills its blocks exactly.
const _: () = assert!(PageSize::Kib8.bytes().is_multiple_of(BLOCK_BYTES));
const _: () = assert!(PageSize::Kib16.bytes().is_multiple_of(BLOCK_BYTES));

impl PageSize {
    pub const fn bytes(self) -> usize {
        match self {
            PageSize::Kib8 => 8 << 10,
            PageSize::Kib16 => 16 << 10,
        }
    }

    /// The 4 KiB blocks a raw page takes.
    pub const fn blocks_4k(self) -> usize {
        self.bytes() / BLOCK_BYTES
    }

    /// The page size of `bytes` bytes, or an Invalid error for any other size.
    pub fn from_bytes(bytes: u64) -> Result<PageSize> {
        match bytes {
            8192 => Ok(PageSize::Kib8),
            16384 => Ok(PageSize::Kib16),
            _ => Err(Error::invalid(format!("a page is 8 KiB or 16 KiB, not {bytes} bytes"))),
        }
    }

    /// The page size of a buffer that must hold exactly one page.
    pub fn of(page: &[u8]) -> Result<PageSize> {
        PageSize::from_bytes(page.len() as u64)
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} KiB", self.bytes() >> 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_8_and_16_kib() {
        assert_eq!(PageSize::from_bytes(8192).unwrap(), PageSize::Kib8);
        assert_eq!(PageSize::of(&[0u8; 16384]).unwrap(), PageSize::Kib16);
        assert_eq!(PageSize::Kib16.blocks_4k(), 4);
        assert_eq!(PageSize::Kib8.to_string(), "8 KiB");
        for bad in [0, 4096, 8191, 32768] {
            assert_eq!(PageSize::from_bytes(bad).unwrap_err().kind(), crate::ErrorKind::Invalid);
        }
    }
}
