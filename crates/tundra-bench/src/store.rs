//! `tundra-bench store`: writes database files page by page through the store onto an emulated
//! drive, once per way of compressing, and reports the space each way really takes, measured from
//! the store's and the drive's own usage (seed 000 Figure 14 and Table 3), against the drive
//! alone and against no compression at all.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;
use tundra_codec::{Algorithm, PageCodec, Selector, SelectorConfig};
use tundra_device::csd::{CsdConfig, CsdDevice, FormatOptions};
use tundra_device::file::FileDevice;
use tundra_device::{BLOCK_SIZE_BYTES, BlockDevice, Lba};
use tundra_store::ids::{ChunkId, Lsn, VolumeId};
use tundra_store::journal::{Journal, JournalGeometry};
use tundra_store::pages::{CpuLoad, Pages};
use tundra_store::store::Store;
use tundra_store::volume::{DEFAULT_CHUNK_BYTES, Volume, VolumeMode};

use tundra::input::{InputFile, calibrate, open_files, parse_page_size, read_padded, selector_config};

#[derive(Args)]
pub struct StoreArgs {
    /// Database files (PostgreSQL relation files, InnoDB .ibd files, ...).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The database's page size: 8KiB (PostgreSQL) or 16KiB (InnoDB).
    #[arg(long, default_value = "8KiB")]
    page_size: String,
    /// Directory for the temporary drive and journal images; the system temporary directory by default.
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long)]
    json: bool,
    /// Algorithm 1's rule for block ties, as for `tundra analyze`.
    #[arg(long, default_value = "100", value_name = "B/µs|off")]
    tie_rate: String,
}

#[derive(Serialize)]
struct Layout {
    name: String,
    pages: u64,
    /// Bytes the store's pages take in 4 KiB blocks (software layer).
    software_4k_bytes: u64,
    /// What the drive stores (its physical_used_bytes).
    physical_bytes: u64,
    software_4k_ratio: f64,
    ratio: f64,
    lz4_pages: u64,
    zstd_pages: u64,
    raw_pages: u64,
    seconds: f64,
    /// Durable page writes (data flushed and journalled) at queue depth 1.
    write_us_mean: f64,
    /// Random page reads at queue depth 1 with the page cache off: read, decompress, verify.
    read_us_mean: f64,
    read_us_p99: f64,
    /// The same reads taken apart, each part timed on its own: reading the page's blocks from
    /// the drive, and decompressing them.
    device_read_us_mean: f64,
    decompress_us_mean: f64,
    /// What the store adds over those two parts (index lookup, checksum, copies); seed 000
    /// §3.2.1's bar is that reads cost no more than the device read and the decompression.
    read_overhead_us: f64,
}

#[derive(Serialize)]
struct Report {
    files: Vec<String>,
    page_size: usize,
    logical_bytes: u64,
    drive_only_physical_bytes: u64,
    drive_only_ratio: f64,
    /// The same pages written (and flushed) and read straight on a plain file device.
    plain_write_us_mean: f64,
    plain_read_us_mean: f64,
    plain_read_us_p99: f64,
    reads: usize,
    layouts: Vec<Layout>,
}

