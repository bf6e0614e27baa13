//! deflate-survey: how raw-deflate libraries do on the 4 KiB blocks of a real
//! database file, as the emulated compressing drive would store them.
//!
//! Usage: `cargo run --release -p deflate-survey -- FILE [--levels 1,5,6] [--runs 3]`
//! (FILE is typically `target/realdata/flights.heap`, made by
//! `scripts/pg-real-table`).
//!
//! The file is cut into 4 KiB blocks, the last one zero-padded. All-zero
//! blocks are stored as nothing and are skipped; every other block is
//! compressed on its own, as raw deflate (no zlib/gzip wrapper), by each
//! library at each level, on one thread, reusing one compressor and one
//! decompressor object per library (reset between blocks). Reported per
//! library and level:
//! - compress and decompress speed in MB/s (10^6 bytes of uncompressed input
//!   or output per second), the best of `--runs` timed passes over all blocks;
//! - the stored size: each compressed block rounded up to 16 bytes, or 4096
//!   bytes (stored raw) when that is more than 4080 bytes.
//!
//! Every block is decompressed once, untimed, and compared with the original.
//!
//! Libraries: `libdeflater` (libdeflate, C; the drive's library),
//! `miniz_oxide` used directly (pure Rust; flate2's default backend), and
//! `flate2` built with only its `zlib-rs` backend (pure Rust port of
//! zlib-ng), through flate2's `Compress`/`Decompress` API.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const BLOCK: usize = 4096;
const GRANULE: usize = 16;
/// A block whose rounded compressed size exceeds this is stored raw.
const MAX_COMPRESSED: usize = 4080;
/// Output slot per block: more than any of the libraries' bound for 4 KiB.
const STRIDE: usize = BLOCK + 512;

/// Bytes the drive stores for a block whose raw-deflate payload is `compressed` bytes.
fn stored_size(compressed: usize) -> usize {
    let rounded = compressed.div_ceil(GRANULE) * GRANULE;
    if rounded > MAX_COMPRESSED { BLOCK } else { rounded }
}

trait Codec {
    /// Compresses `input` (one block) as raw deflate into `out`; returns the length.
    fn compress(&mut self, input: &[u8], out: &mut [u8]) -> usize;
    /// Decompresses one raw-deflate block into `out`; returns the length.
    fn decompress(&mut self, input: &[u8], out: &mut [u8]) -> usize;
}

struct Libdeflate {
    c: libdeflater::Compressor,
    d: libdeflater::Decompressor,
}

impl Libdeflate {
    fn new(level: u32) -> Self {
        let lvl = libdeflater::CompressionLvl::new(level as i32).expect("libdeflate level 0..=12");
        Self { c: libdeflater::Compressor::new(lvl), d: libdeflater::Decompressor::new() }
    }
}

impl Codec for Libdeflate {
    fn compress(&mut self, input: &[u8], out: &mut [u8]) -> usize {
        self.c.deflate_compress(input, out).expect("libdeflate: output slot too small")
    }
    fn decompress(&mut self, input: &[u8], out: &mut [u8]) -> usize {
        self.d.deflate_decompress(input, out).expect("libdeflate: bad deflate stream")
    }
}

struct Miniz {
    c: miniz_oxide::deflate::core::CompressorOxide,
    d: Box<miniz_oxide::inflate::core::DecompressorOxide>,
}

impl Miniz {
    fn new(level: u32) -> Self {
        use miniz_oxide::deflate::core::{CompressorOxide, create_comp_flags_from_zip_params};
        // Negative window bits = raw deflate; strategy 0 = default.
        let flags = create_comp_flags_from_zip_params(level as i32, -15, 0);
        Self { c: CompressorOxide::new(flags), d: Box::new(miniz_oxide::inflate::core::DecompressorOxide::new()) }
    }
}

impl Codec for Miniz {
    fn compress(&mut self, input: &[u8], out: &mut [u8]) -> usize {
        use miniz_oxide::deflate::core::{TDEFLFlush, TDEFLStatus, compress};
        self.c.reset();
        let (status, consumed, written) = compress(&mut self.c, input, out, TDEFLFlush::Finish);
        assert!(
            status == TDEFLStatus::Done && consumed == input.len(),
            "miniz_oxide: compression did not finish ({status:?})"
        );
        written
    }
    fn decompress(&mut self, input: &[u8], out: &mut [u8]) -> usize {
        use miniz_oxide::inflate::TINFLStatus;
        use miniz_oxide::inflate::core::{decompress, inflate_flags};
        self.d.init();
        let (status, _, written) =
            decompress(&mut self.d, input, out, 0, inflate_flags::TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF);
        assert!(status == TINFLStatus::Done, "miniz_oxide: bad deflate stream ({status:?})");
        written
    }
}

struct Flate2 {
    c: flate2::Compress,
    d: flate2::Decompress,
}

impl Flate2 {
    fn new(level: u32) -> Self {
        Self { c: flate2::Compress::new(flate2::Compression::new(level), false), d: flate2::Decompress::new(false) }
    }
}

