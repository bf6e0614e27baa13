//! The `tundra` command line. Every subcommand's names, flags and JSON keys are a user-facing
//! contract documented in docs/cli.md. The benchmarks and measurements are not here: they are
//! the `tundra-bench` binary (crates/tundra-bench, docs/bench-cli.md), except `tundra bench`,
//! which measures the designs built on the drive against their peers.

mod analyze;
mod analyze_report;
mod bench;
mod cluster;
mod drive;
mod kv;
mod rebalance;
mod repair;
mod schedule;
mod serve;
mod sim;
mod volume;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "tundra", version, about = "Tundra: compressed storage for databases")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The emulated compressing drive: format, load, dump, trim, collect, inspect.
    #[command(subcommand)]
    Drive(drive::DriveCommand),
    /// Estimate what Tundra would store for database files: each compression layer, lz4 vs zstd,
    /// Algorithm 1's mix.
    Analyze(analyze::AnalyzeArgs),
    /// Run the node: volumes over NBD and the native protocol, metrics; the embedded default
    /// keeps everything in ./tundra-data and listens on 127.0.0.1 only.
    Serve(serve::NodeArgs),
    /// Run the node with a volume mounted as a file through FUSE in its own process (for a
    /// loop device and a kernel filesystem on this machine; NBD serves remote clients).
    Mount(serve::MountArgs),
    /// Manage a running node's volumes.
    #[command(subcommand)]
    Volume(volume::VolumeCommand),
    /// A cluster's nodes and chunk groups, as a node of it sees them.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// A running node's space, compression ratios per layer, algorithm mix, GC and latencies.
    Stats(volume::StatsArgs),
    /// Check a stopped node's data directory: every page read and verified, no block used twice,
    /// no leaked space.
    Fsck(serve::FsckArgs),
    /// The reference compute node (a B+tree key-value database that sends redo) against a
    /// running node.
    #[command(subcommand)]
    Kv(kv::KvCommand),
    /// Repair a stopped node whose journal is damaged: without --accept-loss, report what would
    /// be dropped; with it, truncate the log at the damage and list the pages that then fail.
    Repair(repair::RepairArgs),
    /// Simulations on the product's decision code: `trim`, virtual data trim against seed 001's
    /// Table 1; `schedule`, the cluster manager's placement and scheduling at 1,000 nodes.
    #[command(subcommand)]
    Sim(sim::SimCommand),
    /// Measure the designs built on the drive against their peers, in the same run.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Drive(command) => drive::run(command),
        Command::Analyze(args) => analyze::run(args),
        Command::Serve(args) => serve::serve(args),
        Command::Mount(args) => serve::mount(args),
        Command::Volume(command) => volume::run(command),
        Command::Stats(args) => volume::stats(args),
        Command::Cluster(command) => cluster::run(command),
        Command::Fsck(args) => serve::fsck(args),
        Command::Repair(args) => repair::repair(args),
        Command::Kv(command) => kv::run(command),
        Command::Sim(command) => sim::run(command),
        Command::Bench(command) => bench::run(command),
    };
    if let Err(error) = result {
        eprintln!("tundra: {error:#}");
        std::process::exit(1);
    }
}
