//! `tundra-bench drive`: the emulated drive measured the way seed 000 §4.1.3 measures PolarCSD
//! (Figure 7: 16 KiB I/O at queue depth 1, compressibility 1.0 to 4.0) against a plain file
//! device in the same run, the host CPU its engine costs, and its garbage collection under random
//! overwrites at several physical fullness levels.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use clap::Args;
use serde::Serialize;
use tundra_device::csd::{CompressionMode, CsdConfig, CsdDevice, FormatOptions, GcPolicy, stored_payload_bytes};
use tundra_device::file::FileDevice;
use tundra_device::size::{format_size, parse_size};
use tundra_device::{BLOCK_SIZE, BLOCK_SIZE_BYTES, BlockDevice, Lba};
use tundra_env::Rng;

use crate::measure::{Latencies, machine_description, process_cpu_time};

#[derive(Args, Clone)]
pub struct DriveArgs {
    /// Directory for the drive and plain images (removed afterwards); defaults to the system
    /// temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Working set of the latency runs.
    #[arg(long, default_value = "256MiB")]
    size: String,
    /// Random reads measured per point (writes cover the whole working set).
    #[arg(long, default_value_t = 4000)]
    reads: usize,
    /// Compressibility targets, fio's buffer_compress_percentage model.
    #[arg(long, default_value = "1.0,2.0,3.0,4.0", value_delimiter = ',')]
    ratios: Vec<f64>,
    /// Physical fullness levels of the garbage collection runs, in percent.
    #[arg(long, default_value = "70,80,90", value_delimiter = ',')]
    fullness: Vec<u32>,
    /// Physical capacity of the drive in the garbage collection runs.
    #[arg(long, default_value = "128MiB")]
    gc_physical: String,
    /// Overwrites in the garbage collection runs, as multiples of the live data.
    #[arg(long, default_value_t = 4.0)]
    gc_passes: f64,
    /// Segment size of the drives.
    #[arg(long, default_value = "1MiB")]
    segment_size: String,
    /// A small configuration that finishes in seconds (used by the tests).
    #[arg(long)]
    quick: bool,
    /// Which parts to run: latency, gc or all.
    #[arg(long, default_value = "all")]
    suite: String,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Serialize)]
struct LatencyPoint {
    target_ratio: f64,
    achieved_ratio: f64,
    drive_write_p50_us: f64,
    drive_write_p99_us: f64,
    plain_write_p50_us: f64,
    plain_write_p99_us: f64,
    drive_read_p50_us: f64,
    drive_read_p99_us: f64,
    plain_read_p50_us: f64,
    plain_read_p99_us: f64,
    drive_write_cpu_us_per_4k: f64,
    plain_write_cpu_us_per_4k: f64,
    drive_read_cpu_us_per_4k: f64,
    plain_read_cpu_us_per_4k: f64,
    inline_4k_write_mb_per_cpu_s: f64,
    deferred_4k_write_foreground_cpu_us_per_4k: f64,
    deferred_background_cpu_us_per_4k: f64,
    deferred_4k_write_p50_us: f64,
    inline_4k_write_p50_us: f64,
    map_bytes_per_lba: f64,
}

#[derive(Serialize)]
struct GcPoint {
    policy: String,
    fullness_target_percent: u32,
    fullness_percent: f64,
    gc_write_amplification: f64,
    space_amplification: f64,
    gc_moved_bytes: u64,
    overwrites: u64,
}

#[derive(Serialize)]
struct Report {
    configuration: String,
    machine: String,
    latency: Vec<LatencyPoint>,
    gc: Vec<GcPoint>,
}

