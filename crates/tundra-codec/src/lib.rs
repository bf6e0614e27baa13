//! The codec layer: how a database page becomes the bytes the store writes (seed 000 §3.2.1,
//! §3.2.3, §3.3.2).
//!
//! - [`PageCodec`] compresses 8 or 16 KiB pages with lz4 or zstd, and applies the storage rule
//!   that a page which saves no 4 KiB block is stored raw ([`EncodedPage`]).
//! - [`heavy`] compresses a run of pages as one zstd frame at a high level with a window that
//!   spans the run (heavy compression, for archived pages), and [`SegmentCache`] keeps recently
//!   decompressed runs for sequential readers.
//! - [`Selector`] is Algorithm 1: the per-page choice between lz4 and zstd, made without I/O from
//!   the page, its history, the host's CPU utilisation ([`CpuSampler`], the real
//!   `tundra_env::CpuGauge`) and a decompression cost model ([`DecompressCost`]: calibrated on
//!   the running machine when a node starts, fixed nominal coefficients everywhere else).
//!
//! The codec knows pages and 4 KiB blocks as sizes only: it never reads or writes a device, and
//! knows nothing of indexes, chunks or the drive's own compression.

mod cache;
mod codec;
mod cost;
mod cpu;
mod error;
pub mod heavy;
mod lz4_block;
mod page;
mod samples;
mod select;
mod zstd_frame;

pub use cache::{CacheStats, SegmentCache};
pub use codec::{EncodedPage, Encoding, PageCodec};
pub use cost::{DecompressCost, LinearCost, calibration_pages, fit_linear};
pub use cpu::{CpuSampler, CpuTimes};
pub use error::{Error, ErrorKind, Result};
pub use heavy::{HeavyConfig, HeavySegment};
pub use page::PageSize;
pub use select::{Comparison, DRIVE_TIE_BYTES_PER_US, PageHistory, Reason, Selection, Selector, SelectorConfig};

use std::fmt;

/// The unit the store allocates and the drive compresses: compressed pages take whole blocks.
pub const BLOCK_BYTES: usize = 4096;

/// The number of 4 KiB blocks `len` bytes occupy: `ceil(len / 4096)`.
pub const fn blocks_4k(len: usize) -> usize {
    len.div_ceil(BLOCK_BYTES)
}

/// `len` rounded up to whole 4 KiB blocks, in bytes.
pub const fn bytes_4k(len: usize) -> usize {
    blocks_4k(len) * BLOCK_BYTES
}

/// A page compression algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// LZ4 block format: fast to decompress, no entropy coding.
    Lz4,
    /// A Zstandard frame: smaller output, slower to decompress.
    Zstd,
}

impl Algorithm {
    /// The lower-case name the command line and JSON output use.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Lz4 => "lz4",
            Algorithm::Zstd => "zstd",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_rounding() {
        assert_eq!(blocks_4k(0), 0);
        assert_eq!(blocks_4k(1), 1);
        assert_eq!(blocks_4k(4096), 1);
        assert_eq!(blocks_4k(4097), 2);
        assert_eq!(bytes_4k(12_289), 16_384);
    }
}
