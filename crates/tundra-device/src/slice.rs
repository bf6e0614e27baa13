//! A contiguous range of another device's blocks, seen as a device of its own: how one fast
//! device holds both the store's journal and the uncompressed volumes.

use std::sync::Arc;

use crate::{BLOCK_SIZE_BYTES, BlockDevice, Error, Lba, Result, Usage, check_io, check_range};

/// Blocks `first .. first + count` of `inner`. Flush flushes the whole inner device.
pub struct SliceDevice {
    inner: Arc<dyn BlockDevice>,
    first: u64,
    count: u64,
}

impl SliceDevice {
    /// The slice of `count` blocks at `first`; refused when it does not lie inside `inner`.
    pub fn new(inner: Arc<dyn BlockDevice>, first: Lba, count: u64) -> Result<SliceDevice> {
        if count == 0 {
            return Err(Error::invalid("a slice of zero blocks"));
        }
        check_range(inner.block_count(), first, count)?;
        Ok(SliceDevice { inner, first: first.0, count })
    }
}

impl BlockDevice for SliceDevice {
    fn block_count(&self) -> u64 {
        self.count
    }

    fn read(&self, lba: Lba, buf: &mut [u8]) -> Result<()> {
        check_io(self.count, lba, buf.len())?;
        self.inner.read(Lba(self.first + lba.0), buf)
    }

    fn read_many(&self, reads: &mut [(Lba, &mut [u8])]) -> Result<()> {
        for (lba, buf) in reads.iter() {
            check_io(self.count, *lba, buf.len())?;
        }
        let mut inner: Vec<(Lba, &mut [u8])> =
            reads.iter_mut().map(|(lba, buf)| (Lba(self.first + lba.0), &mut **buf)).collect();
        self.inner.read_many(&mut inner)
    }

    fn write(&self, lba: Lba, data: &[u8]) -> Result<()> {
        check_io(self.count, lba, data.len())?;
        self.inner.write(Lba(self.first + lba.0), data)
    }

    fn trim(&self, lba: Lba, block_count: u64) -> Result<()> {
        check_range(self.count, lba, block_count)?;
        self.inner.trim(Lba(self.first + lba.0), block_count)
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    /// The slice's capacity, and what is mapped in it when the inner device can tell (a sparse
    /// file can); otherwise the whole inner device's figures.
    fn usage(&self) -> Usage {
        let inner = self.inner.usage();
        match self.inner.mapped_bytes_in(Lba(self.first), self.count) {
            Some(mapped) => Usage {
                logical_capacity_bytes: self.count * BLOCK_SIZE_BYTES,
                mapped_bytes: mapped,
                physical_used_bytes: mapped,
                physical_capacity_bytes: self.count * BLOCK_SIZE_BYTES,
            },
            None => Usage { logical_capacity_bytes: self.count * BLOCK_SIZE_BYTES, ..inner },
        }
    }

    fn mapped_bytes_in(&self, lba: Lba, count: u64) -> Option<u64> {
        check_range(self.count, lba, count).ok()?;
        self.inner.mapped_bytes_in(Lba(self.first + lba.0), count)
    }

    fn physical_bytes_in(&self, lba: Lba, count: u64) -> Option<u64> {
        check_range(self.count, lba, count).ok()?;
        self.inner.physical_bytes_in(Lba(self.first + lba.0), count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemDevice;

    #[test]
    fn a_slice_is_a_device() {
        crate::conformance::run_all(&|blocks| {
            let inner: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(blocks + 24));
            Box::new(SliceDevice::new(inner, Lba(8), blocks).unwrap())
        });
        let inner: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(64));
        let slice = SliceDevice::new(inner.clone(), Lba(16), 32).unwrap();
        assert!(SliceDevice::new(inner.clone(), Lba(60), 8).is_err());
        assert!(SliceDevice::new(inner.clone(), Lba(0), 0).is_err());
        // Blocks outside the slice are untouched by writes through it.
        slice.write(Lba(0), &[7u8; 4096]).unwrap();
        let mut block = [0u8; 4096];
        inner.read(Lba(16), &mut block).unwrap();
        assert_eq!(block, [7u8; 4096]);
        inner.read(Lba(15), &mut block).unwrap();
        assert_eq!(block, [0u8; 4096]);
        assert!(slice.write(Lba(32), &[1u8; 4096]).is_err());
    }

    #[test]
    fn a_slice_of_a_sparse_file_counts_only_its_own_data() {
        let dir = tempfile::tempdir().unwrap();
        let file: Arc<dyn BlockDevice> =
            Arc::new(crate::file::FileDevice::create(dir.path().join("f"), 64 << 12).unwrap());
        file.write(Lba(0), &[1u8; 8 * 4096]).unwrap();
        let slice = SliceDevice::new(file.clone(), Lba(32), 32).unwrap();
        assert_eq!(slice.usage().mapped_bytes, 0);
        slice.write(Lba(4), &[2u8; 4096]).unwrap();
        slice.flush().unwrap();
        assert_eq!(slice.usage().mapped_bytes, 4096);
        slice.trim(Lba(4), 1).unwrap();
        slice.flush().unwrap();
        assert_eq!(slice.usage().mapped_bytes, 0);
    }
}
