//! `tundra-bench redo`: what a redo commit costs on the fast device against a plain
//! `fdatasync` of the same bytes (Opt#1, seed 000 §3.3.1), and what compressing the redo first
//! would add (Figure 13c).
//!
//! Four ways of making one batch of redo durable at queue depth 1, on files in one directory,
//! interleaved commit by commit (each round runs them in a rotated order) so that whatever
//! the machine does meanwhile hits all of them alike:
//!
//! - `fdatasync`, the baseline: the encoded batch written with `pwrite` at the next offset of a
//!   plain file and `fdatasync`, as a database's write-ahead log does. The file is filled with
//!   zeros and synced first, as such logs preallocate their segments, so no commit allocates.
//!   The ratios are taken against its median in the same run.
//! - `fdatasync_direct`: the same bytes written with `O_DIRECT` in whole blocks, the partly
//!   filled last one written again, and `fdatasync` ([`plain`]): how the redo log reaches the
//!   device, without its framing, so the page cache's share and the framing's show apart.
//! - `redo_log`: [`RedoLog::append`] on a [`FileDevice`] (`O_DIRECT` where the filesystem
//!   allows it, like the node's fast device): what the node does for AppendRedo once the request
//!   is decoded, minus the network.
//! - `redo_log_zstd`: the same, but the encoded batch compressed with zstd level 1 first and the
//!   compressed bytes appended (carried as one record of byte ranges, the way a log of
//!   compressed batches would frame them), encoding and compression timed in.
//!
//! - `node_protocol`, with `--node` only: the same batch as AppendRedo over the native
//!   protocol on 127.0.0.1 to a real node on files in the same directory ([`node`]).
//!
//! Each run makes its files afresh and, before timing anything, appends one lap of the ring to
//! each redo log (so every log block is allocated, as on a node that has run a while); the logs
//! are truncated between rounds, outside the timings, as folding would. Workload and reports are
//! in [`workload`] and [`report`].

mod node;
mod plain;
mod report;
mod workload;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use tundra_codec::{Algorithm, PageCodec};
use tundra_device::file::FileDevice;
use tundra_device::size::parse_size;
use tundra_device::{BLOCK_SIZE_BYTES, BlockDevice, Lba, Usage};
use tundra_redo::codec::{encode_batch, encoded_batch_len};
use tundra_redo::{AppendOutcome, LogGeometry, Payload, RedoBatch, RedoLog, RedoRecord};

use crate::measure::{Latencies, machine_description};
use node::NodeLog;
use plain::{DirectPlainLog, PlainLog};
pub use report::{MethodReport, Report, RunStats, SizeReport, Storage};
use report::{MethodRun, method_report};
use workload::{MIN_BATCH_BYTES, VOLUME, Workload};

