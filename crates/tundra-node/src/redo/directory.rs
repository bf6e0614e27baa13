//! The redo area's directory: which volume owns each stream. Two copies in the area's first two
//! blocks, each with a generation and a checksum; an update writes the copy the older one is in
//! and flushes, so a crash leaves the newest valid copy or the one before it, never neither.
//!
//! Layout of a copy (little-endian): 0: magic `TNDRREDO`; 8: u32 version (1); 12: u32 stream
//! count; 16: u64 generation; 24: per stream a u32, the owning volume id plus one (0: free);
//! 4092: crc32c of bytes 0..4092.

use tundra_device::{BLOCK_SIZE, BlockDevice, Lba};
use tundra_store::ids::VolumeId;

use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"TNDRREDO";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 24;
/// Streams one directory block can name.
pub(crate) const MAX_STREAMS: usize = (BLOCK_SIZE - 4 - HEADER_BYTES) / 4;

pub(crate) struct Directory {
    owners: Vec<Option<VolumeId>>,
    generation: u64,
}

impl Directory {
    /// The newest valid copy; a new area (both copies zeros) is an empty directory.
    pub fn read(device: &dyn BlockDevice, streams: u32) -> Result<Directory> {
        if streams as usize > MAX_STREAMS {
            return Err(Error::Invalid(format!("{streams} redo streams; a directory names at most {MAX_STREAMS}")));
        }
        let mut blocks = vec![0u8; 2 * BLOCK_SIZE];
        device.read(Lba(0), &mut blocks)?;
        let copies: Vec<Option<Directory>> = blocks.chunks(BLOCK_SIZE).map(|b| decode(b, streams)).collect();
        if let Some(newest) = copies.into_iter().flatten().max_by_key(|d| d.generation) {
            return Ok(newest);
        }
        if blocks.iter().all(|&b| b == 0) {
            return Ok(Directory { owners: vec![None; streams as usize], generation: 0 });
        }
        Err(Error::Corrupted("both copies of the redo area's directory (fast.img) are damaged".into()))
    }

    pub fn slots(&self) -> usize {
        self.owners.len()
    }

    pub fn owners(&self) -> Vec<(u32, VolumeId)> {
        self.owners.iter().enumerate().filter_map(|(slot, owner)| owner.map(|v| (slot as u32, v))).collect()
    }

    pub fn free_slot(&self) -> Option<u32> {
        self.owners.iter().position(Option::is_none).map(|slot| slot as u32)
    }

    /// Names the owner of `slot` durably.
    pub fn set(&mut self, device: &dyn BlockDevice, slot: u32, owner: Option<VolumeId>) -> Result<()> {
        let mut next = Directory { owners: self.owners.clone(), generation: self.generation + 1 };
        next.owners[slot as usize] = owner;
        device.write(Lba(next.generation % 2), &next.encode())?;
        device.flush()?;
        *self = next;
        Ok(())
    }

    /// Names `owner` the owner of `slot` and frees `freed` (if any) in one durable write: a
    /// volume's stream moves to another slot all at once (a copy installed, `image.rs`).
    pub fn set_pair(
        &mut self,
        device: &dyn BlockDevice,
        slot: u32,
        owner: Option<VolumeId>,
        freed: Option<u32>,
    ) -> Result<()> {
        let mut next = Directory { owners: self.owners.clone(), generation: self.generation + 1 };
        if let Some(freed) = freed {
            next.owners[freed as usize] = None;
        }
        next.owners[slot as usize] = owner;
        device.write(Lba(next.generation % 2), &next.encode())?;
        device.flush()?;
        *self = next;
        Ok(())
    }

    fn encode(&self) -> Vec<u8> {
        let mut block = vec![0u8; BLOCK_SIZE];
        block[..8].copy_from_slice(MAGIC);
        block[8..12].copy_from_slice(&VERSION.to_le_bytes());
        block[12..16].copy_from_slice(&(self.owners.len() as u32).to_le_bytes());
        block[16..24].copy_from_slice(&self.generation.to_le_bytes());
        for (i, owner) in self.owners.iter().enumerate() {
            let value = owner.map_or(0, |v| v.0 + 1);
            block[HEADER_BYTES + 4 * i..HEADER_BYTES + 4 * i + 4].copy_from_slice(&value.to_le_bytes());
        }
        let crc = crc32c::crc32c(&block[..BLOCK_SIZE - 4]);
        block[BLOCK_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
        block
    }
}

fn u32_at(block: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(block[at..at + 4].try_into().expect("4 bytes inside a block"))
}

/// A copy, if it verifies and names `streams` streams.
fn decode(block: &[u8], streams: u32) -> Option<Directory> {
    let crc = u32_at(block, BLOCK_SIZE - 4);
    if crc32c::crc32c(&block[..BLOCK_SIZE - 4]) != crc || &block[..8] != MAGIC || u32_at(block, 8) != VERSION {
        return None;
    }
    if u32_at(block, 12) != streams {
        return None;
    }
    let generation = u64::from_le_bytes(block[16..24].try_into().expect("8 bytes"));
    let owners = (0..streams as usize)
        .map(|i| match u32_at(block, HEADER_BYTES + 4 * i) {
            0 => None,
            value => Some(VolumeId(value - 1)),
        })
        .collect();
    Some(Directory { owners, generation })
}

#[cfg(test)]
mod tests {
    use tundra_device::mem::MemDevice;

    use super::*;

    #[test]
    fn owners_survive_rereading_and_one_damaged_copy() {
        let device = MemDevice::new(2);
        let mut directory = Directory::read(&device, 4).unwrap();
        assert_eq!(directory.free_slot(), Some(0));
        directory.set(&device, 0, Some(VolumeId(7))).unwrap();
        directory.set(&device, 2, Some(VolumeId(9))).unwrap();
        let again = Directory::read(&device, 4).unwrap();
        assert_eq!(again.owners(), vec![(0, VolumeId(7)), (2, VolumeId(9))]);
        assert_eq!(again.free_slot(), Some(1));
        // The newest copy damaged: the one before it (without volume 9) is read.
        let mut block = vec![0u8; BLOCK_SIZE];
        device.read(Lba(0), &mut block).unwrap();
        block[30] ^= 1;
        device.write(Lba(0), &block).unwrap();
        assert_eq!(Directory::read(&device, 4).unwrap().owners(), vec![(0, VolumeId(7))]);
        // Both damaged: refused, never read as empty.
        device.read(Lba(1), &mut block).unwrap();
        block[30] ^= 1;
        device.write(Lba(1), &block).unwrap();
        assert!(Directory::read(&device, 4).is_err());
    }
}
