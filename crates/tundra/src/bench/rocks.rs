//! The peer of `tundra bench hashkv`: RocksDB (Debian's librocksdb 7.8.3 through the `rocksdb`
//! crate 0.20.1), built only with the `rocksdb` feature so that the default build never
//! compiles or links it.
//!
//! Its settings are RocksDB's defaults except where the comparison needs the two stores alike
//! (docs/measurements.md says why): every write synced to its WAL before it returns (as the
//! hash KV acknowledges a PUT only once its log is flushed), reads and compaction with direct
//! I/O and no block cache (the hash KV keeps no cache of its data either), and a 10-bit bloom
//! filter per table, which any deployed RocksDB has and which spares reads of levels that do
//! not hold the key.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use rocksdb::{BlockBasedOptions, DB, Options, WriteOptions};
use tundra_hashkv::load::KvTarget;

use super::drive_fs::DriveFs;

/// Which RocksDB the peer is, for the report.
pub const VERSION: &str = "RocksDB 7.8.3 (Debian librocksdb-dev), Rust crate rocksdb 0.20.1";

/// An open RocksDB database under measurement: on ext4 on an emulated drive, or on the host's
/// filesystem with no drive (`drive` None).
pub struct Rocks {
    db: DB,
    write: WriteOptions,
    drive: Option<Arc<DriveFs>>,
}

impl Rocks {
    /// Opens (creating if missing) the database at `path`, a directory on `drive`'s filesystem
    /// when one is given.
    pub fn open(path: &Path, drive: Option<Arc<DriveFs>>) -> Result<Rocks> {
        let mut table = BlockBasedOptions::default();
        table.disable_cache();
        table.set_bloom_filter(10.0, false);
        let mut options = Options::default();
        options.create_if_missing(true);
        options.set_use_direct_reads(true);
        options.set_use_direct_io_for_flush_and_compaction(true);
        options.set_block_based_table_factory(&table);
        let db = DB::open(&options, path).with_context(|| format!("opening RocksDB at {}", path.display()))?;
        let mut write = WriteOptions::default();
        write.set_sync(true);
        Ok(Rocks { db, write, drive })
    }

    /// Flushes the memtables, so the files hold every record, and closes.
    pub fn close(self) -> Result<()> {
        self.db.flush().context("flushing RocksDB's memtables")?;
        drop(self.db);
        Ok(())
    }
}

impl KvTarget for Rocks {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        self.db.get(key).map_err(|e| e.to_string())
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), String> {
        self.db.put_opt(key, value, &self.write).map_err(|e| e.to_string())
    }

    fn drive_cpu_ns(&self) -> u64 {
        self.drive.as_ref().map_or(0, |d| d.serving_cpu_ns())
    }

    fn drive_codec_cpu_ns(&self) -> u64 {
        self.drive.as_ref().map_or(0, |d| d.codec_cpu_ns())
    }
}