#[derive(Args, Clone)]
pub struct RedoArgs {
    /// Directory the scratch files are made in (a new directory inside it, removed afterwards);
    /// defaults to the build's target/ directory. It decides the filesystem and device measured.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Timed commits per method and batch size in each run.
    #[arg(long, default_value_t = 2000)]
    commits: usize,
    /// Encoded batch sizes, comma-separated.
    #[arg(long, default_value = "512,4KiB,16KiB", value_delimiter = ',')]
    batch_bytes: Vec<String>,
    /// Times the whole interleaved measurement is repeated; the report gives medians over them.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Page size of the volume the redo belongs to.
    #[arg(long, default_value = "16KiB")]
    page_size: String,
    /// Size of each redo log's ring and of the baseline's file (the node's streams take 16 MiB).
    #[arg(long, default_value = "16MiB")]
    ring: String,
    /// Also send each batch to a real node over the native protocol on 127.0.0.1.
    #[arg(long)]
    node: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The methods in their report order, the baseline first; the last runs with `--node` only.
const METHODS: [&str; 5] = ["fdatasync", "fdatasync_direct", "redo_log", "redo_log_zstd", "node_protocol"];
/// The method whose device bytes are not counted: the node's devices are its own.
const NODE: usize = 4;
/// Pages the redo's records touch: few enough that the node's folds stay short.
const VOLUME_PAGES: u64 = 1024;
/// Batches of the warm-up lap: large, so a lap takes few flushes.
const LAP_BATCH_BYTES: usize = 256 * 1024;

/// The command's checked settings.
struct Settings {
    /// How many of [`METHODS`] run: four, or five with `--node`.
    methods: usize,
    commits: usize,
    warmup_commits: usize,
    runs: usize,
    batch_sizes: Vec<usize>,
    page_size: u32,
    ring_bytes: u64,
}

pub fn run(args: RedoArgs) -> Result<()> {
    let settings = settings(&args)?;
    let parent = match &args.dir {
        Some(dir) => dir.clone(),
        None => default_parent(),
    };
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let scratch = tempfile::Builder::new()
        .prefix("tundra-bench-redo.")
        .tempdir_in(&parent)
        .with_context(|| format!("making a scratch directory in {}", parent.display()))?;
    let report = measure(&args, &settings, scratch.path())?;
    report::print(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn settings(args: &RedoArgs) -> Result<Settings> {
    ensure!(args.commits >= 1 && args.runs >= 1, "--commits and --runs must be at least 1");
    let page_size = parse_size(&args.page_size).with_context(|| format!("--page-size {}", args.page_size))?;
    ensure!(
        page_size.is_power_of_two() && (4096..=65536).contains(&page_size),
        "--page-size must be a power of two from 4KiB to 64KiB, not {}",
        args.page_size
    );
    let ring_bytes = parse_size(&args.ring).with_context(|| format!("--ring {}", args.ring))?;
    ensure!(
        ring_bytes.is_multiple_of(BLOCK_SIZE_BYTES) && ring_bytes >= 1 << 20,
        "--ring must be a multiple of 4KiB of at least 1MiB, not {}",
        args.ring
    );
    let mut batch_sizes = Vec::new();
    for text in &args.batch_bytes {
        let size = parse_size(text).with_context(|| format!("--batch-bytes {text}"))? as usize;
        ensure!(
            (MIN_BATCH_BYTES..=(ring_bytes / 8) as usize).contains(&size),
            "--batch-bytes {text}: a batch takes from {MIN_BATCH_BYTES} bytes to an eighth of the ring"
        );
        batch_sizes.push(size);
    }
    Ok(Settings {
        methods: if args.node { 5 } else { 4 },
        commits: args.commits,
        warmup_commits: (args.commits / 20).clamp(1, 50),
        runs: args.runs,
        batch_sizes,
        page_size: page_size as u32,
        ring_bytes,
    })
}

/// The `target` directory this binary was built into, where the scratch files go by default
/// (the system temporary directory may be a memory filesystem); else the temporary directory.
fn default_parent() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().find(|a| a.file_name() == Some("target".as_ref())).map(Path::to_path_buf))
        .unwrap_or_else(std::env::temp_dir)
}

fn measure(args: &RedoArgs, settings: &Settings, dir: &Path) -> Result<Report> {
    let configuration = format!(
        "tundra-bench redo --commits {} --batch-bytes {} --runs {} --page-size {} --ring {}{}",
        settings.commits,
        args.batch_bytes.join(","),
        settings.runs,
        args.page_size,
        args.ring,
        if args.node { " --node" } else { "" }
    );
    let storage = Storage::of(dir);
    let load_average_before = load_average();
    eprintln!("tundra-bench redo: {} runs in {}", settings.runs, storage.describe());
    let mut runs = Vec::with_capacity(settings.runs);
    let mut direct_io = false;
    for run in 0..settings.runs {
        let run_dir = dir.join(format!("run-{run}"));
        std::fs::create_dir(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
        let (sizes, direct) = measure_run(settings, &run_dir).with_context(|| format!("run {}", run + 1))?;
        direct_io = direct;
        std::fs::remove_dir_all(&run_dir).with_context(|| format!("removing {}", run_dir.display()))?;
        runs.push(sizes);
    }
    let sizes = settings
        .batch_sizes
        .iter()
        .enumerate()
        .map(|(i, &batch_bytes)| size_report(settings, batch_bytes, runs.iter().map(|run| &run[i]).collect()))
        .collect();
    Ok(Report {
        configuration,
        machine: machine_description(),
        load_average_before,
        load_average_after: load_average(),
        storage,
        direct_io,
        commits: settings.commits,
        warmup_commits: settings.warmup_commits,
        runs: settings.runs,
        page_size: settings.page_size,
        ring_bytes: settings.ring_bytes,
        sizes,
    })
}

/// The first three fields of /proc/loadavg: the machine is shared, and a busy one shows in the
/// runs' spread.
fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split(' ').take(3).collect::<Vec<_>>().join(" ")
}

/// What one run measured at one batch size.
struct SizeRun {
    methods: Vec<MethodRun>,
    records: u64,
    encoded_bytes: u64,
    compressed_bytes: u64,
    compress_us_p50: f64,
}

fn size_report(settings: &Settings, batch_bytes: usize, runs: Vec<&SizeRun>) -> SizeReport {
    let commits: usize = runs.iter().map(|r| r.methods[0].commits).sum();
    let per_method: Vec<Vec<MethodRun>> =
        (0..settings.methods).map(|m| runs.iter().map(|r| r.methods[m]).collect()).collect();
    let methods = METHODS.iter().zip(&per_method).map(|(name, m)| method_report(name, m, &per_method[0])).collect();
    SizeReport {
        batch_bytes,
        records_per_batch: runs.iter().map(|r| r.records).sum::<u64>() as f64 / commits.max(1) as f64,
        zstd_ratio: runs.iter().map(|r| r.encoded_bytes).sum::<u64>() as f64
            / runs.iter().map(|r| r.compressed_bytes).sum::<u64>().max(1) as f64,
        compress_us_p50: report::median(runs.iter().map(|r| r.compress_us_p50).collect()),
        methods,
    }
}

/// One run: fresh files, the logs' warm-up lap, then every batch size in turn. Answers each
/// size's numbers and whether the logs' files use O_DIRECT.
fn measure_run(settings: &Settings, dir: &Path) -> Result<(Vec<SizeRun>, bool)> {
    let mut methods = Methods::create(settings, dir)?;
    let direct = methods.redo_log.direct && methods.zstd_log.direct && methods.direct_baseline.is_direct();
    let mut workload = Workload::new(0x5EED_0013, settings.page_size, VOLUME_PAGES, methods.redo_log.log.durable_lsn());
    methods.lap(&mut workload, settings.ring_bytes)?;
    let mut sizes = Vec::with_capacity(settings.batch_sizes.len());
    for &batch_bytes in &settings.batch_sizes {
        let mut rounds = Rounds::new(settings);
        for round in 0..settings.warmup_commits + settings.commits {
            let timed = round >= settings.warmup_commits;
            let batch = workload.batch(batch_bytes);
            let mut encoded = Vec::with_capacity(batch_bytes);
            encode_batch(&batch, &mut encoded);
            for k in 0..settings.methods {
                let method = (round + k) % settings.methods;
                let begun = Instant::now();
                let (payload_bytes, device_bytes, compressed) = methods.commit(method, &batch, &encoded)?;
                let elapsed = begun.elapsed();
                if !timed {
                    continue;
                }
                rounds.latencies[method].record(elapsed);
                rounds.payload_bytes[method] += payload_bytes as u64;
                rounds.device_bytes[method] += device_bytes;
                if let Some((compress_time, compressed_bytes)) = compressed {
                    rounds.compress.record(compress_time);
                    rounds.encoded_bytes += encoded.len() as u64;
                    rounds.compressed_bytes += compressed_bytes as u64;
                }
            }
            if timed {
                rounds.records += batch.records.len() as u64;
            }
            methods.make_room()?;
        }
        sizes.push(rounds.finish(settings.methods)?);
    }
    methods.close()?;
    Ok((sizes, direct))
}

/// The files (and the node) of one run, one per method.
struct Methods {
    baseline: PlainLog,
    direct_baseline: DirectPlainLog,
    redo_log: TundraLog,
    zstd_log: TundraLog,
    node: Option<NodeLog>,
    codec: PageCodec,
}

/// What one commit wrote: the bytes handed to the write, the bytes that reached the device and,
/// for the compressed log, the time encoding and compression took and the compressed length.
type Committed = (usize, u64, Option<(Duration, usize)>);

impl Methods {
    fn create(settings: &Settings, dir: &Path) -> Result<Methods> {
        Ok(Methods {
            baseline: PlainLog::create(&dir.join("fdatasync.wal"), settings.ring_bytes)?,
            direct_baseline: DirectPlainLog::create(&dir.join("fdatasync-direct.wal"), settings.ring_bytes)?,
            redo_log: TundraLog::create(&dir.join("redo.log"), settings)?,
            zstd_log: TundraLog::create(&dir.join("redo-zstd.log"), settings)?,
            node: if settings.methods > NODE {
                Some(NodeLog::open(&dir.join("node"), settings.page_size, VOLUME_PAGES)?)
            } else {
                None
            },
            codec: PageCodec::new(PageCodec::DEFAULT_ZSTD_LEVEL)?,
        })
    }