impl Codec for Flate2 {
    fn compress(&mut self, input: &[u8], out: &mut [u8]) -> usize {
        self.c.reset();
        let status = self.c.compress(input, out, flate2::FlushCompress::Finish).expect("flate2: compress failed");
        assert!(status == flate2::Status::StreamEnd, "flate2: compression did not finish ({status:?})");
        self.c.total_out() as usize
    }
    fn decompress(&mut self, input: &[u8], out: &mut [u8]) -> usize {
        self.d.reset(false);
        let status =
            self.d.decompress(input, out, flate2::FlushDecompress::Finish).expect("flate2: bad deflate stream");
        assert!(status == flate2::Status::StreamEnd, "flate2: decompression did not finish ({status:?})");
        self.d.total_out() as usize
    }
}

struct Row {
    library: &'static str,
    level: u32,
    compress: Duration,
    decompress: Duration,
    compressed_bytes: u64,
    physical_bytes: u64,
    raw_blocks: usize,
}

/// Compresses and decompresses all `blocks` (non-zero, BLOCK bytes each) `runs` times.
fn survey(
    library: &'static str,
    level: u32,
    codec: &mut impl Codec,
    blocks: &[u8],
    arena: &mut [u8],
    runs: usize,
) -> Row {
    let n = blocks.len() / BLOCK;
    let mut lens = vec![0usize; n];

    let mut best_c = Duration::MAX;
    for _ in 0..runs {
        let t = Instant::now();
        for (i, len) in lens.iter_mut().enumerate() {
            *len = codec.compress(&blocks[i * BLOCK..][..BLOCK], &mut arena[i * STRIDE..][..STRIDE]);
        }
        best_c = best_c.min(t.elapsed());
        black_box(&lens);
    }

    // Untimed: every block must come back as it was.
    let mut scratch = vec![0u8; BLOCK];
    for (i, &len) in lens.iter().enumerate() {
        let written = codec.decompress(&arena[i * STRIDE..][..len], &mut scratch);
        assert!(
            written == BLOCK && scratch[..] == blocks[i * BLOCK..][..BLOCK],
            "{library} level {level}: block {i} did not round-trip"
        );
    }

    let mut best_d = Duration::MAX;
    for _ in 0..runs {
        let mut total = 0usize;
        let t = Instant::now();
        for (i, &len) in lens.iter().enumerate() {
            total += codec.decompress(&arena[i * STRIDE..][..len], &mut scratch);
        }
        best_d = best_d.min(t.elapsed());
        black_box(total);
    }

    Row {
        library,
        level,
        compress: best_c,
        decompress: best_d,
        compressed_bytes: lens.iter().map(|&l| l as u64).sum(),
        physical_bytes: lens.iter().map(|&l| stored_size(l) as u64).sum(),
        raw_blocks: lens.iter().filter(|&&l| stored_size(l) == BLOCK).count(),
    }
}

fn mb_per_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

struct Args {
    file: String,
    levels: Vec<u32>,
    runs: usize,
}

const USAGE: &str = "usage: deflate-survey FILE [--levels 1,5,6] [--runs 3]";

