//! `tundra bench ...`: measurements of the designs built on the drive against their peers,
//! measured in the same run. Each subcommand lives in a module of its own under `bench/`.

#[cfg(feature = "rocksdb")]
mod drive_fs;
mod hashkv;
#[cfg(feature = "rocksdb")]
mod rocks;

use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// The table-less hash KV store (seed 001 §3.3, Table 2) against RocksDB under one load
    /// generator: uniform keys, 7:3 GET:PUT, 400-byte values half compressible.
    Hashkv(hashkv::HashkvArgs),
}

pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Hashkv(args) => hashkv::run(args),
    }
}