    /// Appends a lap of every ring, so no timed commit writes where nothing was written before.
    fn lap(&mut self, workload: &mut Workload, ring_bytes: u64) -> Result<()> {
        // The node's stream is 16 MiB whatever --ring says.
        let lap_bytes = ring_bytes.max(16 << 20) + LAP_BATCH_BYTES as u64;
        let mut lapped = 0;
        while lapped < lap_bytes {
            let batch = workload.batch(LAP_BATCH_BYTES);
            for log in [&self.redo_log, &self.zstd_log] {
                log.append(&batch)?;
                log.log.truncate_through(log.log.durable_lsn())?;
            }
            if let Some(node) = &mut self.node {
                let mut encoded = Vec::with_capacity(LAP_BATCH_BYTES);
                encode_batch(&batch, &mut encoded);
                node.append(&batch, &encoded)?;
                node.fold_if_due()?;
            }
            lapped += LAP_BATCH_BYTES as u64;
        }
        Ok(())
    }

    /// Makes one batch durable the way of `method`; the caller times it.
    fn commit(&mut self, method: usize, batch: &RedoBatch, encoded: &[u8]) -> Result<Committed> {
        Ok(match method {
            0 => (encoded.len(), self.baseline.commit(encoded)?, None),
            1 => (encoded.len(), self.direct_baseline.commit(encoded)?, None),
            2 => (encoded.len(), self.redo_log.append(batch)?, None),
            3 => {
                let begun = Instant::now();
                let (wrapped, compressed_bytes) = compress(&self.codec, batch, self.zstd_log.log.geometry().page_size)?;
                let compress_time = begun.elapsed();
                let written = self.zstd_log.append(&wrapped)?;
                (encoded_batch_len(&wrapped), written, Some((compress_time, compressed_bytes)))
            }
            _ => {
                let node = self.node.as_mut().expect("the node method runs only with a node");
                node.append(batch, encoded)?;
                (encoded.len(), 0, None)
            }
        })
    }