pub fn run(mut args: DriveArgs) -> Result<()> {
    if args.quick {
        args.size = "8MiB".into();
        args.reads = 300;
        args.gc_physical = "4MiB".into();
        args.gc_passes = 1.5;
        args.segment_size = "64KiB".into();
    }
    ensure!(matches!(args.suite.as_str(), "latency" | "gc" | "all"), "--suite is latency, gc or all");
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("tundra-bench-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let configuration = format!(
        "tundra-bench drive --size {} --reads {} --ratios {} --fullness {} --gc-physical {} --gc-passes {} --segment-size {}{}",
        args.size,
        args.reads,
        args.ratios.iter().map(|r| format!("{r:.1}")).collect::<Vec<_>>().join(","),
        args.fullness.iter().map(|f| f.to_string()).collect::<Vec<_>>().join(","),
        args.gc_physical,
        args.gc_passes,
        args.segment_size,
        if args.quick { " (--quick)" } else { "" },
    );
    let machine = machine_description();
    println!("# tundra-bench drive\n\nconfiguration: `{configuration}`\n\nmachine: {machine}\n");
    let result = run_suites(&args, &dir, configuration, machine);
    if args.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let report = result?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn run_suites(args: &DriveArgs, dir: &Path, configuration: String, machine: String) -> Result<Report> {
    let segment_bytes = parse_size(&args.segment_size)?;
    let mut report = Report { configuration, machine, latency: Vec::new(), gc: Vec::new() };
    if args.suite != "gc" {
        let size = parse_size(&args.size)?;
        for &ratio in &args.ratios {
            ensure!(ratio >= 1.0, "compression ratios start at 1.0");
            report.latency.push(latency_point(dir, size, segment_bytes, ratio, args.reads)?);
        }
        print_latency(&report.latency);
    }
    if args.suite != "latency" {
        let physical = parse_size(&args.gc_physical)?;
        for policy in [GcPolicy::Greedy, GcPolicy::CostBenefit] {
            for &fullness in &args.fullness {
                report.gc.push(gc_point(dir, physical, segment_bytes, policy, fullness, args.gc_passes)?);
            }
        }
        print_gc(&report.gc);
    }
    Ok(report)
}

/// One 4 KiB block at a target compressibility, the way fio's buffer_compress_percentage
/// builds buffers: each 512-byte chunk is random for 1/ratio of its length and zero after.
fn fill_block(rng: &mut Rng, ratio: f64, block: &mut [u8]) {
    let random = (512.0 / ratio).round() as usize;
    for chunk in block.chunks_mut(512) {
        rng.fill(&mut chunk[..random]);
        chunk[random..].fill(0);
    }
}

fn fill_buffer(rng: &mut Rng, ratio: f64, buf: &mut [u8]) {
    for block in buf.chunks_mut(BLOCK_SIZE) {
        fill_block(rng, ratio, block);
    }
}

struct Phase {
    latencies: Latencies,
    cpu: Duration,
    blocks: u64,
}

impl Phase {
    fn cpu_us_per_4k(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.blocks.max(1) as f64
    }
}

/// Writes every 16 KiB slot once in random order at queue depth 1, then flushes.
fn write_phase(dev: &dyn BlockDevice, slots: u64, ratio: f64, seed: u64) -> Result<Phase> {
    let mut rng = Rng::new(seed);
    let mut order: Vec<u64> = (0..slots).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut buf = vec![0u8; 4 * BLOCK_SIZE];
    let mut latencies = Latencies::default();
    let cpu = process_cpu_time();
    for slot in order {
        fill_buffer(&mut rng, ratio, &mut buf);
        let start = Instant::now();
        dev.write(Lba(slot * 4), &buf)?;
        latencies.record(start.elapsed());
    }
    dev.flush()?;
    Ok(Phase { latencies, cpu: process_cpu_time() - cpu, blocks: slots * 4 })
}

fn read_phase(dev: &dyn BlockDevice, slots: u64, reads: usize, seed: u64) -> Result<Phase> {
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; 4 * BLOCK_SIZE];
    let mut latencies = Latencies::default();
    let cpu = process_cpu_time();
    for _ in 0..reads {
        let slot = rng.below(slots);
        let start = Instant::now();
        dev.read(Lba(slot * 4), &mut buf)?;
        latencies.record(start.elapsed());
    }
    Ok(Phase { latencies, cpu: process_cpu_time() - cpu, blocks: reads as u64 * 4 })
}

fn drive_in(
    dir: &Path,
    name: &str,
    logical: u64,
    physical: u64,
    segment_bytes: u64,
    config: CsdConfig,
) -> Result<(CsdDevice, PathBuf)> {
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    let options = FormatOptions { segment_bytes, ..FormatOptions::new(logical, physical) };
    let media = FileDevice::create(&path, options.geometry()?.total_bytes())?;
    Ok((CsdDevice::format(Arc::new(media), &options, config)?, path))
}

