//! `tundra analyze FILE...`: what Tundra would store for a user's own database files.
//!
//! The files are split into pages (the last partial page of each file zero-padded) and every
//! page is put through each way of storing it: the drive alone (raw deflate level 5 per 4 KiB
//! block, exactly what the emulated drive stores), lz4 or zstd in software rounded to 4 KiB
//! blocks, and both layers together, for lz4, zstd and Algorithm 1's per-page choice. It also
//! reproduces seed 000's Figure 2 (index granularity, input size, algorithm), Figure 5c (zstd's
//! advantage over lz4 before and after the drive) and Table 3 (the lz4/zstd mix) on the data.
//!
//! Algorithm 1 runs as on an idle host writing every page for the first time, so that it always
//! compares; its decompression costs are calibrated on this machine at startup, on sample pages
//! of the files themselves. Nothing is written anywhere.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use anyhow::{Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use libdeflater::{CompressionLvl, Compressor};
use tundra::input::{InputFile, calibrate, open_files, parse_page_size, read_padded, selector_config};
use tundra_codec::{Algorithm, EncodedPage, Encoding, PageCodec, PageSize, Selector, bytes_4k};
use tundra_device::csd::{DEFLATE_LEVEL, stored_payload_bytes};
use tundra_device::{BLOCK_SIZE, is_zero};

use crate::analyze_report::{Input, Report};

#[derive(Args)]
pub struct AnalyzeArgs {
    /// Database files: a PostgreSQL table's segment files, an InnoDB .ibd file, ...
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// The database's page size: 8KiB (PostgreSQL) or 16KiB (InnoDB, PolarDB).
    #[arg(long, default_value = "16KiB")]
    page_size: String,
    /// Print one JSON object (keys in docs/cli.md) instead of Markdown tables.
    #[arg(long)]
    json: bool,
    /// How Algorithm 1 decides when lz4 and zstd take the same 4 KiB blocks: bytes zstd must save
    /// per extra µs of decompression, or `off` for the paper's rule (lz4).
    #[arg(long, default_value = "100", value_name = "B/µs|off")]
    tie_rate: String,
}

/// Input sizes of seed 000 Figure 2b. Each divides [`UNIT_BYTES`], so that a unit of work holds
/// whole inputs of every size.
pub const INPUT_SIZES: [usize; 6] = [4 << 10, 8 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20];
/// The input size of Figure 2a: the paper's 16 KiB pages.
pub const GRANULARITY_INPUT: usize = 16 << 10;
/// The bytes of a file one worker takes at a time.
const UNIT_BYTES: u64 = 1 << 20;

// Units start at page boundaries and hold whole inputs of every Figure 2 size.
const _: () = {
    assert!((UNIT_BYTES as usize).is_multiple_of(PageSize::Kib16.bytes()));
    assert!((UNIT_BYTES as usize).is_multiple_of(PageSize::Kib8.bytes()));
    let mut i = 0;
    while i < INPUT_SIZES.len() {
        assert!((UNIT_BYTES as usize).is_multiple_of(INPUT_SIZES[i]));
        i += 1;
    }
};

pub fn run(args: AnalyzeArgs) -> Result<()> {
    let page_size = parse_page_size(&args.page_size)?;
    let files = open_files(&args.files)?;
    let pages: u64 = files.iter().map(|f| f.bytes.div_ceil(page_size.bytes() as u64)).sum();
    if pages == 0 {
        bail!("no pages to analyze: {} empty", names(&args.files));
    }
    let codec = PageCodec::default();
    let cost = calibrate(&codec, &files, page_size, pages)?;
    let selector = Selector::new(selector_config(&args.tie_rate)?, codec, cost)?;
    let totals = scan(&files, page_size, &codec, &selector)?;
    let input = Input {
        files: files.iter().map(|f| (f.path.display().to_string(), f.bytes)).collect(),
        page_size,
        zstd_level: codec.zstd_level(),
        deflate_level: DEFLATE_LEVEL,
        selector: &selector,
    };
    let report = Report::new(&input, &totals);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.markdown());
    }
    Ok(())
}

fn names(paths: &[PathBuf]) -> String {
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let verb = if names.len() == 1 { "is" } else { "are" };
    format!("{} {verb}", names.join(", "))
}