    /// Frees room in the logs between rounds, outside the timings, as folding would.
    fn make_room(&mut self) -> Result<()> {
        self.redo_log.truncate_if_half_full()?;
        self.zstd_log.truncate_if_half_full()?;
        if let Some(node) = &mut self.node {
            node.fold_if_due()?;
        }
        Ok(())
    }

    fn close(self) -> Result<()> {
        match self.node {
            Some(node) => node.close(),
            None => Ok(()),
        }
    }
}

/// What the rounds at one batch size gather, per method.
struct Rounds {
    latencies: [Latencies; 5],
    payload_bytes: [u64; 5],
    device_bytes: [u64; 5],
    compress: Latencies,
    records: u64,
    encoded_bytes: u64,
    compressed_bytes: u64,
    commits: usize,
}

impl Rounds {
    fn new(settings: &Settings) -> Rounds {
        Rounds {
            latencies: Default::default(),
            payload_bytes: [0; 5],
            device_bytes: [0; 5],
            compress: Latencies::default(),
            records: 0,
            encoded_bytes: 0,
            compressed_bytes: 0,
            commits: settings.commits,
        }
    }

    fn finish(mut self, methods: usize) -> Result<SizeRun> {
        let methods = (0..methods)
            .map(|m| {
                ensure!(self.latencies[m].len() == self.commits, "{} timed every commit", METHODS[m]);
                Ok(MethodRun {
                    stats: RunStats::of(&mut self.latencies[m]),
                    payload_bytes: self.payload_bytes[m],
                    device_bytes: (m != NODE).then_some(self.device_bytes[m]),
                    commits: self.commits,
                })
            })
            .collect::<Result<_>>()?;
        Ok(SizeRun {
            methods,
            records: self.records,
            encoded_bytes: self.encoded_bytes,
            compressed_bytes: self.compressed_bytes,
            compress_us_p50: self.compress.percentile_us(50.0),
        })
    }
}

/// Encodes the batch, compresses it and wraps the compressed bytes in a batch of the same LSNs:
/// one record whose ranges carry them, a page's worth each. Answers the wrapping batch and the
/// compressed length.
fn compress(codec: &PageCodec, batch: &RedoBatch, page_size: u32) -> Result<(RedoBatch, usize)> {
    let mut encoded = Vec::new();
    encode_batch(batch, &mut encoded);
    let compressed = codec.compress_bytes(Algorithm::Zstd, &encoded)?;
    let ranges = compressed.chunks(page_size as usize).map(|piece| (0, piece.to_vec())).collect();
    let record = RedoRecord { lsn: batch.end_lsn, page: 0, payload: Payload::Ranges(ranges) };
    let wrapped = RedoBatch { records: vec![record], ..batch.clone() };
    Ok((wrapped, compressed.len()))
}

/// A redo log on a file device, as the node keeps each volume's stream on the fast device.
struct TundraLog {
    log: RedoLog,
    device: Arc<Counting>,
    direct: bool,
}

impl TundraLog {
    fn create(path: &Path, settings: &Settings) -> Result<TundraLog> {
        let geometry = LogGeometry {
            volume: VOLUME,
            page_size: settings.page_size,
            log_blocks: settings.ring_bytes / BLOCK_SIZE_BYTES,
        };
        let file = FileDevice::create(path, geometry.total_blocks() * BLOCK_SIZE_BYTES)?;
        let direct = file.is_direct();
        let device = Arc::new(Counting { inner: file, written_bytes: AtomicU64::new(0) });
        RedoLog::format(device.as_ref(), geometry)?;
        let (log, _) = RedoLog::open(device.clone())?;
        Ok(TundraLog { log, device, direct })
    }