pub fn run(args: StoreArgs) -> Result<()> {
    let page_size = parse_page_size(&args.page_size)?;
    let files = open_files(&args.files)?;
    let page_bytes = page_size.bytes() as u64;
    let pages: u64 = files.iter().map(|f| f.bytes.div_ceil(page_bytes)).sum();
    if pages == 0 {
        bail!("no pages to measure: the files are empty");
    }
    let logical = pages * page_bytes;
    let dir =
        args.dir.clone().unwrap_or_else(std::env::temp_dir).join(format!("tundra-measure-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let config = selector_config(&args.tie_rate)?;
    let result = measure_all(&files, page_size, logical, &dir, config);
    let _ = std::fs::remove_dir_all(&dir);
    let (drive_only, plain, layouts) = result?;
    let report = Report {
        files: args.files.iter().map(|p| p.display().to_string()).collect(),
        page_size: page_size.bytes(),
        logical_bytes: logical,
        drive_only_physical_bytes: drive_only,
        drive_only_ratio: logical as f64 / drive_only.max(1) as f64,
        plain_write_us_mean: plain.write_us_mean,
        plain_read_us_mean: plain.read_us_mean,
        plain_read_us_p99: plain.read_us_p99,
        reads: read_count(pages),
        layouts,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

type Measured = (u64, Timing, Vec<Layout>);

/// Latencies of one way of storing the pages.
struct Timing {
    write_us_mean: f64,
    read_us_mean: f64,
    read_us_p99: f64,
}

/// Random reads measured per layout.
fn read_count(pages: u64) -> usize {
    (pages as usize).clamp(1, 2000)
}

/// The page indexes read, the same for every layout.
fn read_order(pages: u64) -> Vec<u64> {
    let mut rng = tundra_env::Rng::new(7);
    (0..read_count(pages)).map(|_| rng.below(pages)).collect()
}

fn mean_us(samples: &[Duration]) -> f64 {
    samples.iter().map(Duration::as_secs_f64).sum::<f64>() * 1e6 / samples.len().max(1) as f64
}

fn p99_us(samples: &mut [Duration]) -> f64 {
    samples.sort_unstable();
    samples.get((samples.len() * 99).div_ceil(100).saturating_sub(1)).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// The baseline: pages written and flushed one by one, then read, straight on a plain file.
fn plain_device(dir: &Path, files: &[InputFile], page_size: tundra_codec::PageSize, logical: u64) -> Result<Timing> {
    let page_bytes = page_size.bytes() as u64;
    let device = FileDevice::create(dir.join("plain.img"), logical.div_ceil(BLOCK_SIZE_BYTES) * BLOCK_SIZE_BYTES)?;
    let mut writes = Vec::new();
    let mut page = vec![0u8; page_size.bytes()];
    let mut index = 0u64;
    for_each_page(files, page_size, &mut page, |page| {
        let started = Instant::now();
        device.write(Lba(index * page_bytes / BLOCK_SIZE_BYTES), page)?;
        device.flush()?;
        writes.push(started.elapsed());
        index += 1;
        Ok(())
    })?;
    let mut reads = Vec::new();
    for i in read_order(logical / page_bytes) {
        let started = Instant::now();
        device.read(Lba(i * page_bytes / BLOCK_SIZE_BYTES), &mut page)?;
        reads.push(started.elapsed());
    }
    Ok(Timing { write_us_mean: mean_us(&writes), read_us_mean: mean_us(&reads), read_us_p99: p99_us(&mut reads) })
}

fn measure_all(
    files: &[InputFile],
    page_size: tundra_codec::PageSize,
    logical: u64,
    dir: &Path,
    config: SelectorConfig,
) -> Result<Measured> {
    let page_bytes = page_size.bytes() as u64;
    let pages = logical / page_bytes;
    let drive_only = {
        let drive = new_drive(dir, "drive-only.img", logical)?;
        let mut page = vec![0u8; page_size.bytes()];
        let mut index = 0u64;
        for_each_page(files, page_size, &mut page, |page| {
            drive.write(Lba(index * page_bytes / BLOCK_SIZE_BYTES), page)?;
            index += 1;
            Ok(())
        })?;
        drive.flush()?;
        drive.stats().physical_used_bytes
    };
    let plain = plain_device(dir, files, page_size, logical)?;
    let codec = PageCodec::default();
    let cost = calibrate(&codec, files, page_size, pages)?;
    let mut layouts = Vec::new();
    for (name, algorithm) in [
        ("none", Some(None)),
        ("lz4", Some(Some(Algorithm::Lz4))),
        ("zstd", Some(Some(Algorithm::Zstd))),
        ("adaptive", None),
    ] {
        let started = Instant::now();
        let drive = Arc::new(new_drive(dir, &format!("{name}.img"), logical)?);
        let fast = journal_device(dir, name, pages)?;
        let store = Arc::new(Store::open(drive.clone(), fast)?);
        let volume = Volume {
            id: VolumeId(1),
            name: "measure".into(),
            size_bytes: logical,
            page_size: page_size.bytes() as u32,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            mode: VolumeMode::Normal,
        };
        store.create_volume(volume.clone())?;
        let selector = Selector::new(config, codec, cost)?;
        let pages_path = Pages::new(store, page_size, selector, codec, CpuLoad::Fixed(0.0))?;
        pages_path.set_cache_pages(0);
        let mut page_buf = vec![0u8; page_size.bytes()];
        let mut index = 0u64;
        let mut writes = Vec::new();
        for_each_page(files, page_size, &mut page_buf, |page| {
            let (chunk, page_no): (ChunkId, _) = volume.locate(index)?;
            let write_started = Instant::now();
            match algorithm {
                Some(forced) => pages_path.write_page_with(chunk, page_no, page, Lsn(1), forced)?,
                None => {
                    pages_path.write_page(chunk, page_no, page, Lsn(1), None)?;
                }
            }
            writes.push(write_started.elapsed());
            pages_path.store().maybe_checkpoint()?;
            index += 1;
            Ok(())
        })?;
        let order: Vec<(ChunkId, _)> =
            read_order(pages).into_iter().map(|i| volume.locate(i)).collect::<Result<_, _>>()?;
        // Each page is read by the store and, separately, in parts (its blocks from the drive,
        // then their decompression); the two go first by turns, so that neither has the warmer
        // caches and a burst of load on the machine hits both alike.
        let mut reads = Vec::new();
        let (mut device_reads, mut decodes) = (Vec::new(), Vec::new());
        for (n, &(chunk, page_no)) in order.iter().enumerate() {
            let parts_first = n % 2 == 0;
            if parts_first {
                read_parts(
                    pages_path.store(),
                    &*drive,
                    &codec,
                    page_size,
                    chunk,
                    page_no,
                    &mut device_reads,
                    &mut decodes,
                )?;
            }
            let read_started = Instant::now();
            pages_path.read_page(chunk, page_no)?.context("a page written above is missing")?;
            reads.push(read_started.elapsed());
            if !parts_first {
                read_parts(
                    pages_path.store(),
                    &*drive,
                    &codec,
                    page_size,
                    chunk,
                    page_no,
                    &mut device_reads,
                    &mut decodes,
                )?;
            }
        }
        let device_read_us_mean = mean_us(&device_reads);
        let decompress_us_mean = mean_us(&decodes);
        let read_us_mean = mean_us(&reads);
        pages_path.store().release_freed()?;
        drive.flush()?;
        let stats = pages_path.store().stats();
        let counts = pages_path.counts();
        let physical = drive.stats().physical_used_bytes;
        layouts.push(Layout {
            name: name.to_string(),
            pages,
            software_4k_bytes: stats.stored_bytes,
            physical_bytes: physical,
            software_4k_ratio: logical as f64 / stats.stored_bytes.max(1) as f64,
            ratio: logical as f64 / physical.max(1) as f64,
            lz4_pages: counts.written_lz4,
            zstd_pages: counts.written_zstd,
            raw_pages: counts.written_raw,
            seconds: started.elapsed().as_secs_f64(),
            write_us_mean: mean_us(&writes),
            read_us_mean,
            read_us_p99: p99_us(&mut reads),
            device_read_us_mean,
            decompress_us_mean,
            read_overhead_us: read_us_mean - device_read_us_mean - decompress_us_mean,
        });
    }
    Ok((drive_only, plain, layouts))
}

fn for_each_page(
    files: &[InputFile],
    page_size: tundra_codec::PageSize,
    page: &mut [u8],
    mut visit: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let page_bytes = page_size.bytes() as u64;
    for input in files {
        for index in 0..input.bytes.div_ceil(page_bytes) {
            read_padded(input, index * page_bytes, page)?;
            visit(page)?;
        }
    }
    Ok(())
}

/// Times the two parts of one page read on their own: the device read of the page's blocks,
/// and the decompression of its image.
#[allow(clippy::too_many_arguments)]
fn read_parts(
    store: &Store,
    drive: &dyn BlockDevice,
    codec: &PageCodec,
    page_size: tundra_codec::PageSize,
    chunk: ChunkId,
    page: tundra_store::ids::PageNo,
    device: &mut Vec<Duration>,
    decode: &mut Vec<Duration>,
) -> Result<()> {
    let entry = store.entry(chunk, page).context("a page written above is missing")?;
    let mut bytes = vec![0u8; usize::from(entry.run.count) * BLOCK_SIZE_BYTES as usize];
    let started = Instant::now();
    drive.read(entry.run.first_lba(), &mut bytes)?;
    device.push(started.elapsed());
    bytes.truncate(usize::from(entry.stored_len));
    let encoding = match entry.encoding {
        tundra_store::index::Encoding::Lz4 => tundra_codec::Encoding::Compressed(Algorithm::Lz4),
        tundra_store::index::Encoding::Zstd => tundra_codec::Encoding::Compressed(Algorithm::Zstd),
        tundra_store::index::Encoding::Raw => tundra_codec::Encoding::Raw,
        tundra_store::index::Encoding::Heavy => bail!("heavy pages are not measured here"),
    };
    let started = Instant::now();
    let page = codec.decode(encoding, &bytes, page_size).map_err(|e| anyhow::anyhow!("decoding: {e}"))?;
    decode.push(started.elapsed());
    std::hint::black_box(page);
    Ok(())
}

/// An emulated drive in `dir` with room for `logical` bytes even uncompressed.
fn new_drive(dir: &Path, name: &str, logical: u64) -> Result<CsdDevice> {
    let logical = logical.div_ceil(BLOCK_SIZE_BYTES) * BLOCK_SIZE_BYTES;
    let options = FormatOptions::new(logical + (64 << 20), logical + logical / 10 + (16 << 20));
    let path = dir.join(name);
    let media = FileDevice::create(&path, options.geometry()?.total_bytes())?;
    Ok(CsdDevice::format(Arc::new(media), &options, CsdConfig::default())?)
}

/// A journal sized so that a checkpoint of every page fits.
fn journal_device(dir: &Path, name: &str, pages: u64) -> Result<Arc<dyn BlockDevice>> {
    let checkpoint_blocks = 2 + (pages * tundra_store::journal::PAGE_RECORD_BYTES as u64).div_ceil(BLOCK_SIZE_BYTES);
    let geometry = JournalGeometry { checkpoint_blocks, log_blocks: 1024 };
    let device = FileDevice::create(dir.join(format!("{name}.journal")), geometry.total_blocks() * BLOCK_SIZE_BYTES)?;
    Journal::format(&device, geometry)?;
    Ok(Arc::new(device))
}

fn print_report(report: &Report) {
    println!(
        "files: {} ({} bytes, pages of {} bytes)\n",
        report.files.join(", "),
        report.logical_bytes,
        report.page_size
    );
    println!(
        "plain file device: durable page write {:.1} µs, random page read {:.1} µs mean, {:.1} µs p99 ({} reads)\n",
        report.plain_write_us_mean, report.plain_read_us_mean, report.plain_read_us_p99, report.reads
    );
    println!(
        "| layout | software 4 KiB bytes | software ratio | physical bytes | ratio | vs drive only | lz4 / zstd / raw pages | write µs (vs plain) | read µs mean (vs plain) | read µs p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    println!("| drive only | | | {} | {:.3} | | | | | |", report.drive_only_physical_bytes, report.drive_only_ratio);
    for l in &report.layouts {
        println!(
            "| {} + drive | {} | {:.3} | {} | {:.3} | {:+.1}% | {} / {} / {} | {:.1} ({:.2}x) | {:.1} ({:.2}x) | {:.1} |",
            l.name,
            l.software_4k_bytes,
            l.software_4k_ratio,
            l.physical_bytes,
            l.ratio,
            100.0 * (l.ratio / report.drive_only_ratio - 1.0),
            l.lz4_pages,
            l.zstd_pages,
            l.raw_pages,
            l.write_us_mean,
            l.write_us_mean / report.plain_write_us_mean.max(1e-9),
            l.read_us_mean,
            l.read_us_mean / report.plain_read_us_mean.max(1e-9),
            l.read_us_p99
        );
    }
    println!("\nread path, µs mean per page: the store's read against its parts timed alone\n");
    println!("| layout | store read | device read | decompress | store adds |");
    println!("|---|---|---|---|---|");
    for l in &report.layouts {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:+.1} |",
            l.name, l.read_us_mean, l.device_read_us_mean, l.decompress_us_mean, l.read_overhead_us
        );
    }
}
