//! `tundra drive ...`: operate an emulated compressing drive kept in an image file.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, bail, ensure};
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use tundra_device::csd::{CompressionMode, CsdConfig, CsdDevice, CsdStats, FormatOptions, GcPolicy};
use tundra_device::file::FileDevice;
use tundra_device::size::{format_size, parse_size};
use tundra_device::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Lba};

#[derive(Subcommand)]
pub enum DriveCommand {
    /// Create an empty drive image at PATH.
    Format {
        path: PathBuf,
        /// Physical capacity for data after compression, e.g. 4GiB.
        #[arg(long)]
        physical: String,
        /// Logical capacity the drive exposes, e.g. 10GiB (the paper provisions 2.4x physical).
        #[arg(long)]
        logical: String,
        /// Size of the log segments garbage collection works on.
        #[arg(long, default_value = "1MiB")]
        segment_size: String,
        /// Media kept beyond the physical capacity for garbage collection, in percent.
        #[arg(long, default_value_t = FormatOptions::DEFAULT_OVER_PROVISIONING_PERCENT)]
        over_provisioning: u32,
    },
    /// Write FILE to the drive from LBA 0 (or --offset) and flush.
    Load {
        path: PathBuf,
        file: PathBuf,
        /// Byte offset on the drive, a multiple of 4096.
        #[arg(long, default_value = "0")]
        offset: String,
        /// Store blocks raw and compress them in a background pass, as on a busy host.
        #[arg(long)]
        deferred: bool,
    },
    /// Read LENGTH bytes from the drive (from --offset) into OUT.
    Dump {
        path: PathBuf,
        out: PathBuf,
        #[arg(long)]
        length: String,
        #[arg(long, default_value = "0")]
        offset: String,
    },
    /// Declare a byte range unused; its space returns at the next garbage collection.
    Trim {
        path: PathBuf,
        #[arg(long)]
        offset: String,
        #[arg(long)]
        length: String,
    },
    /// Run garbage collection until no segment would free space.
    Gc {
        path: PathBuf,
        /// Stop after this many segments.
        #[arg(long)]
        max_segments: Option<usize>,
        /// Victim choice: greedy or cost-benefit.
        #[arg(long, default_value = "greedy")]
        policy: String,
    },
    /// Print logical and physical usage, compression ratio, GC work and map memory.
    Stats {
        path: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(command: DriveCommand) -> Result<()> {
    match command {
        DriveCommand::Format { path, physical, logical, segment_size, over_provisioning } => {
            let options = FormatOptions {
                logical_bytes: parse_size(&logical)?,
                physical_bytes: parse_size(&physical)?,
                segment_bytes: parse_size(&segment_size)?,
                over_provisioning_percent: over_provisioning,
            };
            format(&path, &options)
        }
        DriveCommand::Load { path, file, offset, deferred } => load(&path, &file, parse_size(&offset)?, deferred),
        DriveCommand::Dump { path, out, length, offset } => {
            dump(&path, &out, parse_size(&offset)?, parse_size(&length)?)
        }
        DriveCommand::Trim { path, offset, length } => trim(&path, parse_size(&offset)?, parse_size(&length)?),
        DriveCommand::Gc { path, max_segments, policy } => gc(&path, max_segments, &policy),
        DriveCommand::Stats { path, json } => stats(&path, json),
    }
}

fn format(path: &Path, options: &FormatOptions) -> Result<()> {
    let geometry = options.geometry()?;
    let media = FileDevice::create(path, geometry.total_bytes())
        .with_context(|| format!("creating the drive image {}", path.display()))?;
    let drive = CsdDevice::format(Arc::new(media), options, CsdConfig { background: false, ..CsdConfig::default() })?;
    drive.close()?;
    println!(
        "formatted {}: logical {}, physical {} ({} segments of {}, {} kept for garbage collection), image {}",
        path.display(),
        format_size(options.logical_bytes),
        format_size(geometry.physical_capacity_bytes()),
        geometry.segment_count,
        format_size(geometry.segment_bytes),
        geometry.segment_count - geometry.usable_segments,
        format_size(geometry.total_bytes()),
    );
    Ok(())
}

/// Opens the drive image at `path`.
pub fn open(path: &Path, config: CsdConfig) -> Result<CsdDevice> {
    let media = FileDevice::open(path).with_context(|| format!("opening the drive image {}", path.display()))?;
    CsdDevice::open(Arc::new(media), config).with_context(|| format!("opening the drive in {}", path.display()))
}

fn block_aligned(what: &str, bytes: u64) -> Result<u64> {
    ensure!(bytes.is_multiple_of(BLOCK_SIZE_BYTES), "{what} {bytes} is not a multiple of 4096");
    Ok(bytes / BLOCK_SIZE_BYTES)
}

/// Blocks written per request while loading.
const LOAD_CHUNK_BLOCKS: u64 = 256;

fn load(path: &Path, file: &Path, offset: u64, deferred: bool) -> Result<()> {
    let first_lba = block_aligned("--offset", offset)?;
    let compression = if deferred { CompressionMode::Deferred } else { CompressionMode::Inline };
    let drive = open(path, CsdConfig { compression, ..CsdConfig::default() })?;
    let length = std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?.len();
    let blocks = length.div_ceil(BLOCK_SIZE_BYTES);
    ensure!(
        first_lba + blocks <= drive.block_count(),
        "{} ({}) does not fit in the drive's logical capacity of {} from offset {offset}",
        file.display(),
        format_size(length),
        format_size(drive.block_count() * BLOCK_SIZE_BYTES)
    );
    let progress = progress_bar(length);
    let source = std::sync::Mutex::new(File::open(file).with_context(|| format!("opening {}", file.display()))?);
    let done = AtomicU64::new(0);
    let next_chunk = AtomicU64::new(0);
    // Compression runs in the writing threads; two writers keep both cores busy.
    let writers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(4);
    let loaded = std::thread::scope(|scope| -> Result<()> {
        let handles: Vec<_> = (0..writers)
            .map(|_| scope.spawn(|| load_chunks(&drive, &source, first_lba, blocks, &next_chunk, &done, &progress)))
            .collect();
        for handle in handles {
            handle.join().expect("a load thread panicked")?;
        }
        Ok(())
    });
    progress.finish_and_clear();
    if let Err(error) = loaded {
        // Keep what was written durable, so that the drive's state after a failed load is known.
        let flushed = drive.flush().and_then(|()| drive.close());
        let note = if flushed.is_ok() { "the blocks written before it are flushed" } else { "flushing failed too" };
        return Err(error.context(format!("loading {} stopped; {note}", file.display())));
    }
    drive.flush()?;
    if deferred {
        drive.drain_deferred()?;
    }
    let stats = drive.stats();
    drive.close()?;
    println!(
        "loaded {} into {} at offset {offset}: mapped {}, physical {} (ratio {:.3})",
        format_size(length),
        path.display(),
        format_size(stats.mapped_bytes),
        format_size(stats.physical_used_bytes),
        stats.compression_ratio()
    );
    Ok(())
}

fn load_chunks(
    drive: &CsdDevice,
    source: &std::sync::Mutex<File>,
    first_lba: u64,
    blocks: u64,
    next_chunk: &AtomicU64,
    done: &AtomicU64,
    progress: &ProgressBar,
) -> Result<()> {
    let mut buf = vec![0u8; (LOAD_CHUNK_BLOCKS * BLOCK_SIZE_BYTES) as usize];
    loop {
        let chunk = next_chunk.fetch_add(1, Ordering::Relaxed);
        let start = chunk * LOAD_CHUNK_BLOCKS;
        if start >= blocks {
            return Ok(());
        }
        let count = LOAD_CHUNK_BLOCKS.min(blocks - start);
        let bytes = &mut buf[..(count * BLOCK_SIZE_BYTES) as usize];
        bytes.fill(0);
        read_at(source, start * BLOCK_SIZE_BYTES, bytes)?;
        drive
            .write(Lba(first_lba + start), bytes)
            .with_context(|| format!("writing blocks {}..+{count}", first_lba + start))?;
        let total = done.fetch_add(bytes.len() as u64, Ordering::Relaxed) + bytes.len() as u64;
        progress.set_position(total);
    }
}

/// Reads up to `buf.len()` bytes at `offset`; what lies past the end of the file stays zero.
fn read_at(source: &std::sync::Mutex<File>, offset: u64, buf: &mut [u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let file = source.lock().expect("the source file lock is never poisoned: readers do not panic");
    let mut filled = 0;
    while filled < buf.len() {
        let n = file.read_at(&mut buf[filled..], offset + filled as u64).context("reading the source file")?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(())
}

fn progress_bar(length: u64) -> ProgressBar {
    let progress = ProgressBar::with_draw_target(Some(length), ProgressDrawTarget::stderr());
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("the template is valid"),
    );
    progress
}

fn dump(path: &Path, out: &Path, offset: u64, length: u64) -> Result<()> {
    let first_lba = block_aligned("--offset", offset)?;
    let drive = open(path, CsdConfig { background: false, ..CsdConfig::default() })?;
    let blocks = length.div_ceil(BLOCK_SIZE_BYTES);
    ensure!(
        first_lba + blocks <= drive.block_count(),
        "--offset {offset} --length {length} reaches past the drive's logical capacity"
    );
    let mut file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut buf = vec![0u8; (LOAD_CHUNK_BLOCKS * BLOCK_SIZE_BYTES) as usize];
    let mut left = length;
    let mut lba = first_lba;
    while left > 0 {
        let count = LOAD_CHUNK_BLOCKS.min(left.div_ceil(BLOCK_SIZE_BYTES));
        let bytes = &mut buf[..(count * BLOCK_SIZE_BYTES) as usize];
        drive.read(Lba(lba), bytes).with_context(|| format!("reading blocks {lba}..+{count}"))?;
        let take = left.min(bytes.len() as u64) as usize;
        file.write_all(&bytes[..take]).with_context(|| format!("writing {}", out.display()))?;
        left -= take as u64;
        lba += count;
    }
    file.sync_all().with_context(|| format!("syncing {}", out.display()))?;
    Ok(())
}

fn trim(path: &Path, offset: u64, length: u64) -> Result<()> {
    let first = block_aligned("--offset", offset)?;
    let count = block_aligned("--length", length)?;
    let drive = open(path, CsdConfig { background: false, ..CsdConfig::default() })?;
    drive.trim(Lba(first), count)?;
    drive.close()?;
    Ok(())
}

fn gc(path: &Path, max_segments: Option<usize>, policy: &str) -> Result<()> {
    let gc_policy = match policy {
        "greedy" => GcPolicy::Greedy,
        "cost-benefit" => GcPolicy::CostBenefit,
        other => bail!("unknown --policy {other:?}: use greedy or cost-benefit"),
    };
    let drive = open(path, CsdConfig { background: false, gc_policy, ..CsdConfig::default() })?;
    let before = drive.stats();
    let collected = drive.collect_garbage(max_segments.unwrap_or(usize::MAX))?;
    let after = drive.stats();
    drive.close()?;
    println!(
        "collected {collected} segments, moved {}, allocated {} -> {}",
        format_size(after.counters.gc_moved_bytes - before.counters.gc_moved_bytes),
        format_size(before.physical_allocated_bytes),
        format_size(after.physical_allocated_bytes)
    );
    Ok(())
}

/// The JSON document of `tundra drive stats --json`. Keys are stable; docs/cli.md explains each.
#[derive(Serialize)]
pub struct StatsJson {
    pub logical_capacity_bytes: u64,
    pub mapped_bytes: u64,
    pub physical_used_bytes: u64,
    pub physical_live_bytes: u64,
    pub physical_allocated_bytes: u64,
    pub physical_capacity_bytes: u64,
    pub media_bytes: u64,
    pub compression_ratio: f64,
    pub map_memory_bytes: u64,
    pub map_bytes_per_lba: f64,
    pub gc_moved_bytes: u64,
    pub gc_segments_collected: u64,
    pub gc_write_amplification: f64,
    pub host_written_bytes: u64,
    pub host_trimmed_bytes: u64,
    pub media_written_bytes: u64,
    pub segment_bytes: u64,
    pub segments: u64,
    pub free_segments: u64,
    pub checkpoints: u64,
}

impl From<&CsdStats> for StatsJson {
    fn from(s: &CsdStats) -> StatsJson {
        StatsJson {
            logical_capacity_bytes: s.logical_capacity_bytes,
            mapped_bytes: s.mapped_bytes,
            physical_used_bytes: s.physical_used_bytes,
            physical_live_bytes: s.physical_live_bytes,
            physical_allocated_bytes: s.physical_allocated_bytes,
            physical_capacity_bytes: s.physical_capacity_bytes,
            media_bytes: s.media_bytes,
            compression_ratio: s.compression_ratio(),
            map_memory_bytes: s.map_memory_bytes,
            map_bytes_per_lba: s.map_bytes_per_lba(),
            gc_moved_bytes: s.counters.gc_moved_bytes,
            gc_segments_collected: s.counters.gc_segments_collected,
            gc_write_amplification: s.gc_write_amplification(),
            host_written_bytes: s.counters.host_written_blocks * BLOCK_SIZE as u64,
            host_trimmed_bytes: s.counters.host_trimmed_blocks * BLOCK_SIZE as u64,
            media_written_bytes: s.counters.media_written_bytes,
            segment_bytes: s.segment_bytes,
            segments: s.segments,
            free_segments: s.free_segments,
            checkpoints: s.counters.checkpoints,
        }
    }
}

fn stats(path: &Path, json: bool) -> Result<()> {
    let drive = open(path, CsdConfig { background: false, ..CsdConfig::default() })?;
    let s = drive.stats();
    drop(drive);
    if json {
        println!("{}", serde_json::to_string_pretty(&StatsJson::from(&s))?);
        return Ok(());
    }
    let pct = |a: u64, b: u64| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
    println!(
        "logical   {} mapped of {} ({:.1}%)",
        format_size(s.mapped_bytes),
        format_size(s.logical_capacity_bytes),
        pct(s.mapped_bytes, s.logical_capacity_bytes)
    );
    println!(
        "physical  {} used of {} ({:.1}%), compression ratio {:.3}",
        format_size(s.physical_used_bytes),
        format_size(s.physical_capacity_bytes),
        pct(s.physical_used_bytes, s.physical_capacity_bytes),
        s.compression_ratio()
    );
    println!(
        "media     {} allocated of {} ({} of {} segments free)",
        format_size(s.physical_allocated_bytes),
        format_size(s.media_bytes),
        s.free_segments,
        s.segments
    );
    println!(
        "gc        {} moved in {} segments, write amplification {:.3}",
        format_size(s.counters.gc_moved_bytes),
        s.counters.gc_segments_collected,
        s.gc_write_amplification()
    );
    println!("map       {} in memory, {:.2} bytes per LBA", format_size(s.map_memory_bytes), s.map_bytes_per_lba());
    Ok(())
}