/// Bytes one way of storing pages costs.
#[derive(Clone, Copy, Debug, Default)]
pub struct LayerBytes {
    /// The software layer's output at byte granularity, each page capped at the page size.
    pub software: u64,
    /// The software layer's output in whole 4 KiB blocks, raw pages as a full page.
    pub software_4k: u64,
    /// What the drive stores for those blocks.
    pub dual_layer: u64,
    /// Pages stored raw because compression saved no 4 KiB block.
    pub raw_pages: u64,
}

impl LayerBytes {
    fn add(&mut self, other: &LayerBytes) {
        self.software += other.software;
        self.software_4k += other.software_4k;
        self.dual_layer += other.dual_layer;
        self.raw_pages += other.raw_pages;
    }
}

/// zstd's output for one input size of Figure 2.
#[derive(Clone, Copy, Debug, Default)]
pub struct InputBytes {
    pub byte_granular: u64,
    pub block_4k: u64,
}

/// Everything counted over the pages.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub pages: u64,
    pub zero_pages: u64,
    pub drive_only: u64,
    pub lz4: LayerBytes,
    pub zstd: LayerBytes,
    pub adaptive: LayerBytes,
    /// Algorithm 1's choices by how the page ends up stored.
    pub adaptive_lz4_pages: u64,
    pub adaptive_zstd_pages: u64,
    pub adaptive_raw_pages: u64,
    /// Raw deflate level 5 of whole pages, byte granularity (Figure 2c).
    pub deflate_page: u64,
    /// zstd at each of [`INPUT_SIZES`] (Figure 2a and 2b).
    pub inputs: [InputBytes; INPUT_SIZES.len()],
}

impl Totals {
    fn add(&mut self, other: &Totals) {
        self.pages += other.pages;
        self.zero_pages += other.zero_pages;
        self.drive_only += other.drive_only;
        self.lz4.add(&other.lz4);
        self.zstd.add(&other.zstd);
        self.adaptive.add(&other.adaptive);
        self.adaptive_lz4_pages += other.adaptive_lz4_pages;
        self.adaptive_zstd_pages += other.adaptive_zstd_pages;
        self.adaptive_raw_pages += other.adaptive_raw_pages;
        self.deflate_page += other.deflate_page;
        for (mine, theirs) in self.inputs.iter_mut().zip(&other.inputs) {
            mine.byte_granular += theirs.byte_granular;
            mine.block_4k += theirs.block_4k;
        }
    }
}

/// A piece of one file: at most [`UNIT_BYTES`] from `offset`.
struct Unit {
    file: usize,
    offset: u64,
    pub(crate) bytes: u64,
}

fn units(files: &[InputFile]) -> Vec<Unit> {
    let mut units = Vec::new();
    for (index, input) in files.iter().enumerate() {
        let mut offset = 0;
        while offset < input.bytes {
            let bytes = UNIT_BYTES.min(input.bytes - offset);
            units.push(Unit { file: index, offset, bytes });
            offset += bytes;
        }
    }
    units
}

/// Runs every unit through [`Worker`]s, one per core, and adds up what they count.
fn scan(files: &[InputFile], page_size: PageSize, codec: &PageCodec, selector: &Selector) -> Result<Totals> {
    let units = units(files);
    let progress = progress_bar(files.iter().map(|f| f.bytes).sum());
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(units.len());
    let results: Vec<Result<Totals>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut worker = Worker::new(page_size, *codec, selector);
                    let result = worker.run(files, &units, &next, &failed, &progress);
                    if result.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    result
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("an analyze thread panicked")).collect()
    });
    progress.finish_and_clear();
    let mut totals = Totals::default();
    for result in results {
        totals.add(&result?);
    }
    Ok(totals)
}

