//! `tundra-bench protocol`: what the native protocol costs per request on a real node.
//!
//! A node is opened on a scratch data directory (a small drive and fast device, as files) and
//! the same page reads and writes run as in-process calls on its service and through the
//! protocol server and client on 127.0.0.1 ([`crate::overhead`]), in one run, so the answer is
//! a difference and a ratio against a baseline measured beside it.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use tundra_device::size::parse_size;
use tundra_node::native::NodeService;
use tundra_node::{Config, Node};
use tundra_proto::{Service, VolumeMode, VolumeSpec, WriteMode};

use crate::overhead::{OverheadConfig, overhead_with};

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    Auto,
    Lz4,
    Zstd,
    None,
}

#[derive(Args)]
pub struct ProtocolArgs {
    /// Reads and writes per phase (each phase is preceded by a tenth as many to warm up).
    #[arg(long, default_value_t = 20_000)]
    ops: usize,
    /// Requests in flight in the pipelined phase.
    #[arg(long, default_value_t = 16)]
    queue_depth: usize,
    #[arg(long, default_value = "8KiB")]
    page_size: String,
    /// How pages are written: Algorithm 1 (auto), one codec, or raw (none).
    #[arg(long, value_enum, default_value = "auto")]
    write_mode: Mode,
    /// Pages of the volume the requests touch (its size is this many pages).
    #[arg(long, default_value_t = 4096)]
    pages: u64,
    /// Scratch data directory for the node (default: a new temporary directory, removed after).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub fn run(args: ProtocolArgs) -> Result<()> {
    let page_size = parse_size(&args.page_size).with_context(|| format!("--page-size {}", args.page_size))?;
    if page_size != 8192 && page_size != 16384 {
        bail!("--page-size must be 8KiB or 16KiB, not {}", args.page_size);
    }
    if args.ops == 0 || args.queue_depth == 0 || args.pages == 0 {
        bail!("--ops, --queue-depth and --pages must be at least 1");
    }
    let scratch;
    let data_dir = match &args.data_dir {
        Some(dir) => {
            if dir.exists() {
                bail!("{} exists: the benchmark needs a new data directory", dir.display());
            }
            dir.clone()
        }
        None => {
            scratch = tempfile::Builder::new().prefix("tundra-bench-protocol.").tempdir()?;
            scratch.path().join("data")
        }
    };
    let volume_bytes = args.pages * page_size;
    let mut config = Config::parse(&format!(
        "[drive]\nphysical = \"{}\"\nlogical = \"{}\"\n[fast]\nvolumes = \"64MiB\"\n",
        (volume_bytes * 2).max(64 << 20),
        (volume_bytes * 4).max(128 << 20)
    ))?;
    config.data_dir = data_dir;
    let node = Arc::new(Node::open(&config, &mut |_| {})?);
    let service = Arc::new(NodeService(node.clone()));
    let volume = service
        .volume_create(VolumeSpec {
            name: "bench".into(),
            size_bytes: volume_bytes,
            page_size: page_size as u32,
            mode: VolumeMode::Normal,
        })
        .map_err(|e| anyhow::anyhow!("creating the benchmark volume: {e}"))?;
    let write_mode = match args.write_mode {
        Mode::Auto => WriteMode::Auto,
        Mode::Lz4 => WriteMode::Lz4,
        Mode::Zstd => WriteMode::Zstd,
        Mode::None => WriteMode::None,
    };
    let bench = OverheadConfig {
        volume: volume.id,
        page_size: page_size as usize,
        ops: args.ops,
        queue_depth: args.queue_depth,
        write_mode,
    };
    if !args.json {
        eprintln!(
            "tundra-bench protocol: a node in {} ({} volume, mode normal), {} ops per phase, depth 1 and {}; \
             client, server and node share this machine's cores",
            config.data_dir.display(),
            tundra_device::size::format_size(volume_bytes),
            args.ops,
            args.queue_depth
        );
    }
    let report = overhead_with(service, &bench).context("running the benchmark")?;
    node.close().context("closing the node")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    Ok(())
}
