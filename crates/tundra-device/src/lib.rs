//! The device layer: block devices of 4 KiB logical blocks behind one trait, [`BlockDevice`].
//!
//! Every layer above writes through this trait and nothing else. The implementations are the
//! emulated compressing drive ([`csd::CsdDevice`], a model of PolarCSD, seed 000 §3.2.2 and §4.1),
//! a plain file or raw block device ([`file::FileDevice`], TRIM by hole punching as in seed 004
//! §3) and a memory device ([`mem::MemDevice`]). All of them pass the same conformance suite
//! (`conformance`), and the layers above test their crash handling on a fault-injecting wrapper
//! (`fault::FaultyDevice`). Those two are test fixtures behind the `testing` feature, which the
//! product never enables; a crate whose tests use them enables it in its dev-dependencies.
//!
//! The device layer knows nothing of pages, volumes or chunks: it stores numbered 4 KiB blocks.

pub mod buf;
#[cfg(any(test, feature = "testing"))]
pub mod conformance;
pub mod csd;
mod error;
#[cfg(any(test, feature = "testing"))]
pub mod fault;
pub mod file;
mod file_ring;
pub mod mem;
pub mod size;
pub mod slice;

pub use error::{Error, ErrorKind, Result};

use std::fmt;

/// The size of one logical block, the unit of every device address.
pub const BLOCK_SIZE: usize = 4096;
/// [`BLOCK_SIZE`] as a byte count of the `u64` kind used for capacities.
pub const BLOCK_SIZE_BYTES: u64 = BLOCK_SIZE as u64;

/// A logical block address: the index of a 4 KiB block on a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lba(pub u64);

impl Lba {
    /// The byte offset of the start of this block.
    pub fn byte_offset(self) -> u64 {
        self.0 * BLOCK_SIZE_BYTES
    }

    /// The block `count` blocks after this one.
    pub fn offset_by(self, count: u64) -> Lba {
        Lba(self.0 + count)
    }
}

impl fmt::Display for Lba {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LBA {}", self.0)
    }
}

/// How much of a device is used, logically and physically.
///
/// `logical_*` counts the address space the device exposes; `physical_*` counts what the data
/// occupies on the media. A compressing drive's logical capacity is larger than its physical one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Size of the address space: block count times 4 KiB.
    pub logical_capacity_bytes: u64,
    /// Logical bytes that hold data (written and not trimmed), 4 KiB per mapped block.
    pub mapped_bytes: u64,
    /// Media bytes the mapped data occupies.
    pub physical_used_bytes: u64,
    /// Media bytes available for data.
    pub physical_capacity_bytes: u64,
}

/// A block device of 4 KiB logical blocks, safe to share between threads.
///
/// Reads and writes move one or more whole blocks: a buffer's length is a non-zero multiple of
/// [`BLOCK_SIZE`]. A block never written, or trimmed since its last write, reads as zeros. A write
/// is durable once a later [`flush`](BlockDevice::flush) returns; before that a crash may lose it.
/// A request outside the device or with a bad length fails with [`ErrorKind::Invalid`] and changes
/// nothing.
pub trait BlockDevice: Send + Sync {
    /// Number of logical blocks.
    fn block_count(&self) -> u64;

    /// Reads `buf.len() / 4096` blocks starting at `lba` into `buf`.
    fn read(&self, lba: Lba, buf: &mut [u8]) -> Result<()>;

    /// Reads several ranges, each as [`BlockDevice::read`] reads it. A device that can have
    /// them in flight at once does ([`file::FileDevice`] submits them together); the default
    /// reads them one after another. On an error some of the buffers may be filled, none
    /// with wrong bytes.
    fn read_many(&self, reads: &mut [(Lba, &mut [u8])]) -> Result<()> {
        for (lba, buf) in reads.iter_mut() {
            self.read(*lba, buf)?;
        }
        Ok(())
    }

    /// Writes `data.len() / 4096` blocks starting at `lba`.
    fn write(&self, lba: Lba, data: &[u8]) -> Result<()>;

    /// Declares `block_count` blocks starting at `lba` unused: they read as zeros from now on and
    /// their media space may be reclaimed. Durable, like a write, after the next flush.
    fn trim(&self, lba: Lba, block_count: u64) -> Result<()>;

    /// Makes every completed write and trim durable.
    fn flush(&self) -> Result<()>;

    /// Current logical and physical usage.
    fn usage(&self) -> Usage;

    /// Bytes holding data in the `count` blocks at `lba`, when the device can tell a range's
    /// share apart (a sparse file can); None otherwise.
    fn mapped_bytes_in(&self, _lba: Lba, _count: u64) -> Option<u64> {
        None
    }

    /// Media bytes the data in the `count` blocks at `lba` occupies, counted as
    /// [`Usage::physical_used_bytes`] counts them (after the drive's own compression), when
    /// the device can tell a range's share apart; None otherwise. A device that does not
    /// compress stores a mapped block as itself, so its mapped bytes are its physical bytes.
    fn physical_bytes_in(&self, lba: Lba, count: u64) -> Option<u64> {
        self.mapped_bytes_in(lba, count)
    }
}

/// Checks that a buffer of `len` bytes at `lba` is whole blocks inside a device of `block_count`
/// blocks, and returns its block count.
pub fn check_io(block_count: u64, lba: Lba, len: usize) -> Result<u64> {
    if len == 0 || !len.is_multiple_of(BLOCK_SIZE) {
        return Err(Error::invalid(format!("buffer length {len} is not a non-zero multiple of {BLOCK_SIZE}")));
    }
    let count = (len / BLOCK_SIZE) as u64;
    check_range(block_count, lba, count)?;
    Ok(count)
}

/// Checks that `count` blocks at `lba` lie inside a device of `block_count` blocks.
pub fn check_range(block_count: u64, lba: Lba, count: u64) -> Result<()> {
    let end = lba.0.checked_add(count);
    match end {
        Some(end) if end <= block_count => Ok(()),
        _ => {
            Err(Error::invalid(format!("blocks {}..+{} are outside the device's {} blocks", lba.0, count, block_count)))
        }
    }
}

/// True when every byte of `data` is zero.
pub fn is_zero(data: &[u8]) -> bool {
    // Compare eight bytes at a time; the compiler vectorises this loop.
    let words = data.chunks_exact(8);
    let tail = words.remainder();
    words.map(|c| u64::from_ne_bytes(c.try_into().expect("chunk of 8"))).all(|w| w == 0) && tail.iter().all(|&b| b == 0)
}
