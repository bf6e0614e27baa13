//! `tundra bench ...`: measurements of the designs built on the drive against their peers,
//! measured in the same run. Each subcommand lives in a module of its own under `bench/`.

#[cfg(feature = "rocksdb")]
mod drive_fs;
mod hashkv;
mod null_export;
#[cfg(feature = "rocksdb")]
mod rocks;

use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// The table-less hash KV store (seed 001 §3.3, Table 2) against RocksDB under one load
    /// generator: uniform keys, 7:3 GET:PUT, 400-byte values half compressible.
    Hashkv(hashkv::HashkvArgs),
    /// The in-process FUSE export with a plain O_DIRECT host file (or memory) behind it instead
    /// of a volume: what FUSE and a loop device cost without the store (bench/block-path's
    /// `fuse-null` step). A measuring instrument, hidden from --help.
    #[command(hide = true)]
    NullExport(null_export::NullExportArgs),
}

pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Hashkv(args) => hashkv::run(args),
        BenchCommand::NullExport(args) => null_export::run(args),
    }
}
