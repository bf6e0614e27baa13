//! `tundra bench hashkv`: the table-less hash KV store (tundra-hashkv) against RocksDB, both
//! driven by tundra-hashkv's load generator in the same run (seed 001 §3.3.3, Table 2).
//!
//! Both stores live in one directory on one filesystem. The hash KV runs on the emulated
//! compressing drive, whose media is a file opened with `O_DIRECT`; RocksDB keeps its files
//! there with direct reads. Each store is loaded once, then for every client count and
//! repetition each store is opened cold (the page cache of its files dropped), warmed up and
//! measured; the stores alternate which goes first. Physical bytes come from the drive's own
//! accounting: the hash KV's drive after the last run, and RocksDB's files (flushed and closed)
//! written block by block into a fresh drive of the same model, as a filesystem on a
//! compressing drive would hold them. docs/measurements.md lists what that leaves out.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};
use tundra_device::csd::{CsdConfig, CsdDevice, CsdStats, FormatOptions};
use tundra_device::file::FileDevice;
use tundra_device::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Lba};
use tundra_hashkv::load::{self, KvTarget, MixConfig, MixReport};
use tundra_hashkv::{HashKv, HashKvConfig, HashKvOptions};

/// The key count of the paper-scale run behind `--full` (the paper loaded 2^31).
const FULL_KEYS: u64 = 1 << 24;

#[derive(Args)]
pub struct HashkvArgs {
    /// Keys loaded into each store before the measured runs.
    #[arg(long, default_value_t = 1 << 18)]
    keys: u64,
    /// Load 2^24 keys (overrides --keys): about 7 GB of records in each store.
    #[arg(long)]
    full: bool,
    /// Client thread counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2,8,32")]
    clients: Vec<usize>,
    /// Runs per store and client count; the report gives their median and spread.
    #[arg(long, default_value_t = 3)]
    repetitions: usize,
    #[arg(long, default_value_t = 3.0)]
    warmup_seconds: f64,
    #[arg(long, default_value_t = 10.0)]
    window_seconds: f64,
    /// Sections of the hash KV store, each with a writer thread (the paper used 16).
    #[arg(long, default_value_t = 16)]
    sections: usize,
    /// Directory for both stores' files; a fresh one under the system's temporary directory
    /// when not given. It must not exist or be empty.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the directory afterwards.
    #[arg(long)]
    keep: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// The two stores, by the names the report uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Peer {
    Hashkv,
    Rocksdb,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Hashkv => "hashkv",
            Peer::Rocksdb => "rocksdb",
        }
    }
}

/// One measured run.
struct Run {
    peer: Peer,
    repetition: usize,
    report: MixReport,
    loadavg: String,
}

