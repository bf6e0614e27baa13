//! `tundra bench hashkv`: the table-less hash KV store (tundra-hashkv) against RocksDB, both
//! driven by tundra-hashkv's load generator in the same run (seed 001 §3.3.3, Table 2).
//!
//! Both stores run on the same model of emulated compressing drive, each on its own, whose
//! media is a file opened with `O_DIRECT` in one directory: the hash KV store directly, RocksDB
//! through ext4 on a loop device over the drive shown as a file through FUSE (drive_fs.rs),
//! with direct reads. Each store is loaded once, then for every client count and repetition
//! each store is opened cold (the page cache of its files dropped), warmed up and measured; the
//! stores alternate which goes first. The drive's CPU (PolarCSD's hardware in the paper) is
//! reported apart from each store's own: ops/s and CPU per operation are given with the drive
//! on the host's CPU, as measured, and with it taken out. Physical bytes come from each drive's
//! own accounting: after the last run, and the peak sampled during the load and the runs.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};
use tundra_device::BLOCK_SIZE_BYTES;
use tundra_device::csd::{CsdConfig, CsdDevice, CsdStats, FormatOptions};
use tundra_device::file::FileDevice;
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

/// The stores, by the names the report uses: the hash KV store and RocksDB on the same model
/// of drive, and RocksDB again on the host's filesystem with no drive at all (its own best case,
/// no FUSE, loop device or drive in its path), as a check on the first comparison.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Peer {
    Hashkv,
    Rocksdb,
    RocksdbPlain,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Hashkv => "hashkv",
            Peer::Rocksdb => "rocksdb",
            Peer::RocksdbPlain => "rocksdb_plain",
        }
    }
}

/// One measured run.
struct Run {
    peer: Peer,
    repetition: usize,
    report: MixReport,
    loadavg: String,
    /// The drive's physical bytes at their peak during the run.
    physical_peak: u64,
}

/// RocksDB's drive, with ext4 on it, for the whole benchmark.
#[cfg(feature = "rocksdb")]
type PeerDrive = Arc<super::drive_fs::DriveFs>;
#[cfg(not(feature = "rocksdb"))]
type PeerDrive = ();

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
    let peers: Vec<Peer> = if cfg!(feature = "rocksdb") {
        vec![Peer::Hashkv, Peer::Rocksdb, Peer::RocksdbPlain]
    } else {
        vec![Peer::Hashkv]
    };
    if !cfg!(feature = "rocksdb") {
        eprintln!(
            "tundra bench hashkv: the RocksDB peer was not built into this binary; measuring the hash KV store \
             alone. Run scripts/bench-hashkv, or build with `cargo build --release -p tundra --features rocksdb`."
        );
    }
    let loadavg_start = loadavg();
    let peer_drive = if peers.contains(&Peer::Rocksdb) { Some(peer_drive(dir, keys)?) } else { None };
    let max_clients = *args.clients.iter().max().expect("clients checked non-empty");
    let mut load_seconds = serde_json::Map::new();
    let mut load_peaks = serde_json::Map::new();
    for &peer in &peers {
        let (seconds, peak) = with_store(peer, args, keys, dir, peer_drive.as_ref(), true, |t| {
            load::load(t, keys, max_clients, args.seed)
        })?;
        load_seconds.insert(peer.name().to_string(), json!(seconds));
        load_peaks.insert(peer.name().to_string(), json!(peak));
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
                let (report, physical_peak) =
                    with_store(peer, args, keys, dir, peer_drive.as_ref(), false, |t| load::run_mix(t, &config))?;
                if !args.json {
                    eprintln!(
                        "{:>7} {clients:>3} clients, run {}: {:>9.0} ops/s, {:>6.1} µs CPU/op",
                        peer.name(),
                        repetition + 1,
                        report.ops_per_s,
                        report.cpu_us_per_op
                    );
                }
                runs.push((clients, Run { peer, repetition, report, loadavg: loadavg(), physical_peak }));
            }
        }
    }
    let hashkv_drive = hashkv_drive_stats(dir)?;
    let rocksdb_space = match peer_drive {
        Some(drive) => Some(close_peer_drive(drive)?),
        None => None,
    };
    let physical = Physical { hashkv: hashkv_drive, rocksdb: rocksdb_space, load_peaks };
    Ok(assemble(args, keys, &peers, &runs, physical, load_seconds, loadavg_start))
}

