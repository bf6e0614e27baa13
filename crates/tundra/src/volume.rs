//! `tundra volume ...` and `tundra stats`: commands that talk to a running node over the native
//! protocol.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use tundra_client::Client;
use tundra_device::size::{format_size, parse_size};
use tundra_proto::{VolumeInfo, VolumeMode, VolumeSpec};

#[derive(Args, Clone)]
pub struct Connect {
    /// The node's native protocol address.
    #[arg(long, default_value = tundra_node::config::DEFAULT_NATIVE_ADDR, value_name = "HOST:PORT")]
    addr: String,
}

impl Connect {
    pub fn client(&self) -> Result<Client> {
        Client::connect(self.addr.as_str())
            .with_context(|| format!("connecting to the node at {} (is `tundra serve` running?)", self.addr))
    }
}

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Create a volume: mode normal is compressed on the drive, mode none (for redo/WAL) is
    /// never compressed and lives on the fast device.
    Create {
        name: String,
        #[arg(long, value_name = "SIZE")]
        size: String,
        #[arg(long, default_value = "8KiB", value_name = "8KiB|16KiB")]
        page_size: String,
        #[arg(long, default_value = "normal", value_name = "normal|none")]
        mode: String,
        /// Copies on the nodes of the server's cluster (every node holds one: the cluster's
        /// node count); 1 keeps the volume on the node asked only.
        #[arg(long, default_value_t = 1, value_name = "N")]
        replicas: u8,
        #[command(flatten)]
        connect: Connect,
    },
    /// List the volumes.
    List {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: Connect,
    },
    /// Grow a volume.
    Resize {
        name: String,
        #[arg(long, value_name = "SIZE")]
        size: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Delete a volume and everything in it.
    Delete {
        name: String,
        #[command(flatten)]
        connect: Connect,
    },
    /// Heavily compress a volume's pages (seed 000 §3.2.3: zstd at a high level over runs of
    /// pages, for archived data); on a replicated volume each chunk's leader compresses and
    /// every replica stores the segments.
    HeavyCompress {
        name: String,
        /// The first page.
        #[arg(long, default_value_t = 0, value_name = "PAGE")]
        first: u64,
        /// How many pages (default: to the volume's end).
        #[arg(long, value_name = "N")]
        count: Option<u64>,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: Connect,
    },
    /// One volume's space, mix and latencies.
    Stats {
        name: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: Connect,
    },
}

fn mode_name(mode: VolumeMode) -> &'static str {
    match mode {
        VolumeMode::Normal => "normal",
        VolumeMode::None => "none",
    }
}

fn print_volume(v: &VolumeInfo) {
    println!(
        "{}\tid {}\t{}\t{} pages of {}\tmode {}",
        printable(&v.name),
        v.id,
        format_size(v.size_bytes),
        v.page_count(),
        format_size(u64::from(v.page_size)),
        mode_name(v.mode)
    );
}

pub fn run(command: VolumeCommand) -> Result<()> {
    match command {
        VolumeCommand::Create { name, size, page_size, mode, replicas, connect } => {
            let size_bytes = size_arg("--size", &size)?;
            let page_size = size_arg("--page-size", &page_size)?;
            if page_size != 8192 && page_size != 16384 {
                bail!("--page-size {page_size}: pages are 8KiB or 16KiB");
            }
            let mode = match mode.as_str() {
                "normal" => VolumeMode::Normal,
                "none" => VolumeMode::None,
                other => bail!("--mode {other}: normal (compressed) or none (uncompressed)"),
            };
            let spec = VolumeSpec { name, size_bytes, page_size: page_size as u32, mode };
            let mut client = connect.client()?;
            let v = match replicas {
                0 => bail!("--replicas 0: a volume has at least one copy"),
                1 => client.volume_create(&spec)?,
                n => client.volume_create_replicated(&spec, n)?,
            };
            print_volume(&v);
            warn_if_overcommitted(&mut client, v.mode)?;
        }
        VolumeCommand::List { json, connect } => {
            let volumes = connect.client()?.volume_list()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&volumes)?);
            } else if volumes.is_empty() {
                println!("no volumes; create one with `tundra volume create NAME --size SIZE`");
            } else {
                volumes.iter().for_each(print_volume);
            }
        }
        VolumeCommand::Resize { name, size, connect } => {
            let size_bytes = size_arg("--size", &size)?;
            let mut client = connect.client()?;
            let v = client.volume_resize(&name, size_bytes)?;
            print_volume(&v);
            warn_if_overcommitted(&mut client, v.mode)?;
        }
        VolumeCommand::Delete { name, connect } => {
            connect.client()?.volume_delete(&name)?;
            println!("deleted {}", printable(&name));
        }
        VolumeCommand::HeavyCompress { name, first, count, json, connect } => {
            heavy_compress(&mut connect.client()?, &name, first, count, json)?;
        }
        VolumeCommand::Stats { name, json, connect } => {
            let mut client = connect.client()?;
            let v = client.volume_lookup(&name)?;
            let text = client.stats(Some(v.id))?;
            let stats: serde_json::Value = serde_json::from_str(&text).context("the node's stats are not JSON")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&stats)?);
            } else {
                print_volume_stats(&stats);
            }
        }
    }
    Ok(())
}

