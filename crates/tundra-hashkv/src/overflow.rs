//! The overflow store (seed 001 §3.3.2: "a separate data store to host those spilled-over KV
//! pairs"; §3.3.3 used SQLite): the rare records whose bucket is full live in a redb database,
//! keyed by their bucket's LBA and their key, so that a bucket's spilled keys sit together.
//!
//! redb runs on a region of the same drive through [`DriveRegion`], its `StorageBackend`: its
//! bytes are compressed and counted by the drive like the table's, and the crash tests cut its
//! writes at the same points. Region block 0 records the database's length (redb treats the
//! backend as a file it may grow and shrink); bytes past the length are kept zero, as a file's
//! would read.

use std::sync::Arc;

use crate::drive::Drive;
use parking_lot::Mutex;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, StorageBackend, TableDefinition};
use tundra_device::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Lba};

use crate::layout::Key;
use crate::{Error, Result};

const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("overflow");
const LENGTH_MAGIC: [u8; 8] = *b"HKOVLEN1";
/// The message of the I/O error a region reports when it has no room; the store maps it to
/// [`ErrorKind::Full`](crate::ErrorKind::Full).
pub const REGION_FULL: &str = "the overflow region is full";
/// redb's page cache: the overflow store holds few records, and the store promises no cache of
/// its data beyond what the drive's map needs.
const CACHE_BYTES: usize = 1 << 20;

/// A change to the overflow store: a put, or a delete when `value` is None.
pub struct OverflowChange {
    pub lba: Lba,
    pub key: Key,
    pub value: Option<Vec<u8>>,
}

/// The redb database of spilled records.
pub struct Overflow {
    db: Database,
}

fn db_key(lba: Lba, key: &Key) -> Vec<u8> {
    [&lba.0.to_be_bytes()[..], key.as_bytes()].concat()
}

impl Overflow {
    /// Opens (or creates, on a zeroed region) the database in `blocks` blocks at `first`.
    pub fn open(drive: Arc<Drive>, first: Lba, blocks: u64) -> Result<Overflow> {
        let region = DriveRegion::open(drive, first, blocks)?;
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create_with_backend(region)
            .map_err(|e| Error::overflow("opening the overflow store", e))?;
        let txn = db.begin_write().map_err(|e| Error::overflow("starting an overflow transaction", e))?;
        txn.open_table(TABLE).map_err(|e| Error::overflow("creating the overflow table", e))?;
        txn.commit().map_err(|e| Error::overflow("committing the overflow table", e))?;
        Ok(Overflow { db })
    }

    pub fn get(&self, lba: Lba, key: &Key) -> Result<Option<Vec<u8>>> {
        let txn = self.db.begin_read().map_err(|e| Error::overflow("reading the overflow store", e))?;
        let table = txn.open_table(TABLE).map_err(|e| Error::overflow("opening the overflow table", e))?;
        let value =
            table.get(db_key(lba, key).as_slice()).map_err(|e| Error::overflow("reading the overflow store", e))?;
        Ok(value.map(|v| v.value().to_vec()))
    }

    /// Applies `changes` in one durable transaction.
    pub fn apply(&self, changes: &[OverflowChange]) -> Result<()> {
        let txn = self.db.begin_write().map_err(|e| Error::overflow("starting an overflow transaction", e))?;
        {
            let mut table = txn.open_table(TABLE).map_err(|e| Error::overflow("opening the overflow table", e))?;
            for change in changes {
                let key = db_key(change.lba, &change.key);
                let result = match &change.value {
                    Some(value) => table.insert(key.as_slice(), value.as_slice()).map(|_| ()),
                    None => table.remove(key.as_slice()).map(|_| ()),
                };
                result.map_err(|e| Error::overflow("changing the overflow store", e))?;
            }
        }
        txn.commit().map_err(|e| Error::overflow("committing to the overflow store", e))
    }

    /// Every record: (bucket LBA, key, value). For statistics and invariant checks.
    pub fn records(&self) -> Result<Vec<(Lba, Key, Vec<u8>)>> {
        let txn = self.db.begin_read().map_err(|e| Error::overflow("reading the overflow store", e))?;
        let table = txn.open_table(TABLE).map_err(|e| Error::overflow("opening the overflow table", e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| Error::overflow("listing the overflow store", e))? {
            let (k, v) = entry.map_err(|e| Error::overflow("listing the overflow store", e))?;
            let k = k.value();
            if k.len() < 9 {
                return Err(Error::corrupted(format!("an overflow key of {} bytes", k.len())));
            }
            let lba = Lba(u64::from_be_bytes(k[..8].try_into().expect("8 bytes")));
            out.push((lba, Key::new(&k[8..])?, v.value().to_vec()));
        }
        Ok(out)
    }

    pub fn record_count(&self) -> Result<u64> {
        let txn = self.db.begin_read().map_err(|e| Error::overflow("reading the overflow store", e))?;
        let table = txn.open_table(TABLE).map_err(|e| Error::overflow("opening the overflow table", e))?;
        table.len().map_err(|e| Error::overflow("counting the overflow store", e))
    }
}

/// A range of the drive's blocks seen by redb as a growable file.
pub struct DriveRegion {
    drive: Arc<Drive>,
    /// The length block; data starts at the block after it.
    first: Lba,
    data_blocks: u64,
    length: Mutex<u64>,
}

impl std::fmt::Debug for DriveRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriveRegion").field("first", &self.first).field("data_blocks", &self.data_blocks).finish()
    }
}

fn io_error(context: &str, error: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("{context}: {error}"))
}

