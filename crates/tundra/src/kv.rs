//! `tundra kv bench`: the reference compute node (tundra-kv) against a running node. Its RW node
//! sends redo and its RO nodes read pages at their own LSNs over the native protocol, and every
//! RO read is checked against a model of the committed data at that reader's LSN.
//!
//! `tundra kv lagging`: RO nodes reading about a second behind a write-only RW node (seed 000
//! Figure 15), their read-only transactions' latency measured.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use tundra_client::Client;
use tundra_kv::{
    ClientStorage, LaggingConfig, Mix, PAGE_SIZE, RoConfig, RwConfig, WorkloadConfig, WorkloadReport, run_lagging,
    run_workload_with,
};
use tundra_proto::{VolumeInfo, VolumeMode, VolumeSpec};

#[derive(Subcommand)]
pub enum KvCommand {
    /// Run the reference compute node's workload against a running node and check every read.
    Bench(BenchArgs),
    /// RO nodes lagging behind a write-only RW node: the latency of their read-only
    /// transactions (seed 000 Figure 15), for comparing per-page log slots on and off.
    Lagging(LaggingArgs),
}

#[derive(Args)]
pub struct LaggingArgs {
    /// The node's native protocol address.
    #[arg(long, default_value = tundra_node::config::DEFAULT_NATIVE_ADDR, value_name = "HOST:PORT")]
    addr: String,
    /// The volume the database lives on; made (8 KiB pages) if it does not exist. Use a new
    /// volume for each run: the load inserts every key.
    #[arg(long, default_value = "lagging")]
    volume: String,
    /// Size of the volume when it is made.
    #[arg(long, default_value = "256MiB")]
    size: String,
    /// Keys loaded before the run.
    #[arg(long, default_value_t = 50_000)]
    keys: u64,
    /// RO threads, each an RO node with its own connection, lease and page cache.
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// How far behind the newest commit the RO nodes read, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    lag_ms: u64,
    /// Pages each RO node caches.
    #[arg(long, default_value_t = 64)]
    ro_cache_pages: usize,
    /// RW commits per second at most; 0: as fast as the node takes them. Comparing storage
    /// settings at one fixed rate gives both the same write load.
    #[arg(long, default_value_t = 0)]
    rw_commits_per_s: u32,
    /// Seconds of warm-up, then of measurement.
    #[arg(long, default_value_t = 3)]
    warmup_secs: u64,
    #[arg(long, default_value_t = 10)]
    measure_secs: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
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
    /// Ride through the node going away and coming back (killed and restarted): reconnect for
    /// up to a minute, settle the commit in doubt from the durable LSN, resync the readers.
    #[arg(long)]
    survive_restarts: bool,
    /// The workload's mix: weights of RO point selects and ranges, and of the RW's updates,
    /// inserts and deletes, as `point_select=10,range=4,update=2,insert=1,delete=1` (sysbench's
    /// oltp_read_write, the default); a weight not named keeps its default.
    #[arg(long, default_value = "point_select=10,range=4,update=2,insert=1,delete=1", value_parser = parse_mix)]
    mix: Mix,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the report as JSON (and no progress lines).
    #[arg(long)]
    json: bool,
}

fn parse_mix(text: &str) -> std::result::Result<Mix, String> {
    text.parse()
}

pub fn run(command: KvCommand) -> Result<()> {
    match command {
        KvCommand::Bench(args) => bench(args),
        KvCommand::Lagging(args) => lagging(args),
    }
}

fn connect(addr: &str) -> Result<Client> {
    Client::connect(addr).with_context(|| format!("connecting to the node at {addr} (is `tundra serve` running?)"))
}

/// The database's volume, made if it does not exist.
fn database_volume(addr: &str, name: &str, size: &str) -> Result<VolumeInfo> {
    let mut admin = connect(addr)?;
    let volume = match admin.volume_lookup(name) {
        Ok(volume) => volume,
        Err(_) => {
            let size_bytes = tundra_device::size::parse_size(size)
                .map_err(|e| anyhow::anyhow!("--size {size:?}: {}", e.message()))?;
            let spec = VolumeSpec {
                name: name.to_string(),
                size_bytes,
                page_size: PAGE_SIZE as u32,
                mode: VolumeMode::Normal,
            };
            admin.volume_create(&spec).with_context(|| format!("creating volume {name:?}"))?
        }
    };
    if volume.page_size as usize != PAGE_SIZE {
        bail!("volume {name:?} has {}-byte pages; the database uses {PAGE_SIZE}", volume.page_size);
    }
    Ok(volume)
}