/// Pages a heavy compression asks for at a time: each batch's progress is printed.
const HEAVY_BATCH_PAGES: u64 = 8192;

/// `tundra volume heavy-compress`: the range in batches, each one's figures on stderr, the
/// total on stdout.
fn heavy_compress(client: &mut Client, name: &str, first: u64, count: Option<u64>, json: bool) -> Result<()> {
    let v = client.volume_lookup(name)?;
    let pages = v.page_count();
    if first >= pages {
        bail!("--first {first}: volume {} has {pages} pages (0 to {})", printable(name), pages.saturating_sub(1));
    }
    let count = count.unwrap_or(pages - first);
    let end = first.checked_add(count).filter(|&end| end <= pages).ok_or_else(|| {
        anyhow::anyhow!(
            "--count {count}: pages {first} to {} are outside volume {}, which has {pages} pages",
            first.saturating_add(count),
            printable(name)
        )
    })?;
    let mut total = tundra_proto::HeavyResult { pages: 0, segments: 0, bytes_before: 0, bytes_after: 0 };
    let mut at = first;
    while at < end {
        let n = HEAVY_BATCH_PAGES.min(end - at);
        let part = client.heavy_compress(v.id, at, n)?;
        total.pages += part.pages;
        total.segments += part.segments;
        total.bytes_before += part.bytes_before;
        total.bytes_after += part.bytes_after;
        at += n;
        if end - first > HEAVY_BATCH_PAGES {
            eprintln!(
                "tundra: pages {first} to {at} of {end}: {} pages into {} segments so far",
                total.pages, total.segments
            );
        }
    }
    if json {
        let report = serde_json::json!({
            "volume": name,
            "first": first,
            "count": count,
            "pages": total.pages,
            "segments": total.segments,
            "bytes_before": total.bytes_before,
            "bytes_after": total.bytes_after,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if total.pages == 0 {
        println!("nothing to compress: no page in {first} to {end} is stored outside a heavy segment");
    } else {
        println!(
            "{} pages into {} segments: {} before, {} after ({:.2}x)",
            total.pages,
            total.segments,
            format_size(total.bytes_before),
            format_size(total.bytes_after),
            total.bytes_before as f64 / total.bytes_after.max(1) as f64
        );
    }
    Ok(())
}

/// A size given on the command line, or what is wrong with it (said once).
fn size_arg(flag: &str, text: &str) -> Result<u64> {
    parse_size(text).map_err(|e| anyhow::anyhow!("{flag} {text}: {}", e.message()))
}

/// A name as it may be printed: control characters (tabs, newlines, terminal escapes) of a
/// volume named before names were checked are shown escaped, never raw.
fn printable(name: &str) -> String {
    tundra_store::volume::printable(name)
}

/// The node accepts volumes beyond a device's space only when its config allows it
/// (`overcommit = true` under [drive] or [fast]); the operator who asked hears it here too.
fn warn_if_overcommitted(client: &mut Client, mode: VolumeMode) -> Result<()> {
    let stats: serde_json::Value =
        serde_json::from_str(&client.stats(None)?).context("the node's stats are not JSON")?;
    let (device, capacity, space, section) = match mode {
        VolumeMode::Normal => {
            ("drive", num(&stats["drive"], "logical_capacity_bytes"), "drive's logical space", "drive")
        }
        VolumeMode::None => ("fast", num(&stats, "fast_volume_bytes"), "fast device's space for mode none", "fast"),
    };
    let total: f64 = stats["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["device"].as_str() == Some(device))
        .map(|v| num(v, "size_bytes"))
        .sum();
    if total > capacity {
        eprintln!(
            "tundra: warning: these volumes take {} of the {} {space} (allowed by overcommit = true under \
             [{section}]); writes fail with no space once their pages no longer fit",
            format_size(total as u64),
            format_size(capacity as u64)
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct StatsArgs {
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    connect: Connect,
}

fn num(v: &serde_json::Value, key: &str) -> f64 {
    v.get(key).and_then(|x| x.as_f64()).unwrap_or(0.0)
}

fn bytes(v: &serde_json::Value, key: &str) -> String {
    format_size(num(v, key) as u64)
}

fn print_volume_stats(v: &serde_json::Value) {
    println!(
        "volume {} ({} mode, {} device): {} pages, {} logical -> {} after software ({:.2}x) -> {} physical ({:.2}x)",
        printable(v["name"].as_str().unwrap_or("?")),
        v["mode"].as_str().unwrap_or("?"),
        v["device"].as_str().unwrap_or("?"),
        num(v, "pages"),
        bytes(v, "logical_bytes"),
        bytes(v, "software_bytes"),
        num(v, "software_ratio"),
        bytes(v, "physical_bytes_attributed"),
        num(v, "ratio"),
    );
    println!(
        "  pages: {} lz4, {} zstd, {} raw, {} heavy",
        num(v, "lz4_pages"),
        num(v, "zstd_pages"),
        num(v, "raw_pages"),
        num(v, "heavy_pages")
    );
    for op in ["page_read", "page_write", "flush"] {
        let h = &v[op];
        println!(
            "  {op}: {} ops, mean {:.1} µs, p50 <= {} µs, p99 <= {} µs",
            num(h, "count"),
            num(h, "mean_us"),
            num(h, "p50_us"),
            num(h, "p99_us")
        );
    }
}

pub fn stats(args: StatsArgs) -> Result<()> {
    let text = args.connect.client()?.stats(None)?;
    let stats: serde_json::Value = serde_json::from_str(&text).context("the node's stats are not JSON")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&stats)?);
        return Ok(());
    }
    let running = &stats["configuration"];
    println!(
        "configuration: software compression {}, drive compression {}{}",
        running["software_compression"].as_str().unwrap_or("?"),
        running["drive_compression"].as_str().unwrap_or("?"),
        if running["drive_deferred"].as_bool() == Some(true) { " (deferred, on the drive's thread)" } else { "" }
    );
    let c = &stats["compressed"];
    println!(
        "compressed volumes: {} pages, {} logical -> {} after software ({:.2}x) -> {} physical on the drive ({:.2}x both layers; drive alone {:.2}x)",
        num(c, "pages"),
        bytes(c, "logical_bytes"),
        bytes(c, "software_bytes"),
        num(&stats, "software_ratio"),
        bytes(&stats["drive"], "physical_used_bytes"),
        num(&stats, "ratio"),
        num(&stats, "drive_ratio"),
    );
    println!(
        "algorithm mix: {} lz4, {} zstd, {} raw, {} heavy",
        num(c, "lz4_pages"),
        num(c, "zstd_pages"),
        num(c, "raw_pages"),
        num(c, "heavy_pages")
    );
    let d = &stats["drive"];
    println!(
        "drive: {} of {} physical used, GC write amplification {:.2}, {} free segments of {}",
        bytes(d, "physical_used_bytes"),
        bytes(d, "physical_capacity_bytes"),
        num(d, "gc_write_amplification"),
        num(d, "free_segments"),
        num(d, "segments"),
    );
    println!(
        "drive: {} blocks waiting for background compression, {} compressed in the background",
        num(d, "deferred_pending_blocks"),
        num(d, "deferred_compressed_blocks"),
    );
    let cpu = &stats["cpu"];
    println!(
        "cpu: {:.2} s in the node process, of which {:.2} s the emulated drive (background {:.2} s, deflate in writers {:.2} s, inflate in readers {:.2} s; a hardware drive takes this off the host) and {:.2} s the host software",
        num(cpu, "process_seconds"),
        num(cpu, "drive_seconds"),
        num(cpu, "drive_background_seconds"),
        num(cpu, "drive_deflate_seconds"),
        num(cpu, "drive_inflate_seconds"),
        num(cpu, "host_seconds"),
    );
    let r = &stats["rechoose"];
    println!(
        "chosen again on an idle host: {} of {} pages examined stored anew, {} -> {}; {} waiting, {} passes found the host busy",
        num(r, "rewritten_pages"),
        num(r, "examined_pages"),
        bytes(r, "bytes_before"),
        bytes(r, "bytes_after"),
        num(r, "pending_pages"),
        num(r, "busy_passes"),
    );
    if let Some(mounts) = stats["mounts"].as_array() {
        for m in mounts {
            println!(
                "mount: volume {} on {} (through {}, {} requests by io_uring): {} reads ({}), {} writes ({}), \
                 {} fsyncs, {} zeroed, {} errors",
                m["volume"].as_str().unwrap_or("?"),
                m["file"].as_str().unwrap_or("?"),
                m["transport"].as_str().unwrap_or("?"),
                num(m, "io_uring_requests"),
                num(m, "reads"),
                bytes(m, "bytes_read"),
                num(m, "writes"),
                bytes(m, "bytes_written"),
                num(m, "fsyncs"),
                bytes(m, "zeroed_bytes"),
                num(m, "errors"),
            );
        }
    }
    println!(
        "index: {} ({:.1} bytes per page); page cache: {} hits, {} misses; write-back cache: {} not yet flushed, \
         {} pieces of pages merged ({} read their page first)",
        bytes(&stats, "index_memory_bytes"),
        num(&stats, "index_bytes_per_page"),
        num(&stats, "cache_hits"),
        num(&stats, "cache_misses"),
        bytes(&stats, "write_back_dirty_bytes"),
        num(&stats, "write_back_pieces"),
        num(&stats, "write_back_piece_reads")
    );
    if let Some(volumes) = stats["volumes"].as_array() {
        for v in volumes {
            print_volume_stats(v);
        }
    }
    Ok(())
}