pub fn run(args: HashkvArgs) -> Result<()> {
    let keys = if args.full { FULL_KEYS } else { args.keys };
    if keys == 0 || args.clients.is_empty() || args.clients.contains(&0) || args.repetitions == 0 {
        bail!("--keys, --clients and --repetitions must be positive");
    }
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("tundra-bench-hashkv-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if std::fs::read_dir(&dir)?.next().is_some() {
        bail!("{} is not empty; give --dir an empty or new directory", dir.display());
    }
    let result = measure(&args, keys, &dir);
    if !args.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let report = result?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn measure(args: &HashkvArgs, keys: u64, dir: &Path) -> Result<Value> {
    let peers: Vec<Peer> =
        if cfg!(feature = "rocksdb") { vec![Peer::Hashkv, Peer::Rocksdb] } else { vec![Peer::Hashkv] };
    if !cfg!(feature = "rocksdb") {
        eprintln!(
            "tundra bench hashkv: the RocksDB peer was not built into this binary; measuring the hash KV store \
             alone. Run scripts/bench-hashkv, or build with `cargo build --release -p tundra --features rocksdb`."
        );
    }
    let loadavg_start = loadavg();
    let max_clients = *args.clients.iter().max().expect("clients checked non-empty");
    let mut load_seconds = serde_json::Map::new();
    for &peer in &peers {
        let seconds = with_store(peer, args, keys, dir, true, |t| load::load(t, keys, max_clients, args.seed))?;
        load_seconds.insert(peer.name().to_string(), json!(seconds));
    }
    let mut runs: Vec<(usize, Run)> = Vec::new();
    for &clients in &args.clients {
        for repetition in 0..args.repetitions {
            // Alternate which store goes first, so a drift in the machine's load hits both.
            let mut order = peers.clone();
            if repetition % 2 == 1 {
                order.reverse();
            }
            for peer in order {
                drop_page_cache(dir)?;
                let config = MixConfig {
                    keys,
                    clients,
                    get_percent: 70,
                    warmup: Duration::from_secs_f64(args.warmup_seconds),
                    window: Duration::from_secs_f64(args.window_seconds),
                    seed: args.seed ^ ((clients as u64) << 32) ^ repetition as u64,
                };
                let report = with_store(peer, args, keys, dir, false, |t| load::run_mix(t, &config))?;
                if !args.json {
                    eprintln!(
                        "{:>7} {clients:>3} clients, run {}: {:>9.0} ops/s, {:>6.1} µs CPU/op",
                        peer.name(),
                        repetition + 1,
                        report.ops_per_s,
                        report.cpu_us_per_op
                    );
                }
                runs.push((clients, Run { peer, repetition, report, loadavg: loadavg() }));
            }
        }
    }
    let hashkv_drive = hashkv_drive_stats(dir)?;
    let rocksdb_space =
        if peers.contains(&Peer::Rocksdb) { Some(files_on_a_drive(&dir.join("rocksdb"), dir)?) } else { None };
    Ok(assemble(args, keys, &peers, &runs, hashkv_drive, rocksdb_space, load_seconds, loadavg_start))
}

/// Opens `peer`'s store (formatting or creating it when `create`), runs `work` on it and
/// closes it.
fn with_store<T>(
    peer: Peer,
    args: &HashkvArgs,
    keys: u64,
    dir: &Path,
    create: bool,
    work: impl FnOnce(&dyn KvTarget) -> Result<T, String>,
) -> Result<T> {
    match peer {
        Peer::Hashkv => {
            let drive = Arc::new(open_hashkv_drive(dir, keys, create)?);
            if create {
                HashKv::format(&drive, &HashKvOptions::for_keys(keys)).context("formatting the hash KV store")?;
            }
            let store = HashKv::open(drive.clone(), HashKvConfig { sections: args.sections })
                .context("opening the hash KV store")?;
            let out = work(&store).map_err(|e| anyhow::anyhow!("hash KV store: {e}"))?;
            store.close().context("closing the hash KV store")?;
            let drive = Arc::into_inner(drive).expect("the store released the drive");
            drive.close().context("closing the hash KV store's drive")?;
            Ok(out)
        }
        Peer::Rocksdb => rocksdb_with(dir, work),
    }
}

#[cfg(feature = "rocksdb")]
fn rocksdb_with<T>(dir: &Path, work: impl FnOnce(&dyn KvTarget) -> Result<T, String>) -> Result<T> {
    let db = super::rocks::Rocks::open(&dir.join("rocksdb"))?;
    let out = work(&db).map_err(|e| anyhow::anyhow!("RocksDB: {e}"))?;
    db.close()?;
    Ok(out)
}

#[cfg(not(feature = "rocksdb"))]
fn rocksdb_with<T>(_dir: &Path, _work: impl FnOnce(&dyn KvTarget) -> Result<T, String>) -> Result<T> {
    unreachable!("the RocksDB peer is only scheduled when it is built")
}

/// The drive sizes for `keys` keys: the store's logical range, and physical space for twice
/// the raw records plus the log ring, so that garbage collection stays light for both the
/// load and the runs.
fn hashkv_drive_options(keys: u64) -> FormatOptions {
    let options = HashKvOptions::for_keys(keys);
    let physical = 2 * keys * (load::KEY_BYTES + load::VALUE_BYTES + 3) as u64
        + 2 * options.wal_blocks * BLOCK_SIZE_BYTES
        + (64 << 20);
    FormatOptions::new(options.logical_blocks() * BLOCK_SIZE_BYTES, physical)
}

fn open_hashkv_drive(dir: &Path, keys: u64, create: bool) -> Result<CsdDevice> {
    let path = dir.join("hashkv-drive.img");
    let options = hashkv_drive_options(keys);
    if create {
        let total = options.geometry().context("the hash KV drive's geometry")?.total_bytes();
        preallocate(&path, total)?;
        let media = FileDevice::open(&path).with_context(|| format!("opening {}", path.display()))?;
        return CsdDevice::format(Arc::new(media), &options, CsdConfig::default()).context("formatting the drive");
    }
    let media = FileDevice::open(&path).with_context(|| format!("opening {}", path.display()))?;
    CsdDevice::open(Arc::new(media), CsdConfig::default()).context("opening the drive")
}

/// Creates the drive's media file with its blocks allocated, as RocksDB preallocates its files
/// (`allow_fallocate`): otherwise every flush of a new segment would also commit the
/// filesystem's allocation of it, a cost only one of the peers would pay.
fn preallocate(path: &Path, bytes: u64) -> Result<()> {
    let file = File::create_new(path).with_context(|| format!("creating {}", path.display()))?;
    file.set_len(bytes)?;
    // SAFETY: fallocate only reads the descriptor, which `file` keeps open.
    let rc = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0, bytes as libc::off_t) };
    if rc != 0 {
        eprintln!("tundra bench hashkv: {} stays sparse: fallocate failed", path.display());
    }
    file.sync_all().with_context(|| format!("syncing {}", path.display()))
}