fn lagging(args: LaggingArgs) -> Result<()> {
    let volume = database_volume(&args.addr, &args.volume, &args.size)?;
    let config = LaggingConfig {
        seed: args.seed,
        keys: args.keys,
        threads: args.threads,
        lag: Duration::from_millis(args.lag_ms),
        warmup: Duration::from_secs(args.warmup_secs),
        measure: Duration::from_secs(args.measure_secs),
        rw_commits_per_s: args.rw_commits_per_s,
        ro: RoConfig { cache_pages: args.ro_cache_pages, ..LaggingConfig::default().ro },
        ..LaggingConfig::default()
    };
    if !args.json {
        eprintln!(
            "tundra kv lagging: volume {:?} (id {}) at {}, {} keys, {} RO thread(s) {} ms behind, {} pages cached              per RO node, {} s warm-up, {} s measured, seed {}",
            args.volume,
            volume.id,
            args.addr,
            args.keys,
            args.threads,
            args.lag_ms,
            args.ro_cache_pages,
            args.warmup_secs,
            args.measure_secs,
            args.seed
        );
    }
    let addr = args.addr.clone();
    let storage = move || -> tundra_kv::Result<Arc<ClientStorage>> {
        let client = Client::connect(addr.as_str())
            .map_err(|e| tundra_kv::Error::new(tundra_kv::ErrorKind::Unavailable, e.to_string()))?;
        Ok(Arc::new(ClientStorage::new(client)?))
    };
    // The node's own view while the run goes: what the volume's log slots cost the drive at
    // their fullest, against the volume's pages, and how many device reads a rebuilt page took.
    let done = std::sync::atomic::AtomicBool::new(false);
    let (report, node_view) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| watch_redo(&args.addr, &args.volume, &done));
        let report = run_lagging(&storage, tundra_store::ids::VolumeId(volume.id), &config);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (report, watcher.join())
    });
    let report = report.map_err(|e| anyhow::anyhow!("the run stopped: {e}"))?;
    let node_view = match node_view {
        Ok(view) => view?,
        Err(_) => bail!("the stats watcher panicked"),
    };
    if args.json {
        let mut json = serde_json::to_value(&report)?;
        if let (Some(object), serde_json::Value::Object(view)) =
            (json.as_object_mut(), serde_json::to_value(&node_view)?)
        {
            object.extend(view);
        }
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        println!(
            "RO transactions: {} ({:.0}/s), p50 {:.0} µs, p95 {:.0} µs, p99 {:.0} µs, {:.2} page reads each; RW: {} \
             commits, {:.2} MB/s of redo; RO lag {:.0} KB of LSN; {} resyncs",
            report.ro_txns,
            report.ro_txns_per_s,
            report.ro_p50_us,
            report.ro_p95_us,
            report.ro_p99_us,
            report.ro_page_reads_per_txn,
            report.rw_commits,
            report.redo_bytes_per_s / 1e6,
            report.ro_lag_lsn_bytes / 1e3,
            report.ro_resyncs
        );
        println!(
            "node: log slots {}, {:.2} device reads per rebuilt page ({} pages rebuilt), slots at most {} physical \
             bytes ({:.1}% of the volume's {})",
            if node_view.log_slots { "on" } else { "off" },
            node_view.reads_per_rebuilt_page,
            node_view.rebuilt_pages,
            node_view.slot_physical_bytes_peak,
            100.0 * node_view.slot_space_fraction,
            node_view.volume_physical_bytes
        );
    }
    Ok(())
}

/// What the node said of the run's volume.
#[derive(Default, serde::Serialize)]
struct NodeView {
    log_slots: bool,
    rebuilt_pages: u64,
    rebuild_device_reads: u64,
    reads_per_rebuilt_page: f64,
    spilled_records_total: u64,
    slot_overflows: u64,
    /// The most the volume's log slots held on the drive at one time, logical and physical.
    slot_mapped_bytes_peak: u64,
    slot_physical_bytes_peak: u64,
    /// The drive's physical bytes attributed to the volume's pages at that time (the slots'
    /// own bytes are not among them).
    volume_physical_bytes: u64,
    /// `slot_physical_bytes_peak / volume_physical_bytes`: what slots cost on this drive, where
    /// a conventional drive would need a 4 KiB slot per page.
    slot_space_fraction: f64,
    /// The same bound on a conventional drive: one block per page of the volume's size.
    conventional_slot_fraction: f64,
}