impl DriveRegion {
    fn open(drive: Arc<Drive>, first: Lba, blocks: u64) -> Result<DriveRegion> {
        let mut block = vec![0u8; BLOCK_SIZE];
        drive.read(first, &mut block).map_err(|e| Error::device("reading the overflow region's length", e))?;
        let length = if tundra_device::is_zero(&block) {
            0
        } else {
            let crc = u32::from_le_bytes(block[16..20].try_into().expect("4 bytes"));
            if block[..8] != LENGTH_MAGIC || crc != crc32c::crc32c(&block[..16]) {
                return Err(Error::corrupted(format!("the overflow region's length block at {first} does not verify")));
            }
            u64::from_le_bytes(block[8..16].try_into().expect("8 bytes"))
        };
        let data_blocks = blocks - 1;
        if length > data_blocks * BLOCK_SIZE_BYTES {
            return Err(Error::corrupted(format!("the overflow region claims {length} bytes, more than it has")));
        }
        Ok(DriveRegion { drive, first, data_blocks, length: Mutex::new(length) })
    }

    fn data_lba(&self, block: u64) -> Lba {
        Lba(self.first.0 + 1 + block)
    }

    fn read_blocks(&self, block: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.drive.read(self.data_lba(block), buf).map_err(|e| io_error("reading the overflow region", e))
    }

    /// Writes `data` at byte `offset`, reading and merging the partial blocks at either end.
    fn write_bytes(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let first = offset / BLOCK_SIZE_BYTES;
        let end = (offset + data.len() as u64).div_ceil(BLOCK_SIZE_BYTES);
        let mut buf = vec![0u8; ((end - first) * BLOCK_SIZE_BYTES) as usize];
        let head = (offset - first * BLOCK_SIZE_BYTES) as usize;
        if head != 0 {
            self.read_blocks(first, &mut buf[..BLOCK_SIZE])?;
        }
        let tail = head + data.len();
        if !tail.is_multiple_of(BLOCK_SIZE) && (end - 1 > first || head == 0) {
            let at = buf.len() - BLOCK_SIZE;
            self.read_blocks(end - 1, &mut buf[at..])?;
        }
        buf[head..tail].copy_from_slice(data);
        self.drive.write(self.data_lba(first), &buf).map_err(|e| {
            if e.kind() == tundra_device::ErrorKind::DriveFull {
                io_error(REGION_FULL, e)
            } else {
                io_error("writing the overflow region", e)
            }
        })
    }

    /// Zeroes bytes `from..to` (trims the whole blocks among them).
    fn zero_range(&self, from: u64, to: u64) -> std::io::Result<()> {
        if from >= to {
            return Ok(());
        }
        let first_whole = from.div_ceil(BLOCK_SIZE_BYTES);
        let end_whole = to / BLOCK_SIZE_BYTES;
        if first_whole < end_whole {
            self.drive
                .trim(self.data_lba(first_whole), end_whole - first_whole)
                .map_err(|e| io_error("trimming the overflow region", e))?;
        } else {
            // One block holds the whole range.
            return self.write_bytes(from, &vec![0u8; (to - from) as usize]);
        }
        self.write_bytes(from, &vec![0u8; (first_whole * BLOCK_SIZE_BYTES - from) as usize])?;
        self.write_bytes(end_whole * BLOCK_SIZE_BYTES, &vec![0u8; (to - end_whole * BLOCK_SIZE_BYTES) as usize])
    }

    fn write_length(&self, length: u64) -> std::io::Result<()> {
        let mut block = vec![0u8; BLOCK_SIZE];
        block[..8].copy_from_slice(&LENGTH_MAGIC);
        block[8..16].copy_from_slice(&length.to_le_bytes());
        let crc = crc32c::crc32c(&block[..16]);
        block[16..20].copy_from_slice(&crc.to_le_bytes());
        self.drive.write(self.first, &block).map_err(|e| io_error("writing the overflow region's length", e))
    }
}

impl StorageBackend for DriveRegion {
    fn len(&self) -> std::io::Result<u64> {
        Ok(*self.length.lock())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let length = *self.length.lock();
        let end = offset.checked_add(out.len() as u64).filter(|&end| end <= length);
        if end.is_none() {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "read past the overflow region's end"));
        }
        if out.is_empty() {
            return Ok(());
        }
        let first = offset / BLOCK_SIZE_BYTES;
        let last = (offset + out.len() as u64).div_ceil(BLOCK_SIZE_BYTES);
        let mut buf = vec![0u8; ((last - first) * BLOCK_SIZE_BYTES) as usize];
        self.read_blocks(first, &mut buf)?;
        let head = (offset - first * BLOCK_SIZE_BYTES) as usize;
        out.copy_from_slice(&buf[head..head + out.len()]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        let mut length = self.length.lock();
        if len > self.data_blocks * BLOCK_SIZE_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!("{REGION_FULL}: {len} bytes asked, {} available", self.data_blocks * BLOCK_SIZE_BYTES),
            ));
        }
        // Whatever lies between the old and the new end must read as zeros once inside the
        // file, and must not come back when the file grows again.
        let (from, to) = if len > *length { (*length, len) } else { (len, *length) };
        self.zero_range(from, to)?;
        self.write_length(len)?;
        *length = len;
        Ok(())
    }

    fn sync_data(&self) -> std::io::Result<()> {
        self.drive.flush().map_err(|e| io_error("flushing the overflow region", e))
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let length = self.length.lock();
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > *length) {
            return Err(std::io::Error::other("write past the overflow region's end"));
        }
        // The length lock also orders the read-modify-write of partial blocks.
        self.write_bytes(offset, data)
    }
}