/// A progress bar on standard error when it is a terminal; nothing otherwise, so that logs and
/// pipes get only the report.
fn progress_bar(bytes: u64) -> ProgressBar {
    let target =
        if std::io::stderr().is_terminal() { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let progress = ProgressBar::with_draw_target(Some(bytes), target);
    progress.set_style(
        ProgressStyle::with_template("analyzing {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("the template is valid"),
    );
    progress
}

/// One way of storing one page, and what it costs.
struct Candidate {
    encoded: EncodedPage,
    bytes: LayerBytes,
}

/// The per-page work of one thread, with its own deflate compressor.
struct Worker<'a> {
    page_size: PageSize,
    codec: PageCodec,
    selector: &'a Selector,
    deflate: Compressor,
    deflate_out: Vec<u8>,
}

impl<'a> Worker<'a> {
    fn new(page_size: PageSize, codec: PageCodec, selector: &'a Selector) -> Worker<'a> {
        let level = CompressionLvl::new(DEFLATE_LEVEL).expect("the drive's level is valid");
        let mut deflate = Compressor::new(level);
        let deflate_out = vec![0u8; deflate.deflate_compress_bound(page_size.bytes())];
        Worker { page_size, codec, selector, deflate, deflate_out }
    }

    fn run(
        &mut self,
        files: &[InputFile],
        units: &[Unit],
        next: &AtomicUsize,
        failed: &AtomicBool,
        progress: &ProgressBar,
    ) -> Result<Totals> {
        let mut totals = Totals::default();
        let mut buf = vec![0u8; UNIT_BYTES as usize];
        while !failed.load(Ordering::Relaxed) {
            let Some(unit) = units.get(next.fetch_add(1, Ordering::Relaxed)) else { break };
            let padded = (unit.bytes as usize).next_multiple_of(self.page_size.bytes());
            let data = &mut buf[..padded];
            read_padded(&files[unit.file], unit.offset, data)?;
            self.unit(data, &mut totals)?;
            progress.inc(unit.bytes);
        }
        Ok(totals)
    }

    /// Counts the pages of `data` (whole pages) and zstd's output at every input size.
    fn unit(&mut self, data: &[u8], totals: &mut Totals) -> Result<()> {
        for page in data.chunks_exact(self.page_size.bytes()) {
            self.page(page, totals)?;
        }
        for (input_size, counted) in INPUT_SIZES.iter().zip(&mut totals.inputs) {
            for input in data.chunks(*input_size) {
                let compressed = self.codec.compress_bytes(Algorithm::Zstd, input)?.len();
                counted.byte_granular += compressed.min(input.len()) as u64;
                counted.block_4k += bytes_4k(compressed).min(bytes_4k(input.len())) as u64;
            }
        }
        Ok(())
    }

    fn page(&mut self, page: &[u8], totals: &mut Totals) -> Result<()> {
        totals.pages += 1;
        totals.zero_pages += u64::from(is_zero(page));
        let drive_only = drive_bytes(page);
        totals.drive_only += drive_only;
        let lz4 = self.candidate(Algorithm::Lz4, page, drive_only)?;
        let zstd = self.candidate(Algorithm::Zstd, page, drive_only)?;
        let chosen = match self.selector.compare(&lz4.encoded, &zstd.encoded).chosen {
            Algorithm::Lz4 => &lz4,
            Algorithm::Zstd => &zstd,
        };
        match chosen.encoded.encoding {
            Encoding::Raw => totals.adaptive_raw_pages += 1,
            Encoding::Compressed(Algorithm::Lz4) => totals.adaptive_lz4_pages += 1,
            Encoding::Compressed(Algorithm::Zstd) => totals.adaptive_zstd_pages += 1,
        }
        totals.adaptive.add(&chosen.bytes);
        totals.lz4.add(&lz4.bytes);
        totals.zstd.add(&zstd.bytes);
        totals.deflate_page += self.deflate_bytes(page) as u64;
        Ok(())
    }

    /// `page` compressed with `algorithm`, stored by the 4 KiB rule, then by the drive.
    fn candidate(&self, algorithm: Algorithm, page: &[u8], drive_only: u64) -> Result<Candidate> {
        let compressed = self.codec.compress(algorithm, page)?;
        let software = compressed.len().min(page.len()) as u64;
        let encoded = EncodedPage::choose(algorithm, page, compressed);
        let raw = encoded.encoding == Encoding::Raw;
        // A raw page reaches the drive as it is: the drive alone.
        let dual_layer = if raw { drive_only } else { drive_bytes(&encoded.padded_4k()) };
        let bytes =
            LayerBytes { software, software_4k: encoded.bytes_4k() as u64, dual_layer, raw_pages: u64::from(raw) };
        Ok(Candidate { encoded, bytes })
    }

    /// Raw deflate level 5 of a whole page, capped at the page (Figure 2c's deflate).
    fn deflate_bytes(&mut self, page: &[u8]) -> usize {
        // libdeflate reports an output that does not fit the bound as an error; it cannot happen.
        let compressed = self.deflate.deflate_compress(page, &mut self.deflate_out).unwrap_or(page.len());
        compressed.min(page.len())
    }
}

/// What the emulated drive stores for whole 4 KiB blocks.
fn drive_bytes(blocks: &[u8]) -> u64 {
    blocks.chunks_exact(BLOCK_SIZE).map(|block| stored_payload_bytes(block) as u64).sum()
}