fn latency_point(dir: &Path, size: u64, segment_bytes: u64, ratio: f64, reads: usize) -> Result<LatencyPoint> {
    let size = size / (16 * 1024) * (16 * 1024);
    let slots = size / (16 * 1024);
    let physical = size + size / 10;
    let (drive, drive_path) = drive_in(dir, "drive.img", size, physical, segment_bytes, CsdConfig::default())?;
    let plain_path = dir.join("plain.img");
    let _ = std::fs::remove_file(&plain_path);
    let plain = FileDevice::create(&plain_path, size)?;

    let drive_write = write_phase(&drive, slots, ratio, 1)?;
    let plain_write = write_phase(&plain, slots, ratio, 1)?;
    let drive_read = read_phase(&drive, slots, reads, 2)?;
    let plain_read = read_phase(&plain, slots, reads, 2)?;
    let stats = drive.stats();
    drop(drive);
    drop(plain);
    let _ = std::fs::remove_file(&drive_path);
    let _ = std::fs::remove_file(&plain_path);

    let inline = small_writes(dir, size, physical, segment_bytes, ratio, CompressionMode::Inline)?;
    let deferred = small_writes(dir, size, physical, segment_bytes, ratio, CompressionMode::Deferred)?;
    let p = |phase: &mut Phase, pct| phase.latencies.percentile_us(pct);
    let (mut dw, mut pw, mut dr, mut pr) = (drive_write, plain_write, drive_read, plain_read);
    Ok(LatencyPoint {
        target_ratio: ratio,
        achieved_ratio: stats.compression_ratio(),
        drive_write_p50_us: p(&mut dw, 50.0),
        drive_write_p99_us: p(&mut dw, 99.0),
        plain_write_p50_us: p(&mut pw, 50.0),
        plain_write_p99_us: p(&mut pw, 99.0),
        drive_read_p50_us: p(&mut dr, 50.0),
        drive_read_p99_us: p(&mut dr, 99.0),
        plain_read_p50_us: p(&mut pr, 50.0),
        plain_read_p99_us: p(&mut pr, 99.0),
        drive_write_cpu_us_per_4k: dw.cpu_us_per_4k(),
        plain_write_cpu_us_per_4k: pw.cpu_us_per_4k(),
        drive_read_cpu_us_per_4k: dr.cpu_us_per_4k(),
        plain_read_cpu_us_per_4k: pr.cpu_us_per_4k(),
        inline_4k_write_mb_per_cpu_s: inline.mb_per_cpu_s,
        deferred_4k_write_foreground_cpu_us_per_4k: deferred.foreground_cpu_us_per_4k,
        deferred_background_cpu_us_per_4k: deferred.background_cpu_us_per_4k,
        deferred_4k_write_p50_us: deferred.p50_us,
        inline_4k_write_p50_us: inline.p50_us,
        map_bytes_per_lba: stats.map_bytes_per_lba(),
    })
}

struct SmallWrites {
    mb_per_cpu_s: f64,
    foreground_cpu_us_per_4k: f64,
    background_cpu_us_per_4k: f64,
    p50_us: f64,
}

/// 4 KiB writes over the working set at queue depth 1, inline or deferred compression: the
/// host CPU per written block, in the writing thread and in the background pass.
fn small_writes(
    dir: &Path,
    size: u64,
    physical: u64,
    segment_bytes: u64,
    ratio: f64,
    mode: CompressionMode,
) -> Result<SmallWrites> {
    let config = CsdConfig { compression: mode, background: false, ..CsdConfig::default() };
    let (drive, path) = drive_in(dir, "small.img", size, physical, segment_bytes, config)?;
    let blocks = size / BLOCK_SIZE_BYTES;
    let mut rng = Rng::new(3);
    let mut block = vec![0u8; BLOCK_SIZE];
    let mut latencies = Latencies::default();
    let cpu = process_cpu_time();
    for lba in 0..blocks {
        fill_block(&mut rng, ratio, &mut block);
        let start = Instant::now();
        drive.write(Lba(lba), &block)?;
        latencies.record(start.elapsed());
    }
    let foreground = process_cpu_time() - cpu;
    let cpu = process_cpu_time();
    drive.drain_deferred()?;
    drive.flush()?;
    let background = process_cpu_time() - cpu;
    drop(drive);
    let _ = std::fs::remove_file(&path);
    let per_4k = |d: Duration| d.as_secs_f64() * 1e6 / blocks as f64;
    Ok(SmallWrites {
        mb_per_cpu_s: (blocks * BLOCK_SIZE_BYTES) as f64 / 1e6 / (foreground + background).as_secs_f64().max(1e-9),
        foreground_cpu_us_per_4k: per_4k(foreground),
        background_cpu_us_per_4k: per_4k(background),
        p50_us: latencies.percentile_us(50.0),
    })
}