fn parse_args() -> Result<Args, String> {
    let mut file = None;
    let mut levels = vec![1, 5, 6];
    let mut runs = 3;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--levels" => {
                let v = it.next().ok_or("--levels needs a value")?;
                levels = v
                    .split(',')
                    .map(|s| s.trim().parse::<u32>().map_err(|e| format!("bad level '{s}': {e}")))
                    .collect::<Result<_, _>>()?;
                if let Some(bad) = levels.iter().find(|&&l| l > 9) {
                    return Err(format!("level {bad}: levels must be 0..=9 (the range all three libraries share)"));
                }
            }
            "--runs" => {
                let v = it.next().ok_or("--runs needs a value")?;
                runs = v.parse().map_err(|e| format!("bad --runs '{v}': {e}"))?;
                if runs == 0 {
                    return Err("--runs must be at least 1".into());
                }
            }
            "-h" | "--help" => return Err(USAGE.into()),
            s if s.starts_with('-') => return Err(format!("unknown option '{s}'\n{USAGE}")),
            _ if file.is_some() => return Err(format!("only one FILE may be given\n{USAGE}")),
            _ => file = Some(a),
        }
    }
    Ok(Args { file: file.ok_or(USAGE)?, levels, runs })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("deflate-survey: {e}");
            return ExitCode::from(2);
        }
    };
    let mut data = match std::fs::read(&args.file) {
        Ok(d) if !d.is_empty() => d,
        Ok(_) => {
            eprintln!("deflate-survey: {} is empty", args.file);
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("deflate-survey: cannot read {}: {e} (make it with scripts/pg-real-table)", args.file);
            return ExitCode::FAILURE;
        }
    };
    let file_size = data.len();
    let total_blocks = file_size.div_ceil(BLOCK);
    data.resize(total_blocks * BLOCK, 0);
    let blocks: Vec<u8> = data.chunks_exact(BLOCK).filter(|b| b.iter().any(|&x| x != 0)).flatten().copied().collect();
    drop(data);
    let n = blocks.len() / BLOCK;
    let zero_blocks = total_blocks - n;
    let logical = (total_blocks * BLOCK) as u64;
    let mut arena = vec![0u8; n * STRIDE];

    let mut rows = Vec::new();
    for &level in &args.levels {
        eprintln!("deflate-survey: level {level} ...");
        rows.push(survey("libdeflater", level, &mut Libdeflate::new(level), &blocks, &mut arena, args.runs));
        rows.push(survey("miniz_oxide", level, &mut Miniz::new(level), &blocks, &mut arena, args.runs));
        rows.push(survey("flate2 (zlib-rs)", level, &mut Flate2::new(level), &blocks, &mut arena, args.runs));
    }
    let reference = rows.iter().find(|r| r.library == "libdeflater" && r.level == 5).map(|r| r.physical_bytes);

    println!("### deflate-survey: raw deflate per 4 KiB block\n");
    println!("- file: `{}` ({file_size} bytes)", args.file);
    println!(
        "- blocks: {total_blocks} of {BLOCK} bytes ({n} compressed, {zero_blocks} all-zero stored as 0 bytes); \
         stored size = compressed size rounded up to {GRANULE} bytes, or {BLOCK} (raw) if that is > {MAX_COMPRESSED}"
    );
    println!(
        "- libraries: libdeflater {} (libdeflate-sys {}, C libdeflate bundled); miniz_oxide {} (used directly, \
         feature `simd`); flate2 {} with backend zlib-rs {} (default-features off, features `zlib-rs`, `runtime_detection`)",
        env!("SURVEY_VERSION_LIBDEFLATER"),
        env!("SURVEY_VERSION_LIBDEFLATE_SYS"),
        env!("SURVEY_VERSION_MINIZ_OXIDE"),
        env!("SURVEY_VERSION_FLATE2"),
        env!("SURVEY_VERSION_ZLIB_RS"),
    );
    println!(
        "- timing: one thread, one compressor/decompressor object per library reset between blocks, best of {} passes; \
         MB/s = 10^6 uncompressed bytes per second; every block verified by a round trip",
        args.runs
    );
    println!(
        "- build: {}, profile {} (opt-level {}), target features: {}; CPU: {} ({} logical CPUs)",
        env!("SURVEY_RUSTC"),
        env!("SURVEY_PROFILE"),
        env!("SURVEY_OPT_LEVEL"),
        env!("SURVEY_TARGET_FEATURES"),
        cpu_model(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    );
    if env!("SURVEY_PROFILE") != "release" {
        println!("- **warning: not a release build; speeds are meaningless**");
    }
    println!();
    println!(
        "| library | level | compress MB/s | decompress MB/s | compressed bytes | stored bytes (16 B, raw rule) | raw blocks | ratio | stored vs libdeflater L5 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let input = n * BLOCK;
    for r in &rows {
        let vs = reference
            .map(|p| format!("{:+.2}%", (r.physical_bytes as f64 / p as f64 - 1.0) * 100.0))
            .unwrap_or_else(|| "n/a".into());
        println!(
            "| {} | {} | {:.1} | {:.1} | {} | {} | {} | {:.3} | {} |",
            r.library,
            r.level,
            mb_per_s(input, r.compress),
            mb_per_s(input, r.decompress),
            r.compressed_bytes,
            r.physical_bytes,
            r.raw_blocks,
            if r.physical_bytes == 0 { 0.0 } else { logical as f64 / r.physical_bytes as f64 },
            vs,
        );
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_size_rule() {
        assert_eq!(stored_size(1), 16);
        assert_eq!(stored_size(16), 16);
        assert_eq!(stored_size(17), 32);
        assert_eq!(stored_size(4080), 4080);
        assert_eq!(stored_size(4065), 4080);
        assert_eq!(stored_size(4081), BLOCK);
        assert_eq!(stored_size(4200), BLOCK);
    }

    fn round_trip(codec: &mut impl Codec) {
        // Runs of 32 patterned bytes between runs of 32 random ones: compressible, not trivially.
        let mut rng = tundra_env::Rng::new(0x9e37_79b9);
        let mut block = rng.bytes(BLOCK);
        for (i, b) in block.iter_mut().enumerate() {
            if i % 64 < 32 {
                *b = (i % 7) as u8;
            }
        }
        let mut out = vec![0u8; STRIDE];
        let mut back = vec![0u8; BLOCK];
        for _ in 0..2 {
            let len = codec.compress(&block, &mut out);
            assert!(len > 0 && len < BLOCK);
            assert_eq!(codec.decompress(&out[..len], &mut back), BLOCK);
            assert_eq!(back, block);
        }
    }

    #[test]
    fn codecs_round_trip() {
        for level in [1, 5, 6] {
            round_trip(&mut Libdeflate::new(level));
            round_trip(&mut Miniz::new(level));
            round_trip(&mut Flate2::new(level));
        }
    }
}
