//! The `tundra-bench` command line: Tundra's benchmarks and measurements. Every subcommand's
//! names, flags and JSON keys are a contract documented in docs/bench-cli.md.

use clap::{Parser, Subcommand};
use tundra_bench::{drive, protocol, redo, store};

#[derive(Parser)]
#[command(
    name = "tundra-bench",
    version,
    about = "Tundra's benchmarks, each against a baseline measured in the same run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure the emulated drive against a plain file device (seed 000 Figure 7) and its
    /// garbage collection under random overwrites.
    Drive(drive::DriveArgs),
    /// Write database files page by page through the store onto an emulated drive, once per way
    /// of compressing (none, lz4, zstd, Algorithm 1), and report the space each really takes.
    Store(store::StoreArgs),
    /// Per-request overhead of the native protocol against in-process calls on a real node.
    Protocol(protocol::ProtocolArgs),
    /// Redo commit latency at queue depth 1: the redo log, and the redo log with compressed
    /// batches, against pwrite and fdatasync of the same bytes on the same filesystem.
    Redo(redo::RedoArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Drive(args) => drive::run(args),
        Command::Store(args) => store::run(args),
        Command::Protocol(args) => protocol::run(args),
        Command::Redo(args) => redo::run(args),
    };
    if let Err(error) = result {
        eprintln!("tundra-bench: {error:#}");
        std::process::exit(1);
    }
}