/// Fills the drive to a physical fullness with data of ratio about 2, then overwrites random
/// blocks; reports the collector's write amplification over the overwrites and the space held
/// per live byte at the end.
fn gc_point(
    dir: &Path,
    physical: u64,
    segment_bytes: u64,
    policy: GcPolicy,
    fullness: u32,
    passes: f64,
) -> Result<GcPoint> {
    let ratio = 2.0;
    let mut rng = Rng::new(u64::from(fullness));
    let mut block = vec![0u8; BLOCK_SIZE];
    // Size the working set from the record size this data really gets.
    let sample: u64 = (0..64)
        .map(|_| {
            fill_block(&mut rng, ratio, &mut block);
            stored_payload_bytes(&block) as u64 + 16
        })
        .sum::<u64>()
        / 64;
    let capacity = FormatOptions { segment_bytes, ..FormatOptions::new(BLOCK_SIZE_BYTES, physical) }
        .geometry()?
        .physical_capacity_bytes();
    let blocks = capacity * u64::from(fullness) / 100 / sample;
    let config = CsdConfig { gc_policy: policy, background: false, ..CsdConfig::default() };
    let (drive, path) = drive_in(dir, "gc.img", blocks * BLOCK_SIZE_BYTES, physical, segment_bytes, config)?;
    for lba in 0..blocks {
        fill_block(&mut rng, ratio, &mut block);
        drive.write(Lba(lba), &block)?;
    }
    drive.flush()?;
    let before = drive.stats();
    let overwrites = (blocks as f64 * passes) as u64;
    for _ in 0..overwrites {
        fill_block(&mut rng, ratio, &mut block);
        drive.write(Lba(rng.below(blocks)), &block)?;
    }
    drive.flush()?;
    let after = drive.stats();
    drop(drive);
    let _ = std::fs::remove_file(&path);
    let delta = after.counters.since(&before.counters);
    let host = delta.media_appended_bytes - delta.gc_moved_bytes;
    Ok(GcPoint {
        policy: match policy {
            GcPolicy::Greedy => "greedy",
            GcPolicy::CostBenefit => "cost-benefit",
        }
        .to_string(),
        fullness_target_percent: fullness,
        fullness_percent: 100.0 * after.physical_live_bytes as f64 / after.physical_capacity_bytes as f64,
        gc_write_amplification: delta.media_appended_bytes as f64 / host.max(1) as f64,
        space_amplification: after.space_amplification(),
        gc_moved_bytes: delta.gc_moved_bytes,
        overwrites,
    })
}

fn print_latency(points: &[LatencyPoint]) {
    println!("## 16 KiB I/O at queue depth 1: emulated drive vs plain file device (seed 000 Figure 7)\n");
    println!(
        "| target ratio | achieved ratio | write p50 µs drive / plain (ratio) | write p99 µs drive / plain (ratio) | read p50 µs drive / plain (ratio) | read p99 µs drive / plain (ratio) | drive CPU µs per 4 KiB write / read | plain CPU µs per 4 KiB write / read |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for p in points {
        let cell = |d: f64, f: f64| format!("{d:.1} / {f:.1} ({:.2}x)", d / f.max(1e-9));
        println!(
            "| {:.1} | {:.2} | {} | {} | {} | {} | {:.1} / {:.1} | {:.1} / {:.1} |",
            p.target_ratio,
            p.achieved_ratio,
            cell(p.drive_write_p50_us, p.plain_write_p50_us),
            cell(p.drive_write_p99_us, p.plain_write_p99_us),
            cell(p.drive_read_p50_us, p.plain_read_p50_us),
            cell(p.drive_read_p99_us, p.plain_read_p99_us),
            p.drive_write_cpu_us_per_4k,
            p.drive_read_cpu_us_per_4k,
            p.plain_write_cpu_us_per_4k,
            p.plain_read_cpu_us_per_4k,
        );
    }
    println!("\n## 4 KiB writes: inline vs deferred compression\n");
    println!(
        "| target ratio | inline MB/s per CPU-second | inline write p50 µs | deferred write p50 µs | deferred foreground CPU µs per 4 KiB | deferred background CPU µs per 4 KiB | map bytes per LBA |"
    );
    println!("|---|---|---|---|---|---|---|");
    for p in points {
        println!(
            "| {:.1} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |",
            p.target_ratio,
            p.inline_4k_write_mb_per_cpu_s,
            p.inline_4k_write_p50_us,
            p.deferred_4k_write_p50_us,
            p.deferred_4k_write_foreground_cpu_us_per_4k,
            p.deferred_background_cpu_us_per_4k,
            p.map_bytes_per_lba
        );
    }
    println!();
}

fn print_gc(points: &[GcPoint]) {
    println!("## Garbage collection under uniform random 4 KiB overwrites, data of ratio about 2\n");
    println!(
        "| policy | target fullness | measured fullness | GC write amplification | space amplification | moved | overwrites |"
    );
    println!("|---|---|---|---|---|---|---|");
    for p in points {
        println!(
            "| {} | {}% | {:.1}% | {:.2} | {:.2} | {} | {} |",
            p.policy,
            p.fullness_target_percent,
            p.fullness_percent,
            p.gc_write_amplification,
            p.space_amplification,
            format_size(p.gc_moved_bytes),
            p.overwrites
        );
    }
    println!();
}
