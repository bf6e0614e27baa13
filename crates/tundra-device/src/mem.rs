//! A device held in memory: the reference every other device is compared with in tests, and a
//! backing store for the emulated drive in simulations.

use std::collections::HashMap;

use parking_lot::RwLock;

use crate::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Lba, Result, Usage, check_io, check_range, is_zero};

/// Blocks in a hash map; unwritten and trimmed blocks take no memory and read as zeros.
pub struct MemDevice {
    block_count: u64,
    blocks: RwLock<HashMap<u64, Box<[u8]>>>,
}

impl MemDevice {
    pub fn new(block_count: u64) -> MemDevice {
        MemDevice { block_count, blocks: RwLock::new(HashMap::new()) }
    }

    /// A copy of every stored block, for tests that compare images.
    pub fn snapshot(&self) -> HashMap<u64, Box<[u8]>> {
        self.blocks.read().clone()
    }

    /// A device holding exactly `blocks`.
    pub fn from_snapshot(block_count: u64, blocks: HashMap<u64, Box<[u8]>>) -> MemDevice {
        assert!(blocks.keys().all(|&lba| lba < block_count));
        MemDevice { block_count, blocks: RwLock::new(blocks) }
    }
}

impl BlockDevice for MemDevice {
    fn block_count(&self) -> u64 {
        self.block_count
    }

    fn read(&self, lba: Lba, buf: &mut [u8]) -> Result<()> {
        check_io(self.block_count, lba, buf.len())?;
        let blocks = self.blocks.read();
        for (i, out) in buf.chunks_exact_mut(BLOCK_SIZE).enumerate() {
            match blocks.get(&(lba.0 + i as u64)) {
                Some(block) => out.copy_from_slice(block),
                None => out.fill(0),
            }
        }
        Ok(())
    }

    fn write(&self, lba: Lba, data: &[u8]) -> Result<()> {
        check_io(self.block_count, lba, data.len())?;
        let mut blocks = self.blocks.write();
        for (i, block) in data.chunks_exact(BLOCK_SIZE).enumerate() {
            let key = lba.0 + i as u64;
            if is_zero(block) {
                blocks.remove(&key);
            } else {
                blocks.insert(key, block.into());
            }
        }
        Ok(())
    }

    fn trim(&self, lba: Lba, block_count: u64) -> Result<()> {
        check_range(self.block_count, lba, block_count)?;
        let mut blocks = self.blocks.write();
        if block_count as usize > blocks.len() {
            blocks.retain(|&key, _| key < lba.0 || key >= lba.0 + block_count);
        } else {
            for key in lba.0..lba.0 + block_count {
                blocks.remove(&key);
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn usage(&self) -> Usage {
        let mapped_bytes = self.blocks.read().len() as u64 * BLOCK_SIZE_BYTES;
        Usage {
            logical_capacity_bytes: self.block_count * BLOCK_SIZE_BYTES,
            mapped_bytes,
            physical_used_bytes: mapped_bytes,
            physical_capacity_bytes: self.block_count * BLOCK_SIZE_BYTES,
        }
    }

    /// Every block is known to be mapped or not, so a slice of the device (a journal, a store's
    /// data) can report its own share, as a sparse file's slices do.
    fn mapped_bytes_in(&self, lba: Lba, count: u64) -> Option<u64> {
        check_range(self.block_count, lba, count).ok()?;
        let end = lba.0 + count;
        let mapped = self.blocks.read().keys().filter(|&&key| key >= lba.0 && key < end).count() as u64;
        Some(mapped * BLOCK_SIZE_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance;

    #[test]
    fn conformance_suite() {
        conformance::run_all(&|blocks| Box::new(MemDevice::new(blocks)));
    }

    #[test]
    fn a_range_reports_its_own_mapped_blocks() {
        let device = MemDevice::new(16);
        device.write(Lba(2), &vec![7u8; 3 * BLOCK_SIZE]).unwrap();
        device.write(Lba(10), &vec![7u8; BLOCK_SIZE]).unwrap();
        // A block of zeros is not stored, as a sparse file's hole.
        device.write(Lba(12), &vec![0u8; BLOCK_SIZE]).unwrap();
        assert_eq!(device.mapped_bytes_in(Lba(0), 16), Some(4 * BLOCK_SIZE_BYTES));
        assert_eq!(device.mapped_bytes_in(Lba(3), 8), Some(3 * BLOCK_SIZE_BYTES));
        assert_eq!(device.mapped_bytes_in(Lba(5), 5), Some(0));
        assert_eq!(device.mapped_bytes_in(Lba(11), 5), Some(0));
        assert_eq!(device.mapped_bytes_in(Lba(10), 7), None);
    }
}