/// What the drives held: after the last run, and at their peaks during the load.
struct Physical {
    hashkv: CsdStats,
    /// RocksDB's file bytes and its drive's statistics.
    rocksdb: Option<(u64, CsdStats)>,
    load_peaks: serde_json::Map<String, Value>,
}

/// Samples a drive's physical bytes every 50 ms while `work` runs; returns its result and the
/// largest sample.
fn sampling_peak<T>(drive: &CsdDevice, work: impl FnOnce() -> T) -> (T, u64) {
    let peak = AtomicU64::new(drive.stats().physical_used_bytes);
    let done = AtomicBool::new(false);
    let out = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(drive.stats().physical_used_bytes, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let out = work();
        done.store(true, Ordering::Relaxed);
        out
    });
    peak.fetch_max(drive.stats().physical_used_bytes, Ordering::Relaxed);
    (out, peak.into_inner())
}

/// Opens `peer`'s store (formatting or creating it when `create`), runs `work` on it and
/// closes it; returns what `work` returned and the drive's physical bytes at their peak.
fn with_store<T>(
    peer: Peer,
    args: &HashkvArgs,
    keys: u64,
    dir: &Path,
    peer_drive: Option<&PeerDrive>,
    create: bool,
    work: impl FnOnce(&dyn KvTarget) -> Result<T, String>,
) -> Result<(T, u64)> {
    match peer {
        Peer::Hashkv => {
            let drive = Arc::new(open_hashkv_drive(dir, keys, create)?);
            if create {
                HashKv::format(&drive, &HashKvOptions::for_keys(keys)).context("formatting the hash KV store")?;
            }
            let store = HashKv::open(drive.clone(), HashKvConfig { sections: args.sections })
                .context("opening the hash KV store")?;
            let (out, peak) = sampling_peak(&drive, || work(&store));
            let out = out.map_err(|e| anyhow::anyhow!("hash KV store: {e}"))?;
            store.close().context("closing the hash KV store")?;
            let drive = Arc::into_inner(drive).expect("the store released the drive");
            drive.close().context("closing the hash KV store's drive")?;
            Ok((out, peak))
        }
        Peer::Rocksdb => rocksdb_with(peer_drive.expect("RocksDB's drive is made with the peer"), work),
        Peer::RocksdbPlain => rocksdb_plain_with(dir, work),
    }
}

#[cfg(feature = "rocksdb")]
fn rocksdb_plain_with<T>(dir: &Path, work: impl FnOnce(&dyn KvTarget) -> Result<T, String>) -> Result<(T, u64)> {
    let db = super::rocks::Rocks::open(&dir.join("rocksdb-plain"), None)?;
    let out = work(&db).map_err(|e| anyhow::anyhow!("RocksDB on the host's filesystem: {e}"))?;
    db.close()?;
    Ok((out, 0))
}

#[cfg(not(feature = "rocksdb"))]
fn rocksdb_plain_with<T>(_dir: &Path, _work: impl FnOnce(&dyn KvTarget) -> Result<T, String>) -> Result<(T, u64)> {
    unreachable!("the RocksDB peer is only scheduled when it is built")
}

/// RocksDB's database directory on its drive's filesystem.
#[cfg(feature = "rocksdb")]
const ROCKSDB_DIR: &str = "rocksdb";