    /// Appends one batch; answers the bytes the log wrote to its device for it.
    fn append(&self, batch: &RedoBatch) -> Result<u64> {
        let before = self.device.written_bytes.load(Ordering::Relaxed);
        match self.log.append(batch)? {
            AppendOutcome::Ok { .. } => {}
            refused => bail!("the redo log refused a batch of the benchmark's one writer: {refused:?}"),
        }
        Ok(self.device.written_bytes.load(Ordering::Relaxed) - before)
    }

    /// Frees the ring behind the durable end once half of it is held, as folding would.
    fn truncate_if_half_full(&self) -> Result<()> {
        let (held, ring) = self.log.usage_blocks();
        if held * 2 > ring {
            self.log.truncate_through(self.log.durable_lsn())?;
        }
        Ok(())
    }
}

/// A file device that counts the bytes written to it.
struct Counting {
    inner: FileDevice,
    written_bytes: AtomicU64,
}

impl BlockDevice for Counting {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }

    fn read(&self, lba: Lba, buf: &mut [u8]) -> tundra_device::Result<()> {
        self.inner.read(lba, buf)
    }

    fn write(&self, lba: Lba, data: &[u8]) -> tundra_device::Result<()> {
        self.written_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.inner.write(lba, data)
    }

    fn trim(&self, lba: Lba, block_count: u64) -> tundra_device::Result<()> {
        self.inner.trim(lba, block_count)
    }

    fn flush(&self) -> tundra_device::Result<()> {
        self.inner.flush()
    }

    fn usage(&self) -> Usage {
        self.inner.usage()
    }
}