fn hashkv_drive_stats(dir: &Path) -> Result<CsdStats> {
    let media = FileDevice::open(dir.join("hashkv-drive.img"))?;
    let drive = CsdDevice::open(Arc::new(media), CsdConfig { background: false, ..CsdConfig::default() })?;
    Ok(drive.stats())
}

/// What a directory's files cost on the compressing drive: every file written from a 4 KiB
/// boundary into a fresh drive of the same model (its tail block padded with zeros, as a
/// filesystem allocates), then the drive's physical bytes. Returns (file bytes, drive stats).
fn files_on_a_drive(files_dir: &Path, scratch: &Path) -> Result<(u64, CsdStats)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(files_dir).with_context(|| format!("listing {}", files_dir.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            files.push((entry.path(), entry.metadata()?.len()));
        }
    }
    let file_bytes: u64 = files.iter().map(|(_, len)| len).sum();
    let blocks: u64 = files.iter().map(|(_, len)| len.div_ceil(BLOCK_SIZE_BYTES)).sum::<u64>().max(1);
    let options = FormatOptions::new(blocks * BLOCK_SIZE_BYTES, blocks * BLOCK_SIZE_BYTES + (16 << 20));
    let image = scratch.join("rocksdb-on-a-drive.img");
    let media = FileDevice::create(&image, options.geometry()?.total_bytes())?;
    let drive = CsdDevice::format(Arc::new(media), &options, CsdConfig::default())?;
    let mut next = 0u64;
    let mut chunk = vec![0u8; 256 * BLOCK_SIZE];
    for (path, len) in files {
        let mut file = File::open(&path).with_context(|| format!("reading {}", path.display()))?;
        let mut left = len;
        while left > 0 {
            let want = chunk.len().min(left as usize);
            std::io::Read::read_exact(&mut file, &mut chunk[..want])?;
            let padded = want.div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
            chunk[want..padded].fill(0);
            drive.write(Lba(next), &chunk[..padded])?;
            next += (padded / BLOCK_SIZE) as u64;
            left -= want as u64;
        }
    }
    drive.flush()?;
    let stats = drive.stats();
    drop(drive);
    std::fs::remove_file(&image)?;
    Ok((file_bytes, stats))
}