#[cfg(feature = "rocksdb")]
fn rocksdb_with<T>(drive: &PeerDrive, work: impl FnOnce(&dyn KvTarget) -> Result<T, String>) -> Result<(T, u64)> {
    let db = super::rocks::Rocks::open(&drive.path().join(ROCKSDB_DIR), Some(drive.clone()))?;
    let (out, peak) = sampling_peak(drive.csd(), || work(&db));
    let out = out.map_err(|e| anyhow::anyhow!("RocksDB: {e}"))?;
    db.close()?;
    Ok((out, peak))
}

#[cfg(not(feature = "rocksdb"))]
fn rocksdb_with<T>(_drive: &PeerDrive, _work: impl FnOnce(&dyn KvTarget) -> Result<T, String>) -> Result<(T, u64)> {
    unreachable!("the RocksDB peer is only scheduled when it is built")
}

/// RocksDB's drive: the same model and configuration as the hash KV store's, with logical room
/// for eight times the raw records (compactions rewrite files; a filesystem wants free space)
/// and physical room for three times them.
#[cfg(feature = "rocksdb")]
fn peer_drive(dir: &Path, keys: u64) -> Result<PeerDrive> {
    let raw = keys * (load::KEY_BYTES + load::VALUE_BYTES) as u64;
    let logical = (8 * raw).max(1 << 30).next_multiple_of(1 << 20);
    let physical = 3 * raw + (256 << 20);
    Ok(Arc::new(super::drive_fs::DriveFs::create(dir, "rocksdb-drive", logical, physical)?))
}

#[cfg(not(feature = "rocksdb"))]
fn peer_drive(_dir: &Path, _keys: u64) -> Result<PeerDrive> {
    unreachable!("the RocksDB peer is only scheduled when it is built")
}

/// RocksDB's file bytes and its drive's statistics after the last run, then the drive taken
/// down.
#[cfg(feature = "rocksdb")]
fn close_peer_drive(drive: PeerDrive) -> Result<(u64, CsdStats)> {
    let mut file_bytes = 0;
    let db = drive.path().join(ROCKSDB_DIR);
    for entry in std::fs::read_dir(&db).with_context(|| format!("listing {}", db.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            file_bytes += entry.metadata()?.len();
        }
    }
    // What ext4 has not yet passed on (its journal, freed blocks) reaches the drive.
    let _ = std::process::Command::new("sync").arg("-f").arg(&db).status();
    let _ = std::process::Command::new("fstrim").arg(drive.path()).status();
    let stats = drive.stats();
    let drive = Arc::into_inner(drive).context("RocksDB's drive is still in use")?;
    drive.close()?;
    Ok((file_bytes, stats))
}

