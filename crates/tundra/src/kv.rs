//! `tundra kv bench`: the reference compute node (tundra-kv) against a running node. Its RW node
//! sends redo and its RO nodes read pages at their own LSNs over the native protocol, and every
//! RO read is checked against a model of the committed data at that reader's LSN.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use tundra_client::Client;
use tundra_kv::{ClientStorage, PAGE_SIZE, RoConfig, RwConfig, WorkloadConfig, run_workload};
use tundra_proto::{VolumeMode, VolumeSpec};

#[derive(Subcommand)]
pub enum KvCommand {
    /// Run the reference compute node's workload against a running node and check every read.
    Bench(BenchArgs),
}

#[derive(Args)]
pub struct BenchArgs {
    /// The node's native protocol address.
    #[arg(long, default_value = tundra_node::config::DEFAULT_NATIVE_ADDR, value_name = "HOST:PORT")]
    addr: String,
    /// The volume the database lives on; made (8 KiB pages) if it does not exist. Its pages are
    /// made from redo only from the first commit on.
    #[arg(long, default_value = "kv")]
    volume: String,
    /// Size of the volume when it is made.
    #[arg(long, default_value = "64MiB")]
    size: String,
    #[arg(long, default_value_t = 2_000)]
    transactions: u64,
    /// Keys are numbered below this; half of them are loaded first.
    #[arg(long, default_value_t = 20_000)]
    keys: u64,
    #[arg(long, default_value_t = 2)]
    ro_nodes: u32,
    /// Every RO node stays this many commits behind the RW node.
    #[arg(long, default_value_t = 8)]
    ro_lag: u32,
    /// RO reads between two commits.
    #[arg(long, default_value_t = 16)]
    reads_per_commit: u32,
    /// Restart the RW node (a new writer epoch fences the old one) every this many commits; 0:
    /// never.
    #[arg(long, default_value_t = 0)]
    restart_every: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(command: KvCommand) -> Result<()> {
    match command {
        KvCommand::Bench(args) => bench(args),
    }
}

fn bench(args: BenchArgs) -> Result<()> {
    let connect = || {
        Client::connect(args.addr.as_str())
            .with_context(|| format!("connecting to the node at {} (is `tundra serve` running?)", args.addr))
    };
    let mut admin = connect()?;
    let volume = match admin.volume_lookup(&args.volume) {
        Ok(volume) => volume,
        Err(_) => {
            let size_bytes = tundra_device::size::parse_size(&args.size)
                .map_err(|e| anyhow::anyhow!("--size {:?}: {}", args.size, e.message()))?;
            let spec = VolumeSpec {
                name: args.volume.clone(),
                size_bytes,
                page_size: PAGE_SIZE as u32,
                mode: VolumeMode::Normal,
            };
            admin.volume_create(&spec).with_context(|| format!("creating volume {:?}", args.volume))?
        }
    };
    if volume.page_size as usize != PAGE_SIZE {
        bail!("volume {:?} has {}-byte pages; the database uses {PAGE_SIZE}", args.volume, volume.page_size);
    }
    let storage = Arc::new(ClientStorage::new(connect()?).context("the node's protocol")?);
    let config = WorkloadConfig {
        seed: args.seed,
        key_space: args.keys,
        initial_keys: args.keys / 2,
        transactions: args.transactions,
        reads_per_txn: args.reads_per_commit,
        ro_nodes: args.ro_nodes,
        ro_lag_commits: args.ro_lag,
        rw: RwConfig::default(),
        ro: RoConfig::default(),
        rw_restart_every: args.restart_every,
        ..WorkloadConfig::default()
    };
    if !args.json {
        eprintln!(
            "tundra kv bench: volume {:?} (id {}) at {}, {} transactions, {} keys, {} RO node(s) {} commits behind, \
             seed {}",
            args.volume, volume.id, args.addr, args.transactions, args.keys, args.ro_nodes, args.ro_lag, args.seed
        );
    }
    let started = Instant::now();
    let report = run_workload(storage, tundra_store::ids::VolumeId(volume.id), &config)
        .map_err(|e| anyhow::anyhow!("the workload stopped: {e}"))?;
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        let json = serde_json::json!({
            "volume": args.volume,
            "seed": args.seed,
            "seconds": seconds,
            "commits": report.commits,
            "reads_checked": report.reads_checked,
            "mismatches": report.mismatches,
            "rows_checked": report.rows_checked,
            "ro_resyncs": report.ro_resyncs,
            "rw_restarts": report.rw_restarts,
            "redo_bytes": report.redo_bytes,
            "final_lsn": report.final_lsn.0,
            "first_mismatch": report.first_mismatch,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        println!(
            "{} commits, {} reads checked ({} rows), {} mismatches, {} RO resyncs, {} RW restarts, {} bytes of redo, \
             {:.1} s",
            report.commits,
            report.reads_checked,
            report.rows_checked,
            report.mismatches,
            report.ro_resyncs,
            report.rw_restarts,
            report.redo_bytes,
            seconds
        );
        if let Some(first) = &report.first_mismatch {
            println!("first mismatch: {first}");
        }
    }
    if report.mismatches > 0 {
        bail!("{} reads did not match the committed data at their reader's LSN", report.mismatches);
    }
    Ok(())
}
