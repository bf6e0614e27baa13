//! The baselines of `tundra-bench redo`: a write-ahead log's append without Tundra's framing.
//! [`PlainLog`] is the one the ratios are taken against, `pwrite` and `fdatasync` through the
//! page cache as most databases write their logs; [`DirectPlainLog`] is the same bytes written
//! with `O_DIRECT` in whole 4 KiB blocks (the partly filled last block written again, from a copy
//! in memory) and `fdatasync`, the way the redo log reaches its device, so the two baselines
//! tell the page cache's share apart from the framing's.
//!
//! Both files are filled and synced before the first commit, as such logs preallocate their
//! segments, so no commit allocates, and both wrap to their start when a batch would pass their
//! end, as a log reusing its segments does.

use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use tundra_device::file::FileDevice;
use tundra_device::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Lba};

/// Bytes of zeros written per call while a file is filled.
const FILL_BYTES: usize = 1 << 20;

/// The baseline: a plain file written through the page cache at the next offset and synced.
pub struct PlainLog {
    file: File,
    size: u64,
    offset: u64,
}

impl PlainLog {
    pub fn create(path: &Path, size: u64) -> Result<PlainLog> {
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .with_context(|| format!("creating {}", path.display()))?;
        let zeros = vec![0u8; FILL_BYTES];
        let mut at = 0;
        while at < size {
            let len = zeros.len().min((size - at) as usize);
            pwrite_all(&file, &zeros[..len], at)?;
            at += len as u64;
        }
        rustix::fs::fsync(&file).context("syncing the baseline's file")?;
        Ok(PlainLog { file, size, offset: 0 })
    }

    /// Writes and syncs one batch; answers the bytes of the 4 KiB pages it dirtied, which is
    /// what the kernel writes back.
    pub fn commit(&mut self, bytes: &[u8]) -> Result<u64> {
        let len = bytes.len() as u64;
        if self.offset + len > self.size {
            self.offset = 0;
        }
        pwrite_all(&self.file, bytes, self.offset)?;
        rustix::fs::fdatasync(&self.file).context("fdatasync of the baseline's file")?;
        let pages = (self.offset + len).div_ceil(BLOCK_SIZE_BYTES) - self.offset / BLOCK_SIZE_BYTES;
        self.offset += len;
        Ok(pages * BLOCK_SIZE_BYTES)
    }
}

fn pwrite_all(file: &File, mut bytes: &[u8], mut offset: u64) -> Result<()> {
    while !bytes.is_empty() {
        let written = rustix::io::pwrite(file, bytes, offset).context("pwrite to the baseline's file")?;
        ensure!(written > 0, "pwrite wrote nothing");
        bytes = &bytes[written..];
        offset += written as u64;
    }
    Ok(())
}

/// The same appends with `O_DIRECT`, through a [`FileDevice`] as the redo log's are: each
/// commit writes the blocks from the partly filled one on and flushes (`fdatasync`).
pub struct DirectPlainLog {
    device: FileDevice,
    offset: u64,
    /// The bytes of the partly filled last block (empty at a block boundary).
    tail: Vec<u8>,
}

impl DirectPlainLog {
    pub fn create(path: &Path, size: u64) -> Result<DirectPlainLog> {
        let device = FileDevice::create(path, size)?;
        let zeros = vec![0u8; FILL_BYTES];
        let mut at = 0;
        while at < size {
            let len = zeros.len().min((size - at) as usize);
            device.write(Lba(at / BLOCK_SIZE_BYTES), &zeros[..len])?;
            at += len as u64;
        }
        device.flush()?;
        Ok(DirectPlainLog { device, offset: 0, tail: Vec::new() })
    }

    /// Whether the file bypasses the page cache; without `O_DIRECT` this is the plain
    /// baseline with whole blocks.
    pub fn is_direct(&self) -> bool {
        self.device.is_direct()
    }

    /// Writes and syncs one batch; answers the bytes written, whole blocks.
    pub fn commit(&mut self, bytes: &[u8]) -> Result<u64> {
        if self.offset + bytes.len() as u64 > self.device.block_count() * BLOCK_SIZE_BYTES {
            self.offset = 0;
            self.tail.clear();
        }
        let first = Lba(self.offset / BLOCK_SIZE_BYTES);
        let mut blocks = std::mem::take(&mut self.tail);
        blocks.extend_from_slice(bytes);
        let filled = blocks.len();
        blocks.resize(filled.next_multiple_of(BLOCK_SIZE), 0);
        self.device.write(first, &blocks)?;
        self.device.flush()?;
        let in_last = filled % BLOCK_SIZE;
        if in_last > 0 {
            self.tail = blocks[filled - in_last..filled].to_vec();
        }
        self.offset += bytes.len() as u64;
        Ok(blocks.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both baselines leave the file holding exactly the appended bytes, the direct one
    /// rewriting its partly filled block from its copy; both wrap at the end of the file.
    #[test]
    fn both_baselines_append_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let size = 64 * 1024;
        let mut plain = PlainLog::create(&dir.path().join("plain"), size).unwrap();
        let mut direct = DirectPlainLog::create(&dir.path().join("direct"), size).unwrap();
        let mut expected = Vec::new();
        for (i, len) in [100usize, 3996, 1, 5000, 4096, 777].into_iter().enumerate() {
            let bytes: Vec<u8> = (0..len).map(|b| (b * 7 + i) as u8).collect();
            assert_eq!(plain.commit(&bytes).unwrap() % BLOCK_SIZE_BYTES, 0);
            let written = direct.commit(&bytes).unwrap();
            assert_eq!(
                written,
                (expected.len() + len).div_ceil(BLOCK_SIZE) as u64 * 4096 - expected.len() as u64 / 4096 * 4096
            );
            expected.extend_from_slice(&bytes);
        }
        for name in ["plain", "direct"] {
            let file = std::fs::read(dir.path().join(name)).unwrap();
            assert_eq!(&file[..expected.len()], &expected[..], "{name}");
            assert!(file[expected.len()..].iter().all(|&b| b == 0), "{name}");
        }
        // A batch that would pass the end goes to the start.
        let big = vec![9u8; 60 * 1024];
        plain.commit(&big).unwrap();
        direct.commit(&big).unwrap();
        for name in ["plain", "direct"] {
            assert_eq!(&std::fs::read(dir.path().join(name)).unwrap()[..big.len()], &big[..], "{name}");
        }
    }
}