/// Polls the node's stats twice a second until `done`, keeping the peak of the volume's slot
/// space and the last counters.
fn watch_redo(addr: &str, volume: &str, done: &std::sync::atomic::AtomicBool) -> Result<NodeView> {
    let mut client = connect(addr)?;
    let mut view = NodeView::default();
    loop {
        let finished = done.load(std::sync::atomic::Ordering::Relaxed);
        let stats: serde_json::Value =
            serde_json::from_str(&client.stats(None)?).context("the node's stats are not JSON")?;
        let found = stats["volumes"].as_array().into_iter().flatten().find(|v| v["name"].as_str() == Some(volume));
        if let Some(v) = found
            && v["redo"].is_object()
        {
            let redo = &v["redo"];
            let n = |value: &serde_json::Value| value.as_u64().unwrap_or(0);
            view.log_slots = redo["log_slots"].as_bool().unwrap_or(false);
            view.rebuilt_pages = n(&redo["rebuilt_pages"]);
            view.rebuild_device_reads = n(&redo["rebuild_device_reads"]);
            view.reads_per_rebuilt_page = redo["reads_per_rebuilt_page"].as_f64().unwrap_or(0.0);
            view.spilled_records_total = n(&redo["spilled_records_total"]);
            view.slot_overflows = n(&redo["slot_overflows"]);
            view.slot_mapped_bytes_peak = view.slot_mapped_bytes_peak.max(n(&redo["slot_mapped_bytes"]));
            if n(&redo["slot_physical_bytes"]) >= view.slot_physical_bytes_peak {
                view.slot_physical_bytes_peak = n(&redo["slot_physical_bytes"]);
                view.volume_physical_bytes = n(&v["physical_bytes_attributed"]);
            }
            let pages = n(&v["size_bytes"]) / u64::from(PAGE_SIZE as u32);
            let logical = n(&v["logical_bytes"]).max(1);
            // A conventional drive stores a slot per page whatever it holds: 4 KiB per page
            // written, against the pages' own bytes.
            let written_pages = logical / PAGE_SIZE as u64;
            view.conventional_slot_fraction = (written_pages.min(pages) * 4096) as f64 / logical as f64;
        }
        if finished {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    if view.volume_physical_bytes > 0 {
        view.slot_space_fraction = view.slot_physical_bytes_peak as f64 / view.volume_physical_bytes as f64;
    }
    Ok(view)
}

fn bench(args: BenchArgs) -> Result<()> {
    let volume = database_volume(&args.addr, &args.volume, &args.size)?;
    let storage = if args.survive_restarts {
        ClientStorage::reconnecting(&args.addr, Duration::from_secs(60))
    } else {
        ClientStorage::new(connect(&args.addr)?)
    };
    let storage = Arc::new(storage.context("the node's protocol")?);
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
        survive_restarts: args.survive_restarts,
        mix: args.mix,
        ..WorkloadConfig::default()
    };
    if !args.json {
        eprintln!(
            "tundra kv bench: volume {:?} (id {}) at {}, {} transactions, {} keys, {} RO node(s) {} commits behind, \
             mix {:?}, seed {}",
            args.volume,
            volume.id,
            args.addr,
            args.transactions,
            args.keys,
            args.ro_nodes,
            args.ro_lag,
            args.mix,
            args.seed
        );
    }
    let started = Instant::now();
    // Once a second on a terminal (stderr, so stdout keeps only the result): commits, reads
    // checked, mismatches and the rates since the last line.
    let mut last = (started, 0u64, 0u64);
    let json = args.json;
    let mut progress = |report: &WorkloadReport| {
        let now = Instant::now();
        let since = now.duration_since(last.0).as_secs_f64();
        if json || since < 1.0 {
            return;
        }
        eprintln!(
            "{:>6.0} s: {} commits ({:.0}/s), {} reads checked ({} RO, {:.0}/s), {} mismatches",
            now.duration_since(started).as_secs_f64(),
            report.commits,
            (report.commits - last.1) as f64 / since,
            report.reads_checked,
            report.ro_reads,
            (report.reads_checked - last.2) as f64 / since,
            report.mismatches
        );
        last = (now, report.commits, report.reads_checked);
    };
    let report = run_workload_with(storage.clone(), tundra_store::ids::VolumeId(volume.id), &config, &mut progress)
        .map_err(|e| anyhow::anyhow!("the workload stopped: {e}"))?;
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        let json = serde_json::json!({
            "volume": args.volume,
            "seed": args.seed,
            "seconds": seconds,
            "commits": report.commits,
            "reads_checked": report.reads_checked,
            "ro_reads": report.ro_reads,
            "point_selects": report.point_selects,
            "range_scans": report.range_scans,
            "mismatches": report.mismatches,
            "rows_checked": report.rows_checked,
            "ro_resyncs": report.ro_resyncs,
            "rw_restarts": report.rw_restarts,
            "storage_outages": report.storage_outages,
            "reconnects": storage.reconnects(),
            "commits_in_doubt_landed": report.commits_in_doubt_landed,
            "commits_in_doubt_lost": report.commits_in_doubt_lost,
            "redo_bytes": report.redo_bytes,
            "final_lsn": report.final_lsn.0,
            "first_mismatch": report.first_mismatch,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        println!(
            "{} commits, {} reads checked ({} by RO nodes, {} rows), {} mismatches, {} RO resyncs, {} RW restarts, \
             {} storage outages ({} commits in doubt landed, {} lost), {} bytes of redo, {:.1} s",
            report.commits,
            report.reads_checked,
            report.ro_reads,
            report.rows_checked,
            report.mismatches,
            report.ro_resyncs,
            report.rw_restarts,
            report.storage_outages,
            report.commits_in_doubt_landed,
            report.commits_in_doubt_lost,
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