/// Writes back and drops the page cache of every file under `dir`, so each run starts cold.
fn drop_page_cache(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            drop_page_cache(&entry.path())?;
        } else if entry.file_type()?.is_file() {
            let file = File::open(entry.path())?;
            file.sync_data()?;
            // SAFETY: posix_fadvise only reads the descriptor, which `file` keeps open.
            unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
    Ok(())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Median, minimum and maximum of one figure.
fn spread(mut values: Vec<f64>) -> Value {
    values.sort_by(f64::total_cmp);
    let median = if values.is_empty() { 0.0 } else { values[values.len() / 2] };
    json!({ "median": median, "min": values.first(), "max": values.last() })
}

fn summary(runs: &[&Run]) -> Value {
    let of = |f: fn(&MixReport) -> f64| spread(runs.iter().map(|r| f(&r.report)).collect());
    json!({
        "ops_per_s": of(|r| r.ops_per_s),
        "cpu_us_per_op": of(|r| r.cpu_us_per_op),
        "drive_cpu_us_per_op": of(|r| r.drive_cpu_us_per_op),
        "host_cpu_us_per_op": of(|r| r.cpu_us_per_op - r.drive_cpu_us_per_op),
        "get_p50_us": of(|r| r.get_p50_us),
        "get_p99_us": of(|r| r.get_p99_us),
        "put_p50_us": of(|r| r.put_p50_us),
        "put_p99_us": of(|r| r.put_p99_us),
    })
}

#[allow(clippy::too_many_arguments)]
fn assemble(
    args: &HashkvArgs,
    keys: u64,
    peers: &[Peer],
    runs: &[(usize, Run)],
    hashkv_drive: CsdStats,
    rocksdb_space: Option<(u64, CsdStats)>,
    load_seconds: serde_json::Map<String, Value>,
    loadavg_start: String,
) -> Value {
    let headline = *args.clients.iter().max().expect("clients checked non-empty");
    let by_clients: Vec<Value> = args
        .clients
        .iter()
        .map(|&clients| {
            let mut entry = serde_json::Map::new();
            entry.insert("clients".into(), json!(clients));
            for &peer in peers {
                let these: Vec<&Run> =
                    runs.iter().filter(|(c, r)| *c == clients && r.peer == peer).map(|(_, r)| r).collect();
                entry.insert(peer.name().into(), summary(&these));
            }
            Value::Object(entry)
        })
        .collect();
    let median_at = |peer: Peer, field: &str| -> Value {
        let entry = by_clients.iter().find(|e| e["clients"] == json!(headline));
        entry.map(|e| e[peer.name()][field]["median"].clone()).unwrap_or(Value::Null)
    };
    let ratio = |a: &Value, b: &Value| match (a.as_f64(), b.as_f64()) {
        (Some(a), Some(b)) if b > 0.0 => json!(a / b),
        _ => Value::Null,
    };
    let (hashkv_ops, rocksdb_ops) = (median_at(Peer::Hashkv, "ops_per_s"), median_at(Peer::Rocksdb, "ops_per_s"));
    let (hashkv_cpu, rocksdb_cpu) =
        (median_at(Peer::Hashkv, "cpu_us_per_op"), median_at(Peer::Rocksdb, "cpu_us_per_op"));
    let hashkv_host_cpu = median_at(Peer::Hashkv, "host_cpu_us_per_op");
    let raw: Vec<Value> = runs
        .iter()
        .map(|(clients, r)| {
            let m = &r.report;
            json!({
                "store": r.peer.name(), "clients": clients, "repetition": r.repetition + 1,
                "seconds": m.seconds, "gets": m.gets, "puts": m.puts, "ops_per_s": m.ops_per_s,
                "cpu_seconds": m.cpu_seconds, "cpu_us_per_op": m.cpu_us_per_op,
                "drive_cpu_us_per_op": m.drive_cpu_us_per_op,
                "get_p50_us": m.get_p50_us, "get_p99_us": m.get_p99_us,
                "put_p50_us": m.put_p50_us, "put_p99_us": m.put_p99_us, "loadavg_after": r.loadavg,
            })
        })
        .collect();
    let built = peers.contains(&Peer::Rocksdb);
    json!({
        "keys": keys,
        "key_bytes": load::KEY_BYTES,
        "value_bytes": load::VALUE_BYTES,
        "get_percent": 70,
        "clients": args.clients,
        "repetitions": args.repetitions,
        "warmup_seconds": args.warmup_seconds,
        "window_seconds": args.window_seconds,
        "sections": args.sections,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "headline_clients": headline,
        "rocksdb_built": built,
        "rocksdb_version": if built { json!(rocksdb_version()) } else { Value::Null },
        "hashkv_ops_per_s": hashkv_ops,
        "rocksdb_ops_per_s": rocksdb_ops,
        "ops_ratio": ratio(&hashkv_ops, &rocksdb_ops),
        "hashkv_cpu_us_per_op": hashkv_cpu,
        "rocksdb_cpu_us_per_op": rocksdb_cpu,
        "cpu_ratio": ratio(&hashkv_cpu, &rocksdb_cpu),
        "hashkv_drive_cpu_us_per_op": median_at(Peer::Hashkv, "drive_cpu_us_per_op"),
        "hashkv_host_cpu_us_per_op": hashkv_host_cpu,
        "host_cpu_ratio": ratio(&hashkv_host_cpu, &rocksdb_cpu),
        "hashkv_physical_bytes": hashkv_drive.physical_used_bytes,
        "hashkv_mapped_bytes": hashkv_drive.mapped_bytes,
        "rocksdb_physical_bytes": rocksdb_space.map(|(_, s)| s.physical_used_bytes),
        "rocksdb_file_bytes": rocksdb_space.map(|(bytes, _)| bytes),
        "load_seconds": load_seconds,
        "by_clients": by_clients,
        "runs": raw,
        "loadavg_start": loadavg_start,
        "loadavg_end": loadavg(),
    })
}

#[cfg(feature = "rocksdb")]
fn rocksdb_version() -> &'static str {
    super::rocks::VERSION
}