#[cfg(not(feature = "rocksdb"))]
fn close_peer_drive(_drive: PeerDrive) -> Result<(u64, CsdStats)> {
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
pub(super) fn preallocate(path: &Path, bytes: u64) -> Result<()> {
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

fn summary(runs: &[&Run], cpus: f64) -> Value {
    let of = |f: &dyn Fn(&MixReport) -> f64| spread(runs.iter().map(|r| f(&r.report)).collect());
    json!({
        "ops_per_s": of(&|r| r.ops_per_s),
        "cpu_us_per_op": of(&|r| r.cpu_us_per_op),
        "drive_cpu_us_per_op": of(&|r| r.drive_cpu_us_per_op),
        "drive_codec_cpu_us_per_op": of(&|r| r.drive_codec_cpu_us_per_op),
        "host_cpu_us_per_op": of(&|r| r.cpu_us_per_op - r.drive_cpu_us_per_op),
        "host_bound_ops_per_s": of(&|r| host_bound_ops(cpus, r)),
        "get_p50_us": of(&|r| r.get_p50_us),
        "get_p99_us": of(&|r| r.get_p99_us),
        "put_p50_us": of(&|r| r.put_p50_us),
        "put_p99_us": of(&|r| r.put_p99_us),
        "physical_peak_bytes": spread(runs.iter().map(|r| r.physical_peak as f64).collect()),
    })
}

/// The operations per second the machine's CPUs could carry with the drive's work in hardware:
/// all of them busy with the store's own CPU per operation. A ceiling derived from the
/// measurement, not a measurement.
fn host_bound_ops(cpus: f64, r: &MixReport) -> f64 {
    let host = r.cpu_us_per_op - r.drive_cpu_us_per_op;
    if host > 0.0 { cpus * 1e6 / host } else { 0.0 }
}

fn assemble(
    args: &HashkvArgs,
    keys: u64,
    peers: &[Peer],
    runs: &[(usize, Run)],
    physical: Physical,
    load_seconds: serde_json::Map<String, Value>,
    loadavg_start: String,
) -> Value {
    let headline = *args.clients.iter().max().expect("clients checked non-empty");
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let by_clients: Vec<Value> = args
        .clients
        .iter()
        .map(|&clients| {
            let mut entry = serde_json::Map::new();
            entry.insert("clients".into(), json!(clients));
            for &peer in peers {
                let these: Vec<&Run> =
                    runs.iter().filter(|(c, r)| *c == clients && r.peer == peer).map(|(_, r)| r).collect();
                entry.insert(peer.name().into(), summary(&these, cpus as f64));
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
    let both = |field: &str| (median_at(Peer::Hashkv, field), median_at(Peer::Rocksdb, field));
    let (hashkv_ops, rocksdb_ops) = both("ops_per_s");
    let (hashkv_cpu, rocksdb_cpu) = both("cpu_us_per_op");
    let (hashkv_drive_cpu, rocksdb_drive_cpu) = both("drive_cpu_us_per_op");
    let (hashkv_codec_cpu, rocksdb_codec_cpu) = both("drive_codec_cpu_us_per_op");
    let (hashkv_host_cpu, rocksdb_host_cpu) = both("host_cpu_us_per_op");
    let (hashkv_bound, rocksdb_bound) = both("host_bound_ops_per_s");
    let (plain_ops, plain_cpu) =
        (median_at(Peer::RocksdbPlain, "ops_per_s"), median_at(Peer::RocksdbPlain, "cpu_us_per_op"));
    let raw: Vec<Value> = runs
        .iter()
        .map(|(clients, r)| {
            let m = &r.report;
            json!({
                "store": r.peer.name(), "clients": clients, "repetition": r.repetition + 1,
                "seconds": m.seconds, "gets": m.gets, "puts": m.puts, "ops_per_s": m.ops_per_s,
                "cpu_seconds": m.cpu_seconds, "cpu_us_per_op": m.cpu_us_per_op,
                "drive_cpu_us_per_op": m.drive_cpu_us_per_op,
                "drive_codec_cpu_us_per_op": m.drive_codec_cpu_us_per_op,
                "host_cpu_us_per_op": m.cpu_us_per_op - m.drive_cpu_us_per_op,
                "get_p50_us": m.get_p50_us, "get_p99_us": m.get_p99_us,
                "put_p50_us": m.put_p50_us, "put_p99_us": m.put_p99_us,
                "physical_peak_bytes": r.physical_peak, "loadavg_after": r.loadavg,
            })
        })
        .collect();
    let built = peers.contains(&Peer::Rocksdb);
    let peak_of = |peer: Peer| -> Value {
        let runs_peak = runs.iter().filter(|(_, r)| r.peer == peer).map(|(_, r)| r.physical_peak).max();
        let load_peak = physical.load_peaks.get(peer.name()).and_then(Value::as_u64);
        runs_peak.into_iter().chain(load_peak).max().map_or(Value::Null, |p| json!(p))
    };
    let report = json!({
        "tundra_commit": std::env::var("TUNDRA_COMMIT").ok(),
        "keys": keys,
        "key_bytes": load::KEY_BYTES,
        "value_bytes": load::VALUE_BYTES,
        "get_percent": 70,
        "clients": args.clients,
        "repetitions": args.repetitions,
        "warmup_seconds": args.warmup_seconds,
        "window_seconds": args.window_seconds,
        "sections": args.sections,
        "cpus": cpus,
        "headline_clients": headline,
        "rocksdb_built": built,
        "rocksdb_version": if built { json!(rocksdb_version()) } else { Value::Null },
        "rocksdb_on": if built { json!(ROCKSDB_ON) } else { Value::Null },
        "hashkv_ops_per_s": hashkv_ops,
        "rocksdb_ops_per_s": rocksdb_ops,
        "ops_ratio": ratio(&hashkv_ops, &rocksdb_ops),
        "hashkv_cpu_us_per_op": hashkv_cpu,
        "rocksdb_cpu_us_per_op": rocksdb_cpu,
        "cpu_ratio": ratio(&hashkv_cpu, &rocksdb_cpu),
        "hashkv_drive_cpu_us_per_op": hashkv_drive_cpu,
        "rocksdb_drive_cpu_us_per_op": rocksdb_drive_cpu,
        "hashkv_drive_codec_cpu_us_per_op": hashkv_codec_cpu,
        "rocksdb_drive_codec_cpu_us_per_op": rocksdb_codec_cpu,
        "hashkv_host_cpu_us_per_op": hashkv_host_cpu,
        "rocksdb_host_cpu_us_per_op": rocksdb_host_cpu,
        "host_cpu_ratio": ratio(&hashkv_host_cpu, &rocksdb_host_cpu),
        "hashkv_host_bound_ops_per_s": hashkv_bound,
        "rocksdb_host_bound_ops_per_s": rocksdb_bound,
        "host_bound_ops_ratio": ratio(&hashkv_bound, &rocksdb_bound),
        "rocksdb_plain_ops_per_s": plain_ops,
        "rocksdb_plain_cpu_us_per_op": plain_cpu,
        "ops_ratio_vs_plain": ratio(&hashkv_ops, &plain_ops),
        "host_cpu_ratio_vs_plain": ratio(&hashkv_host_cpu, &plain_cpu),
    });
    let space = json!({
        "hashkv_physical_bytes": physical.hashkv.physical_used_bytes,
        "hashkv_mapped_bytes": physical.hashkv.mapped_bytes,
        "hashkv_physical_peak_bytes": peak_of(Peer::Hashkv),
        "rocksdb_physical_bytes": physical.rocksdb.map(|(_, s)| s.physical_used_bytes),
        "rocksdb_mapped_bytes": physical.rocksdb.map(|(_, s)| s.mapped_bytes),
        "rocksdb_physical_peak_bytes": if built { peak_of(Peer::Rocksdb) } else { Value::Null },
        "rocksdb_file_bytes": physical.rocksdb.map(|(bytes, _)| bytes),
        "load_seconds": load_seconds,
        "load_physical_peak_bytes": physical.load_peaks,
        "by_clients": by_clients,
        "runs": raw,
        "loadavg_start": loadavg_start,
        "loadavg_end": loadavg(),
    });
    let mut report = report;
    if let (Some(report), Value::Object(space)) = (report.as_object_mut(), space) {
        report.extend(space);
    }
    report
}

/// Where RocksDB's files live during the runs, for the report.
const ROCKSDB_ON: &str = "ext4 (4 KiB blocks, mounted with discard) on a loop device (4 KiB sectors, direct I/O) \
     over an emulated drive of the hash KV store's model, shown as a file through FUSE in this process";

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
        "{:>13} {:>8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "store", "clients", "ops/s", "CPU µs/op", "drive µs", "GET p50", "GET p99", "PUT p50", "PUT p99"
    );
    for entry in report["by_clients"].as_array().into_iter().flatten() {
        for peer in ["hashkv", "rocksdb", "rocksdb_plain"] {
            let s = &entry[peer];
            if s.is_null() {
                continue;
            }
            let m = |f: &str| s[f]["median"].as_f64().unwrap_or(0.0);
            println!(
                "{peer:>13} {:>8} {:>10.0} {:>9.1} {:>9.1} {:>9.0} {:>9.0} {:>9.0} {:>9.0}",
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
