//! The `tundra` command line. Every subcommand's names, flags and JSON keys are a user-facing
//! contract documented in docs/cli.md.

mod drive;
mod drive_bench;
mod measure;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "tundra", version, about = "Tundra: compressed storage for databases")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The emulated compressing drive: format, load, dump, trim, collect, inspect, benchmark.
    #[command(subcommand)]
    Drive(drive::DriveCommand),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Drive(command) => drive::run(command),
    };
    if let Err(error) = result {
        eprintln!("tundra: {error:#}");
        std::process::exit(1);
    }
}