#[cfg(not(feature = "rocksdb"))]
fn rocksdb_version() -> &'static str {
    "not built"
}

fn print_table(report: &Value) {
    println!(
        "{} keys, {}-byte values, {}% GET, medians of {} runs of {} s",
        report["keys"], report["value_bytes"], report["get_percent"], report["repetitions"], report["window_seconds"]
    );
    println!(
        "{:>8} {:>8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "store", "clients", "ops/s", "CPU µs/op", "drive µs", "GET p50", "GET p99", "PUT p50", "PUT p99"
    );
    for entry in report["by_clients"].as_array().into_iter().flatten() {
        for peer in ["hashkv", "rocksdb"] {
            let s = &entry[peer];
            if s.is_null() {
                continue;
            }
            let m = |f: &str| s[f]["median"].as_f64().unwrap_or(0.0);
            println!(
                "{peer:>8} {:>8} {:>10.0} {:>9.1} {:>9.1} {:>9.0} {:>9.0} {:>9.0} {:>9.0}",
                entry["clients"],
                m("ops_per_s"),
                m("cpu_us_per_op"),
                m("drive_cpu_us_per_op"),
                m("get_p50_us"),
                m("get_p99_us"),
                m("put_p50_us"),
                m("put_p99_us")
            );
        }
    }
    println!(
        "physical bytes: hashkv {}, rocksdb {}",
        report["hashkv_physical_bytes"], report["rocksdb_physical_bytes"]
    );
}
